"""An operator command that cannot reach Redis says what to set and, when `make run`'s dev.env
is here and names another Redis, to source it (a newcomer's `vagent docs list` went to 6379
while make run's Redis was on 6390, with no hint why)."""

from __future__ import annotations

from pathlib import Path

from vagent_graph.cli.run_env import dev_env_path, parse_dev_env, redis_hint

DEV_ENV = Path(".data/dev.env")
MADE_RUN = {"REDIS_URL": "redis://127.0.0.1:6390/0", "ENTITY_REDIS_URL": "redis://127.0.0.1:6391/0"}


def test_without_make_runs_data_it_names_the_variable() -> None:
    assert redis_hint("REDIS_URL", "redis://127.0.0.1:6379/0", {}, DEV_ENV) == "Set REDIS_URL to your Redis."


def test_with_make_runs_data_it_names_its_redis_and_the_file_to_source() -> None:
    hint = redis_hint("REDIS_URL", "redis://127.0.0.1:6379/0", MADE_RUN, DEV_ENV)
    assert hint == (
        "Set REDIS_URL to your Redis; make run's Redis is redis://127.0.0.1:6390/0:"
        " run `. .data/dev.env` first."
    )
    entity = redis_hint("ENTITY_REDIS_URL", "redis://127.0.0.1:6379/0", MADE_RUN, DEV_ENV)
    assert "make run's Redis is redis://127.0.0.1:6391/0" in entity and entity.startswith(
        "Set ENTITY_REDIS_URL"
    )


def test_already_pointed_at_make_run_it_asks_whether_make_run_is_running() -> None:
    hint = redis_hint("REDIS_URL", "redis://127.0.0.1:6390/0", MADE_RUN, DEV_ENV)
    assert "is `make run` still running?" in hint and "run `." not in hint


def test_a_password_in_the_files_url_is_never_shown() -> None:
    hint = redis_hint(
        "REDIS_URL", "redis://127.0.0.1:6379/0", {"REDIS_URL": "redis://:pw-9f8e7d@h:1/0"}, DEV_ENV
    )
    assert "pw-9f8e7d" not in hint and "`. .data/dev.env`" in hint


def test_the_file_is_under_vagent_data_dir() -> None:
    assert dev_env_path({}) == DEV_ENV
    assert dev_env_path({"VAGENT_DATA_DIR": "/srv/vagent"}) == Path("/srv/vagent/dev.env")


def test_reading_the_file_skips_comments_and_broken_lines() -> None:
    text = "# a comment\nexport REDIS_URL='redis://127.0.0.1:6390/0'\nexport BROKEN='\nnot an export\n"
    assert parse_dev_env(text) == {"REDIS_URL": "redis://127.0.0.1:6390/0"}
