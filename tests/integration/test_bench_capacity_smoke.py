"""`bench/bench_capacity.py --quick --baseline-ref HEAD --tracing` runs end to end and reports
every figure.

Why: the capacity benchmark is run rarely and by hand, so without this it would rot
unnoticed. It checks that the ramp table, the comparison, the parking figures and the
results file exist and that the tiny run had no errors, never how fast anything was.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.support.procs import ROOT

QUICK_STEPS = (5, 10)
QUICK_PARK = 20


def test_bench_capacity_quick_prints_and_writes_every_figure(tmp_path: Path) -> None:
    json_path = tmp_path / "capacity.json"
    worktrees_before = subprocess.run(
        ["git", "worktree", "list", "--porcelain"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.count("worktree ")
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "bench_capacity.py"),
            "--quick",
            "--baseline-ref",
            "HEAD",
            "--tracing",
            "--json",
            str(json_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-4000:]

    for variant in ("current", "baseline", "traced"):
        for n in QUICK_STEPS:
            row = rf"{variant}\s+{n}\s+{2 * n}/{2 * n}\s+100%\s+0\s+-?\d+\.\d\s+-?\d+\.\d\s+\d+\.\d{{3}}"
            assert re.search(row, out), f"missing ramp row {row!r}:\n{out}"
        assert re.search(rf"{variant}\s+sustains\s+\d+ conversations\. A conversation costs", out), out
    assert "baseline: " in out and "/.data/bench-worktrees/" in out, out  # imported from the worktree
    assert re.search(r"carries [+-]\d+\.\d% conversations per core .*at the same p99: (YES|NO)", out), out
    assert re.search(r"tracing costs [+-]\d+\.\d% CPU per conversation .*: (YES|NO); [\d,]+ spans", out), out
    assert re.search(rf"parked {QUICK_PARK} \(0 failed\)", out), out
    assert re.search(r"redis bytes per parked session: [\d,]+ \(used_memory delta", out), out
    assert re.search(r"graph RSS: \d+\.\d MiB after \d+ parked -> \d+\.\d MiB", out), out
    assert re.search(r"resumed (\d+)/\1 sampled sessions", out), out
    assert re.search(
        rf"control, {QUICK_PARK} ordinary finished sessions on a fresh graph \(0 errors\)", out
    ), out

    results = json.loads(json_path.read_text())
    assert {"machine", "config", "steps", "capacity", "comparison", "parking"} <= results.keys()
    steps = results["steps"]
    assert sorted((r["variant"], r["conversations"]) for r in steps) == sorted(
        (v, n) for v in ("current", "baseline", "traced") for n in QUICK_STEPS
    )
    assert results["tracing"]["spans_received"] > 0, results["tracing"]
    for r in steps:
        assert r["errors"] == 0 and r["completion_rate"] == 1.0, r
        assert r["graph_cpu_s"] > 0 and r["rss_mb"] > 0 and r["cpu_s_per_conversation"] > 0, r
        assert r["standin"]["disconnected"] == 0, r["standin"]
    assert results["config"]["baseline_imports"].startswith(str(ROOT / ".data" / "bench-worktrees"))
    parking = results["parking"]
    assert parking["parked"] == QUICK_PARK and parking["error_count"] == 0, parking
    assert parking["redis_bytes_per_session_used_memory"] > 0
    assert parking["resumed"] == parking["resume_tried"] > 0, parking
    assert results["rss_control"]["sessions"] == QUICK_PARK and results["rss_control"]["error_count"] == 0

    worktrees_after = subprocess.run(
        ["git", "worktree", "list", "--porcelain"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.count("worktree ")
    assert worktrees_after <= worktrees_before  # the baseline's worktree is gone


def test_bench_capacity_quick_relay_peer_reports_the_held_out_ratio(tmp_path: Path) -> None:
    """`--peer relay --quick`: the graph and bench/relay.py alternate step by step and the
    held-out line names both CPUs per turn and their ratio against the target."""
    json_path = tmp_path / "capacity-relay.json"
    proc = subprocess.run(
        [
            *(sys.executable, str(ROOT / "bench" / "bench_capacity.py")),
            *("--quick", "--peer", "relay", "--json", str(json_path)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-4000:]
    for variant in ("current", "relay"):
        for n in QUICK_STEPS:
            row = rf"{variant}\s+{n}\s+{2 * n}/{2 * n}\s+100%\s+0\s"
            assert re.search(row, out), f"missing ramp row {row!r}:\n{out}"
    line = re.search(
        r"graph CPU per turn (\d+\.\d) ms, relay (\d+\.\d) ms, ratio (\d+\.\d\d) "
        r"\(target <= 0\.6\): (PASS|MISS)",
        out,
    )
    assert line, out
    results = json.loads(json_path.read_text())
    at = results["peer"]["at"]
    assert at["relay_cpu_ms_per_turn"] > 0 and at["graph_cpu_ms_per_turn"] > 0, at
    assert at["ratio"] == at["graph_cpu_ms_per_turn"] / at["relay_cpu_ms_per_turn"], at
    assert line.group(3) == f"{at['ratio']:.2f}" and line.group(1) == f"{at['graph_cpu_ms_per_turn']:.1f}"
    assert results["peer"]["peer"] == "relay" and results["config"]["park"] == 0
    assert sorted((r["variant"], r["conversations"]) for r in results["steps"]) == sorted(
        (v, n) for v in ("current", "relay") for n in QUICK_STEPS
    )
    for r in results["steps"]:
        assert r["errors"] == 0 and r["completion_rate"] == 1.0 and r["graph_cpu_s"] > 0, r
