"""What a batch costs to run, learnt from finished batches: by its size
(:class:`CostModel`) or by its shape, items and cost (:class:`ShapeCostModel`). The
adaptive policy predicts run times with them; ``microbatch tune`` fits one too."""

from __future__ import annotations

__all__ = ["CostModel", "ShapeCostModel"]


class CostModel:
    """Batch run time as ``a + b * size``, fitted online by weighted least squares.

    Older batches weigh less (each new batch multiplies the old weights by
    ``forgetting``), so the fit follows a model whose speed changes. While the
    batches seen all had about one size ``n``, their mean time ``d`` is taken as the
    cost of any batch up to ``n``, and as growing in proportion above it: an
    overestimate on both sides, the safe side for a latency bound and for deciding
    that small batches keep up.
    """

    def __init__(self, forgetting: float = 0.95) -> None:
        self._forgetting = forgetting
        self._w = self._wn = self._wnn = self._wd = self._wnd = 0.0
        self._fixed_s = 0.0
        self._per_unit_s = 0.0
        self._single_size = 0.0  # > 0 while only one batch size has been seen
        self._stale = False  # samples arrived since the last fit
        self._observed = 0

    @property
    def fixed_s(self) -> float:
        """The fitted fixed cost per batch ``a``, in seconds."""
        if self._stale:
            self._refit()
        return self._fixed_s

    @property
    def per_unit_s(self) -> float:
        """The fitted cost per unit ``b``, in seconds."""
        if self._stale:
            self._refit()
        return self._per_unit_s

    @property
    def samples(self) -> float:
        """Total weight of the samples seen (0 before the first batch)."""
        return self._w

    def observe(self, size: int, duration_s: float) -> None:
        """Add one measured batch and refit."""
        k = self._forgetting
        n = float(size)
        self._w = self._w * k + 1.0
        self._wn = self._wn * k + n
        self._wnn = self._wnn * k + n * n
        self._wd = self._wd * k + duration_s
        self._wnd = self._wnd * k + n * duration_s
        self._observed += 1
        # Refit on each of the first batches, then every few: the fit moves slowly
        # and a refit per batch would cost more than a tiny model's batch.
        if self._observed <= 8 or self._observed % 8 == 0:
            self._stale = True

    def predict(self, size: int) -> float:
        """Predicted seconds to run a batch of ``size`` units (0 before any sample)."""
        if self._stale:
            self._refit()
        if self._single_size and size <= self._single_size:
            return self._fixed_s + self._per_unit_s * self._single_size
        return self._fixed_s + self._per_unit_s * size

    def _refit(self) -> None:
        self._stale = False
        w, wn, wnn, wd, wnd = self._w, self._wn, self._wnn, self._wd, self._wnd
        mean_n, mean_d = wn / w, wd / w
        variance = wnn / w - mean_n * mean_n
        if variance < 0.25:  # sizes within about half a unit of each other
            self._single_size = max(mean_n, 1.0)
            self._fixed_s, self._per_unit_s = 0.0, mean_d / self._single_size
            return
        self._single_size = 0.0
        slope = (wnd / w - mean_n * mean_d) / variance
        intercept = mean_d - slope * mean_n
        if slope < 0:
            slope, intercept = 0.0, mean_d
        elif intercept < 0:
            slope, intercept = wnd / wnn, 0.0
        self._fixed_s, self._per_unit_s = intercept, slope


class ShapeCostModel:
    """Batch run time as ``a + b * items + c * cost`` (the batch's shape: its items
    and its padded or total cost), fitted online by weighted least squares with
    forgetting, as :class:`CostModel` does for one variable.

    While the batches seen do not tell items and cost apart (one of them barely
    varies, or the two vary together), it fits ``a + c * cost`` alone; a negative
    coefficient falls back the same way.
    """

    def __init__(self, forgetting: float = 0.95) -> None:
        self._forgetting = forgetting
        self._sums = [0.0] * 10  # w, x, y, d, xx, xy, yy, xd, yd, dd (x: items, y: cost)
        self._coefficients = (0.0, 0.0, 0.0)
        self._stale = False
        self.samples = 0

    def observe(self, items: int, cost: float, duration_s: float) -> None:
        """Add one measured batch of ``items`` items costing ``cost``."""
        x, y, d = float(items), float(cost), duration_s
        k = self._forgetting
        values = (1.0, x, y, d, x * x, x * y, y * y, x * d, y * d, d * d)
        self._sums = [old * k + new for old, new in zip(self._sums, values, strict=True)]
        self.samples += 1
        self._stale = True

    def predict(self, items: float, cost: float) -> float:
        """Predicted seconds for a batch of ``items`` items costing ``cost`` (0 before
        any sample)."""
        if self._stale:
            self._refit()
        a, b, c = self._coefficients
        return max(a + b * items + c * cost, 0.0)

    def _refit(self) -> None:
        self._stale = False
        w, x, y, d, xx, xy, yy, xd, yd, _ = self._sums
        if w <= 0:
            return
        mx, my, md = x / w, y / w, d / w
        vxx, vxy, vyy = xx / w - mx * mx, xy / w - mx * my, yy / w - my * my
        vxd, vyd = xd / w - mx * md, yd / w - my * md
        det = vxx * vyy - vxy * vxy
        if det > 1e-9 * max(vxx * vyy, 1e-300):
            b = (vxd * vyy - vyd * vxy) / det
            c = (vyd * vxx - vxd * vxy) / det
            if b >= 0 and c >= 0:
                self._coefficients = (md - b * mx - c * my, b, c)
                return
        if vyy > 1e-12 * max(my * my, 1e-300):
            c = max(vyd / vyy, 0.0)
            self._coefficients = (md - c * my, 0.0, c)
        else:  # one shape only: its mean time, as growing in proportion to cost
            self._coefficients = (0.0, 0.0, md / my) if my > 0 else (md, 0.0, 0.0)
        if self._coefficients[0] < 0:
            self._coefficients = (0.0, 0.0, d / y if y > 0 else 0.0)
