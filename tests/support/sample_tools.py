"""Two LangChain tools for tests that bind tools to a real ChatOpenAI client."""

from __future__ import annotations

from langchain_core.tools import tool


@tool
def get_weather(city: str, unit: str = "celsius") -> str:
    """Look up the weather for a city."""
    return f"sunny in {city}"


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b
