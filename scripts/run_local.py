#!/usr/bin/env python3
"""`make run`: the whole product on embedded defaults, in the foreground; Ctrl-C stops it all.

Starts, each on 127.0.0.1: Redis 8 with search + JSON (unless REDIS_URL is set), a second
Redis with the FalkorDB graph module for the entity graphs (unless ENTITY_REDIS_URL is set;
apart, so a crash of the graph module cannot take the conversations with it), a throwaway
Synapse homeserver with the bot and demo users (unless MATRIX_HOMESERVER is set), the
development AccessControlProvider with the demo policy, the DEVELOPMENT Credential Registry
(`vagent-credentials`, deploy/dev/credentials.yaml), the demo ticket service
(`vagent-tickets`, deploy/dev/tickets.yaml, its database in .data/tickets.db), which the
ticket tools use with each user's own key, and the demo calendar MCP server
(`vagent-calendar`, deploy/dev/calendar.yaml, its database in .data/calendar.db), whose tools
the demo agent (AGENT_DESCRIPTOR=deploy/dev/agent.yaml unless set; its `mcp_servers:` url is
CALENDAR_MCP_URL, set to this server) calls with each user's own key; the speech-to-text
stand-in (`vagent-stt`, the bot's STT_BASE_URL unless set: it answers a WAV's comment, so
`/voice deploy/dev/samples/voice.wav` in `make chat` asks a question); the demo documents and
entities (deploy/dev/knowledge, ingested with `vagent docs`; unchanged ones are skipped), the
graph service (offline model unless OPENAI_BASE_URL / OPENAI_API_KEY are set), the gateway
(`vagent-gateway`, LangGraph's server API on GATEWAY_PORT, default 8100, for the LangGraph SDKs
and agent-chat-ui; a demo user's Matrix access token, kept in .data/dev-secrets.json, is printed
as its API key) and the bot.
Their JSON logs are shown as readable lines. Data lives in .data/ (git-ignored), with the
secrets generated for this machine (the bot's password, the graph's credential-cache key) in
.data/dev-secrets.json, the budgets the demo edits in .data/budgets.yaml (a copy of
deploy/dev/budgets.yaml, unless BUDGETS_FILE is set) and, for the `vagent` operator commands in
a second terminal, .data/dev.env (`. .data/dev.env`: dev_env.py).
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Literal

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from dev_env import budgets_setting, write_dev_env  # noqa: E402
from procutil import read_log  # noqa: E402

from redis_local import RedisServer  # noqa: E402
from synapse_local import SynapseServer  # noqa: E402

DATA = Path(os.environ.get("VAGENT_DATA_DIR", ROOT / ".data"))
DEV_TOKEN = "dev-token-change-me"  # noqa: S105 - local development default, printed on start
DEV_ADMIN_TOKEN = "dev-admin-token-change-me"  # noqa: S105 - the admin API's, likewise
DEMO_MANIFEST = ROOT / "deploy/dev/knowledge/manifest.yaml"
BIN = Path(sys.executable).parent
#: The demo user whose Matrix access token `make run` prints as the gateway's API key.
GATEWAY_DEMO_USER = "alice"
#: What the gateway never gets: the bot's own Matrix account (the gateway acts only as the
#: person whose token it is given) and the other services' secrets (least privilege).
NOT_FOR_GATEWAY = (
    "MATRIX_USER",
    "MATRIX_PASSWORD",
    "MATRIX_ACCESS_TOKEN",
    "MATRIX_STORE_PATH",
    "OPENAI_API_KEY",
    "EMBEDDINGS_API_KEY",
    "GRAPH_ADMIN_TOKEN",
    "CREDENTIAL_CACHE_KEY",
    "CREDENTIAL_REGISTRY_TOKEN",
    "STT_API_KEY",
    "STT_STANDIN_API_KEY",
)
#: Demo users of the throwaway homeserver, their roles in deploy/dev/acp-policy.yaml and
#: whether deploy/dev/credentials.yaml gives them a key for the demo ticket service and calendar.
DEMO_USERS = {
    "alice": "operator: deletes after confirming; reads finance, HR, engineering and public docs;"
    " own ticket and calendar keys",
    "bob": "analyst: read-only queries; reads engineering and public docs; own ticket and calendar keys",
    "carol": "member: chat; reads public docs only; no ticket key (is told none is configured); no calendar",
    "dave": "no access at all (gets no reply)",
    "admin": "superuser: everything in the localhost domain; own ticket key; no calendar key",
}
COLORS = {
    "graph": "\033[35m",
    "bot": "\033[36m",
    "acp": "\033[33m",
    "creds": "\033[32m",
    "tickets": "\033[34m",
    "calendar": "\033[94m",
    "stt": "\033[92m",
    "gateway": "\033[91m",
}
TAG_WIDTH = 8  # the longest tag, "calendar"
RESET = "\033[0m"
_print_lock = threading.Lock()


def say(text: str) -> None:
    with _print_lock:
        print(text, flush=True)


#: An audit event on the console: its gist; the whole record is in the audit stream
#: (`vagent audit tail`) and, in a deployment, in the JSON logs.
AUDIT_WIDTH = 160
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def audit_line(audit: dict[str, Any]) -> str:
    """`audit tool_access allowed @alice:localhost tool:delete_records (reason)` on one short
    line, without control characters (part of it is user-controlled: no terminal escapes)."""
    parts = [
        "audit",
        str(audit.get("event_type", "?")),
        str(audit.get("decision", "?")),
        str(audit.get("user_id", "?")),
        str(audit.get("resource", "")),
    ]
    if audit.get("reason"):
        parts.append(f"({audit['reason']})")
    text = _UNPRINTABLE.sub("?", " ".join(p for p in parts if p))
    return text if len(text) <= AUDIT_WIDTH else text[: AUDIT_WIDTH - 1] + "…"


def flood_line(entry: dict[str, Any]) -> str:
    """The bot's `flood_limited` warning as what happened: who was refused and why, on one short
    line (user and room are user-controlled: no terminal escapes)."""
    limit, window = entry.get("limit", "?"), entry.get("window", "?")
    if isinstance(window, float) and window.is_integer():
        window = int(window)
    text = f"flood_limited {entry.get('user_id', '?')} refused: over {limit} messages in {window} s"
    if entry.get("room_id"):
        text += f" (room {entry['room_id']})"
    text = _UNPRINTABLE.sub("?", text)
    return text if len(text) <= AUDIT_WIDTH else text[: AUDIT_WIDTH - 1] + "…"


def readable(service: str, line: str, color: bool) -> str | None:
    """One JSON log line as `12:00:01 graph  info  event key=value` (an audit event as its
    gist); other lines as they are."""
    line = line.rstrip()
    if not line:
        return None
    try:
        entry: dict[str, Any] = json.loads(line)
    except ValueError:
        entry = {}
    if not isinstance(entry, dict) or "event" not in entry:
        text = line
    else:
        ts = str(entry.pop("timestamp", ""))[11:19]
        level = str(entry.pop("level", "")).ljust(7)
        event = entry.pop("event")
        for k in ("logger", "service", "request_id"):
            entry.pop(k, None)
        audit = entry.get("audit")
        if event == "audit" and isinstance(audit, dict):
            text = f"{ts} {level} {audit_line(audit)}"
        elif event == "flood_limited":
            text = f"{ts} {level} {flood_line(entry)}"
        else:
            rest = " ".join(f"{k}={v}" for k, v in entry.items())
            text = f"{ts} {level} {event} {rest}".rstrip()
    tag = f"{service:<{TAG_WIDTH}}"
    if color:
        tag = f"{COLORS.get(service, '')}{tag}{RESET}"
    return f"{tag} {text}"


def pump(service: str, stream: IO[bytes], color: bool) -> None:
    for raw in iter(stream.readline, b""):
        out = readable(service, raw.decode(errors="replace"), color)
        if out:
            say(out)


def wait_http(url: str, proc: subprocess.Popen[bytes], name: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"run: {name} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - loopback only
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"run: {name} did not become healthy at {url}")


def ingest_demo(env: dict[str, str]) -> None:
    """The demo documents and entities, before the graph starts (unchanged ones are skipped,
    so a restart costs a second)."""
    if env.get("VAGENT_DEMO_DOCS", "1") == "0":
        return
    say("run: ingesting the demo documents and entities (deploy/dev/knowledge)")
    proc = subprocess.run(
        [str(BIN / "vagent"), "docs", "ingest", "--manifest", str(DEMO_MANIFEST)],
        env=env,
        capture_output=True,
        text=True,
    )
    for line in (proc.stdout + proc.stderr).splitlines():
        if line.strip() and "embedding:" not in line:
            say(f"{'docs':<{TAG_WIDTH}} {line}")
    if proc.returncode != 0:
        raise SystemExit("run: ingesting the demo documents failed (see above)")


#: What redis-server logs when its data was saved with a module it was not started with.
_NEEDS_GRAPH_MODULE = "no matching module 'graphdata'"


def start_redis(port: int, data: Path, modules: Literal["main", "entities"], what: str) -> RedisServer | None:
    """Our local Redis (None: one already answers on `port`, not ours to stop).

    The main one runs without the graph module. Its data from before the entity graphs had a
    Redis of their own cannot be read without it (FalkorDB writes its own records into every
    save): that Redis keeps loading the module, unused, and says how to start it clean."""
    server = RedisServer(port, data, modules=modules)
    if server.ping():
        say(f"run: reusing the Redis already on port {port} ({what})")
        return None
    seen = len(read_log(data / "redis.log"))
    try:
        server.start()
    except RuntimeError:
        if modules != "main" or _NEEDS_GRAPH_MODULE not in read_log(data / "redis.log")[seen:]:
            raise
        say(
            f"run: {data} was saved with the graph module loaded (before the entities had a Redis"
            f" of their own), so this Redis keeps loading it, unused; `rm -r {data}` starts it clean"
        )
        server = RedisServer(port, data, modules="all").start()
    say(f"run: Redis 8 ({what}) on 127.0.0.1:{port}, data in {data}")
    return server


def shown_path(path: Path) -> str:
    """`path` as the user would type it here: relative to the current directory when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def fernet_key() -> str:
    """A new Fernet key (32 random bytes, url-safe base64), as `vagent admin genkey` prints."""
    return base64.urlsafe_b64encode(os.urandom(32)).decode()


