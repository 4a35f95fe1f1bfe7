#!/usr/bin/env python3
"""`make run`: the product on embedded defaults, in the foreground, Ctrl-C stops it all.

Starts a local Redis (unless REDIS_URL is set) and the graph service on the offline
model (unless OPENAI_BASE_URL / OPENAI_API_KEY are set), then prints how to talk to it.
Data lives in .data/ (git-ignored).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from redis_local import RedisServer  # noqa: E402

DATA = Path(os.environ.get("VAGENT_DATA_DIR", ROOT / ".data"))
DEV_TOKEN = "dev-token-change-me"  # noqa: S105 - local development default, printed on start


def wait_http(url: str, proc: subprocess.Popen[bytes], name: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"run: {name} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:  # noqa: S310 - loopback only
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"run: {url} did not become healthy")


def main() -> int:
    env = dict(os.environ)
    DATA.mkdir(exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    redis: RedisServer | None = None
    if not env.get("REDIS_URL"):
        redis = RedisServer(int(env.get("REDIS_PORT", "6390")), DATA / "redis")
        if redis.ping():
            print(f"run: reusing the Redis already on port {redis.port}")
        else:
            redis.start()
            print(f"run: Redis 8 (search + JSON) on 127.0.0.1:{redis.port}, data in {DATA / 'redis'}")
        env["REDIS_URL"] = redis.url
    env.setdefault("GRAPH_API_TOKEN", DEV_TOKEN)
    env.setdefault("RECORDS_DB_PATH", str(DATA / "records.db"))
    env.setdefault("HTTP_HOST", "127.0.0.1")
    port = env.setdefault("HTTP_PORT", "8000")
    bin_dir = Path(sys.executable).parent
    try:
        graph = subprocess.Popen([str(bin_dir / "vagent-graph")], env=env)
        procs.append(graph)
        wait_http(f"http://127.0.0.1:{port}/health", graph, "vagent-graph")
        llm = env.get("OPENAI_BASE_URL") or ("OpenAI" if env.get("OPENAI_API_KEY") else None)
        token_note = (
            "(the development default)" if env["GRAPH_API_TOKEN"] == DEV_TOKEN else "(from GRAPH_API_TOKEN)"
        )
        print(
            f"""
vagent is running.
  graph service   http://127.0.0.1:{port}   (API docs: http://127.0.0.1:{port}/docs)
  LLM             {llm or "offline model (set OPENAI_BASE_URL / OPENAI_API_KEY for a real one)"}
  service token   {"set" if token_note.startswith("(from") else DEV_TOKEN} {token_note}
Try the SSE conversation in README.md ("Talk to it with curl"). Ctrl-C stops everything.
""",
            flush=True,
        )
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        return 1
    except KeyboardInterrupt:
        print("\nrun: stopping…", flush=True)
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        if redis is not None and redis.proc is not None:
            redis.stop()


if __name__ == "__main__":
    sys.exit(main())
