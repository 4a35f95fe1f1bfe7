"""The LangGraph workflow (graph.py): the model node, tool calls (tool_calls.py) with their
access checks (access.py), confirmations (approval.py, hitl.py), the history window
(history.py) and the answer's stream (answer_stream.py)."""
