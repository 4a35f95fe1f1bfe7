"""One turn's life: turn.py owns it (lock, intake, run, stream, trace, end); events.py runs
the workflow and maps its stream to SSE events, outbox.py paces the writes, intake.py reads
the files that came with a message."""
