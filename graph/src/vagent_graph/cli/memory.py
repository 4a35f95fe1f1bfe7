"""`vagent memory`: what the agent remembers about one user, for operators (docs/memory.md).

    vagent memory list USER_ID [--json]
    vagent memory delete USER_ID [ID] [--yes]

`list` prints every memory of the user, in every tenant, oldest first: its id, tenant, date,
room, who heard it (how many people, or "everywhere"), how it was written and its text. The
text is shown on purpose: it is what an operator needs to judge an erasure request, and this
command is theirs alone (never the audit trail's, a trace's or a log's). `--json` prints one
Memory a line.

`delete` deletes one memory by its id, or all of the user's memories (every tenant) without
one, after asking (`--yes` does not ask: for scripts). Each deletion writes one
`memory_deleted` audit record (ids and count, reason "operator", never the text).
`vagent admin forget` deletes a user's memories too, with the rest of their data.

Reads the graph's settings (REDIS_URL, EMBEDDINGS_*: the store's vector index is the one the
graph uses). Exit codes: 0 done, 1 no such memory, not confirmed or Redis refused a command,
2 bad usage or Redis unreachable.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from redis.asyncio import Redis

from vagent_graph.cli.common import load_settings, on_redis
from vagent_graph.cli.output import cell, complain, header, plural, printable, say
from vagent_graph.state.erasure import valid_user_id
from vagent_shared.audit import AuditEvent
from vagent_shared.audit_trail import stream_bounds
from vagent_shared.memory import Memory
from vagent_shared.settings import GraphSettings

if TYPE_CHECKING:  # loaded when a command runs (see with_store)
    from vagent_graph.memory.store import MemoryStore

PROG = "vagent memory"
#: The audit record's reason: deleted by an operator (the graph's are `forget_all`, ...).
REASON = "operator"
#: Ids named in one `memory_deleted` record at most (the count is always exact).
AUDIT_IDS = 20
T = TypeVar("T")

app = typer.Typer(
    help="What the agent remembers about a user: list, delete (docs/memory.md).",
    short_help="A user's memories: list, delete.",
    no_args_is_help=True,
)


class NotConfirmed(Exception):
    """The operator did not confirm a deletion."""


class NoSuchMemory(Exception):
    """No memory of the user has that id."""


# ---- the text (pure) ---------------------------------------------------------------------------


def heard(memory: Memory) -> str:
    """Where a memory may be heard, in short: "everywhere", or how many people heard it."""
    if memory.everywhere:
        return "everywhere"
    return plural(len(memory.heard_by), "person", "people")


#: (title, width) of `list`'s columns; the text, last, is never cut.
COLUMNS: tuple[tuple[str, int], ...] = (
    ("ID", 12),
    ("TENANT", 12),
    ("DATE (UTC)", 16),
    ("ROOM", 24),
    ("HEARD BY", 10),
    ("ORIGIN", 7),
    ("TEXT", 0),
)


def table_row(m: Memory) -> str:
    """One memory, in COLUMNS' order; its whole text last (printable: one line)."""
    values = (
        m.id,
        m.domain or "-",
        m.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M"),
        m.room_id or "-",
        heard(m),
        m.origin,
    )
    cells = [cell(v, w).ljust(w) for v, (_, w) in zip(values, COLUMNS[:-1], strict=True)]
    return "  ".join([*cells, printable(m.text)])


def deleted_event(owner: str, ids: Sequence[str], count: int) -> AuditEvent:
    """The record a deletion leaves: whose, which ids (the first AUDIT_IDS) and how many;
    never the text."""
    return AuditEvent(
        service="admin",
        user_id=owner,
        event_type="memory_deleted",
        resource="memory",
        decision="done",
        reason=REASON,
        metadata={"ids": list(ids[:AUDIT_IDS]), "count": count},
    )


# ---- Redis -------------------------------------------------------------------------------------


