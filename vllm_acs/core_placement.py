"""Keeps the node's own threads off the cores vLLM bound its CPU workers to.

API server process, once the engine is up, on vLLM's CPU build. With `VLLM_CPU_OMP_THREADS_BIND`
at `auto` (vLLM's default) or a core list, vLLM binds each worker's OpenMP threads to cores of
their own and leaves the others (on x86, one core per worker) for the rest of the node. It binds
nothing else: the API server's and EngineCore's threads still run on any core, the workers'
included, where an OpenMP thread computes without pause while a harvest runs. Measured on two
cores (docs/decisions.md, "The node's own threads stay off the workers' cores"), a thread that
waits there for its turn can wait a second or more; so this binds every thread of the node's
process tree that vLLM left unbound to the cores it left free.

Nothing changes when vLLM bound nothing (`nobind`: the test harness, several nodes on one
machine), when it left no core free, or when the API server is not EngineCore's parent (more
than one API server).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import psutil


def cores_left(masks: Iterable[frozenset[int]], allowed: frozenset[int]) -> frozenset[int] | None:
    """The cores of `allowed` that no bound thread holds: a thread is bound when its mask is
    narrower than `allowed`. None when no thread is bound, or when the bound ones hold them all."""
    bound = frozenset[int]().union(*(mask for mask in masks if mask < allowed))
    left = allowed - bound
    return left if bound and left else None


def _thread_masks(root: psutil.Process) -> dict[int, frozenset[int]]:
    """The CPU mask of every thread of `root` and its descendants (those that ended meanwhile
    left out)."""
    masks: dict[int, frozenset[int]] = {}
    for process in [root, *root.children(recursive=True)]:
        try:
            threads = process.threads()
        except psutil.Error:
            continue
        for thread in threads:
            try:
                masks[thread.id] = frozenset(os.sched_getaffinity(thread.id))
            except OSError:
                continue
    return masks


def keep_off_worker_cores(pid: int | None = None) -> frozenset[int] | None:
    """Binds every thread of the process tree under `pid` (this process by default) whose mask
    is the process's whole set to the cores that no bound thread holds. The cores it bound them
    to, or None when there was nothing to do. Threads started later inherit their starter's
    mask, so they stay off too."""
    root = psutil.Process(pid or os.getpid())
    allowed = frozenset(os.sched_getaffinity(root.pid))
    masks = _thread_masks(root)
    left = cores_left(masks.values(), allowed)
    if left is None:
        return None
    for thread_id, mask in masks.items():
        if mask == allowed:
            try:
                os.sched_setaffinity(thread_id, left)
            except OSError:  # ended meanwhile
                continue
    return left
