"""vagent graph service: the LangGraph workflow behind FastAPI/SSE."""
