"""Machines for the fake NVML library (tests/fake_nvml.py): GPUs as their drivers answer.

Bus ids use PCI domain 0xfa11, which no machine running the tests has, so sysfs says
nothing about them and what the backend reports comes from the fake alone."""

from __future__ import annotations

import pynvml

from tests.fake_nvml import NOT_SUPPORTED, FakeGpu, FakeMigDevice, FakeProcess

GiB = 1 << 30
MiB = 1 << 20

# Symbols a driver of the R470 branch does not export: the _v3 process lists and the
# versioned memory query came with R510, the NUMA node id later still.
R470_MISSING = frozenset(
    {
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetNumaNodeId",
    }
)


def h100_with_processes() -> list[FakeGpu]:
    """Two datacenter GPUs on NVLink: GPU 0 runs two training processes, GPU 1 idles."""
    bus0, bus1 = "0000FA11:17:00.0", "0000FA11:2A:00.0"
    train = FakeProcess(pid=4101, used_memory=30 * GiB, sm_util=87)
    infer = FakeProcess(pid=4102, used_memory=10 * GiB, sm_util=12)
    return [
        FakeGpu(
            uuid="GPU-11111111-2222-3333-4444-000000000000",
            name="NVIDIA H100 80GB HBM3",
            bus_id=bus0,
            minor=0,
            total=80 * GiB,
            used=40 * GiB + 1 * GiB,
            reserved=512 * MiB,
            utilization=(93, 41),
            temperature=61,
            power_mw=512_345,
            numa_node=0,
            cpu_mask=[0x0000_0000_00FF_00FF],
            nvlinks=[bus1] * 18,
            remapped_rows=(2, 1, 1, 0),
            ecc_uncorrected=3,
            compute=[train, infer],
        ),
        FakeGpu(
            uuid="GPU-11111111-2222-3333-4444-000000000001",
            name="NVIDIA H100 80GB HBM3",
            bus_id=bus1,
            minor=1,
            total=80 * GiB,
            reserved=512 * MiB,
            numa_node=1,
            cpu_mask=[0xFF00_FF00],
            nvlinks=[bus0] * 18,
        ),
    ]


def geforce_with_little_support() -> list[FakeGpu]:
    """A low-end consumer GPU: no ECC, no row remapping or page retirement, no MIG, no
    NVLink, no utilisation, power or process-utilisation sensors. A desktop's X server
    and a CUDA program that also draws are on it."""
    unsupported = (
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetEnforcedPowerLimit",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetRetiredPages",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetNvLinkState",
        "nvmlDeviceGetNumaNodeId",
        "nvmlDeviceGetCpuAffinity",
        "nvmlDeviceGetProcessUtilization",
        "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    )
    xorg = FakeProcess(pid=4201, used_memory=200 * MiB, name=b"/usr/lib/xorg/Xorg")
    both = FakeProcess(pid=4202, used_memory=900 * MiB)
    return [
        FakeGpu(
            uuid="GPU-aaaaaaaa-bbbb-cccc-dddd-000000000000",
            name="NVIDIA GeForce GTX 1650",
            bus_id="0000FA11:01:00.0",
            minor=0,
            total=4 * GiB,
            used=1100 * MiB,
            reserved=60 * MiB,
            persistence=pynvml.NVML_FEATURE_DISABLED,
            compute=[both],
            graphics=[xorg, both],
            errors=dict.fromkeys(unsupported, NOT_SUPPORTED),
        )
    ]


def v100_on_an_old_driver() -> FakeGpu:
    """A Volta GPU under an R470 driver: no _v3 process lists and no v2 memory query
    (pair with ``R470_MISSING``), and page retirement where Ampere remaps rows."""
    return FakeGpu(
        uuid="GPU-55555555-6666-7777-8888-000000000000",
        name="Tesla V100-SXM2-32GB",
        bus_id="0000FA11:3B:00.0",
        minor=0,
        total=32 * GiB,
        used=8 * GiB,
        reserved=300 * MiB,
        retired_pages=([0x1000, 0x2000], [0x9000]),
        retired_pending=pynvml.NVML_FEATURE_ENABLED,
        errors={"nvmlDeviceGetRemappedRows": NOT_SUPPORTED},
        compute=[FakeProcess(pid=4301, used_memory=8 * GiB, sm_util=55)],
    )


def a100_in_mig_mode() -> FakeGpu:
    """An A100 split into a 3g.40gb and a 2g.20gb instance, a process on each; the GPU's
    own list names both processes, with the instances they run in."""
    on_3g = FakeProcess(pid=4401, used_memory=12 * GiB, gpu_instance=1, compute_instance=0)
    on_2g = FakeProcess(pid=4402, used_memory=5 * GiB, gpu_instance=5, compute_instance=0)
    mig_unsupported = dict.fromkeys(
        ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetProcessUtilization"), NOT_SUPPORTED
    )
    return FakeGpu(
        uuid="GPU-99999999-aaaa-bbbb-cccc-000000000000",
        name="NVIDIA A100-SXM4-80GB",
        bus_id="0000FA11:4C:00.0",
        minor=0,
        total=80 * GiB,
        used=17 * GiB + 400 * MiB,
        reserved=600 * MiB,
        mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE,
        mig_slots=7,
        compute=[on_3g, on_2g],
        errors=mig_unsupported,
        mig_devices={
            0: FakeMigDevice(
                gpu_instance=1,
                compute_instance=0,
                uuid="MIG-3g000000-0000-0000-0000-000000000001",
                name="NVIDIA A100-SXM4-80GB MIG 3g.40gb",
                total=40 * GiB,
                used=12 * GiB + 200 * MiB,
                compute=[on_3g],
            ),
            2: FakeMigDevice(
                gpu_instance=5,
                compute_instance=0,
                uuid="MIG-2g000000-0000-0000-0000-000000000005",
                name="NVIDIA A100-SXM4-80GB MIG 2g.20gb",
                total=20 * GiB,
                used=5 * GiB + 200 * MiB,
                compute=[on_2g],
            ),
        },
    )
