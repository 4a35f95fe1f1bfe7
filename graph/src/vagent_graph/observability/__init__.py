"""What a turn leaves behind for operators: metrics, OpenTelemetry spans, the turn's trace
(recorder.py, trace_store.py), usage and budgets, the audit trail's reader."""
