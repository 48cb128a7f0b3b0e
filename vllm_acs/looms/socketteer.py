"""Read a socketteer/loom save file into a flat list of nodes, parents before children.

Pure (standard library only); runs in the API server process when a user imports a tree that
the socketteer/loom desktop app saved. Nothing here touches storage.

The format, as the app writes it (`model.py` `save_tree`/`load_tree_data`, `gpt.py`):

* A JSON object with a nested `root` node. A node is an object with `text`, `children` (a
  list of nodes), `id` (a uuid string; the app adds one where it is missing), and optional
  `parent_id` (the app rewrites it from the nesting on load, so nesting wins here too),
  `meta` (`source`: "prompt" for text a person typed, "AI", or "mixed" for model text a person
  edited; `creation_timestamp`, `modified`, `origin`), `tags` (a list of tag names, e.g.
  "bookmark"; older files set `bookmark`/`archived`/`canonical` to true on the node instead)
  and `generation`.
* Current files: a model-written node has `generation: {"id": <response id>, "index": <i>}`
  and the top-level `model_responses` maps response ids to the app's own response record:
  `{"id", "model", "timestamp", "prompt": {...}, "completions": [{"text", "finishReason",
  "tokens": [{"generatedToken": {"token", "logprob"}, "position", "counterfactuals":
  {alternative: logprob} | null}]}]}`. The app may back up and empty `model_responses`, so a
  reference can dangle; that is noted, not an error.
* Older files (2021) put the raw OpenAI completion choice on the node as `meta.generation`:
  `{"text", "index", "finish_reason", "model", "prompt", "logprobs": {"tokens",
  "token_logprobs", "top_logprobs": [{alternative: logprob}], "text_offset"}}`.
* A `model_responses` entry that is a raw OpenAI response (`choices` instead of
  `completions`, legacy `logprobs` arrays or chat `logprobs.content`) is read as well.

Which tokens belong to a node: a node's reference names one completion, and all of that
completion's tokens are the node's when the completion text appears in the node text (the app
may add fixed start/restart text around it). When the node holds only part of the completion
(the app's "split" keeps the reference on the later piece), the tokens whose text lies wholly
inside that part are kept; their places come from the running length of the token strings, not
from `position`/`text_offset`, whose base differs between app versions (absolute with the
prompt, prompt-relative, or a token index for chat models). Text edited after generation does
not match; its tokens are not imported and a note says so. The file's top-level
`generation_settings` are the app's settings at save time, not those of any one generation, so
`generation["parameters"]` holds only what a generation record itself carries.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = [
    "ImportedNode",
    "ImportedToken",
    "LoomFileInvalid",
    "is_socketteer_file",
    "parse_socketteer",
]

_RESPONSES_KEYS = ("model_responses", "modelResponses")
_LEGACY_FLAG_TAGS = ("bookmark", "archived", "canonical")
_MODEL_SOURCES = frozenset({"ai", "model"})
_HUMAN_SOURCES = frozenset({"prompt", "human", "user"})
_PARAMETER_NAMES = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "max_tokens": "max_tokens",
    "response_length": "max_tokens",
    "n": "n",
    "num_continuations": "n",
    "logprobs": "logprobs",
    "top_logprobs": "top_logprobs",
    "stop": "stop",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty",
    "seed": "seed",
}
_PARAMETER_HOLDERS = ("settings", "generation_settings", "parameters", "params", "request")
_PATH_HEAD, _PATH_TAIL = 4, 6
_SHOWN_CHARS = 60
_MAX_ID_INT = 10**15


class LoomFileInvalid(ValueError):
    """The file cannot be imported; the message names the problem (and where, e.g. a JSON path
    like root.children[2])."""


@dataclass(frozen=True)
class ImportedToken:
    """One generated token: its text, id when the file has one, logprob and best alternatives."""

    text: str
    id: int | None  # token id when the file has it, else None
    logprob: float | None
    top_logprobs: list[tuple[str, float]]  # alternatives (text, logprob), best first; [] if none


@dataclass(frozen=True)
class ImportedNode:
    """One node of the file, keyed by its file id (or a made-up "#<n>")."""

    key: str  # the node's id in the file, or a made-up unique "#<n>" when it had none
    parent: str | None  # the parent's key; None only for the root (first node)
    text: str
    origin: str  # "root", "model" (source "AI" or generation info), "human", or "import"
    tokens: list[ImportedToken] | None  # the node's part of the completion it points to
    generation: dict[str, object] | None  # what the file records of the generation, or None
    bookmarked: bool
    tags: list[str]
    unknown: list[str]  # readable notes of what was absent or dangling


@dataclass
class _Seen:
    """A node found by the walk: the object, its parent's index and its place among siblings."""

    obj: dict
    parent: int | None
    position: int
    text: str


