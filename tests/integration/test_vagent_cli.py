"""`vagent`, the operators' one command, as installed: every level answers --help, the shell
completion works, and `vagent admin genkey` makes keys (production needs no dev tool for it).

A subprocess for every group and top-level behaviour: the console script, its program name and
its exit codes are what an operator meets. Each command's own -h runs in this process
(tests/support/vagent_cli.py, the same app), as its group's --help already proved the process.
The commands' own behaviour is tested with Redis in test_docs_cli.py, test_audit_cli_redis.py
and test_forget.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from dev_env import write_dev_env
from procutil import free_port

from tests.support.vagent_cli import run_vagent

BIN = Path(sys.executable).parent
COMMANDS = {
    "docs": ["ingest", "list", "delete", "status", "reindex", "entities"],
    "docs entities": ["load", "delete"],
    "audit": ["tail", "export"],
    "trace": ["show", "list"],
    "admin": ["forget", "genkey"],
    "memory": ["list", "delete"],
    "schedules": ["list", "delete"],
}


def vagent(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "vagent"), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def listed(help_text: str) -> list[str]:
    """The command names under `Commands:` in a help text."""
    lines = help_text.split("\nCommands:\n", 1)[1].splitlines()
    return [line.split()[0] for line in lines if line.startswith("  ") and not line.startswith("   ")]


def test_the_top_level_help_lists_every_group_and_completion() -> None:
    for top in (vagent("--help"), run_vagent(["-h"], os.environ)):
        assert top.returncode == 0, top.stderr
        assert top.stdout.startswith("Usage: vagent [OPTIONS] COMMAND [ARGS]...")
        assert listed(top.stdout) == ["usage", "docs", "audit", "trace", "admin", "memory", "schedules"]
        assert "--install-completion" in top.stdout and "--show-completion" in top.stdout
    bare = vagent()
    assert bare.returncode == 2 and "Usage: vagent" in bare.stdout + bare.stderr


@pytest.mark.parametrize("group", list(COMMANDS))
def test_every_group_and_command_answers_help(group: str) -> None:
    words = group.split()
    shown = vagent(*words, "--help")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"Usage: vagent {group} [OPTIONS] COMMAND [ARGS]...")
    assert listed(shown.stdout) == COMMANDS[group]
    for command in COMMANDS[group]:
        if f"{group} {command}" in COMMANDS:
            continue  # a group of its own
        sub = run_vagent([*words, command, "-h"], os.environ)
        assert sub.returncode == 0, sub.stderr
        assert sub.stdout.startswith(f"Usage: vagent {group} {command} [OPTIONS]")


def test_shell_completion_of_commands_and_choices() -> None:
    script = vagent("--show-completion", "bash")
    assert script.returncode == 0 and "_VAGENT_COMPLETE=complete_bash" in script.stdout
    groups = vagent(_VAGENT_COMPLETE="complete_bash", COMP_WORDS="vagent a", COMP_CWORD="1")
    assert groups.stdout.split() == ["audit", "admin"]
    decisions = vagent(
        _VAGENT_COMPLETE="complete_bash", COMP_WORDS="vagent audit tail --decision d", COMP_CWORD="4"
    )
    assert decisions.stdout.split() == ["denied", "declined", "done"]


def test_a_usage_error_exits_2_and_names_the_command() -> None:
    proc = vagent("docs", "entities", "load", "x.json")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "Usage: vagent docs entities load" in proc.stderr and "Missing option '--domain'" in proc.stderr


def test_genkey_prints_a_fernet_key() -> None:
    done = vagent("admin", "genkey")
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    assert len(done.stdout.splitlines()) == 1
    fernet = Fernet(key.encode())
    assert fernet.decrypt(fernet.encrypt(b"x")) == b"x"
    again = run_vagent(["admin", "genkey"], os.environ)
    assert again.stdout.strip() != key


def test_an_unreachable_redis_names_the_setting_and_make_runs_redis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second terminal without `. .data/dev.env`: every group says what to set and, as make
    run's dev.env is there, which Redis make run has and what to source. Without make run's
    data only the setting is named."""
    made_run = f"redis://127.0.0.1:{free_port()}/0"
    closed = free_port()
    (tmp_path / ".data").mkdir()
    write_dev_env(tmp_path / ".data", {"REDIS_URL": made_run, "ENTITY_REDIS_URL": made_run}, BIN, "x")
    env = {k: v for k, v in os.environ.items() if k != "VAGENT_DATA_DIR"}
    env["REDIS_URL"] = f"redis://127.0.0.1:{closed}/0"
    hint = f"Set REDIS_URL to your Redis; make run's Redis is {made_run}: run `. .data/dev.env` first."
    proc = subprocess.run(
        [str(BIN / "vagent"), "docs", "list"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert (
        proc.stderr
        == f"vagent docs: cannot reach Redis at 127.0.0.1:{closed} (REDIS_URL): ConnectionError. {hint}\n"
    )
    monkeypatch.chdir(tmp_path)
    for args in (["audit", "tail"], ["usage"], ["trace", "list"]):
        ran = run_vagent(args, env)
        assert ran.returncode != 0 and ran.stderr.rstrip().endswith(hint), ran.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    ran = run_vagent(["audit", "tail"], env)
    assert ran.stderr.rstrip().endswith("(REDIS_URL): ConnectionError. Set REDIS_URL to your Redis."), (
        ran.stderr
    )
