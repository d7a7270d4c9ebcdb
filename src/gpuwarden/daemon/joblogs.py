"""Reading a job's output for ``logs`` and ``logs -f``: one attempt's stream, in chunks
from an offset, with what a poller needs to know when to stop. Each attempt writes a
job directory of its own (jobs/jobdir.py), so the attempt asked for picks the file."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from gpuwarden.errors import UsageError
from gpuwarden.jobs.jobdir import job_dir
from gpuwarden.jobs.model import Job

MAX_LOG_CHUNK = 1 << 20


@dataclass(frozen=True)
class LogChunk:
    """What one ``logs`` request returns: bytes of one attempt's stream from an offset."""

    data: bytes
    next_offset: int
    attempt: int  # counted from 1
    attempts: int  # how many the job has had so far, the current one too
    ended: bool  # this attempt writes nothing more
    job_ended: bool


def read_log(
    jobs_dir: Path, job: Job, stream: str, offset: int, attempt: int | None = None
) -> LogChunk:
    """At most ``MAX_LOG_CHUNK`` bytes of ``stream`` (stdout or stderr) of one attempt of
    the job (the latest unless ``attempt``, counted from 1), from ``offset``. Whether the
    caller may read them is decided before (daemon/service.py)."""
    if stream not in ("stdout", "stderr"):
        raise UsageError("stream must be stdout or stderr")
    if offset < 0:
        raise UsageError("offset must not be negative")
    attempts = job.attempts + 1
    if attempt is None:
        attempt = attempts
    elif not 1 <= attempt <= attempts:
        raise UsageError(
            f"job {job.id} has had {attempts} attempt"
            f"{'' if attempts == 1 else 's'}; attempt {attempt} is not one "
            "of them"
        )
    path = job_dir(jobs_dir, dataclasses.replace(job, attempts=attempt - 1)) / stream
    try:
        with open(path, "rb") as f:
            # Past the end there is nothing yet; seeking there could overflow.
            if offset >= os.fstat(f.fileno()).st_size:
                chunk = b""
            else:
                f.seek(offset)
                chunk = f.read(MAX_LOG_CHUNK)
    except FileNotFoundError:
        chunk = b""
    return LogChunk(
        chunk,
        offset + len(chunk),
        attempt,
        attempts,
        ended=job.terminal or attempt < attempts,
        job_ended=job.terminal,
    )
