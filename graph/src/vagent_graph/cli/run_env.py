"""What `make run` left for the operator commands: `.data/dev.env`, and the hint it makes
possible when Redis cannot be reached.

Why: `make run` starts its Redis on port 6390 (6379 may be someone else's), while `vagent`
defaults to 6379; a newcomer typing the README's `vagent docs list` in a second terminal got
"cannot reach Redis at 127.0.0.1:6379" and no idea why. `make run` writes the settings its
stack uses to `$VAGENT_DATA_DIR/dev.env` (default `.data/dev.env`, see scripts/run_local.py);
the README says `. .data/dev.env`, and an error names the variable to set and, when that file
is there and names another Redis, the file to source.

The file is POSIX sh, one `export NAME=VALUE` a line with shell-quoted values (shlex.quote),
read back here with shlex. Pure functions apart from `made_run_settings`.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

#: Where `make run` keeps its data unless VAGENT_DATA_DIR says otherwise (relative to the
#: directory `make run` was started in, the repository's root).
DEFAULT_DATA_DIR = ".data"
DEV_ENV = "dev.env"


def dev_env_path(environ: Mapping[str, str]) -> Path:
    """`$VAGENT_DATA_DIR/dev.env`, default `.data/dev.env` (relative: as the user would type it)."""
    return Path(environ.get("VAGENT_DATA_DIR") or DEFAULT_DATA_DIR) / DEV_ENV


def parse_dev_env(text: str) -> dict[str, str]:
    """The `export NAME=VALUE` lines of a dev.env (comments and anything else skipped)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name, value = words[1].split("=", 1)
            found[name] = value
    return found


def _shown(url: str) -> str | None:
    """`url` as it may be printed: None when it holds a password (never in an error message)."""
    try:
        return None if urlsplit(url).password else url
    except ValueError:
        return None


def redis_hint(variable: str, url: str, made_run: Mapping[str, str], dev_env: Path) -> str:
    """What to do about an unreachable Redis named by `variable` (whose value was `url`):
    set it, or source `make run`'s dev.env when that names another Redis.

    `made_run` is the dev.env's settings (empty: no `make run` data here). For ENTITY_REDIS_URL
    unset (the entity graphs then live in REDIS_URL's Redis), call it with "REDIS_URL"."""
    hint = f"Set {variable} to your Redis"
    theirs = made_run.get(variable)
    if not theirs:
        return hint + "."
    if theirs == url:
        return hint + f" (this is make run's, from {dev_env}: is `make run` still running?)."
    shown = _shown(theirs)
    where = f"make run's Redis is {shown}" if shown else "make run's Redis is another one"
    return f"{hint}; {where}: run `. {dev_env}` first."


def made_run_settings(environ: Mapping[str, str] | None = None) -> tuple[dict[str, str], Path]:
    """The settings in `make run`'s dev.env under the current directory (empty when there is
    none or it cannot be read), and the path as the user would type it."""
    env = os.environ if environ is None else environ
    path = dev_env_path(env)
    try:
        return parse_dev_env(path.read_text(errors="replace")), path
    except OSError:
        return {}, path
