"""The graph LangGraph's own server serves in `bench_capacity.py --peer langgraph`.

Why this shape: it is the least a LangGraph chat server does for a streamed turn, the same
shape as vagent's model node: the thread's messages (kept by the server's checkpointer) go
to the same paced model through langchain-openai's ChatOpenAI, streaming, and the answer is
added to the thread. The server streams its tokens (`stream_mode="messages-tuple"`) to the
bench's clients. No tools, no access checks: whatever vagent does beyond this is its own.

The model comes from the environment the bench gives the server: OPENAI_BASE_URL,
OPENAI_API_KEY (a dummy) and LLM_MODEL.
"""

from __future__ import annotations

import os
from typing import Any

from langchain_core.messages import SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph

SYSTEM = "You are a helpful assistant."

model = ChatOpenAI(
    model=os.environ.get("LLM_MODEL", "test-model"),
    streaming=True,
    stream_usage=True,
    max_retries=0,
    timeout=120,
)


async def call_model(state: MessagesState) -> dict[str, Any]:
    """One model call over the thread's history; its chunks stream through the server."""
    answer = await model.ainvoke([SystemMessage(SYSTEM), *state["messages"]])
    return {"messages": [answer]}


builder = StateGraph(MessagesState)
builder.add_node("model", call_model)
builder.add_edge(START, "model")
builder.add_edge("model", END)
graph = builder.compile()
