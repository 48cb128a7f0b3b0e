"""Storage: accounts, keys, budgets, usage (SQLAlchemy; grows here)."""
