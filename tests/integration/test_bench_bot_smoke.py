"""`bench/bench_bot.py --quick` runs end to end and reports every figure.

Why: the benchmark starts the whole product (Synapse, Redis, provider, graph, bot, echo
bot) and is run rarely and by hand, so without this it would rot unnoticed. It checks
that the numbers exist and are sane, never how fast anything was.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import run_bench_quick

pytestmark = pytest.mark.e2e

QUICK_MESSAGES = 5
RATIO = r"\d+\.\d+x"


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and value > 0


def test_bench_bot_quick_prints_and_writes_every_figure(tmp_path: Path) -> None:
    stdout, results = run_bench_quick("bench_bot.py", tmp_path / "bot.json", timeout=180)

    for bot in ("echo", "vagent"):
        assert re.search(rf"^\s+{bot}\s+{QUICK_MESSAGES}(\s+\d+\.\d+){{4}}$", stdout, re.M), stdout
    assert re.search(rf"vagent/echo p50 final-edit\s+{RATIO}\s+(PASS|MISS)", stdout), stdout
    assert re.search(rf"vagent/echo p50 first-visible\s+{RATIO}", stdout), stdout
    assert re.search(rf"vagent/echo p99 final-edit\s+{RATIO}\s+first-visible {RATIO}", stdout), stdout
    assert re.search(r"vagent edits per answer: median \d", stdout), stdout

    assert {"machine", "config", "bots", "ratios", "breakdown_p50_ms"} <= results.keys()
    assert _positive(results["machine"]["cores"])
    assert results["config"]["messages"] == QUICK_MESSAGES
    assert results["config"]["llm_tcp_nodelay"] is True

    assert set(results["bots"]) == {"echo", "vagent"}
    for name, bot in results["bots"].items():
        assert bot["messages"] == QUICK_MESSAGES == len(bot["samples"]), name
        for metric in ("first_visible_ms", "final_ms", "send_ms"):
            assert all(_positive(bot[metric][k]) for k in ("p50", "p99", "mean", "min", "max")), (name, bot)
        for s in bot["samples"]:
            assert 0 < s["first_ms"] <= s["final_ms"], (name, s)
            assert s["question_ts"] <= s["first_ts"] <= s["final_ts"], (name, s)
    echo, vagent = results["bots"]["echo"], results["bots"]["vagent"]
    assert echo["edits"]["max"] == 0  # the echo's reply is final as sent
    assert all(s["first_ms"] == s["final_ms"] for s in echo["samples"])
    # a zero-delay answer is complete within the bot's hold: one message, maybe no edit at all
    assert vagent["edits"]["min"] >= 0 and vagent["final_ms"]["p50"] >= vagent["first_visible_ms"]["p50"]

    ratios = results["ratios"]
    for key in ("final_p50", "final_p99", "first_visible_p50", "first_visible_p99"):
        assert _positive(ratios[key]), ratios
    assert ratios["target_final_p50"] == 1.5
    assert isinstance(ratios["pass"], bool)
    assert _positive(results["breakdown_p50_ms"]["vagent"]["bot_first"])
