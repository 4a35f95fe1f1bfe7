"""`vagent-acp`: the DEVELOPMENT AccessControlProvider.

Why: the real provider is an external .NET service. Local runs, the demo and the
integration tests need something that speaks the same HTTP contract
(docs/access-control.md, "AccessControlProvider HTTP contract") from a small YAML policy
(deploy/dev/acp-policy.yaml). Never point a production bot at it.

    POST /api/v1/authenticate  {"user_id": "@alice:localhost", "domain": "localhost"}
    -> 200 AcContext (camelCase) | 403 not in that domain | 404 unknown user

The policy file is re-read whenever it changes on disk, so editing the demo policy takes
effect on the next request without a restart. An invalid edit makes the provider answer
503 (the bot then fails closed) until the file is fixed.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import NamedTuple

import structlog
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vagent_dev.serving import add_policy_health, serve
from vagent_dev.settings import AcpSettings
from vagent_dev.yaml_files import FileError, ReloadingFile, YamlBlock, YamlList, YamlMap, load_yaml_model
from vagent_shared.access import AcContext, Resource, RoleGrant
from vagent_shared.http_errors import api_error, install_error_handlers
from vagent_shared.wire import AuthenticateRequest, ErrorResponse

log = structlog.get_logger(__name__)

#: The superuser group the dev provider reports for every listed superuser.
SUPERUSER_GROUP = "superusers"


class PolicyError(FileError):
    """The policy file is missing, not YAML, or does not validate."""


class DomainPolicy(BaseModel):
    """One ACL domain: who holds which roles, and what each role grants."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: `users:` with nothing, `guest:` (a role granting nothing), `"@dave:x":` (no roles).
    users: YamlMap[YamlList[str]] = Field(default_factory=dict)
    roles: YamlMap[YamlList[str]] = Field(default_factory=dict)

    @field_validator("users", "roles", mode="after")
    @classmethod
    def _names(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        if any(not k.strip() for k in v):
            raise ValueError("user and role names must not be empty")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> DomainPolicy:
        """A typo in a role or instance name must fail loudly, not silently grant nothing."""
        for role, instances in self.roles.items():
            for inst in instances:
                try:
                    Resource.parse(inst)
                except ValueError:
                    raise ValueError(
                        f"role {role!r} grants invalid instance {inst!r} "
                        f"(expected kind:name, kinds: {', '.join(r.value for r in Resource)})"
                    ) from None
        for user, roles in self.users.items():
            unknown = [r for r in roles if r not in self.roles]
            if unknown:
                raise ValueError(f"user {user!r} holds unknown role(s) {unknown}")
        return self


class Policy(BaseModel):
    """The whole YAML file: superusers plus per-domain users and roles."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    superusers: YamlList[str] = Field(default_factory=list)
    domains: YamlMap[YamlBlock[DomainPolicy]] = Field(default_factory=dict)


def load_policy(path: Path | str) -> Policy:
    """Read and validate a policy file; PolicyError says what is wrong and where."""
    return load_yaml_model(path, Policy, "policy", PolicyError)


class Reason(StrEnum):
    """Why the provider answers what it answers; also the audit `decision`."""

    MEMBER = "member"
    SUPERUSER = "superuser"
    UNKNOWN_USER = "unknown_user"
    NOT_IN_DOMAIN = "not_in_domain"

    @property
    def status(self) -> int:
        """HTTP status of the contract: 200 with an AcContext, 404 unknown, 403 not here."""
        return {Reason.UNKNOWN_USER: 404, Reason.NOT_IN_DOMAIN: 403}.get(self, 200)


class Decision(NamedTuple):
    """`context_for`'s answer: the AcContext (None = no access) and the reason."""

    ac: AcContext | None
    reason: Reason


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def context_for(policy: Policy, user_id: str, domain: str) -> Decision:
    """What the provider answers for `user_id` in `domain` (pure; no I/O).

    Like the real provider, `roles` also lists the user's grants in other domains; the
    AcContext rules make them grant nothing, and the tests prove it.
    """
    superuser = user_id in policy.superusers
    held = {d: dp.users[user_id] for d, dp in policy.domains.items() if user_id in dp.users}
    if not superuser and not held:
        return Decision(None, Reason.UNKNOWN_USER)
    if not superuser and domain not in held:
        return Decision(None, Reason.NOT_IN_DOMAIN)
    roles: dict[str, list[RoleGrant]] = {
        d: [RoleGrant(name=r, instances=list(policy.domains[d].roles[r])) for r in _unique(rs)]
        for d, rs in held.items()
    }
    roles.setdefault(domain, [])
    ac = AcContext(
        user_id=user_id,
        active_acl_domain=domain,
        active_roles=_unique(held.get(domain, [])),
        superuser_groups=[SUPERUSER_GROUP] if superuser else [],
        roles=roles,
    )
    return Decision(ac, Reason.SUPERUSER if superuser else Reason.MEMBER)


def policy_file(path: Path) -> ReloadingFile[Policy]:
    """The policy file, re-read when it changes: editing the demo policy needs no restart, and
    a broken edit answers 503 until it is fixed (yaml_files.py)."""
    return ReloadingFile(
        path,
        load_policy,
        lambda p: {"domains": sorted(p.domains), "superusers": len(p.superusers)},
        PolicyError,
    )


_MESSAGES = {
    Reason.UNKNOWN_USER: "Unknown user.",
    Reason.NOT_IN_DOMAIN: "The user has no access in this domain.",
}


def create_app(policy_path: Path | str) -> FastAPI:
    """Build the provider; raises PolicyError if the policy file is invalid now."""
    store = policy_file(Path(policy_path))
    app = FastAPI(
        title="vagent development AccessControlProvider",
        version="0.1.0",
        description="DEV ONLY. Answers AcContexts from a YAML policy (docs/access-control.md).",
    )

    install_error_handlers(app)

    @app.post(
        "/api/v1/authenticate",
        response_model=None,
        responses={
            200: {"description": "The user's AcContext (camelCase)"},
            403: {"model": ErrorResponse, "description": "Known user, no access in this domain"},
            404: {"model": ErrorResponse, "description": "Unknown user"},
            422: {"model": ErrorResponse},
            503: {"model": ErrorResponse, "description": "The policy file is invalid"},
        },
    )
    async def authenticate(body: AuthenticateRequest) -> JSONResponse:
        """The AcContext of `user_id` in `domain`; every decision is an audit log line."""
        try:
            policy = store.current()
        except PolicyError as exc:
            log.error(
                "acp_decision",
                user_id=body.user_id,
                domain=body.domain,
                decision="policy_invalid",
                status=503,
            )
            raise api_error(503, "policy_invalid", "The access policy is not valid.") from exc
        decision = context_for(policy, body.user_id, body.domain)
        status = decision.reason.status
        log.info(
            "acp_decision",
            user_id=body.user_id,
            domain=body.domain,
            decision=decision.reason.value,
            status=status,
            active_roles=decision.ac.active_roles if decision.ac else [],
        )
        if decision.ac is None:
            raise api_error(status, decision.reason.value, _MESSAGES[decision.reason])
        return JSONResponse(decision.ac.to_wire())

    add_policy_health(app, store, "the provider denies everyone")

    return app


def main() -> int:
    """Serve the dev provider on ACP_HOST:ACP_PORT with the policy ACP_POLICY_FILE."""
    settings = AcpSettings()
    return serve(
        "vagent-acp",
        lambda: create_app(settings.ACP_POLICY_FILE),
        host=settings.ACP_HOST,
        port=settings.ACP_PORT,
        log_level=settings.LOG_LEVEL,
        startup_errors=(PolicyError,),
        note="DEVELOPMENT AccessControlProvider, never use in production",
        policy_file=str(settings.ACP_POLICY_FILE),
    )


if __name__ == "__main__":
    raise SystemExit(main())
