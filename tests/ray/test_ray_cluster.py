"""gpuwarden on a real local Ray cluster (two nodes on loopback, 2 simulated 24 GiB GPUs
each, declared to Ray with --num-gpus and gpuwarden's memory resources): jobs placed by
their memory share, the enforcement environment on the node, OOM retried through Ray
with a bigger budget, the job's leftovers killed, cluster status, and the task
decorator."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.paths import EXAMPLES, SRC
from tests.integration.daemon_fixture import free_port

ray = pytest.importorskip("ray")

from ray.job_submission import JobStatus, JobSubmissionClient  # noqa: E402

from gpuwarden.errors import UsageError  # noqa: E402
from gpuwarden.ray.shares import resources_flag  # noqa: E402

pytestmark = pytest.mark.ray
GiB = 1 << 30
PY = sys.executable
DONE = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED)
NODE2 = "gwtest_node2"  # a Ray resource only the second node has


class Cluster:
    def __init__(
        self, gcs: str, dashboard: str, env: dict[str, str], node2_env: dict[str, str]
    ) -> None:
        self.gcs = gcs
        self.dashboard = dashboard
        self.env = env
        self.node2_env = node2_env  # the second node's: its own GPUWARDEN_HOME and GPUs
        self.client = JobSubmissionClient(dashboard)

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [PY, "-m", "gpuwarden", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and r.returncode != 0:
            raise AssertionError(f"{args}: {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def submit(self, *args: str) -> str:
        return self.cli("submit", "--cluster", self.dashboard, *args).stdout.strip()

    def wait(self, sid: str, timeout: float = 90) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.client.get_job_status(sid) in DONE:
                return self.client.get_job_status(sid)
            time.sleep(0.3)
        raise AssertionError(
            f"{sid} still {self.client.get_job_status(sid)}: {self.client.get_job_logs(sid)}"
        )

    def logs(self, sid: str) -> str:
        return str(self.client.get_job_logs(sid))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    tmp = Path(tempfile.mkdtemp(prefix="gwray-"))
    port, dash = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "CUDA_", "RAY_"))}
    env.update(
        GPUWARDEN_SIM=str(EXAMPLES / "idle-2gpu.json"),
        GPUWARDEN_SIM_STATE=str(tmp / "sim"),
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONPATH=str(SRC),
        PATH=f"{Path(PY).parent}{os.pathsep}{env.get('PATH', '')}",
        GPUWARDEN_HOME=str(tmp / "gw"),
    )
    res = resources_flag([24 * GiB, 24 * GiB])
    ray_bin = str(Path(PY).parent / "ray")
    common = ["--num-gpus=2", "--num-cpus=4", f"--resources={res}", "--disable-usage-stats"]
    subprocess.run(
        [
            ray_bin,
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dash}",
            f"--temp-dir={tmp / 'ray'}",
            *common,
        ],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    try:
        # A second node on the same host: its agents need ports of their own.
        own = [
            f"--{flag}={free_port()}"
            for flag in (
                "dashboard-agent-listen-port",
                "dashboard-agent-grpc-port",
                "metrics-export-port",
                "runtime-env-agent-port",
                "node-manager-port",
                "object-manager-port",
            )
        ]
        # ... and GPUs of its own: its simulated driver keeps a separate state (and a
        # gpuwarden home of its own, where one test runs the node's daemon).
        # A resource of its own lets a test send a job there.
        env2 = {**env, "GPUWARDEN_SIM_STATE": str(tmp / "sim2"), "GPUWARDEN_HOME": str(tmp / "gw2")}
        res2 = json.dumps({**json.loads(res), NODE2: 1})
        subprocess.run(
            [
                ray_bin,
                "start",
                f"--address=127.0.0.1:{port}",
                "--node-ip-address=127.0.0.1",
                *own,
                *common,
                f"--resources={res2}",
            ],
            env=env2,
            check=True,
            capture_output=True,
            timeout=120,
        )
        c = Cluster(f"127.0.0.1:{port}", f"http://127.0.0.1:{dash}", env, env2)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the dashboard answers a little later
            try:
                c.client = JobSubmissionClient(c.dashboard)
                break
            except Exception:
                time.sleep(0.5)
        yield c
    finally:
        subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(tmp, ignore_errors=True)


def sim(mem: str, seconds: float) -> list[str]:
    return ["python", "-m", "gpuwarden.sim.job", "--mem", mem, "--seconds", str(seconds)]


def test_jobs_are_placed_by_memory_share_and_run_with_the_budget_enforced(cluster: Cluster) -> None:
    from gpuwarden.ray.submit import submit

    probe = (
        "import os, json, time; env = {k: os.environ.get(k) for k in "
        "('CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER', 'GPUWARDEN_MEM_LIMIT', "
        "'PYTHONPATH')}; env['start'] = time.time(); time.sleep(6); "
        "env['end'] = time.time(); print('ENV', json.dumps(env))"
    )
    # 0.5 GPU each: the 4 GPUs of the two nodes hold 8 at once, two a GPU, never three
    sids = [
        submit(
            cluster.dashboard,
            mem=12 * GiB,
            gpus=1,
            command=["python", "-c", probe],
            name=f"half-{i}",
            env={"GPUWARDEN_SIM": cluster.env["GPUWARDEN_SIM"]},
        )
        for i in range(10)
    ]
    assert all(cluster.wait(s) == JobStatus.SUCCEEDED for s in sids)
    jobs = {j.submission_id: j for j in cluster.client.list_jobs()}
    spans: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for s in sids:
        log = cluster.logs(s)
        line = next(x for x in log.splitlines() if x.startswith("ENV "))
        env = json.loads(line[4:])
        assert env["GPUWARDEN_MEM_LIMIT"] == str(12 * GiB)
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert env["PYTHONPATH"].split(os.pathsep)[0].endswith("hooks")
        assert "its GPU memory is back" in log
        j = jobs[s]
        assert j.metadata["mem"] == str(12 * GiB)
        key = (j.driver_node_id or "", env["CUDA_VISIBLE_DEVICES"])
        spans.setdefault(key, []).append((env["start"], env["end"]))
    most = max(_most_at_once(v) for v in spans.values())
    assert most == 2, spans  # shared, and never more than two halves on a GPU
    assert len({node for node, _ in spans}) == 2  # both nodes were used


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    now = best = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def test_a_job_wider_than_the_share_waits_for_room(cluster: Cluster) -> None:
    from gpuwarden.ray.submit import submit

    big = [
        submit(cluster.dashboard, mem=20 * GiB, gpus=1, command=sim("18G", 6)) for _ in range(5)
    ]  # 0.8333 GPU each: four GPUs, four at a time
    deadline = time.monotonic() + 30
    while sum(cluster.client.get_job_status(s) == JobStatus.RUNNING for s in big) < 4:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    statuses = [cluster.client.get_job_status(s) for s in big]
    assert statuses.count(JobStatus.RUNNING) == 4 and JobStatus.PENDING in statuses, statuses
    assert all(cluster.wait(s) == JobStatus.SUCCEEDED for s in big)  # none ran out of memory


def test_a_cuda_oom_is_retried_through_ray_with_a_bigger_budget(cluster: Cluster) -> None:
    sid = cluster.submit("--mem", "6G", "--retries", "1", "--name", "grower", "--", *sim("7G", 1))
    assert cluster.wait(sid) == JobStatus.FAILED
    log = cluster.logs(sid)
    assert "CUDA out of memory" in log and "retry 1 of 1; submitted again as Ray job" in log, log
    retry = log.split("submitted again as Ray job ")[1].split()[0]
    assert cluster.wait(retry) == JobStatus.SUCCEEDED, cluster.logs(retry)
    meta = next(j.metadata for j in cluster.client.list_jobs() if j.submission_id == retry)
    assert meta["attempt"] == "1" and int(meta["mem"]) == int(6 * GiB * 1.25)


def test_what_a_job_leaves_behind_is_killed(cluster: Cluster, tmp_path: Path) -> None:
    pidfile = tmp_path / "orphan"
    script = (
        f"import subprocess, sys; p = subprocess.Popen([sys.executable, '-m', "
        f"'gpuwarden.sim.job', '--mem', '2G', '--seconds', '300'], "
        f"start_new_session=True); open('{pidfile}', 'w').write(str(p.pid))"
    )
    sid = cluster.submit("--mem", "4G", "--", "python", "-c", script)
    assert cluster.wait(sid) == JobStatus.SUCCEEDED
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid), "the job's orphan survived it"
    assert "its GPU memory is back" in cluster.logs(sid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def test_cluster_status_shows_each_nodes_budgets(cluster: Cluster) -> None:
    sid = cluster.submit("--mem", "10G", "--", *sim("9G", 6))
    deadline = time.monotonic() + 30
    while cluster.client.get_job_status(sid) != JobStatus.RUNNING:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    data = json.loads(
        cluster.cli("cluster", "status", "--cluster", cluster.dashboard, "--json").stdout
    )
    nodes = data["nodes"]
    assert len(nodes) == 2 and all(n["gpus"] == 2 and n["memory"] == 48 * GiB for n in nodes)
    busy = [n for n in nodes if sid in n["jobs"]]
    assert len(busy) == 1 and busy[0]["in_use"] == 10 * GiB and busy[0]["free"] == 38 * GiB
    text = cluster.cli("cluster", "status", "--cluster", cluster.dashboard).stdout
    assert "2 node(s)" in text and "10.0GiB of 48.0GiB" in text
    cluster.wait(sid)


def test_the_task_decorator_places_and_caps_by_budget(cluster: Cluster) -> None:
    import gpuwarden.ray

    os.environ.update(GPUWARDEN_SIM=cluster.env["GPUWARDEN_SIM"])
    ray.init(address=cluster.gcs, ignore_reinit_error=True, log_to_driver=False)
    try:

        @gpuwarden.ray.remote(mem="8G")
        def where() -> dict[str, Any]:
            return {
                "gpus": ray.get_gpu_ids(),
                "budget": os.environ.get("GPUWARDEN_BUDGET"),
                "limit": os.environ.get("GPUWARDEN_MEM_LIMIT"),
            }

        got = ray.get([where.remote() for _ in range(6)], timeout=120)
        assert where.ask.num_gpus == 0.3333
        assert all(g["budget"] == str(8 * GiB) and g["limit"] == str(8 * GiB) for g in got)
        assert all(len(g["gpus"]) == 1 for g in got)
    finally:
        ray.shutdown()


def test_a_task_out_of_gpu_memory_is_run_again_with_a_bigger_budget(cluster: Cluster) -> None:
    import gpuwarden.ray

    os.environ.update(GPUWARDEN_SIM=cluster.env["GPUWARDEN_SIM"])
    ray.init(address=cluster.gcs, ignore_reinit_error=True, log_to_driver=False)
    try:

        @gpuwarden.ray.remote(mem="6G", oom_retries=2)
        def grow(size: str) -> tuple[str, list[int]]:
            # A simulated CUDA program under the task's cap: it fails with PyTorch's OOM
            # message while the cap is under its need.
            r = subprocess.run(
                [sys.executable, "-m", "gpuwarden.sim.job", "--mem", size, "--seconds", "0.2"],
                capture_output=True,
                text=True,
            )
            if r.returncode != 0:
                raise RuntimeError(r.stderr.strip().splitlines()[-1])
            return os.environ["GPUWARDEN_BUDGET"], ray.get_gpu_ids()

        budget, gpus = ray.get(grow.remote("7G"), timeout=120)
        assert int(budget) == int(6 * GiB * 1.25) and len(gpus) == 1  # one retry: 7.5 GiB
        with pytest.raises(ray.exceptions.RayTaskError, match="CUDA out of memory"):
            ray.get(grow.remote("11G"), timeout=120)  # 6 -> 7.5 -> 9.375 GiB: not enough

        @gpuwarden.ray.remote(mem="6G")
        def once(size: str) -> str:
            return grow.fn(size)[0]

        with pytest.raises(ray.exceptions.RayTaskError, match="CUDA out of memory"):
            ray.get(once.remote("7G"), timeout=120)  # no oom_retries: Ray's error as is
    finally:
        ray.shutdown()


def test_the_decorator_makes_budgeted_actors(cluster: Cluster) -> None:
    import gpuwarden.ray

    ray.init(address=cluster.gcs, ignore_reinit_error=True, log_to_driver=False)
    try:

        @gpuwarden.ray.remote(mem="16G")
        class Holder:
            def __init__(self, tag: str) -> None:
                self.tag = tag
                self.budget = os.environ.get("GPUWARDEN_BUDGET")  # set before __init__

            def where(self) -> tuple[str, str | None, list[int]]:
                return self.tag, self.budget, ray.get_gpu_ids()

        holders = [Holder.remote(f"h{i}") for i in range(4)]  # 0.6667 GPU: one a GPU
        got = ray.get([h.where.remote() for h in holders], timeout=120)
        assert [g[0] for g in got] == ["h0", "h1", "h2", "h3"]
        assert all(g[1] == str(16 * GiB) and len(g[2]) == 1 for g in got)
        assert Holder.ask is not None and Holder.ask.num_gpus == 0.6666
        fifth = Holder.remote("h4")  # no GPU has 16 GiB left: it waits for one
        ready, _ = ray.wait([fifth.where.remote()], timeout=3)
        assert not ready
        ray.kill(holders[0])
        assert ray.get(fifth.where.remote(), timeout=60)[0] == "h4"
        with pytest.raises(UsageError, match="oom_retries is for tasks"):
            gpuwarden.ray.remote(mem="1G", oom_retries=1)(Holder.cls)
    finally:
        ray.shutdown()


def test_bad_input_is_one_line(cluster: Cluster) -> None:
    r = cluster.cli("submit", "--cluster", cluster.dashboard, "--", "true", check=False)
    assert r.returncode == 2 and "--cluster needs --mem" in r.stderr
    r = cluster.cli(
        "submit", "--cluster", "ray://127.0.0.1:1", "--mem", "1G", "--", "true", check=False
    )
    assert r.returncode == 3 and "no Ray cluster at http://127.0.0.1:1" in r.stderr, r.stderr
    r = cluster.cli(
        "submit", "--cluster", cluster.dashboard, "--mem", "30G", "--", "true", check=False
    )
    assert r.returncode == 2 and "more than the smallest GPU" in r.stderr
    assert "Traceback" not in r.stderr


def test_cluster_status_can_bring_each_nodes_own_snapshot(cluster: Cluster) -> None:
    data = json.loads(
        cluster.cli(
            "cluster", "status", "--cluster", cluster.dashboard, "--snapshots", "--json"
        ).stdout
    )
    snaps = [n["snapshot"] for n in data["nodes"]]
    assert all(s and "error" not in s for s in snaps), snaps
    assert [g["name"] for g in snaps[0]["gpus"]] == ["NVIDIA L4", "NVIDIA L4"]
    assert snaps[0]["gpus"][0]["memory_total"] == 24 * GiB
    assert all(n["in_use"] == 0 for n in data["nodes"])  # the snapshot jobs hold no budget
    text = cluster.cli("cluster", "status", "--cluster", cluster.dashboard, "--snapshots").stdout
    assert "GPU 0 NVIDIA L4: 0B of 24.0GiB used, 0 process(es)" in text, text


@pytest.fixture(scope="module")
def node2(cluster: Cluster) -> Iterator[Callable[..., subprocess.CompletedProcess[str]]]:
    """A gpuwarden daemon on the second node (the tests that use it come last: from then
    on, the jobs Ray places there are registered with it). Yields its CLI."""
    env = cluster.node2_env
    home = Path(env["GPUWARDEN_HOME"])
    home.mkdir(mode=0o700, exist_ok=True)
    (home / "config.toml").write_text('interval = "100ms"\ngrace = "2s"\n')

    def gw(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PY, "-m", "gpuwarden", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )

    gw("daemon", "start")
    try:
        yield gw
    finally:
        subprocess.run(
            [PY, "-m", "gpuwarden", "daemon", "stop"], env=env, capture_output=True, timeout=60
        )


def _settled(gw: Callable[..., subprocess.CompletedProcess[str]]) -> list[dict[str, Any]]:
    """The node daemon's jobs once every ended one has its memory back."""
    deadline = time.monotonic() + 30
    while True:
        jobs: list[dict[str, Any]] = json.loads(gw("ps", "--all", "--json").stdout)["jobs"]
        if (
            all(j["memory_release"] and j["memory_release"]["released_at"] for j in jobs)
            or time.monotonic() > deadline
        ):
            return jobs
        time.sleep(0.2)


