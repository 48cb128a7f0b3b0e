"""Benchmarks: one measurement per module, each a ratio measured in one run (`make bench`)."""
