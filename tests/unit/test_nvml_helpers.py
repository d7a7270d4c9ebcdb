"""The pure helpers of the NVML backend: they run without a GPU and without NVML."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpuwarden
from gpuwarden.errors import UsageError
from gpuwarden.gpus.model import COMPUTE_MODES
from gpuwarden.gpus.nvml_values import (
    compute_mode_name,
    compute_mode_value,
    cpu_mask_to_cpulist,
    normalize_bus_id,
)
from gpuwarden.gpus.topology import parse_cpulist


def test_importing_the_module_does_not_load_pynvml() -> None:
    # The module is imported on every CLI start; NVML must load only on open().
    # A fresh interpreter, because other tests may have loaded pynvml already.
    src = str(Path(gpuwarden.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": src}
    code = "import sys, gpuwarden.gpus.nvml; print('pynvml' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


class TestCpuMask:
    def test_empty_and_zero_masks(self) -> None:
        assert cpu_mask_to_cpulist([]) == ""
        assert cpu_mask_to_cpulist([0, 0]) == ""

    def test_single_word(self) -> None:
        assert cpu_mask_to_cpulist([0b1]) == "0"
        assert cpu_mask_to_cpulist([0b1111]) == "0-3"
        assert cpu_mask_to_cpulist([0b1011_0001]) == "0,4-5,7"

    def test_full_word_and_top_bit(self) -> None:
        assert cpu_mask_to_cpulist([2**64 - 1]) == "0-63"
        assert cpu_mask_to_cpulist([1 << 63]) == "63"

    def test_range_continues_across_words(self) -> None:
        # CPUs 60-67 straddle the word boundary and must come out as one range.
        words = [0xF << 60, 0xF]
        assert cpu_mask_to_cpulist(words) == "60-67"

    def test_two_socket_layout_with_gaps(self) -> None:
        # A typical dual-socket GPU affinity: 0-23 and 48-71 (hyperthreads), 96 CPUs.
        cpus = set(range(24)) | set(range(48, 72))
        words = [0, 0]
        for c in cpus:
            words[c // 64] |= 1 << (c % 64)
        assert cpu_mask_to_cpulist(words) == "0-23,48-71"
        assert parse_cpulist(cpu_mask_to_cpulist(words)) == frozenset(cpus)

    def test_leading_empty_words(self) -> None:
        assert cpu_mask_to_cpulist([0, 0, 0b11]) == "128-129"

    def test_32_bit_words(self) -> None:
        assert cpu_mask_to_cpulist([1 << 31, 1], bits_per_word=32) == "31-32"
        # Bits above the word width are not CPUs of this word.
        assert cpu_mask_to_cpulist([1 << 32], bits_per_word=32) == ""

    def test_bad_input(self) -> None:
        with pytest.raises(ValueError):
            cpu_mask_to_cpulist([1], bits_per_word=0)
        with pytest.raises(ValueError):
            cpu_mask_to_cpulist([-1])


class TestComputeMode:
    @pytest.mark.parametrize(
        ("value", "name"),
        [(0, "Default"), (1, "Exclusive_Thread"), (2, "Prohibited"), (3, "Exclusive_Process")],
    )
    def test_nvml_numbers_map_to_names_and_back(self, value: int, name: str) -> None:
        assert compute_mode_name(value) == name
        assert compute_mode_value(name) == value

    def test_every_model_mode_round_trips(self) -> None:
        for mode in COMPUTE_MODES:
            name = compute_mode_name(compute_mode_value(mode))
            assert name == mode

    def test_unknown_numbers_are_none(self) -> None:
        assert compute_mode_name(4) is None
        assert compute_mode_name(-1) is None

    def test_names_forgive_case_and_dashes(self) -> None:
        assert compute_mode_value("exclusive-process") == 3
        assert compute_mode_value(" PROHIBITED ") == 2

    def test_unknown_name_is_a_usage_error_listing_choices(self) -> None:
        with pytest.raises(UsageError, match="Exclusive_Process"):
            compute_mode_value("shared")


class TestBusId:
    def test_eight_and_four_digit_domains_compare_equal(self) -> None:
        assert normalize_bus_id("00000000:17:00.0") == "0000:17:00.0"
        assert normalize_bus_id(b"00000000:9A:00.0") == normalize_bus_id("0000:9a:00.0")
