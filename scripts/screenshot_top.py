"""Write docs/top.svg: ``gpuwarden top`` at 80x24 on examples/leaky-4gpu.json.

Run from the repository root: ``.venv/bin/python scripts/screenshot_top.py``. It uses
a private simulation state and GPUWARDEN_HOME, so no daemon is reached ("no daemon")."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


async def shoot(out: Path) -> None:
    from gpuwarden.gpus.backend import open_backend
    from gpuwarden.tui.app import TopApp

    backend = open_backend()
    app = TopApp(backend, interval=60)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            for _ in range(200):  # two looks: %CPU is the CPU time between them
                await pilot.pause(0.05)
                if app.refreshes == 1:
                    await pilot.pause(0.5)
                    app.action_refresh()
                if app.refreshes >= 2:
                    break
            await pilot.pause(0.2)
            app.save_screenshot(filename=out.name, path=str(out.parent))
    finally:
        backend.close()


def main() -> int:
    sys.path.insert(0, str(ROOT / "src"))
    out = ROOT / "docs" / "top.svg"
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["GPUWARDEN_SIM"] = str(ROOT / "examples" / "leaky-4gpu.json")
        os.environ["GPUWARDEN_SIM_STATE"] = str(Path(tmp) / "sim")
        os.environ["GPUWARDEN_HOME"] = str(Path(tmp) / "home")
        asyncio.run(shoot(out))
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
