"""How an answer reaches Matrix: streamed by edits (streaming.py, edit_pacing.py), split and
rendered, questions and images posted."""
