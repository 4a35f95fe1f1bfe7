#!/usr/bin/env python3
"""`make run`: the whole product on embedded defaults, in the foreground; Ctrl-C stops it all.

Starts, each on 127.0.0.1: Redis 8 with search + JSON (unless REDIS_URL is set), a throwaway
Synapse homeserver with the bot and demo users (unless MATRIX_HOMESERVER is set), the
development AccessControlProvider with the demo policy, the demo documents and entities
(deploy/dev/knowledge, ingested with `vagent-docs`; unchanged ones are skipped), the graph
service (offline model unless OPENAI_BASE_URL / OPENAI_API_KEY are set) and the bot. Their
JSON logs are shown as readable lines. Data lives in .data/ (git-ignored).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from redis_local import RedisServer  # noqa: E402
from synapse_local import SynapseServer  # noqa: E402

DATA = Path(os.environ.get("VAGENT_DATA_DIR", ROOT / ".data"))
DEV_TOKEN = "dev-token-change-me"  # noqa: S105 - local development default, printed on start
DEV_ADMIN_TOKEN = "dev-admin-token-change-me"  # noqa: S105 - the admin API's, likewise
DEMO_MANIFEST = ROOT / "deploy/dev/knowledge/manifest.yaml"
BIN = Path(sys.executable).parent
#: Demo users of the throwaway homeserver and their roles in deploy/dev/acp-policy.yaml.
DEMO_USERS = {
    "alice": "operator: deletes after confirming; reads finance, HR, engineering and public docs",
    "bob": "analyst: read-only queries; reads engineering and public docs",
    "carol": "member: chat; reads public docs only",
    "dave": "no access at all (gets no reply)",
    "admin": "superuser: everything in the localhost domain",
}
COLORS = {"graph": "\033[35m", "bot": "\033[36m", "acp": "\033[33m"}
RESET = "\033[0m"
_print_lock = threading.Lock()


def say(text: str) -> None:
    with _print_lock:
        print(text, flush=True)


def readable(service: str, line: str, color: bool) -> str | None:
    """One JSON log line as `12:00:01 graph  info  event key=value`; other lines as they are."""
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
        rest = " ".join(f"{k}={v}" for k, v in entry.items())
        text = f"{ts} {level} {event} {rest}".rstrip()
    tag = f"{service:<5}"
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
        [str(BIN / "vagent-docs"), "ingest", "--manifest", str(DEMO_MANIFEST)],
        env=env,
        capture_output=True,
        text=True,
    )
    for line in (proc.stdout + proc.stderr).splitlines():
        if line.strip() and "embedding:" not in line:
            say(f"docs  {line}")
    if proc.returncode != 0:
        raise SystemExit("run: ingesting the demo documents failed (see above)")


def dev_secret(name: str) -> str:
    """A random secret generated once and kept in .data (the bot's dev password)."""
    path = DATA / "dev-secrets.json"
    known = json.loads(path.read_text()) if path.exists() else {}
    if name not in known:
        known[name] = secrets.token_urlsafe(18)
        path.write_text(json.dumps(known))
        path.chmod(0o600)
    return str(known[name])


def main() -> int:
    env = dict(os.environ)
    DATA.mkdir(parents=True, exist_ok=True)
    color = sys.stdout.isatty()
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    redis: RedisServer | None = None
    synapse: SynapseServer | None = None

    def start(name: str, command: str, extra: dict[str, str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [str(BIN / command)], env={**env, **extra}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        procs.append((name, proc))
        assert proc.stdout is not None
        threading.Thread(target=pump, args=(name, proc.stdout, color), daemon=True).start()
        return proc

    try:
        if not env.get("REDIS_URL"):
            redis = RedisServer(int(env.get("REDIS_PORT", "6390")), DATA / "redis")
            if redis.ping():
                say(f"run: reusing the Redis already on port {redis.port}")
                redis = RedisServer(redis.port, redis.data_dir)  # not ours to stop
                env["REDIS_URL"] = redis.url
                redis = None
            else:
                redis.start()
                say(f"run: Redis 8 (search + JSON) on 127.0.0.1:{redis.port}, data in {DATA / 'redis'}")
                env["REDIS_URL"] = redis.url
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
        env.setdefault("RECORDS_DB_PATH", str(DATA / "records.db"))
        env.setdefault("HTTP_HOST", "127.0.0.1")
        port = env.setdefault("HTTP_PORT", "8000")
        acp_port = env.setdefault("ACP_PORT", "8090")
        env.setdefault("ACP_HOST", "127.0.0.1")
        env.setdefault("ACP_POLICY_FILE", str(ROOT / "deploy/dev/acp-policy.yaml"))
        env.setdefault("ACCESS_CONTROL_PROVIDER_URL", f"http://127.0.0.1:{acp_port}")
        env.setdefault("GRAPH_API_ENDPOINT", f"http://127.0.0.1:{port}")
        env.setdefault("MATRIX_STORE_PATH", str(DATA / "bot-store"))
        if own_homeserver:
            env.setdefault("DEFAULT_DOMAIN", "localhost")  # DMs carry no tenant state event
        env.setdefault("BOT_HEALTH_HOST", "127.0.0.1")
        health_port = env.setdefault("BOT_HEALTH_PORT", "8080")

        ingest_demo(env)
        acp = start("acp", "vagent-acp", {})
        wait_http(f"http://127.0.0.1:{acp_port}/health", acp, "vagent-acp")
        graph = start("graph", "vagent-graph", {})
        wait_http(f"http://127.0.0.1:{port}/health", graph, "vagent-graph")
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
        homeserver = (
            f"""  homeserver      {env["MATRIX_HOMESERVER"]}  (throwaway; demo users:)
{users}"""
            if own_homeserver
            else f"  homeserver      {env['MATRIX_HOMESERVER']} as {env.get('MATRIX_USER')}"
        )
        say(f"""
vagent is running.
{homeserver}
  bot             {env["MATRIX_USER"]}   (health: http://127.0.0.1:{health_port}/health)
  graph service   http://127.0.0.1:{port}   (API docs: /docs; token: {token_note};
                  admin API: /admin/v1, {admin_note})
  documents       `.venv/bin/vagent-docs list` (demo: deploy/dev/knowledge/README.md)
  access control  http://127.0.0.1:{acp_port}   (policy: {env["ACP_POLICY_FILE"]})
  LLM             {llm or "offline model (set OPENAI_BASE_URL / OPENAI_API_KEY for a real one)"}
Talk to it: `make chat` in another terminal (as @alice:localhost; CHAT_USER=@dave:localhost
CHAT_PASSWORD=dave-password make chat to see a user without access get nothing), or any Matrix
client (e.g. Element) pointed at {env["MATRIX_HOMESERVER"]}. The HTTP API example is in README.md.
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
        if redis is not None:
            redis.stop()


if __name__ == "__main__":
    sys.exit(main())
