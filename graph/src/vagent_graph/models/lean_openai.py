"""Send chat completions through the openai SDK's client, without its per-chunk models and
its client-side request transform.

Why (measured): ``make bench-capacity`` (bench/README.md, "Conclusion on the four
modules") ran the graph service with and without this module behind a model paced like a
hosted one: with it, one process carries **+44-46% more conversations per core** (CPU per
conversation, current/with-it, median of the per-step ratios: 1.44 with all of 7ba0554's
modules, 1.46 with this module alone; the other removed modules together: +2%, noise).
Nearly all of it is the streamed chunks: **~320 vs ~443 µs of graph CPU per model chunk
relayed** (all costs included; 39 vs 53 ms per 120-chunk turn). By issue 14's rule (a
bypass of library internals stays only if it buys >= 10% more conversations at the same
p99) it stays; json_route.py, locked_read.py and upstream.py did not and are gone.

What it skips:

* Per streamed chunk, the SDK builds a pydantic ``ChatCompletionChunk`` (``construct_type``)
  that langchain-openai ``model_dump()``s straight back to a dict. Here the chunks stay the
  parsed JSON dicts (``_ChunkDict``), with the few keys langchain-openai indexes directly
  filled in as ``model_dump`` would.
* Per request, ``AsyncCompletions.create`` runs ``async_maybe_transform(body,
  CompletionCreateParams…)`` (``openai/_utils/_transform.py``), walking every message
  against every variant of the message ``Union`` type: ~0.1 ms per message (4.6 ms for a
  40-message history), for nothing, since langchain-openai already builds plain JSON-ready
  dicts and the chat-completion param types have no aliased keys or date/base64 formats
  (the body on the wire is equal).

What it adds (usage.py, docs/budgets.md): the budgets charge what a call cost however it
ends, so each streamed chunk is shown to ``usage.on_chunk`` (its deltas and usage block, as
parsed here anyway). Outside a metered call that does nothing. (Every attempt of a call, the
SDK's retries included, is seen by the HTTP client's event hooks: ``llm.metered_http_client``.)

How: ``PlainChatCompletions`` stands in for ``chat.completions`` as
``ChatOpenAI.async_client``. Its ``create`` does what ``AsyncCompletions.create`` does minus
the transform, through the SDK's public low-level ``AsyncOpenAI.post`` (documented by
openai-python for undocumented endpoints): same path, ``cast_to``, ``stream``/``stream_cls``
and request options, so auth headers, timeouts, SSE parsing, error types
(``RateLimitError``, ``APIStatusError``…) and the retry policy (``max_retries``, i.e.
LLM_MAX_RETRIES: 408/409/429/5xx and connection errors, with backoff and Retry-After,
before a response arrives) are the SDK's own. Calls the fast path cannot mirror exactly
(unknown or missing keywords, a pydantic class as ``response_format``) and every other
attribute (``with_raw_response``, ``parse``, ``stream``…) go to the real
``chat.completions``.

On every upgrade of ``openai`` or ``langchain-openai``, run
``tests/integration/test_lean_openai.py`` and ``tests/unit/test_lean_openai_chunks.py``: they
compare the request on the wire (body, URL, headers) and the messages langchain-openai
builds from the chunks against the unmodified SDK path, and check that retries, timeouts
and error types are the SDK's. Check too that ``AsyncCompletions.create`` still only
transforms the body and calls ``self._post`` (this module mirrors it), and that
langchain-openai still calls ``async_client.create(**payload)`` and reads chunks as dicts,
and that the SDK still sends every attempt through the ``httpx`` client it is given (whose
event hooks meter them: ``tests/integration/test_llm_retries.py``).
Then re-run ``make bench-capacity BENCH_ARGS="--baseline-ref <a commit without this
module>"``: if the SDK stops building a model per chunk (or langchain-openai stops asking
for one) and the gain falls under 10%, delete this module and its wiring in ``llm.py``.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

from openai import AsyncOpenAI, AsyncStream, NotGiven, Omit, RequestOptions
from openai.resources.chat.completions import AsyncCompletions
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from vagent_graph.observability.usage import on_chunk

__all__ = ["PlainChatCompletions"]

_PATH = "/chat/completions"  # as in AsyncCompletions.create
_REQUIRED = ("messages", "model")  # AsyncCompletions.create's @required_args
# The keyword arguments the installed SDK's create() accepts; anything else must fail
# there exactly as it would without this module.
_CREATE_KWARGS = frozenset(inspect.signature(AsyncCompletions.create).parameters) - {"self"}
_OPTION_KWARGS = frozenset({"extra_headers", "extra_query", "extra_body", "timeout"})


def _given(value: object) -> bool:
    """False for the SDK's "not passed" sentinels."""
    return not isinstance(value, NotGiven | Omit)


