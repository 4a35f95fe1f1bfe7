"""vagent gateway: LangGraph's server API in front of the graph, with the bot's guarantees."""
