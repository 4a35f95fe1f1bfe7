"""The stand-ins' SQLite files (the demo ticket service's, the demo calendar's): one
connection and one transaction per call, a writer taking the write lock up front, so two
requests never interleave half-done writes. Blocking: call it in a worker thread."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path


@contextmanager
def transaction(path: Path, write: bool = True) -> Iterator[sqlite3.Connection]:
    """One connection, one transaction; rows as `sqlite3.Row`."""
    with closing(sqlite3.connect(path, isolation_level=None, timeout=10)) as conn:
        conn.row_factory = sqlite3.Row
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
