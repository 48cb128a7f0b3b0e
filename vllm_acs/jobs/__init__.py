"""The job machinery: a runner per API server process that claims, leases and fences jobs."""
