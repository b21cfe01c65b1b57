"""DOMAIN §5.7 D17: every counter and histogram series re-projected from a longer prefix of the
log is ≥ the same series from a shorter one, and no histogram ever receives a negative
observation — on generated histories (``tests/histories.py``: clocks stepped back, writes after a
close or a takeover, responses on ids not held, and the races of D1–D11) and on the committed
field-case logs.

Generic over the exposition: whatever families ``metrics`` prints are parsed from the Prometheus
text (by their ``# TYPE``), so families added later are covered without naming them here."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from engine_bridge.prometheus import LedgerMetrics
from events.records import StoredEvent
from tests.cases.field_support import FIELD_DIR, read_jsonl
from tests.histories import generate

MONOTONE_TYPES = frozenset({"counter", "histogram"})
Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def monotone_series(exposition: str) -> Series:
    """Every sample of every counter and histogram family in ``exposition`` (buckets, _count,
    _sum, _total) by (sample name, labels)."""
    out: Series = {}
    for family in text_string_to_metric_families(exposition):
        if family.type in MONOTONE_TYPES:
            for s in family.samples:
                out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def assert_not_decreasing(previous: Series, now: Series, where: object) -> None:
    """Every series of ``previous`` is still in ``now`` and not lower; none is negative."""
    for key, value in previous.items():
        assert key in now, (where, key)
        assert now[key] >= value, (where, key, value, now[key])
    for key, value in now.items():
        assert value >= 0, (where, key, value)


def check_every_prefix(events: Sequence[StoredEvent], rnd: random.Random) -> int:
    """Fold ``events`` one at a time and compare the exposition at every prefix with the one
    before; at a few prefixes, also with a fresh re-projection of that prefix. Returns the number
    of series seen at the end."""
    live = LedgerMetrics()
    previous: Series = {}
    rechecks = set(rnd.sample(range(1, len(events) + 1), min(3, len(events))))
    for n, stored in enumerate(events, start=1):
        live.apply(stored)
        text = live.exposition()
        now = monotone_series(text)
        assert_not_decreasing(previous, now, (n, stored.event.type))
        if n in rechecks:
            assert LedgerMetrics().apply_all(events[:n]).exposition() == text, n
        previous = now
    return len(previous)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rnd=st.randoms(use_true_random=False), sessions=st.integers(1, 3))
def test_every_counter_and_histogram_never_decreases_over_the_prefixes_of_a_generated_log(
    rnd: random.Random, sessions: int
) -> None:
    history = generate(rnd, sessions)
    assert check_every_prefix(history.log.stored, rnd) > 0


@pytest.mark.parametrize("path", sorted(FIELD_DIR.glob("*.jsonl")), ids=lambda p: p.name)
def test_every_counter_and_histogram_never_decreases_over_the_prefixes_of_a_field_case(path: Path) -> None:
    assert check_every_prefix(read_jsonl(path), random.Random(path.name)) > 0


def test_a_decreasing_or_vanishing_or_negative_series_is_caught() -> None:
    """The check can fail."""
    before = monotone_series('# TYPE x_total counter\nx_total{a="1"} 2.0\n# TYPE h histogram\nh_sum 1.0\nh_count 1.0\n')
    assert len(before) == 3
    for after in (
        '# TYPE x_total counter\nx_total{a="1"} 1.0\n# TYPE h histogram\nh_sum 1.0\nh_count 1.0\n',
        "# TYPE h histogram\nh_sum 1.0\nh_count 1.0\n",
        '# TYPE x_total counter\nx_total{a="1"} 2.0\n# TYPE h histogram\nh_sum -1.0\nh_count 2.0\n',
    ):
        with pytest.raises(AssertionError):
            assert_not_decreasing(before, monotone_series(after), "test")
    assert_not_decreasing(before, before, "test")
