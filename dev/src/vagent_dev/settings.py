"""Settings of the development stand-ins, read from the environment (field names ARE the
variable names). They live here, not in vagent_shared: the product never reads them."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class StandInSettings(BaseSettings):
    """What every stand-in reads alike: exact names, unknown variables ignored, empty as unset."""

    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore", env_ignore_empty=True)

    LOG_LEVEL: str = "INFO"


class CredentialRegistrySettings(StandInSettings):
    """The development Credential Registry (`vagent-credentials`)."""

    CREDENTIALS_HOST: str = "127.0.0.1"
    CREDENTIALS_PORT: int = Field(default=8091, ge=1, le=65535)
    CREDENTIALS_POLICY_FILE: Path = Path("deploy/dev/credentials.yaml")
    #: If set, callers must send it as `Authorization: Bearer ...`.
    CREDENTIAL_REGISTRY_TOKEN: SecretStr | None = None


class TicketsSettings(StandInSettings):
    """The demo ticket service (`vagent-tickets`), which authenticates people by API key."""

    TICKETS_HOST: str = "127.0.0.1"
    TICKETS_PORT: int = Field(default=8092, ge=1, le=65535)
    #: Who owns which API key, and the demo tickets to start with.
    TICKETS_SEED_FILE: Path = Path("deploy/dev/tickets.yaml")
    TICKETS_DB_PATH: Path = Path(".data/tickets.db")


class AcpSettings(StandInSettings):
    """The development AccessControlProvider (`vagent-acp`)."""

    ACP_HOST: str = "127.0.0.1"
    ACP_PORT: int = Field(default=8090, ge=1, le=65535)
    ACP_POLICY_FILE: Path = Path("deploy/dev/acp-policy.yaml")


class CalendarSettings(StandInSettings):
    """The demo calendar MCP server (`vagent-calendar`), which authenticates people by API key."""

    CALENDAR_HOST: str = "127.0.0.1"
    CALENDAR_PORT: int = Field(default=8093, ge=1, le=65535)
    #: Who owns which API key, and the demo events to start with.
    CALENDAR_SEED_FILE: Path = Path("deploy/dev/calendar.yaml")
    CALENDAR_DB_PATH: Path = Path(".data/calendar.db")


class SttSettings(StandInSettings):
    """The speech-to-text stand-in (`vagent-stt`). Its own names (STT_STANDIN_*), not the bot's
    STT_*: `make run` gives every process one environment, and the bot's STT_API_KEY is what
    the bot sends, not what this server asks for."""

    STT_STANDIN_HOST: str = "127.0.0.1"
    STT_STANDIN_PORT: int = Field(default=8094, ge=1, le=65535)
    #: If set, callers must send it as `Authorization: Bearer ...` (else 401).
    STT_STANDIN_API_KEY: SecretStr | None = None
