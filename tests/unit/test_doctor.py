"""Doctor rules on hand-built snapshots: each rule fires, and stays quiet on the near miss."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwarden.gpus.model import COMPUTE_MODES, GpuFacts, GpuProcessFacts
from gpuwarden.mps.state import MpsDaemon, MpsState
from gpuwarden.observe.doctor import RULE_IDS, RULES, diagnose, summarize
from gpuwarden.observe.doctor_findings import SEVERITIES, Finding
from gpuwarden.observe.leaks import find_leaks
from gpuwarden.observe.snapshot import GpuView, ProcessView, Snapshot, process_state
from gpuwarden.procs.model import Holder, ProcInfo
from gpuwarden.units import GiB, MiB

NODE0, NODE1 = "0-15", "16-31"


def proc(
    pid: int,
    gpu: int,
    *,
    user: str | None = "alice",
    memory: int | None = GiB,
    exists: bool = True,
    status: str = "running",
    cpus: str | None = None,
    env: Mapping[str, str] | None = None,
    torch: bool | None = None,
    garbage: bool = False,
    hint: str | None = None,
    ppid: int = 100,
    orphan: bool = False,
) -> ProcessView:
    from gpuwarden.gpus.topology import parse_cpulist

    info = ProcInfo(
        pid=pid,
        exists=exists,
        start_time=1000.0 if exists else None,
        user=user if exists else None,
        command=f"python job{pid}.py" if exists else None,
        status=status if exists else None,
        ppid=1 if orphan else ppid,
        pgid=pid - 1 if orphan else pid,
        group_leader_alive=not orphan,
        cpus_allowed=None if cpus is None else parse_cpulist(cpus),
        env=env,
        uses_torch=torch,
        garbage=garbage,
        namespace_hint=hint,
    )
    return ProcessView(
        GpuProcessFacts(pid=pid, gpu_index=gpu, memory=memory), info, process_state(info), 60.0
    )


def gpu(
    index: int,
    *procs: ProcessView,
    total: int = 40 * GiB,
    extra: int = 0,
    mode: str | None = "Default",
    persistence: bool | None = True,
    mps: bool | None = False,
    cpus: str | None = NODE0,
    numa: int | None = 0,
    ecc: int | None = 0,
    retired: int | None = 0,
    pending: bool | None = False,
) -> GpuView:
    """A GPU whose used memory is its processes' plus ``extra`` (unaccounted)."""
    used = min(total, sum(p.memory or 0 for p in procs) + extra)
    facts = GpuFacts(
        index=index,
        uuid=f"GPU-{index}",
        name="NVIDIA A100-SXM4-40GB",
        memory_total=total,
        memory_used=used,
        memory_free=total - used,
        compute_mode=mode,
        persistence_mode=persistence,
        mps=mps,
        numa_node=numa,
        cpus=cpus,
        ecc_uncorrected=ecc,
        retired_pages=retired,
        retired_pages_pending=pending,
    )
    return GpuView(facts, tuple(procs))


def snap(
    *gpus: GpuView, holders: Sequence[Holder] = (), in_child: bool = False, now: float = 2000.0
) -> Snapshot:
    return Snapshot(
        taken_at=now,
        backend="test",
        driver_version="535.104.05",
        gpus=gpus,
        holders=tuple(holders),
        in_child_namespace=in_child,
        observer_pid=1,
    )


def run(s: Snapshot, mps: MpsState | None = None) -> list[Finding]:
    return diagnose(s, find_leaks([s]), mps)


def rules(findings: Sequence[Finding], rule: str | None = None) -> list[Finding]:
    return [f for f in findings if rule is None or f.rule == rule]


# --- shared_default_mode ----------------------------------------------------------------


def test_two_users_in_default_mode_is_a_warning() -> None:
    s = snap(
        gpu(3, proc(10, 3, user="dave", memory=10 * GiB), proc(11, 3, user="erin", memory=10 * GiB))
    )
    [f] = rules(run(s), "shared_default_mode")
    assert (f.severity, f.gpu, f.pid) == ("warning", 3, None)
    assert "dave" in f.evidence and "erin" in f.evidence
    assert "nvidia-smi -i 3 -c EXCLUSIVE_PROCESS" in f.remedy
    assert "gpuwarden exec --mem" in f.remedy and "CUDA_VISIBLE_DEVICES" in f.remedy


