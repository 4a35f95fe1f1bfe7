"""`vagent`: the operators' one command, shipped in the graph image (and in the venv).

    vagent docs ...     documents and entities: ingest, list, delete, status, reindex (docs.py)
    vagent audit ...    read the audit trail: tail, export (audit.py)
    vagent trace ...    how a turn came about: show, list (trace.py)
    vagent admin ...    forget a user (GDPR), make a credential-cache key (admin.py)
    vagent memory ...   what the agent remembers about a user: list, delete (memory.py)
    vagent schedules ... every user's scheduled tasks: list, delete (schedules.py)
    vagent usage        tokens per day, tenant and user (usage.py)

One command rather than one per job, so that `vagent --help` shows a newcomer everything
there is, and one completion script (`vagent --install-completion`) covers all of it. Every
level answers --help (or -h). Help and errors are plain text, not rich panels: they end up in
CI and kubectl logs and are read by scripts and tests; results and messages go through
output.py. Usage errors exit 2, as Click's do.
"""

from __future__ import annotations

from collections.abc import Sequence

import typer

from vagent_graph.cli import admin, audit, docs, memory, schedules, trace, usage

app = typer.Typer(
    name="vagent",
    help="Operate vagent: its documents, its audit trail, its users' data.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(docs.app, name="docs")
app.add_typer(audit.app, name="audit")
app.add_typer(trace.app, name="trace")
app.add_typer(admin.app, name="admin")
app.add_typer(memory.app, name="memory")
app.add_typer(schedules.app, name="schedules")
app.command("usage", short_help="Tokens per day, tenant and user.")(usage.usage)


def main(argv: Sequence[str] | None = None) -> None:
    """The console script; `argv` (default: the process' arguments) lets tests call it.
    Always ends with SystemExit, carrying the exit code."""
    app(args=None if argv is None else list(argv), prog_name="vagent")
