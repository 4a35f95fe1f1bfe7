"""`vagent` run inside the test process: the same Typer app, arguments, environment, stdout,
stderr and exit code as the console script, without starting an interpreter per command
(~2-3 s of imports each, most of a CLI test's time).

What only a real process shows (the installed entry point, its program name, exit codes
through the OS, Ctrl-C) stays tested with subprocesses: test_vagent_cli.py for every level,
and at least one run per group in test_docs_cli.py, test_forget.py, test_audit_cli_redis.py.
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from unittest import mock

import structlog
from typer.testing import CliRunner

from vagent_graph import cli
from vagent_graph.cli import docs_work
from vagent_shared.logs import configure_logging


@dataclass(frozen=True)
class Ran:
    """What subprocess.run would have returned (returncode, stdout, stderr as text)."""

    returncode: int
    stdout: str
    stderr: str


def run_vagent(args: Sequence[str], env: Mapping[str, str]) -> Ran:
    """`vagent ARGS` with exactly the environment `env` (as subprocess.run's env= means it:
    variables of this process that `env` lacks are unset for the command's duration).

    An exception that escapes the command is reported as the interpreter would: a traceback
    on stderr and exit code 1, so tests that assert "no Traceback" still catch it."""
    overrides: dict[str, str | None] = {k: None for k in os.environ if k not in env}
    overrides.update(env)
    with _process_wide_state_restored():
        result = CliRunner().invoke(cli.app, list(args), env=overrides, prog_name="vagent")
    stderr, code = result.stderr, result.exit_code
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
        code = 1
    return Ran(code, result.stdout, stderr)


@contextmanager
def _process_wide_state_restored() -> Iterator[None]:
    """A command starts with logging as a new interpreter has it (earlier tests leave handlers
    on streams since closed) and configures it for its process (root handlers on its stdout,
    structlog loggers cached on first use): put this process' back afterwards, and keep the command's
    structlog config from caching loggers, so later tests do not log through a closed capture
    or at the command's level."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    saved: dict[str, Any] = structlog.get_config()

    def configure_without_caching(level: str = "INFO", service: str = "vagent") -> None:
        configure_logging(level, service)
        structlog.configure(cache_logger_on_first_use=False)

    root.handlers[:] = []  # as in a new interpreter: no handlers, WARNING
    root.setLevel(logging.WARNING)
    try:
        with mock.patch.object(docs_work, "configure_logging", configure_without_caching):
            yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.configure(**saved)
