"""Batch sizes from a microbatch server's ``/metrics``, read before and after a run."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

from .client import Endpoint

__all__ = ["BATCH_SIZE_METRIC", "BatchTotals", "mean_batch_sizes", "parse_batch_totals", "scrape"]

BATCH_SIZE_METRIC = "microbatch_batch_size"
"""The per-stage batch-size histogram of ``microbatch serve`` (label ``stage``)."""

BatchTotals = dict[str, tuple[float, float]]
"""Per stage: (batches so far, items so far) — the histogram's count and sum."""


def parse_batch_totals(text: str) -> BatchTotals:
    """The batch-size histogram's count and sum per stage, from Prometheus text.

    Raises:
        ValueError: The text is not in Prometheus' exposition format.
    """
    totals: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name != BATCH_SIZE_METRIC:
            continue
        for sample in family.samples:
            stage = sample.labels.get("stage", "")
            pair = totals.setdefault(stage, [0.0, 0.0])
            if sample.name == BATCH_SIZE_METRIC + "_count":
                pair[0] = sample.value
            elif sample.name == BATCH_SIZE_METRIC + "_sum":
                pair[1] = sample.value
    return {stage: (count, total) for stage, (count, total) in totals.items()}


def mean_batch_sizes(
    before: Mapping[str, tuple[float, float]], after: BatchTotals
) -> dict[str, float]:
    """Mean batch size per stage over the batches released between two scrapes
    (stages without a batch in between are left out)."""
    means = {}
    for stage, (count, total) in after.items():
        count_before, total_before = before.get(stage, (0.0, 0.0))
        if count > count_before:
            means[stage] = (total - total_before) / (count - count_before)
    return means


async def scrape(endpoint: Endpoint, timeout_s: float = 10.0) -> BatchTotals | None:
    """The batch totals now, or None when ``/metrics`` does not give them (not a
    microbatch server, a token is missing, or the scrape failed)."""
    try:
        response = await endpoint.fetch("/metrics", timeout_s)
        if response.status != 200:
            return None
        totals = parse_batch_totals(response.body.decode("utf-8", "replace"))
    except Exception:  # a load test must not stop because its side metric failed
        return None
    return totals or None
