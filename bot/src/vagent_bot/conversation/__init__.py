"""One conversation: its sessions (one run at a time, `!stop`), a turn's message and files,
the graph call and its stream (conversations.py), questions waiting for an answer."""
