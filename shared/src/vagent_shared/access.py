"""The access-control context sent by the external AccessControlProvider (.NET).

Decisions use the ACTIVE roles in the ACTIVE domain only; roles held in other
domains, or held but not active, grant nothing. A superuser bypasses checks.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from pydantic import AliasChoices, BaseModel, ConfigDict, Field


class Resource(StrEnum):
    """Kinds of protected resources; an instance string is `{kind}:{name}`."""

    AGENT = "agent"
    TOOL = "tool"
    DOCUMENT = "document"
    DOCUMENT_CATEGORY = "document_category"
    DOCUMENT_TAG = "document_tag"
    ENTITY = "entity"
    ENTITY_TYPE = "entity_type"
    ENTITY_TAG = "entity_tag"
    #: Every tool of one MCP server (`mcp_server:calendar`), beside `tool:calendar__x` per tool.
    MCP_SERVER = "mcp_server"

    def instance(self, name: str) -> str:
        if not name or any(c.isspace() for c in name):
            raise ValueError(f"invalid {self.value} name {name!r}")
        return f"{self.value}:{name}"

    @classmethod
    def parse(cls, instance: str) -> tuple[Resource, str]:
        kind, sep, name = instance.partition(":")
        if not sep or not name:
            raise ValueError(f"invalid resource instance {instance!r}")
        return cls(kind), name


def agent(name: str) -> str:
    return Resource.AGENT.instance(name)


def tool(name: str) -> str:
    return Resource.TOOL.instance(name)


def document(name: str) -> str:
    return Resource.DOCUMENT.instance(name)


def document_category(name: str) -> str:
    return Resource.DOCUMENT_CATEGORY.instance(name)


def document_tag(name: str) -> str:
    return Resource.DOCUMENT_TAG.instance(name)


def entity(name: str) -> str:
    return Resource.ENTITY.instance(name)


def entity_type(name: str) -> str:
    return Resource.ENTITY_TYPE.instance(name)


def entity_tag(name: str) -> str:
    return Resource.ENTITY_TAG.instance(name)


def mcp_server(name: str) -> str:
    return Resource.MCP_SERVER.instance(name)


def instance_matches(granted: str, wanted: str) -> bool:
    """A grant is an exact instance or a kind wildcard such as `tool:*`. Nothing else is a
    pattern: `document:q3:*` grants only the document whose id is literally `q3:*`."""
    if granted == wanted:
        return True
    kind, _, name = granted.partition(":")
    return name == "*" and wanted.partition(":")[0] == kind


class RoleGrant(BaseModel):
    """One role in one domain and the resource instances it grants."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)

    name: str = Field(min_length=1)
    instances: list[str] = Field(default_factory=list)


class AcContext(BaseModel):
    """Who the user is and what they may touch, as the provider answers it.

    Accepts the provider's camelCase JSON and snake_case; serialises to camelCase.
    """

    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)

    user_id: str = Field(
        min_length=1, validation_alias=AliasChoices("userId", "user_id"), serialization_alias="userId"
    )
    active_acl_domain: str = Field(
        min_length=1,
        validation_alias=AliasChoices("activeAclDomain", "active_acl_domain"),
        serialization_alias="activeAclDomain",
    )
    active_roles: list[str] = Field(
        default_factory=list,
        validation_alias=AliasChoices("activeRoles", "active_roles"),
        serialization_alias="activeRoles",
    )
    superuser_groups: list[str] = Field(
        default_factory=list,
        validation_alias=AliasChoices("superuserGroups", "superuser_groups"),
        serialization_alias="superuserGroups",
    )
    roles: dict[str, list[RoleGrant]] = Field(default_factory=dict)

    def to_wire(self) -> dict[str, object]:
        return self.model_dump(by_alias=True, mode="json")

    def is_superuser(self) -> bool:
        """The provider lists the superuser groups the user belongs to; any makes a superuser."""
        return any(g.strip() for g in self.superuser_groups)

    def _active_grants(self, roles: Iterable[str], domain: str | None = None) -> list[RoleGrant]:
        wanted = set(roles) & set(self.active_roles)
        grants = self.roles.get(domain or self.active_acl_domain, [])
        return [g for g in grants if g.name in wanted]

    def get_instances_for_roles(self, roles: Iterable[str]) -> set[str]:
        """Instances granted by those of `roles` that are active, in the active domain."""
        out: set[str] = set()
        for grant in self._active_grants(roles):
            out.update(grant.instances)
        return out

    def granted_instances(self) -> set[str]:
        return self.get_instances_for_roles(self.active_roles)

    def has_role(self, role: str, instance: str, domain: str | None = None) -> bool:
        """True if active `role` grants `instance` in `domain` (default: the active one)."""
        if self.is_superuser():
            return True
        return any(
            instance_matches(i, instance) for g in self._active_grants([role], domain) for i in g.instances
        )

    def can_access(self, instance: str) -> bool:
        """The one question every check asks: superuser, or an active role grants it."""
        if self.is_superuser():
            return True
        return any(instance_matches(i, instance) for i in self.granted_instances())
