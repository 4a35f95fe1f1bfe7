"""A local Redis Sentinel set-up for tests: a master and a replica (both with the search and
JSON modules) and one sentinel, all on free 127.0.0.1 ports.

The sentinel is the same redis-server binary in sentinel mode, with quorum 1 and short
timeouts so a forced failover (`SENTINEL FAILOVER`) finishes in seconds. Both servers start a
replica's full sync at once (`repl-diskless-sync-delay 0`; Redis' default waits 5 s for more
replicas to share the transfer, which only slows a test down).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import TracebackType

import redis
from procutil import free_port, stop_process, wait_until

from redis_local import RedisServer, binaries

SERVICE = "vagentmaster"
#: No wait before a full sync (see the module docstring).
SYNC_AT_ONCE = ("--repl-diskless-sync-delay", "0")


def client(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2, decode_responses=True)


def info_field(port: int, field: str) -> str | None:
    with client(port) as c:
        value = c.info("replication").get(field)
    return None if value is None else str(value)


class SentinelSetup:
    """Master, replica and sentinel; `url` is the REDIS_URL the services get."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.master = RedisServer(free_port(), data_dir / "a", extra_args=SYNC_AT_ONCE)
        self.replica = RedisServer(
            free_port(),
            data_dir / "b",
            extra_args=(*SYNC_AT_ONCE, "--replicaof", "127.0.0.1", str(self.master.port)),
        )
        self.sentinel_port = free_port()
        self.sentinel: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{SERVICE}/0"

    def start(self) -> SentinelSetup:
        self.master.start()
        self.replica.start()
        conf_dir = self.data_dir / "sentinel"
        conf_dir.mkdir(parents=True, exist_ok=True)
        conf = conf_dir / "sentinel.conf"
        conf.write_text(
            f"port {self.sentinel_port}\nbind 127.0.0.1\ndir {conf_dir.resolve()}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.master.port} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 5000\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        log = open(conf_dir / "sentinel.log", "ab")
        server, _ = binaries()
        self.sentinel = subprocess.Popen(
            [server, str(conf), "--sentinel"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        if not wait_until(self.in_sync, 30, interval=0.1):
            self.stop()
            raise TimeoutError("replica did not sync with the master")
        if not wait_until(self._sentinel_sees_replica, 30, interval=0.2):
            self.stop()
            raise TimeoutError("the sentinel did not find the replica")
        return self

    def _sentinel_sees_replica(self) -> bool:
        """The sentinel has connected to the replica and seen its link to the master up, so
        it would promote it (before that, `SENTINEL FAILOVER` answers NOGOODSLAVE)."""
        try:
            with client(self.sentinel_port) as c:
                replicas = c.execute_command("SENTINEL", "REPLICAS", SERVICE)
        except redis.RedisError:
            return False
        return any(
            str(r.get("port")) == str(self.replica.port)
            and r.get("flags") == "slave"
            and r.get("master-link-status") == "ok"
            for r in replicas
        )

    def master_port(self) -> int | None:
        """The master's port as the sentinel reports it."""
        try:
            with client(self.sentinel_port) as c:
                addr = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        except redis.RedisError:
            return None
        return int(addr[1]) if addr else None

    def in_sync(self) -> bool:
        """The replica has everything the master wrote (same replication offset)."""
        primary, secondary = self.current()
        try:
            done = info_field(secondary.port, "master_link_status") == "up"
            return done and info_field(primary.port, "master_repl_offset") == info_field(
                secondary.port, "slave_repl_offset"
            )
        except redis.RedisError:
            return False

    def current(self) -> tuple[RedisServer, RedisServer]:
        """(master, replica) as the sentinel sees them now."""
        if self.master_port() == self.replica.port:
            return self.replica, self.master
        return self.master, self.replica

    def failover(self, timeout: float = 30) -> RedisServer:
        """Force a failover; wait until the sentinel names the other server master. Returns
        the old master, which goes on accepting writes until a sentinel turns it into a
        replica (up to about 10 s later: `wait_demoted`)."""
        old, new = self.current()
        if not wait_until(self._start_failover, timeout, interval=0.1):
            raise TimeoutError("the sentinel found no replica to promote")
        if not wait_until(lambda: self.master_port() == new.port, timeout, interval=0.05):
            raise TimeoutError("the sentinel did not switch masters")
        return old

    def _start_failover(self) -> bool:
        """False while the sentinel knows no replica fit to promote (it learns a replica's
        state from its INFO, sent every few seconds)."""
        with client(self.sentinel_port) as c:
            try:
                c.execute_command("SENTINEL", "FAILOVER", SERVICE)
            except redis.ResponseError as exc:
                if str(exc).startswith("NOGOODSLAVE"):
                    return False
                raise
        return True

    def wait_demoted(self, old: RedisServer, timeout: float = 30, hurry: bool = False) -> None:
        """Until the old master is a replica (the sentinel then closes its clients' connections).

        `hurry`: for a test that has seen what it needs of the window before: the sentinel
        demotes the old master 4 publish periods after the switch, on its next INFO (about
        10 s with the defaults); `SENTINEL DEBUG` shortens both periods while this waits, so
        it takes about a second, and puts them back afterwards."""
        with client(self.sentinel_port) as c:
            periods = c.execute_command("SENTINEL", "DEBUG") if hurry else {}
            if hurry:
                c.execute_command("SENTINEL", "DEBUG", "info-period", 100, "publish-period", 100)
        try:
            if not wait_until(lambda: self.role(old.port) == "slave", timeout, interval=0.05):
                raise TimeoutError("the old master was not turned into a replica")
        finally:
            if hurry:
                with client(self.sentinel_port) as c:
                    c.execute_command(
                        "SENTINEL",
                        "DEBUG",
                        "info-period",
                        periods["INFO-PERIOD"],
                        "publish-period",
                        periods["PUBLISH-PERIOD"],
                    )

    @staticmethod
    def role(port: int) -> str | None:
        """"master" or "slave" as the server says; None when it does not answer."""
        try:
            return info_field(port, "role")
        except redis.RedisError:
            return None

    def stop(self) -> None:
        stop_process(self.sentinel, 10)
        self.sentinel = None
        self.replica.stop()
        self.master.stop()

    def __enter__(self) -> SentinelSetup:
        return self.start()

    def __exit__(self, *exc: tuple[type[BaseException], BaseException, TracebackType]) -> None:
        self.stop()
