"""The real `vagent-tickets` process over HTTP: each API key sees only its owner's tickets,
tickets survive a restart, and the service neither logs nor keeps a raw key.

Why a subprocess: the ticket tools and the end-to-end tests talk to exactly this process.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from procutil import free_port

from tests.support.procs import BIN, ServiceProcess

ROOT = Path(__file__).resolve().parents[2]
DEV_SEED = ROOT / "deploy/dev/tickets.yaml"
ALICE, BOB, ADMIN = "@alice:localhost", "@bob:localhost", "@admin:localhost"
TICKETS = "/api/v1/tickets"
FIELDS = {"id", "title", "description", "status", "priority", "created_at", "owner"}


def keys() -> dict[str, str]:
    """owner -> API key, from the dev seed file."""
    return {owner: key for key, owner in yaml.safe_load(DEV_SEED.read_text())["keys"].items()}


def sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class TicketsProcess(ServiceProcess):
    """`vagent-tickets` on a free loopback port with its own seed file and database."""

    def __init__(self, directory: Path) -> None:
        self.seed, self.db = directory / "tickets.yaml", directory / "data" / "tickets.db"
        self.port = free_port()
        env = {
            "TICKETS_HOST": "127.0.0.1",
            "TICKETS_PORT": str(self.port),
            "TICKETS_SEED_FILE": str(self.seed),
            "TICKETS_DB_PATH": str(self.db),
            "LOG_LEVEL": "DEBUG",
        }
        super().__init__("vagent-tickets", env, directory / f"tickets-{self.port}.log", f"{self.url}/health")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, owner: str | None, status: str | None = None) -> httpx.Response:
        params = {"status": status} if status else None
        return httpx.get(self.url + TICKETS, params=params, headers=self._auth(owner), timeout=5)

    def post(self, owner: str | None, body: Any) -> httpx.Response:
        return httpx.post(self.url + TICKETS, json=body, headers=self._auth(owner), timeout=5)

    def titles(self, owner: str, status: str | None = None) -> list[str]:
        r = self.get(owner, status)
        assert r.status_code == 200, r.text
        return [t["title"] for t in r.json()["tickets"]]

    @staticmethod
    def _auth(owner: str | None) -> dict[str, str]:
        return {"X-API-Key": keys()[owner]} if owner else {}


def start_tickets(directory: Path) -> TicketsProcess:
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(DEV_SEED, directory / "tickets.yaml")
    return TicketsProcess(directory).start()


@pytest.fixture(scope="module")
def tickets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TicketsProcess]:
    server = start_tickets(tmp_path_factory.mktemp("tickets"))
    yield server
    server.stop()


def test_each_key_sees_only_its_owners_tickets(tickets: TicketsProcess) -> None:
    assert tickets.titles(ALICE) == ["VPN drops every hour", "New laptop for onboarding"]
    assert tickets.titles(BOB) == ["Grafana dashboard shows no data", "Access to the staging database"]
    assert tickets.titles(ALICE, "closed") == ["Password reset for the wiki"]
    assert tickets.titles(ALICE, "all") == [*tickets.titles(ALICE), "Password reset for the wiki"]
    assert tickets.titles(BOB, "closed") == []
    for owner in (ALICE, BOB, ADMIN):
        assert {t["owner"] for t in tickets.get(owner, "all").json()["tickets"]} == {owner}


def test_ticket_shape(tickets: TicketsProcess) -> None:
    (vpn, laptop) = tickets.get(ALICE).json()["tickets"]
    assert set(vpn) == FIELDS
    assert re.fullmatch(r"T-1\d{3}", vpn["id"]) and vpn["id"] != laptop["id"]
    assert (vpn["status"], vpn["priority"], laptop["priority"]) == ("open", "high", "normal")
    assert vpn["description"].startswith("The VPN disconnects")
    created = datetime.fromisoformat(vpn["created_at"])
    assert created.utcoffset() == timedelta(0) and created < datetime.now(UTC)
    assert datetime.fromisoformat(laptop["created_at"]) < created  # newest first


@pytest.mark.parametrize("headers", [{}, {"X-API-Key": ""}, {"X-API-Key": "dev-tickets-key-nobody-0000"}])
def test_no_or_unknown_key_is_401(tickets: TicketsProcess, headers: dict[str, str]) -> None:
    for r in (
        httpx.get(tickets.url + TICKETS, headers=headers),
        httpx.post(tickets.url + TICKETS, json={"title": "x"}, headers=headers),
        httpx.post(tickets.url + TICKETS, content=b"{nope", headers=headers),  # auth comes first
    ):
        assert r.status_code == 401, r.text
        assert r.json()["error_code"] == "unauthorized" and "X-API-Key" in r.json()["message"]


def test_a_created_ticket_is_listed_for_its_owner_only(tickets: TicketsProcess) -> None:
    r = tickets.post(ALICE, {"title": "  Printer on floor 3 is jammed  "})
    assert r.status_code == 201, r.text
    ticket = r.json()
    assert set(ticket) == FIELDS
    assert ticket["title"] == "Printer on floor 3 is jammed"
    assert (ticket["owner"], ticket["status"], ticket["priority"], ticket["description"]) == (
        ALICE,
        "open",
        "normal",
        "",
    )
    assert tickets.get(ALICE).json()["tickets"][0] == ticket
    assert ticket["title"] not in tickets.titles(BOB, "all")

    full = {"title": "Monitor flickers", "description": "Since the update.", "priority": "low"}
    second = tickets.post(BOB, full).json()
    assert int(second["id"][2:]) == int(ticket["id"][2:]) + 1
    assert {k: second[k] for k in full} == full and second["owner"] == BOB


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({}, "title: Field required"),
        ({"title": ""}, "title: String should have at least 1 character"),
        ({"title": "   "}, "title: String should have at least 1 character"),
        ({"title": "x" * 201}, "title: String should have at most 200 characters"),
        ({"title": 5}, "title: Input should be a valid string"),
        ({"title": "x", "description": "d" * 4001}, "description: String should have at most 4000"),
        ({"title": "x", "description": None}, "description: Input should be a valid string"),
        ({"title": "x", "priority": "urgent"}, "priority: Input should be 'low', 'normal' or 'high'"),
        ({"title": "x", "status": "closed"}, "status: Extra inputs are not permitted"),
        ([{"title": "x"}], "body: Input should be a valid dictionary"),
        (None, "body"),
    ],
)
def test_bad_bodies_are_422_never_500(tickets: TicketsProcess, body: Any, where: str) -> None:
    r = tickets.post(ALICE, body)
    assert r.status_code == 422, r.text
    assert r.json()["error_code"] == "invalid_request" and where in r.json()["message"], r.text


def test_bad_json_and_bad_status_are_422(tickets: TicketsProcess) -> None:
    headers = {"X-API-Key": keys()[ALICE], "content-type": "application/json"}
    r = httpx.post(tickets.url + TICKETS, content=b"{nope", headers=headers)
    assert r.status_code == 422 and r.json()["message"] == "body: not valid JSON"
    r = tickets.get(ALICE, "pending")
    assert r.status_code == 422 and "status" in r.json()["message"]


def test_requests_record_whose_key_arrived(tickets: TicketsProcess) -> None:
    assert httpx.delete(tickets.url + "/debug/requests").status_code == 204
    tickets.get(ALICE)
    tickets.post(BOB, {"title": "Recorded"})
    httpx.get(tickets.url + TICKETS, headers={"X-API-Key": "dev-tickets-key-nobody-0000"})
    tickets.get(None)
    httpx.get(tickets.url + "/health")  # not an API request
    r = httpx.get(tickets.url + "/debug/requests")
    assert r.json()["requests"] == [
        {
            "method": "GET",
            "path": TICKETS,
            "key_sha256": sha256(keys()[ALICE]),
            "owner": ALICE,
            "status": 200,
        },
        {"method": "POST", "path": TICKETS, "key_sha256": sha256(keys()[BOB]), "owner": BOB, "status": 201},
        {
            "method": "GET",
            "path": TICKETS,
            "key_sha256": sha256("dev-tickets-key-nobody-0000"),
            "owner": None,
            "status": 401,
        },
        {"method": "GET", "path": TICKETS, "key_sha256": None, "owner": None, "status": 401},
    ]
    assert not any(key in r.text for key in keys().values())


def test_listing_is_capped_at_50_newest_first(tickets: TicketsProcess) -> None:
    with httpx.Client(base_url=tickets.url, headers={"X-API-Key": keys()[ADMIN]}) as admin:
        for i in range(52):
            assert admin.post(TICKETS, json={"title": f"Bulk {i}"}).status_code == 201
        listed = admin.get(TICKETS).json()["tickets"]
    assert len(listed) == 50
    assert [t["title"] for t in listed[:2]] == ["Bulk 51", "Bulk 50"]


def test_tickets_survive_a_restart_and_are_seeded_once(tmp_path: Path) -> None:
    tickets = start_tickets(tmp_path)
    try:
        before = tickets.titles(ALICE, "all")
        created = tickets.post(ALICE, {"title": "Survives restarts", "priority": "high"}).json()
        tickets.restart()
        after = tickets.get(ALICE, "all").json()["tickets"]
        assert after[0] == created
        assert [t["title"] for t in after] == ["Survives restarts", *before]  # not seeded again
        nxt = tickets.post(BOB, {"title": "Next"}).json()
        assert int(nxt["id"][2:]) == int(created["id"][2:]) + 1
    finally:
        tickets.stop()
    assert tickets.db.is_file()


def test_no_raw_key_in_the_log_or_the_database(tickets: TicketsProcess) -> None:
    for owner in (ALICE, BOB, ADMIN):
        tickets.get(owner)
    tickets.post(ALICE, {"title": "Log check"})
    logs = tickets.logs()
    for owner, key in keys().items():
        assert key not in logs, f"{owner}'s key is in the ticket service's log"
        assert key.encode() not in tickets.db.read_bytes()
    lines = [r for r in tickets.log_records() if r.get("event") == "ticket_request"]
    assert {r["owner"] for r in lines} >= {ALICE, BOB, ADMIN}
    assert all(r["key_id"] is None or len(r["key_id"]) == 12 for r in lines)


def test_refuses_to_start_with_an_invalid_seed(tmp_path: Path) -> None:
    key = "dev-tickets-key-that-is-not-quoted"
    seed = tmp_path / "tickets.yaml"
    seed.write_text(yaml.safe_dump({"keys": {key: "@a:x"}, "tickets": [{"owner": "@b:x", "title": "t"}]}))
    env = {**os.environ, **TicketsProcess(tmp_path).env}
    done = subprocess.run([str(BIN / "vagent-tickets")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert str(seed) in done.stderr and "who hold no key" in done.stderr and key not in done.stderr
