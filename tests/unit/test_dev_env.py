"""`make run`'s dev.env: a second terminal runs `. .data/dev.env` and the README's `vagent`
commands reach make run's stack; the file is private and holds no secret the user supplied.
And the budget demo edits a git-ignored copy, kept across restarts."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

from dev_env import budgets_copy, budgets_setting, dev_env_text, write_dev_env
from run_local import DEV_ADMIN_TOKEN

from vagent_graph.cli.run_env import parse_dev_env

VENV_BIN = Path("/home/new comer/vagent/.venv/bin")  # a space: quoting matters
STACK = {
    "REDIS_URL": "redis://127.0.0.1:6390/0",
    "ENTITY_REDIS_URL": "redis://127.0.0.1:6391/0",
    "BUDGETS_FILE": "/home/new comer/vagent/.data/budgets.yaml",
    "RECORDS_DB_PATH": "/home/new comer/vagent/.data/records/{domain}.db",
    "EMBEDDINGS_MODEL": "it's-a-model; rm -rf /",
    "GRAPH_ADMIN_TOKEN": DEV_ADMIN_TOKEN,
    "GRAPH_API_TOKEN": "dev-token-change-me",
    "OPENAI_API_KEY": "sk-proj-abcdefghijklmnopqrstuvwxyz",
    "MATRIX_PASSWORD": "bot-password-123",
    "HTTP_PORT": "8000",
}


def sourced(path: Path, *names: str) -> list[str]:
    """What `sh` sees after `. path`: each of `names`, one a line."""
    script = f". '{path}'; " + "; ".join(f'printf "%s\\n" "${name}"' for name in names)
    out = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"}
    )
    return out.stdout.splitlines()


def test_sourcing_dev_env_points_the_operator_commands_at_make_runs_stack(tmp_path: Path) -> None:
    path = write_dev_env(tmp_path, STACK, VENV_BIN, DEV_ADMIN_TOKEN)
    assert path == tmp_path / "dev.env"
    redis, entity, budgets, records, model, admin, shell_path = sourced(
        path,
        "REDIS_URL",
        "ENTITY_REDIS_URL",
        "BUDGETS_FILE",
        "RECORDS_DB_PATH",
        "EMBEDDINGS_MODEL",
        "GRAPH_ADMIN_TOKEN",
        "PATH",
    )
    assert redis == "redis://127.0.0.1:6390/0" and entity == "redis://127.0.0.1:6391/0"
    assert budgets == STACK["BUDGETS_FILE"] and records == STACK["RECORDS_DB_PATH"]
    assert model == STACK["EMBEDDINGS_MODEL"]  # quoted: nothing ran
    assert admin == DEV_ADMIN_TOKEN  # make run's printed development default
    assert shell_path == f"{VENV_BIN}:/usr/bin:/bin"  # `vagent` is on PATH, the venv first


def test_dev_env_is_private_and_rewritten_each_run(tmp_path: Path) -> None:
    path = tmp_path / "dev.env"
    path.write_text("export REDIS_URL=redis://old:1/0\n")
    path.chmod(0o644)
    write_dev_env(tmp_path, STACK, VENV_BIN, DEV_ADMIN_TOKEN)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sourced(path, "REDIS_URL") == ["redis://127.0.0.1:6390/0"]
    assert [p.name for p in tmp_path.iterdir()] == ["dev.env"]  # no temporary file left


def test_no_secret_the_user_supplied_is_written() -> None:
    mine = {
        **STACK,
        "GRAPH_ADMIN_TOKEN": "my-own-admin-token-4f9a8b7c",
        "REDIS_URL": "redis://:s3cret-pass@redis.example:6379/0",
    }
    text = dev_env_text(mine, VENV_BIN, DEV_ADMIN_TOKEN)
    for secret in ("my-own-admin-token", "s3cret-pass", "sk-proj", "bot-password", "dev-token-change-me"):
        assert secret not in text
    names = parse_dev_env(text)
    assert "GRAPH_ADMIN_TOKEN" not in names and "REDIS_URL" not in names
    assert "# REDIS_URL holds a password: set it yourself" in text
    assert "HTTP_PORT" not in names  # only what the operator commands read


def test_the_cli_reads_back_what_make_run_wrote() -> None:
    names = parse_dev_env(dev_env_text(STACK, VENV_BIN, DEV_ADMIN_TOKEN))
    assert names["REDIS_URL"] == STACK["REDIS_URL"]
    assert names["EMBEDDINGS_MODEL"] == STACK["EMBEDDINGS_MODEL"]
    assert names["PATH"] == f"{VENV_BIN}:$PATH"


def test_the_budget_demo_edits_a_copy_that_survives_restarts(tmp_path: Path) -> None:
    original = tmp_path / "deploy-budgets.yaml"
    original.write_text("default_user_daily_tokens: 2000000\n")
    data = tmp_path / "data"
    data.mkdir()
    copy = budgets_copy(data, original)
    assert copy == data / "budgets.yaml" and copy.read_text() == original.read_text()
    copy.write_text("users:\n  '@alice:localhost': {daily_tokens: 100}\n")  # the newcomer's edit
    assert budgets_copy(data, original).read_text().endswith("{daily_tokens: 100}\n")
    assert original.read_text() == "default_user_daily_tokens: 2000000\n"  # the checkout unchanged


def test_make_run_uses_the_copy_unless_budgets_file_is_set(tmp_path: Path) -> None:
    original = tmp_path / "deploy-budgets.yaml"
    original.write_text("llm_calls_per_turn: 12\n")
    assert budgets_setting({}, tmp_path, original) == str(tmp_path / "budgets.yaml")
    assert (tmp_path / "budgets.yaml").exists()
    assert budgets_setting({"BUDGETS_FILE": "/etc/mine.yaml"}, tmp_path, original) == "/etc/mine.yaml"
    assert budgets_setting({"BUDGETS_FILE": ""}, tmp_path, original) == ""  # no budgets at all
