"""Metrics, spans and the health endpoint."""
