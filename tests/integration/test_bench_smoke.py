"""`bench/bench_graph.py --quick` runs end to end and reports every figure.

Why: the benchmark is run rarely and by hand, so without this it would rot unnoticed. It
checks that the numbers exist and are sane, never how fast anything was.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import ROOT, run_bench_quick

QUICK_CONCURRENCY = 4
QUICK_REQUESTS = 10
QUICK_TURNS = (10, 12)
QUICK_CHUNKS = 200  # bench_rag --quick: one document of 10 chunks in each of the 20 categories
VERDICT = r"(PASS|MISS)"


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and value > 0


def test_bench_graph_quick_prints_and_writes_every_figure(tmp_path: Path) -> None:
    stdout, results = run_bench_quick("bench_graph.py", tmp_path / "graph.json", timeout=120)

    for conc in (1, QUICK_CONCURRENCY):
        for label in ("first-event", "total"):
            line = rf"service/bare p50 {label}\s+c={conc}\s+\d+\.\d+x\s+{VERDICT}"
            assert re.search(line, stdout), f"missing p50 ratio line {line!r}:\n{stdout}"
    first, last = QUICK_TURNS
    for turns in QUICK_TURNS:
        assert re.search(rf"redis bytes after\s+{turns} turns:\s+[\d,]+ bytes in\s+\d+ keys", stdout), stdout
    assert re.search(rf"redis ratio {last}/{first} turns: \d+\.\d+x\s+{VERDICT}", stdout), stdout

    assert {"machine", "config", "latency", "ratios", "redis"} <= results.keys()
    assert _positive(results["machine"]["cores"])
    assert results["config"]["llm_tcp_nodelay"] is True
    assert results["config"]["placement"].startswith(("split:", "left to the kernel")), results["config"]
    assert "placement: " in stdout

    phases = {(p["mode"], p["concurrency"]): p for p in results["latency"]}
    assert set(phases) == {(m, c) for m in ("bare", "service") for c in (1, QUICK_CONCURRENCY)}
    for phase in phases.values():
        # at least the requested number is counted; at c>1 the edges of each block run uncounted
        assert phase["requests"] >= QUICK_REQUESTS
        assert phase["requests_executed"] >= phase["requests"]
        if phase["concurrency"] == 1:
            assert phase["requests_executed"] == phase["requests"] == QUICK_REQUESTS
        assert _positive(phase["throughput_rps"])
        for metric in ("first_event_ms", "total_ms"):
            assert all(_positive(phase[metric][k]) for k in ("p50", "p99", "mean", "min", "max")), phase
        # the stand-in's 20 pieces arrive whole, in-process and over SSE, coalesced into at
        # most 20 text items (STREAM_COALESCE_MS)
        assert phase["whole_answer_every_time"] is True, phase
        assert 1 <= phase["text_items_min"] <= phase["text_items_max"] <= 20, phase

    assert [r["concurrency"] for r in results["ratios"]] == [1, QUICK_CONCURRENCY]
    for ratio in results["ratios"]:
        for key in ("first_event_p50", "total_p50", "first_event_p99", "total_p99"):
            assert _positive(ratio[key]), ratio
        assert isinstance(ratio["pass"], bool)

    redis = results["redis"]
    assert [p["turns"] for p in redis["checkpoints"]] == list(QUICK_TURNS)
    for point in redis["checkpoints"]:
        assert _positive(point["bytes"]) and _positive(point["keys"]), point
        assert point["other_keys"] == 0, point  # the dedicated Redis holds only this session
    assert _positive(redis["ratio"])
    assert isinstance(redis["pass"], bool)


# bench_graph.py's placement, from bench/common.py where it lives: not bench_graph itself,
# whose imports (the whole graph) take seconds
PLACEMENT_PROBE = """
import os, subprocess, sys, types
from bench.common import place_processes
service = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
fixture = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
try:
    said = place_processes("split", [types.SimpleNamespace(proc=service)])
    print(said)
    for name, pid in (("bench", 0), ("service", service.pid), ("fixture", fixture.pid)):
        print(name, sorted(os.sched_getaffinity(pid)))
finally:
    service.kill(); fixture.kill()
