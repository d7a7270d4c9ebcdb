"""doctor's screen is drawn from its --json document: what `doctor --json` printed draws
the same screen as the findings themselves, most urgent first."""

from __future__ import annotations

import io
import json

from rich.console import Console

from gpuwarden.observe.doctor import report
from gpuwarden.observe.doctor_findings import Finding
from gpuwarden.render.doctor import render


def text(findings: list[Finding], *, via_json: bool) -> str:
    doc = report(findings)
    if via_json:
        doc = json.loads(json.dumps(doc))
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(render(doc))
    return console.export_text()


FINDINGS = [
    Finding("numa_mismatch", "info", 2, 4242, "CPUs 0-7 are off GPU 2's node", "taskset -c 8-15"),
    Finding(
        "residual_memory",
        "critical",
        1,
        None,
        "3.0 GiB held by no process",
        "nvidia-smi -i 1 -pm 1",
    ),
    Finding("mps_orphan", "warning", None, 77, "an MPS server with no control", "kill 77"),
]


def test_the_document_draws_the_same_screen_grouped_most_urgent_first() -> None:
    out = text(FINDINGS, via_json=True)
    assert out == text(FINDINGS, via_json=False)
    heads = [out.index(h) for h in ("Critical (1)", "Warning (1)", "Info (1)")]
    assert heads == sorted(heads)
    assert "GPU 1 · residual_memory" in out and "machine · mps_orphan · pid 77" in out
    assert "fix: nvidia-smi -i 1 -pm 1" in out
    assert out.rstrip().endswith("1 critical, 1 warning, 1 info")


def test_no_findings_say_so() -> None:
    assert text([], via_json=True).strip() == "No problems found"
