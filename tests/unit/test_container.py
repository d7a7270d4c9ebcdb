from __future__ import annotations

import pytest

from gpuwarden.procs.container import container_from_cgroup

CID = "3f9a1c2b7d4e" + "a" * 52


@pytest.mark.parametrize(
    ("cgroup", "expected"),
    [
        (f"0::/system.slice/docker-{CID}.scope\n", "docker:3f9a1c2b7d4e"),
        (f"12:memory:/docker/{CID}\n", "docker:3f9a1c2b7d4e"),
        (
            f"0::/system.slice/containerd.service/cri-containerd-{CID}.scope",
            "containerd:3f9a1c2b7d4e",
        ),
        (f"0::/machine.slice/libpod-{CID}.scope/container", "podman:3f9a1c2b7d4e"),
        (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_5f60_"
            f"4718_9a0b_1c2d3e4f5a6b.slice/cri-containerd-{CID}.scope",
            "k8s:1b2c3d4e-5f60-4718-9a0b-1c2d3e4f5a6b/3f9a1c2b7d4e",
        ),
        (
            f"11:devices:/kubepods/besteffort/pod1b2c3d4e-5f60-4718-9a0b-1c2d3e4f5a6b/{CID}",
            "k8s:1b2c3d4e-5f60-4718-9a0b-1c2d3e4f5a6b/3f9a1c2b7d4e",
        ),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", None),
        ("0::/\n", None),
    ],
)
def test_container_from_cgroup(cgroup: str, expected: str | None) -> None:
    assert container_from_cgroup(cgroup) == expected
