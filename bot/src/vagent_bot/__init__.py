"""vagent bot service: the Matrix client in front of the graph service."""
