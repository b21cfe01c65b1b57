"""Per-stage collapse of a turn's StageRequestStats segments (DOMAIN §5.4, §5.3 buffering).

A turn may receive several snapshots ("segments") per stage. They are folded into ONE row per
stage with the rules of DOMAIN §5.4:

======================================================  =====================================
field                                                   rule
======================================================  =====================================
num_tokens_in/out, stage_gen_time_ms,                   sum
postprocess_time_ms, audio_generated_frames,
audio_duration_s, image_pixels, output_unit_count
vllm_ttft_ms, serving_time_to_first_output_ms,          first positive
image_time_to_first_output_ms, audio_sample_rate
vllm_tpot_ms                                            weighted mean over segments with tpot>0,
                                                        weight ``max(num_tokens_out - 1, 1)``;
                                                        none positive -> first segment's value
vllm_itls_ms, inter_output_latencies_ms                 concatenate (always a list after collapse)
vllm_itl_ms, inter_output_latency_ms                    >= 2 segments: mean of the concatenated
                                                        list; 1 segment: its own value
denoise_step_latency_ms                                 last positive
finish_reason, final_output_type, output_unit_type      last non-None
time_per_output_unit_ms                                 >= 2 segments: max(sum gen - ttfo, 0) /
                                                        (count - 1) if count > 1 else 0.0
rx_decode_time_ms, rx_in_flight_time_ms                 sum *(decision)*: they feed the turn's
                                                        transfer edge as turn totals (never printed
                                                        in the stage table)
rx_transfer_bytes                                       first positive: a turn edge's size is set
                                                        once, never summed (DOMAIN §5.7 D3)
everything else (batch_id, batch_size, replica_id, ...) first segment
======================================================  =====================================

The merged extra key ``audio_frames`` adds to ``audio_generated_frames``; any other extra key is
dropped and logged at DEBUG on logger ``projections.collapse`` (M3).

**None vs 0** — ``None`` means "no segment reported it" and is kept in the collapsed row, so the
JSON of a tokenless turn shows ``null`` for ``vllm_ttft_ms``/``vllm_tpot_ms`` (CASE-03/09):

* sums: ``None`` counts as 0, but a field that is ``None`` in every segment stays ``None``;
* first/last positive: ``None`` when no segment has a positive value (a 0 is "not measured");
* ``vllm_tpot_ms`` with no positive segment: the first segment's value, except ``None`` when the
  stage produced no output token (sum of ``num_tokens_out`` is 0/None) — a 0.0 TPOT for a
  tokenless turn would be a sentinel, not a measurement;
* the text renderer (``reports.render_text``) prints a ``None`` cell of a shown row as the field
  kind's zero (``0``, ``0.000``, blank for lists), which is what vLLM-Omni prints for its
  zero-initialised dataclass fields; the golden's stage-1 ``vllm_ttft_ms`` cell ``0.000`` comes
  from a ``None`` here.

**Incremental collapse** (pre-begin buffering, M15): :class:`StageCollapse` is an exact
accumulator, not a collapsed row. :func:`merge_into_pending` folds one snapshot at a time and
:func:`collapse_segments` is the same left fold, so sums (same addition order), first/last
positive and last-non-None are bit-identical either way. What a collapsed *row* cannot do is be
merged again: the itl means need the concatenated lists and the segment count (1 segment keeps
its own ``vllm_itl_ms``, 2+ use the list mean), ``vllm_tpot_ms`` needs the weight sums, and
``time_per_output_unit_ms`` needs the segment count. The accumulator therefore keeps the
concatenated lists, the tpot weighted sum and weight, the segment count and the first segment's
values — one tuple of every field's folded value, in ``STAT_FIELDS`` order, so a snapshot is read
with one call and a one-segment row is that tuple with its lists made lists — and only
:meth:`StageCollapse.row` derives the means. Accumulators combine associatively
(:meth:`StageCollapse.combine`), so a pending accumulator may be passed to
:func:`collapse_segments` in place of its snapshots.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from events.limits import derived
from events.stats import STAT_FIELDS, StageRequestStats

logger = logging.getLogger(__name__)

SUM_FIELDS: tuple[str, ...] = (
    "num_tokens_in",
    "num_tokens_out",
    "stage_gen_time_ms",
    "postprocess_time_ms",
    "audio_generated_frames",
    "audio_duration_s",
    "image_pixels",
    "output_unit_count",
    "rx_decode_time_ms",
    "rx_in_flight_time_ms",
)
FIRST_POSITIVE_FIELDS: tuple[str, ...] = (
    "vllm_ttft_ms",
    "serving_time_to_first_output_ms",
    "image_time_to_first_output_ms",
    "audio_sample_rate",
    "rx_transfer_bytes",
)
LAST_POSITIVE_FIELDS: tuple[str, ...] = ("denoise_step_latency_ms",)
LAST_NON_NONE_FIELDS: tuple[str, ...] = ("finish_reason", "final_output_type", "output_unit_type")
LIST_MEAN_FIELDS: dict[str, str] = {
    "vllm_itls_ms": "vllm_itl_ms",
    "inter_output_latencies_ms": "inter_output_latency_ms",
}
"""concatenated list field -> its mean field."""
EXTRA_KEY_MAP: dict[str, str] = {"audio_frames": "audio_generated_frames"}

_DERIVED = {"vllm_tpot_ms", "time_per_output_unit_ms", *LIST_MEAN_FIELDS, *LIST_MEAN_FIELDS.values()}
FIRST_SEGMENT_FIELDS: tuple[str, ...] = tuple(  # everything else: the first segment's value
    f
    for f in STAT_FIELDS
    if f not in {*SUM_FIELDS, *FIRST_POSITIVE_FIELDS, *LAST_POSITIVE_FIELDS, *LAST_NON_NONE_FIELDS, *_DERIVED}
)


_INDEX: dict[str, int] = {f: i for i, f in enumerate(STAT_FIELDS)}
_SUM = tuple(_INDEX[f] for f in SUM_FIELDS)
_FIRST_POSITIVE = tuple(_INDEX[f] for f in FIRST_POSITIVE_FIELDS)
_LAST_POSITIVE = tuple(_INDEX[f] for f in LAST_POSITIVE_FIELDS)
_LAST_NON_NONE = tuple(_INDEX[f] for f in LAST_NON_NONE_FIELDS)
_LATEST = _LAST_POSITIVE + _LAST_NON_NONE  # later segment's value wins when it has one
_LISTS = tuple(_INDEX[f] for f in LIST_MEAN_FIELDS)
_TPOT = _INDEX["vllm_tpot_ms"]
_TOKENS_OUT = _INDEX["num_tokens_out"]
_STAT_NAMES = frozenset(STAT_FIELDS)
_read_stats = attrgetter(*STAT_FIELDS)  # one C call: every field of a snapshot (struct or model)


def _add(a: Any, b: Any) -> Any:
    """None-aware sum: None + None = None, None counts as 0 otherwise."""
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _positive(v: Any) -> bool:
    return v is not None and v > 0


@dataclass(frozen=True, slots=True)
class StageCollapse:
    """Exact accumulator of one stage's segments (DOMAIN §5.4). Build with
    :func:`merge_into_pending` / :meth:`from_snapshot`; read with :meth:`row`.

    ``segments`` is how many snapshots were merged (0 = empty accumulator). ``values`` holds one
    entry per ``STAT_FIELDS`` field, in that order, already folded by the field's rule: a sum
    (None when every segment had None), the first / last positive value (None: none positive),
    the last non-None value, the concatenated list (a tuple), and for every other field
    (first-segment fields, ``vllm_tpot_ms``, ``time_per_output_unit_ms``, the itl means) the
    first segment's own value. ``tpot_weighted_sum`` / ``tpot_weight``: Σ tpot·w and Σ w over
    segments with a positive TPOT, w = ``max(num_tokens_out - 1, 1)``."""

    segments: int = 0
    values: tuple[Any, ...] = ()
    tpot_weighted_sum: float = 0.0
    tpot_weight: float = 0.0

    @classmethod
    def from_snapshot(cls, snap: Any, overrides: Mapping[str, Any] | None = None) -> StageCollapse:
        """Accumulator of exactly one segment. ``snap`` is a ``StageRequestStats`` or its struct
        (read by attribute only); ``overrides`` replace
        fields (engine-stamp TTFT/TPOT). Maps extra ``audio_frames`` onto
        ``audio_generated_frames``; other extra keys are logged at DEBUG and dropped (M3)."""
        values = list(_read_stats(snap))
        if overrides:
            for name, value in overrides.items():
                if name in _INDEX:
                    values[_INDEX[name]] = value
        return cls._from_list(values, snap.extra)

    @classmethod
    def from_values(cls, **values: Any) -> StageCollapse:
        """Accumulator of one segment given as ``STAT_FIELDS`` keywords (missing = None)."""
        if not _STAT_NAMES.issuperset(values):
            raise ValueError(f"not StageRequestStats fields: {sorted(set(values) - _STAT_NAMES)}")
        row: list[Any] = [None] * len(STAT_FIELDS)
        for name, value in values.items():
            row[_INDEX[name]] = value
        return cls._from_list(row, None)

    @classmethod
    def _from_list(cls, v: list[Any], extra: Mapping[str, Any] | None) -> StageCollapse:
        """One segment from its raw field values (``v``, STAT_FIELDS order; changed in place)."""
        if extra:
            for key, value in extra.items():
                target = EXTRA_KEY_MAP.get(key)
                if target is None:
                    logger.debug("collapse: dropping merged key %r=%r with no row field", key, value)
                elif isinstance(value, (int, float)) and not isinstance(value, bool):
                    v[_INDEX[target]] = _add(v[_INDEX[target]], value)
                else:
                    logger.debug("collapse: dropping non-numeric %r=%r", key, value)
        tpot = v[_TPOT]
        weight = float(max((v[_TOKENS_OUT] or 0) - 1, 1)) if _positive(tpot) else 0.0
        for i in _FIRST_POSITIVE:
            if not _positive(v[i]):
                v[i] = None
        for i in _LAST_POSITIVE:
            if not _positive(v[i]):
                v[i] = None
        for i in _LISTS:
            v[i] = tuple(v[i] or ())
        return cls(1, tuple(v), tpot * weight if weight else 0.0, weight)

    def combine(self, later: StageCollapse) -> StageCollapse:
        """Accumulator of ``self``'s segments followed by ``later``'s (associative)."""
        if self.segments == 0:
            return later
        if later.segments == 0:
            return self
        a, b = self.values, later.values
        out = list(a)  # first-segment fields keep self's values
        for i in _SUM:
            out[i] = _add(a[i], b[i])
        for i in _FIRST_POSITIVE:
            if a[i] is None:
                out[i] = b[i]
        for i in _LATEST:
            if b[i] is not None:
                out[i] = b[i]
        for i in _LISTS:
            out[i] = a[i] + b[i]
        return StageCollapse(
            self.segments + later.segments,
            tuple(out),
            self.tpot_weighted_sum + later.tpot_weighted_sum,
            self.tpot_weight + later.tpot_weight,
        )

    def row(self) -> dict[str, Any]:
        """The collapsed row: every ``STAT_FIELDS`` key -> value (None = not reported).

        List fields are always lists. Raises ValueError on an empty accumulator."""
        if self.segments == 0:
            raise ValueError("cannot collapse zero segments")
        row = dict(zip(STAT_FIELDS, self.values))
        single = self.segments == 1
        for list_field, mean_field in LIST_MEAN_FIELDS.items():
            values = list(row[list_field])
            row[list_field] = values
            if not single:  # one segment keeps its own mean
                row[mean_field] = sum(values) / len(values) if values else None
        if self.tpot_weight > 0:
            if not single:  # one segment: exact, t * w / w can be one ulp off t
                row["vllm_tpot_ms"] = self.tpot_weighted_sum / self.tpot_weight
        elif not row["num_tokens_out"]:
            row["vllm_tpot_ms"] = None  # tokenless stage: no TPOT, never a 0 sentinel (CASE-03)
        if not single:
            row["time_per_output_unit_ms"] = self._time_per_output_unit(row)
        return row

    @staticmethod
    def _time_per_output_unit(row: Mapping[str, Any]) -> float | None:
        count = row["output_unit_count"] or 0
        if count <= 1:
            return 0.0
        ttfo = row["serving_time_to_first_output_ms"] or 0.0
        gen = row["stage_gen_time_ms"] or 0.0
        return derived(max(gen - ttfo, 0.0) / (count - 1), count, gen, ttfo)


EMPTY = StageCollapse()

Segment = StageRequestStats | StageCollapse
"""A turn segment: one snapshot, or an accumulator of buffered snapshots (pending replay)."""


def merge_into_pending(pending: StageCollapse | None, snapshot: StageRequestStats) -> StageCollapse:
    """Fold one pre-begin snapshot into a stage's pending accumulator (DOMAIN §5.3, M15).

    ``pending`` None = nothing buffered yet. Returns a new accumulator (inputs are not changed);
    1,000 snapshots stay one accumulator. ``merge_into_pending(p, s).row()`` equals
    ``collapse_segments([...p's snapshots, s])``."""
    return (pending or EMPTY).combine(StageCollapse.from_snapshot(snapshot))


def accumulate(segments: Iterable[Segment]) -> StageCollapse:
    """Left fold of snapshots and/or accumulators, in arrival order."""
    acc = EMPTY
    for seg in segments:
        acc = acc.combine(seg if isinstance(seg, StageCollapse) else StageCollapse.from_snapshot(seg))
    return acc


def collapse_segments(segments: Iterable[Segment]) -> dict[str, Any]:
    """Collapse one stage's segments (arrival order) into one row (DOMAIN §5.4).

    ``segments``: StageRequestStats snapshots, and/or a :class:`StageCollapse` pending
    accumulator (pre-begin buffer replayed at begin). Returns a dict with every ``STAT_FIELDS``
    key; units as in the field names. Raises ValueError when ``segments`` is empty."""
    return accumulate(segments).row()
