"""NVML's numbers and strings as gpuwarden's values: CPU affinity masks, compute modes,
PCI bus ids. Pure, so they are tested without NVML or a GPU."""

from __future__ import annotations

from gpuwarden.errors import UsageError
from gpuwarden.gpus.model import COMPUTE_MODES
from gpuwarden.gpus.topology import format_cpulist


def cpu_mask_to_cpulist(words: list[int], bits_per_word: int = 64) -> str:
    """Turn an NVML CPU affinity bitmask (array of words, CPU 0 = bit 0 of word 0)
    into a kernel cpulist such as ``0-23,48-71``; an all-zero mask gives ``""``."""
    if bits_per_word <= 0:
        raise ValueError("bits_per_word must be positive")
    cpus: list[int] = []
    for w, word in enumerate(words):
        if word < 0:
            raise ValueError(f"negative mask word {word}")
        base = w * bits_per_word
        for bit in range(bits_per_word):
            if word >> bit & 1:
                cpus.append(base + bit)
    return format_cpulist(cpus)


def compute_mode_name(value: int) -> str | None:
    """NVML's compute-mode number as one of ``COMPUTE_MODES``; None for a value this
    version does not know (newer drivers may add modes)."""
    # NVML_COMPUTEMODE_DEFAULT=0, EXCLUSIVE_THREAD=1, PROHIBITED=2, EXCLUSIVE_PROCESS=3:
    # COMPUTE_MODES lists them in exactly that order.
    if 0 <= value < len(COMPUTE_MODES):
        return COMPUTE_MODES[value]
    return None


def compute_mode_value(name: str) -> int:
    """The NVML number for a compute-mode name. Case and ``-``/``_`` are forgiven
    because people type these; anything else is a UsageError listing the choices."""
    wanted = name.strip().lower().replace("-", "_")
    for value, mode in enumerate(COMPUTE_MODES):
        if mode.lower() == wanted:
            return value
    raise UsageError(f"unknown compute mode {name!r}; choose one of {', '.join(COMPUTE_MODES)}")


def normalize_bus_id(bus_id: str | bytes) -> str:
    """Comparable PCI bus id: lower case, 4-digit domain (NVML mixes 4 and 8 digits)."""
    text = bus_id.decode(errors="replace") if isinstance(bus_id, bytes) else bus_id
    text = text.strip().lower()
    domain, sep, rest = text.partition(":")
    if sep and len(domain) == 8:
        domain = domain[4:]
    return f"{domain}{sep}{rest}"
