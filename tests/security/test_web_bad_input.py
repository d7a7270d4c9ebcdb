"""Anyone's input to the page's feeds: a job id in non-ASCII digits ("²", Arabic-Indic
"١") passed ``str.isdigit`` and then failed ``int()``, a 500 with a traceback in
daemon.log per request, from anyone on ``web_listen``. It is refused as the API refuses
it: 400, one line, nothing logged."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.paths import EXAMPLES
from tests.integration.daemon_fixture import free_port, http_request, raw_http, start_daemon

BAD_IDS = ("%C2%B2", "%D9%A1", "%EF%BC%91")  # ², ١, fullwidth 1


def _status(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.mark.parametrize("raw", BAD_IDS)
def test_a_job_id_in_other_digits_is_a_400_not_a_500(tmp_path: Path, raw: str) -> None:
    port = free_port()
    for d in start_daemon(
        tmp_path, EXAMPLES / "idle-2gpu.json", f'web_listen = "127.0.0.1:{port}"\n'
    ):
        code, body = _status(f"http://127.0.0.1:{port}/ui/data/jobs/{raw}")
        assert code == 400, body
        assert "invalid job id" in json.loads(body)["error"]
        code, body = raw_http(d.socket, http_request("GET", f"/ui/data/jobs/{raw}"))
        assert code == 400, body  # the owner's view through `gpuwarden web`, too
        log = (d.home / "daemon.log").read_text(errors="replace")
        assert "Traceback" not in log and "internal error" not in log, log[-2000:]
