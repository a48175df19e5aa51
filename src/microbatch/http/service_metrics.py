"""One Prometheus page for several services: each service's families with a
``service`` label, the shared routes' requests (``service="*"``), and the process's
own metrics once."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, GCCollector, ProcessCollector, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from .metrics import HttpMetrics, RequestCollector

__all__ = ["ServicesMetrics"]

_PER_PROCESS = ("process_", "python_gc_")
"""Families about the process, not a service: shown once, without a service label."""


class _Merged(Collector):
    """Each service's families (less the per-process ones) and the shared routes',
    samples labelled with the service, families of one name merged."""

    def __init__(self, metrics: Mapping[str, HttpMetrics], shared: RequestCollector) -> None:
        self._metrics = metrics
        self._shared = shared

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        sources: list[tuple[str, Iterable[Metric]]] = [
            (service, metrics.registry.collect()) for service, metrics in self._metrics.items()
        ]
        sources.append(("*", self._shared.collect()))
        for service, families in sources:
            for family in families:
                if family.name.startswith(_PER_PROCESS):
                    continue
                into = merged.get(family.name)
                if into is None:
                    into = Metric(family.name, family.documentation, family.type, family.unit)
                    merged[family.name] = into
                for sample in family.samples:
                    labels = {**sample.labels, "service": service}
                    into.add_sample(
                        sample.name, labels, sample.value, sample.timestamp, sample.exemplar
                    )
        yield from merged.values()


class ServicesMetrics:
    """The ``/metrics`` page of :class:`~microbatch.http.Services`.

    Args:
        metrics: Each service's own metrics, by service name.
    """

    content_type = HttpMetrics.content_type

    def __init__(self, metrics: Mapping[str, HttpMetrics]) -> None:
        self.shared = RequestCollector()
        """Requests of the routes every service shares (``/v2/...``, ``/v1/...``)."""
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Merged(metrics, self.shared))
        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def render(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)
