"""The bot's outbound HTTP: the graph service, speech to text, and what they share."""
