"""What every `vagent` command prints, from one place.

Results go to stdout, flushed line by line (a pipe, or `vagent audit tail --follow`, sees each
at once); problems go to stderr as one line `vagent GROUP: message`, never a traceback. Text
that comes from users (audit reasons, key names) is made printable first: it must not move
the operator's cursor or clear their terminal. Redis is named without its password, with a hint
that names the setting (and `make run`'s dev.env, run_env.py).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence

from vagent_graph.cli import run_env
from vagent_shared import redis_connect

_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def say(text: str = "") -> None:
    print(text, flush=True)


def complain(prog: str, message: str) -> None:
    print(f"{prog}: {message}", file=sys.stderr, flush=True)


def printable(text: str) -> str:
    """`text` on one line, without control characters (no terminal escapes)."""
    return _UNPRINTABLE.sub("?", text)


def cell(text: str, width: int) -> str:
    """`text` printable, cut to `width` with an ellipsis."""
    flat = printable(text)
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def header(columns: Sequence[tuple[str, int]]) -> str:
    """A table's header line: each title padded to its column's width."""
    return "  ".join(title.ljust(width) for title, width in columns).rstrip()


def plural(n: int, noun: str, nouns: str) -> str:
    return f"{n} {noun if n == 1 else nouns}"


def unreachable(url: str, exc: BaseException, variable: str = "REDIS_URL") -> str:
    """Redis did not answer: where (no credentials) and how, naming the setting to set and,
    when `make run`'s dev.env is here and names another Redis, the file to source."""
    made_run, dev_env = run_env.made_run_settings()
    hint = run_env.redis_hint(variable, url, made_run, dev_env)
    return f"cannot reach Redis at {redis_connect.where(url)} ({variable}): {type(exc).__name__}. {hint}"


def skipped(n: int) -> str:
    return f"skipped {plural(n, 'stream entry', 'stream entries')} (not an audit event)"
