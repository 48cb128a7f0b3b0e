"""Storage: accounts, keys, budget counters, usage rows, jobs, idempotency records, and the shared
counters (slots, Holds).

Used by the API server and the CLI; imports only the project's leaves (no web framework, no vLLM).
"""

from .db import Storage, check_counters_backend, create_engine, open_storage

__all__ = ["Storage", "check_counters_backend", "create_engine", "open_storage"]
