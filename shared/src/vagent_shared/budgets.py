"""The budgets policy (`BUDGETS_FILE`, YAML, docs/budgets.md) and the usage record: the
only definition of both. Every key is optional; no file means no limit (usage is still
counted)."""

from __future__ import annotations

from datetime import UTC, date, datetime

from pydantic import BaseModel, ConfigDict, Field, computed_field


class Limit(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: Tokens (input + output, as the provider reported them) per UTC day.
    daily_tokens: int = Field(ge=0)


class BudgetPolicy(BaseModel):
    """```yaml
    default_user_daily_tokens: 200000        # users not listed below
    tenants:
      acme: {daily_tokens: 5000000}
    users:
      "@alice:example.org": {daily_tokens: 100000}
    llm_calls_per_turn: 12                   # beside the agent's max_turns
    ```"""

    model_config = ConfigDict(extra="forbid")

    default_user_daily_tokens: int | None = Field(default=None, ge=0)
    tenants: dict[str, Limit] = Field(default_factory=dict)
    users: dict[str, Limit] = Field(default_factory=dict)
    llm_calls_per_turn: int | None = Field(default=None, ge=1)

    def user_limit(self, user_id: str) -> int | None:
        """The user's daily tokens (None: unlimited)."""
        own = self.users.get(user_id)
        return own.daily_tokens if own is not None else self.default_user_daily_tokens

    def tenant_limit(self, tenant: str) -> int | None:
        own = self.tenants.get(tenant)
        return own.daily_tokens if own is not None else None


#: At this share of a user's budget the user is told, once that day.
NOTICE_SHARE = 0.8


def usage_day(when: datetime | None = None) -> date:
    """The UTC day usage is counted in."""
    return (when or datetime.now(UTC)).astimezone(UTC).date()


class UsageRow(BaseModel):
    """One user's (or one tenant's) tokens on one UTC day: `vagent usage`, `/admin/v1/usage`."""

    day: date
    tenant: str = ""
    user_id: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    llm_calls: int = 0

    @computed_field  # type: ignore[prop-decorator]  # in the JSON too (`--json`, the admin API)
    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens
