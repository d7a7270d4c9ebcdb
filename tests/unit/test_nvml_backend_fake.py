"""NvmlBackend over a fake NVML library (tests/fake_nvml.py) under the real pynvml: the
facts it reports for datacenter, consumer, old-driver, lost and MIG GPUs, without a GPU."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pynvml
import pytest

from gpuwarden.errors import BackendUnavailable, GpuwardenError, PermissionDenied, UsageError
from gpuwarden.gpus.nvml import NvmlBackend
from tests.fake_nvml import (
    GPU_IS_LOST,
    NO_PERMISSION,
    NOT_SUPPORTED,
    FakeGpu,
    FakeNvmlLibrary,
    FakeProcess,
    installed,
)
from tests.fake_nvml_machines import (
    R470_MISSING,
    GiB,
    MiB,
    a100_in_mig_mode,
    geforce_with_little_support,
    h100_with_processes,
    v100_on_an_old_driver,
)

UNKNOWN = 999  # NVML_ERROR_UNKNOWN


@contextmanager
def opened(library: FakeNvmlLibrary) -> Iterator[NvmlBackend]:
    """NvmlBackend.open() as a machine with ``library`` for its driver runs it."""
    with installed(library):
        backend = NvmlBackend.open()
        try:
            yield backend
        finally:
            backend.close()


def one_gpu(**fields: object) -> FakeGpu:
    base: dict[str, object] = dict(
        uuid="GPU-00000000-0000-0000-0000-00000000000a",
        name="NVIDIA L40S",
        bus_id="0000FA11:81:00.0",
        minor=3,
        total=48 * GiB,
    )
    base.update(fields)
    return FakeGpu(**base)  # type: ignore[arg-type]


class TestDatacenterGpu:
    def test_every_field_the_driver_answers(self) -> None:
        with opened(FakeNvmlLibrary(h100_with_processes())) as nv:
            g0, g1 = nv.gpus()
            assert nv.warnings == []
        assert (g0.index, g0.uuid, g0.name) == (
            0,
            "GPU-11111111-2222-3333-4444-000000000000",
            "NVIDIA H100 80GB HBM3",
        )
        assert (g0.memory_total, g0.memory_used, g0.memory_reserved) == (
            80 * GiB,
            41 * GiB,
            512 * MiB,
        )
        assert g0.memory_used + g0.memory_free + (g0.memory_reserved or 0) == g0.memory_total
        assert (g0.utilization, g0.memory_utilization, g0.temperature) == (93, 41, 61)
        assert (g0.power_watts, g0.power_limit_watts) == (512.345, 700.0)
        assert (g0.compute_mode, g0.persistence_mode, g0.mig_mode, g0.mps) == (
            "Default",
            True,
            False,
            False,
        )
        assert (g0.pci_bus_id, g0.minor_number, g0.numa_node) == ("0000FA11:17:00.0", 0, 0)
        assert g0.cpus == "0-7,16-23"  # from NVML's affinity mask: sysfs has no such bus
        # Row remapping: corrected + uncorrected rows, and a remap pending.
        assert (g0.ecc_uncorrected, g0.retired_pages, g0.retired_pages_pending) == (3, 3, True)
        assert (g0.nvlink_peers, g1.nvlink_peers) == ((1,), (0,))
        assert (g1.memory_used, g1.memory_free, g1.cpus) == (0, 80 * GiB - 512 * MiB, "8-15,24-31")
        assert g0.mig_instances == ()

    def test_gpus_behind_nvswitch_all_reach_each_other(self) -> None:
        gpus = [*h100_with_processes(), one_gpu(nvlinks=["0000FA11:F0:00.0"] * 18)]
        for g in gpus:
            g.nvlink_remote_type = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        with opened(FakeNvmlLibrary(gpus)) as nv:
            assert [g.nvlink_peers for g in nv.gpus()] == [(1, 2), (0, 2), (0, 1)]

    def test_processes_with_their_memory_and_sm_share(self) -> None:
        with opened(FakeNvmlLibrary(h100_with_processes())) as nv:
            procs = nv.processes()
        assert [
            (p.pid, p.gpu_index, p.memory, p.kinds, p.sm_utilization, p.mig_uuid) for p in procs
        ] == [
            (4101, 0, 30 * GiB, ("compute",), 87, None),
            (4102, 0, 10 * GiB, ("compute",), 12, None),
        ]

    def test_device_files_by_minor_number_and_the_driver_version(self) -> None:
        with opened(FakeNvmlLibrary(h100_with_processes(), driver="550.90.07")) as nv:
            files = nv.device_files()
            assert nv.driver_version() == "550.90.07"
        assert files["/dev/nvidia0"] == 0 and files["/dev/nvidia1"] == 1
        assert files["/dev/nvidiactl"] is None and files["/dev/nvidia-uvm"] is None

    def test_device_files_follow_the_minor_number_not_the_index(self) -> None:
        with opened(FakeNvmlLibrary([one_gpu(minor=3)])) as nv:
            files = nv.device_files()
        assert files["/dev/nvidia3"] == 0 and "/dev/nvidia0" not in files

    def test_a_process_without_samples_has_no_sm_share(self) -> None:
        gpus = h100_with_processes()
        for p in gpus[0].compute:
            p.sm_util = None  # the driver answers NOT_FOUND: nothing sampled in the window
        with opened(FakeNvmlLibrary(gpus)) as nv:
            assert [p.sm_utilization for p in nv.processes()] == [None, None]
            assert nv.warnings == []


class TestConsumerGpu:
    def test_unsupported_fields_are_none_without_a_warning(self) -> None:
        with opened(FakeNvmlLibrary(geforce_with_little_support())) as nv:
            (g,) = nv.gpus()
            assert nv.warnings == []
        assert (g.name, g.memory_total, g.memory_reserved) == (
            "NVIDIA GeForce GTX 1650",
            4 * GiB,
            60 * MiB,
        )
        assert g.utilization is None and g.memory_utilization is None
        assert g.power_watts is None and g.power_limit_watts is None
        assert (g.ecc_uncorrected, g.retired_pages, g.retired_pages_pending) == (None,) * 3
        assert (g.mig_mode, g.numa_node, g.cpus) == (None, None, None)
        assert (g.mig_instances, g.nvlink_peers) == ((), ())
        assert (g.temperature, g.persistence_mode) == (35, False)
        assert g.mps is False  # the MPS list is unsupported; the compute list says no server

    def test_graphics_and_compute_lists_merge_per_process(self) -> None:
        with opened(FakeNvmlLibrary(geforce_with_little_support())) as nv:
            procs = nv.processes()
            assert nv.warnings == []
        assert [(p.pid, p.memory, p.kinds, p.sm_utilization) for p in procs] == [
            (4201, 200 * MiB, ("graphics",), None),
            (4202, 900 * MiB, ("compute", "graphics"), None),
        ]


class TestOldDriver:
    def test_memory_from_the_v1_query_folds_reserved_into_used(self) -> None:
        with opened(FakeNvmlLibrary([v100_on_an_old_driver()], missing=R470_MISSING)) as nv:
            (g,) = nv.gpus()
            assert nv.warnings == []
        assert (g.memory_total, g.memory_used, g.memory_reserved) == (
            32 * GiB,
            8 * GiB + 300 * MiB,
            None,
        )
        assert g.memory_used + g.memory_free == g.memory_total
        assert g.numa_node is None  # nvmlDeviceGetNumaNodeId is newer than the driver

    def test_page_retirement_where_rows_are_not_remapped(self) -> None:
        with opened(FakeNvmlLibrary([v100_on_an_old_driver()], missing=R470_MISSING)) as nv:
            (g,) = nv.gpus()
        assert (g.retired_pages, g.retired_pages_pending) == (3, True)

    def test_processes_through_the_v2_lists(self) -> None:
        with opened(FakeNvmlLibrary([v100_on_an_old_driver()], missing=R470_MISSING)) as nv:
            procs = nv.processes()
            assert nv.warnings == []
        assert [(p.pid, p.memory, p.kinds, p.sm_utilization) for p in procs] == [
            (4301, 8 * GiB, ("compute",), 55)
        ]

    def test_a_driver_with_no_process_list_at_all_lists_none(self) -> None:
        lists = {
            f"nvmlDevice{k}RunningProcesses{v}"
            for k in ("GetCompute", "GetGraphics", "GetMPSCompute")
            for v in ("_v2", "_v3")
        }
        with opened(FakeNvmlLibrary([v100_on_an_old_driver()], missing=frozenset(lists))) as nv:
            assert nv.processes() == []
            (g,) = nv.gpus()
            assert nv.warnings == []
        assert g.mps is None  # neither list answered: unknown, not "no"


class TestLostGpu:
    def test_a_gpu_lost_between_snapshots_is_left_out_with_a_warning(self) -> None:
        gpus = h100_with_processes()
        with opened(FakeNvmlLibrary(gpus)) as nv:
            assert [g.index for g in nv.gpus()] == [0, 1]
            gpus[0].lost = True
            assert [g.index for g in nv.gpus()] == [1]
            assert nv.processes() == []
            assert "/dev/nvidia0" not in nv.device_files()
            assert "/dev/nvidia1" in nv.device_files()
            assert any(w.startswith("GPU 0:") and "skipped" in w for w in nv.warnings)
            assert any("GPU is lost" in w for w in nv.warnings)
            assert not any(w.startswith("GPU 1") for w in nv.warnings)

    def test_a_gpu_lost_before_its_handle_is_skipped(self) -> None:
        gpus = h100_with_processes()
        gpus[1].lost = True
        with opened(FakeNvmlLibrary(gpus)) as nv:
            (g,) = nv.gpus()
            assert g.index == 0 and g.nvlink_peers == ()  # its only peer is gone
            assert [p.pid for p in nv.processes()] == [4101, 4102]
            assert nv.warnings == ["GPU 1: handle: GPU is lost; skipped"]

    def test_a_lost_gpu_that_answers_again_is_seen_again(self) -> None:
        gpus = h100_with_processes()
        gpus[1].lost = True
        with opened(FakeNvmlLibrary(gpus)) as nv:
            assert len(nv.gpus()) == 1
            gpus[1].lost = False  # handles were not kept while one was missing
            assert [g.index for g in nv.gpus()] == [0, 1]


class TestMigGpu:
    def test_instances_with_their_profiles_and_memory(self) -> None:
        with opened(FakeNvmlLibrary([a100_in_mig_mode()])) as nv:
            (g,) = nv.gpus()
            assert nv.warnings == []
        assert g.mig_mode is True and g.utilization is None
        assert [
            (m.gi_id, m.ci_id, m.profile, m.uuid, m.memory_total, m.memory_used)
            for m in g.mig_instances
        ] == [
            (
                1,
                0,
                "3g.40gb",
                "MIG-3g000000-0000-0000-0000-000000000001",
                40 * GiB,
                12 * GiB + 200 * MiB,
            ),
            (
                5,
                0,
                "2g.20gb",
                "MIG-2g000000-0000-0000-0000-000000000005",
                20 * GiB,
                5 * GiB + 200 * MiB,
            ),
        ]
        assert all(m.memory_used + m.memory_free == m.memory_total for m in g.mig_instances)

    def test_processes_are_named_with_their_instance_once(self) -> None:
        with opened(FakeNvmlLibrary([a100_in_mig_mode()])) as nv:
            procs = nv.processes()
            assert nv.warnings == []
        assert [(p.pid, p.memory, p.mig_uuid) for p in procs] == [
            (4401, 12 * GiB, "MIG-3g000000-0000-0000-0000-000000000001"),
            (4402, 5 * GiB, "MIG-2g000000-0000-0000-0000-000000000005"),
        ]

    def test_a_process_only_the_gpu_lists_stays_on_the_gpu(self) -> None:
        gpu = a100_in_mig_mode()
        gpu.compute.append(FakeProcess(pid=4403, used_memory=GiB))
        with opened(FakeNvmlLibrary([gpu])) as nv:
            procs = nv.processes()
        assert [(p.pid, p.mig_uuid) for p in procs][-1] == (4403, None)

    def test_without_permission_for_the_lists_there_are_no_processes(self) -> None:
        gpu = a100_in_mig_mode()
        denied = dict.fromkeys(
            (
                "nvmlDeviceGetComputeRunningProcesses_v3",
                "nvmlDeviceGetGraphicsRunningProcesses_v3",
                "nvmlDeviceGetMPSComputeRunningProcesses_v3",
            ),
            NO_PERMISSION,
        )
        gpu.errors.update(denied)
        for mig in gpu.mig_devices.values():
            mig.errors.update(denied)
        with opened(FakeNvmlLibrary([gpu])) as nv:
            assert nv.processes() == []
            (g,) = nv.gpus()
            assert nv.warnings == []
        assert len(g.mig_instances) == 2 and g.mps is None

    def test_mig_off_is_a_plain_gpu(self) -> None:
        gpu = a100_in_mig_mode()
        gpu.mig_mode = pynvml.NVML_DEVICE_MIG_DISABLE
        with opened(FakeNvmlLibrary([gpu])) as nv:
            (g,) = nv.gpus()
            procs = nv.processes()
            assert nv.warnings == []
        assert (g.mig_mode, g.mig_instances) == (False, ())
        assert [(p.pid, p.mig_uuid) for p in procs] == [(4401, None), (4402, None)]

    def test_a_driver_without_mig_calls_sees_a_plain_gpu(self) -> None:
        missing = frozenset({"nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount"})
        with opened(FakeNvmlLibrary([a100_in_mig_mode()], missing=missing)) as nv:
            (g,) = nv.gpus()
            procs = nv.processes()
        assert (g.mig_mode, g.mig_instances) == (None, ())
        assert [(p.pid, p.mig_uuid) for p in procs] == [(4401, None), (4402, None)]


class TestProcessMemory:
    def test_memory_the_driver_does_not_know_is_none(self) -> None:
        gpu = one_gpu(
            compute=[
                FakeProcess(pid=4501, used_memory=None),
                FakeProcess(pid=4502, used_memory=2 * GiB),
            ]
        )
        with opened(FakeNvmlLibrary([gpu])) as nv:
            assert [(p.pid, p.memory) for p in nv.processes()] == [(4501, None), (4502, 2 * GiB)]
            assert nv.warnings == []

    @pytest.mark.parametrize(
        ("compute", "graphics"), [(None, 3 * GiB), (3 * GiB, None), (3 * GiB, GiB), (GiB, 3 * GiB)]
    )
    def test_the_most_a_list_knows_wins(self, compute: int | None, graphics: int | None) -> None:
        gpu = one_gpu(
            compute=[FakeProcess(pid=4501, used_memory=compute)],
            graphics=[FakeProcess(pid=4501, used_memory=graphics)],
        )
        with opened(FakeNvmlLibrary([gpu])) as nv:
            (p,) = nv.processes()
        assert (p.memory, p.kinds) == (3 * GiB, ("compute", "graphics"))


class TestMps:
    def test_mps_clients_mean_an_mps_server(self) -> None:
        gpu = one_gpu(mps=[FakeProcess(pid=4601, used_memory=GiB)])
        with opened(FakeNvmlLibrary([gpu])) as nv:
            (g,) = nv.gpus()
            (p,) = nv.processes()
        assert g.mps is True and p.kinds == ("mps",)

    def test_the_server_among_compute_processes_means_mps(self) -> None:
        server = FakeProcess(
            pid=4602, used_memory=30 * MiB, name=b"/usr/bin/nvidia-cuda-mps-server"
        )
        with opened(FakeNvmlLibrary([one_gpu(compute=[server])])) as nv:
            (g,) = nv.gpus()
        assert g.mps is True

    def test_a_process_name_that_is_not_utf8_does_not_kill_the_view(self) -> None:
        # Linux names are bytes; pynvml decodes the name as UTF-8 and raises on others.
        odd = FakeProcess(pid=4603, used_memory=GiB, name=b"/opt/\xe9t\xe9/train")
        with opened(FakeNvmlLibrary([one_gpu(compute=[odd])])) as nv:
            (g,) = nv.gpus()
        assert g.mps is False and g.memory_total == 48 * GiB


class TestFailures:
    def test_an_unexpected_error_is_none_and_one_warning(self) -> None:
        gpu = one_gpu(errors={"nvmlDeviceGetTemperature": UNKNOWN})
        with opened(FakeNvmlLibrary([gpu])) as nv:
            (g,) = nv.gpus()
            nv.gpus()
            assert g.temperature is None and g.memory_total == 48 * GiB
            assert nv.warnings == ["GPU 0: temperature: Unknown Error"]

    def test_no_uuid_means_the_gpu_is_left_out(self) -> None:
        gpu = one_gpu(errors={"nvmlDeviceGetUUID": UNKNOWN})
        with opened(FakeNvmlLibrary([gpu, *h100_with_processes()])) as nv:
            assert [g.index for g in nv.gpus()] == [1, 2]
            assert "GPU 0: no uuid or memory information; skipped" in nv.warnings

    def test_open_without_a_driver_is_one_line_naming_the_simulation(self) -> None:
        library = FakeNvmlLibrary([], init_error=9)  # NVML_ERROR_DRIVER_NOT_LOADED
        with installed(library), pytest.raises(BackendUnavailable) as caught:
            NvmlBackend.open()
        assert "Driver Not Loaded" in str(caught.value)
        assert "GPUWARDEN_SIM" in str(caught.value) and "\n" not in str(caught.value)

    def test_close_shuts_nvml_down_once(self) -> None:
        library = FakeNvmlLibrary(h100_with_processes())
        with installed(library):
            nv = NvmlBackend.open()
            nv.close()
            nv.close()
        assert library.shutdowns == 1


class TestSetComputeMode:
    def test_the_new_mode_is_what_the_gpu_reports(self) -> None:
        with opened(FakeNvmlLibrary(h100_with_processes())) as nv:
            nv.set_compute_mode(1, "exclusive-process")
            assert [g.compute_mode for g in nv.gpus()] == ["Default", "Exclusive_Process"]

    @pytest.mark.parametrize(
        ("code", "error", "words"),
        [
            (NO_PERMISSION, PermissionDenied, "needs root"),
            (NOT_SUPPORTED, UsageError, "does not support compute mode Prohibited"),
            (GPU_IS_LOST, GpuwardenError, "GPU 0: setting compute mode failed: GPU is lost"),
        ],
    )
    def test_refusals_are_one_clear_error(
        self, code: int, error: type[Exception], words: str
    ) -> None:
        gpu = one_gpu(errors={"nvmlDeviceSetComputeMode": code})
        with opened(FakeNvmlLibrary([gpu])) as nv, pytest.raises(error, match=words):
            nv.set_compute_mode(0, "prohibited")

    @pytest.mark.parametrize(
        ("gpus", "words"),
        [
            (h100_with_processes, "no GPU 2; this machine has GPUs 0-1"),
            (list, "no GPU 2; this machine has no GPUs"),
        ],
    )
    def test_an_index_past_the_gpus_is_a_usage_error(
        self, gpus: Callable[[], list[FakeGpu]], words: str
    ) -> None:
        with opened(FakeNvmlLibrary(gpus())) as nv, pytest.raises(UsageError, match=words):
            nv.set_compute_mode(2, "default")
