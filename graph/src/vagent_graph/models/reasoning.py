"""A reasoning model's thinking never reaches the room, nor the history sent back to it.

Reasoning models show their thinking in one of two ways (docs/attachments.md, "Reasoning
models"): inline, as a `<think>…</think>` block at the start of the content (DeepSeek R1,
Qwen3 and gpt-oss through Ollama or llama.cpp), or beside it, as `reasoning_content` deltas
(vLLM's and DeepSeek's API). langchain-openai's ChatOpenAI drops `reasoning_content`
altogether (its documented scope: "non-standard response fields … are not extracted or
preserved"), and sends no reasoning back; `ThinkingChatOpenAI` keeps only the fact that
the model is reasoning (`REASONING_MARK`, no text), so the stream can say "thinking…".
Inline blocks are cut from the stream as it arrives (`ThinkFilter`, tags split across
chunks included) and from the final message (`without_reasoning`) before it is
checkpointed, so the history never carries them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGenerationChunk
from langchain_openai import ChatOpenAI

#: additional_kwargs key on a streamed chunk whose delta carried reasoning (the text is dropped).
REASONING_MARK = "vagent_reasoning"
#: What the user sees while the model reasons before its first answer token.
THINKING_STATUS = "thinking…"
_OPEN, _CLOSE = ("<think>", "<thinking>"), ("</think>", "</thinking>")
_BLOCK = re.compile(r"<(think|thinking)>.*?(?:</\1>|\Z)\s*", re.DOTALL)
_ORPHAN_CLOSE = re.compile(r"\A.*?</(?:think|thinking)>\s*", re.DOTALL)


@dataclass
class ThinkFilter:
    """Feed streamed text pieces; get back only what is outside `<think>` blocks.

    A tag may be split across pieces, so a tail that could still become one is held back
    until the next piece (or `flush`) decides. White space right after a block is dropped
    (models put a blank line between their thinking and the answer).
    """

    inside: bool = False
    _held: str = ""
    _after_block: bool = False

    def feed(self, piece: str) -> str:
        text, self._held = self._held + piece, ""
        out: list[str] = []
        while text:
            tags = _CLOSE if self.inside else _OPEN
            at, tag = _find_first(text, tags)
            if at < 0:
                keep = _partial_tag_tail(text, tags)
                body, self._held = (text[:-keep], text[-keep:]) if keep else (text, "")
                if not self.inside:
                    out.append(self._visible(body))
                break
            if not self.inside:
                out.append(self._visible(text[:at]))
            self.inside = not self.inside
            self._after_block = not self.inside
            text = text[at + len(tag) :]
        return "".join(out)

    def flush(self) -> str:
        """The end of the message: a held tail that never became a tag is text after all."""
        held, self._held = self._held, ""
        return "" if self.inside else self._visible(held)

    def _visible(self, text: str) -> str:
        if self._after_block:
            text = text.lstrip()
            if text:
                self._after_block = False
        return text


def _find_first(text: str, tags: tuple[str, ...]) -> tuple[int, str]:
    found = [(i, t) for t in tags if (i := text.find(t)) >= 0]
    return min(found) if found else (-1, "")


def _partial_tag_tail(text: str, tags: tuple[str, ...]) -> int:
    """How many characters at the end of `text` could be the start of one of `tags`."""
    for n in range(min(len(text), max(len(t) for t in tags) - 1), 0, -1):
        if any(t.startswith(text[-n:]) for t in tags):
            return n
    return 0


def strip_reasoning(text: str) -> str:
    """The answer without its `<think>` blocks; an unclosed block (a model cut off while
    thinking) leaves nothing. A lone `</think>` (some chat templates open the block in the
    prompt) ends a block that started with the text."""
    if "</think" in text and not re.search(r"<think(?:ing)?>", text):
        text = _ORPHAN_CLOSE.sub("", text, count=1)
    return _BLOCK.sub("", text).strip() if "<think" in text else text


def without_reasoning(ai: AIMessage) -> AIMessage:
    """The message as it goes into the history: no `<think>` text, no reasoning fields."""
    kwargs = {k: v for k, v in ai.additional_kwargs.items() if k not in (REASONING_MARK, "reasoning_content")}
    content: Any = ai.content
    if isinstance(content, str):
        content = strip_reasoning(content)
    else:
        content = [
            {**p, "text": strip_reasoning(str(p.get("text", "")))}
            if isinstance(p, dict) and "text" in p
            else p
            for p in content
            if not (isinstance(p, dict) and p.get("type") in ("reasoning", "thinking"))
        ]
    if content == ai.content and kwargs == ai.additional_kwargs:
        return ai
    return ai.model_copy(update={"content": content, "additional_kwargs": kwargs})


class ThinkingChatOpenAI(ChatOpenAI):
    """ChatOpenAI that notes, without keeping the text, that a streamed delta carried
    `reasoning_content` (or `reasoning`, as some servers name it)."""

    def _convert_chunk_to_generation_chunk(
        self,
        chunk: dict[str, Any],
        default_chunk_class: type,
        base_generation_info: dict[str, Any] | None,
    ) -> ChatGenerationChunk | None:
        generation = super()._convert_chunk_to_generation_chunk(
            chunk, default_chunk_class, base_generation_info
        )
        if generation is not None and _delta_reasons(chunk):
            generation.message.additional_kwargs[REASONING_MARK] = True
        return generation


def _delta_reasons(chunk: dict[str, Any]) -> bool:
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    if not choices or not isinstance(choices[0], dict):
        return False
    delta = choices[0].get("delta")
    return isinstance(delta, dict) and delta_reasons(delta)


def delta_reasons(delta: dict[str, Any]) -> bool:
    """A streamed delta carries reasoning (its text is never kept)."""
    return any(isinstance(delta.get(k), str) and delta[k] for k in ("reasoning_content", "reasoning"))