def is_socketteer_file(data: object) -> bool:
    """True when `data` (parsed JSON) looks like a socketteer/loom save file (a dict with a dict
    `root` that has `text` or `children`)."""
    if not isinstance(data, dict):
        return False
    root = data.get("root")
    return isinstance(root, dict) and ("text" in root or "children" in root)


def parse_socketteer(
    data: object, *, max_nodes: int, max_text_chars: int, max_tokens: int | None = None
) -> list[ImportedNode]:
    """The file's nodes, parents before children, children in file order (pre-order).

    Raises LoomFileInvalid for: not a dict / no root; a node that is not an object; text not a
    string; children not a list; a cycle or a node id used twice; more than max_nodes nodes; a
    text longer than max_text_chars; more than max_tokens tokens in all the nodes together (a
    completion that several nodes share counts for each of them: each keeps its own copy).
    Each completion is read once however many nodes name it. `parent_id` fields that
    contradict the nesting are noted in `unknown` and the nesting is used. Walks iteratively,
    so deep files are fine. Absent
    optional parts (meta, tags, model_responses, logprobs) are imported as far as they go and
    noted in `unknown`.

    `generation` keys, each only when the file has it: "response_id", "index", "model",
    "finish_reason", "timestamp", "parameters" (a dict of temperature, top_p, max_tokens, ...).
    """
    if not isinstance(data, dict):
        raise LoomFileInvalid(f"the file is not a JSON object (it is {_json_type(data)})")
    if "root" not in data:
        raise LoomFileInvalid("the file has no 'root' node")
    root = data["root"]
    if not isinstance(root, dict):
        raise LoomFileInvalid(f"root is not an object (it is {_json_type(root)})")
    seen = _walk(root, max_nodes, max_text_chars)
    keys, key_notes = _assign_keys(seen)
    file_notes: list[str] = []
    responses = _responses(data, file_notes)
    completions = _Completions()
    nodes, total = [], 0
    for index, item in enumerate(seen):
        notes = file_notes + key_notes[index] if index == 0 else key_notes[index]
        parent = None if item.parent is None else keys[item.parent]
        node = _build_node(item, keys[index], parent, responses, notes, completions)
        total += len(node.tokens or ())
        if max_tokens is not None and total > max_tokens:
            raise LoomFileInvalid(
                f"the nodes hold more than {max_tokens} tokens in all (the limit); "
                f"{_seen_path(seen, index)} passes it"
            )
        nodes.append(node)
    return nodes


# ---- the walk -----------------------------------------------------------------------------


def _walk(root: dict, max_nodes: int, max_text_chars: int) -> list[_Seen]:
    """All nodes in pre-order, validated for shape and limits, without recursion."""
    out: list[_Seen] = []
    objects: set[int] = set()
    stack: list[tuple[object, int | None, int]] = [(root, None, -1)]
    while stack:
        obj, parent, position = stack.pop()
        if not isinstance(obj, dict):
            where = _path(out, parent, position)
            raise LoomFileInvalid(f"{where} is not an object (it is {_json_type(obj)})")
        if id(obj) in objects:
            where = _path(out, parent, position)
            raise LoomFileInvalid(f"{where} appears twice in the tree (a cycle or a shared node)")
        objects.add(id(obj))
        children = obj.get("children", [])
        if not isinstance(children, list):
            where = _path(out, parent, position)
            raise LoomFileInvalid(
                f"{where}: children is {_json_type(children)}, not a list of nodes"
            )
        if len(out) + 1 + len(stack) + len(children) > max_nodes:
            raise LoomFileInvalid(f"the file has more than {max_nodes} nodes (the limit)")
        text = _node_text(obj, out, parent, position, max_text_chars)
        index = len(out)
        out.append(_Seen(obj, parent, position, text))
        stack.extend((children[at], index, at) for at in range(len(children) - 1, -1, -1))
    return out