def test_two_users_on_a_nearly_full_gpu_is_critical() -> None:
    s = snap(
        gpu(0, proc(10, 0, user="dave", memory=20 * GiB), proc(11, 0, user="erin", memory=19 * GiB))
    )  # 1 of 40 GiB free: 2.5%
    [f] = rules(run(s), "shared_default_mode")
    assert f.severity == "critical"
    assert "2.5%" in f.evidence


def test_an_idle_gpu_is_suggested() -> None:
    s = snap(gpu(0, proc(10, 0, user="dave"), proc(11, 0, user="erin")), gpu(1))
    [f] = rules(run(s), "shared_default_mode")
    assert "idle now: GPU 1" in f.remedy


def test_two_users_whose_processes_are_all_gpuwarden_jobs_share_safely() -> None:
    # Each job is held to its budget: no warning about gpuwarden's own packing; one
    # process outside a job (nothing holds it) brings the warning back.
    job = {"GPUWARDEN_JOB": "7"}
    capped = proc(10, 3, user="dave", memory=10 * GiB, env=job)
    other = proc(11, 3, user="erin", memory=10 * GiB, env={"GPUWARDEN_JOB": "8"})
    assert rules(run(snap(gpu(3, capped, other))), "shared_default_mode") == []
    raw = proc(11, 3, user="erin", memory=10 * GiB)
    [f] = rules(run(snap(gpu(3, capped, raw))), "shared_default_mode")
    assert "dave" in f.evidence and "erin" in f.evidence


def test_two_users_whose_torch_was_capped_by_exec_share_safely() -> None:
    # What the rule's fix suggests (`gpuwarden exec --mem`) quiets it, where the
    # environment can be read; a capped environment without torch is not capped.
    capped = {"GPUWARDEN_MEM_LIMIT": str(10 * GiB)}
    dave = proc(10, 3, user="dave", memory=10 * GiB, env=capped, torch=True)
    erin = proc(11, 3, user="erin", memory=10 * GiB, env=capped, torch=True)
    assert rules(run(snap(gpu(3, dave, erin))), "shared_default_mode") == []
    other = proc(11, 3, user="erin", memory=10 * GiB, env=capped, torch=False)
    assert len(rules(run(snap(gpu(3, dave, other))), "shared_default_mode")) == 1


def test_same_user_twice_in_default_mode_is_fine() -> None:
    s = snap(gpu(0, proc(10, 0, user="dave"), proc(11, 0, user="dave")))
    assert rules(run(s), "shared_default_mode") == []


@pytest.mark.parametrize("mode", ["Exclusive_Process", "Prohibited", None])
def test_not_default_mode_is_fine(mode: str | None) -> None:
    s = snap(gpu(0, proc(10, 0, user="dave"), proc(11, 0, user="erin"), mode=mode))
    assert rules(run(s), "shared_default_mode") == []


def test_a_dead_process_does_not_count_as_a_user() -> None:
    s = snap(gpu(0, proc(10, 0, user="dave"), proc(11, 0, exists=False)))
    assert rules(run(s), "shared_default_mode") == []


# --- residual_memory ---------------------------------------------------------------------


def test_memory_with_no_process_is_residual() -> None:
    s = snap(gpu(3, extra=126 * MiB))
    [f] = rules(run(s), "residual_memory")
    assert (f.severity, f.gpu) == ("warning", 3)
    assert "126MiB" in f.evidence
    assert "gpuwarden reap --gpu 3 --yes" in f.remedy
    assert "nvidia-smi -i 3 -pm 0 && nvidia-smi -i 3 -pm 1" in f.remedy


def test_a_few_mib_of_driver_overhead_is_not_residual() -> None:
    s = snap(gpu(3, proc(10, 3), extra=4 * MiB))
    assert rules(run(s), "residual_memory") == []


def test_residual_memory_must_persist_over_the_samples() -> None:
    gone = snap(gpu(3), now=1.0)
    there = snap(gpu(3, extra=300 * MiB), now=2.0)
    f = diagnose(there, find_leaks([gone, there]))
    assert rules(f, "residual_memory") == []


