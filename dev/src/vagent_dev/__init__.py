"""Development stand-ins: everything that exists only to run vagent locally and in tests.

The AccessControlProvider stand-in (`vagent-acp`), the development Credential Registry
(`vagent-credentials`), the demo ticket service (`vagent-tickets`), the demo calendar MCP
server (`vagent-calendar`), the speech-to-text stand-in (`vagent-stt`) and the terminal chat
client (`vagent-chat`, `make chat`). They run in `make run`, compose's dev profile, the k8s
dev overlay, Tilt and the tests; never in production. The product packages (vagent_shared,
vagent_graph, vagent_bot) never import this one (import-linter checks it in `make lint`).
"""
