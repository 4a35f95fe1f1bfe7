"""`vagent-credentials`: the DEVELOPMENT Credential Registry.

Why: the real registry is an external system that hands a tool the asking user's OWN
credential for another system. Local runs, the demo and the tests need something that speaks
the same HTTP contract (vagent_shared.credentials) from a small YAML policy
(deploy/dev/credentials.yaml). Never point a production graph at it.

    POST /api/v1/credentials/get  {"user_id", "resource_id", "domain"}
    -> 200 {"credential_type", "credential", "expires_at"} | 403 denied | 404 none configured
    -> 401 without `Authorization: Bearer <CREDENTIAL_REGISTRY_TOKEN>` (when that is set)
    -> 503 while the policy file is invalid

Like the development AccessControlProvider (vagent_dev.acp), the policy is re-read when the
file changes on disk, and an invalid edit answers 503 until it is fixed. Credential values
are never logged: only who asked for what, and the outcome.
"""

from __future__ import annotations

import argparse
import hmac
import re
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NamedTuple

import structlog
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StrictInt,
    StrictStr,
    model_validator,
)
from starlette.middleware.base import RequestResponseEndpoint

from vagent_dev.serving import add_policy_health, install_json_error_handlers, serve
from vagent_dev.settings import CredentialRegistrySettings
from vagent_dev.yaml_files import (
    MATRIX_USER_ID,
    FileError,
    ReloadingFile,
    YamlBlock,
    YamlList,
    YamlMap,
    load_yaml_model,
)
from vagent_shared.credentials import (
    CREDENTIALS_GET_PATH,
    CredentialRequest,
    CredentialResponse,
    CredentialType,
)
from vagent_shared.http_errors import api_error
from vagent_shared.wire import ErrorResponse

log = structlog.get_logger(__name__)

_JWT = re.compile(r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$")

Secret = Annotated[StrictStr, Field(min_length=1)]


class PolicyError(FileError):
    """The policy file is missing, not YAML, or does not validate."""


def secret_problem(kind: CredentialType, secret: str) -> str | None:
    """What is wrong with `secret` as a `kind` credential, or None.

    The message never quotes the value: it ends up in logs and 503 diagnostics.
    """
    if kind == "custom":
        return None
    if kind == "basic_auth":
        username, sep, _ = secret.partition(":")
        return None if sep and username else "a basic_auth credential must be 'username:password'"
    if kind == "jwt":
        ok = _JWT.match(secret) is not None
        return None if ok else "a jwt credential must be three base64url parts joined by '.'"
    if any(c.isspace() for c in secret):
        return f"{kind} credentials must not contain whitespace"
    return None


class ResourcePolicy(BaseModel):
    """One external system in one domain: the credential type and who holds which secret."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: CredentialType
    #: expires_at = now + ttl_seconds; None: the credential does not expire.
    ttl_seconds: StrictInt | None = Field(default=None, gt=0)
    users: YamlMap[Secret] = Field(default_factory=dict)
    denied: YamlList[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> ResourcePolicy:
        """Typos must fail loudly; messages name users, never their secrets."""
        for where, ids in (("users", list(self.users)), ("denied", self.denied)):
            for i, user in enumerate(ids):
                if not MATRIX_USER_ID.match(user):
                    raise ValueError(f"entry {i + 1} of {where} is not a Matrix user id (@name:server)")
        for user, secret in self.users.items():
            problem = secret_problem(self.type, secret)
            if problem:
                raise ValueError(f"users.{user}: {problem}")
        both = sorted(set(self.users) & set(self.denied))
        if both:
            raise ValueError(f"{both} listed both in users and in denied")
        return self


class DomainPolicy(BaseModel):
    """One ACL domain: its resources."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    resources: YamlMap[ResourcePolicy] = Field(default_factory=dict)


class Policy(BaseModel):
    """The whole YAML file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    domains: YamlMap[YamlBlock[DomainPolicy]] = Field(default_factory=dict)


def load_policy(path: Path | str) -> Policy:
    """Read and validate a policy file; PolicyError says what is wrong and where, never a secret."""
    return load_yaml_model(path, Policy, "policy", PolicyError)


class Outcome(StrEnum):
    """The registry's answer; also the `outcome` of its log lines."""

    ISSUED = "issued"
    DENIED = "denied"
    NO_CREDENTIAL = "no_credential"

    @property
    def status(self) -> int:
        return {Outcome.DENIED: 403, Outcome.NO_CREDENTIAL: 404}.get(self, 200)


class Lookup(NamedTuple):
    outcome: Outcome
    credential: CredentialResponse | None


def lookup(policy: Policy, req: CredentialRequest, now: datetime) -> Lookup:
    """What the registry answers for `req` at `now` (pure; no I/O). A denial wins."""
    domain = policy.domains.get(req.domain)
    resource = domain.resources.get(req.resource_id) if domain else None
    if resource is None:
        return Lookup(Outcome.NO_CREDENTIAL, None)
    if req.user_id in resource.denied:
        return Lookup(Outcome.DENIED, None)
    secret = resource.users.get(req.user_id)
    if secret is None:
        return Lookup(Outcome.NO_CREDENTIAL, None)
    expires = None
    if resource.ttl_seconds is not None:
        expires = now.replace(microsecond=0) + timedelta(seconds=resource.ttl_seconds)
    response = CredentialResponse(
        credential_type=resource.type, credential=SecretStr(secret), expires_at=expires
    )
    return Lookup(Outcome.ISSUED, response)


def policy_file(path: Path) -> ReloadingFile[Policy]:
    """The policy file, re-read when it changes (yaml_files.py): a broken edit answers 503
    until it is fixed, never with the previous policy (that could keep a revoked credential)."""
    return ReloadingFile(
        path,
        load_policy,
        lambda p: {"domains": {d: sorted(dp.resources) for d, dp in p.domains.items()}},
        PolicyError,
    )


_MESSAGES = {
    Outcome.DENIED: "The user may not use this resource.",
    Outcome.NO_CREDENTIAL: "No credential is configured for this user and resource.",
}


def bearer_ok(header: str | None, token: str) -> bool:
    """`Authorization: Bearer <token>`, compared in constant time."""
    scheme, _, value = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.strip().encode(), token.encode())


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorResponse(error_code=code, message=message).model_dump()
    return JSONResponse(body, status_code=status, headers=headers)


