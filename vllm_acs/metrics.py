"""The plugin's Prometheus series, served by vLLM's own `/metrics` beside vLLM's.

A leaf module, API server process. The series live in prometheus_client's default registry,
the one vLLM's `/metrics` serves (with several API server processes vLLM sets
PROMETHEUS_MULTIPROC_DIR before this module is imported, and the values go through its files).
Labels are bounded: a route template, a method, a status, a spec error code, an outcome; never
a key, a prompt or a request id.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# Methods the API knows; any other a client sends is counted as OTHER.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

REQUESTS = Counter(
    "acs_requests",
    "Requests answered by this node, by route template, method, status and spec error code "
    "(empty for a success); route 'other' is every path outside the surface.",
    ["route", "method", "status", "code"],
)
VALIDATION_SECONDS = Histogram(
    "acs_validation_seconds",
    "Time to parse and validate one /v1/completions body (tokenizing included).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0),
)
ADMISSIONS = Counter(
    "acs_admissions",
    "Admission outcomes: admitted (a running slot at once), queued (waits for a slot), or the "
    "429 code of a refusal.",
    ["outcome"],
)
RUNNING = Gauge(
    "acs_running_requests",
    "Requests of this node holding a running slot.",
    multiprocess_mode="livesum",
)
WAITING = Gauge(
    "acs_waiting_requests",
    "Requests of this node queued for a running slot.",
    multiprocess_mode="livesum",
)
TOKENS_HELD = Gauge(
    "acs_tokens_held",
    "Tokens this node's in-flight requests hold on their budgets (prompt + worst-case output).",
    multiprocess_mode="livesum",
)
TOKENS_SETTLED = Counter(
    "acs_tokens_settled",
    "Tokens charged when requests settled, by kind (prompt or completion).",
    ["kind"],
)
ACTIVATION_REQUESTS = Counter(
    "acs_activation_requests",
    "Requests that reached the engine with an activation payload, by kind (capture, steering; "
    "a request doing both counts in both).",
    ["kind"],
)
CAPTURE_ROWS = Counter(
    "acs_capture_rows",
    "Token positions read back from capture files (each holds every captured layer).",
)
CAPTURE_BYTES = Counter(
    "acs_capture_bytes",
    "Bytes of captured residual stream read back from capture files (bf16).",
)

JOB_RUNS = Counter(
    "acs_job_runs",
    "Job runs on this node by kind and how they ended: succeeded, failed, handed_back (to wait "
    "or at shutdown), stopped (cancelled or lease lost), fenced_out (its end came too late).",
    ["kind", "outcome"],
)
RUNNING_JOBS = Gauge("acs_running_jobs", "Jobs this node runs now.", multiprocess_mode="livesum")
WAITING_JOB_READS = Gauge(
    "acs_waiting_job_reads",
    "Job reads (`?wait=`) held until their job ends, on this node (capped by job_long_polls).",
    multiprocess_mode="livesum",
)
REAPED_JOBS = Counter(
    "acs_reaped_jobs", "Jobs whose lease expired (their process died), handed back or failed."
)


def method_label(method: str) -> str:
    return method if method in KNOWN_METHODS else "OTHER"


class SlotGauges:
    """One admitted request's place in the running and waiting gauges, and its Hold."""

    def __init__(self, *, running: bool, held_tokens: int) -> None:
        self.running = running
        self.held_tokens = held_tokens
        self.released = False
        (RUNNING if running else WAITING).inc()
        TOKENS_HELD.inc(held_tokens)

    def start_running(self) -> None:
        if not self.running and not self.released:
            WAITING.dec()
            RUNNING.inc()
            self.running = True

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        (RUNNING if self.running else WAITING).dec()
        TOKENS_HELD.dec(self.held_tokens)


FORWARDED = Counter(
    "acs_forwarded_requests",
    "Requests for another node's model: forwarded (answered by that node) or ejected (its "
    "connection failed; the next node is tried).",
    ["outcome"],
)
OUTAGES = Counter(
    "acs_shared_service_outages",
    "Requests answered 503 because a shared service did not answer: the database, the "
    "counters (Redis) or the object store of the job files.",
    ["service"],
)
USAGE_ROWS_PENDING = Gauge(
    "acs_usage_rows_pending",
    "Usage rows this node holds that the database has not taken yet (the ledger's queue and "
    "the batch being written); it grows while the database is down.",
    multiprocess_mode="livesum",
)
USAGE_ROWS_DROPPED = Counter(
    "acs_usage_rows_dropped",
    "Usage rows this node could not write, each also logged at ERROR with its metadata: refused "
    "(the database refused the row itself, on a data error, even with over-long text cut), "
    "queue_full (usage_queue_max_rows were waiting), shutdown (still waiting when the server "
    "stopped).",
    ["reason"],
)
LEASES_LOST = Counter(
    "acs_leases_lost",
    "In-flight requests whose Redis lease had lapsed when this process renewed it (a stalled "
    "process, or Redis restarted): the slot and hold are put back for the rest of the request.",
)