def _node_text(
    obj: dict, out: list[_Seen], parent: int | None, position: int, max_text_chars: int
) -> str:
    text = obj.get("text", "")
    if not isinstance(text, str):
        where = _path(out, parent, position)
        raise LoomFileInvalid(f"{where}: text is {_json_type(text)}, not a string")
    if len(text) > max_text_chars:
        where = _path(out, parent, position)
        raise LoomFileInvalid(
            f"{where}{_id_suffix(obj)}: text has {len(text)} characters, "
            f"over the limit of {max_text_chars}"
        )
    return text


def _path(out: list[_Seen], parent: int | None, position: int) -> str:
    """The JSON path of a node, shortened in the middle when the node is deep."""
    positions: list[int] = []
    while parent is not None:
        positions.append(position)
        position, parent = out[parent].position, out[parent].parent
    steps = [f".children[{at}]" for at in reversed(positions)]
    if len(steps) > _PATH_HEAD + _PATH_TAIL:
        hidden = len(steps) - _PATH_HEAD - _PATH_TAIL
        steps = [*steps[:_PATH_HEAD], f" ...({hidden} more levels)... ", *steps[-_PATH_TAIL:]]
    return "root" + "".join(steps)


def _seen_path(seen: list[_Seen], index: int) -> str:
    return _path(seen, seen[index].parent, seen[index].position)


# ---- keys ---------------------------------------------------------------------------------


def _assign_keys(seen: list[_Seen]) -> tuple[list[str], list[list[str]]]:
    """Each node's key (file id or made-up "#<n>") and the notes that go with it."""
    owners: dict[str, int] = {}
    file_ids: list[str | None] = []
    notes: list[list[str]] = [[] for _ in seen]
    for index, item in enumerate(seen):
        key = _file_id(item.obj.get("id"))
        if key is not None:
            if key in owners:
                first, again = _seen_path(seen, owners[key]), _seen_path(seen, index)
                raise LoomFileInvalid(
                    f"node id {_shown(key)} is used twice: at {first} and at {again}"
                )
            owners[key] = index
        elif "id" in item.obj:
            notes[index].append("node id was not a usable string; made one up")
        else:
            notes[index].append("node had no id")
        file_ids.append(key)
    keys, counter = [], 0
    for key in file_ids:
        if key is None:
            counter += 1
            while f"#{counter}" in owners:
                counter += 1
            key = f"#{counter}"
        keys.append(key)
    return keys, notes


def _file_id(value: object) -> str | None:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < _MAX_ID_INT:
        return str(value)
    return None


# ---- one node -----------------------------------------------------------------------------


def _build_node(
    item: _Seen,
    key: str,
    parent: str | None,
    responses: dict | None,
    notes: list[str],
    completions: _Completions,
) -> ImportedNode:
    obj = item.obj
    unknown = list(notes)
    if "text" not in obj:
        unknown.append("node had no text")
    _check_parent_id(obj, parent, unknown)
    meta = obj.get("meta")
    if meta is not None and not isinstance(meta, dict):
        unknown.append(f"meta is {_json_type(meta)}, not an object; ignored")
        meta = None
    generation, tokens = _generation(obj, meta or {}, item.text, responses, unknown, completions)
    origin = _origin(parent is None, (meta or {}).get("source"), generation is not None, unknown)
    tags = _tags(obj, unknown)
    return ImportedNode(
        key=key,
        parent=parent,
        text=item.text,
        origin=origin,
        tokens=tokens,
        generation=generation,
        bookmarked="bookmark" in tags,
        tags=tags,
        unknown=unknown,
    )


def _check_parent_id(obj: dict, parent: str | None, unknown: list[str]) -> None:
    field = "parent_id" if "parent_id" in obj else "parentId"
    stated = obj.get(field)
    if stated is None:
        return
    if parent is None:
        unknown.append(f"root has {field} {_shown(stated)}; ignored")
    elif _file_id(stated) != parent:
        unknown.append(
            f"{field} {_shown(stated)} contradicts nesting under {_shown(parent)}; nesting used"
        )


def _origin(is_root: bool, source: object, has_generation: bool, unknown: list[str]) -> str:
    if is_root:
        return "root"
    if isinstance(source, str):
        lowered = source.lower()
        if lowered in _MODEL_SOURCES:
            return "model"
        if lowered in _HUMAN_SOURCES:
            return "human"
        if lowered == "mixed":
            unknown.append("source 'mixed': model text edited by a person")
        else:
            unknown.append(f"source {_shown(source)} not recognised")
        return "import"
    if has_generation:
        return "model"
    unknown.append("source not recorded")
    return "import"


