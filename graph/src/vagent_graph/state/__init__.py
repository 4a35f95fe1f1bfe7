"""What the graph keeps in Redis per session: the checkpointer, the session lock, the
end-of-run pruning, and erasure (a person's data, everywhere)."""
