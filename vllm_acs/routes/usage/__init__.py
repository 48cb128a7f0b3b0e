"""GET /v1/usage: the calling key's budgets, this month's tokens and its traffic in use."""
