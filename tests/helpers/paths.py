"""Where the repository's parts are, for tests that run its code or read its files."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES = ROOT / "examples"
SRC = ROOT / "src"
