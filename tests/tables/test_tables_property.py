"""Property: incremental pending collapse == batch collapse (DOMAIN §5.3/§5.4, M15)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from events.stats import StageRequestStats
from projections.collapse import (
    FIRST_POSITIVE_FIELDS,
    LAST_NON_NONE_FIELDS,
    LAST_POSITIVE_FIELDS,
    SUM_FIELDS,
    collapse_segments,
    merge_into_pending,
)

_float = st.none() | st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
_int = st.none() | st.integers(min_value=0, max_value=10_000)
_text = st.none() | st.sampled_from(["stop", "length", "audio", "text"])


def _kind(name: str):
    ann = str(StageRequestStats.model_fields[name].annotation)
    return _int if "int" in ann else _text if "str" in ann else _float


_FIELDS = (*SUM_FIELDS, *FIRST_POSITIVE_FIELDS, *LAST_POSITIVE_FIELDS, *LAST_NON_NONE_FIELDS)
snapshots = st.builds(
    StageRequestStats,
    **{f: _kind(f) for f in _FIELDS},
    vllm_tpot_ms=_float,
    vllm_itl_ms=_float,
    vllm_itls_ms=st.none() | st.lists(st.floats(0, 1e4, allow_nan=False), max_size=5),
    inter_output_latencies_ms=st.none() | st.lists(st.floats(0, 1e4, allow_nan=False), max_size=3),
    batch_id=_int,
)


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


@settings(max_examples=100, deadline=None)
@given(st.lists(snapshots, min_size=1, max_size=12), st.data())
def test_incremental_pending_then_replay_equals_batch(segs, data):
    split = data.draw(st.integers(min_value=1, max_value=len(segs)))
    pending = None
    for s in segs[:split]:
        pending = merge_into_pending(pending, s)
    incremental = collapse_segments([pending, *segs[split:]])
    assert incremental == collapse_segments(segs)  # same left fold: exact, itl means included
    if split == len(segs):
        assert pending.row() == incremental


@settings(max_examples=100, deadline=None)
@given(st.lists(snapshots, min_size=1, max_size=12))
def test_additive_first_last_fields_match_an_independent_oracle(segs):
    pending = None
    for s in segs:
        pending = merge_into_pending(pending, s)
    row = pending.row()
    for f in SUM_FIELDS:
        values = [getattr(s, f) for s in segs]
        want = None if all(v is None for v in values) else sum(v or 0 for v in values)
        assert _same(row[f], want), f
    for f in FIRST_POSITIVE_FIELDS:
        want = next((getattr(s, f) for s in segs if (getattr(s, f) or 0) > 0), None)
        assert row[f] == want, f
    for f in LAST_POSITIVE_FIELDS:
        want = next((getattr(s, f) for s in reversed(segs) if (getattr(s, f) or 0) > 0), None)
        assert row[f] == want, f
    for f in LAST_NON_NONE_FIELDS:
        want = next((getattr(s, f) for s in reversed(segs) if getattr(s, f) is not None), None)
        assert row[f] == want, f
    assert row["batch_id"] == segs[0].batch_id
    itls = [x for s in segs for x in (s.vllm_itls_ms or [])]
    assert row["vllm_itls_ms"] == itls
