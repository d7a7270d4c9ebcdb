"""``python -m gpuwarden.supervisor [--nonce N] [--foreground] JOBDIR``: run the job
that ``JOBDIR/spec.json`` describes under a detached supervisor (``spawn_supervisor``
starts it so; the fork server calls ``detach.start`` instead)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from gpuwarden.jobs.jobdir import SupervisorError, load_spec
from gpuwarden.supervisor.detach import daemonize, refuse_if_started
from gpuwarden.supervisor.shim import Supervisor


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuwarden.supervisor",
        description="Run the job described by JOBDIR/spec.json under a supervisor.",
    )
    parser.add_argument("jobdir")
    parser.add_argument("--nonce", help="echoed in supervisor.json (spawn_supervisor's check)")
    parser.add_argument("--foreground", action="store_true", help="do not detach (for debugging)")
    args = parser.parse_args(argv)
    jobdir = Path(args.jobdir).resolve()
    try:
        spec = load_spec(jobdir)
        refuse_if_started(jobdir)
    except SupervisorError as e:
        print(f"gpuwarden supervisor: {e}", file=sys.stderr)
        return 2
    if args.foreground:
        return Supervisor(jobdir, spec, args.nonce).run(None)
    return daemonize(jobdir, spec, args.nonce)


if __name__ == "__main__":
    sys.exit(main())
