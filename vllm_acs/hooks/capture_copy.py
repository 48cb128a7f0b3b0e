"""A step's captured rows out of the device and into the capture files, off the step's critical
path. Runs in each vLLM worker; tested without vLLM (and without a GPU, through a fake device).

After a forward pass that captured rows, `CaptureCopyOut.submit` starts a copy of the capture
buffer's first rows to the host and queues the step's filing (the rows into each request's file,
then `rows_done` raised) behind it. On CUDA (`CudaCopies`) the copy runs on a side stream into
pinned memory, ordered after the forward pass by an event and non-blocking, so sampling is
launched without waiting for it; the next forward pass that writes capture rows waits for the
copy on the device (`before_capture`), never on the host. On CPU (`HostCopies`) there is no
stream: the rows are read in place and filed at once, through the same code.

Ordering, which is what makes a capture complete before its response is sent:
- The API server reads a capture once the request's final output is back and requires
  `rows_done` to cover its rows (activations/store.py `check_applied`; it reads once, it does
  not wait). A request's final output comes from the scheduler after it has the output of the
  step that sampled the last token, and that step's forward pass computed the last row the
  capture keeps. So each step's rows must be filed before that step's model-runner output
  leaves the worker.
- compat.py holds every step's output for this (`hold_output`): after `sample_tokens` returns,
  it takes `mark` (the newest filing queued, which includes this step's) and files through it
  before the output is handed on: at once for a plain `ModelRunnerOutput` (synchronous
  scheduling: the runner has already waited for the sampled tokens), else inside the async
  output's `get_output`, which vLLM's output thread calls before it sends the output to the
  engine (and which waits for the sampled tokens anyway). The copy was started on its own
  stream before sampling was launched, so that wait is about over when the tokens are back.
- Filings run in submission order, one at a time, and `rows_done` only grows: a step with no
  rows to copy (steering only) queues its `rows_done` behind an earlier step's pending rows
  instead of raising it first. A file whose request finished while its rows were pending is
  closed once they are filed (`retire`).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from ..activations.store import CaptureWriter
from .capture import CaptureSegment, file_rows


class RowCopy(Protocol):
    """One step's rows on their way to the host."""

    def done(self) -> bool:
        """Whether the rows have landed (never blocks)."""
        ...

    def wait(self) -> None:
        """Blocks until the rows have landed."""
        ...

    def bits(self) -> np.ndarray:
        """The rows as bf16 bits (int16) `[rows, hidden]`; only once landed."""
        ...


class CopyDevice(Protocol):
    """Where the capture buffer lives: how its rows come back to the host."""

    # Whether a copy has landed when `start` returns (then the step files at once).
    synchronous: bool

    def has_room(self) -> bool:
        """Whether `start` can run now (host memory free for another step's rows)."""
        ...

    def start(self, rows: int) -> RowCopy:
        """After the forward pass: starts copying the capture buffer's first `rows` rows."""
        ...

    def release(self, copy: RowCopy) -> None:
        """The copy's rows are filed: its host memory may take another step's."""
        ...

    def before_capture(self) -> None:
        """Before a forward pass that writes capture rows: orders it after the copies started
        (on the device; the host does not wait)."""
        ...


class _Landed:
    def __init__(self, bits: np.ndarray) -> None:
        self._bits = bits

    def done(self) -> bool:
        return True

    def wait(self) -> None:
        return None

    def bits(self) -> np.ndarray:
        return self._bits


class HostCopies:
    """The CPU build: the capture buffer is host memory, read in place. Filed at once, before
    the next forward pass can write the buffer again."""

    synchronous = True

    def __init__(self, capture_buffer: torch.Tensor) -> None:
        self._bits = capture_buffer.view(torch.int16).numpy()

    def has_room(self) -> bool:
        return True

    def start(self, rows: int) -> RowCopy:
        return _Landed(self._bits[:rows])

    def release(self, copy: RowCopy) -> None:
        return None

    def before_capture(self) -> None:
        return None


class _CudaCopy:
    def __init__(self, landed: torch.cuda.Event, host: torch.Tensor, rows: int) -> None:
        self.landed = landed
        self.host = host
        self.rows = rows

    def done(self) -> bool:
        return bool(self.landed.query())

    def wait(self) -> None:
        self.landed.synchronize()

    def bits(self) -> np.ndarray:
        return self.host[: self.rows].view(torch.int16).numpy()


class CudaCopies:
    """A CUDA capture buffer: each step's rows go to a pinned host buffer on a side stream,
    after an event recorded behind the forward pass. `slots` pinned buffers of the capture
    buffer's size, made when first needed (vLLM's asynchronous scheduling keeps at most two
    steps in flight; a third waits for the oldest to be filed)."""

    synchronous = False

    def __init__(self, capture_buffer: torch.Tensor, slots: int = 2) -> None:
        self._source = capture_buffer
        self._stream = torch.cuda.Stream(device=capture_buffer.device)
        self._slots = slots
        self._made = 0
        self._free: list[torch.Tensor] = []
        self._last: torch.cuda.Event | None = None  # the newest copy, for before_capture

    def has_room(self) -> bool:
        return bool(self._free) or self._made < self._slots

    def start(self, rows: int) -> RowCopy:
        if self._free:
            host = self._free.pop()
        else:
            self._made += 1
            host = torch.empty(
                (self._source.shape[0] - 1, self._source.shape[1]),  # not the scratch row
                dtype=self._source.dtype,
                pin_memory=True,
            )
        forward_done = torch.cuda.Event()
        forward_done.record()  # on the stream that ran the forward pass
        with torch.cuda.stream(self._stream):
            self._stream.wait_event(forward_done)
            host[:rows].copy_(self._source[:rows], non_blocking=True)
            # Blocking: a host wait sleeps rather than spinning on the driver.
            landed = torch.cuda.Event(blocking=True)
            landed.record(self._stream)
        self._last = landed
        return _CudaCopy(landed, host, rows)

    def release(self, copy: RowCopy) -> None:
        assert isinstance(copy, _CudaCopy)
        self._free.append(copy.host)

    def before_capture(self) -> None:
        if self._last is not None:
            torch.cuda.current_stream().wait_event(self._last)
            self._last = None


