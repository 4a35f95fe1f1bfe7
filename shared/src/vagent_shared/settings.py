"""Settings read from the environment. The field names ARE the variable names.

Both services read their own class; names shared by both (REDIS_URL,
GRAPH_API_TOKEN, LOG_LEVEL) are declared once in CommonSettings.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore", env_ignore_empty=True)

    REDIS_URL: str = "redis://127.0.0.1:6379/0"
    GRAPH_API_TOKEN: SecretStr | None = None
    LOG_LEVEL: str = "INFO"


class GraphSettings(CommonSettings):
    """Graph service settings (documented in README.md)."""

    HTTP_HOST: str = "0.0.0.0"
    HTTP_PORT: int = Field(default=8000, ge=1, le=65535)
    OPENAI_API_KEY: SecretStr | None = None
    OPENAI_BASE_URL: str | None = None
    LLM_MODEL: str | None = None
    #: Run without GRAPH_API_TOKEN (every /api/ call accepted). Local development only.
    GRAPH_INSECURE_DEV: bool = False
    AGENT_DESCRIPTOR: Path | None = None
    RECORDS_DB_PATH: Path = Path(".data/records.db")
    MAX_MESSAGE_CHARS: int = Field(default=16000, ge=1)
    MAX_REQUEST_BYTES: int = Field(default=1_000_000, ge=1024)
    CHECKPOINT_TTL_MINUTES: int = Field(default=1440, ge=1)
    LLM_TIMEOUT_SECONDS: float = Field(default=120.0, gt=0)
    RUN_TIMEOUT_SECONDS: float = Field(default=600.0, gt=0)

    def llm_configured(self) -> bool:
        """A real LLM is used when a model or an endpoint/key is configured."""
        return bool(self.LLM_MODEL or self.OPENAI_BASE_URL or self.OPENAI_API_KEY)