"""


def test_split_placement_puts_the_measured_code_and_the_fixtures_on_different_cpus() -> None:
    """What --placement split does to real processes (in a child: it pins its caller)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs 2 usable CPUs")
    proc = subprocess.run(
        [sys.executable, "-c", PLACEMENT_PROBE], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    said, *lines = proc.stdout.splitlines()
    assert said.startswith("split:"), said
    placed = {name: value for name, value in (line.split(" ", 1) for line in lines)}
    assert placed == {"bench": str(cpus[:1]), "service": str(cpus[:1]), "fixture": str(cpus[1:])}


def test_bench_rag_quick_prints_and_writes_every_figure(tmp_path: Path) -> None:
    stdout, results = run_bench_quick("bench_rag.py", tmp_path / "rag.json", timeout=180)
    assert re.search(r"ingestion of [\d,]+ chunks: \d+ chunks/s \(embedding \d+/s", stdout), stdout
    for algorithm in ("FLAT", "HNSW"):
        assert f"{algorithm} index: search p50" in stdout
    for mode in ("5% user", "50% user"):
        assert re.search(rf"filtered/unfiltered redis p50 {re.escape(mode)}\s+\d+\.\d+x\s+{VERDICT}", stdout)
        recall = rf"recall@10 {re.escape(mode)}\s+1\.000 \(brute force 1\.000\)\s+PASS"
        assert re.search(recall, stdout), stdout
    flat = results["algorithms"]["flat"]
    assert flat["recall_at_10"]["5% user"] == 1.0 and flat["recall_at_10"]["50% user"] == 1.0
    for mode in ("unfiltered", "5% user", "50% user"):
        assert _positive(flat["search"][mode]["redis"]["p50"])
        assert _positive(flat["search"][mode]["search_documents"]["p99"])
    assert _positive(results["ingest"]["chunks_per_second"]) and results["chunks"] == QUICK_CHUNKS


def test_bench_capacity_mcp_quick_compares_the_tool_turns_and_checks_each_users_key(tmp_path: Path) -> None:
    """`bench_capacity.py --quick --mcp`: the built-in and the MCP tool turn side by side, and
    every call on the MCP server carried its own user's key (~10 s)."""
    stdout, results = run_bench_quick("bench_capacity.py", tmp_path / "capacity-mcp.json", 120, "--mcp")

    steps = (5, 10)
    for n in steps:
        for variant in ("builtin", "mcp"):
            row = rf"{variant}\s+{n}\s+{2 * n}/{2 * n}\s+100%\s+0\s+-?\d+\.\d\s+-?\d+\.\d\s+\d+\.\d{{3}}"
            assert re.search(row, stdout), f"missing ramp row {row!r}:\n{stdout}"
        # the history's tool turn and the 2 measured ones of each conversation, each user's own key
        calls = rf"mcp server: {3 * n} calls \(expected {3 * n}\) of {n} users on {n} keys, .*only: OK"
        assert re.search(calls, stdout), stdout
        compared = rf"^\s+{n} \|\s+{2 * n}\s+-?\d+\.\d\s+-?\d+\.\d\s+\d+\.\d \|\s+{2 * n}\s.*\d+\.\d\dx"
        assert re.search(compared, stdout, re.M), stdout
    assert "target: at 50 concurrent conversations an MCP tool turn costs at most 1.2x" in stdout
    assert "verdict: not measured (no step of 50 conversations" in stdout  # --quick stops at 10
    summary = r"\d+ calls of 10 users on 10 keys .*each user's calls carried that user's key only: OK"
    assert re.search(summary, stdout), stdout
    assert "MISMATCH" not in stdout

    assert {"machine", "config", "steps", "capacity", "mcp"} <= results.keys()
    assert results["config"]["mcp"] is True and results["config"]["mcp_server"]["graph_health"]["up"]
    for r in results["steps"]:
        assert r["errors"] == 0 and r["completion_rate"] == 1.0, r
        assert r["cpu_ms_per_turn"] > 0 and r["mcp_calls"]["ok"], r
        assert r["mcp_calls"]["calls"] == (3 * r["conversations"] if r["variant"] == "mcp" else 0), r
    mcp = results["mcp"]
    assert [s["conversations"] for s in mcp["steps"]] == list(steps)
    assert all(s["cpu_ratio"] > 0 for s in mcp["steps"]) and mcp["pass"] is None
    credentials = mcp["credentials"]
    assert credentials["ok"] and credentials["users"] == credentials["fingerprints"] == 10, credentials
    for group in credentials["groups"]:
        assert group["match"] and list(group["users"]) == [group["key_of"]], group


def test_bench_capacity_reports_a_call_that_carried_another_users_key() -> None:
    """The --mcp check itself: a call whose key is not its user's is a MISMATCH."""
    from bench.bench_capacity import credential_groups

    keys = {"@cap0:localhost": "bench-key-0", "@cap1:localhost": "bench-key-1"}
    fingerprints = {user: hashlib.sha256(key.encode()).hexdigest() for user, key in keys.items()}

    def call(user: str, key: str | None, authorization: str | None = None) -> dict[str, Any]:
        fp = {"x-api-key": key and hashlib.sha256(key.encode()).hexdigest(), "authorization": authorization}
        return {"tool": "echo", "arguments": {"text": f"[mcp] hi [user {user}]"}, "fingerprints": fp}

    good = [call("@cap0:localhost", "bench-key-0"), call("@cap1:localhost", "bench-key-1")] * 2
    assert credential_groups(good, fingerprints)["ok"]
    for bad in (
        call("@cap0:localhost", "bench-key-1"),  # another user's key
        call("@cap1:localhost", None),  # no key
        call("@cap1:localhost", "bench-key-9"),  # nobody's key
        call("@cap0:localhost", "bench-key-0", "ab" * 32),  # an Authorization header as well
    ):
        checked = credential_groups([*good, bad], fingerprints)
        assert not checked["ok"] and checked["mismatches"][0].startswith("MISMATCH"), checked
