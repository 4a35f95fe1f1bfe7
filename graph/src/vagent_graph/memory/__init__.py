"""Memory that follows the person and never leaks (docs/memory.md): the recall rules
(rules.py, pure), the store (store.py: LangGraph's AsyncRedisStore), recall before a model
call (recall.py), and the `!remember` / `!memory` / `!forget` commands (commands.py)."""
