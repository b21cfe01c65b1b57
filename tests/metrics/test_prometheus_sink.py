"""issue 23: the Prometheus sink keeps plain numbers (``engine_bridge.prometheus.FamilyCollector``)
and its exposition is byte for byte what ``prometheus_client``'s own Counter / Gauge / Histogram
objects give after the same updates — checked against such objects (:class:`ObjectSink`, the
sink as it was before) on random update sequences with odd values and on the metrics of every
committed field-case log and of generated histories."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from engine_bridge.prometheus import COUNTER_NEGATIVE, LedgerMetrics, PrometheusSink, exposition
from events.records import StoredEvent
from projections.metrics import FAMILIES, OFFLINE_FAMILIES, MetricsFold
from tests.cases.field_support import FIELD_DIR, read_jsonl
from tests.histories import generate

FIELD_CASES = sorted(FIELD_DIR.glob("*.jsonl"))
COUNTERS = [n for n in OFFLINE_FAMILIES if FAMILIES[n].kind == "counter"]
GAUGES = [n for n in OFFLINE_FAMILIES if FAMILIES[n].kind == "gauge"]
HISTOGRAMS = [n for n in OFFLINE_FAMILIES if FAMILIES[n].kind == "histogram"]


class ObjectSink:
    """The reference: every family a ``prometheus_client`` metric object, each update a call
    of its child (the sink before issue 23)."""

    def __init__(self, families: Sequence[str] = OFFLINE_FAMILIES) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.metrics: dict[str, Any] = {}
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
        metric = self.metrics[family]
        return metric.labels(*labels) if labels else metric

    def inc(self, family: str, labels: tuple[str, ...], amount: float) -> None:
        self._child(family, labels).inc(amount)

    def observe(self, family: str, labels: tuple[str, ...], value: float) -> None:
        self._child(family, labels).observe(value)

    def set(self, family: str, labels: tuple[str, ...], value: float) -> None:
        self._child(family, labels).set(value)

    def declare(self, family: str, labels: tuple[str, ...]) -> None:
        self._child(family, labels)


def _labels(rnd: random.Random, family: str) -> tuple[str, ...]:
    return tuple(rnd.choice(["a", "b", "m-1", "日本"]) for _ in FAMILIES[family].labels)


ODD_VALUES = [0, 1, 7, 2**53 + 1, 2**70, 0.1, 1e-9, 3.7, 1e300, math.inf, -0.5, -math.inf, math.nan, 0.3, 7680.0]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rnd=st.randoms(use_true_random=False), n=st.integers(0, 120))
def test_the_exposition_is_prometheus_clients_after_any_updates(rnd: random.Random, n: int) -> None:
    new, ref = PrometheusSink(), ObjectSink()
    for _ in range(n):
        op = rnd.choice(["inc", "observe", "set", "declare"])
        family = rnd.choice({"inc": COUNTERS, "observe": HISTOGRAMS, "set": GAUGES}.get(op, list(OFFLINE_FAMILIES)))
        if FAMILIES[family].kind == "gauge" and family == "duplex_ledger:request_ids_leaked":
            continue  # a scrape-time gauge: set_function below
        labels, value = _labels(rnd, family), rnd.choice(ODD_VALUES)
        if op == "inc":
            value = abs(value) if value == value else 0
        for sink in (new, ref):
            getattr(sink, op)(family, labels, *([] if op == "declare" else [value]))
    for sink in (new, ref):
        sink.metrics["duplex_ledger:request_ids_leaked"].set_function(lambda: 3)
    assert exposition(new.registry) == exposition(ref.registry)


def test_a_negative_increment_and_a_wrong_label_count_are_refused_as_prometheus_client_does() -> None:
    new, ref = PrometheusSink(), ObjectSink()
    family = "vllm_omni:prompt_tokens_total"
    for sink in (new, ref):
        with pytest.raises(ValueError, match=COUNTER_NEGATIVE):
            sink.inc(family, ("m",), -1)
        with pytest.raises(ValueError, match="label"):
            sink.inc(family, ("m", "extra"), 1)
    assert exposition(new.registry) == exposition(ref.registry)  # the refused child exists in both


def _metrics(events: Sequence[StoredEvent], sink: Any) -> str:
    fold = MetricsFold(sink)
    fold.apply_all(events)
    sink.metrics["duplex_ledger:request_ids_leaked"].set_function(lambda: fold.leaked_request_ids(30.0, None))
    return exposition(sink.registry)


@pytest.mark.parametrize("path", FIELD_CASES, ids=lambda p: p.name)
def test_a_field_cases_metrics_are_byte_for_byte_prometheus_clients(path: Path) -> None:
    events = read_jsonl(path)
    assert _metrics(events, PrometheusSink()) == _metrics(events, ObjectSink())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rnd=st.randoms(use_true_random=False), sessions=st.integers(1, 3))
def test_a_generated_logs_metrics_are_byte_for_byte_prometheus_clients(rnd: random.Random, sessions: int) -> None:
    events = generate(rnd, sessions).log.stored
    assert _metrics(events, PrometheusSink()) == _metrics(events, ObjectSink())


def test_the_ledger_metrics_expose_the_drift_gauge_read_when_scraped() -> None:
    class Port:
        def live_request_ids(self) -> set[str]:
            return {"x", "y"}

    metrics = LedgerMetrics([Port()])
    text = metrics.exposition()
    assert "duplex_ledger:running_counter_drift -2.0" in text  # nothing runs in the log, two on the port
    assert "duplex_ledger:request_ids_leaked 0.0" in text