def _require_token(app: FastAPI, token: str) -> None:
    """Check the bearer token before the body is even parsed (so a stranger learns nothing)."""

    @app.middleware("http")
    async def _auth(request: Request, call_next: RequestResponseEndpoint) -> Response:
        if not request.url.path.startswith("/api/"):
            return await call_next(request)
        header = request.headers.get("authorization")
        if bearer_ok(header, token):
            return await call_next(request)
        reason = "missing_token" if header is None else "wrong_token"
        log.warning("credential_unauthorized", path=request.url.path, reason=reason, status=401)
        message = "A valid 'Authorization: Bearer <token>' header is required."
        return _error(401, "unauthorized", message, {"WWW-Authenticate": "Bearer"})


def _log_outcome(req: CredentialRequest, outcome: str, status: int) -> None:
    """The audit line of one request: who, what, where, and the answer; never the secret."""
    log.info(
        "credential_request",
        user_id=req.user_id,
        resource_id=req.resource_id,
        domain=req.domain,
        outcome=outcome,
        status=status,
    )


def create_app(policy_path: Path | str, token: str | None = None) -> FastAPI:
    """Build the registry; raises PolicyError if the policy file is invalid now."""
    store = policy_file(Path(policy_path))
    app = FastAPI(
        title="vagent development Credential Registry",
        version="0.1.0",
        description="DEV ONLY. Answers per-user credentials from a YAML policy.",
    )
    install_json_error_handlers(app)
    if token:
        _require_token(app, token)

    @app.post(
        CREDENTIALS_GET_PATH,
        response_model=None,
        responses={
            200: {"description": "The user's credential (the secret in clear)"},
            401: {"model": ErrorResponse, "description": "Missing or wrong bearer token"},
            403: {"model": ErrorResponse, "description": "The user is denied this resource"},
            404: {"model": ErrorResponse, "description": "No credential configured"},
            422: {"model": ErrorResponse},
            503: {"model": ErrorResponse, "description": "The policy file is invalid"},
        },
    )
    async def get_credential(body: CredentialRequest) -> JSONResponse:
        """The asking user's own credential for `resource_id` in `domain`."""
        try:
            policy = store.current()
        except PolicyError as exc:
            _log_outcome(body, "policy_invalid", 503)
            raise api_error(503, "policy_invalid", "The credential policy is not valid.") from exc
        found = lookup(policy, body, datetime.now(UTC))
        _log_outcome(body, found.outcome.value, found.outcome.status)
        if found.credential is None:
            raise api_error(found.outcome.status, found.outcome.value, _MESSAGES[found.outcome])
        return JSONResponse(found.credential.to_wire(), headers={"Cache-Control": "no-store"})

    add_policy_health(app, store, "every request then fails")

    return app


def main(argv: list[str] | None = None) -> int:
    """Serve on CREDENTIALS_HOST:CREDENTIALS_PORT with the policy CREDENTIALS_POLICY_FILE."""
    argparse.ArgumentParser(
        prog="vagent-credentials",
        description="DEVELOPMENT Credential Registry (never production). "
        "Configured by CREDENTIALS_* environment variables.",
    ).parse_args(argv)
    settings = CredentialRegistrySettings()
    token = settings.CREDENTIAL_REGISTRY_TOKEN
    return serve(
        "vagent-credentials",
        lambda: create_app(settings.CREDENTIALS_POLICY_FILE, token.get_secret_value() if token else None),
        host=settings.CREDENTIALS_HOST,
        port=settings.CREDENTIALS_PORT,
        log_level=settings.LOG_LEVEL,
        startup_errors=(PolicyError,),
        note="DEVELOPMENT Credential Registry, never use in production",
        policy_file=str(settings.CREDENTIALS_POLICY_FILE),
        token_required=token is not None,
    )


if __name__ == "__main__":
    raise SystemExit(main())
