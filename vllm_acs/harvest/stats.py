"""Exact per-layer statistics of harvested residual-stream rows (API server process).

Batches merge with Chan et al.'s parallel formula, so totals equal a direct computation over every
row. BOS rows are kept apart: their outlier norms would skew SAE normalisation. std is the
population std (ddof=0).
"""

from __future__ import annotations

import numpy as np

# The accumulator state and each array's dtype; from_state insists on exactly these.
_STATE_DTYPES: dict[str, np.dtype] = {
    "count": np.dtype(np.int64),
    "mean": np.dtype(np.float64),
    "m2": np.dtype(np.float64),
    "sum_norm": np.dtype(np.float64),
    "sum_sq_norm": np.dtype(np.float64),
    "absmax": np.dtype(np.float32),
    "bos_count": np.dtype(np.int64),
    "bos_sum_norm": np.dtype(np.float64),
}
_PER_DIM = frozenset({"mean", "m2"})


class LayerStats:
    """Running count, mean, M2, norms and absmax for each of n_layers kept layers of hidden dims."""

    def __init__(self, n_layers: int, hidden: int) -> None:
        if n_layers < 1 or hidden < 1:
            raise ValueError(f"need n_layers >= 1 and hidden >= 1, got {n_layers}, {hidden}")
        self.n_layers = n_layers
        self.hidden = hidden
        self.count = np.zeros(n_layers, dtype=np.int64)
        self.mean = np.zeros((n_layers, hidden), dtype=np.float64)
        self.m2 = np.zeros((n_layers, hidden), dtype=np.float64)
        self.sum_norm = np.zeros(n_layers, dtype=np.float64)
        self.sum_sq_norm = np.zeros(n_layers, dtype=np.float64)
        self.absmax = np.zeros(n_layers, dtype=np.float32)
        self.bos_count = np.zeros(n_layers, dtype=np.int64)
        self.bos_sum_norm = np.zeros(n_layers, dtype=np.float64)

    def _check_rows(self, rows: np.ndarray, name: str) -> None:
        if rows.ndim != 3 or rows.shape[0] != self.n_layers or rows.shape[2] != self.hidden:
            raise ValueError(
                f"{name} must be [{self.n_layers}, T, {self.hidden}], got {list(rows.shape)}"
            )
        if not np.issubdtype(rows.dtype, np.floating):
            raise ValueError(f"{name} must be a float array, got {rows.dtype}")

    def add(self, rows: np.ndarray, bos_rows: np.ndarray | None = None) -> None:
        """Fold in one prompt: rows [L, T, H] its non-BOS tokens (T may be 0), bos_rows [L, B, H].

        B is 0 or 1 in practice; any float dtype is widened to float64 first.
        """
        self._check_rows(rows, "rows")
        if bos_rows is not None:
            self._check_rows(bos_rows, "bos_rows")
            if bos_rows.shape[1]:
                bos64 = bos_rows.astype(np.float64)
                self.bos_count += bos_rows.shape[1]
                self.bos_sum_norm += np.sqrt(np.einsum("lth,lth->lt", bos64, bos64)).sum(axis=1)
        n_tokens = rows.shape[1]
        if n_tokens == 0:
            return
        x = rows.astype(np.float64)
        batch_mean = x.mean(axis=1)
        deviation = x - batch_mean[:, None, :]
        batch_m2 = np.einsum("lth,lth->lh", deviation, deviation)
        batch_count = np.full(self.n_layers, n_tokens, dtype=np.int64)
        self._merge_moments(batch_count, batch_mean, batch_m2)
        sq_norms = np.einsum("lth,lth->lt", x, x)
        self.sum_norm += np.sqrt(sq_norms).sum(axis=1)
        self.sum_sq_norm += sq_norms.sum(axis=1)
        batch_absmax = np.abs(rows).max(axis=(1, 2)).astype(np.float32)
        np.maximum(self.absmax, batch_absmax, out=self.absmax)

    def _merge_moments(self, n_b: np.ndarray, mean_b: np.ndarray, m2_b: np.ndarray) -> None:
        """Chan et al.: combine (count, mean, M2) of two disjoint sets without revisiting rows."""
        n_a = self.count
        n = n_a + n_b
        # Layers where both sides are empty stay at zero rather than dividing by zero.
        safe_n = np.where(n > 0, n, 1).astype(np.float64)
        delta = mean_b - self.mean
        weight_b = (n_b / safe_n)[:, None]
        self.mean = self.mean + delta * weight_b
        self.m2 = self.m2 + m2_b + delta * delta * ((n_a * n_b) / safe_n)[:, None]
        self.count = n

    def merge(self, other: LayerStats) -> None:
        """Fold another accumulator over disjoint rows into this one; other is left unchanged."""
        if (other.n_layers, other.hidden) != (self.n_layers, self.hidden):
            raise ValueError(
                f"cannot merge stats of shape [{other.n_layers}, {other.hidden}] into "
                f"[{self.n_layers}, {self.hidden}]"
            )
        self._merge_moments(other.count, other.mean, other.m2)
        self.sum_norm = self.sum_norm + other.sum_norm
        self.sum_sq_norm = self.sum_sq_norm + other.sum_sq_norm
        self.absmax = np.maximum(self.absmax, other.absmax)
        self.bos_count = self.bos_count + other.bos_count
        self.bos_sum_norm = self.bos_sum_norm + other.bos_sum_norm

    def to_state(self) -> dict[str, np.ndarray]:
        """The exact accumulator, copied, for saving after each shard and resuming later."""
        return {name: getattr(self, name).copy() for name in _STATE_DTYPES}

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> LayerStats:
        """Rebuild from to_state(); bit-identical, and refuses missing keys, dtypes or shapes."""
        missing = set(_STATE_DTYPES) - set(state)
        if missing:
            raise ValueError(f"stats state lacks {sorted(missing)}")
        mean = np.asarray(state["mean"])
        if mean.ndim != 2:
            raise ValueError(f"stats state mean must be [L, H], got {list(mean.shape)}")
        stats = cls(mean.shape[0], mean.shape[1])
        for name, dtype in _STATE_DTYPES.items():
            value = np.asarray(state[name])
            expected = mean.shape if name in _PER_DIM else mean.shape[:1]
            if value.dtype != dtype or value.shape != expected:
                raise ValueError(
                    f"stats state {name} must be {dtype} {list(expected)}, "
                    f"got {value.dtype} {list(value.shape)}"
                )
            setattr(stats, name, value.copy())
        return stats

    def final(self) -> dict[str, np.ndarray]:
        """What users get: count, mean, std, mean_norm, mean_sq_norm, absmax, bos_mean_norm."""
        has_rows = self.count > 0
        safe_count = np.where(has_rows, self.count, 1).astype(np.float64)
        variance = np.where(has_rows[:, None], self.m2 / safe_count[:, None], 0.0)
        has_bos = self.bos_count > 0
        safe_bos = np.where(has_bos, self.bos_count, 1).astype(np.float64)
        return {
            "count": self.count.copy(),
            "mean": np.where(has_rows[:, None], self.mean, 0.0).astype(np.float32),
            "std": np.sqrt(variance).astype(np.float32),
            "mean_norm": np.where(has_rows, self.sum_norm / safe_count, 0.0).astype(np.float32),
            "mean_sq_norm": np.where(has_rows, self.sum_sq_norm / safe_count, 0.0).astype(
                np.float32
            ),
            "absmax": self.absmax.copy(),
            "bos_mean_norm": np.where(has_bos, self.bos_sum_norm / safe_bos, 0.0).astype(
                np.float32
            ),
        }
