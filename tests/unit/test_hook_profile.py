"""benchmarks/hook_profile.py's attribution of py-spy samples to the plugin."""

from __future__ import annotations

from benchmarks.hook_profile import plugin_share

LOOP = "a (x.py:1);WorkerProc.worker_busy_loop (vllm/v1/executor/m.py:1)"


def test_a_sample_is_the_plugins_when_its_innermost_owner_frame_is():
    raw = "\n".join(
        (
            # The plugin's code calling a torch op: the plugin's.
            f"{LOOP};f (vllm_acs/hooks/runtime.py:3);add (torch/_ops.py:9) 3",
            # The plugin's wrapper running vLLM's forward: vLLM's.
            f"{LOOP};f (vllm_acs/hooks/compat.py:3);g (vllm/model.py:2) 5",
            # The op called from the compiled graph: the plugin's.
            f"{LOOP};f (vllm_acs/hooks/compat.py:3);k (torch/_inductor/x.py:2);"
            "op (vllm_acs/hooks/intervention_op.py:5) 2",
            # Another thread than the worker's main loop: not counted at all.
            "other (y.py:1) 7",
        )
    )
    share, samples, lines = plugin_share(raw)
    assert (share, samples) == (0.5, 10)
    assert lines == {"runtime.py:3 f": 3, "intervention_op.py:5 op": 2}
