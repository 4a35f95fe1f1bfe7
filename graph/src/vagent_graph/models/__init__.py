"""The chat models: the OpenAI-compatible clients (llm.py, lean_openai.py), reasoning
models' thinking (reasoning.py), the stall guard, and the offline model `make run` uses."""
