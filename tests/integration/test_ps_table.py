"""``ps`` as a table people read: one row a job whatever its name holds, columns aligned
by display width, the command quoted as a shell would take it, whole lines into a pipe,
and the waiting time apart from the run time."""

from __future__ import annotations

from tests.integration.daemon_fixture import PY, Daemon


def _row(table: str, job_id: int) -> str:
    (row,) = [line for line in table.splitlines() if line.split(" ", 1)[0] == str(job_id)]
    return row


def test_ps_rows_stay_one_per_job_aligned_and_quoted(daemon: Daemon) -> None:
    wide = daemon.submit(
        "--mem", "1G", "--name", "訓練ジョブ", cmd=["sh", "-c", "env | grep -c CUDA"]
    )
    plain = daemon.submit("--mem", "1G", "--name", "two\nlines", cmd=["echo", "it's", "a b"])
    daemon.wait_state(wide, "succeeded")
    daemon.wait_state(plain, "succeeded")
    table = daemon.cli("ps", "--all", check=True).stdout
    lines = table.splitlines()
    assert len(lines) == 3, table  # the header and one row a job: the newline is shown
    assert "two\\nlines" in _row(table, plain)
    # Quoted as a shell would take it back, not joined with spaces.
    assert "sh -c 'env | grep -c CUDA'" in _row(table, wide), table
    assert """echo 'it'"'"'s' 'a b'""" in _row(table, plain), table

    # Aligned by display width: the STATE column starts at the same terminal column,
    # though the CJK name takes 10 columns in 5 characters.
    def column_of(line: str, word: str) -> int:
        import unicodedata

        before = line[: line.index(word)]
        return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in before)

    assert (
        column_of(_row(table, wide), "succeeded")
        == column_of(lines[0], "STATE")
        == column_of(_row(table, plain), "succeeded")
    ), table


def test_ps_keeps_long_lines_whole_in_a_pipe_and_says_wait_and_run_apart(daemon: Daemon) -> None:
    long_arg = "x" * 400
    done = daemon.submit(
        "--mem", "1G", "--name", "slow", cmd=[PY, "-c", "import time; time.sleep(1.2)", long_arg]
    )
    daemon.wait_state(done, "succeeded")
    table = daemon.cli("ps", "--all", check=True).stdout
    header, row = table.splitlines()[0], _row(table, done)
    assert long_arg in row, "a pipe gets the whole line (ps -ww)"
    assert "WAIT" in header and "RUN" in header and "TIME" not in header.split()
    cells = row.split()
    run = cells[header.split().index("RUN")]
    assert run.endswith("s") and float(run.rstrip("s")) >= 1.0, (header, row)
