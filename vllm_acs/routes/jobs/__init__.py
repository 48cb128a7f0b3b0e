"""Completion jobs: POST/GET/DELETE /v1/completion-jobs."""
