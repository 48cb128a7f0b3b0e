"""The operator's console API under /v1/admin (issue 34): keys with the `admin` scope only."""
