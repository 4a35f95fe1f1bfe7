"""Demo tools acting on a ticket service AS the asking user, with that user's own API key
from the Credential Registry (resource `tickets`). The key reaches this module only in
`ToolContext.credential` and leaves it only in a request header (services/credentials.py).

`create_ticket` is confirmed by the user first; the key is fetched after the answer, at
run time, so a confirmation that waits for hours (or across a restart) still uses a key
that is valid when the ticket is created.
"""

from __future__ import annotations

from typing import Any, Literal

import httpx
import structlog
from pydantic import BaseModel, Field

from vagent_graph.services.credentials import credential_auth
from vagent_graph.services.tickets import TicketService
from vagent_graph.tools.base import Prepared, Tool, ToolContext

log = structlog.get_logger(__name__)

RESOURCE = "tickets"
UNAVAILABLE = "The ticket service is unavailable right now; try again later."


class ListTicketsArgs(BaseModel):
    status: Literal["open", "closed", "all"] = Field(
        default="open", description="Which of the user's tickets: open (default), closed or all."
    )


class CreateTicketArgs(BaseModel):
    title: str = Field(min_length=1, max_length=200, description="A short summary of the problem.")
    description: str = Field(default="", max_length=4000, description="Details, in the user's words.")
    priority: Literal["low", "normal", "high"] = "normal"


def format_tickets(tickets: list[dict[str, Any]], status: str) -> str:
    if not tickets:
        return f"You have no {status} tickets." if status != "all" else "You have no tickets."
    lines = [
        f"Your {status} tickets ({len(tickets)}):" if status != "all" else f"Your tickets ({len(tickets)}):"
    ]
    for t in tickets:
        lines.append(
            f"- {t.get('id')}: {t.get('title')} ({t.get('status')}, {t.get('priority')} priority, "
            f"opened {str(t.get('created_at', ''))[:10]})"
        )
    return "\n".join(lines)


async def _call(ctx: ToolContext, method: str, path: str, **kwargs: Any) -> httpx.Response | str:
    """The request, authenticated as the user; a failure is the text the model reads."""
    if ctx.credential is None:  # the workflow fetches it for requires_credentials tools
        return "No credential for the ticket service was provided; nothing was done."
    service = ctx.services.get(TicketService)
    try:
        resp = await service.client.request(method, path, auth=credential_auth(ctx.credential), **kwargs)
    except httpx.HTTPError as exc:
        log.warning("ticket_service_unreachable", error=type(exc).__name__)
        return UNAVAILABLE
    if resp.status_code in (401, 403):
        return "The ticket service rejected your credential; ask your administrator to renew it."
    if resp.status_code >= 500:
        return UNAVAILABLE
    return resp


async def _list(args: ListTicketsArgs, ctx: ToolContext, _: str | None) -> str:
    resp = await _call(ctx, "GET", "/api/v1/tickets", params={"status": args.status})
    if isinstance(resp, str):
        return resp
    if resp.status_code != 200:
        return f"The ticket service could not list tickets (HTTP {resp.status_code})."
    return format_tickets(list(resp.json().get("tickets", [])), args.status)


async def _prepare_create(args: CreateTicketArgs, ctx: ToolContext) -> Prepared:
    """The headline only: the question lists every field the ticket will get (confirmation.py)."""
    return Prepared(action="Create this ticket in the ticket service, in your name")


def _listed(args: ListTicketsArgs) -> str:
    return "all your tickets" if args.status == "all" else f"your {args.status} tickets"


async def _create(args: CreateTicketArgs, ctx: ToolContext, _: str | None) -> str:
    resp = await _call(ctx, "POST", "/api/v1/tickets", json=args.model_dump())
    if isinstance(resp, str):
        return resp
    if resp.status_code != 201:
        return f"The ticket service did not create the ticket (HTTP {resp.status_code})."
    t = resp.json()
    return f"Created ticket {t.get('id')}: {t.get('title')} ({t.get('priority')} priority)."


TOOLS = [
    Tool(
        name="list_my_tickets",
        description="List the user's own tickets in the ticket service (open ones by default).",
        args_model=ListTicketsArgs,
        run=_list,
        requires_credentials=True,
        credential_resource=RESOURCE,
        personal_label=_listed,
        shows=("status",),
    ),
    Tool(
        name="create_ticket",
        description="Open a ticket in the ticket service in the user's name. The user must confirm.",
        args_model=CreateTicketArgs,
        prepare=_prepare_create,
        run=_create,
        requires_confirmation=True,
        requires_credentials=True,
        credential_resource=RESOURCE,
        personal_label=lambda args: "the new ticket",
    ),
]
