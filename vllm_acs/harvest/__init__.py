"""Bulk activation harvests: layers, shards, statistics, the job that writes them
(API server process)."""
