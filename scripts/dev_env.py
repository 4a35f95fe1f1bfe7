"""`make run`'s settings for a second terminal: `.data/dev.env`, and the budgets file it edits.

Why: the operator commands (`vagent docs|audit|admin|usage|trace`) default to Redis on 6379,
while `make run` starts its own on 6390, and `vagent` is in .venv/bin, not on PATH. The
README's commands work as written after `. .data/dev.env`. The file holds only what those
commands need and nothing the user supplied as a secret: a REDIS_URL with a password, an
admin token of their own and API keys stay out (the graph reads them; a file on disk need not).

The budget demo edits `.data/budgets.yaml`, a git-ignored copy of deploy/dev/budgets.yaml, so
trying a tiny budget leaves no change in the checkout.

Pure functions (dev_env_text) and thin file writers; run_local.py calls them at start, after
the ports are known; tests/unit/test_dev_env.py tests them.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

DEV_ENV = "dev.env"
BUDGETS_COPY = "budgets.yaml"
#: Settings the operator commands read, exported as `make run` uses them when they are set and
#: hold no password (a REDIS_URL with one is the user's to set in the second terminal too).
URL_SETTINGS = ("REDIS_URL", "ENTITY_REDIS_URL")
#: Plain settings passed on as they are when set: the embedding model must be the one the
#: graph uses (`vagent docs ingest` would otherwise build vectors of another model), the
#: names of the index, the graph and the stream must be the ones make run's stack writes.
PLAIN_SETTINGS = (
    "EMBEDDINGS_BASE_URL",
    "EMBEDDINGS_MODEL",
    "DOCS_INDEX",
    "DOCS_VECTOR_ALGORITHM",
    "ENTITY_GRAPH",
    "AUDIT_STREAM",
    "TRACE_TTL_SECONDS",
    "BUDGETS_FILE",
    "RECORDS_DB_PATH",
    "DEFAULT_DOMAIN",
    "VAGENT_DATA_DIR",
)


def _has_password(url: str) -> bool:
    try:
        return bool(urlsplit(url).password)
    except ValueError:
        return True  # unreadable: do not risk writing it


def dev_env_text(env: Mapping[str, str], venv_bin: Path, dev_admin_token: str) -> str:
    """The dev.env for `env`, the settings `make run` started its stack with.

    GRAPH_ADMIN_TOKEN only when it is `dev_admin_token`, make run's printed development
    default: a token the user supplied never lands in a file."""
    lines = [
        "# Written by `make run` at each start: its stack's settings for the `vagent` operator",
        "# commands in another terminal: `. .data/dev.env` in the directory make run started in",
        "# (or the dev.env under your VAGENT_DATA_DIR).",
        f'export PATH={shlex.quote(str(venv_bin))}:"$PATH"',
    ]
    for name in URL_SETTINGS:
        value = env.get(name)
        if not value:
            continue
        if _has_password(value):
            lines.append(f"# {name} holds a password: set it yourself in this terminal")
        else:
            lines.append(f"export {name}={shlex.quote(value)}")
    lines += [f"export {name}={shlex.quote(env[name])}" for name in PLAIN_SETTINGS if env.get(name)]
    if env.get("GRAPH_ADMIN_TOKEN") == dev_admin_token:
        lines.append(f"export GRAPH_ADMIN_TOKEN={shlex.quote(dev_admin_token)}")
    return "\n".join(lines) + "\n"


def write_private(path: Path, text: str) -> None:
    """`text` into `path`, readable by its owner only (0600), replacing what was there in one
    step (a second terminal sourcing it meanwhile reads the old file or the new, never half)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    tmp.chmod(0o600)  # O_CREAT's mode applies only to a new file
    tmp.replace(path)


def write_dev_env(data: Path, env: Mapping[str, str], venv_bin: Path, dev_admin_token: str) -> Path:
    """`data/dev.env` for the stack started with `env`; its path."""
    path = data / DEV_ENV
    write_private(path, dev_env_text(env, venv_bin, dev_admin_token))
    return path


def budgets_copy(data: Path, original: Path) -> Path:
    """`data/budgets.yaml`, copied from `original` when it is not there yet (an edited copy
    is kept across restarts: the newcomer's change stays)."""
    copy = data / BUDGETS_COPY
    if not copy.exists():
        shutil.copyfile(original, copy)
    return copy


def budgets_setting(env: Mapping[str, str], data: Path, original: Path) -> str:
    """BUDGETS_FILE for make run's stack: the user's when set (even empty: no budgets), else
    the git-ignored copy `data/budgets.yaml` (made from `original` on first use)."""
    if "BUDGETS_FILE" in env:
        return env["BUDGETS_FILE"]
    return str(budgets_copy(data, original))
