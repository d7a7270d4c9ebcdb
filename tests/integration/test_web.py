"""The web page end to end: a real daemon over the simulated leaky 4-GPU machine records
memory history while a simulated job runs; the page is read anonymously on
``web_listen`` (no command lines, GET only), as the user through ``gpuwarden web``, and
in a real headless Chromium, whose charts must show the scenario's numbers with no
console errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.wait import wait_for
from tests.integration.daemon_fixture import EXAMPLES, PY, Daemon, free_port, start_daemon

GiB = 1 << 30
CONTEXT = 512 << 20  # the simulated driver's CUDA context per process
MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, str, int]]:
    """A daemon with a 3 GiB job that ran for a while (history every 200 ms), one job
    running and one queued after it."""
    port = free_port()
    tmp = tmp_path_factory.mktemp("web")
    config = f'history_interval = "200ms"\nweb_listen = "127.0.0.1:{port}"\n'
    for d in start_daemon(tmp, EXAMPLES / "leaky-4gpu.json", config):
        job = d.submit(
            "--mem",
            "4G",
            "--name",
            "trainer",
            "--gpus",
            "1",
            cmd=[PY, "-m", "gpuwarden.sim.job", "--mem", "3G", "--seconds", "3"],
        )
        assert d.cli("wait", str(job), timeout=60).returncode == 0
        blocker = d.submit(
            "--mem",
            "1G",
            "--name",
            "blocker",
            "--restart",
            "on-failure",
            "--health-cmd",
            "true # SECRET-HEALTH",
            "--notify",
            "echo SECRET-NOTIFY",
            "--comment",
            "ask SECRET-COMMENT",
            cmd=[PY, "-c", "import time; time.sleep(600)"],
        )
        d.submit(
            "--mem",
            "1G",
            "--name",
            "later",
            "--after",
            str(blocker),
            cmd=[PY, "-c", "print('SECRET-TOKEN')"],
        )
        d.wait_state(blocker, "running")
        yield d, f"http://127.0.0.1:{port}", job


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_the_public_feed_has_the_history_and_no_command_lines(
    site: tuple[Daemon, str, int],
) -> None:
    _, base, job = site
    data = get(f"{base}/ui/data/overview?hours=1")
    assert [g["index"] for g in data["gpus"]] == [0, 1, 2, 3]
    gpu = next(g for g in data["gpus"] if any(k.startswith(f"job {job} ") for k in g["layers"]))
    layer = gpu["layers"][f"job {job} (root)"]
    # 3 GiB of allocations and the CUDA context the simulated driver charges beside them
    assert 3 * GiB + CONTEXT <= max(layer) < 3 * GiB + CONTEXT + 64 * MiB, max(layer)
    leaky = data["gpus"][1]  # examples/leaky-4gpu.json: 300 MiB nobody accounts for
    assert max(leaky["leaked"]) >= 300 * MiB and leaky["leak_periods"]
    assert any(k.startswith("user ") for g in data["gpus"] for k in g["layers"])
    assert [(j["name"], j["state"]) for j in data["queue"]] == [
        ("blocker", "running"),
        ("later", "queued"),
    ]
    everything = json.dumps(data)
    assert "SECRET-TOKEN" not in everything and "command" not in data["queue"][1]
    assert "SECRET-NOTIFY" not in everything and "SECRET-HEALTH" not in everything
    assert "SECRET-COMMENT" not in everything and data["queue"][0]["comment"] is None
    assert data["queue"][0]["service"]["restart"] == "on-failure"
    page = get(f"{base}/ui/data/jobs/{job}")
    assert page["budget"] == 4 * GiB and page["job"]["state"] == "succeeded"
    assert max(page["timeline"]["used"]) >= 3 * GiB
    kinds = [e["kind"] for e in page["job"]["events"]]
    assert "placed" in kinds and "succeeded" in kinds
    for bad, code in (
        (f"{base}/ui/data/jobs/999", 404),
        (f"{base}/ui/data/jobs/x", 400),
        (f"{base}/ui/data/overview?hours=-1", 400),
        (f"{base}/ui/data/overview?by=gpu", 400),
        (f"{base}/v1/jobs", 404),
    ):
        with pytest.raises(urllib.error.HTTPError) as err:
            get(bad)
        err.value.close()  # the answer it carries, and the socket under it
        assert err.value.code == code, bad
    post = urllib.request.Request(f"{base}/ui/data/overview", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(post, timeout=10)
    err.value.close()
    assert err.value.code == 405
    with urllib.request.urlopen(f"{base}/ui/", timeout=10) as r:
        assert "default-src 'self'" in r.headers["Content-Security-Policy"]


def test_gpuwarden_web_serves_the_users_view_through_the_socket(
    site: tuple[Daemon, str, int],
) -> None:
    d, _, _ = site
    port = free_port()
    proxy = subprocess.Popen(
        [PY, "-m", "gpuwarden", "web", "--listen", f"127.0.0.1:{port}"],
        env=d.env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proxy.stderr is not None
        line = proxy.stderr.readline()
        assert f"http://127.0.0.1:{port}/ui/?token=" in line, line
        token = line.split("?token=", 1)[1].split()[0]
        # The printed URL's token becomes a cookie; the browser (here a cookie jar) keeps it.
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        url = f"http://127.0.0.1:{port}/ui/data/overview?hours=1&by=user&token={token}"
        with browser.open(url, timeout=10) as r:
            data = json.load(r)
        assert data["by"] == "user" and "SECRET-TOKEN" in " ".join(data["queue"][1]["command"])
        assert any("user root" in g["layers"] for g in data["gpus"])
        with pytest.raises(urllib.error.HTTPError) as err:
            browser.open(f"http://127.0.0.1:{port}/v1/jobs", timeout=10)  # only the page
        err.value.close()
        assert err.value.code == 404
        with pytest.raises(urllib.error.HTTPError) as err:  # without the token: nothing
            get(f"http://127.0.0.1:{port}/ui/data/overview")
        err.value.close()
        assert err.value.code == 403
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)
        if proxy.stderr is not None:
            proxy.stderr.close()
    taken = subprocess.run(
        [PY, "-m", "gpuwarden", "web", "--listen", "nonsense"],
        env=d.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert taken.returncode != 0 and "invalid listen address" in taken.stderr
    assert "Traceback" not in taken.stderr


def chromium() -> tuple[str, str] | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def test_the_page_renders_the_scenarios_numbers_in_chromium(
    site: tuple[Daemon, str, int], tmp_path: Path
) -> None:
    found = chromium()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install chromium and chromium-driver (see .ci/run)")
        pytest.skip("needs chromium and chromium-driver (Debian packages)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    _, base, job = site
    options = webdriver.ChromeOptions()
    options.binary_location = found[0]
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path / 'profile'}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=found[1]), options=options)
    shots = os.environ.get("GPUWARDEN_SCREENSHOTS")
    try:
        driver.get(f"{base}/ui/")
        WebDriverWait(driver, 20).until(
            lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready")
        )
        assert driver.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "true"
        cards = driver.find_elements(By.CSS_SELECTOR, "section.card")
        assert [c.get_attribute("data-gpu") for c in cards] == ["0", "1", "2", "3"]
        layer = driver.find_element(By.CSS_SELECTOR, f'path[data-layer="job {job} (root)"]')
        assert (
            3 * GiB + CONTEXT
            <= int(layer.get_attribute("data-max") or 0)
            < 3 * GiB + CONTEXT + 64 * MiB
        )
        assert cards[1].find_elements(By.CSS_SELECTOR, "rect.leakband")
        assert "leaked" in cards[1].find_element(By.TAG_NAME, "h3").text
        legend = cards[1].find_element(By.CSS_SELECTOR, ".legend").text
        assert "leaked" in legend
        rows = driver.find_elements(By.CSS_SELECTOR, "#queue tbody tr[data-job]")
        assert [r.find_elements(By.TAG_NAME, "td")[2].text for r in rows] == ["blocker", "later"]
        assert [r.find_elements(By.TAG_NAME, "td")[3].text for r in rows] == [
            "running · service, 0 restarts",
            "queued",
        ]
        if shots:
            driver.save_screenshot(str(Path(shots) / "web-overview.png"))
        driver.find_element(By.CSS_SELECTOR, "#hours button[data-hours='1']").click()
        driver.find_element(By.CSS_SELECTOR, "#by button[data-by='user']").click()
        WebDriverWait(driver, 10).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, 'path[data-layer="user root"]')
        )
        driver.get(f"{base}/ui/#job/{job}")
        WebDriverWait(driver, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#job svg"))
        chart = driver.find_element(By.CSS_SELECTOR, "#job svg.chart")
        assert chart.get_attribute("data-budget") == str(4 * GiB)
        used = driver.find_element(By.CSS_SELECTOR, "#job path.usedline")
        assert int(used.get_attribute("data-max") or 0) >= 3 * GiB
        kinds = [
            r.get_attribute("data-kind")
            for r in driver.find_elements(By.CSS_SELECTOR, "#events tbody tr")
        ]
        assert kinds[0] == "submitted" and "placed" in kinds and "succeeded" in kinds
        assert driver.find_elements(By.CSS_SELECTOR, "#job line.event[data-kind='placed']")
        if shots:
            driver.save_screenshot(str(Path(shots) / "web-job.png"))
        errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        assert errors == [], errors
    finally:
        driver.quit()


def test_without_history_the_page_says_so(tmp_path: Path) -> None:
    port = free_port()
    config = f'history_interval = "0"\nweb_listen = "127.0.0.1:{port}"\n'
    for _ in start_daemon(tmp_path, EXAMPLES / "idle-2gpu.json", config):
        assert wait_for(lambda: _answers(f"http://127.0.0.1:{port}/ui/data/overview"))
        time.sleep(0.5)
        assert get(f"http://127.0.0.1:{port}/ui/data/overview")["gpus"] == []


def _answers(url: str) -> bool:
    try:
        get(url)
        return True
    except (urllib.error.URLError, OSError):
        return False