# --- hidden holders and the leak family ----------------------------------------------------


def test_hidden_holder() -> None:
    h = Holder(
        pid=45678,
        devices=("/dev/nvidia2", "/dev/nvidia-uvm"),
        gpu_indices=(2,),
        user="bob",
        command="python notebook.py",
        uses_uvm=True,
    )
    [f] = rules(run(snap(gpu(2), holders=[h])), "hidden_holder")
    assert (f.severity, f.gpu, f.pid) == ("warning", 2, 45678)
    assert "gpuwarden reap --pid 45678 --yes" in f.remedy and "kill 45678" in f.remedy


def test_a_listed_holder_or_a_monitor_is_not_hidden() -> None:
    listed = Holder(pid=10, devices=("/dev/nvidia0",), gpu_indices=(0,))
    monitor = Holder(pid=11, devices=("/dev/nvidiactl",), gpu_indices=())
    s = snap(gpu(0, proc(10, 0)), holders=[listed, monitor])
    assert rules(run(s), "hidden_holder") == []


@pytest.mark.parametrize(
    ("view", "rule", "severity", "remedy"),
    [
        (proc(12345, 0, exists=False), "dead_pid", "warning", "nvidia-smi -i 0 -pm 0"),
        (
            proc(2**32 - 1, 0, exists=False, garbage=True),
            "garbage_pid",
            "warning",
            "pip install -U nvidia-ml-py",
        ),
        (
            proc(88, 0, exists=False, hint="container docker:abc"),
            "other_namespace",
            "info",
            "--pid=host",
        ),
        (proc(23457, 0, status="zombie", ppid=23400), "zombie", "warning", "kill -CHLD 23400"),
        (proc(23456, 0, orphan=True), "orphan", "warning", "gpuwarden reap --pid 23456 --yes"),
    ],
)
def test_each_leaked_pid_kind_has_its_own_remedy(
    view: ProcessView, rule: str, severity: str, remedy: str
) -> None:
    [f] = rules(run(snap(gpu(0, view))), rule)
    assert (f.severity, f.gpu, f.pid) == (severity, 0, view.pid)
    assert remedy in f.remedy


def test_a_running_process_is_no_leak() -> None:
    found = run(snap(gpu(0, proc(10, 0), mode="Exclusive_Process")))
    leak_rules = {
        "dead_pid",
        "garbage_pid",
        "other_namespace",
        "zombie",
        "orphan",
        "hidden_holder",
        "residual_memory",
    }
    assert not [f for f in found if f.rule in leak_rules]


def test_a_self_led_daemon_reparented_to_init_is_no_orphan() -> None:
    v = proc(10, 0, ppid=1)  # its own process group leader: detached on purpose
    assert rules(run(snap(gpu(0, v))), "orphan") == []


# --- numa_mismatch -----------------------------------------------------------------------


def test_cpus_on_the_other_node_are_a_mismatch() -> None:
    s = snap(gpu(2, proc(2332308, 2, cpus="24-47,72-95"), cpus="0-23,48-71"))
    [f] = rules(run(s), "numa_mismatch")
    assert (f.severity, f.gpu, f.pid) == ("warning", 2, 2332308)
    assert "48 of 48" in f.evidence
    assert "taskset -a -cp 0-23,48-71 2332308" in f.remedy
    assert "gpuwarden exec --mem SIZE -- CMD" in f.remedy
    assert "numactl --cpunodebind=0 --membind=0" in f.remedy


def test_cpus_mostly_on_the_other_node_are_a_mismatch() -> None:
    s = snap(gpu(0, proc(10, 0, cpus="0-3,16-31")))  # 16 of 20 outside 0-15
    [f] = rules(run(s), "numa_mismatch")
    assert "16 of 20" in f.evidence


@pytest.mark.parametrize("allowed", ["0-15", "0-31", "4-7", "0-7,16-23"])
def test_cpus_overlapping_the_gpu_node_are_fine(allowed: str) -> None:
    assert rules(run(snap(gpu(0, proc(10, 0, cpus=allowed)))), "numa_mismatch") == []


