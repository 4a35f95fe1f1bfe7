"""The budgets policy as the graph sees it: BUDGETS_FILE (YAML, vagent_shared.budgets.
BudgetPolicy, docs/budgets.md), re-read when the file changes.

Why re-read and not restart: an operator who caps a runaway user wants it to apply now, on
every replica. The check is cheap: at most one `stat()` per RECHECK_SECONDS (mtime, size
and inode; an editor that saves by renaming changes the inode), the file read only when one
of them changed.

A broken edit keeps the LAST GOOD policy (unlike the access policy: a stale budget costs
tokens, never access) and logs, once per distinct problem, where it is broken: the YAML line
and column, or the key path (`users."@alice:example.org".daily_tokens: Input should be greater
than or equal to 0`), never the file's text. No file configured: no limits. A file missing at
start: logged, no limits until it appears.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import structlog
import yaml
from pydantic import ValidationError

from vagent_shared.budgets import BudgetPolicy
from vagent_shared.validation import Loc, problems

log = structlog.get_logger(__name__)

#: How often the file's stat is looked at (at most).
RECHECK_SECONDS = 1.0
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


class PolicyError(ValueError):
    """The file is not YAML, or does not validate; the message says where."""


def place(loc: Loc) -> str:
    """A validation error's location as the file spells it: `users."@alice:example.org".daily_tokens`
    (keys that are not plain words quoted; list positions as `[0]`)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        text = part if _PLAIN_KEY.match(part) else '"' + part.replace('"', '\\"') + '"'
        out += f".{text}" if out else text
    return out or "(the file)"


def yaml_problem(exc: yaml.YAMLError) -> str:
    """Where the YAML is broken (line and column, 1-based), without PyYAML's quote of the line."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem or exc.context}"
    return type(exc).__name__


def parse_policy(text: str) -> BudgetPolicy:
    """The policy in `text` (an empty file: no limits); PolicyError says where it is wrong."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"not valid YAML: {yaml_problem(exc)}") from None
    if raw is None:
        return BudgetPolicy()
    if not isinstance(raw, dict):
        raise PolicyError(f"the file must be a mapping of settings, not a {type(raw).__name__}")
    try:
        return BudgetPolicy.model_validate(raw)
    except ValidationError as exc:
        raise PolicyError(problems(exc, place)) from None


def describe(policy: BudgetPolicy) -> dict[str, object]:
    """The `budgets_loaded` log line's fields (counts, no ids)."""
    return {
        "default_user_daily_tokens": policy.default_user_daily_tokens,
        "users": len(policy.users),
        "tenants": len(policy.tenants),
        "llm_calls_per_turn": policy.llm_calls_per_turn,
    }


class Budgets:
    """The current policy of BUDGETS_FILE (`path` None: no limits)."""

    def __init__(self, path: Path | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self._policy = BudgetPolicy()
        self._sig: tuple[int, int, int] | None = None
        self._checked = float("-inf")
        self._problem = ""
        self._loaded = False
        if path is not None:
            self.policy()

    def policy(self) -> BudgetPolicy:
        """The last good policy, after looking at the file if a second has passed."""
        if self.path is None:
            return self._policy
        now = self._clock()
        if now - self._checked >= RECHECK_SECONDS:
            self._checked = now
            self._look()
        return self._policy

    def _look(self) -> None:
        assert self.path is not None
        try:
            st = os.stat(self.path)
        except OSError as exc:
            self._sig = None
            self._fail(f"cannot read it: {exc.strerror or type(exc).__name__}")
            return
        sig = (st.st_mtime_ns, st.st_size, st.st_ino)
        if sig == self._sig:
            return
        self._sig = sig
        try:
            policy = parse_policy(self.path.read_text(encoding="utf-8"))
        except OSError as exc:
            self._sig = None
            self._fail(f"cannot read it: {exc.strerror or type(exc).__name__}")
        except (PolicyError, UnicodeDecodeError) as exc:
            self._fail(str(exc))
        else:
            self._policy, self._problem, self._loaded = policy, "", True
            log.info("budgets_loaded", budgets_file=str(self.path), **describe(policy))

    def _fail(self, problem: str) -> None:
        """Log a problem once (not at every check while it lasts); the last good policy stays."""
        if problem != self._problem:
            self._problem = problem
            log.warning(
                "budgets_file_invalid",
                budgets_file=str(self.path),
                problem=problem,
                kept="the last good policy" if self._loaded else "no limits",
            )
