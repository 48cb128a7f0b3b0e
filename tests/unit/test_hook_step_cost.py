"""benchmarks/hook_step_cost.py runs and reports (its figures are not asserted: timings on a shared
machine are not a test's business)."""

from __future__ import annotations

from benchmarks import hook_step_cost


def test_the_step_cost_benchmark_runs_every_mode_and_reports(capsys):
    hook_step_cost.main(["--quick"])
    out = capsys.readouterr().out
    for mode in hook_step_cost.MODES:
        line = next(line for line in out.splitlines() if line.startswith(mode))
        assert line.count(" us") == 2 * len(hook_step_cost.BATCHES) + 1


def test_a_run_steps_every_scheduled_step_and_ends_its_requests():
    cost = hook_step_cost.measure("capture_1_layer", 2, output_tokens=5, runs=2)
    assert cost.steps == 2 * 5 + 1  # per run a prefill and 4 decode steps; the last end's step