def _tags(obj: dict, unknown: list[str]) -> list[str]:
    """The node's tag names, in file order without repeats, plus older boolean flags."""
    tags: list[str] = []
    raw = obj.get("tags")
    if raw is not None and not isinstance(raw, list):
        unknown.append(f"tags is {_json_type(raw)}, not a list; ignored")
        raw = None
    for at, tag in enumerate(raw or []):
        if not isinstance(tag, str):
            unknown.append(f"tags[{at}] is {_json_type(tag)}, not a string; dropped")
        elif tag not in tags:
            tags.append(tag)
    for flag in _LEGACY_FLAG_TAGS:
        if obj.get(flag) is True and flag not in tags:
            tags.append(flag)
    return tags


# ---- generation and tokens ----------------------------------------------------------------


def _responses(data: dict, file_notes: list[str]) -> dict | None:
    for name in _RESPONSES_KEYS:
        if name in data:
            value = data[name]
            if isinstance(value, dict):
                return value
            file_notes.append(f"{name} is {_json_type(value)}, not an object; ignored")
            return None
    return None


def _generation(
    obj: dict,
    meta: dict,
    text: str,
    responses: dict | None,
    unknown: list[str],
    completions: _Completions,
) -> tuple[dict[str, object] | None, list[ImportedToken] | None]:
    """The node's generation record and tokens: `generation` first, then `meta.generation`."""
    generation: dict[str, object] | None = None
    tokens: list[ImportedToken] | None = None
    records = (("generation", obj.get("generation")), ("meta.generation", meta.get("generation")))
    for where, record in records:
        if record is None or tokens is not None:
            continue
        if not isinstance(record, dict):
            unknown.append(f"{where} is {_json_type(record)}, not an object; ignored")
            continue
        found, tokens = _from_record(record, where, text, responses, unknown, completions)
        generation = found if generation is None else {**found, **generation}
    return generation or None, tokens


def _from_record(
    record: dict,
    where: str,
    text: str,
    responses: dict | None,
    unknown: list[str],
    completions: _Completions,
) -> tuple[dict[str, object], list[ImportedToken] | None]:
    """One generation record: inline (an OpenAI choice) or a reference into model_responses."""
    index = _index(record, where, unknown)
    if "logprobs" in record or "text" in record or "message" in record:
        generation = _generation_fields(None, index, None, record, record)
        return generation, _tokens_for_node(completions.read(record, where), text, unknown)
    response_id = record.get("id")
    if not isinstance(response_id, str) or not response_id:
        unknown.append(f"{where} names no model_responses entry")
        return _generation_fields(None, index, None, None, record), None
    entry = responses.get(response_id) if responses is not None else None
    if entry is None:
        unknown.append(f"model_responses entry {_shown(response_id)} not in file")
        return _generation_fields(response_id, index, None, None, record), None
    if not isinstance(entry, dict):
        unknown.append(f"model_responses entry {_shown(response_id)} is not an object")
        return _generation_fields(response_id, index, None, None, record), None
    completion, index = _pick_completion(entry, response_id, index, unknown)
    generation = _generation_fields(response_id, index, entry, completion, record)
    if completion is None:
        return generation, None
    label = f"{_shown(response_id)}[{index}]"
    return generation, _tokens_for_node(completions.read(completion, label), text, unknown)


def _index(record: dict, where: str, unknown: list[str]) -> int | None:
    index = record.get("index")
    if index is None or (isinstance(index, int) and not isinstance(index, bool)):
        return index
    unknown.append(f"{where}.index is {_json_type(index)}, not an integer; ignored")
    return None


def _pick_completion(
    entry: dict, response_id: str, index: int | None, unknown: list[str]
) -> tuple[dict | None, int | None]:
    completions = entry.get("completions")
    if not isinstance(completions, list):
        completions = entry.get("choices")
    name = _shown(response_id)
    if not isinstance(completions, list):
        unknown.append(f"model_responses entry {name} has no completions")
        return None, index
    if index is None:
        if len(completions) != 1:
            unknown.append(f"generation index missing for model_responses entry {name}")
            return None, None
        index = 0
    if not 0 <= index < len(completions):
        unknown.append(
            f"generation index {index} out of range for model_responses entry {name} "
            f"({len(completions)} completions)"
        )
        return None, index
    completion = completions[index]
    if not isinstance(completion, dict):
        unknown.append(f"completion {name}[{index}] is not an object")
        return None, index
    return completion, index


