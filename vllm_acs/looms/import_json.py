"""An import file's JSON, parsed without recursion to the nesting a Loom file may need.

Pure (API server process, in a worker thread). A socketteer/loom file nests its tree
(root.children[...].children...), two levels per Node, so a chain as long as the node limit
allows is far deeper than Python's json.loads can go (it recurses and raises RecursionError
past about a thousand levels). Ordinary files take json.loads; one too deep for it is read
again from ijson's events (its C backend, yajl) with an explicit stack. Either way a file that
nests deeper than `max_depth` is a 400 naming the limit.
"""

from __future__ import annotations

import json
from typing import Any

import ijson

from ..contract.bounded_json import nesting_depth, too_deep
from ..errors import BadJson

WHAT = "The import file"
# Levels above a chain of Nodes: the file object, `root`; and below the deepest Node: its
# generation record, a legacy completion's logprobs and their alternatives.
_SPARE_LEVELS = 16


def import_depth_limit(max_nodes: int) -> int:
    """The nesting an import of `max_nodes` Nodes may need: two levels per Node (the Node and
    its `children` list) plus a few."""
    return 2 * max_nodes + _SPARE_LEVELS


def loads_import(raw: bytes, *, max_depth: int) -> Any:
    """The parsed file, or BadJson: not JSON, or nested deeper than `max_depth`."""
    try:
        data = json.loads(raw)
    except RecursionError:
        return _loads_iterative(raw, max_depth)
    except (ValueError, UnicodeDecodeError):
        raise BadJson(f"{WHAT} is not valid JSON.") from None
    if nesting_depth(data, max_depth) > max_depth:
        raise too_deep(max_depth, WHAT)
    return data


def _loads_iterative(raw: bytes, max_depth: int) -> Any:
    """json.loads's answer for input too deep for it, built from parse events on a stack.
    Refuses (BadJson) as soon as the nesting passes `max_depth`, before reading further."""
    stack: list[Any] = []  # the open containers, outermost first
    keys: list[str | None] = []  # per open container: the key its next value goes under
    done: list[Any] = []
    try:
        for event, value in ijson.basic_parse(raw, use_float=True):
            if event == "map_key":
                keys[-1] = value
                continue
            if event in ("start_map", "start_array"):
                if len(stack) >= max_depth:
                    raise too_deep(max_depth, WHAT)
                stack.append({} if event == "start_map" else [])
                keys.append(None)
                continue
            if event in ("end_map", "end_array"):
                value = stack.pop()
                keys.pop()
            if not stack:
                done.append(value)
            elif isinstance(stack[-1], list):
                stack[-1].append(value)
            else:
                stack[-1][keys[-1]] = value
    except ijson.common.JSONError:
        raise BadJson(f"{WHAT} is not valid JSON.") from None
    if len(done) != 1:
        raise BadJson(f"{WHAT} is not valid JSON.")
    return done[0]
