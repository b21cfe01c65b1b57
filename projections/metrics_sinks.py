"""Where :class:`~projections.metrics.MetricsFold` hands its updates: the :class:`MetricsSink`
protocol (``engine_bridge.prometheus.PrometheusSink`` is the Prometheus one) and
:class:`TallySink`, a plain-dict sink for tests and the offline summary."""

from __future__ import annotations

from typing import Protocol


class MetricsSink(Protocol):
    """Where the fold's updates go. ``labels`` are values in the family's label order."""

    def inc(self, family: str, labels: tuple[str, ...], amount: float) -> None: ...

    def observe(self, family: str, labels: tuple[str, ...], value: float) -> None: ...

    def set(self, family: str, labels: tuple[str, ...], value: float) -> None: ...

    def declare(self, family: str, labels: tuple[str, ...]) -> None:
        """Make the child exist (zero samples) before its first update (issue 22)."""


class TallySink:
    """A plain-dict sink: ``values[(family, labels)]`` = counter total or gauge value;
    ``observations[(family, labels)]`` = histogram samples in order."""

    def __init__(self) -> None:
        self.values: dict[tuple[str, tuple[str, ...]], float] = {}
        self.observations: dict[tuple[str, tuple[str, ...]], list[float]] = {}
        self.declared: set[tuple[str, tuple[str, ...]]] = set()

    def inc(self, family: str, labels: tuple[str, ...], amount: float) -> None:
        self.values[(family, labels)] = self.values.get((family, labels), 0.0) + amount

    def observe(self, family: str, labels: tuple[str, ...], value: float) -> None:
        self.observations.setdefault((family, labels), []).append(value)

    def set(self, family: str, labels: tuple[str, ...], value: float) -> None:
        self.values[(family, labels)] = value

    def declare(self, family: str, labels: tuple[str, ...]) -> None:
        self.declared.add((family, labels))