def _generation_fields(
    response_id: str | None,
    index: int | None,
    entry: dict | None,
    completion: dict | None,
    record: dict,
) -> dict[str, object]:
    fields: dict[str, object] = {}
    if response_id is not None:
        fields["response_id"] = response_id
    if index is not None:
        fields["index"] = index
    model = _first_str((entry or {}).get("model"), record.get("model"))
    if model is not None:
        fields["model"] = model
    finish = _finish_reason(completion) or _finish_reason(record)
    if finish is not None:
        fields["finish_reason"] = finish
    timestamp = _first_str((entry or {}).get("timestamp"), record.get("timestamp"))
    if timestamp is not None:
        fields["timestamp"] = timestamp
    parameters = _parameters([record, *_parameter_holders(record), *_parameter_holders(entry)])
    if parameters:
        fields["parameters"] = parameters
    return fields


def _finish_reason(holder: dict | None) -> str | None:
    if holder is None:
        return None
    value = holder.get("finishReason", holder.get("finish_reason"))
    if isinstance(value, dict):
        value = value.get("reason")
    return value if isinstance(value, str) else None


def _parameter_holders(holder: dict | None) -> list[dict]:
    if holder is None:
        return []
    return [holder[name] for name in _PARAMETER_HOLDERS if isinstance(holder.get(name), dict)]


def _parameters(sources: Iterable[dict]) -> dict[str, object]:
    """Sampling parameters a generation record carries, under OpenAI names; first source wins."""
    found: dict[str, object] = {}
    for source in sources:
        for name, canonical in _PARAMETER_NAMES.items():
            if canonical in found or name not in source:
                continue
            value = _parameter_value(source[name])
            if value is not None:
                found[canonical] = value
    return found


def _parameter_value(value: object) -> object:
    if isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return list(value)
    return None


@dataclass(frozen=True)
class _ReadCompletion:
    """A completion as read once: its tokens, what they spell, its text, the notes of reading."""

    label: str
    tokens: list[ImportedToken] | None
    joined: str
    text: str | None
    notes: list[str]


class _Completions:
    """Each completion of the file read once, however many nodes point at it (a shared
    `model_responses` entry): by the identity of its object, which the parsed file keeps."""

    def __init__(self) -> None:
        self._read: dict[int, _ReadCompletion] = {}

    def read(self, completion: dict, label: str) -> _ReadCompletion:
        found = self._read.get(id(completion))
        if found is None:
            notes: list[str] = []
            tokens = _completion_tokens(completion, label, notes)
            joined = "" if tokens is None else "".join(token.text for token in tokens)
            found = _ReadCompletion(label, tokens, joined, _completion_text(completion), notes)
            self._read[id(completion)] = found
        return found


def _tokens_for_node(
    read: _ReadCompletion, text: str, unknown: list[str]
) -> list[ImportedToken] | None:
    unknown.extend(read.notes)
    if read.tokens is None:
        return None
    return _align(text, read, unknown)


def _completion_text(completion: dict) -> str | None:
    text = completion.get("text")
    if isinstance(text, str):
        return text
    message = completion.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, str) else None


def _completion_tokens(
    completion: dict, label: str, unknown: list[str]
) -> list[ImportedToken] | None:
    """The completion's tokens in whichever shape it has: the app's, legacy or chat OpenAI."""
    listed = completion.get("tokens")
    logprobs = completion.get("logprobs")
    if isinstance(listed, list):
        tokens = _listed_tokens(listed, _app_token)
    elif isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
        tokens = _listed_tokens(logprobs["content"], _chat_token)
    elif isinstance(logprobs, dict) and isinstance(logprobs.get("tokens"), list):
        tokens = _legacy_tokens(logprobs)
    elif listed is None and logprobs is None:
        unknown.append(f"completion {label} has no per-token logprobs")
        return None
    else:
        unknown.append(f"completion {label} has logprobs in an unknown shape; not imported")
        return None
    if tokens is None:
        unknown.append(f"completion {label} has a malformed token entry; tokens not imported")
    return tokens


def _listed_tokens(
    items: list, read: Callable[[dict], ImportedToken | None]
) -> list[ImportedToken] | None:
    tokens = []
    for item in items:
        token = read(item) if isinstance(item, dict) else None
        if token is None:
            return None
        tokens.append(token)
    return tokens


def _app_token(item: dict) -> ImportedToken | None:
    """`{"generatedToken": {"token", "logprob"}, "counterfactuals": {alt: logprob}}`."""
    generated = item.get("generatedToken")
    if not isinstance(generated, dict) or not isinstance(generated.get("token"), str):
        return None
    return ImportedToken(
        text=generated["token"],
        id=_token_id(generated, item),
        logprob=_number(generated.get("logprob")),
        top_logprobs=_alternatives(item.get("counterfactuals")),
    )


