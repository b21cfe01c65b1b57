"""Prometheus exposition of :mod:`projections.metrics` with ``prometheus_client`` (issue 16).

* :class:`PrometheusSink` — the families of :data:`projections.metrics.FAMILIES` as
  :class:`FamilyCollector` s (plain numbers exposed as ``prometheus_client``'s Counter / Gauge /
  Histogram objects would expose them, issue 23) in a registry of its own (never the global
  one, which vLLM uses). Counters are declared with their ``_total`` name, which is the name
  exposed.
* :class:`LedgerMetrics` — a :class:`~projections.metrics.MetricsFold` feeding that sink, plus
  the two gauges read when scraped: ``duplex_ledger:request_ids_leaked`` (from the audit) and,
  when live ports are given, ``duplex_ledger:running_counter_drift``.
* :func:`exposition` — the text format (0.0.4) without the ``*_created`` series: they hold the
  wall time a child was created, which would make the live and the re-projected exposition
  differ for the same log.
* :class:`MetricsServer` / :meth:`LedgerMetrics.serve` — ``/metrics`` on 127.0.0.1 by
  default: ``prometheus_client.make_asgi_app`` served by uvicorn on a thread of its own, with a
  listen backlog of :data:`LISTEN_BACKLOG` (the standard library's ``wsgiref`` server behind
  ``start_http_server`` listens with a backlog of 5 and dropped scrapes under 64 concurrent
  scrapers, issue 22).
"""

from __future__ import annotations

import math
import socket
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry, generate_latest, make_asgi_app
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from events.records import StoredEvent
from projections.metrics import FAMILIES, OFFLINE_FAMILIES, MetricsFold
from projections.projector import Projector
from projections.resources import SessionResources
from projections.turn_tables import TurnTables

COUNTER_NEGATIVE = "Counters can only be incremented by non-negative amounts."
"""prometheus_client's refusal of a negative counter increment, raised the same way here."""


class _Histogram:
    """One histogram child's numbers, as ``prometheus_client.Histogram`` keeps them: the count
    per bucket (not cumulative) and the sum, each a float added to in observation order."""

    __slots__ = ("buckets", "sum", "created")

    def __init__(self, size: int) -> None:
        self.buckets = [0.0] * size
        self.sum = 0.0
        self.created = time.time()


class FamilyCollector:
    """One family of :data:`projections.metrics.FAMILIES` as a registry collector whose
    children are plain numbers (issue 23: the live fold updates a few children per event; a
    ``prometheus_client`` metric object spent ~1-2 µs of frames and locks on each update).

    ``collect`` yields what ``prometheus_client``'s Counter / Gauge / Histogram of the same
    name, help, label names and buckets yield after the same updates, child by child in order
    of creation (the exposition is byte for byte theirs, tests/metrics/test_prometheus_sink.py):
    a counter named ``…_total`` is the family without it with ``_total`` and ``_created``
    samples; a histogram's buckets are cumulative at collection, ``le`` as Go formats floats,
    then ``_count``, ``_sum`` (buckets starting at ≥ 0) and ``_created``; a family without
    labels has its one child from the start. Read on the ``/metrics`` thread: a child is
    updated by the loop thread without a lock, so a scrape may see an update in part, as
    ``prometheus_client``'s per-value locks allow too."""

    def __init__(
        self, name: str, kind: str, documentation: str, labelnames: tuple[str, ...], buckets: tuple[float, ...]
    ):
        self.kind = kind
        self.documentation = documentation
        self.labelnames = labelnames
        self.name = name[:-6] if kind == "counter" and name.endswith("_total") else name
        self.children: dict[tuple[str, ...], Any] = {}  # label values -> [value] | _Histogram
        self.function: Callable[[], float] | None = None
        if kind == "histogram":
            bounds = [float(b) for b in buckets]
            if bounds != sorted(bounds):
                raise ValueError("Buckets not in sorted order")
            if bounds and bounds[-1] != math.inf:
                bounds.append(math.inf)
            if len(bounds) < 2:
                raise ValueError("Must have at least two buckets")
            self.bounds = bounds
            self.le = [floatToGoString(b) for b in bounds]
        if not labelnames:
            self.child(())

    def child(self, labels: tuple[str, ...]) -> Any:
        """The child of ``labels`` (values in label-name order, as text; made on first use, in
        that order): ``[value, created]`` of a counter or gauge, a :class:`_Histogram`.
        Raises ValueError for a wrong label count."""
        if len(labels) != len(self.labelnames):
            raise ValueError(f"Incorrect label count: {len(labels)} for {self.labelnames}")
        values = tuple(str(v) for v in labels)
        found = self.children.get(values)
        if found is None:
            found = _Histogram(len(self.bounds)) if self.kind == "histogram" else [0.0, time.time()]
            self.children[values] = found
        return found

    def set_function(self, f: Callable[[], float]) -> None:
        """A gauge read when collected: ``float(f())`` (as ``Gauge.set_function``)."""
        self.function = f

    def collect(self) -> list[Metric]:
        metric = Metric(self.name, self.documentation, self.kind, "")
        if self.function is not None:
            metric.add_sample(self.name, {}, float(self.function()))
            return [metric]
        name, labelnames = self.name, self.labelnames
        for labels, child in list(self.children.items()):
            series = dict(zip(labelnames, labels, strict=True))
            if self.kind == "histogram":
                acc = 0.0
                for le, count in zip(self.le, list(child.buckets), strict=True):
                    acc += count
                    metric.add_sample(name + "_bucket", {**series, "le": le}, acc)
                metric.add_sample(name + "_count", series, acc)
                if self.bounds[0] >= 0:
                    metric.add_sample(name + "_sum", series, child.sum)
                metric.add_sample(name + "_created", series, child.created)
            elif self.kind == "counter":
                metric.add_sample(name + "_total", series, child[0])
                metric.add_sample(name + "_created", series, child[1])
            else:
                metric.add_sample(name, series, child[0])
        return [metric]


