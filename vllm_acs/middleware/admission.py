"""AdmissionMiddleware: a slot, a start and the Hold before a completion runs; Settle after it.

API server process, after StrictValidation and before Rewrite. It reads the ValidatedCompletion
and the principal from `scope["state"]`, may lower max_tokens (X-Acs-Max-Tokens-Clamped), answers
429 spend_cap / budget_exceeded / activation_quota_exceeded / rate_limited / queue_full, and
settles the Hold to the real usage however the request ends, then queues one metadata-only usage
row.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timezone

from ..auth.principal import PRINCIPAL_STATE_KEY, REPLAY_SCOPE_KEY, Principal, Replay
from ..auth.refusals import refusal
from ..contract.validated import VALIDATED_COMPLETION_KEY, ValidatedCompletion
from ..errors import AcsError, CountersUnavailable, SpendCap
from ..metrics import ADMISSIONS, TOKENS_SETTLED, SlotGauges
from ..storage.counters import AdmitRequest, Counters, Ticket, activation_units
from ..storage.errors import BudgetExhausted, LeaseLost, QueueFull, StartsExhausted
from ..storage.ledger import UsageLedger
from ..storage.usage import UsageRow
from .admission_wait import ClientGone, wait_watching_disconnect
from .asgi import ASGIApp, Message, Receive, Scope, Send, request_id, send_error
from .request_window import WINDOW_ENDED_STATE_KEY
from .response_usage import ResponseUsage

logger = logging.getLogger(__name__)
CLAMP_HEADER = b"x-acs-max-tokens-clamped"


class AdmissionMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        counters: Counters,
        ledger: UsageLedger,
        *,
        path: str = "/v1/completions",
    ) -> None:
        self.app = app
        self.counters = counters
        self.ledger = ledger
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = scope.get("state") or {}
        validated = state.get(VALIDATED_COMPLETION_KEY)
        principal = state.get(PRINCIPAL_STATE_KEY)
        if (
            scope["type"] != "http"
            or scope.get("method") != "POST"
            or scope.get("path") != self.path
            or not isinstance(validated, ValidatedCompletion)
            or not isinstance(principal, Principal)
        ):
            await self.app(scope, receive, send)
            return
        await _Admission(self, scope, validated, principal).run(receive, send)


def _lease_lost() -> AcsError:
    return CountersUnavailable(
        "This request lost its place in the shared counters (Redis restarted, or the node "
        "stalled past its lease) and was stopped; send it again."
    )


def receive_until(event: asyncio.Event, receive: Receive) -> Receive:
    """A receive() that reports a disconnect once `event` is set (the app then aborts the
    request, as for a client that left); the pending real receive is kept for the next call."""
    pending: asyncio.Future[Message] | None = None

    async def watched() -> Message:
        nonlocal pending
        if event.is_set():
            return {"type": "http.disconnect"}
        if pending is None:
            pending = asyncio.ensure_future(receive())
        stop = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait({pending, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if pending.done():
            message, pending = pending.result(), None
            return message
        return {"type": "http.disconnect"}

    return watched


class _Admission:
    """The state of one admitted request (a responder: nothing per request on the middleware)."""

    def __init__(
        self,
        middleware: AdmissionMiddleware,
        scope: Scope,
        validated: ValidatedCompletion,
        principal: Principal,
    ) -> None:
        self.m = middleware
        self.scope = scope
        self.validated = validated
        self.principal = principal
        self.started = time.perf_counter()
        self.admitted_at = datetime.now(timezone.utc)
        self.meter = ResponseUsage(stream=validated.stream)
        self.ticket: Ticket | None = None
        self.replayed = isinstance(scope.get(REPLAY_SCOPE_KEY), Replay)

    async def run(self, receive: Receive, send: Send) -> None:
        try:
            if self.principal.spend_capped:
                raise SpendCap()
            try:
                self.ticket = await self.m.counters.admit(
                    AdmitRequest(
                        principal=self.principal,
                        prompt_tokens=self.validated.prompt_tokens,
                        choices=self.validated.choices,
                        max_tokens=self.validated.max_tokens,
                        activation=self.validated.activations is not None,
                        # A job took its start at submit, and refuses instead of clamping, as
                        # does a caller that sent `X-Acs-Budget-Clamp: refuse`.
                        count_start=not self.replayed,
                        allow_clamp=not self.replayed and self.validated.may_clamp_to_budget,
                    )
                )
            except (BudgetExhausted, StartsExhausted, QueueFull) as error:
                raise refusal(error) from None
        except AcsError as error:
            ADMISSIONS.labels(outcome=error.code).inc()
            await send_error(self.scope, send, error)
            self._record(error.status, 0, 0)
            return
        self.validated.clamp(self.ticket.applied_max_tokens, "budget")
        ADMISSIONS.labels(outcome="admitted" if self.ticket.running else "queued").inc()
        gauges = SlotGauges(
            running=self.ticket.running,
            held_tokens=self.validated.prompt_tokens
            + self.validated.choices * self.ticket.applied_max_tokens,
        )
        try:
            if not self.ticket.running:
                receive = await wait_watching_disconnect(self.m.counters, self.ticket, receive)
                gauges.start_running()
            # From here the engine works on the prompt: what a dead process's hold settles at.
            self.m.counters.report_progress(self.ticket, self.validated.prompt_tokens, 0)
            meter = self.meter
            await self.m.app(
                self.scope, receive_until(self.ticket.lease_lost, receive), self._send_through(send)
            )
            if self.ticket.lease_lost.is_set():
                if meter.status:  # the answer began: a stream ends with the error's frame
                    raise _lease_lost()
                meter.status = 503
                await send_error(self.scope, send, _lease_lost())
        except ClientGone:
            self.meter.status = 499  # nobody to answer: the client left while its request waited
        except LeaseLost:
            self.meter.status = 429
            await send_error(self.scope, send, refusal(QueueFull(1000)))
        except asyncio.CancelledError:
            self.meter.status = self.meter.status or 499
            raise
        finally:
            gauges.release()
            if self.scope.get("state", {}).get(WINDOW_ENDED_STATE_KEY):
                # Stopped at the request window: the client is answered 504 upstream_deadline
                # (or that envelope inside a committed 200), whatever vLLM said on being stopped.
                self.meter.status = 504
            prompt, completion = self.meter.tokens(self.validated.prompt_tokens)
            TOKENS_SETTLED.labels(kind="prompt").inc(prompt)
            TOKENS_SETTLED.labels(kind="completion").inc(completion)
            units = (
                activation_units(self.ticket, prompt, completion)
                if self.validated.activations is not None
                else 0
            )
            self._record(self.meter.status or 500, prompt, completion, units)
            try:
                # Shielded: a cancelled request must still give its slot and Hold back.
                await asyncio.shield(self.m.counters.settle(self.ticket, prompt, completion))
            except Exception:
                # The counters' store is down: the lease expires and settles at the progress.
                logger.exception("settling request %s failed", request_id(self.scope))

    def _send_through(self, send: Send) -> Send:
        counters, ticket, meter = self.m.counters, self.ticket, self.meter
        assert ticket is not None
        header = self.validated.clamp_header()

        async def send_metered(message: Message) -> None:
            if message["type"] == "http.response.start":
                meter.status = int(message["status"])
                if header is not None:
                    headers = [(k, v) for k, v in message.get("headers", ()) if k != CLAMP_HEADER]
                    headers.append((CLAMP_HEADER, header.encode("latin-1")))
                    message = {**message, "headers": headers}
            elif message["type"] == "http.response.body":
                meter.feed(message.get("body", b""))
                if meter.stream and meter.status == 200:
                    counters.report_progress(
                        ticket, self.validated.prompt_tokens, meter.streamed_tokens
                    )
            await send(message)

        return send_metered

    def _record(self, status: int, prompt: int, completion: int, activations: int = 0) -> None:
        self.m.ledger.record(
            UsageRow(
                route=self.scope.get("path", ""),
                status=status,
                latency_ms=int((time.perf_counter() - self.started) * 1000),
                prompt_tokens=prompt,
                completion_tokens=completion,
                request_id=request_id(self.scope),
                key_id=self.principal.key_id,
                key_prefix=self.principal.key_prefix,
                account_id=self.principal.account_id,
                model=self.validated.model.id,
                workload=self.validated.workload,
                activation_requests=activations,
                created_at=self.admitted_at,
            )
        )
