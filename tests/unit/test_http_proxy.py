"""Which proxy the bot's service calls use, from the environment, read once per target."""

from __future__ import annotations

import pytest

from vagent_bot.clients.http import proxy_for

VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


@pytest.fixture(autouse=True)
def no_proxies(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARS:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


def test_no_variables_no_proxy() -> None:
    assert proxy_for("http://graph:8000") is None


def test_the_proxy_of_the_urls_scheme(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    assert proxy_for("http://graph:8000") == "http://proxy:3128"
    assert proxy_for("https://acp.example.org") is None
    monkeypatch.setenv("https_proxy", "http://secure-proxy:3128")
    assert proxy_for("https://acp.example.org") == "http://secure-proxy:3128"


def test_no_proxy_hosts_and_domains_go_direct(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    monkeypatch.setenv("NO_PROXY", "graph,.svc.cluster.local")
    assert proxy_for("http://graph:8000") is None
    assert proxy_for("http://acp.vagent.svc.cluster.local:8090") is None
    assert proxy_for("http://elsewhere:8090") == "http://proxy:3128"
