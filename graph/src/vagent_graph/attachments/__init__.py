"""Files a user attaches to a message: read in a process of their own (reading.py,
worker.py), then turned into what the model sees (content.py).

Why the names are loaded on first use: `python -m vagent_graph.attachments.worker` imports
this package first, and the worker must start fast (it should not load structlog and the
settings it never uses).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vagent_graph.attachments.content import describe, shown_texts, turn_content
    from vagent_graph.attachments.files import ReadFile
    from vagent_graph.attachments.reading import ReadLimits, Refused, read_attachment

__all__ = ["ReadFile", "ReadLimits", "Refused", "describe", "read_attachment", "shown_texts", "turn_content"]

_MODULES = {
    "ReadFile": "files",
    "ReadLimits": "reading",
    "Refused": "reading",
    "read_attachment": "reading",
    "describe": "content",
    "turn_content": "content",
    "shown_texts": "content",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # looked up once
    return value