def _request_options(params: dict[str, Any]) -> RequestOptions:
    """The options ``create`` builds with ``make_request_options`` (same keys and rules)."""
    options: RequestOptions = {"security": {"bearer_auth": True}}
    headers = params.get("extra_headers")
    if headers is not None and _given(headers):
        options["headers"] = headers
    extra_body = params.get("extra_body")
    if extra_body is not None and _given(extra_body):
        options["extra_json"] = extra_body  # merged into the JSON body by the client
    extra_query = params.get("extra_query")
    if extra_query is not None and _given(extra_query):
        options["params"] = extra_query
    if "timeout" in params and _given(params["timeout"]):
        options["timeout"] = params["timeout"]  # None is meaningful: no timeout
    return options


class _ChunkDict:
    """Stream chunks as the plain dicts langchain-openai turns them into anyway.

    The SDK would build a ``ChatCompletionChunk`` model per chunk (``construct_type``) and
    langchain-openai would ``model_dump()`` it straight back to a dict: ~0.1 ms per chunk
    for nothing. ``build`` is the SDK's hook for such types (``ModelBuilderProtocol``). The
    keys langchain-openai indexes directly get the ``None`` that ``model_dump`` would give
    them when a server leaves them out; everything else it reads with ``.get``.
    """

    @classmethod
    def build(cls, *, response: object, data: object) -> Any:
        if isinstance(data, dict):
            on_chunk(data)  # what the call has cost so far (usage.Meter)
        for choice in (data.get("choices") if isinstance(data, dict) else None) or ():
            if isinstance(choice, dict):
                delta = choice.setdefault("delta", None)
                for call in (delta.get("tool_calls") if isinstance(delta, dict) else None) or ():
                    if isinstance(call, dict):
                        call.setdefault("index", None)
                        call.setdefault("function", None)
        return data


class PlainChatCompletions:
    """Drop-in for ``AsyncOpenAI.chat.completions`` as ``ChatOpenAI.async_client``."""

    def __init__(self, client: AsyncOpenAI) -> None:
        self._client = client
        self._sdk: AsyncCompletions = client.chat.completions

    def _fast_path_ok(self, params: dict[str, Any]) -> bool:
        """Only calls the SDK would accept and send unchanged; the rest take its path."""
        return (
            all(key in params for key in _REQUIRED)
            and _CREATE_KWARGS.issuperset(params)
            and not inspect.isclass(params.get("response_format"))
        )

    async def create(self, **params: Any) -> ChatCompletion | AsyncStream[Any]:
        """``AsyncCompletions.create`` without ``async_maybe_transform`` of the body; a
        stream yields dicts (``_ChunkDict``), which langchain-openai takes as they are."""
        if not self._fast_path_ok(params):
            sdk_result: ChatCompletion | AsyncStream[ChatCompletionChunk] = await self._sdk.create(**params)
            return sdk_result
        body: dict[str, Any] = {}
        for key, value in params.items():
            if key in _OPTION_KWARGS or not _given(value):
                continue
            # The transform turns one-shot iterables (declared Iterable[...]) into lists.
            body[key] = list(value) if isinstance(value, Iterator) else value
        return await self._client.post(
            _PATH,
            cast_to=ChatCompletion,
            body=body,
            options=_request_options(params),
            stream=bool(body.get("stream")),
            stream_cls=AsyncStream[_ChunkDict],
        )

    def __getattr__(self, name: str) -> Any:
        """Everything else (``with_raw_response``, ``parse``, ``stream``…) is the SDK's."""
        sdk = self.__dict__.get("_sdk")  # absent while copying/unpickling: no recursion
        if sdk is None:
            raise AttributeError(name)
        return getattr(sdk, name)
