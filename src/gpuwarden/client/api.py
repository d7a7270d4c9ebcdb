"""A client's side of the API (the CLI, ``top``, the Ray launcher): HTTP over the
daemon's unix socket with the standard library only, so client commands start fast.
The page sizes are the API's own (``daemon/api.py`` imports them)."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from gpuwarden.errors import GpuwardenError, PermissionDenied, UsageError

if TYPE_CHECKING:
    from gpuwarden.client.views import JobDoc, JobPage

PAGE = 1000  # jobs GET /v1/jobs returns unless it asks for fewer
MAX_PAGE = 5000  # the most it returns at once


class DaemonUnavailable(GpuwardenError):
    exit_code = 3


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.unix_path)
        except OSError:
            s.close()
            raise
        self.sock = s


class Client:
    def __init__(self, socket_path: str, timeout: float = 30.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: dict[str, Any] | None = None,
        timeout: float | None = None,
        raw: bool = False,
    ) -> Any:
        if query:
            path = f"{path}?{urlencode({k: v for k, v in query.items() if v is not None})}"
        conn = _UnixConnection(self.socket_path, timeout or self.timeout)
        try:
            payload = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if payload is not None else {}
            conn.request(method, path, body=payload, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except (FileNotFoundError, ConnectionRefusedError) as e:
            raise DaemonUnavailable(
                f"no gpuwarden daemon at {self.socket_path} ({e.strerror});"
                " start one with `gpuwarden daemon start`"
            ) from None
        except PermissionError:
            raise DaemonUnavailable(
                f"cannot connect to {self.socket_path}: permission denied"
            ) from None
        except (OSError, http.client.HTTPException) as e:
            raise DaemonUnavailable(
                f"the daemon at {self.socket_path} did not answer: {e}"
            ) from None
        finally:
            conn.close()
        if resp.status >= 400:
            try:
                message = json.loads(data)["error"]
            except (ValueError, KeyError, TypeError):
                message = data.decode(errors="replace")[:200] or resp.reason
            if resp.status == 403:
                raise PermissionDenied(message)
            if resp.status == 503:
                raise DaemonUnavailable(f"the daemon cannot do that now: {message}")
            if resp.status >= 500:
                raise GpuwardenError(f"daemon error: {message}")
            raise UsageError(message)
        if raw:
            return data, dict(resp.getheaders())
        return json.loads(data) if data else None

    def job(self, job_id: int) -> JobDoc:
        """One job (GET /v1/jobs/ID), as ``show`` prints it."""
        doc: JobDoc = self.request("GET", f"/v1/jobs/{job_id}")
        return doc

    def jobs_page(self, query: dict[str, Any]) -> JobPage:
        """One page of GET /v1/jobs."""
        page: JobPage = self.request("GET", "/v1/jobs", query=query)
        return page

    def job_pages(self, query: dict[str, Any] | None = None) -> Iterator[list[JobDoc]]:
        """Every job matching ``query``, a page (GET /v1/jobs) at a time, in id order."""
        after = 0
        while True:
            got = self.jobs_page({**(query or {}), "after": after, "limit": PAGE})
            if got["jobs"]:
                yield got["jobs"]
            if not got.get("more") or not got["jobs"]:
                return
            after = got["jobs"][-1]["id"]

    def all_jobs(self, query: dict[str, Any] | None = None) -> list[JobDoc]:
        return [j for page in self.job_pages(query) for j in page]

    def latest_jobs(self, query: dict[str, Any] | None, n: int) -> tuple[list[JobDoc], bool]:
        """The latest ``n`` jobs matching ``query`` in id order, and whether there are
        older ones."""
        out: list[JobDoc] = []
        before = None
        while len(out) < n:
            got = self.jobs_page(
                {**(query or {}), "before": before, "limit": min(n - len(out), MAX_PAGE)}
            )
            out = got["jobs"] + out
            if not got.get("more") or not got["jobs"]:
                return out, False
            before = got["jobs"][0]["id"]
        return out, True

    def alive(self) -> bool:
        try:
            self.request("GET", "/v1/health", timeout=2.0)
            return True
        except DaemonUnavailable:
            return False
