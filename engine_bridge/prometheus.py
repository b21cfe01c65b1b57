"""Prometheus exposition of :mod:`projections.metrics` with ``prometheus_client`` (issue 16).

* :class:`PrometheusSink` — the families of :data:`projections.metrics.FAMILIES` as
  ``prometheus_client`` Counter/Gauge/Histogram objects in a registry of its own (never the
  global one, which vLLM uses). Counters are declared with their ``_total`` name, which is the
  name exposed.
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

import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, make_asgi_app
from prometheus_client.metrics_core import Metric

from events.records import StoredEvent
from projections.metrics import FAMILIES, OFFLINE_FAMILIES, MetricsFold
from projections.projector import Projector
from projections.resources import SessionResources
from projections.turn_tables import TurnTables


class PrometheusSink:
    """:class:`projections.metrics.MetricsSink` over ``prometheus_client`` metric objects.

    ``families``: the family names to declare (default: all but the live-only drift gauge,
    which :class:`LedgerMetrics` adds when it has ports)."""

    def __init__(self, families: Iterable[str] = OFFLINE_FAMILIES) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.metrics: dict[str, Any] = {}
        self._children: dict[tuple[str, tuple[str, ...]], Any] = {}
        for name in families:
            fam = FAMILIES[name]
            kwargs: dict[str, Any] = {"labelnames": fam.labels, "registry": self.registry}
            if fam.kind == "counter":
                self.metrics[name] = Counter(name, fam.help, **kwargs)
            elif fam.kind == "gauge":
                self.metrics[name] = Gauge(name, fam.help, **kwargs)
            else:
                self.metrics[name] = Histogram(name, fam.help, buckets=fam.buckets, **kwargs)

    def _child(self, family: str, labels: tuple[str, ...]) -> Any:
        """The family's child for ``labels``, looked up once (``labels()`` takes a lock and
        checks its arguments on every call; the fold updates a few children per event)."""
        key = (family, labels)
        child = self._children.get(key)
        if child is None:
            metric = self.metrics[family]
            child = self._children[key] = metric.labels(*labels) if labels else metric
        return child

    def inc(self, family: str, labels: tuple[str, ...], amount: float) -> None:
        self._child(family, labels).inc(amount)

    def observe(self, family: str, labels: tuple[str, ...], value: float) -> None:
        self._child(family, labels).observe(value)

    def set(self, family: str, labels: tuple[str, ...], value: float) -> None:
        self._child(family, labels).set(value)

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
