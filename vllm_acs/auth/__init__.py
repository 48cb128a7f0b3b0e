"""Access: who is calling (principal.py, a leaf), the built-in key plugin (key_auth.py), the
embedded node's local key (local_key.py), and storage refusals as AcsErrors (refusals.py).

Imports nothing itself, so that storage can import the principal leaf without the rest.
"""
