"""MCP servers' tools as agent tools: configured in the agent descriptor (`mcp_servers:`),
filtered per user like built-in tools, run with the asking user's own credential, confirmed
before anything that writes. config.py is the YAML shape, tools.py turns a server's tool
list into registry Tools, results.py what the model reads back, client.py the SDK calls,
servers.py keeps the lists fresh."""