def test_jobs_on_a_node_with_a_daemon_are_registered_with_it(
    cluster: Cluster, node2: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    """The second node runs a gpuwarden daemon: the jobs Ray places there show in its
    queue as jobs attached by their Ray job, with their budget, peak and memory check;
    the first node has none, and its jobs run as before."""
    from gpuwarden.ray.submit import submit

    # 0.8333 GPU each: one to a GPU, so four at once are spread over both nodes.
    sids = [
        submit(cluster.dashboard, mem=20 * GiB, gpus=1, command=sim("18G", 8), name=f"reg-{i}")
        for i in range(4)
    ]
    assert all(cluster.wait(s) == JobStatus.SUCCEEDED for s in sids)
    registered = [s for s in sids if "with this node's gpuwarden daemon" in cluster.logs(s)]
    assert 1 <= len(registered) < len(sids), [cluster.logs(s) for s in sids]
    jobs = _settled(node2)
    assert sorted(j["attach"] for j in jobs) == sorted(f"ray job {s}" for s in registered)
    for j in jobs:
        assert j["state"] == "succeeded" and j["budget"] == 20 * GiB, j
        assert j["peak_memory"] == 18.5 * GiB and j["name"].startswith("reg-"), j  # + context
        assert j["memory_release"]["how"] == "verified", j


def test_a_ray_job_the_node_daemon_preempts_is_submitted_again(
    cluster: Cluster, node2: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    from gpuwarden.ray.submit import submit

    sid = submit(
        cluster.dashboard,
        mem=20 * GiB,
        gpus=1,
        command=sim("18G", 20),
        name="be",
        qos="besteffort",
        resources={NODE2: 0.001},
    )
    label = f"ray job {sid}"
    deadline = time.monotonic() + 60
    while True:
        mine = [
            j
            for j in json.loads(node2("ps", "--json").stdout)["jobs"]
            if j["attach"] == label and j["state"] == "running"
        ]
        if mine:
            break
        assert time.monotonic() < deadline, cluster.logs(sid)
        time.sleep(0.2)
    [job] = mine
    assert job["qos"] == "besteffort"
    # Someone on the node needs that GPU's memory, with a higher class.
    local = int(
        node2(
            "submit",
            "--qos",
            "guaranteed",
            "--mem",
            "20G",
            "--gpu-ids",
            str(job["gpus"][0]),
            "--",
            *sim("18G", 2),
        ).stdout
    )
    assert cluster.wait(sid) == JobStatus.FAILED
    log = cluster.logs(sid)
    assert "preempted by this node's gpuwarden daemon; submitted again as Ray job" in log, log
    again = log.split("submitted again as Ray job ")[1].split()[0]
    assert cluster.wait(again) == JobStatus.SUCCEEDED, cluster.logs(again)
    jobs = {j["id"]: j for j in _settled(node2)}
    assert jobs[local]["state"] == "succeeded"
    assert jobs[job["id"]]["state"] == "cancelled"
    assert jobs[job["id"]]["reason"] == f"preempted; {label} may start it again"
    assert any(
        j["attach"] == f"ray job {again}" and j["state"] == "succeeded" for j in jobs.values()
    )