def test_unknown_cpus_give_no_numa_finding() -> None:
    assert rules(run(snap(gpu(0, proc(10, 0, cpus=None)))), "numa_mismatch") == []
    unknown_gpu = snap(gpu(0, proc(10, 0, cpus=NODE1), cpus=None))
    assert rules(run(unknown_gpu), "numa_mismatch") == []
    garbled_gpu = snap(gpu(0, proc(10, 0, cpus=NODE1), cpus="zero-seven"))
    assert rules(run(garbled_gpu), "numa_mismatch") == []


def test_a_process_on_gpus_of_both_nodes_is_judged_against_both() -> None:
    s = snap(gpu(0, proc(10, 0, cpus="0-31")), gpu(1, proc(10, 1, cpus="0-31"), cpus=NODE1, numa=1))
    assert rules(run(s), "numa_mismatch") == []


# --- persistence_off ---------------------------------------------------------------------


def test_persistence_off() -> None:
    [f] = rules(run(snap(gpu(1, persistence=False))), "persistence_off")
    assert (f.severity, f.gpu) == ("warning", 1)
    assert "nvidia-smi -i 1 -pm 1" in f.remedy


@pytest.mark.parametrize("persistence", [True, None])
def test_persistence_on_or_unknown_is_fine(persistence: bool | None) -> None:
    assert rules(run(snap(gpu(1, persistence=persistence))), "persistence_off") == []


# --- MPS ---------------------------------------------------------------------------------


def test_mps_gpu_shared_by_users() -> None:
    s = snap(gpu(0, proc(10, 0, user="dave"), proc(11, 0, user="erin"), mps=True))
    state = MpsState((MpsDaemon(pid=500, kind="server", user="dave"),))
    found = run(s, state)
    [f] = rules(found, "mps_shared_users")
    assert (f.severity, f.gpu) == ("warning", 0)
    assert "no memory isolation" in f.evidence and "runs as dave" in f.evidence
    assert "echo quit | nvidia-cuda-mps-control" in f.remedy
    assert rules(found, "shared_default_mode") == []  # one finding for one problem


def test_mps_gpu_of_one_user_is_fine() -> None:
    s = snap(gpu(0, proc(10, 0, user="dave"), proc(11, 0, user="dave"), mps=True))
    assert rules(run(s), "mps_shared_users") == []


def test_mps_daemon_without_memory_limit() -> None:
    state = MpsState(
        (
            MpsDaemon(
                pid=500,
                kind="control",
                user="root",
                visible_devices="2",
                pipe_dir="/tmp/nvidia-mps",
            ),
            MpsDaemon(pid=501, kind="server", user="root"),
        )
    )
    s = snap(gpu(1), gpu(2, proc(10, 2, user="dave"), proc(11, 2, user="erin")))
    [f] = rules(run(s, state), "mps_no_memory_limit")
    assert (f.severity, f.gpu, f.pid) == ("warning", 2, 500)
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" in f.evidence
    assert (
        "echo set_default_device_pinned_mem_limit 0 20G | "
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps nvidia-cuda-mps-control"
    ) in f.remedy
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT='0=20G'" in f.remedy


def test_mps_daemon_for_every_gpu_limits_each() -> None:
    state = MpsState((MpsDaemon(pid=500, kind="control", pipe_dir="/run/mps"),))
    [f] = rules(run(snap(gpu(0), gpu(1)), state), "mps_no_memory_limit")
    assert f.gpu is None
    assert "for d in 0 1; do echo set_default_device_pinned_mem_limit $d 20G" in f.remedy
    assert "CUDA_MPS_PIPE_DIRECTORY=/run/mps nvidia-cuda-mps-control" in f.remedy
    assert "'0=20G,1=20G'" in f.remedy


def test_mps_daemon_with_limit_or_unknown_environment_is_fine() -> None:
    limited = MpsState(
        (MpsDaemon(pid=500, kind="control", pipe_dir="/tmp/nvidia-mps", pinned_mem_limit="0=16G"),)
    )
    unreadable = MpsState((MpsDaemon(pid=500, kind="control"),))  # not root: unknown
    for state in (limited, unreadable, MpsState(), None):
        assert rules(run(snap(gpu(0)), state), "mps_no_memory_limit") == []


