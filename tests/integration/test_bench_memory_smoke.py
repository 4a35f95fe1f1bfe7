"""`bench/bench_memory.py --quick` runs end to end and reports every figure.

Why: the benchmark is run rarely and by hand, so without this it would rot unnoticed. It
checks that the numbers exist and are sane (and that recall never returned another user's
memory), never how fast anything was.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.support.procs import run_bench_quick

QUICK_MEMORIES = 20 * 20  # bench_memory --quick: 20 users x 20 memories
VERDICT = r"(PASS|MISS)"


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and value > 0


def test_bench_memory_quick_prints_and_writes_every_figure(tmp_path: Path) -> None:
    stdout, results = run_bench_quick("bench_memory.py", tmp_path / "memory.json", timeout=180)

    assert re.search(rf"fill: {QUICK_MEMORIES:,} memories of 20 users in \d+\.\d s", stdout), stdout
    assert re.search(r"redis memory per memory: [\d,]+ bytes", stdout), stdout
    assert "filled documents: same fields and TTL as MemoryStore.add's; found by MemoryStore.search" in stdout
    for q in ("p50", "p99"):
        line = (
            rf"turn {q}: baseline\s+\d+\.\d ms, with recall\s+\d+\.\d ms: "
            rf"\d+\.\d{{3}}x, added\s+-?\d+\.\d ms\s+{VERDICT}"
        )
        assert re.search(line, stdout), f"missing {line!r}:\n{stdout}"
    assert re.search(r"empty store \(1 conv\.\) p50\s+\d+\.\d ms", stdout), stdout
    assert re.search(
        r"one page \(1 conv\.\)\s+p50\s+\d+\.\d ms .*the library's asearch: p50 \d+\.\d ms", stdout
    )
    assert "another user's: 0" in stdout

    assert results["fill"]["memories"] == QUICK_MEMORIES
    assert _positive(results["redis"]["bytes_per_memory"])
    recall = results["recall"]
    assert recall["recalls"] == 4 * 4  # 4 conversations x 4 turns
    assert recall["foreign_memories"] == 0
    assert 0 < recall["memories_recalled_per_turn"] <= 5
    for mode in ("baseline", "recall", "pre_embedded"):
        assert all(_positive(recall["turn_ms"][mode][k]) for k in ("p50", "p99")), recall
    assert _positive(recall["recall_step_ms"]["p50"]) and _positive(recall["empty_store_recall_ms"]["p99"])
    assert all(_positive(page["p50"]) for page in recall["one_page_ms"].values())
    assert (
        _positive(recall["recall_step_pre_embedded_ms"]["p50"])
        and "p99" in recall["added_without_embedding_ms"]
    )
    assert re.search(r"question pre-embedded p50\s+\d+\.\d ms", stdout), stdout
    assert set(results["pass"]) == {"p50", "p99"} and all(
        isinstance(v, bool) for v in results["pass"].values()
    )
