"""Which GPUs reach which over NVLink, asked of NVML link by link.

Apart from the backend because it is one question with its own rules (direct links,
NVSwitch, the P2P fallback) that needs none of the backend's field guards: a link that
does not answer is simply no link."""

from __future__ import annotations

from typing import Any

from gpuwarden.gpus.nvml_values import normalize_bus_id


def nvlink_peers(
    nv: Any, handles: dict[int, Any], bus_ids: dict[int, str | None]
) -> dict[int, tuple[int, ...]]:
    """GPU index -> indices of GPUs reachable over active NVLink, best effort. ``nv`` is
    the initialised pynvml module, ``handles`` and ``bus_ids`` are by GPU index."""
    by_bus = {normalize_bus_id(b): i for i, b in bus_ids.items() if b}
    peers: dict[int, set[int]] = {i: set() for i in handles}
    on_switch: set[int] = set()
    has_links: set[int] = set()
    max_links = int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))
    switch_type = getattr(nv, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
    type_fn = getattr(nv, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
    for i, h in handles.items():
        for link in range(max_links):
            try:
                if int(nv.nvmlDeviceGetNvLinkState(h, link)) != nv.NVML_FEATURE_ENABLED:
                    continue
            except nv.NVMLError:
                continue  # no such link, or NVLink not supported at all
            has_links.add(i)
            if type_fn is not None:
                try:
                    if int(type_fn(h, link)) == switch_type:
                        on_switch.add(i)
                        continue
                except nv.NVMLError:
                    pass
            try:
                remote = nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link)
            except nv.NVMLError:
                continue
            peer = by_bus.get(normalize_bus_id(remote.busId))
            if peer is not None and peer != i:
                peers[i].add(peer)
                peers[peer].add(i)
    # Behind NVSwitch every switch-attached GPU reaches every other one.
    for i in on_switch:
        peers[i] |= on_switch - {i}
    # Links up but no peer identified (remote type unknown): ask P2P over NVLink.
    p2p = getattr(nv, "nvmlDeviceGetP2PStatus", None)
    for i in sorted(has_links):
        if peers[i] or p2p is None:
            continue
        for j, hj in handles.items():
            if j == i:
                continue
            try:
                status = p2p(handles[i], hj, nv.NVML_P2P_CAPS_INDEX_NVLINK)
            except nv.NVMLError:
                continue
            if int(status) == nv.NVML_P2P_STATUS_OK:
                peers[i].add(j)
    return {i: tuple(sorted(p)) for i, p in peers.items()}
