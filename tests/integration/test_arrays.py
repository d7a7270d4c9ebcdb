"""Job arrays on a real daemon over the simulated machine (2 x 24 GiB): ``--array
0-19%4`` never has more than 4 tasks at once though memory would let all 20 run, each
task sees its GPUWARDEN_ARRAY_INDEX, ``--after`` on the array waits for every task; an
array and its tasks (``12_7``) are named in ps, show, hold, release and cancel; bad
arrays are one-line errors."""

from __future__ import annotations

from pathlib import Path

from gpuwarden.client.api import Client
from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import PY, Daemon

# Each task notes its index and when its process ran: the spans the test overlays.
TASK = [
    PY,
    "-c",
    "import os, sys, time; t = time.time(); time.sleep(0.4); "
    "open(sys.argv[1], 'a').write("
    "f\"{os.environ['GPUWARDEN_ARRAY_ID']} "
    "{os.environ['GPUWARDEN_ARRAY_INDEX']} {t} {time.time()}\\n\")",
]


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    now = most = 0
    for _, step in edges:  # an end sorts before a start at the same moment
        now += step
        most = max(most, now)
    return most


def test_an_array_of_20_with_limit_4_never_runs_more_than_4(daemon: Daemon, tmp_path: Path) -> None:
    log = tmp_path / "spans"
    out = daemon.cli(
        "submit", "--mem", "1G", "--array", "0-19%4", "--", *TASK, str(log), check=True
    )
    array = int(out.stdout.strip())
    assert f"array {array}: 20 tasks (the first {array}_0), at most 4 at once" in out.stderr
    after = daemon.submit(
        "--mem", "1G", "--after", str(array), cmd=[PY, "-m", "gpuwarden.sim.job", "--seconds", "0"]
    )
    # While it runs, the throttled tasks say why they wait.
    seen = wait_for(
        lambda: (
            lambda js: (
                any((j["reason"] or "").startswith(f"array {array}: 4 of at most 4") for j in js)
                and js
            )
        )(daemon.json("ps", "--array", str(array), "--all")["jobs"]),
        timeout=20,
    )
    assert len(seen) == 20 and [j["array"]["index"] for j in seen] == list(range(20))
    tasks = [j["id"] for j in seen]
    for jid in tasks:
        daemon.wait_state(jid, "succeeded", timeout=90)
    done = daemon.wait_state(after, "succeeded", timeout=30)
    lines = [line.split() for line in log.read_text().splitlines()]
    assert sorted((int(a), int(i)) for a, i, _, _ in lines) == [(array, i) for i in range(20)]
    assert _most_at_once([(float(a), float(b)) for _, _, a, b in lines]) <= 4
    ended = max(daemon.job(j)["ended_at"] for j in tasks)
    assert done["started_at"] >= ended, (done, ended)  # --after ARRAY: every task


def test_tasks_are_named_and_acted_on_one_by_one_or_all_at_once(daemon: Daemon) -> None:
    blocker = daemon.submit("--mem", "1G", cmd=[PY, "-m", "gpuwarden.sim.job", "--seconds", "60"])
    out = daemon.cli(
        "submit",
        "--mem",
        "1G",
        "--after",
        str(blocker),
        "--array",
        "1,3,5-7%2",
        "--",
        PY,
        "-m",
        "gpuwarden.sim.job",
        "--seconds",
        "0",
        check=True,
    )
    a = int(out.stdout.strip())
    jobs = daemon.json("ps", "--array", str(a))["jobs"]
    ids = {j["array"]["index"]: j["id"] for j in jobs}
    assert sorted(ids) == [1, 3, 5, 6, 7] and ids[1] == a
    table = daemon.cli("ps", check=True).stdout
    assert all(f"{a}_{i} " in table for i in ids), table
    shown = daemon.cli("show", f"{a}_5", check=True).stdout
    assert f"job {ids[5]}  queued" in shown
    assert f"array     task {a}_5 (index 5 of array {a}, at most 2 tasks at once)" in shown
    csv = daemon.cli("ps", "--array", str(a), "-o", "id,task", "--format", "csv", check=True).stdout
    assert csv.splitlines()[1:] == [f"{ids[i]},{a}_{i}" for i in sorted(ids)]

    # Through the API too, a dependency on the array's id waits for each task.
    dep = Client(str(daemon.socket)).request(
        "POST", "/v1/jobs", body={"command": ["true"], "cwd": "/", "mem": "1G", "after": [a]}
    )
    assert dep["after"] == sorted(ids.values())
    daemon.cli("hold", str(a), check=True)  # the array's id: every task
    assert {daemon.job(j)["state"] for j in ids.values()} == {"held"}
    daemon.cli("release", f"{a}_3", check=True)  # one task
    assert [daemon.job(ids[i])["state"] for i in (1, 3, 5)] == ["held", "queued", "held"]
    r = daemon.cli("cancel", f"{a}_6", f"{a}_99")
    assert (
        r.returncode == 2
        and r.stderr.strip().splitlines()[-1] == f"gpuwarden: error: no job {a}_99"
    ), r.stderr
    assert daemon.job(ids[6])["state"] == "cancelled"
    assert daemon.job(ids[7])["state"] == "held"
    r = daemon.cli("cancel", str(a))
    assert r.returncode == 2  # task 6 had ended: one error line, the others cancelled
    assert {daemon.job(j)["state"] for j in ids.values()} == {"cancelled"}
    assert len(r.stderr.strip().splitlines()) == 1 and "already cancelled" in r.stderr
    daemon.cli("cancel", str(blocker), check=True)
    assert daemon.wait_state(dep["id"], "cancelled")["reason"].startswith("dependency")


def test_bad_arrays_and_references_are_one_line_errors(daemon: Daemon) -> None:
    for args, said in (
        (("submit", "--array", "5-3", "--", "true"), "'5-3' is not a range"),
        (("submit", "--array", "0-20000", "--", "true"), "more than 10000 tasks"),
        (("submit", "--array", "0-3%0", "--", "true"), "%N needs N from 1"),
        (("show", "12_x"), "is not an index"),
        (("show", "3,4"), "is not one job"),
        (("cancel", "7_"), "is not an index"),
        (("hold", "1-999999"), "invalid job id or range '1-999999'"),
    ):
        r = daemon.cli(*args)
        assert r.returncode == 2, (args, r)
        assert "Traceback" not in r.stderr and said in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
    r = daemon.cli("show", "999_1")
    assert r.returncode == 2 and r.stderr.strip() == "gpuwarden: error: no job 999_1"
    assert daemon.json("ps")["jobs"] == []  # nothing was queued by the bad ones
