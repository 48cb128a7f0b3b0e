"""Looms: /v1/looms, its Nodes and what they ask of the model (branch, replay, score)."""