def dev_secret(name: str, new: Callable[[], str] = lambda: secrets.token_urlsafe(18)) -> str:
    """A random secret generated once (by `new`) and kept in .data: the bot's dev password, the
    graph's credential-cache key (a new key would only make the cached credentials unreadable,
    but one per machine keeps restarts warm)."""
    path = DATA / "dev-secrets.json"
    known = json.loads(path.read_text()) if path.exists() else {}
    if name not in known:
        known[name] = new()
        path.write_text(json.dumps(known))
        path.chmod(0o600)
    return str(known[name])


def _matrix_call(url: str, token: str | None = None, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """One Matrix client-server API call on the local homeserver (loopback only)."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")  # noqa: S310
    with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 - loopback only
        found: dict[str, Any] = json.loads(r.read() or b"{}")
        return found


def demo_token(homeserver: str, localpart: str) -> str:
    """A demo user's own Matrix access token, the gateway's API key for the LangGraph SDKs and
    agent-chat-ui. Kept in .data/dev-secrets.json and reused while the homeserver still
    accepts it (the same key across restarts, one device instead of one per run); otherwise a
    new password login (the demo convention `<name>-password`)."""
    path = DATA / "dev-secrets.json"
    name = f"gateway_token_{localpart}"
    known = json.loads(path.read_text()) if path.exists() else {}
    token = known.get(name)
    if token:
        try:
            if _matrix_call(f"{homeserver}/_matrix/client/v3/account/whoami", token).get("user_id"):
                return str(token)
        except OSError:  # 401: forgotten by a fresh homeserver; log in again
            pass
    login = {
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": localpart},
        "password": f"{localpart}-password",
        "initial_device_display_name": "make run: gateway demo key",
    }
    token = str(_matrix_call(f"{homeserver}/_matrix/client/v3/login", body=login)["access_token"])
    known = json.loads(path.read_text()) if path.exists() else {}
    known[name] = token
    path.write_text(json.dumps(known))
    path.chmod(0o600)
    return token


def gateway_hint(url: str, agent_id: str, user: str, token: str | None) -> str:
    """How to reach the gateway: agent-chat-ui's three fields and a langgraph_sdk one-liner."""
    key = token or "<a Matrix access token of the person (Element: Settings > Help & About)>"
    who = f"{user}'s Matrix access token" if token else "the person's own Matrix access token"
    example = (
        f"{BIN / 'python'} -c 'from langgraph_sdk import get_sync_client; "
        f'c = get_sync_client(url="{url}", api_key="{key}"); t = c.threads.create(); '
        f'print(c.runs.wait(t["thread_id"], "{agent_id}", input={{"messages": [{{"role": "user", '
        f'"content": "how many records are older than 2020?"}}]}})["messages"][-1]["content"])\''
    )
    return f"""LangGraph SDK / agent-chat-ui (docs/gateway.md): deployment URL {url}, assistant id {agent_id},
API key ({who}): {key}
  {example}"""


def main() -> int:
    env = dict(os.environ)
    DATA.mkdir(parents=True, exist_ok=True)
    color = sys.stdout.isatty()
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    redis: RedisServer | None = None
    entity_redis: RedisServer | None = None
    synapse: SynapseServer | None = None

    def start(
        name: str, command: str, extra: dict[str, str], drop: tuple[str, ...] = ()
    ) -> subprocess.Popen[bytes]:
        child_env = {k: v for k, v in {**env, **extra}.items() if k not in drop}
        proc = subprocess.Popen(
            [str(BIN / command)], env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        procs.append((name, proc))
        assert proc.stdout is not None
        threading.Thread(target=pump, args=(name, proc.stdout, color), daemon=True).start()
        return proc

    redis_given = bool(env.get("REDIS_URL"))
    entity_redis_given = bool(env.get("ENTITY_REDIS_URL"))
    try:
        if not redis_given:
            redis_port = int(env.get("REDIS_PORT", "6390"))
            redis = start_redis(redis_port, DATA / "redis", "main", "search + JSON")
            env["REDIS_URL"] = RedisServer(redis_port, DATA / "redis").url
        if not entity_redis_given:
            entity_port = int(env.get("ENTITY_REDIS_PORT", "6391"))
            if not redis_given and entity_port == redis_port:
                raise SystemExit(f"run: ENTITY_REDIS_PORT and REDIS_PORT are both {entity_port}")
            entity_redis = start_redis(
                entity_port, DATA / "entity-redis", "entities", "graph module, for entities"
            )
            env["ENTITY_REDIS_URL"] = RedisServer(entity_port, DATA / "entity-redis").url
        own_homeserver = not env.get("MATRIX_HOMESERVER")
        if own_homeserver:
            synapse = SynapseServer(int(env.get("SYNAPSE_PORT", "8008")), DATA / "synapse", for_tests=False)
            synapse.start()
            bot_password = dev_secret("bot")
            env["MATRIX_USER"] = synapse.register_user("vagent", bot_password)
            env["MATRIX_PASSWORD"] = bot_password
            env["MATRIX_HOMESERVER"] = synapse.url
            for name in DEMO_USERS:
                synapse.register_user(name, f"{name}-password")
            say(
                f"run: Synapse (throwaway homeserver 'localhost') on {synapse.url}, "
                f"data in {DATA / 'synapse'}"
            )
        elif not (env.get("MATRIX_PASSWORD") or env.get("MATRIX_ACCESS_TOKEN")):
            raise SystemExit(
                "run: MATRIX_HOMESERVER is set: also set MATRIX_USER and MATRIX_PASSWORD "
                "(or MATRIX_ACCESS_TOKEN) for the bot's account"
            )
        env.setdefault("GRAPH_API_TOKEN", DEV_TOKEN)
        env.setdefault("GRAPH_ADMIN_TOKEN", DEV_ADMIN_TOKEN)
        env.setdefault("RECORDS_DB_PATH", str(DATA / "records" / "{domain}.db"))
        env.setdefault("HTTP_HOST", "127.0.0.1")
        port = env.setdefault("HTTP_PORT", "8000")
        acp_port = env.setdefault("ACP_PORT", "8090")
        env.setdefault("ACP_HOST", "127.0.0.1")
        env.setdefault("ACP_POLICY_FILE", str(ROOT / "deploy/dev/acp-policy.yaml"))
        env.setdefault("ACCESS_CONTROL_PROVIDER_URL", f"http://127.0.0.1:{acp_port}")
        # The DEVELOPMENT Credential Registry and the demo ticket service (DEV ONLY), and the
        # graph pointed at them; CREDENTIAL_REGISTRY_TOKEN, when set, reaches both.
        creds_port = env.setdefault("CREDENTIALS_PORT", "8091")
        env.setdefault("CREDENTIALS_HOST", "127.0.0.1")
        env.setdefault("CREDENTIALS_POLICY_FILE", str(ROOT / "deploy/dev/credentials.yaml"))
        tickets_port = env.setdefault("TICKETS_PORT", "8092")
        env.setdefault("TICKETS_HOST", "127.0.0.1")
        env.setdefault("TICKETS_SEED_FILE", str(ROOT / "deploy/dev/tickets.yaml"))
        env.setdefault("TICKETS_DB_PATH", str(DATA / "tickets.db"))
        env.setdefault("CREDENTIAL_REGISTRY_URL", f"http://127.0.0.1:{creds_port}")
        env.setdefault("TICKETS_URL", f"http://127.0.0.1:{tickets_port}")
        # The demo calendar MCP server (DEV ONLY) and the demo agent that lists it in
        # `mcp_servers:` (its url is ${CALENDAR_MCP_URL}); an AGENT_DESCRIPTOR of yours wins.
        calendar_port = env.setdefault("CALENDAR_PORT", "8093")
        env.setdefault("CALENDAR_HOST", "127.0.0.1")
        env.setdefault("CALENDAR_SEED_FILE", str(ROOT / "deploy/dev/calendar.yaml"))
        env.setdefault("CALENDAR_DB_PATH", str(DATA / "calendar.db"))
        env.setdefault("CALENDAR_MCP_URL", f"http://127.0.0.1:{calendar_port}/mcp")
        # The speech-to-text stand-in (DEV ONLY) for voice messages; an STT_BASE_URL of yours
        # wins (and then STT_API_KEY is yours to set too).
        stt_port = env.setdefault("STT_STANDIN_PORT", "8094")
        env.setdefault("STT_STANDIN_HOST", "127.0.0.1")
        stt_url = f"http://127.0.0.1:{stt_port}/v1"
        if not env.get("STT_BASE_URL"):
            env["STT_BASE_URL"] = stt_url
            if env.get("STT_STANDIN_API_KEY"):
                env.setdefault("STT_API_KEY", env["STT_STANDIN_API_KEY"])
        if not env.get("AGENT_DESCRIPTOR"):
            env["AGENT_DESCRIPTOR"] = str(ROOT / "deploy/dev/agent.yaml")
        # Generous token budgets a newcomer can edit to see one apply (docs/budgets.md): a
        # git-ignored copy in .data, so the demo leaves the checkout as it was.
        env["BUDGETS_FILE"] = budgets_setting(env, DATA, ROOT / "deploy/dev/budgets.yaml")
        if not env.get("CREDENTIAL_CACHE_KEY"):
            env["CREDENTIAL_CACHE_KEY"] = dev_secret("credential_cache_key", fernet_key)
        env.setdefault("GRAPH_API_ENDPOINT", f"http://127.0.0.1:{port}")
        env.setdefault("MATRIX_STORE_PATH", str(DATA / "bot-store"))
        if own_homeserver:
            env.setdefault("DEFAULT_DOMAIN", "localhost")  # DMs carry no tenant state event
        env.setdefault("BOT_HEALTH_HOST", "127.0.0.1")
        health_port = env.setdefault("BOT_HEALTH_PORT", "8080")
        # The gateway: LangGraph's server API, with the bot's Redis, graph, token, provider,
        # homeserver and agent id (the same names, inherited from this environment).
        env.setdefault("GATEWAY_HOST", "127.0.0.1")
        gateway_port = env.setdefault("GATEWAY_PORT", "8100")

        dev_env = write_dev_env(DATA, env, BIN, DEV_ADMIN_TOKEN)
        ingest_demo(env)
        acp = start("acp", "vagent-acp", {})
        creds = start("creds", "vagent-credentials", {})
        tickets = start("tickets", "vagent-tickets", {})
        calendar = start("calendar", "vagent-calendar", {})
        stt = start("stt", "vagent-stt", {})
        wait_http(f"http://127.0.0.1:{acp_port}/health", acp, "vagent-acp")
        wait_http(f"http://127.0.0.1:{creds_port}/health", creds, "vagent-credentials")
        wait_http(f"http://127.0.0.1:{tickets_port}/health", tickets, "vagent-tickets")
        wait_http(f"http://127.0.0.1:{calendar_port}/health", calendar, "vagent-calendar")
        wait_http(f"http://127.0.0.1:{stt_port}/health", stt, "vagent-stt")
        graph = start("graph", "vagent-graph", {})
        wait_http(f"http://127.0.0.1:{port}/health", graph, "vagent-graph")
        gateway = start("gateway", "vagent-gateway", {}, drop=NOT_FOR_GATEWAY)
        wait_http(f"http://127.0.0.1:{gateway_port}/health", gateway, "vagent-gateway")
        bot = start("bot", "vagent-bot", {})
        wait_http(f"http://127.0.0.1:{health_port}/health", bot, "vagent-bot")

        llm = env.get("OPENAI_BASE_URL") or ("OpenAI" if env.get("OPENAI_API_KEY") else None)
        token_note = "development default" if env["GRAPH_API_TOKEN"] == DEV_TOKEN else "from GRAPH_API_TOKEN"
        admin_note = (
            f"development token {DEV_ADMIN_TOKEN}"
            if env["GRAPH_ADMIN_TOKEN"] == DEV_ADMIN_TOKEN
            else "token from GRAPH_ADMIN_TOKEN"
        )
        users = "\n".join(f"    @{n}:localhost / {n}-password   {role}" for n, role in DEMO_USERS.items())
        creds_url = f"http://127.0.0.1:{creds_port}"
        creds_note = ""
        if env["CREDENTIAL_REGISTRY_URL"] != creds_url:
            creds_note = f"; the graph uses {env['CREDENTIAL_REGISTRY_URL']}"
        calendar_url = f"http://127.0.0.1:{calendar_port}/mcp"
        calendar_note = ""
        if env["CALENDAR_MCP_URL"] != calendar_url:
            calendar_note = f"; the agent uses {env['CALENDAR_MCP_URL']}"
        stt_note = (
            "stand-in: answers a WAV's comment"
            if env["STT_BASE_URL"] == stt_url
            else f"the bot uses {env['STT_BASE_URL']}"
        )
        # The CLIs default to port 6379 and are not on PATH: dev.env points them at this stack.
        source = f". {shown_path(dev_env)}"
        audit_stream = env.get("AUDIT_STREAM") or "vagent:audit"
        homeserver = (
            f"""  homeserver      {env["MATRIX_HOMESERVER"]}  (throwaway; demo users:)
{users}"""
            if own_homeserver
            else f"  homeserver      {env['MATRIX_HOMESERVER']} as {env.get('MATRIX_USER')}"
        )
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        agent_id = env.get("AGENT_ID") or "vagent"
        token = demo_token(env["MATRIX_HOMESERVER"], GATEWAY_DEMO_USER) if own_homeserver else None
        gateway_note = gateway_hint(gateway_url, agent_id, f"@{GATEWAY_DEMO_USER}:localhost", token)
        say(f"""
vagent is running.
{homeserver}
  bot             {env["MATRIX_USER"]}   (health: http://127.0.0.1:{health_port}/health)
  graph service   http://127.0.0.1:{port}   (API docs: /docs; token: {token_note};
                  admin API: /admin/v1, {admin_note})
  gateway         {gateway_url}   (LangGraph's server API for the SDKs and agent-chat-ui; below)
  operator        `{source}` in another terminal, then `vagent docs|audit|usage|trace|admin`
  documents       `vagent docs list` (demo: deploy/dev/knowledge/README.md)
  access control  http://127.0.0.1:{acp_port}   (policy: {env["ACP_POLICY_FILE"]})
  credentials     {creds_url}   (DEVELOPMENT registry; policy: {env["CREDENTIALS_POLICY_FILE"]}{creds_note})
  tickets         http://127.0.0.1:{tickets_port}   (demo ticket service; data: {env["TICKETS_DB_PATH"]})
  calendar        {calendar_url}   (demo calendar MCP server; data: {env["CALENDAR_DB_PATH"]}{calendar_note})
  speech-to-text  {stt_url}   ({stt_note})
  agent           {env["AGENT_DESCRIPTOR"]}   (AGENT_DESCRIPTOR)
  audit trail     `vagent audit tail` (Redis stream {audit_stream})
  token usage     `vagent usage` (budgets: {env["BUDGETS_FILE"] or "none"}, applied when saved)
  LLM             {llm or "offline model (set OPENAI_BASE_URL / OPENAI_API_KEY for a real one)"}
Talk to it: `make chat` in another terminal (as @alice:localhost; CHAT_USER=@dave:localhost
CHAT_PASSWORD=dave-password make chat to see a user without access get nothing), or any Matrix
client (e.g. Element) pointed at {env["MATRIX_HOMESERVER"]}. The HTTP API example is in README.md.
Try "what are my open tickets?" as alice, then as bob (CHAT_USER=@bob:localhost
CHAT_PASSWORD=bob-password make chat): each sees only their own; carol has no key and is told so.
Try "what is on my calendar on 2026-12-01?" (alice and bob see only their own events; carol is
never offered the calendar) and "book a design review with @bob:localhost on 2026-12-01 at 10:00"
(it asks first; "yes" books it).
Files and voice in `make chat`: `/file deploy/dev/samples/report.pdf what is the outlook?`,
`/file deploy/dev/samples/screenshot.png what went wrong?` and
`/voice deploy/dev/samples/voice.wav` (the stand-in hears "What is on my calendar today?").
Then see who did what: `{source}; vagent audit tail` in another terminal.
{gateway_note}
Ctrl-C stops everything.
""")
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        while all(p.poll() is None for _, p in procs):
            time.sleep(0.5)
        dead = next(name for name, p in procs if p.poll() is not None)
        say(f"run: {dead} stopped unexpectedly; stopping everything")
        return 1
    except KeyboardInterrupt:
        say("\nrun: stopping…")
        return 0
    finally:
        for _, p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for _, p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        if synapse is not None:
            synapse.stop()
        if entity_redis is not None:
            entity_redis.stop()
        if redis is not None:
            redis.stop()


if __name__ == "__main__":
    sys.exit(main())
