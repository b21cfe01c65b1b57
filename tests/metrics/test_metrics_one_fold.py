"""issue 23 step 3: one fold per event, live and offline.

* The live engine keeps one :class:`Projector` per session and hands what it made of each event
  (verdict, finalized turn tables, the session's resources state) to
  :meth:`MetricsFold.apply_folded`; the offline command folds the whole log with the metrics'
  own projector (:meth:`MetricsFold.apply`). Both give every sample alike — on generated
  histories (``tests/histories.py``) and on the committed field-case logs — and the same
  ``[DuplexSessionSummary]`` rollups.
* The running/waiting gauges are recounted only on the events that can change them; after every
  event they equal a recount made after every event."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine_bridge.prometheus import LedgerMetrics
from events.records import StoredEvent
from events.types import EventBase
from projections import metrics_requests
from projections.metrics import MetricsFold, TallySink
from projections.projector import Projector
from tests.cases.field_support import FIELD_DIR, read_jsonl
from tests.histories import generate
from tests.metrics.test_metrics_live_offline import assert_same_samples, samples

FIELD_CASES = sorted(FIELD_DIR.glob("*.jsonl"))


def per_session_folds(events: Sequence[StoredEvent], now: float) -> LedgerMetrics:
    """The live shape: one projector per session folds each event once, the metrics count it."""
    projectors: dict[str, Projector] = {}
    live = LedgerMetrics(now=lambda: now, folded_by=lambda: projectors.values())
    for stored in events:
        sid = stored.event.session_id
        projector = projectors.setdefault(sid, Projector())
        accepted = projector.apply(stored)
        live.apply_folded(stored, accepted, projector.turns.take_finalized(), projector.session_resources(sid))
    return live


def assert_one_fold_equals_the_offline_fold(events: Sequence[StoredEvent]) -> None:
    now = max((s.event.ts for s in events), default=0.0)  # the audit's "now", one for both arms
    live = per_session_folds(events, now)
    offline = LedgerMetrics(now=lambda: now).apply_all(events)
    assert_same_samples(samples(live.exposition()), samples(offline.exposition()))
    assert live.fold.rollups == offline.fold.rollups
    assert live.fold.running() == offline.fold.running()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rnd=st.randoms(use_true_random=False), sessions=st.integers(1, 3))
def test_per_session_folds_give_the_offline_samples_on_a_generated_log(rnd: random.Random, sessions: int) -> None:
    assert_one_fold_equals_the_offline_fold(generate(rnd, sessions).log.stored)


@pytest.mark.parametrize("path", FIELD_CASES, ids=lambda p: p.name)
def test_per_session_folds_give_the_offline_samples_on_a_field_case(path: Path) -> None:
    assert_one_fold_equals_the_offline_fold(read_jsonl(path))


def assert_gauges_as_recounted_after_every_event(events: Sequence[StoredEvent]) -> None:
    cheap, every = MetricsFold(TallySink()), MetricsFold(TallySink())
    every.gauges_every_event = True
    for n, stored in enumerate(events, start=1):
        cheap.apply(stored)
        every.apply(stored)
        assert cheap.sink.values == every.sink.values, (n, stored.event.type)  # type: ignore[attr-defined]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rnd=st.randoms(use_true_random=False), sessions=st.integers(1, 3))
def test_running_and_waiting_equal_a_recount_after_every_event_of_a_generated_log(
    rnd: random.Random, sessions: int
) -> None:
    assert_gauges_as_recounted_after_every_event(generate(rnd, sessions).log.stored)


@pytest.mark.parametrize("path", FIELD_CASES, ids=lambda p: p.name)
def test_running_and_waiting_equal_a_recount_after_every_event_of_a_field_case(path: Path) -> None:
    assert_gauges_as_recounted_after_every_event(read_jsonl(path))


def test_the_recount_check_catches_a_gauge_left_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check can fail: with every event taken for one that cannot move the gauges, the
    counts fall behind on some field case."""
    everything = metrics_requests.structs_of(*_event_classes())
    monkeypatch.setattr(metrics_requests, "_GAUGES_QUIET", everything)
    caught = 0
    for path in FIELD_CASES:
        try:
            assert_gauges_as_recounted_after_every_event(read_jsonl(path))
        except AssertionError:
            caught += 1
    assert caught > 0


def _event_classes() -> list[type[EventBase]]:
    out: list[type[EventBase]] = []
    pending = list(EventBase.__subclasses__())
    while pending:
        cls = pending.pop()
        out.append(cls)
        pending.extend(cls.__subclasses__())
    return out
