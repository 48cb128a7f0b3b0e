"""Worker-side capture and steering hooks (vLLM worker processes; see docs/architecture.md).

compat.py touches vLLM (installed from the general plugin); runtime.py, capture.py and steering.py
work on plain tensors; post_import.py patches modules as they are imported.
"""
