"""`bench/bench_memory.py --quick` runs end to end and reports every figure.

Why: the benchmark is run rarely and by hand, so without this it would rot unnoticed. It
checks that the numbers exist and are sane, that the memory-ON graph really recalled (a
bench whose turns never recalled would measure nothing) and the OFF one never did, and that
recall never returned another user's memory; never how fast anything was.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import run_bench_quick

QUICK_MEMORIES = 20 * 20  # bench_memory --quick: 20 users x 20 memories
QUICK_TURNS = 4 * 4  # 4 conversations x 4 measured turns, per mode
VERDICT = r"(PASS|MISS)"


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and value > 0


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """One `--quick` run for every test here (it starts two graph services)."""
    path: Path = tmp_path_factory.mktemp("bench-memory") / "memory.json"
    return run_bench_quick("bench_memory.py", path, timeout=180)


def test_bench_memory_quick_prints_and_writes_every_figure(quick_run: tuple[str, dict[str, Any]]) -> None:
    stdout, results = quick_run

    assert re.search(rf"fill: {QUICK_MEMORIES:,} memories of 20 users in \d+\.\d s", stdout), stdout
    assert re.search(r"redis memory per memory: [\d,]+ bytes", stdout), stdout
    assert "filled documents: same fields and TTL as MemoryStore.add's; found by MemoryStore.search" in stdout
    assert re.search(r"empty store \(1 conv\.\) p50\s+\d+\.\d ms", stdout), stdout
    assert re.search(
        r"one page \(1 conv\.\)\s+p50\s+\d+\.\d ms .*the library's asearch: p50 \d+\.\d ms", stdout
    )
    assert re.search(r"question pre-embedded p50\s+\d+\.\d ms", stdout), stdout

    assert results["fill"]["memories"] == QUICK_MEMORIES
    assert _positive(results["redis"]["bytes_per_memory"])
    recall = results["recall"]  # the store-level diagnostics
    assert recall["recalls"] == QUICK_TURNS
    assert recall["foreign_memories"] == 0
    assert 0 < recall["memories_recalled_per_turn"] <= 5
    assert _positive(recall["recall_step_ms"]["p50"]) and _positive(recall["empty_store_recall_ms"]["p99"])
    assert all(_positive(page["p50"]) for page in recall["one_page_ms"].values())


def test_bench_memory_quick_measures_real_turns_with_and_without_memory(
    quick_run: tuple[str, dict[str, Any]],
) -> None:
    stdout, results = quick_run

    assert "turns through the graph (headline)" in stdout, stdout
    for q in ("p50", "p99"):
        line = rf"turn {q}: OFF\s+\d+\.\d ms, ON\s+\d+\.\d ms: added\s+-?\d+\.\d ms\s+{VERDICT}"
        assert re.search(line, stdout), f"missing {line!r}:\n{stdout}"
        assert re.search(rf"first text {q}: OFF\s+\d+\.\d ms, ON\s+\d+\.\d ms: added", stdout), stdout
    assert re.search(rf"recalls on ON: {QUICK_TURNS} \(expected {QUICK_TURNS} turns\), on OFF: 0;", stdout), (
        stdout
    )
    assert f"errors: ON 0/{QUICK_TURNS}, OFF 0/{QUICK_TURNS} turns" in stdout, stdout

    turns = results["graph_turns"]
    on, off = turns["modes"]["on"], turns["modes"]["off"]
    assert on["turns"] == off["turns"] == QUICK_TURNS
    assert turns["errors"] == 0 and on["errors"] == off["errors"] == 0
    # The ON graph recalled once per measured turn (its /metrics), and its audit trail holds
    # the memories it gave the model, all the asker's own; the OFF graph touched no memory.
    assert on["recalls"] == QUICK_TURNS and off["recalls"] == 0
    assert on["audit"]["recalled"] > 0 and 0 < on["audit"]["memories"] <= 5 * on["audit"]["recalled"]
    assert on["audit"]["foreign"] == 0 and turns["foreign_memories"] == 0
    assert on["audit"]["withheld"].get("not_heard", 0) > 0  # the group rooms' unheard memories
    assert off["audit"]["records"] == 0
    for mode in (on, off):
        assert all(_positive(mode[k][q]) for k in ("ttft_ms", "turn_ms") for q in ("p50", "p99")), mode
        assert _positive(mode["cpu_s_per_turn"]) and _positive(mode["rss_mb_at_end"])
        # the loop thread's CPU is a part of the process's, both read in 10 ms clock ticks at
        # slightly different moments: at most a tick or two apart over the run
        tick = 0.02 / QUICK_TURNS
        assert 0 < mode["loop_cpu_s_per_turn"] <= mode["cpu_s_per_turn"] + tick
        assert _positive(mode["loop_busy"])
    assert set(turns["added_ms"]) == set(turns["added_ttft_ms"]) == {"p50", "p99"}
    assert set(results["pass"]) == {"p50", "p99"} and all(
        isinstance(v, bool) for v in results["pass"].values()
    )
