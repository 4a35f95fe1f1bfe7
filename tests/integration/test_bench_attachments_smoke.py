"""`bench/bench_attachments.py --quick` runs end to end and reports every figure (~10 s).

Why: the benchmark is run rarely and by hand, so without this it would rot unnoticed. It
checks that every file was read and answered, that both phases had turns and no errors,
and that the memory figures exist (the worker's peak comes from the graph's
`attachment_read` log line), never how fast anything was or whether a target was met.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.procs import run_bench_quick

VERDICT = r"(PASS|MISS)"
QUICK_ROUNDS = 2


def test_bench_attachments_quick_prints_and_writes_every_figure(tmp_path: Path) -> None:
    stdout, results = run_bench_quick("bench_attachments.py", tmp_path / "attachments.json", timeout=120)

    assert re.search(rf"B - A first-token p99: [+-]\d+\.\d ms .*target <= 100 ms: {VERDICT}", stdout), stdout
    for name in ("report.pdf", "photo.jpg"):
        line = (
            rf"{re.escape(name)}\s+\d+\.\d MiB: worker peak \d+ MiB = \d+ idle \+ -?\d+ "
            rf"\(-?\d+\.\d\dx the file\) {VERDICT}; graph [+-]\d+ MiB \(-?\d+\.\d\dx\) {VERDICT}"
        )
        assert re.search(line, stdout), f"missing memory line {line!r}:\n{stdout}"
    for stage in ("upload", "read", "reply", "between"):
        assert re.search(rf"^\s+{stage}\s+\d+ turns\s+add p50", stdout, re.MULTILINE), stdout

    wanted = {"machine", "config", "files", "per_file", "phases", "blocks", "p99_pass", "rss_pass"}
    assert wanted <= results.keys()
    for phase in ("A", "B"):
        fig = results["phases"][phase]
        assert fig["blocks"] == QUICK_ROUNDS and fig["turns"] > 0 and fig["errors"] == 0, fig
        assert fig["added_first_ms"]["p99"] is not None, fig
    files = results["files"]
    keys = [f["key"] for f in files]  # sent again while a phase lasts: at least once a round
    assert set(keys) == {"image", "pdf"} and min(keys.count("image"), keys.count("pdf")) >= QUICK_ROUNDS
    for f in files:
        assert not f["error"], f
        assert f["upload_ms"] > 0 and f["read_ms"] > 0 and f["total_ms"] >= f["upload_ms"], f
        assert f["worker_peak_logged"] > 0, f  # the graph's attachment_read line carries it
        assert f["worker_idle_peak"] > 0 and f["graph_peak"] > 0, f
        if not f["question"]:
            assert f["reply"] == f"Got {f['name']} — what should I do with it?", f
    for key in ("pdf", "image"):
        assert results["per_file"][key]["size"] > 0 and results["per_file"][key]["errors"] == 0
