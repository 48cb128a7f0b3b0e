"""Worker-side capture and steering hooks (grow here; see docs/architecture.md)."""
