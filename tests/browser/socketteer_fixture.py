"""A socketteer/loom save file of 764 nodes, made the same way every time (no file in the repo).

The shape of a real session: long chains of continuations with forks along them (up to 32 deep),
most nodes written by a model (each with its `model_responses` entry: per-token logprobs and
counterfactuals), some by hand, a few bookmarked. The format is the app's, as
`vllm_acs/looms/socketteer.py` documents it. Used by the Loom browser test and
`benchmarks/workbench_render.py`.
"""

from __future__ import annotations

import random
from typing import Any

NODES = 764
MAX_DEPTH = 32
# fmt: off
_WORDS = (
    "the", "sky", "river", "light", "slowly", "over", "a", "quiet", "town", "and", "then", "she",
    "said", "nothing", "while", "rain", "fell", "across", "old", "stone", "roads", "where",
    "lanterns", "burned", "until", "morning", "came", "with", "bells", "ringing", "far", "away",
    "beyond", "hills", "of", "green", "grass", "under", "which", "something", "waited",
    "patiently", "for", "years",
)
# fmt: on


def _text(rng: random.Random) -> list[str]:
    """A continuation as the tokens a model would have made: words with their leading space."""
    words = [" " + rng.choice(_WORDS) for _ in range(rng.randint(3, 14))]
    return [*words, rng.choice([".", ",", ""])]


def _response(response_id: str, tokens: list[str], rng: random.Random) -> dict[str, Any]:
    entries = []
    for position, token in enumerate(t for t in tokens if t):
        logprob = -round(rng.expovariate(1.2), 3)
        others = {" " + rng.choice(_WORDS): -round(rng.uniform(0.2, 6.0), 3) for _ in range(3)}
        entries.append(
            {
                "generatedToken": {"token": token, "logprob": logprob},
                "position": position,
                "counterfactuals": {token: logprob, **others},
            }
        )
    return {
        "id": response_id,
        "model": "davinci-002",
        "timestamp": 1_700_000_000 + len(response_id),
        "prompt": {"text": "", "tokens": None},
        "completions": [{"text": "".join(tokens), "finishReason": "length", "tokens": entries}],
    }


def socketteer_file(nodes: int = NODES, seed: int = NODES) -> dict[str, Any]:
    """The file as a dict (json.dumps it to write it). Node ids are "n0000".."n0763"."""
    rng = random.Random(seed)
    root: dict[str, Any] = {
        "id": "n0000",
        "text": "In the valley there was a town with one road, and on that road",
        "meta": {"source": "prompt"},
        "children": [],
    }
    made: list[tuple[dict[str, Any], int]] = [(root, 0)]
    responses: dict[str, Any] = {}
    while len(made) < nodes:
        last, last_depth = made[-1]
        if last_depth < MAX_DEPTH and rng.random() < 0.62:
            parent, depth = last, last_depth  # go on down the chain
        else:
            parent, depth = made[rng.randrange(max(0, len(made) - 60), len(made))]  # fork back
            if depth >= MAX_DEPTH:
                parent, depth = root, 0
        number = len(made)
        node: dict[str, Any] = {"id": f"n{number:04d}", "children": []}
        tokens = _text(rng)
        node["text"] = "".join(tokens)
        if rng.random() < 0.85:
            response_id = f"cmpl-{number:04d}"
            responses[response_id] = _response(response_id, tokens, rng)
            node["meta"] = {"source": "AI"}
            node["generation"] = {"id": response_id, "index": 0}
        else:
            node["meta"] = {"source": "prompt"}
        if rng.random() < 0.04:
            node["tags"] = ["bookmark"]
        parent["children"].append(node)
        made.append((node, depth + 1))
    return {
        "root": root,
        "model_responses": responses,
        "tags": {"bookmark": {"name": "bookmark"}},
        "generation_settings": {"temperature": 0.9, "num_continuations": 4, "response_length": 32},
    }


def depth_of(file: dict[str, Any]) -> int:
    """The deepest level of the file's tree (the root is 0)."""
    deepest = 0
    stack = [(file["root"], 0)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in node.get("children", []))
    return deepest
