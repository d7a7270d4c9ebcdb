"""Regenerate docs/web-overview.png and docs/web-job.png: a real daemon on the simulated
8 x A100 box (examples/a100x8-shared.json) runs a mix of simulated jobs for about a
minute, one of which leaks, and headless Chromium takes the two pictures.

    .venv/bin/python scripts/screenshot_web.py      (needs chromium and chromium-driver)
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def main() -> int:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = Path(tempfile.mkdtemp(prefix="gw-shot-"))
    home = tmp / "home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'interval = "200ms"\nhistory_interval = "1s"\nrelease_timeout = "3s"\n'
        f'web_listen = "127.0.0.1:{port}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUWARDEN_", "CUDA_"))}
    env.update(GPUWARDEN_HOME=str(home), GPUWARDEN_SIM=str(ROOT / "examples/a100x8-shared.json"),
               GPUWARDEN_SIM_STATE=str(tmp / "sim"), PYTHONPATH=str(ROOT / "src"))

    def gw(*args: str) -> str:
        return subprocess.run([PY, "-m", "gpuwarden", *args], env=env, check=True,
                              capture_output=True, text=True).stdout.strip()

    def sim(mem: str, seconds: float, *extra: str) -> list[str]:
        return ["--", PY, "-m", "gpuwarden.sim.job", "--mem", mem, "--seconds", str(seconds),
                *extra]

    gw("daemon", "start")
    try:
        train = gw("submit", "--name", "train-llm", "--gpus", "2", "--mem", "30G",
                   *sim("20G", 55, "--grow-to", "28G", "--steps", "6",
                       "--grow-seconds", "27"))
        for i in range(4):
            gw("submit", "--name", f"eval-{i}", "--mem", "8G", "--qos", "besteffort",
               *sim("6G", 12 + 8 * i))
        time.sleep(15)
        gw("submit", "--name", "notebook", "--mem", "10G", *sim("9G", 10, "--leak"))
        gw("submit", "--name", "sweep", "--mem", "12G", "--gpus", "2", *sim("11G", 30))
        time.sleep(45)
        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium") or "chromium"
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1250",
                    f"--user-data-dir={tmp / 'profile'}"):
            options.add_argument(arg)
        driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or ""),
                                  options=options)
        try:
            driver.get(f"http://127.0.0.1:{port}/ui/")
            WebDriverWait(driver, 20).until(lambda d: d.find_element(
                By.TAG_NAME, "body").get_attribute("data-ready") == "true")
            driver.save_screenshot(str(ROOT / "docs/web-overview.png"))
            driver.set_window_size(1400, 1000)
            driver.get(f"http://127.0.0.1:{port}/ui/#job/{train}")
            WebDriverWait(driver, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR,
                                                                      "#job svg"))
            driver.save_screenshot(str(ROOT / "docs/web-job.png"))
        finally:
            driver.quit()
    finally:
        gw("daemon", "stop")
        subprocess.run(["pkill", "-f", str(tmp / "sim")], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    print("wrote docs/web-overview.png and docs/web-job.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