class Advancing(Protocol):
    """A request as the filing sees it (the runtime's per-request state)."""

    writer: CaptureWriter | None
    failed: bool


@dataclass
class _Filing:
    """One step's filing: its rows (if any) and each request's new `rows_done`."""

    seq: int
    copy: RowCopy | None
    segments: Sequence[CaptureSegment]
    positions: list[int]
    advance: list[tuple[Advancing, int]]


class CaptureCopyOut:
    """The queue of steps whose rows are on their way to the files. `submit` runs in the
    worker's step (main thread); `file_ready` at the start of a later step; `file_through` where
    an output must wait for its rows, possibly in vLLM's output thread."""

    def __init__(self, device: CopyDevice) -> None:
        self.device = device
        self._pending: deque[_Filing] = deque()
        self._lock = threading.Lock()  # the queue and the retiring list
        self._filing = threading.Lock()  # one filer at a time, in order
        self._retiring: list[Advancing] = []
        self._submitted = 0  # seq of the newest filing queued
        self._filed = 0  # seq of the newest filing done

    @property
    def mark(self) -> int | None:
        """The newest filing still to do (the current step's, right after it), else None."""
        submitted = self._submitted
        return submitted if submitted > self._filed else None

    @property
    def pending(self) -> bool:
        return self._submitted > self._filed

    def submit(
        self,
        rows: int,
        segments: Sequence[CaptureSegment],
        positions: list[int],
        advance: list[tuple[Advancing, int]],
    ) -> None:
        """After a completed forward pass: the step's `rows` captured rows (0: none) to go into
        `segments`, then each request's `rows_done`. Never waits for the device unless every
        host buffer still holds an unfiled step's rows."""
        if not rows and not self.pending:
            _advance(advance)  # nothing in flight to overtake: no queue
            return
        copy = None
        if rows:
            while not self.device.has_room():
                head = self._head()
                if head is None:
                    break
                self.file_through(head.seq)
            copy = self.device.start(rows)
        with self._lock:
            self._submitted += 1
            seq = self._submitted
            self._pending.append(_Filing(seq, copy, segments, positions, advance))
        if self.device.synchronous:
            self.file_through(seq)

    def before_capture(self) -> None:
        self.device.before_capture()

    def file_ready(self) -> None:
        """Files the steps whose rows have landed, in order; never waits (another thread
        filing, or a copy still in flight, leaves the rest for later)."""
        if not self.pending or not self._filing.acquire(blocking=False):
            return
        try:
            while True:
                filing = self._head()
                if filing is None or (filing.copy is not None and not filing.copy.done()):
                    return
                self._file(filing)
        finally:
            self._filing.release()

    def file_through(self, mark: int) -> None:
        """Files every step queued up to `mark` (a value of `mark`), waiting for their rows to
        land."""
        with self._filing:
            while True:
                filing = self._head()
                if filing is None or filing.seq > mark:
                    return
                if filing.copy is not None:
                    filing.copy.wait()
                self._file(filing)

    def retire(self, state: Advancing) -> None:
        """A request finished: close its file now, or once the rows queued for it are filed."""
        with self._lock:
            if any(state is s for filing in self._pending for s, _ in filing.advance):
                self._retiring.append(state)
                return
        _close(state)

    def _head(self) -> _Filing | None:
        with self._lock:
            return self._pending[0] if self._pending else None

    def _file(self, filing: _Filing) -> None:
        """Under `_filing`, the copy landed: rows into the files, then `rows_done`."""
        try:
            if filing.copy is not None:
                file_rows(filing.copy.bits(), filing.segments, filing.positions)
            _advance(filing.advance)
        finally:  # a filing that raised is not retried: its requests' rows_done stay short
            if filing.copy is not None:
                self.device.release(filing.copy)
            self._dequeue(filing)

    def _dequeue(self, filing: _Filing) -> None:
        with self._lock:
            self._pending.popleft()
            self._filed = filing.seq
            if not self._retiring:
                return
            waiting = [s for f in self._pending for s, _ in f.advance]
            done = [state for state in self._retiring if not any(state is s for s in waiting)]
            self._retiring = [s for s in self._retiring if not any(s is d for d in done)]
        for state in done:
            _close(state)


def _advance(advance: list[tuple[Advancing, int]]) -> None:
    for state, rows_done in advance:
        if state.writer is not None and not state.failed:
            state.writer.advance(rows_done)


def _close(state: Advancing) -> None:
    if state.writer is not None:
        state.writer.close()
