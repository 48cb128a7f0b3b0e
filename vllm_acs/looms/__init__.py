"""Looms: server-side trees of completions (storage-free pieces)."""
