"""The /v1 contract as plain Python: request models, bounds, the validated-request object.

Leaf-level: imports only the project's leaves and pydantic, so middleware and routes share it.
"""
