"""IdempotencyMiddleware: a writing POST sent again with its Idempotency-Key gets the first answer.

API server process, just inside Auth (records are scoped to the caller's key). Same key and body:
the stored answer with `Idempotent-Replayed: true`; other body: `409 idempotency_conflict`; the
first still in flight: `409 running`; the first ended without an answer: `409 no_answer`. A
request refused before its work started (a 4xx) stores nothing. A route that writes its own rows
may store the answer in the same transaction (`IdempotencyClaim.completed`), so an accepted job is
never without its record (`IdempotencyClaim` on `scope["state"]`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
from collections.abc import Callable, Mapping
from datetime import datetime, timezone

from ..auth.key_auth import bearer_token
from ..auth.principal import PRINCIPAL_STATE_KEY, Principal
from ..contract.routes import template_pattern
from ..errors import (
    AcsError,
    IdempotencyConflict,
    IdempotencyNoAnswer,
    IdempotencyRunning,
    InvalidRequest,
)
from ..storage.idempotency import (
    IDEMPOTENCY_STATE_KEY,
    Existing,
    IdempotencyClaim,
    IdempotencyRecords,
    IdempotencyTarget,
    StoredAnswer,
)
from .asgi import ASGIApp, Message, Receive, Scope, Send, header, read_body, replay_body, send_error

logger = logging.getLogger(__name__)

# (stored body, the caller's bearer secret or None, the Idempotency-Key) -> body: what a route
# stores instead of its answer, and how a replay gets the answer back (`POST /v1/keys` seals
# the new secret; account/sealed_answer.py).
Seal = Callable[[str, str | None, str], str]

REPLAYED_HEADER = b"idempotent-replayed"
# 1-255 printable ASCII characters (shared/spec/DECISIONS.md).
_KEY_PATTERN = re.compile(r"[\x20-\x7e]{1,255}")
# Headers of the first answer that a replay repeats (the request id is the new request's own).
_STORED_HEADERS = ("content-type", "location")
# How long a record stays `running` without an answer before it reads as `no_answer` (a crash).
RUNNING_LEASE_S = 120.0


# Bodies above this are fingerprinted by their bytes: parsing a large body (a harvest takes 50 MB)
# on the event loop would stall the node, and would burn its CPU for a submit that the route may
# then refuse at once. A resent request carries the same bytes.
CANONICAL_LIMIT_BYTES = 1024 * 1024


def fingerprint(route: str, body: bytes) -> str:
    """The body's identity: canonical JSON (key order and spacing do not matter) up to
    CANONICAL_LIMIT_BYTES, else the bytes."""
    canonical = body
    if len(body) <= CANONICAL_LIMIT_BYTES:
        with contextlib.suppress(ValueError, UnicodeDecodeError, RecursionError):
            canonical = json.dumps(
                json.loads(body), sort_keys=True, separators=(",", ":"), ensure_ascii=False
            ).encode()
    return hashlib.sha256(route.encode() + b"\n" + canonical).hexdigest()


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class IdempotencyMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        records: IdempotencyRecords,
        routes: Mapping[str, bool],
        *,
        clock: Callable[[], datetime] = utc_now,
        seals: Mapping[str, tuple[Seal, Seal]] | None = None,
    ) -> None:
        self.app = app
        self.records = records
        # Path template (`/v1/looms/{loom_id}/nodes/{node_id}/branch`) -> whether the key is
        # required there (optional elsewhere).
        self.routes = [(template_pattern(t), required) for t, required in routes.items()]
        self.clock = clock
        # Path template -> (seal, unseal) of its stored answer.
        self.seals = [(template_pattern(t), pair) for t, pair in (seals or {}).items()]

    def _seal(self, path: str) -> tuple[Seal, Seal] | None:
        return next((pair for p, pair in self.seals if p.fullmatch(path)), None)

    def _required(self, path: str) -> bool | None:
        """Whether this writing POST needs the key; None: not a route with idempotency."""
        return next((required for p, required in self.routes if p.fullmatch(path)), None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        required = self._required(path) if scope.get("method") == "POST" else None
        if scope["type"] != "http" or required is None:
            await self.app(scope, receive, send)
            return
        principal = scope.get("state", {}).get(PRINCIPAL_STATE_KEY)
        value = header(scope, b"idempotency-key")
        try:
            if value is None and required:
                raise InvalidRequest(
                    f"POST {path} needs an Idempotency-Key header (1-255 printable ASCII "
                    "characters): a resent submit with the same key returns the first answer.",
                    param="Idempotency-Key",
                )
            if value is not None and not _KEY_PATTERN.fullmatch(value):
                raise InvalidRequest(
                    "Idempotency-Key must be 1-255 printable ASCII characters.",
                    param="Idempotency-Key",
                )
        except AcsError as error:
            await send_error(scope, send, error)
            return
        if value is None or not isinstance(principal, Principal):
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        target = IdempotencyTarget(principal.key_id, value)
        identity = fingerprint(path, body)
        found = await self.records.reserve(target, path, identity, self.clock(), RUNNING_LEASE_S)
        if isinstance(found, Existing):
            await self._answer_existing(scope, send, found, identity)
            return
        await self._first(scope, replay_body(body, receive), send, target)

    async def _answer_existing(
        self, scope: Scope, send: Send, found: Existing, wanted: str
    ) -> None:
        if found.fingerprint != wanted:
            error: AcsError = IdempotencyConflict(
                "This Idempotency-Key was used with another request body; use a new key for a "
                "new request."
            )
        elif found.state == "done" and found.answer is not None:
            answer, seal = found.answer, self._seal(scope.get("path", ""))
            if seal is not None:
                opened = seal[1](answer.body, _caller_secret(scope), _key_of(scope))
                answer = StoredAnswer(answer.status, opened, answer.headers)
            await _send_stored(send, answer)
            return
        elif found.state == "running":
            error = IdempotencyRunning(
                "The first request with this Idempotency-Key is still running; retry shortly."
            )
        else:
            error = IdempotencyNoAnswer(
                "The first request with this Idempotency-Key ended without an answer to replay; "
                "send the request again with a new key."
            )
        await send_error(scope, send, error)

    async def _first(
        self, scope: Scope, receive: Receive, send: Send, target: IdempotencyTarget
    ) -> None:
        claim = IdempotencyClaim(target)
        scope.setdefault("state", {})[IDEMPOTENCY_STATE_KEY] = claim
        status = 0
        headers: list[tuple[bytes, bytes]] = []
        chunks: list[bytes] = []

        async def send_keeping(message: Message) -> None:
            nonlocal status, headers
            if message["type"] == "http.response.start":
                status, headers = int(message["status"]), list(message.get("headers", ()))
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_keeping)
        except BaseException:
            if not claim.completed:
                await self.records.abandon(target)
            raise
        if claim.completed:
            return
        if 400 <= status < 500 or status == 0:
            # Refused before the work started (or nobody answered): nothing to replay.
            await self.records.release(target)
            return
        stored = b"".join(chunks).decode("utf-8", "replace")
        seal = self._seal(scope.get("path", ""))
        if seal is not None:
            stored = seal[0](stored, _caller_secret(scope), target.idempotency_key)
        answer = StoredAnswer(status, stored, _kept(headers))
        await self.records.complete(target, answer, self.clock())


def _caller_secret(scope: Scope) -> str | None:
    value = header(scope, b"authorization")
    return None if value is None else bearer_token({"authorization": value})


def _key_of(scope: Scope) -> str:
    return header(scope, b"idempotency-key") or ""


def _kept(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    return {
        k.decode("latin-1").lower(): v.decode("latin-1")
        for k, v in headers
        if k.decode("latin-1").lower() in _STORED_HEADERS
    }


async def _send_stored(send: Send, answer: StoredAnswer) -> None:
    payload = answer.body.encode()
    raw = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.headers.items()]
    raw += [(b"content-length", str(len(payload)).encode()), (REPLAYED_HEADER, b"true")]
    await send({"type": "http.response.start", "status": answer.status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})
