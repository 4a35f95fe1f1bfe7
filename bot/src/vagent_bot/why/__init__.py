"""🔍 / `!why`: the asker's account of how an answer came about."""
