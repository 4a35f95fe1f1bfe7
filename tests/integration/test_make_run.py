"""`make run` starts the whole product on embedded defaults; `make chat` talks to it; the
README's curl example works as written (only ports change: tests never bind 8000/8008); the
gateway answers a demo user's LangGraph SDK client with the token `make run` prints; the
ticket tools act with each demo user's own key and the audit trail records it; the demo agent
uses the demo calendar MCP server with each user's own key."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml
from langgraph_sdk import get_client

from redis_local import free_port
from vagent_shared.settings import BotSettings, GatewaySettings, GraphSettings

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BIN = ROOT / ".venv" / "bin"
TICKETS_SEED = ROOT / "deploy" / "dev" / "tickets.yaml"
CREDENTIALS_POLICY = ROOT / "deploy" / "dev" / "credentials.yaml"


def curl_blocks() -> list[str]:
    section = README.split("<!-- curl-example:start -->")[1].split("<!-- curl-example:end -->")[0]
    return [b for b in re.findall(r"```sh\n(.*?)```", section, re.S) if b.startswith("curl")]


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_readme_documents_every_setting() -> None:
    for name in [*GraphSettings.model_fields, *BotSettings.model_fields, *GatewaySettings.model_fields]:
        assert f"| `{name}` |" in README, f"{name} is not documented in README.md"


def test_readme_names_every_vagent_command_group() -> None:
    """The Layout and the parts table list every `vagent` group, so a newcomer finds them."""
    from vagent_graph.cli import app

    groups = {g.name for g in app.registered_groups} | {c.name for c in app.registered_commands}
    assert groups == {"docs", "audit", "admin", "usage", "trace", "memory", "schedules"}, groups
    layout = README.split("Layout:")[1].split("```")[1]
    cli = re.sub(r"\s+", " ", layout.split("cli/ (`vagent`:")[1].split(")")[0])
    row = README.split("| `graph/` (`vagent-graph`; `vagent` with")[1].split(")")[0]
    for group in groups:
        assert re.search(rf"\b{group}\b", cli), f"Layout's cli/ line lacks {group}"
        assert f"`{group}`" in row, f"the parts table lacks {group}"


@pytest.fixture(scope="module")
def run_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stack's VAGENT_DATA_DIR (`.data` for a newcomer)."""
    return tmp_path_factory.mktemp("make-run")


@pytest.fixture(scope="module")
def run_summary() -> dict[str, str]:
    """What `make run` printed up to "Ctrl-C stops everything" (filled in by make_run)."""
    return {}


