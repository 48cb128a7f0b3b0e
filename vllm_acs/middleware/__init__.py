"""Pure-ASGI middleware of the API server process, one class per module."""
