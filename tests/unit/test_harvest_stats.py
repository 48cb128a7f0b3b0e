"""Harvest statistics: batch-by-batch and merged totals equal a direct NumPy computation, BOS rows
stay apart, and a saved state resumes bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from vllm_acs.harvest.stats import LayerStats

L, H = 3, 16
LENGTHS = [5, 1, 0, 17, 2, 9, 0, 33, 4]


def _prompts(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """(rows [L, T, H], bos [L, 1, H]) per prompt, float32, with an offset so the mean is not 0."""
    rng = np.random.default_rng(seed)
    prompts = []
    for length in LENGTHS:
        rows = (rng.standard_normal((L, length, H)) * 2.0 + 3.0).astype(np.float32)
        bos = (rng.standard_normal((L, 1, H)) * 50.0 + 100.0).astype(np.float32)
        prompts.append((rows, bos))
    return prompts


def _filled(prompts: list[tuple[np.ndarray, np.ndarray]]) -> LayerStats:
    stats = LayerStats(L, H)
    for rows, bos in prompts:
        stats.add(rows, bos)
    return stats


def _state_close(a: LayerStats, b: LayerStats) -> None:
    sa, sb = a.to_state(), b.to_state()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert sa[name].dtype == sb[name].dtype, name
        np.testing.assert_allclose(sa[name], sb[name], rtol=1e-12, atol=1e-12, err_msg=name)


def test_adding_prompt_by_prompt_equals_a_direct_computation():
    prompts = _prompts()
    stats = _filled(prompts)
    all_rows = np.concatenate([rows for rows, _ in prompts], axis=1)
    x = all_rows.astype(np.float64)
    norms = np.linalg.norm(x, axis=2)
    mean, std = x.mean(axis=1), x.std(axis=1)
    mean_norm, mean_sq_norm = norms.mean(axis=1), (norms**2).mean(axis=1)

    # In float64, before the cast: the merge is exact up to rounding.
    assert stats.count.tolist() == [sum(LENGTHS)] * L
    np.testing.assert_allclose(stats.mean, mean, rtol=1e-10)
    np.testing.assert_allclose(np.sqrt(stats.m2 / stats.count[:, None]), std, rtol=1e-10)
    np.testing.assert_allclose(stats.sum_norm / stats.count, mean_norm, rtol=1e-10)
    np.testing.assert_allclose(stats.sum_sq_norm / stats.count, mean_sq_norm, rtol=1e-10)

    final = stats.final()
    assert final["count"].dtype == np.int64
    assert final["count"].tolist() == [sum(LENGTHS)] * L
    for name, expected in [
        ("mean", mean),
        ("std", std),
        ("mean_norm", mean_norm),
        ("mean_sq_norm", mean_sq_norm),
    ]:
        assert final[name].dtype == np.float32, name
        np.testing.assert_allclose(final[name], expected, rtol=1e-6, err_msg=name)
    assert final["absmax"].dtype == np.float32
    assert np.array_equal(final["absmax"], np.abs(all_rows).max(axis=(1, 2)))


def test_two_accumulators_merged_equal_one():
    prompts = _prompts(1)
    one = _filled(prompts)
    first, second = _filled(prompts[:4]), _filled(prompts[4:])
    second_before = second.to_state()
    first.merge(second)
    _state_close(first, one)
    for name, value in second.to_state().items():
        assert np.array_equal(value, second_before[name]), name


def test_merging_into_an_empty_accumulator_copies_the_other():
    full = _filled(_prompts(2))
    empty = LayerStats(L, H)
    empty.merge(full)
    _state_close(empty, full)


def test_bos_rows_stay_out_of_the_moments_but_give_bos_mean_norm():
    prompts = _prompts(3)
    with_bos = _filled(prompts)
    without_bos = LayerStats(L, H)
    for rows, _ in prompts:
        without_bos.add(rows)
    for name in ("count", "mean", "m2", "sum_norm", "sum_sq_norm", "absmax"):
        assert np.array_equal(getattr(with_bos, name), getattr(without_bos, name)), name

    bos = np.concatenate([b for _, b in prompts], axis=1).astype(np.float64)
    final = with_bos.final()
    assert with_bos.bos_count.tolist() == [len(prompts)] * L
    np.testing.assert_allclose(
        final["bos_mean_norm"], np.linalg.norm(bos, axis=2).mean(axis=1), rtol=1e-6
    )
    assert np.array_equal(without_bos.final()["bos_mean_norm"], np.zeros(L, dtype=np.float32))


def test_an_empty_accumulator_reports_zeros():
    stats = LayerStats(L, H)
    stats.add(np.zeros((L, 0, H), dtype=np.float32), np.zeros((L, 0, H), dtype=np.float32))
    final = stats.final()
    assert final["count"].tolist() == [0] * L
    for name in ("mean", "std", "mean_norm", "mean_sq_norm", "absmax", "bos_mean_norm"):
        assert np.array_equal(final[name], np.zeros(final[name].shape, dtype=np.float32)), name
    assert final["mean"].shape == (L, H) and final["std"].shape == (L, H)


def test_a_saved_state_resumes_bit_for_bit():
    prompts = _prompts(4)
    straight = _filled(prompts)

    resumed = _filled(prompts[:5])
    state = resumed.to_state()
    restored = LayerStats.from_state(state)
    for name, value in restored.to_state().items():
        assert value.dtype == state[name].dtype and np.array_equal(value, state[name]), name
    for rows, bos in prompts[5:]:
        restored.add(rows, bos)

    expected, got = straight.to_state(), restored.to_state()
    assert expected.keys() == got.keys()
    for name in expected:
        assert got[name].dtype == expected[name].dtype, name
        assert np.array_equal(got[name], expected[name]), name


def test_a_state_survives_an_npz_round_trip(tmp_path):
    stats = _filled(_prompts(5))
    path = tmp_path / "stats.npz"
    np.savez(path, **stats.to_state())
    with np.load(path) as loaded:
        restored = LayerStats.from_state(dict(loaded))
    for name, value in stats.to_state().items():
        assert np.array_equal(restored.to_state()[name], value), name


def test_from_state_refuses_a_wrong_state():
    state = LayerStats(L, H).to_state()
    with pytest.raises(ValueError, match="lacks"):
        LayerStats.from_state({k: v for k, v in state.items() if k != "m2"})
    with pytest.raises(ValueError, match="absmax"):
        LayerStats.from_state({**state, "absmax": state["absmax"].astype(np.float64)})


def test_merge_with_different_shapes_raises():
    with pytest.raises(ValueError):
        LayerStats(L, H).merge(LayerStats(L, H + 1))
    with pytest.raises(ValueError):
        LayerStats(L, H).merge(LayerStats(L + 1, H))


def test_add_refuses_rows_of_the_wrong_shape():
    stats = LayerStats(L, H)
    with pytest.raises(ValueError):
        stats.add(np.zeros((L + 1, 2, H), dtype=np.float32))
    with pytest.raises(ValueError):
        stats.add(np.zeros((L, 2, H - 1), dtype=np.float32))
    with pytest.raises(ValueError):
        stats.add(np.zeros((L, 2, H), dtype=np.float32), np.zeros((L, 1, H + 1), np.float32))


def test_float16_rows_are_accepted_and_widened():
    rows = np.random.default_rng(6).standard_normal((L, 7, H)).astype(np.float16)
    stats = LayerStats(L, H)
    stats.add(rows)
    np.testing.assert_allclose(stats.mean, rows.astype(np.float64).mean(axis=1), rtol=1e-12)
