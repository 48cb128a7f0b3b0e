"""FastAPI routers of the API server process, one package per feature."""
