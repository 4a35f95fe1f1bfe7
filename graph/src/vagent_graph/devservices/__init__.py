"""Development stand-ins for external systems (the Credential Registry, a ticket service).

They run in `make run`, the compose dev profile, the k8s dev overlay and the tests; never
in production.
"""
