#!/usr/bin/env python3
"""Run a throwaway local Synapse homeserver (sqlite, loopback, no federation) from the venv.

matrix-synapse is installed in .venv; no Docker, no `--generate-config` step: the config is
built by `homeserver_config()` and rewritten on every start. Secrets are generated once and
kept in `<dir>/secrets.json`, so a restart on the same data dir keeps users, devices and the
signing key valid.

    python scripts/synapse_local.py --port 8448 --dir .data/synapse --register bot:botpass alice:pw
Importable by tests: `SynapseServer(port, data_dir).start()`, then `register_user(...)`.

for_tests=True and for_tests=False differ only in password hashing (bcrypt_rounds 4 vs 12, so
test registrations take ~25 ms) and log level (WARNING vs INFO, both to `<dir>/homeserver.log`).
Both raise every rc_* rate limit: Synapse's defaults (rc_message 0.2/s, burst 10) make
matrix-nio sleep silently on 429 and a busy bot crawl, and this server is never exposed.
Both disable the sync response cache so a restarted client does not get a stale sync.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import secrets
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from procutil import free_port as free_port  # re-exported: benches import it from here
from procutil import stop_process, wait_until

# Every rate limiter Synapse 1.163 reads (synapse/config/ratelimiting.py), set far above
# anything a test or a local demo does.
_HIGH = {"per_second": 10_000, "burst_count": 100_000}
RATE_LIMITS: dict[str, Any] = {
    "rc_message": _HIGH,
    "rc_registration": _HIGH,
    "rc_registration_token_validity": _HIGH,
    "rc_login": {"address": _HIGH, "account": _HIGH, "failed_attempts": _HIGH},
    "rc_admin_redaction": _HIGH,
    "rc_joins": {"local": _HIGH, "remote": _HIGH},
    "rc_joins_per_room": _HIGH,
    "rc_key_requests": _HIGH,
    "rc_3pid_validation": _HIGH,
    "rc_invites": {"per_room": _HIGH, "per_user": _HIGH, "per_issuer": _HIGH},
    "rc_third_party_invite": _HIGH,
    "rc_media_create": _HIGH,
    "rc_presence": {"per_user": _HIGH},
    "rc_delayed_event_mgmt": _HIGH,
    "rc_room_creation": _HIGH,
    "rc_reports": _HIGH,
    "rc_user_directory": _HIGH,
    "rc_profile": _HIGH,
}

SECRET_NAMES = ("registration_shared_secret", "macaroon_secret_key", "form_secret")


def log_config(log_file: Path, level: str) -> dict[str, Any]:
    """Python logging dictConfig: Synapse logs to one file in the data dir, nothing to stdout."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"}},
        "handlers": {
            "file": {
                "class": "logging.FileHandler",
                "filename": str(log_file),
                "formatter": "plain",
                "encoding": "utf-8",
            }
        },
        "root": {"level": level, "handlers": ["file"]},
    }


def homeserver_config(
    port: int,
    data_dir: Path,
    server_name: str,
    secret_values: dict[str, str],
    for_tests: bool = True,
) -> dict[str, Any]:
    """The homeserver.yaml content, as a dict. Pure: no file is read or written."""
    d = Path(data_dir).resolve()
    return {
        "server_name": server_name,
        "public_baseurl": f"http://127.0.0.1:{port}/",
        "pid_file": str(d / "homeserver.pid"),
        "report_stats": False,
        "listeners": [
            {
                "port": port,
                "bind_addresses": ["127.0.0.1"],
                "type": "http",
                "tls": False,
                "x_forwarded": False,
                "resources": [{"names": ["client"], "compress": False}],
            }
        ],
        "database": {"name": "sqlite3", "args": {"database": str(d / "homeserver.db")}},
        "log_config": str(d / "log_config.yaml"),
        "media_store_path": str(d / "media_store"),
        "max_upload_size": "10M",
        "url_preview_enabled": False,
        "signing_key_path": str(d / "signing.key"),
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        "federation_domain_whitelist": [],
        "enable_registration": False,
        "enable_metrics": False,
        "presence": {"enabled": False},
        "bcrypt_rounds": 4 if for_tests else 12,
        # 0: a client restarted with an old since-token must not get a cached (stale) sync
        "caches": {"sync_response_cache_duration": 0},
        **{name: secret_values[name] for name in SECRET_NAMES},
        **RATE_LIMITS,
    }


