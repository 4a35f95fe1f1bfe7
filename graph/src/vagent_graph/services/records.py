"""The demo "records" database (SQLite), which the service creates and seeds, and its access.

`RECORDS_DB_PATH` may name one database for everybody or, with `{domain}` in it, one per
tenant (`make run`: `.data/records/{domain}.db`), each created and seeded on its first use, so
one tenant's deletes never change another's rows.

Reads open the file READ-ONLY (SQLite URI mode=ro + query_only, no ATTACH), so no SQL text
can write, whatever it says. A delete removes exactly the rows that were counted: the count and
a digest of their ids are checked again inside its write transaction (`delete_confirmed`).
"""

from __future__ import annotations

import hashlib
import random
import re
import sqlite3
import time
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from urllib.parse import quote

MAX_ROWS = 50
QUERY_TIME_LIMIT_S = 2.0
CUSTOMERS = [
    "Acme Corp",
    "Globex",
    "Initech",
    "Umbrella",
    "Hooli",
    "Stark Industries",
    "Wayne Enterprises",
    "Wonka",
    "Soylent",
    "Tyrell",
    "Cyberdyne",
    "Aperture",
]
SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY,
    customer TEXT NOT NULL,
    amount REAL NOT NULL,
    created_at TEXT NOT NULL  -- ISO date YYYY-MM-DD
);
CREATE INDEX IF NOT EXISTS records_created_at ON records(created_at);
"""


#: What `{domain}` in RECORDS_DB_PATH may become: a tenant's name, never a path.
_DOMAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]+)*")
DOMAIN_PLACEHOLDER = "{domain}"


@dataclass(frozen=True)
class RecordsDb:
    """The demo database's file (or, with `{domain}` in it, each tenant's), as a service the
    records tools find in their context."""

    path: Path

    def for_domain(self, domain: str) -> Path:
        """The database of `domain`'s tenant, created and seeded if it is new. A domain that
        is no plain name (`..`, a slash) gets no database at all."""
        template = str(self.path)
        if DOMAIN_PLACEHOLDER not in template:
            return self.path
        if len(domain) > 100 or not _DOMAIN.fullmatch(domain):
            raise FileNotFoundError("the records database does not exist")
        path = Path(template.replace(DOMAIN_PLACEHOLDER, domain))
        ensure_records_db(path)
        return path


def ensure_records_db(path: Path, rows: int = 1500, seed: int = 42) -> None:
    """Create and seed the database once; an existing one is left alone (a template with
    `{domain}`: each tenant's on its first use)."""
    if DOMAIN_PLACEHOLDER in str(path):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as conn:
        conn.executescript(SCHEMA)
        (n,) = conn.execute("SELECT COUNT(*) FROM records").fetchone()
        if n:
            return
        rng = random.Random(seed)
        start, span = date(2015, 1, 1), (date(2025, 12, 31) - date(2015, 1, 1)).days
        conn.executemany(
            "INSERT INTO records (customer, amount, created_at) VALUES (?, ?, ?)",
            [
                (
                    rng.choice(CUSTOMERS),
                    round(rng.uniform(10, 5000), 2),
                    (start + timedelta(days=rng.randint(0, span))).isoformat(),
                )
                for _ in range(rows)
            ],
        )


def _readonly(path: Path) -> sqlite3.Connection:
    if not path.exists():
        raise FileNotFoundError("the records database does not exist")
    conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=5)
    conn.execute("PRAGMA query_only = ON")
    conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)  # no ATTACH of other (writable) files
    return conn


def run_query(
    path: Path, sql: str, max_rows: int = MAX_ROWS
) -> tuple[list[str], list[tuple[object, ...]], bool]:
    """Columns, at most `max_rows` rows, and whether more were cut off."""
    conn = _readonly(path)
    deadline = time.monotonic() + QUERY_TIME_LIMIT_S
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    try:
        cur = conn.execute(sql)
        cols = [d[0] for d in cur.description or []]
        rows = cur.fetchmany(max_rows + 1)
        return cols, rows[:max_rows], len(rows) > max_rows
    finally:
        conn.close()


def count_older_than(path: Path, cutoff: date) -> int:
    conn = _readonly(path)
    try:
        (n,) = conn.execute(
            "SELECT COUNT(*) FROM records WHERE created_at < ?", (cutoff.isoformat(),)
        ).fetchone()
        return int(n)
    finally:
        conn.close()


def _matching(conn: sqlite3.Connection, cutoff: date) -> tuple[int, str]:
    """How many rows are older than `cutoff`, and a digest of exactly which: their ids, joined
    by SQLite itself (no Python object per row) in the order of the created_at index, which is
    the same for the same rows."""
    n, ids = conn.execute(
        "SELECT COUNT(*), group_concat(id) FROM records WHERE created_at < ?", (cutoff.isoformat(),)
    ).fetchone()
    return int(n), hashlib.sha256(str(ids or "").encode()).hexdigest()


def matching_older_than(path: Path, cutoff: date) -> tuple[int, str]:
    """The rows a delete would remove now: their count and the digest of their ids."""
    conn = _readonly(path)
    try:
        return _matching(conn, cutoff)
    finally:
        conn.close()


def delete_confirmed(path: Path, cutoff: date, count: int, digest: str) -> tuple[int | None, int, str]:
    """Delete the rows older than `cutoff` iff they are exactly the confirmed ones.

    Returns (deleted, count now, digest now); `deleted` is None when the matching rows are not
    the confirmed ones any more (nothing deleted). The check and the delete share one write
    transaction (BEGIN IMMEDIATE), so no row can slip in between them.
    """
    conn = sqlite3.connect(path, timeout=5, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            now, now_digest = _matching(conn, cutoff)
            if (now, now_digest) != (count, digest):
                conn.execute("ROLLBACK")
                return None, now, now_digest
            cur = conn.execute("DELETE FROM records WHERE created_at < ?", (cutoff.isoformat(),))
            deleted = cur.rowcount
            conn.execute("COMMIT")
            return deleted, now, now_digest
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    finally:
        conn.close()
