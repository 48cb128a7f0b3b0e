"""Apply for access: the form's routes, the only ones that answer without a key (issue 34)."""
