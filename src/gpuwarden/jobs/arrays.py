"""Job arrays (``submit --array 0-99%8``): one submission, many tasks that differ only in
``GPUWARDEN_ARRAY_INDEX``, as Slurm's arrays are. The array's id is its first task's job
id. A task is named ``ID_INDEX`` (``12_7``) wherever a job is named; where a command acts
on many jobs (cancel, hold, release, retry, wait, rm), the array's id names every task.
``%N`` lets at most N tasks hold GPUs at once (``sched.arrays.throttle``). The grammar of job
references is here too, so the CLI and the daemon read ``3-7,12_7`` by one rule."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuwarden.errors import UsageError

MAX_TASKS = 10_000  # tasks in one array (Slurm's default MaxArraySize is 1001)
MAX_INDEX = 9_999_999
MAX_RANGE = 100_000  # ids one range may name (cancel 1-100000)


@dataclass(frozen=True)
class Array:
    """An array as submitted: its task indices, in order, and its %N."""

    indices: tuple[int, ...]
    limit: int | None = None  # at most this many tasks reserved or running at once

    def text(self) -> str:
        return f"{len(self.indices)} tasks" + (
            "" if self.limit is None else f", at most {self.limit} at once"
        )


@dataclass(frozen=True)
class Member:
    """A job's place in its array."""

    array_id: int
    index: int
    limit: int | None = None

    def ref(self) -> str:
        return f"{self.array_id}_{self.index}"


def _index(text: str, spec: str) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_INDEX:
        raise UsageError(f"invalid array {spec!r}: {text!r} is not an index (0 to {MAX_INDEX})")
    return int(text)


def parse_array(spec: object) -> Array:
    """``0-99%8``, ``1,3,5-9``, ``0-20:5``: indices as ranges (``:STEP``), comma-separated,
    then ``%N`` for at most N at once. Every index once, at most ``MAX_TASKS``."""
    if not isinstance(spec, str) or not spec or len(spec) > 1000:
        raise UsageError("invalid array: give indices such as 0-99 or 0-99%8")
    body, sep, limit_text = spec.partition("%")
    limit = None
    if sep:
        if (
            not (limit_text.isascii() and limit_text.isdigit())
            or not 0 < int(limit_text) <= MAX_TASKS
        ):
            raise UsageError(f"invalid array {spec!r}: %N needs N from 1 to {MAX_TASKS}")
        limit = int(limit_text)
    seen: set[int] = set()
    indices: list[int] = []
    for part in body.split(","):
        span, colon, step_text = part.partition(":")
        lo_text, dash, hi_text = span.partition("-")
        lo = _index(lo_text.strip(), spec)
        hi = _index(hi_text.strip(), spec) if dash else lo
        step = _index(step_text.strip(), spec) if colon else 1
        if hi < lo or step < 1 or (colon and not dash):
            raise UsageError(
                f"invalid array {spec!r}: {part!r} is not a range (LOW-HIGH or LOW-HIGH:STEP)"
            )
        if (hi - lo) // step + 1 + len(indices) > MAX_TASKS:
            raise UsageError(f"invalid array {spec!r}: more than {MAX_TASKS} tasks")
        for i in range(lo, hi + 1, step):
            if i in seen:
                raise UsageError(f"invalid array {spec!r}: index {i} is given twice")
            seen.add(i)
            indices.append(i)
    return Array(tuple(indices), limit)


Ref = int | tuple[int, int]  # a job id, or (array id, task index)


def _job_id(text: str, part: str) -> int:
    if not (text.isascii() and text.isdigit()) or not 0 < int(text) < 2**63:
        raise UsageError(f"invalid job id or range {part!r}")
    return int(text)


def parse_refs(specs: Iterable[str]) -> list[Ref]:
    """Job references from ``3``, ``3,5``, ``7-9`` and ``12_7`` (task 7 of array 12)."""
    out: list[Ref] = []
    for spec in specs:
        for raw in spec.split(","):
            part = raw.strip()
            if not part:
                continue
            head, under, index = part.partition("_")
            if under:
                out.append((_job_id(head, part), _index(index, part)))
            elif "-" in part:
                lo_text, _, hi_text = part.partition("-")
                lo, hi = _job_id(lo_text, part), _job_id(hi_text, part)
                if hi < lo or hi - lo >= MAX_RANGE:
                    raise UsageError(f"invalid job id or range {part!r}")
                out.extend(range(lo, hi + 1))
            else:
                out.append(_job_id(part, part))
    return out
