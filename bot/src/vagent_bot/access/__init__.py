"""Who may use the agent and who reads an answer: the AccessControlProvider client
(provider.py), a room's audience, the flood window, invites, whose file a turn may use."""
