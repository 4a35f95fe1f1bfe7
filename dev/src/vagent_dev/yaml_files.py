"""Configuration files of the development stand-ins (`vagent-acp`, `vagent-credentials`,
`vagent-tickets`): a YAML file validated into a pydantic model, and, for the policies, the
same file re-read whenever it changes on disk.

Why one copy: every stand-in must fail the same way on a bad file: a message that says
where, never quotes the file's content (the credential policy and the ticket seed hold
secrets, and PyYAML's error would show the broken line), and, once running, a broken edit
that is not papered over with the previous version (that could keep a revoked grant alive).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Generic, TypeVar

import structlog
import yaml
from pydantic import BaseModel, BeforeValidator, ValidationError

from vagent_shared.validation import Loc, dotted, problems

log = structlog.get_logger(__name__)

M = TypeVar("M", bound=BaseModel)
#: A Matrix user id as the stand-ins' files write it (`@name:server`).
MATRIX_USER_ID = re.compile(r"^@[^:\s]+:\S+$")
T = TypeVar("T")


def _empty_list(v: Any) -> Any:
    return [] if v is None else v


def _empty_map(v: Any) -> Any:
    return {} if v is None else v


#: A list / map in a stand-in's YAML file. `key:` with nothing after it is null in YAML;
#: people write it for "none" (a role granting nothing, a user without keys), so it reads
#: as empty instead of failing validation.
YamlList = Annotated[list[T], BeforeValidator(_empty_list)]
YamlMap = Annotated[dict[str, T], BeforeValidator(_empty_map)]
#: A section read into a model of its own (all of whose fields have defaults), likewise.
YamlBlock = Annotated[T, BeforeValidator(_empty_map)]


class FileError(ValueError):
    """The file is missing, not YAML, or does not validate; the message says where."""


def yaml_problem(exc: yaml.YAMLError) -> str:
    """Where the YAML is broken, without PyYAML's snippet of the line."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem or exc.context}"
    return type(exc).__name__


def load_yaml_model(
    path: Path | str,
    model: type[M],
    what: str,
    error: type[FileError] = FileError,
    where: Callable[[Loc], str] | None = None,
) -> M:
    """`path` validated as `model` (an empty file is an empty mapping); `error` names the
    problem and its place (`where` renders a validation error's location; default: the dotted
    path, or `what`)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise error(f"{path}: cannot read {what}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML: {yaml_problem(exc)}") from None
    try:
        return model.model_validate({} if raw is None else raw)
    except ValidationError as exc:
        found = problems(exc, where or (lambda loc: dotted(loc) or what))
        raise error(f"{path}: invalid {what}: {found}") from None


class ReloadingFile(Generic[M]):
    """A file loaded by `load`, re-read when its mtime, size or inode changes. `current()`
    raises the loader's FileError while the file is invalid; `describe` gives the fields of
    the `policy_loaded` log line."""

    def __init__(
        self,
        path: Path,
        load: Callable[[Path], M],
        describe: Callable[[M], dict[str, Any]] = lambda _: {},
        error: type[FileError] = FileError,
    ) -> None:
        self.path, self._load, self._describe, self._error_type = path, load, describe, error
        self._sig: tuple[int, int, int] | None = None
        self._value: M | None = None
        self._error = "not loaded"
        self.current()  # an invalid file at startup is a startup error

    def current(self) -> M:
        """The valid content as the file is now."""
        try:
            st = os.stat(self.path)
        except OSError as exc:
            self._sig = None
            self._fail(f"{self.path}: cannot read policy: {exc.strerror or exc}")
            raise self._error_type(self._error) from None
        sig = (st.st_mtime_ns, st.st_size, st.st_ino)
        if sig != self._sig:
            self._sig = sig
            try:
                self._value = self._load(self.path)
            except FileError as exc:
                self._fail(str(exc))
            else:
                log.info("policy_loaded", policy_file=str(self.path), **self._describe(self._value))
        if self._value is None:
            raise self._error_type(self._error)
        return self._value

    def _fail(self, error: str) -> None:
        """Log a new problem once (not on every request while it lasts)."""
        if self._value is not None or error != self._error:
            log.error("policy_invalid", policy_file=str(self.path), error=error)
        self._value, self._error = None, error