def with_store(work: Callable[[MemoryStore, Redis, GraphSettings], Awaitable[T]]) -> T:
    """Run `work` on the memory store, turning failures into one line and the exit code."""
    settings = load_settings(PROG, GraphSettings)
    # The store (and the embedding stack under it) loads only when a command runs.
    from vagent_graph.knowledge.embeddings import make_embedder
    from vagent_graph.memory.store import MemoryStore

    try:
        embedder = make_embedder(settings)  # the model itself loads only if a text is embedded
    except ValueError as exc:
        complain(PROG, f"invalid settings: {exc}")
        raise typer.Exit(2) from None

    async def run(redis: Redis) -> T:
        store = MemoryStore(redis, embedder)
        try:
            await store.setup()
            return await work(store, redis, settings)
        finally:
            await store.aclose()

    return on_redis(PROG, settings.REDIS_URL, run)


async def record_deleted(redis: Redis, settings: GraphSettings, event: AuditEvent) -> None:
    """Append the record to the audit stream (as `vagent admin forget` does: the command
    waits for it, so the operator knows it is on record)."""
    bounds = stream_bounds(settings.AUDIT_STREAM_MAXLEN, settings.AUDIT_STREAM_MAX_AGE_HOURS * 3600)
    await redis.xadd(settings.AUDIT_STREAM, event.to_stream(), **bounds)  # type: ignore[arg-type]


# ---- the command line --------------------------------------------------------------------------


def _user(text: str) -> str:
    if not valid_user_id(text):
        raise typer.BadParameter(f"{text!r} is not a Matrix user id (@name:server)")
    return text


UserArg = Annotated[
    str, typer.Argument(parser=_user, metavar="USER_ID", help="the Matrix user id, @name:server")
]


@app.command("list", short_help="Every memory of a user, with its text.")
def list_(
    user_id: UserArg,
    as_json: Annotated[bool, typer.Option("--json", help="JSON, one memory per line")] = False,
) -> None:
    """Every memory of the user, in every tenant, oldest first, with its text."""

    async def work(store: MemoryStore, _redis: Redis, _settings: GraphSettings) -> list[Memory]:
        return await store.all_of(user_id, None)

    memories = with_store(work)
    if as_json:
        for m in memories:
            say(m.model_dump_json())
        return
    if not memories:
        say(f"No memories of {printable(user_id)}.")
        return
    say(header(COLUMNS))
    for m in memories:
        say(table_row(m))
    say(f"{plural(len(memories), 'memory', 'memories')} of {printable(user_id)}.")


@app.command(short_help="Delete one memory of a user, or all of them.")
def delete(
    user_id: UserArg,
    memory_id: Annotated[
        str | None, typer.Argument(metavar="ID", help="the memory's id (`list` shows it); none: all of them")
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
) -> None:
    """Delete one memory of the user (by its id), or all of them in every tenant."""

    def confirmed(question: str) -> None:
        if yes:
            return
        try:
            answer = typer.confirm(question, default=False)
        except typer.Abort:  # end of input, Ctrl-C
            answer = False
        if not answer:
            raise NotConfirmed

    async def work(store: MemoryStore, redis: Redis, settings: GraphSettings) -> int:
        mine = await store.all_of(user_id, None)
        if memory_id is not None:
            found = [m for m in mine if m.id == memory_id]
            if not found:
                raise NoSuchMemory
            confirmed(f"Delete this memory of {printable(user_id)}: {printable(found[0].text)!r}?")
            count = await store.delete(user_id, None, [memory_id])
            ids = [memory_id]
        else:
            if not mine:
                return 0
            confirmed(
                f"Delete all {plural(len(mine), 'memory', 'memories')} of {printable(user_id)} "
                "(every tenant)?"
            )
            count = await store.delete_all(user_id, None)
            ids = [m.id for m in mine]
        if count:
            await record_deleted(redis, settings, deleted_event(user_id, ids, count))
        return count

    try:
        count = with_store(work)
    except NotConfirmed:
        complain(PROG, "not confirmed; nothing was deleted")
        raise typer.Exit(1) from None
    except NoSuchMemory:
        complain(
            PROG,
            f"{printable(user_id)} has no memory {printable(memory_id or '')!r} "
            "(`vagent memory list` shows them)",
        )
        raise typer.Exit(1) from None
    say(f"Deleted {plural(count, 'memory', 'memories')} of {printable(user_id)}.")
