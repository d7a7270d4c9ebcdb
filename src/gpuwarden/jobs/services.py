"""A service's restart policy and health check, as submitted (``--restart``): a value of
the job model; the daemon's health checks and restarts act on it (daemon/restart.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

ON_FAILURE, ALWAYS = "on-failure", "always"
POLICIES = (ON_FAILURE, ALWAYS)
DEFAULT_LIMIT, DEFAULT_WINDOW = 5, 600.0  # --restart-limit 5/10m
DEFAULT_INTERVAL, DEFAULT_GRACE = 30.0, 60.0  # --health-interval, --health-grace
HEALTH_TIMEOUT = 10.0  # the longest one check may take (less when the interval is shorter)


@dataclass(frozen=True)
class Service:
    """A job's restart policy and health check, as submitted."""

    restart: str  # on-failure | always
    limit: int = DEFAULT_LIMIT  # restarts allowed within ``window``
    window: float = DEFAULT_WINDOW
    health_cmd: str | None = None  # run with /bin/sh -c as the job's user
    health_url: str | None = None  # GET; healthy when 2xx
    health_interval: float = DEFAULT_INTERVAL
    health_grace: float = DEFAULT_GRACE  # after each start, before the first check

    @property
    def health_timeout(self) -> float:
        return min(HEALTH_TIMEOUT, self.health_interval)

    def restarts_from(self, succeeded: bool) -> bool:
        """Whether an end (not a cancel: that stops a service for good) restarts it."""
        return self.restart == ALWAYS or not succeeded

    def to_json(self) -> dict[str, Any]:
        return {
            "restart": self.restart,
            "restart_limit": self.limit,
            "restart_window": self.window,
            "health_cmd": self.health_cmd,
            "health_url": self.health_url,
            "health_interval": self.health_interval,
            "health_grace": self.health_grace,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), sort_keys=True)

    @classmethod
    def loads(cls, text: str | None) -> Service | None:
        if text is None:
            return None
        d = json.loads(text)
        return cls(
            restart=d["restart"],
            limit=d["restart_limit"],
            window=d["restart_window"],
            health_cmd=d["health_cmd"],
            health_url=d["health_url"],
            health_interval=d["health_interval"],
            health_grace=d["health_grace"],
        )
