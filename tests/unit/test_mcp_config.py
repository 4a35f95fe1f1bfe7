"""`mcp_servers:` in the agent descriptor: the exact shape of issue 21, `${VAR}` expanded from
the environment (a missing one is a startup error naming it), and no secret in any message."""

from __future__ import annotations

from pathlib import Path

import pytest

from vagent_graph.agents.descriptor import load_descriptor
from vagent_graph.agents.mcp_config import McpConfigError, load_servers

FULL = {
    "name": "calendar",
    "url": "${CALENDAR_MCP_URL}",
    "transport": "streamable_http",
    "credential": "user",
    "credential_header": "Authorization",
    "confirm": "auto",
    "confirm_tools": ["delete_event"],
    "include": [],
    "exclude": ["admin_reset"],
    "timeout_seconds": 30,
}


def test_the_documented_shape_loads_with_variables_expanded() -> None:
    (server,) = load_servers([FULL], {"CALENDAR_MCP_URL": "http://127.0.0.1:8093/mcp"})
    assert server.url == "http://127.0.0.1:8093/mcp"
    assert server.credential_resource == "mcp:calendar"
    assert server.offers("list_events") and not server.offers("admin_reset")
    only = load_servers([{**FULL, "include": ["list_events"]}], {"CALENDAR_MCP_URL": "http://x/mcp"})[0]
    assert only.offers("list_events") and not only.offers("create_event")


def test_a_missing_variable_is_a_startup_error_naming_it() -> None:
    with pytest.raises(McpConfigError, match=r"mcp_servers\[calendar\].*CALENDAR_MCP_URL is not set"):
        load_servers([FULL], {})


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"name": "Calendar!", "url": "http://x"}, "name"),
        ({"name": "a" * 25, "url": "http://x"}, "name"),
        ({"name": "cal"}, "url"),
        ({"name": "cal", "url": "ftp://x"}, "url"),
        ({"name": "cal", "transport": "stdio", "url": "http://x"}, "command"),
        ({"name": "cal", "url": "http://x", "credential": "service"}, "service_credential_env"),
        ({"name": "cal", "url": "http://x", "credential_header": "Bad Header"}, "credential_header"),
        ({"name": "cal", "url": "http://x", "confirm": "sometimes"}, "confirm"),
        ({"name": "cal", "url": "http://x", "timeout_seconds": 0}, "timeout_seconds"),
        ({"name": "cal", "url": "http://x", "extra": 1}, "extra"),
    ],
)
def test_a_wrong_entry_says_which_and_why(entry: dict[str, object], problem: str) -> None:
    with pytest.raises(McpConfigError, match=problem):
        load_servers([entry], {})


def test_messages_never_quote_a_secret_from_the_url_or_the_environment() -> None:
    entry = {"name": "cal", "url": "http://user:s3cr3t-pass@host/mcp?token=s3cr3t", "confirm": "x"}
    with pytest.raises(McpConfigError) as err:
        load_servers([entry], {})
    assert "s3cr3t" not in str(err.value)
    service = {
        "name": "svc",
        "url": "http://h/mcp",
        "credential": "service",
        "service_credential_env": "SVC_KEY",
    }
    with pytest.raises(McpConfigError, match="SVC_KEY is not set"):
        load_servers([service], {})
    (ok,) = load_servers([service], {"SVC_KEY": "k-123"})
    assert "k-123" not in ok.model_dump_json()  # the secret is read when needed, never kept


def test_names_are_unique() -> None:
    with pytest.raises(McpConfigError, match="cal listed more than once"):
        load_servers([{"name": "cal", "url": "http://a"}, {"name": "cal", "url": "http://b"}], {})


def test_the_descriptor_expands_variables_in_mcp_servers_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CAL_URL", "http://127.0.0.1:9/mcp")
    path = tmp_path / "agent.yaml"
    path.write_text(
        "id: a\nname: a\nsystem_prompt: 'Keep ${THIS} as it is.'\ntools: []\n"
        "mcp_servers:\n  - name: cal\n    url: ${CAL_URL}\n"
    )
    agent = load_descriptor(path)
    assert agent.system_prompt == "Keep ${THIS} as it is."
    assert agent.mcp_servers[0].url == "http://127.0.0.1:9/mcp"
    assert agent.mcp_server_names == frozenset({"cal"})


@pytest.mark.parametrize("name", ["git__hub", "_git", "git_", "a__b__c", "_", "__"])
def test_a_name_that_could_make_two_tools_one_is_refused_at_startup(name: str) -> None:
    """`git` + `hub__merge` and `git__hub` + `merge` would both be `git__hub__merge`."""
    with pytest.raises(McpConfigError) as err:
        load_servers([{"name": "git", "url": "http://a"}, {"name": name, "url": "http://b"}], {})
    assert f"mcp_servers[{name}]: name:" in str(err.value)
    assert "neither starting nor ending with _ nor containing __" in str(err.value)


@pytest.mark.parametrize("name", ["git", "git_hub", "a", "a_b_c", "x1", "9"])
def test_names_that_keep_the_prefix_unambiguous_load(name: str) -> None:
    assert load_servers([{"name": name, "url": "http://a"}], {})[0].name == name


@pytest.mark.parametrize("credential", ["user", "service"])
def test_a_stdio_server_with_a_credential_is_refused_not_ignored(credential: str) -> None:
    """Nothing would carry the credential to a local process, while the trace said "with your
    credential": the operator is told at startup instead."""
    entry = {"name": "local", "transport": "stdio", "command": "/usr/bin/true", "credential": credential}
    if credential == "service":
        entry["service_credential_env"] = "LOCAL_KEY"
    with pytest.raises(McpConfigError) as err:
        load_servers([entry], {"LOCAL_KEY": "k"})
    message = str(err.value)
    assert message.startswith("mcp_servers[local]:") and "a stdio server takes no credential" in message
    (ok,) = load_servers([{**entry, "credential": "none", "service_credential_env": None}], {})
    assert ok.credential == "none"


def test_annotations_are_untrusted_unless_the_operator_says_so() -> None:
    (plain,) = load_servers([{"name": "cal", "url": "http://a"}], {})
    (trusted,) = load_servers([{"name": "cal", "url": "http://a", "trust_annotations": True}], {})
    assert plain.trust_annotations is False and trusted.trust_annotations is True


def test_the_origin_tells_servers_apart_without_naming_their_url() -> None:
    a, b = (
        load_servers([{"name": "git", "url": u}], {})[0] for u in ("http://a/mcp?t=s3cr3t", "http://b/mcp")
    )
    assert a.origin != b.origin and a.origin.startswith("mcp:git@") and "s3cr3t" not in a.origin
    assert a.origin == load_servers([{"name": "git", "url": "http://a/mcp?t=s3cr3t"}], {})[0].origin