@pytest.fixture(scope="module")
def make_run(run_data: Path, run_summary: dict[str, str]) -> Iterator[dict[str, int]]:
    names = (
        "HTTP_PORT",
        "REDIS_PORT",
        "ENTITY_REDIS_PORT",
        "SYNAPSE_PORT",
        "ACP_PORT",
        "BOT_HEALTH_PORT",
        "CREDENTIALS_PORT",
        "TICKETS_PORT",
        "CALENDAR_PORT",
        "STT_STANDIN_PORT",
        "GATEWAY_PORT",
    )
    ports: dict[str, int] = {}
    for name in names:  # free_port may hand out the same free port twice: all different
        port = free_port()
        while port in ports.values():
            port = free_port()
        ports[name] = port
    drop = {
        "REDIS_URL",
        "ENTITY_REDIS_URL",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "LLM_MODEL",
        "GRAPH_API_TOKEN",
        "MATRIX_HOMESERVER",
        "MATRIX_USER",
        "MATRIX_PASSWORD",
        # `make run` points the graph at its own dev registry and ticket service
        "CREDENTIAL_REGISTRY_URL",
        "CREDENTIAL_REGISTRY_TOKEN",
        "CREDENTIAL_CACHE_KEY",
        "CREDENTIAL_MISSING_HELP",
        "CREDENTIALS_POLICY_FILE",
        "TICKETS_URL",
        "TICKETS_SEED_FILE",
        "TICKETS_DB_PATH",
        # ... and at its demo calendar, through the demo agent
        "AGENT_DESCRIPTOR",
        "CALENDAR_MCP_URL",
        "CALENDAR_SEED_FILE",
        "CALENDAR_DB_PATH",
        # ... and the bot at its speech-to-text stand-in
        "STT_BASE_URL",
        "STT_API_KEY",
        "STT_STANDIN_API_KEY",
        "AUDIT_STREAM",
        "BUDGETS_FILE",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        # the gateway: make run's defaults (its port is set above)
        "AGENT_ID",
        "GATEWAY_HOST",
        "GATEWAY_TENANT",
        "GATEWAY_TOKEN_CACHE_SECONDS",
        "GATEWAY_MAX_STREAMS_PER_USER",
    }
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        {k: str(v) for k, v in ports.items()},
        VAGENT_DATA_DIR=str(run_data),
        # This module sends alice's messages through Matrix and the gateway faster than a person
        # would (one flood budget for both doors); the limit itself: test_flood*.py, test_gateway_api.py.
        FLOOD_MAX_MESSAGES="40",
    )
    proc = subprocess.Popen(
        ["make", "-s", "run"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    out = ""
    deadline = time.monotonic() + 180
    while "Ctrl-C stops everything" not in out:
        assert proc.poll() is None and time.monotonic() < deadline, out
        out += proc.stdout.readline()  # type: ignore[union-attr]
    assert "offline model" in out and "@alice:localhost / alice-password" in out
    assert f"http://127.0.0.1:{ports['CALENDAR_PORT']}/mcp" in out and "deploy/dev/agent.yaml" in out
    assert f"http://127.0.0.1:{ports['STT_STANDIN_PORT']}/v1   (stand-in" in out
    run_summary["text"] = out
    yield ports
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("make run did not stop on Ctrl-C")
    deadline = time.monotonic() + 15
    while any(port_open(p) for p in ports.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(port_open(p) for p in ports.values()), "Ctrl-C left something running"


def test_make_run_keeps_the_entities_in_a_redis_of_their_own(make_run: dict[str, int]) -> None:
    """The main Redis runs without the graph module; the demo entities are in the second
    Redis, which /health reports apart."""

    def redis_at(name: str) -> tuple[set[str], set[str]]:
        with redis.Redis(port=make_run[name]) as r:
            return {m[b"name"].decode() for m in r.module_list()}, {k.decode() for k in r.keys("vagent_kg:*")}

    main_modules, main_graphs = redis_at("REDIS_PORT")
    entity_modules, entity_graphs = redis_at("ENTITY_REDIS_PORT")
    assert "graph" not in main_modules and {"search", "ReJSON"} <= main_modules, main_modules
    assert "graph" in entity_modules and not main_graphs
    assert {"vagent_kg:localhost", "vagent_kg:acme"} <= entity_graphs, entity_graphs
    health = httpx.get(f"http://127.0.0.1:{make_run['HTTP_PORT']}/health").json()
    assert (health["status"], health["entities"]) == ("healthy", "available"), health


def readme_streams() -> list[list[str]]:
    """The event names of the SSE streams the README's curl section shows, in order (`…`
    stands for more `text_chunk` events)."""
    section = README.split("<!-- curl-example:start -->")[1].split("<!-- curl-example:end -->")[0]
    blocks = [body for lang, body in re.findall(r"```(\w*)\n(.*?)```", section, re.S) if not lang]
    return [re.findall(r"^event: (\w+)$", b, re.M) for b in blocks]


def stream_names(raw: str) -> list[str]:
    """A stream's event names, a run of `text_chunk` events shown once (as the README does)."""
    names = re.findall(r"^event: (\w+)$", raw, re.M)
    return [n for i, n in enumerate(names) if not (n == "text_chunk" and i and names[i - 1] == n)]


def test_readme_curl_conversation(make_run: dict[str, int], run_data: Path) -> None:
    """Both curl commands, run as written (only the port differs): the streams have exactly the
    events the README shows, the count it shows (its tenant `demo` has a database of its own,
    untouched by the chat demo), and the database is deleted from as it says."""
    port = make_run["HTTP_PORT"]
    assert httpx.get(f"http://127.0.0.1:{port}/health").json()["status"] == "healthy"
    first, second = curl_blocks()
    shown_first, shown_second = readme_streams()

    def run(cmd: str) -> str:
        return subprocess.run(
            ["bash", "-c", cmd.replace("localhost:8000", f"127.0.0.1:{port}")],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout

    asked = run(first)
    assert stream_names(asked) == shown_first == ["turn", "hitl_request", "done"], asked
    promised = re.search(r"Delete (\d+) records older than 2020-01-01\?", README)
    assert promised and f"Delete {promised.group(1)} records older than 2020-01-01?" in asked, asked
    answered = run(second)
    assert stream_names(answered) == shown_second, answered
    shown = re.search(r"event: progress\ndata: (\{.*\})", README)
    progress = [json.loads(d) for d in re.findall(r"event: progress\ndata: (\{.*\})", answered)]
    assert shown and json.loads(shown.group(1)) in progress, answered
    final = re.search(r"event: text_final\ndata: (\{.*\})", README)
    assert final and json.loads(final.group(1))["content"] in answered, answered
    assert (run_data / "records" / "demo.db").exists()


def chat(
    make_run: dict[str, int],
    tmp: Path,
    user: str,
    lines: list[tuple[str, str]],
    timeout: float = 60,
    **extra: str,
) -> str:
    """Drive `vagent-chat` like a person: type a line, wait until `expect` shows, type the next."""
    env = {
        **os.environ,
        **extra,
        "CHAT_HOMESERVER": f"http://127.0.0.1:{make_run['SYNAPSE_PORT']}",
        "CHAT_USER": f"@{user}:localhost",
        "CHAT_PASSWORD": f"{user}-password",
        "CHAT_STORE": str(tmp / "chat"),
    }
    proc = subprocess.Popen(
        [str(BIN / "vagent-chat")],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    received: list[bytes] = []

    def reader() -> None:
        assert proc.stdout is not None
        while chunk := os.read(proc.stdout.fileno(), 4096):
            received.append(chunk)

    threading.Thread(target=reader, daemon=True).start()

    def text() -> str:
        return b"".join(received).decode(errors="replace")

    def wait(pattern: str, since: int, deadline: float) -> None:
        while not re.search(pattern, text()[since:]):
            assert proc.poll() is None and time.monotonic() < deadline, f"waited for {pattern!r}:\n{text()}"
            time.sleep(0.05)

    try:
        wait("Type a message", 0, time.monotonic() + timeout)
        for line, expect in lines:
            start = len(text())
            assert proc.stdin is not None
            proc.stdin.write(line.encode() + b"\n")
            proc.stdin.flush()
            wait(expect, start, time.monotonic() + timeout)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # Ctrl-D
        proc.wait(20)
    return text()


def test_make_chat_streams_answers_and_confirms_a_delete(make_run: dict[str, int], tmp_path: Path) -> None:
    out = chat(
        make_run,
        tmp_path,
        "alice",
        [
            ("how many records are older than 2020?", r"\(offline model\) There are \d+ matching records\."),
            ("delete records older than 2022", r"❓ Delete \d+ records older than 2022-01-01\? \(yes/no\)"),
            ("maybe", r"Please answer yes or no"),
            ("yes", r"Deleted \d+ records older than 2022-01-01\."),
        ],
    )
    assert "vagent:" in out


def test_make_chat_user_without_access_gets_nothing(make_run: dict[str, int], tmp_path: Path) -> None:
    out = chat(
        make_run,
        tmp_path,
        "dave",
        [("hello?", r"no reply: the bot stays silent for people without access, by design")],
        timeout=30,
        CHAT_SILENCE_HINT_SECONDS="3",
    )
    assert "vagent:" not in out.split("Ctrl-D quits")[1]


def test_make_chat_commands_reach_the_bot_in_a_group_room(make_run: dict[str, int], tmp_path: Path) -> None:
    """`!help` typed in `make chat`'s group room with carol gets the prefix and an answer."""
    out = chat(make_run, tmp_path, "alice", [("!help", r"How to talk to")], CHAT_WITH="@carol:localhost")
    assert "a room with @carol:localhost" in out


def test_make_run_answers_from_what_each_reader_may_read(make_run: dict[str, int], tmp_path: Path) -> None:
    """The demo: alice and bob ask the same question and get different, cited answers; in a
    room with carol, alice gets only what carol may read too."""
    question = "What was the Q3 revenue?"
    alice = chat(make_run, tmp_path, "alice", [(question, r"Sources:\n- \[1\].*\n- \[2\]")])
    assert "EUR 18.4 million" in alice and "(`q3-2026-financials`)" in alice
    bob = chat(make_run, tmp_path, "bob", [(question, r"Sources:\n- \[1\]")])
    assert "(`q3-2026-press-summary`)" in bob
    assert "18.4" not in bob and "q3-2026-financials" not in bob
    room = chat(make_run, tmp_path, "alice", [(question, r"Sources:\n- \[1\]")], CHAT_WITH="@carol:localhost")
    assert "a room with @carol:localhost" in room and "(`q3-2026-press-summary`)" in room
    assert "18.4" not in room and "q3-2026-financials" not in room


def open_tickets(user: str) -> list[str]:
    """Titles of the user's open demo tickets (deploy/dev/tickets.yaml)."""
    seed = yaml.safe_load(TICKETS_SEED.read_text())
    return [t["title"] for t in seed["tickets"] if t["owner"] == user and t["status"] == "open"]


def listed(titles: list[str]) -> str:
    """The offline model's whole answer to "what are my open tickets?" with these tickets:
    waiting for all of it, not the first streamed chunk, before looking for what it lacks."""
    line = r"\n- T-\d+: [^\n]*\(open, \w+ priority, opened \d{4}-\d\d-\d\d\)"
    return rf"Your open tickets \({len(titles)}\):" + line * len(titles)


def audit_events(make_run: dict[str, int]) -> list[dict[str, object]]:
    """`vagent audit tail --json` against the stack's Redis (as README tells people to run it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUDIT_")}
    env["REDIS_URL"] = f"redis://127.0.0.1:{make_run['REDIS_PORT']}/0"
    out = subprocess.run(
        [str(BIN / "vagent"), "audit", "tail", "--json", "--count", "2000"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.mark.timeout(300)
def test_make_run_tickets_with_each_users_own_key_and_the_audit_trail(
    make_run: dict[str, int], tmp_path: Path
) -> None:
    """Issue 13's "done when": in the `make run` stack, "what are my open tickets?" shows alice
    HER tickets and bob his (each fetched with their own key from the dev Credential Registry),
    carol (no key) is told no credential is configured, and `vagent audit tail` shows it all."""
    question = "what are my open tickets?"
    mine = {u: open_tickets(f"@{u}:localhost") for u in ("alice", "bob")}
    assert mine["alice"] and mine["bob"] and not set(mine["alice"]) & set(mine["bob"])
    seed = yaml.safe_load(TICKETS_SEED.read_text())
    everyones = {t["title"] for t in seed["tickets"]}

    # alice asks twice: the second answer comes through the encrypted credential cache
    # (CREDENTIAL_CACHE_KEY, generated by `make run` into .data/dev-secrets.json).
    alice = chat(
        make_run,
        tmp_path,
        "alice",
        [
            *[(question, listed(mine["alice"]))] * 2,
            # the README's ticket example: every field asked about first; "no" answers her
            (
                "open a ticket about the printer",
                r"❓ Create this ticket(?s:.*)`title`: `the printer`\n(?s:.*)`priority`",
            ),
            ("no", r"You said no; nothing was changed\."),
        ],
    )
    bob = chat(make_run, tmp_path, "bob", [(question, listed(mine["bob"]))])
    for user, out in (("alice", alice), ("bob", bob)):
        answer = out.split("Ctrl-D quits")[1]
        for title in everyones:
            assert (title in answer) == (title in mine[user]), f"{user}: {title!r}\n{answer}"

    help_text = str(GraphSettings.model_fields["CREDENTIAL_MISSING_HELP"].default)
    carol = chat(make_run, tmp_path, "carol", [(question, re.escape(help_text))])
    answer = carol.split("Ctrl-D quits")[1]
    assert "no credential is configured" in answer, answer
    assert not [t for t in everyones if t in answer], answer

    # The audit trail (both services write it; the bot's part may land a moment later).
    need = {"agent_access", "tool_offered", "tool_access", "credential_access"}
    deadline = time.monotonic() + 20
    while True:
        events = audit_events(make_run)
        seen = {
            u: {str(e["event_type"]) for e in events if e["user_id"] == f"@{u}:localhost"}
            for u in ("alice", "bob", "carol")
        }
        if all(need <= seen[u] for u in ("alice", "bob")) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for user in ("alice", "bob"):
        assert need <= seen[user], f"{user}: {sorted(need - seen[user])} missing from the audit trail"
        theirs = [e for e in events if e["user_id"] == f"@{user}:localhost"]
        assert any(
            e["event_type"] == "tool_access"
            and e["resource"] == "tool:list_my_tickets"
            and e["decision"] == "allowed"
            for e in theirs
        ), theirs
        fetched = [e for e in theirs if e["event_type"] == "credential_access"]
        assert fetched and {e["resource"] for e in fetched} == {"credential:tickets"}, fetched
        assert {e["decision"] for e in fetched} == {"allowed"}, fetched
    assert "cache" in {
        e["reason"]
        for e in events
        if e["user_id"] == "@alice:localhost" and e["event_type"] == "credential_access"
    }, "alice's second question should have used the credential cache"
    refused = [
        e for e in events if e["user_id"] == "@carol:localhost" and e["event_type"] == "credential_access"
    ]
    assert refused and {e["decision"] for e in refused} == {"denied"}, refused
    # ... and never a credential itself
    policy = CREDENTIALS_POLICY.read_text()
    keys = list(yaml.safe_load(TICKETS_SEED.read_text())["keys"])
    assert keys and all(k in policy for k in keys)
    dump = json.dumps(events)
    assert not [k for k in keys if k in dump], "a ticket key is in the audit trail"


@pytest.mark.timeout(300)
def test_make_run_calendar_mcp_server_with_each_users_own_key(
    make_run: dict[str, int], tmp_path: Path
) -> None:
    """The demo agent's calendar MCP server runs in `make run`: alice books a meeting after
    confirming it and then sees it on her calendar, bob (with his own key) does not see her
    event, and carol is never offered the calendar."""
    calendar = httpx.get(f"http://127.0.0.1:{make_run['CALENDAR_PORT']}/health")
    assert calendar.status_code == 200, calendar.text
    health = httpx.get(f"http://127.0.0.1:{make_run['HTTP_PORT']}/health").json()
    assert health["mcp_servers"]["calendar"] == {"up": True, "tools": 3, "reason": None}, health

    question = "what is on my calendar on 2026-12-01?"
    book = "book a design review with @bob:localhost on 2026-12-01 at 10:00"
    alice = chat(
        make_run,
        tmp_path,
        "alice",
        [
            (question, r"Nothing on your calendar on Tue 1 Dec( 2026)?\."),
            (book, r"❓ Book a calendar event \(calendar server\), in your name\?(?s:.*)\(yes/no\)"),
            (
                "yes",
                r"Booked 'design review' on Tue 1 Dec( 2026)? 10:00–10:30 with @bob:localhost \(E-\d+\)\.",
            ),
            (question, r"(?i)design review"),
        ],
    )
    answer = alice.split("Ctrl-D quits")[1]
    assert "10:00–10:30 design review" in answer.lower(), answer
    bob = chat(make_run, tmp_path, "bob", [(question, r"Nothing on your calendar on Tue 1 Dec( 2026)?\.")])
    assert "design review" not in bob.split("Ctrl-D quits")[1].lower()
    carol = chat(make_run, tmp_path, "carol", [(question, r"I can't do that here\.")])
    assert "calendar__" not in carol and "events" not in carol.split("Ctrl-D quits")[1].lower()


def test_make_run_hears_the_voice_sample_and_takes_files(make_run: dict[str, int], tmp_path: Path) -> None:
    """The speech-to-text stand-in runs in `make run` and the bot uses it: the demo voice
    sample, sent with `/voice` in `make chat`, is heard as its comment; `/file` sends a file."""
    samples = ROOT / "deploy" / "dev" / "samples"
    heard = httpx.post(
        f"http://127.0.0.1:{make_run['STT_STANDIN_PORT']}/v1/audio/transcriptions",
        files={"file": ("voice.wav", (samples / "voice.wav").read_bytes())},
        data={"model": "whisper-1"},
    )
    assert heard.json() == {"text": "What is on my calendar today?"}, heard.text
    out = chat(
        make_run,
        tmp_path,
        "carol",  # alice has sent many messages by now: flood control would step in
        [
            (f"/voice {samples / 'voice.wav'}", r'🎤 "What is on my calendar today\?"'),
            # the offline model quotes what it was given: the PDF's first lines, cited as hers
            (
                f"/file {samples / 'report.pdf'} what is the outlook?",
                r"> Outlook: Q1 2027 revenue expected between 5\.0 and 5\.4 M EUR\."
                r"(?s:.*)From your attachment: `report\.pdf`",
            ),
            (f"/file {samples / 'notes.docx'}", r"Got notes\.docx — what should I do with it\?"),
            ("summarise it", r"> Date: 2026-11-20\. Attendees: Alice, Bob, Carol\."),
            (f"/file {samples / 'notes.docx'} what are my action items?", r"(?i)action items(?s:.*)\n> "),
            (f"/file {samples / 'screenshot.png'} what went wrong?", r"`screenshot\.png` is an image"),
        ],
        CHAT_SAVE_DIR=str(tmp_path / "received"),
    )
    assert "vagent:" in out.split("Ctrl-D quits")[1]


def test_make_chat_memory_as_the_readme_shows(make_run: dict[str, int], tmp_path: Path) -> None:
    """The README's memory example: remembered in the DM, recalled after `!reset`, listed,
    never recalled in the room with carol (who did not hear it), forgotten. As the demo's
    admin (memory is granted to every demo user): alice and bob send enough messages in the
    tests around this one that these seven would cross their flood limit (10 a minute)."""
    dm = chat(
        make_run,
        tmp_path,
        "admin",
        [
            ("remember that I prefer short answers", r"🧠 Remembered: I prefer short answers"),
            ("!reset", r"I forgot this conversation"),
            ("what do you remember about me?", r'"I prefer short answers"'),
            ("!memory", r"1\. I prefer short answers — .*here"),
        ],
    )
    assert "(offline model) I'll remember that." in dm
    room = chat(
        make_run,
        tmp_path,
        "admin",
        [("what do you remember about me?", r"don't remember anything about you that I may use here")],
        CHAT_WITH="@carol:localhost",
    )
    # the bot's lines only: the chat client's own hints quote the README's examples
    said = [
        ln for ln in re.sub(r"\x1b\[[0-9;]*m", "", room).splitlines() if ln.lstrip().startswith("vagent:")
    ]
    assert said and not any("short answers" in ln for ln in said), room
    gone = chat(
        make_run,
        tmp_path,
        "admin",
        [("!forget 1", r"Forgot: I prefer short answers"), ("!memory", r"You have no memories\.")],
    )
    assert "Forgot" in gone


def test_make_chat_schedules_as_the_readme_shows(make_run: dict[str, int], tmp_path: Path) -> None:
    """The README's scheduled-task example: made, run as the asker with the ⏰ line and the
    answer, listed with its last result, deleted. As the demo's admin (see the memory test)."""
    task = "what is on my calendar today?"
    out = chat(
        make_run,
        tmp_path,
        "admin",
        [
            (f"!schedule in 15s: {task}", r"⏰ Scheduled task (\d+): .* next run "),
            ("!schedules", r"\d+\. .what is on my calendar today\?. — .* — last: not run yet"),
            # the run: the ⏰ line, then the answer in its thread (the calendar stand-in's events)
            ("!help", r"⏰ Scheduled: what is on my calendar today\?"),
        ],
        timeout=90,
    )
    number = re.findall(r"⏰ Scheduled task (\d+):", out)[-1]
    done = chat(
        make_run,
        tmp_path,
        "admin",
        [
            ("!schedules", rf"{number}\. .what is on my calendar today\?. — .* — last: (answered|failed)"),
            (f"!unschedule {number}", rf"🗑️ Deleted scheduled task {number}"),
        ],
    )
    assert re.search(rf"{number}\. .* — last: answered", done), done


def matrix_login(make_run: dict[str, int], user: str, password: str | None = None) -> str:
    """A demo user's own Matrix access token from make run's Synapse (what a web client holds)."""
    body = {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": user},
        "password": password or f"{user}-password",
    }
    got = httpx.post(f"http://127.0.0.1:{make_run['SYNAPSE_PORT']}/_matrix/client/v3/login", json=body)
    assert got.status_code == 200, got.text
    return str(got.json()["access_token"])


def gateway_summary(run_summary: dict[str, str]) -> tuple[str, str, str, str]:
    """make run's gateway lines: deployment URL, assistant id, API key, the SDK one-liner."""
    out = run_summary["text"]
    found = re.search(r"deployment URL (\S+), assistant id (\S+),\nAPI key \([^)]*\): (\S+)\n  (.+)\n", out)
    assert found, out
    url, assistant, key, example = found.groups()
    return url, assistant, key, example


@pytest.mark.timeout(300)
def test_make_run_gateway_serves_a_demo_users_sdk_client(
    make_run: dict[str, int], run_summary: dict[str, str], tmp_path: Path
) -> None:
    """Issue 33's "done when", against make run: the deployment URL, assistant id and API key
    (alice's own Matrix access token from the throwaway Synapse) that make run prints work from
    `langgraph_sdk.get_client` as documented: a thread is created and an answer streamed
    (`values`); the printed one-liner answers as written; bob cannot see alice's thread (404),
    dave, who has no agent access, gets 403 and a forged token 401."""
    url, assistant, key, example = gateway_summary(run_summary)
    assert url == f"http://127.0.0.1:{make_run['GATEWAY_PORT']}", url
    assert assistant == "vagent"
    assert httpx.get(f"{url}/health").status_code == 200
    whoami = httpx.get(
        f"http://127.0.0.1:{make_run['SYNAPSE_PORT']}/_matrix/client/v3/account/whoami",
        headers={"Authorization": f"Bearer {key}"},
    )
    assert whoami.json().get("user_id") == "@alice:localhost", "the printed API key is not alice's token"
    question = "how many records are older than 2020?"
    answer = r"\(offline model\) There are \d+ matching records\."
    turn: dict[str, Any] = {"messages": [{"role": "user", "content": question}]}

    async def as_alice() -> tuple[str, list[tuple[str, Any]]]:
        client = get_client(url=url, api_key=key)
        thread = await client.threads.create(metadata={"purpose": "make run check"})
        events = [
            (part.event, part.data)
            async for part in client.runs.stream(
                thread["thread_id"],
                assistant,
                input=turn,
                stream_mode="values",
            )
        ]
        mine = await client.threads.search(metadata={"purpose": "make run check"})
        assert thread["thread_id"] in [t["thread_id"] for t in mine], mine
        return str(thread["thread_id"]), events

    thread_id, events = asyncio.run(as_alice())
    names = [name for name, _ in events]
    assert names[0] == "metadata" and "values" in names and "error" not in names, events
    messages = [data for name, data in events if name == "values"][-1]["messages"]
    assert messages[0]["type"] == "human" and messages[0]["content"] == question, messages
    assert messages[-1]["type"] == "ai" and re.fullmatch(answer, messages[-1]["content"]), messages

    # The one-liner make run prints, run as printed.
    done = subprocess.run(["bash", "-c", example], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{example}\n{done.stdout}\n{done.stderr}"
    assert re.fullmatch(answer, done.stdout.strip()), done.stdout

    async def status(token: str, call: str) -> int:
        client = get_client(url=url, api_key=token)
        try:
            if call == "get":
                await client.threads.get(thread_id)
            elif call == "stream":
                async for _ in client.runs.stream(thread_id, assistant, input=turn):
                    pass
            elif call == "create":
                await client.threads.create()
            elif not await client.assistants.search():
                return 403  # not listed at all: as good as refused
        except httpx.HTTPStatusError as e:
            return e.response.status_code
        return 200

    bob = matrix_login(make_run, "bob")
    assert asyncio.run(status(bob, "get")) == 404, "bob can read alice's thread"
    assert asyncio.run(status(bob, "stream")) == 404, "bob can run in alice's thread"
    dave = matrix_login(make_run, "dave")
    assert asyncio.run(status(dave, "create")) == 403, "dave (no agent access) got a thread"
    assert asyncio.run(status(dave, "search")) == 403, "dave (no agent access) sees the assistant"
    assert asyncio.run(status("syt_forged_" + key[-12:], "create")) == 401


def docs_sdk_example() -> str:
    """The Python example of docs/gateway.md, as a reader copies it."""
    doc = (ROOT / "docs" / "gateway.md").read_text()
    section = doc.split("<!-- sdk-example:start -->")[1].split("<!-- sdk-example:end -->")[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    return str(code)


@pytest.mark.timeout(300)
def test_docs_gateway_sdk_example_runs_as_written(
    make_run: dict[str, int], run_summary: dict[str, str]
) -> None:
    """docs/gateway.md's langgraph_sdk example, run as written against make run's gateway with a
    demo user's own token (admin, a superuser, so the other tests' flood budget is untouched):
    the delete's confirmation arrives as an interrupt with its action and arguments, `n`
    rejects it, and nothing was deleted (asked again in a new thread: the same count); the
    thread search lists the example's own threads."""
    url, _, _, _ = gateway_summary(run_summary)
    env = {**os.environ, "VAGENT_URL": url, "VAGENT_TOKEN": matrix_login(make_run, "admin")}
    code = docs_sdk_example()

    def run_once() -> str:
        done = subprocess.run(
            [str(BIN / "python"), "-c", code],
            input="n\n",
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
        return done.stdout

    first = run_once()
    asked = re.search(
        r"^Delete (\d[\d,]*) records? older than 2024-01-01\? \{.*'older_than'.*\}$", first, re.M
    )
    assert asked, first
    assert "approve? [y/N]" in first
    after = first.split("approve? [y/N]", 1)[1]
    assert "Deleted" not in after and after.strip(), first
    again = run_once()
    assert f"Delete {asked[1]} record" in again, f"the rejected delete changed something:\n{first}\n{again}"
    listed = re.findall(r"^([0-9a-f-]{36}) (\w+)$", again, re.M)
    assert len(listed) >= 2 and all(status == "idle" for _, status in listed), again


def vagent_json(make_run: dict[str, int], *args: str) -> list[Any]:
    """`vagent ... --json` against the stack's Redis, as README tells operators to run it."""
    env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{make_run['REDIS_PORT']}/0"}
    command = [str(BIN / "vagent"), *args, "--json"]
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30, check=True).stdout
    try:
        found = json.loads(out)  # one JSON document (`trace list`: an array)
    except json.JSONDecodeError:
        return [json.loads(line) for line in out.splitlines() if line.strip()]  # JSON lines
    return found if isinstance(found, list) else [found]


def test_make_run_why_usage_and_a_tiny_budget(
    make_run: dict[str, int], run_data: Path, tmp_path: Path
) -> None:
    """Issue 23's "done when": bob asks, reacts 🔍 (`/why` in make chat) and sees how the answer
    came about; `vagent usage` shows his tokens; with a tiny budget in the policy file he is
    told he is over budget and no LLM call is made (his model calls stay as they were)."""
    out = chat(
        make_run,
        tmp_path,
        "bob",
        [
            ("how many records are older than 2020?", r"\(offline model\) There are \d+ matching records\."),
            # (tokens over 999 are written 1,004: bob's DM holds the earlier tests' turns)
            ("/why", r"asked about \$(?s:.*)How this answer came about(?s:.*)Total: [\d,]+ in / [\d,]+ out"),
        ],
    )
    assert "database_query" in out.split("How this answer came about")[1]
    rows = vagent_json(make_run, "usage", "--user", "@bob:localhost")
    assert rows, "vagent usage shows nothing for bob"
    calls = sum(int(r["llm_calls"]) for r in rows)
    assert calls >= 2 and sum(int(r["total_tokens"]) for r in rows) > 0, rows

    budgets_file = run_data / "budgets.yaml"  # the git-ignored copy the README says to edit
    assert "`.data/budgets.yaml`" in README
    policy = yaml.safe_load(budgets_file.read_text())
    policy["users"]["@bob:localhost"] = {"daily_tokens": 10}
    budgets_file.write_text(yaml.safe_dump(policy))
    time.sleep(1.5)  # the graph looks at the file at most once a second
    chat(make_run, tmp_path, "bob", [("how many records are older than 2020?", r"token budget")])
    after = vagent_json(make_run, "usage", "--user", "@bob:localhost")
    assert sum(int(r["llm_calls"]) for r in after) == calls, after
    traces = vagent_json(make_run, "trace", "list", "--user", "@bob:localhost")
    assert traces and traces[0]["outcome"] == "over_budget", traces


def readme_sh_blocks() -> list[str]:
    return [textwrap.dedent(b) for b in re.findall(r"```sh\n(.*?)```", README, re.S)]


#: The first line of every `sh` block in the README, and what runs it (or why nothing can).
SH_BLOCKS = {
    "make run": "the make_run fixture; `make chat`: chat(); `make test`: CI itself",
    "curl -sN http://localhost:8000/api/v1/process_message": "test_readme_curl_conversation",
    "curl -sN http://localhost:8000/api/v1/submit_feedback": "test_readme_curl_conversation",
    "OPENAI_API_KEY=sk-... LLM_MODEL=gpt-4o-mini make run": (
        "needs a hosted or local model this machine does not have; the OpenAI-compatible path is "
        "tested against tests/support/llm_server.py"
    ),
    ". .data/dev.env": "test_readme_operator_commands (the last test of this module: it forgets alice)",
}


def test_every_readme_shell_block_is_run_by_a_test() -> None:
    for block in readme_sh_blocks():
        first = block.strip().splitlines()[0]
        assert any(first.startswith(k) for k in SH_BLOCKS), f"no test runs this README example:\n{block}"


def without_venv_on_path(env: dict[str, str]) -> dict[str, str]:
    """A newcomer's shell: no venv on PATH, none of the stack's settings."""
    path = ":".join(p for p in env.get("PATH", "").split(":") if ".venv" not in p)
    keep = {k: v for k, v in env.items() if not k.startswith(("REDIS", "ENTITY_REDIS", "GRAPH_", "AUDIT_"))}
    return {**keep, "PATH": path or "/usr/bin:/bin"}


def test_readme_operator_commands(make_run: dict[str, int], run_data: Path, tmp_path: Path) -> None:
    """The README's operator blocks, run as written in a second terminal (only `.data` and the
    port differ): `. .data/dev.env` puts `vagent` on PATH and points it at make run's stack.
    Last in this module: its `vagent admin forget @alice:localhost` erases alice's data."""
    blocks = [b for b in readme_sh_blocks() if b.startswith(". .data/dev.env")]
    assert len(blocks) == 2, blocks
    (tmp_path / "deploy").symlink_to(ROOT / "deploy")  # the README's paths are relative to the checkout
    turns = {t["turn_id"] for t in vagent_json(make_run, "trace", "list", "--user", "@alice:localhost")}
    with redis.Redis(port=make_run["REDIS_PORT"], decode_responses=True) as r:  # the bot's pointers
        answers = [k.removeprefix("trace:event:") for k in r.scan_iter("trace:event:*") if r.get(k) in turns]
    assert answers, turns
    outputs = []
    for block in blocks:
        script = (
            block.replace(".data/", f"{run_data}/")
            .replace(":8000/", f":{make_run['HTTP_PORT']}/")
            .replace("$answer_event_id", answers[0])
        )
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=tmp_path,
            env=without_venv_on_path(dict(os.environ)),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{script}\n{done.stdout}\n{done.stderr}"
        outputs.append(done.stdout)
    docs, operator = outputs
    assert re.search(r"\bacme +report +finance", docs) and '"doc_id":"q3"' in docs, docs
    assert "tool_access" in operator and "@alice:localhost" in operator, operator
    assert (tmp_path / "audit.jsonl").read_text().count("\n") > 10
    assert "forgot" in operator.lower() or "erased" in operator.lower(), operator
    assert not vagent_json(make_run, "trace", "list", "--user", "@alice:localhost")
