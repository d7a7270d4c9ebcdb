"""MPS's own spellings: memory limits (``0=2G``), GPU lists, thread percentages and
the control daemon's server list, parsed and formatted, with one-line errors."""

from collections.abc import Iterable, Mapping

from gpuwarden.errors import UsageError
from gpuwarden.units import GiB, MiB, parse_size

# -- parsing and formatting -----------------------------------------------------


def format_mps_size(nbytes: int) -> str:
    """A size as MPS takes it: ``2G`` or ``512M`` (whole MiB; MPS has no byte unit)."""
    if nbytes <= 0:
        raise UsageError(f"memory limit must be positive, got {nbytes}")
    if nbytes % GiB == 0:
        return f"{nbytes // GiB}G"
    if nbytes % MiB == 0:
        return f"{nbytes // MiB}M"
    raise UsageError(f"memory limit of {nbytes} bytes is not a whole number of MiB")


def parse_mem_limit(text: str) -> tuple[int, int]:
    """``GPU=SIZE`` (``0=2G``) as (GPU index, bytes); UsageError on anything else."""
    gpu, sep, size = text.partition("=")
    gpu = gpu.strip()
    if not sep or not gpu.isdigit() or not size.strip():
        raise UsageError(f"invalid --mem-limit {text!r}: use GPU=SIZE, e.g. 0=2G")
    try:
        nbytes = parse_size(size.strip())
    except UsageError as e:
        raise UsageError(f"invalid --mem-limit {text!r}: {e}") from None
    if nbytes <= 0:
        raise UsageError(f"invalid --mem-limit {text!r}: the size must be positive")
    try:
        format_mps_size(nbytes)
    except UsageError as e:
        raise UsageError(f"invalid --mem-limit {text!r}: {e}") from None
    return int(gpu), nbytes


def parse_mem_limits(texts: Iterable[str]) -> dict[int, int]:
    """Several ``GPU=SIZE`` into GPU index -> bytes; a GPU named twice is an error."""
    out: dict[int, int] = {}
    for text in texts:
        gpu, nbytes = parse_mem_limit(text)
        if gpu in out:
            raise UsageError(f"--mem-limit names GPU {gpu} twice")
        out[gpu] = nbytes
    return out


def format_mem_limits(limits: Mapping[int, int]) -> str:
    """Device ordinal -> bytes as CUDA_MPS_PINNED_DEVICE_MEM_LIMIT wants it: ``0=2G,1=4G``."""
    return ",".join(f"{dev}={format_mps_size(n)}" for dev, n in sorted(limits.items()))


def check_thread_percentage(value: int) -> int:
    if not 1 <= value <= 100:
        raise UsageError(f"--thread-percentage must be 1-100, got {value}")
    return value


def parse_gpu_list(text: str) -> tuple[int, ...]:
    """``0,1`` as (0, 1); order kept (it is CUDA_VISIBLE_DEVICES order), no repeats."""
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isdigit() for p in parts):
        raise UsageError(f"invalid GPU list {text!r}: use indices such as 0,1")
    gpus = tuple(int(p) for p in parts)
    if len(set(gpus)) != len(gpus):
        raise UsageError(f"invalid GPU list {text!r}: a GPU is named twice")
    return gpus


def parse_server_list(answer: str) -> list[int] | None:
    """The pids in a ``get_server_list`` answer (one per line); None if it is not that."""
    pids: list[int] = []
    for line in answer.split():
        if not line.isdigit():
            return None
        pids.append(int(line))
    return pids