# --- alloc_conf_unset --------------------------------------------------------------------


def test_big_torch_process_without_alloc_conf() -> None:
    s = snap(gpu(2, proc(10, 2, memory=30 * GiB, torch=True, env={})))
    [f] = rules(run(s), "alloc_conf_unset")
    assert (f.severity, f.gpu, f.pid) == ("info", 2, 10)
    assert f.remedy.startswith("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")


@pytest.mark.parametrize(
    ("memory", "torch", "env"),
    [
        (30 * GiB, True, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
        (30 * GiB, True, {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}),
        (30 * GiB, True, None),  # environment unreadable: we do not know
        (30 * GiB, False, {}),
        (30 * GiB, None, {}),
        (9 * GiB, True, {}),  # under a quarter of 40 GiB
        (None, True, {}),
    ],
)
def test_alloc_conf_near_misses(
    memory: int | None, torch: bool | None, env: dict[str, str] | None
) -> None:
    s = snap(gpu(0, proc(10, 0, memory=memory, torch=torch, env=env)))
    assert rules(run(s), "alloc_conf_unset") == []


# --- ECC -----------------------------------------------------------------------------------


def test_uncorrected_ecc_is_critical() -> None:
    [f] = rules(run(snap(gpu(5, ecc=2))), "ecc_uncorrected")
    assert (f.severity, f.gpu) == ("critical", 5)
    assert "nvidia-smi -i 5 -r" in f.remedy


def test_pending_retirement_is_critical() -> None:
    [f] = rules(run(snap(gpu(5, pending=True))), "retired_pages_pending")
    assert f.severity == "critical"
    assert "nvidia-smi -i 5 -r" in f.remedy


@pytest.mark.parametrize(("count", "severity"), [(3, "info"), (60, "warning")])
def test_retired_pages(count: int, severity: str) -> None:
    [f] = rules(run(snap(gpu(5, retired=count))), "retired_pages")
    assert f.severity == severity


def test_clean_or_unknown_ecc_is_fine() -> None:
    for s in (snap(gpu(0)), snap(gpu(0, ecc=None, retired=None, pending=None))):
        found = run(s)
        assert not [f for f in found if f.rule.startswith(("ecc", "retired"))]


# --- container namespace, ordering, registry -------------------------------------------------


def test_child_namespace_is_one_info_finding() -> None:
    [f] = rules(run(snap(gpu(0), in_child=True)), "container_namespace")
    assert (f.severity, f.gpu, f.pid) == ("info", None, None)
    assert rules(run(snap(gpu(0))), "container_namespace") == []


def test_a_healthy_machine_has_no_findings() -> None:
    s = snap(
        gpu(0, proc(10, 0, user="dave", cpus=NODE0, torch=True, env={}, memory=GiB)),
        gpu(1, cpus=NODE1, numa=1),
    )
    assert run(s) == []


def test_findings_sort_by_severity_then_gpu() -> None:
    s = snap(
        gpu(3, persistence=False),
        gpu(1, persistence=False, ecc=1),
        gpu(0, proc(10, 0, memory=30 * GiB, torch=True, env={})),
        in_child=True,
    )
    found = run(s)
    keys = [(f.severity, f.gpu) for f in found]
    assert keys == [("critical", 1), ("warning", 1), ("warning", 3), ("info", None), ("info", 0)]
    assert summarize(found) == {"critical": 1, "warning": 2, "info": 2}


def test_registry_is_complete_and_ids_are_stable() -> None:
    assert len(set(RULE_IDS)) == len(RULE_IDS)
    assert all(r.__doc__ for r in RULES)
    assert all(rid.islower() and " " not in rid for rid in RULE_IDS)


# --- property: never raises, always actionable ------------------------------------------------

_users = st.sampled_from(["alice", "bob", None])
_cpulists = st.sampled_from([None, "0-15", "16-31", "0-31", "3", "", "bogus", "7-2"])


@st.composite
def _process(draw: st.DrawFn, pid: int, index: int) -> ProcessView:
    cpus = draw(st.one_of(st.none(), st.frozensets(st.integers(0, 40), max_size=6)))
    info = ProcInfo(
        pid=pid,
        exists=draw(st.booleans()),
        user=draw(_users),
        status=draw(st.sampled_from(["running", "zombie", "sleeping", None])),
        ppid=draw(st.sampled_from([None, 1, 99])),
        pgid=draw(st.sampled_from([None, pid, 5])),
        group_leader_alive=draw(st.sampled_from([None, True, False])),
        cpus_allowed=cpus,
        env=draw(st.sampled_from([None, {}, {"PYTORCH_CUDA_ALLOC_CONF": "x"}])),
        uses_torch=draw(st.sampled_from([None, True, False])),
        garbage=draw(st.booleans()),
        namespace_hint=draw(st.sampled_from([None, "container x"])),
    )
    mem = draw(st.one_of(st.none(), st.integers(0, 50 * GiB)))
    return ProcessView(
        GpuProcessFacts(pid=pid, gpu_index=index, memory=mem), info, process_state(info), None
    )


@st.composite
def _snapshots(draw: st.DrawFn) -> tuple[Snapshot, MpsState | None]:
    views = []
    pid = 10
    for index in range(draw(st.integers(0, 3))):
        total = draw(st.integers(0, 80 * GiB))
        used = draw(st.integers(0, 80 * GiB))
        procs = []
        for _ in range(draw(st.integers(0, 3))):
            pid += draw(st.integers(1, 3))
            procs.append(draw(_process(pid, index)))
        facts = GpuFacts(
            index=index,
            uuid=f"GPU-{index}",
            name="sim",
            memory_total=total,
            memory_used=used,
            memory_free=total - used,
            compute_mode=draw(st.sampled_from((*COMPUTE_MODES, None))),
            persistence_mode=draw(st.sampled_from([None, True, False])),
            mps=draw(st.sampled_from([None, True, False])),
            numa_node=draw(st.sampled_from([None, 0, 1])),
            cpus=draw(_cpulists),
            ecc_uncorrected=draw(st.sampled_from([None, 0, 1])),
            retired_pages=draw(st.sampled_from([None, 0, 2, 99])),
            retired_pages_pending=draw(st.sampled_from([None, False, True])),
            driver_baseline=draw(st.integers(0, GiB)),
        )
        views.append(GpuView(facts, tuple(procs)))
    holders = [
        Holder(
            pid=p,
            devices=("/dev/nvidia0",),
            gpu_indices=tuple(
                draw(st.lists(st.sampled_from(range(len(views))), max_size=2, unique=True))
                if views
                else ()
            ),
        )
        for p in draw(st.lists(st.integers(1, 40), max_size=3, unique=True))
    ]
    s = snap(*views, holders=holders, in_child=draw(st.booleans()))
    daemons = draw(
        st.lists(
            st.builds(
                MpsDaemon,
                pid=st.integers(1, 100),
                kind=st.sampled_from(["control", "server"]),
                user=_users,
                pipe_dir=st.sampled_from([None, "/tmp/mps"]),
                visible_devices=st.sampled_from([None, "0", "0,1", ""]),
                pinned_mem_limit=st.sampled_from([None, "", "0=8G"]),
            ),
            max_size=3,
        )
    )
    mps = draw(st.sampled_from([None, MpsState(tuple(daemons))]))
    return s, mps


@settings(max_examples=300, deadline=None)
@given(_snapshots())
def test_diagnose_never_raises_and_every_finding_is_actionable(
    case: tuple[Snapshot, MpsState | None],
) -> None:
    s, mps = case
    found = diagnose(s, find_leaks([s]), mps)
    indices = {g.index for g in s.gpus}
    order = {sev: i for i, sev in enumerate(SEVERITIES)}
    for f in found:
        assert f.severity in SEVERITIES
        assert f.rule in RULE_IDS
        assert f.remedy.strip() and f.evidence.strip()
        assert f.gpu is None or f.gpu in indices or f.rule == "mps_no_memory_limit"
    sev_keys = [order[f.severity] for f in found]
    assert sev_keys == sorted(sev_keys)
    json.dumps([f.to_json() for f in found])
    assert sum(summarize(found).values()) == len(found)