class PrometheusSink:
    """:class:`projections.metrics.MetricsSink` over a registry of :class:`FamilyCollector`:
    the same exposition as ``prometheus_client`` Counter/Gauge/Histogram objects of these
    families, updated as plain numbers (issue 23).

    ``families``: the family names to declare, in exposition order (default: all but the
    live-only drift gauge, which :class:`LedgerMetrics` adds when it has ports). Raises
    ValueError for a negative counter increment (as ``prometheus_client``) and a wrong label
    count."""

    def __init__(self, families: Iterable[str] = OFFLINE_FAMILIES) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.metrics: dict[str, FamilyCollector] = {}
        self._children: dict[tuple[str, tuple[str, ...]], Any] = {}
        for name in families:
            fam = FAMILIES[name]
            collector = FamilyCollector(name, fam.kind, fam.help, fam.labels, fam.buckets)
            self.registry.register(collector)  # type: ignore[arg-type]
            self.metrics[name] = collector

    def _child(self, family: str, labels: tuple[str, ...]) -> Any:
        key = (family, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.metrics[family].child(labels)
        return child

    def inc(self, family: str, labels: tuple[str, ...], amount: float) -> None:
        child = self._children.get((family, labels)) or self._child(family, labels)
        if amount < 0:
            raise ValueError(COUNTER_NEGATIVE)
        child[0] += amount

    def observe(self, family: str, labels: tuple[str, ...], value: float) -> None:
        child = self._children.get((family, labels)) or self._child(family, labels)
        child.sum += value
        if value == value:  # a NaN falls in no bucket (prometheus_client's loop finds none)
            child.buckets[bisect_left(self.metrics[family].bounds, value)] += 1

    def set(self, family: str, labels: tuple[str, ...], value: float) -> None:
        child = self._children.get((family, labels)) or self._child(family, labels)
        child[0] = float(value)

    def declare(self, family: str, labels: tuple[str, ...]) -> None:
        self._child(family, labels)


class _WithoutCreated:
    """A collector view of a registry with every ``*_created`` sample left out."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield metric


def exposition_registry(registry: CollectorRegistry) -> CollectorRegistry:
    """A registry that exposes ``registry`` without its ``*_created`` series."""
    view = CollectorRegistry(auto_describe=False)
    view.register(_WithoutCreated(registry))  # type: ignore[arg-type]
    return view


def exposition(registry: CollectorRegistry) -> str:
    """Prometheus text format (0.0.4) of ``registry`` without ``*_created`` series."""
    return generate_latest(exposition_registry(registry)).decode()


class LedgerMetrics:
    """The fold, its Prometheus sink and the scrape-time gauges.

    ``ports``: live stage ports (anything with ``live_request_ids() -> set[str]``); when given,
    ``duplex_ledger:running_counter_drift`` = ids the log says are running
    (``ResourcesFold.running()``) − distinct ids the engines hold. ``folded_by``: live, the
    projectors of the sessions that hand their folded events to :meth:`apply_folded` (the
    audit-read gauges read them with the metrics' own). ``now``: the "now" of the
    audit's idle rule when live (default ``time.time``); offline the audit uses the ts of the
    last applied event, as ``duplex-ledger audit`` does. ``max_idle_s`` as ``audit --max-idle``."""

    def __init__(
        self,
        ports: Sequence[Any] | None = None,
        *,
        now: Callable[[], float] | None = None,
        max_idle_s: float = 30.0,
        folded_by: Callable[[], Iterable[Projector]] | None = None,
    ) -> None:
        names = list(OFFLINE_FAMILIES) + (["duplex_ledger:running_counter_drift"] if ports is not None else [])
        self.sink = PrometheusSink(names)
        self.registry = self.sink.registry
        self.fold = MetricsFold(self.sink)
        self.fold.folded_by = folded_by
        self.ports = list(ports) if ports is not None else None
        self.max_idle_s = max_idle_s
        self._now = now
        self.events_applied = 0
        self.apply_s = 0.0  # perf_counter seconds spent in apply (offline folds; live ones are not timed)
        self.sink.metrics["duplex_ledger:request_ids_leaked"].set_function(self._leaked)
        if self.ports is not None:
            self.sink.metrics["duplex_ledger:running_counter_drift"].set_function(self.running_counter_drift)
        self._server: Any = None

    def apply(self, stored: StoredEvent) -> None:
        """Fold one event with the metrics' own projector and count it (the offline command;
        live, a takeover's events, which no open session folds)."""
        start = time.perf_counter()
        self.fold.apply(stored)
        self.apply_s += time.perf_counter() - start
        self.events_applied += 1

    def apply_folded(
        self, stored: StoredEvent, accepted: bool, turns: Sequence[TurnTables], resources: SessionResources | None
    ) -> None:
        """Count one event a live session's projector has folded
        (:meth:`projections.metrics.MetricsFold.apply_folded`): nothing is folded twice. Not
        timed (two clock reads an event, on the live path: issue 23); :attr:`apply_s` is the
        offline :meth:`apply`'s."""
        self.events_applied += 1
        self.fold.apply_folded(stored, accepted, turns, resources)

    def apply_all(self, events: Iterable[StoredEvent]) -> LedgerMetrics:
        for stored in events:
            self.apply(stored)
        return self

    def _leaked(self) -> float:
        as_of = self._now() if self._now is not None else None
        return float(self.fold.leaked_request_ids(self.max_idle_s, as_of))

    def running_counter_drift(self) -> float:
        """Log-running ids minus engine-held ids (live ports only; 0 without ports)."""
        if not self.ports:
            return 0.0
        engine_ids: set[str] = set()
        for port in self.ports:
            engine_ids |= set(port.live_request_ids())
        return float(self.fold.running() - len(engine_ids))

    def exposition(self) -> str:
        return exposition(self.registry)

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``addr:port`` (0 = any free port) until :meth:`close`; returns
        the port. Only loopback by default."""
        self._server = self.start_server(port, addr)
        return self._server.port

    def start_server(self, port: int, addr: str = "127.0.0.1") -> MetricsServer:
        """A :class:`MetricsServer` of this registry that :meth:`close` leaves running: its
        caller stops it (or the process's exit does), so a scraper still sees the final state
        after the engine closed (``duplex-ledger run --metrics-linger-s``)."""
        return MetricsServer(self.registry, port, addr)

    def close(self) -> None:
        """Stop the HTTP server :meth:`serve` started, if any."""
        if self._server is not None:
            self._server.close()
            self._server = None


LISTEN_BACKLOG = 2048
"""Pending connections the ``/metrics`` socket queues (the OS may cap it: ``somaxconn``)."""
SERVER_START_TIMEOUT_S = 10.0


class MetricsServer:
    """``/metrics`` (any path answers the exposition) of ``registry`` without ``*_created``
    series, served by uvicorn (``make_asgi_app``) on a daemon thread with its own event loop.

    The socket is bound here, so ``port`` (0 = any free port) is known when the constructor
    returns and a taken port raises ``OSError`` at once; the constructor waits until uvicorn
    serves (``RuntimeError`` after :data:`SERVER_START_TIMEOUT_S`). :meth:`close` stops it."""

    def __init__(self, registry: CollectorRegistry, port: int, addr: str = "127.0.0.1") -> None:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._socket.bind((addr, port))
            self._socket.listen(LISTEN_BACKLOG)
        except OSError:
            self._socket.close()
            raise
        self.addr = addr
        self.port = int(self._socket.getsockname()[1])
        app = make_asgi_app(registry=exposition_registry(registry))
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off", backlog=LISTEN_BACKLOG, timeout_keep_alive=5
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="metrics-http", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the /metrics server on {addr}:{self.port} did not start")
            time.sleep(0.005)

    @property
    def url(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and wait for the thread (at most a few seconds)."""
        self._server.should_exit = True
        self._thread.join(timeout=SERVER_START_TIMEOUT_S)
        self._socket.close()
