"""Settings read from the environment. The field names ARE the variable names.

Both services read their own class; names shared by both (REDIS_URL,
GRAPH_API_TOKEN, LOG_LEVEL) are declared once in CommonSettings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(case_sensitive=True, extra="ignore", env_ignore_empty=True)

    REDIS_URL: str = "redis://127.0.0.1:6379/0"
    #: Connections the process's Redis client may open; beyond, a command waits for a free
    #: one (up to redis_connect.POOL_TIMEOUT_SECONDS) instead of failing.
    REDIS_MAX_CONNECTIONS: int = Field(default=200, ge=1, le=100_000)
    GRAPH_API_TOKEN: SecretStr | None = None
    LOG_LEVEL: str = "INFO"

    # ---- the audit trail (docs/audit.md) ----
    #: The Redis stream both services append AuditEvents to.
    AUDIT_STREAM: str = Field(default="vagent:audit", min_length=1, max_length=200)
    #: Bound by count: about this many events are kept (0: no count bound).
    AUDIT_STREAM_MAXLEN: int = Field(default=1_000_000, ge=0)
    #: Bound by time instead: events older than this many hours are trimmed (0: by count).
    AUDIT_STREAM_MAX_AGE_HOURS: float = Field(default=0, ge=0)
    #: Record message bodies and free-text tool arguments in audit metadata (off: their length).
    AUDIT_INCLUDE_CONTENT: bool = False

    # ---- files in the conversation (docs/attachments.md) ----
    #: The largest file the agent takes (bytes): the bot checks the declared size before it
    #: downloads and the bytes while it downloads; the graph checks what it receives.
    ATTACHMENT_MAX_BYTES: int = Field(default=20 * 1024 * 1024, ge=1024)
    #: Files one turn may use (the message's own, the one it replies to, ones kept before).
    ATTACHMENT_MAX_PER_TURN: int = Field(default=3, ge=1, le=16)

    # ---- traces and usage (docs/traces.md; the standard OTEL_* variables too) ----
    #: How long a TurnTrace (and the bot's answer -> turn index) is kept in Redis.
    TRACE_TTL_SECONDS: int = Field(default=7 * 24 * 3600, ge=60)
    #: Put prompt and answer text on OpenTelemetry spans (off: lengths only). Never credentials.
    OTEL_CAPTURE_CONTENT: bool = False

    # ---- scheduled tasks (docs/schedules.md) ----
    #: The zone times are read in for a user who set
    #: none (`!timezone`), jobs per user, the shortest interval of a recurring job, and how
    #: late a one-off missed while no bot ran may still run.
    SCHEDULE_DEFAULT_TZ: str = "UTC"
    SCHEDULE_MAX_PER_USER: int = Field(default=10, ge=0)
    SCHEDULE_MIN_INTERVAL_SECONDS: int = Field(default=900, ge=1)
    SCHEDULE_GRACE_SECONDS: int = Field(default=3600, ge=0)


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
    #: The openai SDK's retries of one LLM request (its default: 2): 408/409/429/5xx and
    #: connection errors, with exponential backoff, before any streamed chunk arrived.
    LLM_MAX_RETRIES: int = Field(default=2, ge=0, le=10)
    RUN_TIMEOUT_SECONDS: float = Field(default=600.0, gt=0)
    #: Text chunks after the first wait up to this long to share one SSE write (0: none wait).
    SSE_FLUSH_INTERVAL_MS: int = Field(default=50, ge=0, le=1000)
    #: The answer's text after its first piece leaves the model node once per window, as one
    #: `text_chunk` (0: one event per model chunk), and the model's socket is read once per
    #: window (models/read_pacing.py). The first text is never held. 100 ms: below what a
    #: reader notices and the bot's edit pacing, ~30% less graph CPU than 40 (bench/README.md).
    STREAM_COALESCE_MS: int = Field(default=100, ge=0, le=1000)
    #: A stream silent this long gets a keep-alive comment (proxies close idle connections).
    SSE_KEEPALIVE_SECONDS: float = Field(default=15.0, gt=0)

    # ---- documents and entities (docs/knowledge.md) ----
    #: OpenAI-compatible /v1/embeddings endpoint (OpenAI, Ollama, vLLM); unset: the packaged
    #: offline model (all-MiniLM-L6-v2, int8 ONNX).
    EMBEDDINGS_BASE_URL: str | None = None
    #: Model name at EMBEDDINGS_BASE_URL (required with it).
    EMBEDDINGS_MODEL: str | None = None
    #: API key of EMBEDDINGS_BASE_URL (unset: OPENAI_API_KEY if the URL is OPENAI_BASE_URL, else none).
    EMBEDDINGS_API_KEY: SecretStr | None = None
    EMBEDDINGS_TIMEOUT_SECONDS: float = Field(default=30.0, gt=0)
    #: Name of the RediSearch document index; its keys start with `{DOCS_INDEX}:`.
    DOCS_INDEX: str = Field(default="vagent_docs", pattern=r"^[A-Za-z0-9_]{1,64}$")
    #: `flat`: exact vector search (every allowed chunk is compared); `hnsw`: approximate.
    DOCS_VECTOR_ALGORITHM: Literal["flat", "hnsw"] = "flat"
    #: Chunks search_documents gives the model per search.
    SEARCH_TOP_K: int = Field(default=5, ge=1, le=20)
    #: Prefix of the per-domain FalkorDB graphs (`{ENTITY_GRAPH}:{domain}`).
    ENTITY_GRAPH: str = Field(default="vagent_kg", pattern=r"^[A-Za-z0-9_]{1,64}$")
    #: The Redis with the FalkorDB module that holds the entity graphs (REDIS_URL's forms);
    #: unset: REDIS_URL. Its own server, so a crash of the graph module cannot take the
    #: checkpoints, confirmations and audit stream with it (docs/deployment.md).
    ENTITY_REDIS_URL: str | None = None
    #: Token of the admin API (`/admin/v1/...`: document ingestion); unset: admin API off.
    GRAPH_ADMIN_TOKEN: SecretStr | None = None
    #: Largest document the admin API accepts.
    MAX_INGEST_BYTES: int = Field(default=20_000_000, ge=1024)

    # ---- per-user credentials for tools (docs/credentials.md) ----
    #: The Credential Registry; unset: tools that need a credential tell the user none is set up.
    CREDENTIAL_REGISTRY_URL: str | None = None
    #: Service token sent to the registry as `Authorization: Bearer ...` (if it asks for one).
    CREDENTIAL_REGISTRY_TOKEN: SecretStr | None = None
    CREDENTIAL_REGISTRY_TIMEOUT_SECONDS: float = Field(default=5.0, gt=0)
    #: Fernet key (`vagent admin genkey`) for the Redis credential cache; unset: no cache.
    CREDENTIAL_CACHE_KEY: SecretStr | None = None
    #: A cached credential is dropped this long before its `expires_at`.
    CREDENTIAL_CACHE_MARGIN_SECONDS: int = Field(default=60, ge=0)
    #: Longest a credential without `expires_at` stays cached.
    CREDENTIAL_CACHE_MAX_SECONDS: int = Field(default=900, ge=1)
    #: What a user without a credential is told to do (the operator's words).
    CREDENTIAL_MISSING_HELP: str = "Ask your administrator to add one for you in the credential registry."
    #: How often MCP servers' tool lists are read again (also the cap of the retry backoff of a
    #: server that is down).
    MCP_REFRESH_SECONDS: float = Field(default=300, ge=1)
    #: The longest MCP tool result the model reads; a longer one is cut, and it says so.
    MCP_RESULT_MAX_CHARS: int = Field(default=20_000, ge=100)
    #: Images one MCP result, and one turn, may post into the room; more are dropped (said so).
    MCP_MAX_IMAGES: int = Field(default=4, ge=0, le=32)
    #: Tools one MCP server may bring (the first ones as it lists them); more are not offered.
    MCP_MAX_TOOLS: int = Field(default=128, ge=1, le=1024)
    #: The function specs of one MCP server's tools, together, in characters (every model call
    #: carries them); tools beyond it are not offered.
    MCP_MAX_SCHEMA_CHARS: int = Field(default=200_000, ge=1000)
    #: One HTTP response of an MCP server; a larger one is not read on (the call fails).
    MCP_RESPONSE_MAX_BYTES: int = Field(default=16 * 1024 * 1024, ge=64 * 1024)
    #: The text of all files of one turn is cut to about this many tokens (it says so).
    ATTACHMENT_MAX_TOKENS: int = Field(default=8000, ge=100)
    #: Reading one file (a separate process, killed after this) may take this long.
    ATTACHMENT_PARSE_TIMEOUT_SECONDS: float = Field(default=30.0, gt=0)
    #: Memory the process reading one file may use (MiB); a zip bomb ends there, not the graph.
    ATTACHMENT_PARSE_MEMORY_MB: int = Field(default=1024, ge=128)
    #: `true`: images go to the model as image parts (a vision model is needed: docs/attachments.md).
    LLM_VISION: bool = False
    #: Images are scaled down to at most this many pixels on their longer side first.
    IMAGE_MAX_SIDE: int = Field(default=1568, ge=64, le=8192)
    #: An image a tool returns is posted into the room if it is at most this large (bytes).
    TOOL_IMAGE_MAX_BYTES: int = Field(default=5 * 1024 * 1024, ge=1024)
    #: The longest confirmation question (characters) that is asked; it shows every argument
    #: whole, so a call whose question would be longer is not asked and the model is told to
    #: shorten the arguments (docs/access-control.md, "Confirmations bind the action").
    CONFIRM_MAX_CHARS: int = Field(default=20_000, ge=1_000, le=1_000_000)
    #: The ticket service of the demo tools list_my_tickets / create_ticket; unset: tools off.
    TICKETS_URL: str | None = None
    #: A personal tool (acting with the user's own credential, or returning the user's own
    #: data) in a room where others read the answer: `ask` the user first, `allow` it, `deny` it.
    PERSONAL_RESULTS_IN_GROUPS: Literal["ask", "allow", "deny"] = "ask"
    #: Token budgets per user and tenant (YAML, docs/budgets.md); re-read when it changes.
    #: Unset: no limits (usage is still counted).
    BUDGETS_FILE: Path | None = None

    def llm_configured(self) -> bool:
        """A real LLM is used when a model or an endpoint/key is configured."""
        return bool(self.LLM_MODEL or self.OPENAI_BASE_URL or self.OPENAI_API_KEY)

    def entity_redis_url(self) -> str:
        """Where the entity graphs are: ENTITY_REDIS_URL, or REDIS_URL when it is unset."""
        return self.ENTITY_REDIS_URL or self.REDIS_URL


class BotSettings(CommonSettings):
    """Bot settings (documented in README.md)."""

    MATRIX_HOMESERVER: str = "http://127.0.0.1:8008"
    MATRIX_USER: str = "@vagent:localhost"
    MATRIX_PASSWORD: SecretStr | None = None
    #: Alternative to the password: an existing access token (its device is reused).
    MATRIX_ACCESS_TOKEN: SecretStr | None = None
    MATRIX_DEVICE_NAME: str = "vagent-bot"
    #: Persistent folder for the E2EE crypto store and the device id.
    MATRIX_STORE_PATH: Path = Path(".data/bot-store")
    GRAPH_API_ENDPOINT: str = "http://127.0.0.1:8000"
    #: Connections to the graph, so answers in flight at once (0: no cap); beyond, a message
    #: waits for a free connection up to the 10 s connect timeout.
    GRAPH_MAX_CONNECTIONS: int = Field(default=100, ge=0)
    ACCESS_CONTROL_PROVIDER_URL: str = "http://127.0.0.1:8090"
    ACP_TIMEOUT_SECONDS: float = Field(default=3.0, gt=0)
    AGENT_ID: str = "vagent"
    TENANT_STATE_EVENT_TYPE: str = "io.vagent.tenant"
    #: Domain for rooms without a tenant state event; unset = such rooms are denied.
    DEFAULT_DOMAIN: str | None = None
    COMMAND_PREFIX: str = "!ai"
    #: Who may invite the bot: user ids (@u:server) or server names (example.org); `*` = anyone.
    #: Empty = only users of the bot's own server.
    INVITE_ALLOWLIST: Annotated[list[str], NoDecode] = Field(default_factory=list)
    FLOOD_MAX_MESSAGES: int = Field(default=10, ge=1)
    FLOOD_WINDOW_SECONDS: float = Field(default=60.0, gt=0)
    MAX_MESSAGE_CHARS: int = Field(default=8000, ge=1)
    HITL_DEFAULT_TIMEOUT_SECONDS: int = Field(default=3600, gt=0)
    #: The first text is held this long; an answer complete by then is sent once, unedited.
    STREAM_HOLD_SECONDS: float = Field(default=0.1, ge=0, le=2)
    #: Typing notice only when no text has arrived by then (fast answers need none).
    TYPING_DELAY_SECONDS: float = Field(default=0.3, ge=0)
    EDIT_FIRST_DELAY_SECONDS: float = Field(default=0.5, ge=0)
    EDIT_MAX_INTERVAL_SECONDS: float = Field(default=4.0, gt=0)
    EDIT_MAX_COUNT: int = Field(default=30, ge=1)
    EVENT_DEDUP_TTL_SECONDS: int = Field(default=7 * 24 * 3600, ge=60)
    #: A claimed event is this bot's while it renews the lease (every third of it); a bot that
    #: dies mid-answer leaves its unfinished events to the next bot once the lease runs out.
    EVENT_LEASE_SECONDS: float = Field(default=15.0, ge=1)
    #: Events per room in one sync; more arrive as a `limited` sync and are backfilled.
    SYNC_TIMELINE_LIMIT: int = Field(default=100, ge=1, le=1000)
    BOT_HEALTH_HOST: str = "0.0.0.0"
    BOT_HEALTH_PORT: int = Field(default=8080, ge=1, le=65535)
    #: `on`: in a group room, documents are retrieved only if EVERY joined member may read them.
    AUDIENCE_FILTER: Literal["on", "off"] = "on"
    #: Rooms with more joined members than this use only documents tagged `public`.
    AUDIENCE_MAX_MEMBERS: int = Field(default=50, ge=2)
    #: Provider requests in flight at once while resolving a room's members.
    AUDIENCE_CONCURRENCY: int = Field(default=8, ge=1, le=100)
    #: A file download that receives nothing for this long is given up (a stalled server).
    ATTACHMENT_STALL_SECONDS: float = Field(default=20.0, gt=0)
    #: Voice messages: an OpenAI-compatible `/v1/audio/transcriptions` endpoint (base URL
    #: ending in /v1); unset: the bot says voice is not configured.
    STT_BASE_URL: str | None = None
    STT_MODEL: str = "whisper-1"
    STT_API_KEY: SecretStr | None = None
    STT_TIMEOUT_SECONDS: float = Field(default=60.0, gt=0)

    @field_validator("INVITE_ALLOWLIST", mode="before")
    @classmethod
    def _comma_list(cls, v: Any) -> Any:
        """`INVITE_ALLOWLIST=@alice:example.org,example.com` (a JSON list works too)."""
        if isinstance(v, str):
            v = v.strip()
            if v.startswith("["):
                import json

                return json.loads(v)
            return [p.strip() for p in v.split(",") if p.strip()]
        return v

    @property
    def server_name(self) -> str:
        return self.MATRIX_USER.partition(":")[2]


class GatewaySettings(CommonSettings):
    """Gateway settings (docs/gateway.md): LangGraph's server API in front of the graph, for
    SDK clients and web UIs. Names shared with the bot mean the same thing."""

    GATEWAY_HOST: str = "0.0.0.0"
    GATEWAY_PORT: int = Field(default=8100, ge=1, le=65535)
    #: The tenant (domain) of every gateway turn; unset: the provider's active domain.
    GATEWAY_TENANT: str | None = None
    #: A person's Matrix token is re-verified with the homeserver after at most this long.
    GATEWAY_TOKEN_CACHE_SECONDS: int = Field(default=60, ge=0, le=3600)
    #: Runs one person may have streaming at once (beyond: 429).
    GATEWAY_MAX_STREAMS_PER_USER: int = Field(default=4, ge=1, le=100)
    #: Browser origins (`https://chat.example.org`) whose pages may call the gateway (CORS):
    #: comma-separated or a JSON list; `*` = any; `[]` = none (no CORS headers at all). Any is
    #: safe as a default because callers prove who they are with a token in a header
    #: (`Authorization` / `X-Api-Key`), never a cookie: a page of another origin has no token
    #: the browser would add by itself, so no credentials mode is ever answered.
    GATEWAY_CORS_ORIGINS: Annotated[list[str], NoDecode] = Field(default_factory=lambda: ["*"])
    MATRIX_HOMESERVER: str = "http://127.0.0.1:8008"
    GRAPH_API_ENDPOINT: str = "http://127.0.0.1:8000"
    ACCESS_CONTROL_PROVIDER_URL: str = "http://127.0.0.1:8090"
    ACP_TIMEOUT_SECONDS: float = Field(default=3.0, gt=0)
    AGENT_ID: str = "vagent"
    FLOOD_MAX_MESSAGES: int = Field(default=10, ge=1)
    FLOOD_WINDOW_SECONDS: float = Field(default=60.0, gt=0)
    MAX_MESSAGE_CHARS: int = Field(default=8000, ge=1)
    MAX_REQUEST_BYTES: int = Field(default=1_000_000, ge=1024)

    @field_validator("GATEWAY_CORS_ORIGINS", mode="before")
    @classmethod
    def _origins(cls, v: Any) -> Any:
        """`GATEWAY_CORS_ORIGINS=https://a.example,https://b.example` (a JSON list works too);
        a trailing `/` is dropped, since a browser's `Origin` never has one."""
        if isinstance(v, str):
            v = v.strip()
            if v.startswith("["):
                import json

                v = json.loads(v)
            else:
                v = v.split(",")
        if isinstance(v, list):
            return [str(o).strip().rstrip("/") for o in v if str(o).strip()]
        return v
