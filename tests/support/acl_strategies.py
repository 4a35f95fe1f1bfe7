"""Hypothesis strategies for access contexts and room audiences, shared by the property tests
of the document filter and of the entity filter (they differ only in the grants they draw)."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from vagent_shared.access import AcContext
from vagent_shared.knowledge import PUBLIC_TAG, Audience, AudienceMember

#: Tags a grant or a record may carry: the public tag and its look-alikes, and Redis query
#: syntax (`|`, `}`, a leading `-`, `*`, spaces) that must neither widen nor break a filter.
ADVERSARIAL_TAGS = [
    PUBLIC_TAG,
    "Public",
    "confidential",
    "with space",
    "a|b",
    "x}y",
    "-neg",
    "star*",
    "*",
    "pub*",
    "日本",
]


@st.composite
def contexts(
    draw: st.DrawFn,
    grants: st.SearchStrategy[str],
    domains: Sequence[str],
    domain: str | None = None,
    *,
    superuser_one_in: int = 20,
    empty_one_in: int = 0,
) -> AcContext:
    """A user in `domain` (else a drawn one) whose active role holds drawn `grants`, with an
    inactive role and a role in another domain that must grant nothing; a superuser one
    time in `superuser_one_in`, a reader with no grant at all one time in `empty_one_in`."""
    active = domain or draw(st.sampled_from(list(domains)))
    other = draw(st.sampled_from([d for d in domains if d != active]))
    empty = empty_one_in > 0 and draw(st.integers(0, empty_one_in - 1)) == 0
    return AcContext.model_validate(
        {
            "userId": f"@{draw(st.integers(0, 999))}:x",
            "activeAclDomain": active,
            "activeRoles": ["reader"],
            "superuserGroups": ["admins"] if draw(st.integers(0, superuser_one_in - 1)) == 0 else [],
            "roles": {
                active: [
                    {"name": "reader", "instances": [] if empty else draw(st.lists(grants, max_size=6))},
                    {"name": "inactive", "instances": draw(st.lists(grants, max_size=3))},
                ],
                other: [{"name": "reader", "instances": draw(st.lists(grants, max_size=4))}],
            },
        }
    )


@st.composite
def audiences(
    draw: st.DrawFn, grants: st.SearchStrategy[str], domains: Sequence[str], domain: str
) -> Audience | None:
    """None (a DM) half the time; else up to three other members, now and then one the provider
    could not answer for or one from another domain, and now and then a too-large room."""
    if draw(st.booleans()):
        return None
    members = []
    for i in range(draw(st.integers(0, 3))):
        kind = draw(st.integers(0, 9))
        ctx = None if kind == 0 else draw(contexts(grants, domains, None if kind == 1 else domain))
        members.append(AudienceMember(user_id=f"@m{i}:x", ac_context=ctx))
    return Audience(members=members, public_only=draw(st.integers(0, 4)) == 0, member_count=len(members) + 2)
