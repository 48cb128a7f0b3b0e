"""core_placement: which cores are left for the node's own threads, and the binding itself on a
real process tree (a child that binds its threads to one core, as vLLM binds a CPU worker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from vllm_acs.core_placement import cores_left

ALL = frozenset({0, 1, 2, 3})


def test_the_cores_a_bound_thread_holds_are_left_out():
    masks = [ALL, ALL, frozenset({0}), frozenset({1}), ALL]
    assert cores_left(masks, ALL) == {2, 3}


def test_nothing_to_do_when_no_thread_is_bound():
    assert cores_left([ALL, ALL], ALL) is None


def test_nothing_to_do_when_the_bound_threads_hold_every_core():
    assert cores_left([ALL, frozenset({0, 1}), frozenset({2, 3})], ALL) is None


def test_a_mask_outside_the_allowed_set_is_not_a_bound_thread():
    # An operator ran the API server with `taskset -c 2,3`; a thread elsewhere is not ours.
    assert cores_left([frozenset({2, 3}), frozenset({0})], frozenset({2, 3})) is None


# A "worker": binds its main thread to one core, starts a helper thread (which inherits that
# core), and a second one that it leaves on every core it may use.
WORKER = textwrap.dedent(
    """
    import os, sys, threading, time
    every, core = os.sched_getaffinity(0), int(sys.argv[1])
    os.sched_setaffinity(0, {core})
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    os.sched_setaffinity(0, every)
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    os.sched_setaffinity(0, {core})
    print("ready", flush=True)
    time.sleep(60)
    """
)
# The node: starts the worker and a helper thread of its own, then binds.
TREE = textwrap.dedent(
    """
    import json, os, subprocess, sys, threading, time
    from vllm_acs.core_placement import keep_off_worker_cores

    worker = subprocess.Popen(
        [sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, text=True
    )
    try:
        assert worker.stdout.readline().strip() == "ready"
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        left = keep_off_worker_cores()
        later = []
        started = threading.Thread(target=lambda: later.append(sorted(os.sched_getaffinity(0))))
        started.start()
        started.join()

        def masks(pid):
            tasks = os.listdir(f"/proc/{pid}/task")
            return sorted(sorted(os.sched_getaffinity(int(t))) for t in tasks)

        print(json.dumps({
            "left": sorted(left),
            "ours": masks(os.getpid()),
            "worker": masks(worker.pid),
            "later": later[0],
        }))
    finally:  # a failed check leaves no sleeping worker behind
        worker.kill()
    """
)


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs two cores to bind one away from the other"
)
def test_a_process_tree_goes_to_the_cores_its_bound_threads_left():
    allowed = sorted(os.sched_getaffinity(0))
    core, rest = allowed[0], allowed[1:]
    out = subprocess.run(
        [sys.executable, "-c", TREE, WORKER, str(core)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["left"] == rest
    # Every thread of this process (its main thread and its helper among them) is off the
    # worker's core.
    assert len(seen["ours"]) >= 2 and all(mask == rest for mask in seen["ours"])
    # The worker's bound threads stay on its core; the one it left unbound moves.
    assert seen["worker"] == sorted([[core], [core], rest])
    # A thread started afterwards inherits the binding.
    assert seen["later"] == rest
