"""Budget-aware loading, the parts that need no torch: a safetensors header read without
its data, the bytes each precision takes, the plan that picks the best precision that
fits, the refusal with numbers; and the clear error when torch is missing."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.errors import UsageError
from gpuwarden.guard.loading import (
    BYTES,
    PRECISIONS,
    TensorGroup,
    Weights,
    plan_loads,
    read_safetensors,
    refusal,
)
from gpuwarden.units import GiB, MiB

ROOT = Path(__file__).resolve().parents[2]


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A real safetensors file: 8-byte header length, JSON header, zero-filled data."""
    size = {"F32": 4, "BF16": 2, "F16": 2, "I64": 8}
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)


def test_a_safetensors_header_is_read_without_the_data(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_safetensors(
        path,
        {
            "w1": ("F32", [4096, 4096]),
            "b1": ("F32", [4096]),
            "emb": ("BF16", [1000, 64]),
            "steps": ("I64", [1]),
        },
    )
    weights, table = read_safetensors(path)
    assert table["w1"] == ("F32", (4096, 4096)) and table["steps"] == ("I64", (1,))
    assert weights.parameters == 4096 * 4096 + 4096 + 64000 + 1
    assert weights.stored == (4096 * 4096 + 4096) * 4 + 64000 * 2 + 8
    # bf16 halves the fp32 tensors; the bf16 one stays as stored; the integer one too
    assert weights.bytes_at("bf16") == (4096 * 4096 + 4096) * 2 + 64000 * 2 + 8
    assert weights.bytes_at("fp32") == weights.stored  # never widened


def test_bad_checkpoints_are_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{nope")
    with pytest.raises(UsageError, match="not a readable safetensors file"):
        read_safetensors(bad)
    with pytest.raises(UsageError, match="not a readable safetensors file"):
        read_safetensors(tmp_path / "missing.safetensors")
    odd = tmp_path / "odd.safetensors"
    raw = json.dumps({"x": {"dtype": "Q3", "shape": [2], "data_offsets": [0, 1]}}).encode()
    odd.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0")
    with pytest.raises(UsageError, match="unknown dtype 'Q3'"):
        read_safetensors(odd)


LINEARS = Weights(
    (
        TensorGroup(4 * 8192 * 8192, 4, True, quantizable=True, rows=4 * 8192),
        TensorGroup(4 * 8192, 4, True),
    )
)  # four 8192x8192 linears and biases


def test_the_plan_takes_the_best_precision_that_fits() -> None:
    fp32, bf16, int8 = (LINEARS.bytes_at(p) for p in ("fp32", "bf16", "int8"))
    assert (fp32 // MiB, bf16 // MiB, int8 // MiB) == (1024, 512, 256)
    plans = plan_loads(LINEARS, 700 * MiB)
    # fp16 is dropped: no smaller than bf16
    assert [p.precision for p in plans] == ["fp32", "bf16", "int8"]
    assert [p.fits for p in plans] == [False, True, True]
    assert plans[1].activation == bf16 // 10
    assert next(p.precision for p in plan_loads(LINEARS, 2 * GiB) if p.fits) == "fp32"
    measured = plan_loads(LINEARS, 700 * MiB, activation=300 * MiB)
    assert [p.fits for p in measured] == [False, False, True]


def test_nothing_fitting_is_refused_with_every_estimate() -> None:
    plans = plan_loads(LINEARS, 200 * MiB)
    assert not any(p.fits for p in plans)
    text = refusal(plans, "the job budget (200MiB)")
    assert text.startswith("nothing fits the job budget (200MiB): fp32: weights 1024MiB")
    assert "int8: weights 256MiB + activations 26MiB = 282MiB over 200MiB" in text


def test_int8_is_only_offered_where_there_is_something_to_quantize() -> None:
    no_linear = Weights((TensorGroup(1000, 4, True),))
    assert [p.precision for p in plan_loads(no_linear, GiB)] == ["fp32", "bf16"]
    with pytest.raises(UsageError, match="unknown precision 'fp8'"):
        no_linear.bytes_at("fp8")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 10**8), st.sampled_from([2, 4]), st.booleans(), st.booleans()),
        min_size=1,
        max_size=6,
    ),
    st.integers(0, 2 * 10**9),
    st.integers(0, 10**8),
)
def test_the_first_plan_that_fits_is_the_best_and_fits(
    groups: list[tuple[int, int, bool, bool]], available: int, activation: int
) -> None:
    weights = Weights(
        tuple(
            TensorGroup(n, size, is_float, quantizable=q and is_float, rows=1)
            for n, size, is_float, q in groups
        )
    )
    plans = plan_loads(weights, available, activation=activation)
    order = [PRECISIONS.index(p.precision) for p in plans]
    assert order == sorted(order)  # highest precision first
    sizes = [p.weights for p in plans]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == len(sizes)
    for p in plans:
        assert p.fits == (p.weights + activation <= available)
        assert p.weights <= weights.stored or p.precision == "int8"
        assert p.weights >= weights.parameters * min(BYTES[p.precision], 1)


def test_without_torch_loading_says_what_is_missing() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from gpuwarden.guard import load_within_budget, MissingDependency\n"
        "import gpuwarden.guard\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "try:\n    load_within_budget(lambda: None, budget='1G')\n"
        "except MissingDependency as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT / "src")},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "loading a model needs PyTorch: pip install torch"
