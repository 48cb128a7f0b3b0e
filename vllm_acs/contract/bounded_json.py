"""JSON from a client, parsed with a bound on nesting: a breach is a 400, never a 500.

API server process. Every client body that is JSON goes through `loads_bounded`. Python's parser
recurses once per level and raises RecursionError (not ValueError) past about a thousand; the
walk after the parse holds every body to `MAX_DEPTH`, far above any request the API defines.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import BadJson

# The deepest API body (an activation request's steering entries) nests 6 levels.
MAX_DEPTH = 64


def nesting_depth(value: Any, stop_after: int) -> int:
    """How deep containers nest in `value` (a scalar is 0), counted without recursion; stops
    counting once it passes `stop_after`."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > stop_after:
            return deepest
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return deepest


def too_deep(max_depth: int, what: str = "The request body") -> BadJson:
    return BadJson(f"{what} nests arrays and objects deeper than {max_depth} levels.")


def loads_bounded(
    raw: bytes | str, *, max_depth: int = MAX_DEPTH, what: str = "The request body"
) -> Any:
    """The parsed JSON, or BadJson: not JSON, or nested deeper than `max_depth`."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise too_deep(max_depth, what) from None
    except (ValueError, UnicodeDecodeError):
        raise BadJson(f"{what} is not valid JSON.") from None
    if nesting_depth(data, max_depth) > max_depth:
        raise too_deep(max_depth, what)
    return data