def _chat_token(item: dict) -> ImportedToken | None:
    """`{"token", "logprob", "top_logprobs": [{"token", "logprob"}]}` (OpenAI chat)."""
    if not isinstance(item.get("token"), str):
        return None
    return ImportedToken(
        text=item["token"],
        id=_token_id(item),
        logprob=_number(item.get("logprob")),
        top_logprobs=_alternatives(item.get("top_logprobs")),
    )


def _legacy_tokens(logprobs: dict) -> list[ImportedToken] | None:
    """`{"tokens", "token_logprobs", "top_logprobs": [{alt: logprob} | null]}` (OpenAI legacy)."""
    texts = logprobs["tokens"]
    values = logprobs.get("token_logprobs")
    tops = logprobs.get("top_logprobs")
    if not isinstance(values, list):
        values = [None] * len(texts)
    if not isinstance(tops, list):
        tops = []
    if len(values) != len(texts) or not all(isinstance(text, str) for text in texts):
        return None
    return [
        ImportedToken(
            text=text,
            id=None,
            logprob=_number(values[at]),
            top_logprobs=_alternatives(tops[at] if at < len(tops) else None),
        )
        for at, text in enumerate(texts)
    ]


def _token_id(*holders: dict) -> int | None:
    for holder in holders:
        for name in ("token_id", "id"):
            value = holder.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def _alternatives(raw: object) -> list[tuple[str, float]]:
    """Alternatives best first, from `{alt: logprob}` or `[{"token", "logprob"}]`."""
    pairs: list[tuple[str, float]] = []
    if isinstance(raw, dict):
        items: Iterable[tuple[object, object]] = raw.items()
    elif isinstance(raw, list):
        items = ((e.get("token"), e.get("logprob")) for e in raw if isinstance(e, dict))
    else:
        return pairs
    for text, value in items:
        number = _number(value)
        if isinstance(text, str) and number is not None:
            pairs.append((text, number))
    pairs.sort(key=lambda pair: pair[1], reverse=True)
    return pairs


def _align(text: str, read: _ReadCompletion, unknown: list[str]) -> list[ImportedToken] | None:
    """The tokens that belong to the node's text (see the module docstring). The whole list is
    the shared one (never copied per node); a part is a new list."""
    tokens, label, joined = read.tokens or [], read.label, read.joined
    whole = joined if read.text is None else read.text
    if joined == whole and whole in text:
        return tokens
    if joined != whole:
        unknown.append(
            f"node text differs from completion {label} and its tokens do not spell the "
            "completion; tokens not imported"
        )
        return None
    start = _place(text, whole)
    if start < 0:
        unknown.append(
            f"node text no longer matches completion {label} (edited after generation?); "
            "tokens not imported"
        )
        return None
    return _slice(tokens, start, start + len(text), label, unknown)


def _place(text: str, whole: str) -> int:
    """Where the node's text sits in the completion text, or -1."""
    if not text:
        return -1
    if whole.endswith(text):
        return len(whole) - len(text)
    return whole.find(text)


def _slice(
    tokens: list[ImportedToken], start: int, end: int, label: str, unknown: list[str]
) -> list[ImportedToken]:
    kept, crossing, offset = [], 0, 0
    for token in tokens:
        token_end = offset + len(token.text)
        if offset >= start and token_end <= end:
            kept.append(token)
        elif offset < end and token_end > start:
            crossing += 1
        offset = token_end
    if crossing:
        unknown.append(
            f"{crossing} token(s) of completion {label} cross the edge of the node's text; left out"
        )
    return kept


# ---- small helpers ------------------------------------------------------------------------


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return None if math.isnan(number) else number


def _first_str(*values: object) -> str | None:
    for value in values:
        if isinstance(value, str):
            return value
    return None


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def _shown(value: object) -> str:
    """A value for a message: quoted and cut short; never the repr of a nested structure."""
    if isinstance(value, str):
        text = value if len(value) <= _SHOWN_CHARS else value[:_SHOWN_CHARS] + "..."
        return f"'{text}'"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) < _MAX_ID_INT:
        return str(value)
    return _json_type(value)


def _id_suffix(obj: dict) -> str:
    key = _file_id(obj.get("id"))
    return "" if key is None else f" (id {_shown(key)})"
