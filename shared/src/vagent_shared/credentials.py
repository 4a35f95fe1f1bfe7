"""The Credential Registry contract (docs/credentials.md): how a tool gets the asking user's
own credential for an external system.

    POST {CREDENTIAL_REGISTRY_URL}/api/v1/credentials/get
         {"user_id": "@alice:localhost", "resource_id": "tickets", "domain": "localhost"}
    -> 200 {"credential_type": "api_key", "credential": "...", "expires_at": "2026-...Z" | null}
    -> 404 no credential configured for that user and resource
    -> 403 the user may not use that resource

The secret is a `SecretStr` everywhere in the product, so a repr, a log line or an
exception message built from these models shows `**********`, never the value.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

CredentialType = Literal["api_key", "bearer_token", "basic_auth", "jwt", "custom"]
#: The registry's path, under CREDENTIAL_REGISTRY_URL.
CREDENTIALS_GET_PATH = "/api/v1/credentials/get"


class CredentialRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user_id: str = Field(min_length=1, max_length=255)
    resource_id: str = Field(min_length=1, max_length=255)
    domain: str = Field(min_length=1, max_length=255)


class CredentialResponse(BaseModel):
    """A user's credential for one resource. `basic_auth` credentials are `username:password`;
    `custom` ones are opaque to everyone but the tool that uses them."""

    model_config = ConfigDict(extra="ignore")

    credential_type: CredentialType
    credential: SecretStr = Field(min_length=1)
    #: After this instant the credential must not be used (None: it does not expire).
    expires_at: datetime | None = None

    @field_validator("expires_at")
    @classmethod
    def _aware(cls, v: datetime | None) -> datetime | None:
        """A naive timestamp is read as UTC (the contract's timestamps are UTC)."""
        return v.replace(tzinfo=UTC) if v is not None and v.tzinfo is None else v

    def expired(self, now: datetime, margin_seconds: float = 0) -> bool:
        if self.expires_at is None:
            return False
        return (self.expires_at - now).total_seconds() <= margin_seconds

    def to_wire(self) -> dict[str, object]:
        """The JSON the registry sends (the only place the secret is written out)."""
        return {
            "credential_type": self.credential_type,
            "credential": self.credential.get_secret_value(),
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
        }