class SynapseServer:
    """A Synapse subprocess in its own session, configured from `homeserver_config()`."""

    def __init__(
        self, port: int, data_dir: Path, server_name: str = "localhost", for_tests: bool = True
    ) -> None:
        self.port, self.data_dir = port, Path(data_dir)
        self.server_name, self.for_tests = server_name, for_tests
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "homeserver.yaml"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "homeserver.log"

    @property
    def stdout_path(self) -> Path:
        return self.data_dir / "synapse.stdout.log"

    def secrets(self) -> dict[str, str]:
        """Secrets made on the first run and reused after, so restarts keep sessions valid."""
        path = self.data_dir / "secrets.json"
        if path.exists():
            values: dict[str, str] = json.loads(path.read_text())
            if all(name in values for name in SECRET_NAMES):
                return values
        values = {name: secrets.token_urlsafe(32) for name in SECRET_NAMES}
        path.write_text(json.dumps(values, indent=2))
        path.chmod(0o600)
        return values

    def write_config(self) -> Path:
        import yaml  # PyYAML comes with matrix-synapse; lazy so importing this module is free

        self.data_dir.mkdir(parents=True, exist_ok=True)
        level = "WARNING" if self.for_tests else "INFO"
        (self.data_dir / "log_config.yaml").write_text(
            yaml.safe_dump(log_config(self.log_path.resolve(), level), sort_keys=False)
        )
        config = homeserver_config(self.port, self.data_dir, self.server_name, self.secrets(), self.for_tests)
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        return self.config_path

    def command(self) -> list[str]:
        return [sys.executable, "-m", "synapse.app.homeserver", "-c", str(self.config_path.resolve())]

    def start(self, timeout: float = 60.0) -> SynapseServer:
        self.write_config()
        with open(self.stdout_path, "ab") as out:
            self.proc = proc = subprocess.Popen(
                self.command(),
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
            )

        def started() -> bool:
            if proc.poll() is not None:
                self.proc = None
                raise RuntimeError(f"synapse exited with {proc.returncode}:\n{self.log_tail()}")
            return self.ready()

        if wait_until(started, timeout):
            return self
        self.stop()
        raise TimeoutError(f"synapse did not answer within {timeout}s:\n{self.log_tail()}")

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/_matrix/client/versions", timeout=1) as r:  # noqa: S310
                return bool(r.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def log_tail(self, lines: int = 40) -> str:
        out = []
        for path in (self.stdout_path, self.log_path):
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {path}\n" + "\n".join(tail))
        return "\n".join(out) or "(no log)"

    def stop(self) -> None:
        stop_process(self.proc, 15)
        self.proc = None

    def __enter__(self) -> SynapseServer:
        return self.start()

    def __exit__(self, *exc: tuple[type[BaseException], BaseException, TracebackType]) -> None:
        self.stop()

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(  # noqa: S310 - always our loopback http URL
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310
            return json.loads(r.read() or b"{}")

    def register_user(self, localpart: str, password: str, admin: bool = False) -> str:
        """Register via the shared-secret admin API; an existing user is fine if the password works.

        Returns the full user id. Raises ValueError if the user exists with another password.
        """
        user_id = f"@{localpart}:{self.server_name}"
        nonce = self._request("GET", "/_synapse/admin/v1/register")["nonce"]
        key = self.secrets()["registration_shared_secret"].encode()
        mac = hmac.new(key, digestmod=hashlib.sha1)
        mac.update(b"\x00".join([nonce.encode(), localpart.encode(), password.encode()]))
        mac.update(b"\x00" + (b"admin" if admin else b"notadmin"))
        body = {
            "nonce": nonce,
            "username": localpart,
            "password": password,
            "admin": admin,
            "mac": mac.hexdigest(),
        }
        try:
            return str(self._request("POST", "/_synapse/admin/v1/register", body)["user_id"])
        except urllib.error.HTTPError as e:
            err = json.loads(e.read() or b"{}")
            if e.code != 400 or err.get("errcode") != "M_USER_IN_USE":
                raise RuntimeError(f"register {localpart}: HTTP {e.code} {err}") from e
        self._check_password(user_id, password)
        return user_id

    def _check_password(self, user_id: str, password: str) -> None:
        """Log in (and out again, so no device is left behind) to prove the password."""
        body = {
            "type": "m.login.password",
            "identifier": {"type": "m.id.user", "user": user_id},
            "password": password,
            "initial_device_display_name": "synapse_local password check",
        }
        try:
            token = self._request("POST", "/_matrix/client/v3/login", body)["access_token"]
        except urllib.error.HTTPError as e:
            raise ValueError(f"{user_id} exists with a different password (HTTP {e.code})") from e
        req = urllib.request.Request(  # noqa: S310
            f"{self.url}/_matrix/client/v3/logout",
            data=b"{}",
            method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        urllib.request.urlopen(req, timeout=30).close()  # noqa: S310


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--port", type=int, default=int(os.environ.get("SYNAPSE_PORT", "8448")))
    p.add_argument("--dir", type=Path, default=Path(".data/synapse"))
    p.add_argument("--server-name", default="localhost")
    p.add_argument(
        "--register",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME:PASSWORD",
        help="users to create (existing ones are fine when the password matches)",
    )
    p.add_argument("--for-tests", action="store_true", help="cheap bcrypt, WARNING logs")
    p.add_argument("--print-config", action="store_true", help="write the config, print it, exit")
    args = p.parse_args()
    server = SynapseServer(args.port, args.dir, args.server_name, for_tests=args.for_tests)
    if args.print_config:
        print(server.write_config().read_text())
        return 0

    def _stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)  # also when started in the background (SIG_IGN)
    try:
        server.start()
        for item in args.register:
            name, sep, password = item.partition(":")
            if not sep or not name or not password:
                p.error(f"--register wants NAME:PASSWORD, got {item!r}")
            print(f"user {server.register_user(name, password)}", flush=True)
        print(f"synapse ready at {server.url} (logs in {server.log_path})", flush=True)
        assert server.proc is not None
        return server.proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
