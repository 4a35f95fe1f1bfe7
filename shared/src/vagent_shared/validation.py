"""What a pydantic ValidationError says, for a person: each problem as `place: message`.

Why not `str(exc)`: pydantic's own text quotes the input, which may be a secret (a token in
a URL, a credential in a policy file, a tool argument)."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import ValidationError

Loc = tuple[int | str, ...]


def dotted(loc: Loc) -> str:
    return ".".join(str(p) for p in loc)


def problems(exc: ValidationError, place: Callable[[Loc], str] = dotted) -> str:
    """Every problem of `exc` as `place: message`, joined with "; "; never the input."""
    return "; ".join(f"{place(e['loc'])}: {e['msg']}" for e in exc.errors())
