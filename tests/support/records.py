"""The demo records database as the graph's `delete_records` tool sees it: tests ask for a
delete of everything older than CUTOFF and count what is left."""

from __future__ import annotations

import sqlite3
from pathlib import Path

CUTOFF = "2020-01-01"


def older(db: Path) -> int:
    """Records created before CUTOFF."""
    with sqlite3.connect(db) as c:
        return int(c.execute("SELECT COUNT(*) FROM records WHERE created_at < ?", (CUTOFF,)).fetchone()[0])


def add_old_record(db: Path) -> None:
    """One record the test's delete has to remove (a test before may have removed the seeded ones)."""
    with sqlite3.connect(db) as c:
        c.execute("INSERT INTO records (customer, amount, created_at) VALUES ('Old Co', 1.0, '2019-06-01')")
