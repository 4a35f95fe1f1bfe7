"""`mcp_servers:` in the agent descriptor: which MCP servers the agent uses, and how.

    mcp_servers:
      - name: calendar            # [a-z0-9_]{1,24}, no "__", no "_" at either end; the tools'
                                  # prefix (calendar__create_event)
        url: ${CALENDAR_MCP_URL}  # ${VAR} from the environment; a missing VAR fails at startup
        transport: streamable_http   # or sse, or stdio (then command: and args: instead of url)
        credential: user          # none | user (the asker's own, Credential Registry) | service
                                  # (http transports only: a stdio server gets no credential)
        credential_header: Authorization   # where an api_key goes (default X-API-Key)
        service_credential_env: X          # credential: service only; the secret stays out of YAML
        confirm: auto             # auto | always | never
        trust_annotations: false  # auto: believe the server's readOnlyHint (operator's call)
        confirm_tools: []         # tools that always ask, whatever their annotations say
        include: []               # allow-list of the server's tool names; exclude: [] likewise
        timeout_seconds: 30

Why `${VAR}`: URLs differ per deployment and a service credential must never sit in a file
that is committed; a variable that is not set is a startup error naming it, never an empty
URL found at the first call.

Why the name rules: a tool is offered as `<server>__<tool>` and found again by that name.
With `__` allowed in a server name, `git` + `hub__merge` and `git__hub` + `merge` would both
be `git__hub__merge`, and whichever server answered first would own it; without `__` and
without `_` at either end, the first `__` of a name always ends the server's part.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from vagent_shared.validation import dotted, problems

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: An HTTP header name (RFC 9110 token).
_HEADER = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$")
#: A server's name: its tools' prefix (module docstring: why no `__` and no `_` at an end).
_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9_]{0,22}[a-z0-9])?$")
NAME_RULE = (
    "must be 1-24 characters of a-z, 0-9 and _, neither starting nor ending with _ nor "
    "containing __ (it is the prefix of the server's tools: <name>__<tool>)"
)

Transport = Literal["streamable_http", "sse", "stdio"]
CredentialMode = Literal["none", "user", "service"]
ConfirmMode = Literal["auto", "always", "never"]


class McpConfigError(ValueError):
    """The descriptor's `mcp_servers:` cannot be used; the message says which entry and why."""


def expand_env(value: Any, where: str, environ: Mapping[str, str] | None = None) -> Any:
    """`${VAR}` replaced in every string of `value` (lists and maps too); McpConfigError names
    a variable that is not set."""
    env = os.environ if environ is None else environ
    if isinstance(value, str):

        def one(m: re.Match[str]) -> str:
            name = m.group(1)
            if name not in env:
                raise McpConfigError(f"{where}: environment variable {name} is not set")
            return env[name]

        return _VAR.sub(one, value)
    if isinstance(value, list):
        return [expand_env(v, where, env) for v in value]
    if isinstance(value, dict):
        return {k: expand_env(v, where, env) for k, v in value.items()}
    return value


class McpServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    transport: Transport = "streamable_http"
    url: str | None = None
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    credential: CredentialMode = "none"
    credential_header: str = "X-API-Key"
    service_credential_env: str | None = None
    confirm: ConfirmMode = "auto"
    #: `confirm: auto` believes the server's `readOnlyHint` only when the operator trusts it.
    trust_annotations: bool = False
    confirm_tools: list[str] = Field(default_factory=list)
    include: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    timeout_seconds: float = Field(default=30, gt=0, le=600)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _NAME.match(name) or "__" in name:
            raise ValueError(NAME_RULE)
        return name

    @model_validator(mode="after")
    def _consistent(self) -> McpServerConfig:
        if self.transport == "stdio":
            if not self.command or self.url:
                raise ValueError("a stdio server takes command: (and args:), not url:")
            if self.credential != "none":  # nothing would carry it: refused, never ignored
                raise ValueError(
                    f"a stdio server takes no credential (credential: {self.credential} would be "
                    "ignored: no HTTP request carries it); use credential: none, or an http transport"
                )
        elif not self.url or not self.url.startswith(("http://", "https://")) or self.command:
            raise ValueError(f"a {self.transport} server takes an http(s) url:, not command:")
        if not _HEADER.match(self.credential_header):
            raise ValueError("credential_header must be an HTTP header name")
        if (self.credential == "service") != bool(self.service_credential_env):
            raise ValueError("service_credential_env goes with credential: service, and only with it")
        return self

    @property
    def credential_resource(self) -> str:
        """The Credential Registry's resource id of this server's per-user credentials."""
        return f"mcp:{self.name}"

    @property
    def origin(self) -> str:
        """Which server its tools act on: the name and a digest of where it is reached and as
        whom (never the URL itself, which may carry a token). A confirmation is bound to it, so
        a "yes" given for one server never runs another that took the same name after a
        configuration change."""
        where = json.dumps([self.transport, self.url, self.command, self.args, self.credential])
        return f"mcp:{self.name}@{hashlib.sha256(where.encode()).hexdigest()[:16]}"

    def offers(self, tool: str) -> bool:
        """Whether the server's tool `tool` belongs to the agent (include / exclude)."""
        return (not self.include or tool in self.include) and tool not in self.exclude

    def service_secret(self, environ: Mapping[str, str] | None = None) -> str:
        """The service credential, read from the environment when it is needed (never kept
        in the config, so it never reaches a log of the descriptor)."""
        env = os.environ if environ is None else environ
        name = self.service_credential_env or ""
        secret = env.get(name, "")
        if not secret:
            raise McpConfigError(f"mcp_servers[{self.name}]: environment variable {name} is not set")
        return secret


def load_servers(raw: Any, environ: Mapping[str, str] | None = None) -> list[McpServerConfig]:
    """The `mcp_servers:` list of a descriptor, variables expanded; McpConfigError otherwise."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise McpConfigError("mcp_servers must be a list")
    servers: list[McpServerConfig] = []
    for i, entry in enumerate(raw):
        label = entry.get("name") if isinstance(entry, dict) else None
        where = f"mcp_servers[{label or i}]"
        if not isinstance(entry, dict):
            raise McpConfigError(f"{where} must be a mapping")
        try:
            servers.append(McpServerConfig.model_validate(expand_env(entry, where, environ)))
        except ValidationError as exc:  # its text would quote the input (a URL with a token)
            found = problems(exc, lambda loc: dotted(loc) or "entry")
            raise McpConfigError(f"{where}: {found}") from None
    names = [s.name for s in servers]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise McpConfigError(f"mcp_servers: {', '.join(twice)} listed more than once")
    service = [s for s in servers if s.credential == "service"]
    for s in service:
        s.service_secret(environ)  # a missing secret is a startup error too
    return servers
