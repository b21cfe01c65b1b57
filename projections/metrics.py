"""Operator metrics from the log: one pure fold behind the live ``/metrics`` and the offline
``duplex-ledger metrics`` (issue 16).

:class:`MetricsFold` counts stored events one at a time from what a
:class:`~projections.projector.Projector` made of each (so turn tables, reasons and findings are
the audit's own, DOMAIN §5.5/§5.7): the resources verdict, the turn tables the event finalized and
the session's resources state, plus a few raw facts of the event, become updates of the families
in :data:`FAMILIES`, handed to a :class:`MetricsSink` (``engine_bridge.prometheus.PrometheusSink``
for Prometheus, :class:`TallySink` for tests). One fold per event (issue 23): live, each session's
own projector — the one its decisions read — hands its results to :meth:`MetricsFold.apply_folded`;
offline (``duplex-ledger metrics``, ``tables --summary``), :meth:`MetricsFold.apply` folds the
stored log with the metrics' own projector and hands them to the same method: the same updates,
so the same samples. Positions play no part (live folds see provisional ones).

Clocks: every duration is two event ``ts`` of one wall clock (the server's), computed on integer
microseconds (``projections.intervals.span_ms``); no engine-monotonic stamp is used here.

Per turn (once per ``response_id``, when the projector finalizes it; listen-only turns make no
turn table, so they add nothing here):

* ``vllm_omni:requests_success_total{model_name, finished_reason}`` +1, every reason of
  DOMAIN §2.4/§5.5 (stop, barge_in, cancel, close, abort, error) kept apart; the six children
  of a model exist from its first session on (zero until counted);
* ``vllm_omni:e2e_request_latency_s{model_name}`` observes ``e2e_total_ms`` / 1000 (arrival →
  finalize, DOMAIN §5.5) for every reason except ``abort``;
* ``vllm_omni:prompt_tokens_total{model_name}`` + Stage0 ``num_tokens_in``;
  ``vllm_omni:generation_tokens_total{model_name}`` + every stage's ``num_tokens_out`` (the two
  add up to the turn's ``e2e_total_tokens``);
* ``vllm_omni:audio_ttfp_s{model_name, stage}``: turn ``arrival_ts`` → the first audio output of
  the turn's engine id (a ``StageOutput`` with ``audio_frames`` > 0, or a token-carrying output
  of a stage ≥ 1, whose tokens stand for codec frames) that falls inside
  [arrival_ts, finalize_ts]; at most one sample per turn, never negative; ``stage`` = the stage
  of that output. A turn with no audio output has no sample.
* vLLM's own charts (issue 22), from the turn table's Stage0 row:
  ``vllm_omni:time_to_first_token_s{model_name}`` (``vllm_ttft_ms`` / 1000 when present),
  ``vllm_omni:request_time_per_output_token_s{model_name}`` (``vllm_tpot_ms`` / 1000 when > 0),
  ``vllm_omni:inter_token_latency_s{model_name}`` (each ``vllm_itls_ms`` entry / 1000).

After every event that can move them (one that binds, finishes or drops a key, or an id's first
output since its submit/forward; the others cannot): ``vllm_omni:num_requests_running`` /
``num_requests_waiting`` ``{model_name}`` (gauges): of the ids the resources fold says run, those with no ``StageOutput`` since their
latest submit/forward are waiting, the others running. A model's histogram children and these
gauges exist (zero samples) from its first ``SessionOpened``.

Session and lifecycle (``duplex_ledger:``): ``listen_units_total`` (+1 per
``ResponseListened``); ``listen_only_turns_total`` (+1 when a turn that listened and never
began a response ends: ``TurnCompleted`` from it or ``SessionClosed``, DOMAIN M11);
``sessions_admitted`` (gauge: opened, not closed); ``sessions_cleanup_pending`` (gauge: closed
but the resources fold still holds something of it: a failed close cleanup keeps the slot
pending, not closed); ``sessions_closed_total{reason}`` (+1 when a closed session holds nothing
any more; ``reason`` from ``SessionClosed``); ``session_duration_s`` (histogram, open ts → close
ts) and ``session_turns`` (histogram, turn tables of the session) observed at ``SessionClosed``;
``abort_failures_total{stage}`` (+1 per ``AbortResult`` with outcome ``failed``, i.e. per pool
call). ``request_ids_leaked`` is read from the audit when exposed (:meth:`MetricsFold.
leaked_request_ids`); ``running_counter_drift`` needs a live engine (``engine_bridge.prometheus``).

At ``SessionClosed`` the fold also keeps a :class:`SessionRollup` (the
``[DuplexSessionSummary]`` table).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from events.records import StoredEvent
from events.types import (
    FINISHED_REASONS,
    AbortResult,
    ActiveRequestBound,
    CancelRequested,
    CommandRejected,
    EpochAdvanced,
    EventBase,
    InputAppended,
    InputCleared,
    ReleaseRequested,
    ResponseBegun,
    ResponseEnded,
    ResponseListened,
    SessionClosed,
    SessionOpened,
    StageMetricsReported,
    StageOutput,
    StageRequestForwarded,
    StageRequestReserved,
    StageRequestSubmitted,
    TransferTx,
    TurnCommitted,
    TurnCompleted,
    TurnFinalized,
)
from projections.dispatch import dispatch_table
from projections.intervals import span_ms
from projections.projector import Projector
from projections.resources import SessionResources
from projections.turn_tables import TurnTables

FamilyKind = Literal["counter", "gauge", "histogram"]

E2E_BUCKETS_S: tuple[float, ...] = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
"""vLLM's ``vllm:e2e_request_latency_seconds`` buckets (s)."""
TTFP_BUCKETS_S: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
"""vLLM's time-to-first-token buckets (s), used for time to first audio packet."""
TTFT_BUCKETS_S: tuple[float, ...] = TTFP_BUCKETS_S
"""vLLM's ``vllm:time_to_first_token_seconds`` buckets (s)."""
ITL_BUCKETS_S: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
"""vLLM's ``vllm:inter_token_latency_seconds`` / ``request_time_per_output_token_seconds``
buckets (s)."""
SESSION_DURATION_BUCKETS_S: tuple[float, ...] = (
    1.0,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    7200.0,
    14400.0,
    86400.0,
)
SESSION_TURNS_BUCKETS: tuple[float, ...] = (0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 55.0, 89.0, 144.0)
UNKNOWN_MODEL = "unknown"
"""``model_name`` of a session whose ``SessionOpened`` names no model."""


@dataclass(frozen=True)
class Family:
    """One metric family: the exposed name (counters end in ``_total``), its kind, label names,
    buckets (histograms) and help text."""

    name: str
    kind: FamilyKind
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    help: str = ""


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "vllm_omni:requests_success_total",
            "counter",
            ("model_name", "finished_reason"),
            help="Finalized duplex turns (one per response_id) by finished reason (DOMAIN §2.4).",
        ),
        Family(
            "vllm_omni:e2e_request_latency_s",
            "histogram",
            ("model_name",),
            E2E_BUCKETS_S,
            help="Turn arrival to finalize, seconds, wall clock; every reason except abort.",
        ),
        Family(
            "vllm_omni:prompt_tokens_total", "counter", ("model_name",), help="Stage0 prompt tokens of finalized turns."
        ),
        Family(
            "vllm_omni:generation_tokens_total",
            "counter",
            ("model_name",),
            help="Output tokens of every stage of finalized turns.",
        ),
        Family(
            "vllm_omni:audio_ttfp_s",
            "histogram",
            ("model_name", "stage"),
            TTFP_BUCKETS_S,
            help="Turn arrival to the turn's first audio output, seconds, server wall clock; one per turn.",
        ),
        Family(
            "vllm_omni:time_to_first_token_s",
            "histogram",
            ("model_name",),
            TTFT_BUCKETS_S,
            help="Stage0 vllm_ttft_ms of each turn table, seconds (vLLM's time_to_first_token).",
        ),
        Family(
            "vllm_omni:request_time_per_output_token_s",
            "histogram",
            ("model_name",),
            ITL_BUCKETS_S,
            help="Stage0 vllm_tpot_ms (> 0) of each turn table, seconds (vLLM's request TPOT).",
        ),
        Family(
            "vllm_omni:inter_token_latency_s",
            "histogram",
            ("model_name",),
            ITL_BUCKETS_S,
            help="Each Stage0 vllm_itls_ms entry of each turn table, seconds.",
        ),
        Family(
            "vllm_omni:num_requests_running",
            "gauge",
            ("model_name",),
            help="Engine ids the log says run and that gave an output since their latest submit/forward.",
        ),
        Family(
            "vllm_omni:num_requests_waiting",
            "gauge",
            ("model_name",),
            help="Engine ids the log says run that gave no output yet since their latest submit/forward.",
        ),
        Family(
            "duplex_ledger:listen_units_total",
            "counter",
            help="Listen-only units (ResponseListened): the model kept listening.",
        ),
        Family(
            "duplex_ledger:listen_only_turns_total",
            "counter",
            help="Turns that listened and ended without beginning a response.",
        ),
        Family("duplex_ledger:sessions_admitted", "gauge", help="Sessions opened and not closed."),
        Family(
            "duplex_ledger:sessions_cleanup_pending",
            "gauge",
            help="Closed sessions whose request ids are still held (close cleanup pending or failed).",
        ),
        Family("duplex_ledger:request_ids_leaked", "gauge", help="Distinct request ids with a leak finding (audit)."),
        Family("duplex_ledger:abort_failures_total", "counter", ("stage",), help="Failed aborts, one per pool call."),
        Family(
            "duplex_ledger:session_duration_s",
            "histogram",
            (),
            SESSION_DURATION_BUCKETS_S,
            help="SessionOpened to SessionClosed, seconds, wall clock.",
        ),
        Family(
            "duplex_ledger:session_turns",
            "histogram",
            (),
            SESSION_TURNS_BUCKETS,
            help="Turn tables (finalized responses) per closed session.",
        ),
        Family(
            "duplex_ledger:sessions_closed_total",
            "counter",
            ("reason",),
            help="Closed sessions that hold nothing any more, by close reason.",
        ),
        Family(
            "duplex_ledger:running_counter_drift",
            "gauge",
            help="Request ids the log says are running minus the ids the engines hold (live only).",
        ),
    )
}
OFFLINE_FAMILIES: tuple[str, ...] = tuple(n for n in FAMILIES if n != "duplex_ledger:running_counter_drift")
"""Families the log alone determines (everything but the engine-side drift)."""


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


@dataclass(frozen=True)
class Distribution:
    """count / mean / p50 / p99 of a list of values (ms); None when empty. Percentiles are
    nearest-rank: the value at rank ceil(p/100 · count) of the sorted values."""

    count: int
    mean: float | None
    p50: float | None
    p99: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        if not values:
            return cls(0, None, None, None)
        ordered = sorted(values)

        def rank(p: float) -> float:
            return ordered[max(math.ceil(p / 100.0 * len(ordered)), 1) - 1]

        return cls(len(ordered), sum(ordered) / len(ordered), rank(50), rank(99))

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean, "p50": self.p50, "p99": self.p99}


@dataclass(frozen=True)
class SessionRollup:
    """One closed session (fixed at its ``SessionClosed``): turns by finished reason (all six,
    DOMAIN §5.5), Stage0 TTFT and TPOT (``vllm_ttft_ms``, ``vllm_tpot_ms`` > 0 of its turn tables)
    and TTFP (:data:`FAMILIES` ``audio_ttfp_s``, in ms) as :class:`Distribution` s, listen units,
    ``session_wall_ms`` (open ts → close ts, wall clock; None when the open is not in the folded
    log) and the close reason. Leaked ids are read from the audit when it is rendered."""

    session_id: str
    model_name: str
    close_reason: str
    opened_ts: float | None
    closed_ts: float
    closed_position: int
    turns_by_reason: dict[str, int]
    ttft_ms: Distribution
    ttfp_ms: Distribution
    tpot_ms: Distribution
    listen_units: int
    session_wall_ms: float | None

    @property
    def turns(self) -> int:
        return sum(self.turns_by_reason.values())


@dataclass
class _Session:
    model_name: str = UNKNOWN_MODEL
    opened_ts: float | None = None
    admitted: bool = False
    reasons: Counter[str] = field(default_factory=Counter)
    ttft_ms: list[float] = field(default_factory=list)
    tpot_ms: list[float] = field(default_factory=list)
    ttfp_ms: list[float] = field(default_factory=list)
    listen_units: int = 0
    listened_turns: set[int] = field(default_factory=set)
    answered_turns: set[int] = field(default_factory=set)
    counted_responses: set[str] = field(default_factory=set)
    audio_open: set[tuple[str, int]] = field(default_factory=set)  # (request_id, stage): segment awaiting audio
    audio_first: dict[str, list[tuple[float, int]]] = field(default_factory=dict)  # request_id -> (ts, stage)
    close_reason: str | None = None  # closed, slot not yet settled


def is_audio_output(stage_id: int, num_new_tokens: int, audio_frames: int) -> bool:
    """An output that carries audio: frames reported, or tokens of a stage ≥ 1 (the talker's
    tokens stand for codec frames)."""
    return audio_frames > 0 or (stage_id >= 1 and num_new_tokens > 0)


def holds_slot(resources: Any) -> bool:
    """Does a session (``projections.resources.SessionResources``) still hold engine work: a
    binding, an abort in flight or failed, or an id whose keys were dropped and whose cleanup
    was not yet acknowledged (close drops the keys before it asks for the abort, R1)?"""
    if resources.holds_anything():
        return True
    return any(
        life.submitted
        and not life.cleanup_ok
        and life.keys_dropped_at is not None
        and not (0 in life.finished_stages and not life.abort_failed and not life.abort_pending)
        for life in resources.lives.values()
    )


def _classes(*classes: type[EventBase]) -> frozenset[type]:
    """The structs of ``classes`` (:func:`projections.dispatch.dispatch_table`'s keys)."""
    return frozenset(dispatch_table(dict.fromkeys(classes, _classes)))


_CLOSES = _classes(SessionClosed)
"""``SessionClosed``'s struct: the event that fixes a session's rollup."""
_OUTPUTS = _classes(StageOutput)
_GAUGES_QUIET = _classes(
    StageOutput,  # only a finishing output or an id's first since its submit/forward
    StageRequestReserved,  # a reserved key is not submitted: it does not run yet
    StageMetricsReported,
    TransferTx,
    InputAppended,
    InputCleared,
    TurnCommitted,
    ResponseListened,
    ResponseBegun,
    ResponseEnded,
    TurnCompleted,
    TurnFinalized,
    CancelRequested,
    EpochAdvanced,
    ActiveRequestBound,
    ReleaseRequested,
    CommandRejected,
)
"""Events that neither bind, finish nor drop a key in the resources fold nor give an id its
first output: the running/waiting gauges cannot change on them (tests/metrics checks this against
a recount after every event)."""


class MetricsFold:
    """Pure fold from stored events to metric updates (see the module docstring).

    ``apply(stored)`` returns the turn tables the event finalized. ``rollups`` collects a
    :class:`SessionRollup` per ``SessionClosed``."""

    def __init__(self, sink: MetricsSink, projector: Projector | None = None) -> None:
        self.sink = sink
        self.projector = projector or Projector()
        self.sessions: dict[str, _Session] = {}
        self.rollups: list[SessionRollup] = []
        self.admitted = 0
        self.cleanup_pending = 0
        self._models: set[str] = set()
        self._awaiting: dict[str, set[str]] = {}  # session -> ids awaiting an output since their submit
        self._request_counts: dict[str, tuple[str, int, int]] = {}  # session -> (model, running, waiting)
        self._model_requests: dict[str, list[int]] = {}  # model -> [running, waiting]
        self._stages: set[tuple[str, int]] = set()  # (model, stage) declared
        self._woke = False  # the event being counted gave an id its first output since its submit
        self.gauges_every_event = False  # recount running/waiting after every event (tests)
        self.folded_by: Callable[[], Iterable[Projector]] | None = None  # live: the sessions' folds
        self._handlers = dispatch_table(
            {
                SessionOpened: self._opened,
                SessionClosed: self._closed,
                ResponseListened: self._listened,
                ResponseBegun: self._begun,
                TurnCommitted: self._committed,
                TurnCompleted: self._turn_completed,
                StageRequestSubmitted: self._segment,
                StageRequestForwarded: self._segment,
                StageOutput: self._output,
                AbortResult: self._abort_result,
            }
        )
        sink.set("duplex_ledger:sessions_admitted", (), 0)
        sink.set("duplex_ledger:sessions_cleanup_pending", (), 0)

    # ------------------------------------------------------------------ apply
    def apply(self, stored: StoredEvent) -> list[TurnTables]:
        """Fold one event with this fold's own :attr:`projector` and count what it gave
        (:meth:`apply_folded`); returns the turn tables the event finalized. The offline path
        (``duplex-ledger metrics``, ``tables --summary``): one fold of the log."""
        projector = self.projector
        accepted = projector.apply(stored)
        turns = projector.turns.take_finalized() if projector.turns.finalized else []
        self.apply_folded(stored, accepted, turns, projector.session_resources(stored.event.session_id))
        return turns

    def apply_folded(
        self,
        stored: StoredEvent,
        accepted: bool,
        turns: Sequence[TurnTables],
        resources: SessionResources | None,
    ) -> None:
        """Count one event a :class:`~projections.projector.Projector` has already folded
        (issue 23: one fold per event, live and offline): ``accepted`` is its resources verdict
        (D9/D18: a refused fact counts nowhere), ``turns`` the turn tables it finalized (in
        order), ``resources`` the event's session's resources state after it (None: none). The
        live session (``engine_bridge.session_log.SessionLog``) hands its own fold's results
        here; :meth:`apply` its own. Nothing here folds the event again."""
        event = stored.event
        sid = event.session_id
        s = self.sessions.get(sid)
        if s is None:
            s = self.sessions[sid] = _Session()
        etype = type(event)
        handler = self._handlers.get(etype)
        self._woke = False
        if handler is not None and accepted:
            handler(s, stored, event)
            s = self.sessions[sid]  # a SessionOpened starts a fresh incarnation
        for turn in turns:
            self._turn(s, turn)
        if accepted and etype in _CLOSES:
            self._rollup(sid, s, stored, event)  # type: ignore[arg-type]  # after its close's turn
        if s.close_reason is not None:
            self._settle(s, resources)
        # Running/waiting change only when an id starts or stops running or gives its first
        # output since its submit/forward: not on the other events (nor on every output).
        if (
            self.gauges_every_event
            or etype not in _GAUGES_QUIET
            or (etype in _OUTPUTS and (self._woke or event.finished))  # type: ignore[attr-defined]
        ):
            self._request_gauges(sid, s.model_name, resources)

    def apply_all(self, events: Sequence[StoredEvent] | Any) -> MetricsFold:
        for stored in events:
            self.apply(stored)
        return self

    # ------------------------------------------------------------------ raw facts
    def _opened(self, s: _Session, st: StoredEvent, e: SessionOpened) -> None:
        model = e.model or UNKNOWN_MODEL
        fresh = _Session(model_name=model, opened_ts=e.ts, admitted=True)
        fresh.close_reason = s.close_reason  # a previous incarnation's slot may still be pending
        self.sessions[e.session_id] = fresh
        if s.admitted:  # reopened without a close in the log: the old slot is gone
            self.admitted -= 1
        self.admitted += 1
        self.sink.set("duplex_ledger:sessions_admitted", (), self.admitted)
        if model not in self._models:
            self._models.add(model)
            for reason in FINISHED_REASONS:  # every reason visible from the start (rate() works)
                self.sink.inc("vllm_omni:requests_success_total", (model, reason), 0)
            for name in ("vllm_omni:prompt_tokens_total", "vllm_omni:generation_tokens_total"):
                self.sink.inc(name, (model,), 0)
            self._declare_model(model)

    def _closed(self, s: _Session, st: StoredEvent, e: SessionClosed) -> None:
        if s.admitted:
            s.admitted = False
            self.admitted -= 1
            self.sink.set("duplex_ledger:sessions_admitted", (), self.admitted)
        if s.close_reason is None:
            self.cleanup_pending += 1
            self.sink.set("duplex_ledger:sessions_cleanup_pending", (), self.cleanup_pending)
        s.close_reason = e.reason
        self._end_listen_turns(s, None)

    def _listened(self, s: _Session, st: StoredEvent, e: ResponseListened) -> None:
        s.listen_units += 1
        s.listened_turns.add(e.turn_id)
        self.sink.inc("duplex_ledger:listen_units_total", (), 1)

    def _begun(self, s: _Session, st: StoredEvent, e: ResponseBegun) -> None:
        s.answered_turns.add(e.turn_id)

    def _committed(self, s: _Session, st: StoredEvent, e: TurnCommitted) -> None:
        if e.response_id is not None and e.create_response:
            s.answered_turns.add(e.turn_id)

    def _turn_completed(self, s: _Session, st: StoredEvent, e: TurnCompleted) -> None:
        self._end_listen_turns(s, e.completed_turn_id)

    def _end_listen_turns(self, s: _Session, turn_id: int | None) -> None:
        ended = s.listened_turns if turn_id is None else s.listened_turns & {turn_id}
        for t in ended:
            if t not in s.answered_turns:
                self.sink.inc("duplex_ledger:listen_only_turns_total", (), 1)
        s.listened_turns -= set(ended)

    def _segment(self, s: _Session, st: StoredEvent, e: StageRequestSubmitted | StageRequestForwarded) -> None:
        s.audio_open.add((e.request_id, e.stage_id))
        self._awaiting.setdefault(e.session_id, set()).add(e.request_id)
        self._declare_stage(s.model_name, e.stage_id)

    def _output(self, s: _Session, st: StoredEvent, e: StageOutput) -> None:
        awaiting = self._awaiting.get(e.session_id)
        if awaiting and e.request_id in awaiting:
            awaiting.discard(e.request_id)
            self._woke = True  # the id's first output since its submit/forward: it runs now
        key = (e.request_id, e.stage_id)
        if key in s.audio_open and is_audio_output(e.stage_id, e.num_new_tokens, e.audio_frames):
            s.audio_open.discard(key)
            s.audio_first.setdefault(e.request_id, []).append((e.ts, e.stage_id))

    def _abort_result(self, s: _Session, st: StoredEvent, e: AbortResult) -> None:
        if e.outcome == "failed":
            self.sink.inc("duplex_ledger:abort_failures_total", (str(e.stage_id),), 1)

    # ------------------------------------------------------------------ turns
    def _turn(self, s: _Session, t: TurnTables) -> None:
        if t.response_id in s.counted_responses:
            return  # a response finalized twice counts once
        s.counted_responses.add(t.response_id)
        model = s.model_name
        s.reasons[t.finished_reason] += 1
        self.sink.inc("vllm_omni:requests_success_total", (model, t.finished_reason), 1)
        if t.finished_reason != "abort":
            self.sink.observe("vllm_omni:e2e_request_latency_s", (model,), t.e2e["e2e_total_ms"] / 1000.0)
        stage0 = t.stages.get(0, {})
        self.sink.inc("vllm_omni:prompt_tokens_total", (model,), stage0.get("num_tokens_in") or 0)
        self.sink.inc(
            "vllm_omni:generation_tokens_total",
            (model,),
            sum(row.get("num_tokens_out") or 0 for row in t.stages.values()),
        )
        self._latencies(model, stage0)
        if stage0.get("vllm_ttft_ms") is not None:
            s.ttft_ms.append(stage0["vllm_ttft_ms"])
        if (stage0.get("vllm_tpot_ms") or 0) > 0:
            s.tpot_ms.append(stage0["vllm_tpot_ms"])
        first = self._first_audio(s, t)
        if first is not None:
            ts, stage = first
            ttfp_ms = max(span_ms(t.arrival_ts, ts), 0.0)  # D17 (inside [arrival, finalize] already)
            s.ttfp_ms.append(ttfp_ms)
            self.sink.observe("vllm_omni:audio_ttfp_s", (model, str(stage)), ttfp_ms / 1000.0)

    @staticmethod
    def _first_audio(s: _Session, t: TurnTables) -> tuple[float, int] | None:
        """The turn's first audio output inside [arrival, finalize]; the id's outputs up to the
        finalize (in log order) are then forgotten (a resident id serves later turns)."""
        if t.request_id is None:  # ended before any engine request (D8): no audio
            return None
        outputs = s.audio_first.get(t.request_id)
        if not outputs:
            return None
        inside = [o for o in outputs if t.arrival_ts <= o[0] <= t.finalize_ts]
        # Every output recorded so far came before the finalize in the log, whatever its ts says
        # (a clock stepped back, D17): none of them may lend a later turn its first audio.
        del s.audio_first[t.request_id]
        return min(inside) if inside else None

    # ------------------------------------------------------------------ vLLM-style families (issue 22)
    def _declare_model(self, model: str) -> None:
        """A model's histogram children and request gauges exist from its first session on."""
        for name in (
            "vllm_omni:e2e_request_latency_s",
            "vllm_omni:time_to_first_token_s",
            "vllm_omni:request_time_per_output_token_s",
            "vllm_omni:inter_token_latency_s",
        ):
            self.sink.declare(name, (model,))
        self._model_requests.setdefault(model, [0, 0])
        self.sink.set("vllm_omni:num_requests_running", (model,), 0)
        self.sink.set("vllm_omni:num_requests_waiting", (model,), 0)

    def _declare_stage(self, model: str, stage_id: int) -> None:
        """A stage's children (``abort_failures_total``, the model's ``audio_ttfp_s``) exist
        from the stage's first submit/forward on."""
        if (model, stage_id) in self._stages:
            return
        if not any(stage == stage_id for _, stage in self._stages):
            self.sink.inc("duplex_ledger:abort_failures_total", (str(stage_id),), 0)
        self._stages.add((model, stage_id))
        self.sink.declare("vllm_omni:audio_ttfp_s", (model, str(stage_id)))

    def _latencies(self, model: str, stage0: Mapping[str, Any]) -> None:
        """TTFT, request TPOT and ITLs of one turn table's Stage0 row (the figures its
        ``[DuplexSessionSummary]`` and ``--log-stats`` tables print), in seconds."""
        ttft_ms = stage0.get("vllm_ttft_ms")
        if ttft_ms is not None:
            self.sink.observe("vllm_omni:time_to_first_token_s", (model,), ttft_ms / 1000.0)
        tpot_ms = stage0.get("vllm_tpot_ms") or 0
        if tpot_ms > 0:
            self.sink.observe("vllm_omni:request_time_per_output_token_s", (model,), tpot_ms / 1000.0)
        for itl_ms in stage0.get("vllm_itls_ms") or ():
            self.sink.observe("vllm_omni:inter_token_latency_s", (model,), itl_ms / 1000.0)

    def _request_gauges(self, session_id: str, model: str, held: SessionResources | None) -> None:
        """Running/waiting of the session's model after an event that may change them: of the
        ids the resources fold says run (``held``: submitted, not finished, aborted or
        released), those with no ``StageOutput`` since their latest submit/forward are
        waiting, the others running."""
        ids = held.running_ids() if held is not None else set()
        awaiting = self._awaiting.get(session_id)
        if awaiting:
            awaiting &= ids
        waiting = len(ids & awaiting) if awaiting else 0
        now = (model, len(ids) - waiting, waiting)
        before = self._request_counts.get(session_id, (model, 0, 0))
        if now == before:
            return
        self._request_counts[session_id] = now
        for (m, running, wait), sign in ((before, -1), (now, 1)):
            totals = self._model_requests.setdefault(m, [0, 0])
            totals[0] += sign * running
            totals[1] += sign * wait
        for m in {before[0], model}:
            totals = self._model_requests[m]
            self.sink.set("vllm_omni:num_requests_running", (m,), totals[0])
            self.sink.set("vllm_omni:num_requests_waiting", (m,), totals[1])

    # ------------------------------------------------------------------ close
    def _rollup(self, session_id: str, s: _Session, st: StoredEvent, e: SessionClosed) -> None:
        # D17: a clock stepped back between open and close shows and observes 0, never negative
        wall_ms = max(span_ms(s.opened_ts, e.ts), 0.0) if s.opened_ts is not None else None
        self.rollups.append(
            SessionRollup(
                session_id=session_id,
                model_name=s.model_name,
                close_reason=e.reason,
                opened_ts=s.opened_ts,
                closed_ts=e.ts,
                closed_position=st.position,
                turns_by_reason={r: s.reasons.get(r, 0) for r in FINISHED_REASONS},
                ttft_ms=Distribution.of(s.ttft_ms),
                ttfp_ms=Distribution.of(s.ttfp_ms),
                tpot_ms=Distribution.of(s.tpot_ms),
                listen_units=s.listen_units,
                session_wall_ms=wall_ms,
            )
        )
        if wall_ms is not None:
            self.sink.observe("duplex_ledger:session_duration_s", (), wall_ms / 1000.0)
        self.sink.observe("duplex_ledger:session_turns", (), float(sum(s.reasons.values())))

    def _settle(self, s: _Session, held: SessionResources | None) -> None:
        """A closed session whose resources (``held``) hold nothing any more frees its slot."""
        if held is not None and holds_slot(held):
            return
        self.sink.inc("duplex_ledger:sessions_closed_total", (s.close_reason or "",), 1)
        s.close_reason = None
        self.cleanup_pending -= 1
        self.sink.set("duplex_ledger:sessions_cleanup_pending", (), self.cleanup_pending)

    # ------------------------------------------------------------------ audit
    def projectors(self) -> list[Projector]:
        """The folds whose state the audit-read gauges read: this fold's own :attr:`projector`
        plus, live, those of the sessions that hand their results to :meth:`apply_folded`
        (:attr:`folded_by`, set by the engine; each session's state lives in one of them)."""
        own = [self.projector]
        return own if self.folded_by is None else own + list(self.folded_by())

    def running(self) -> int:
        """Ids the log says are running (``ResourcesFold.running``), over :meth:`projectors`."""
        return sum(p.resources.running() for p in self.projectors())

    def leaked_request_ids(self, max_idle_s: float = 30.0, as_of_ts: float | None = None) -> int:
        """Distinct (session, request id) pairs with a leak finding now (DOMAIN §4.2; the
        audit's own findings, ``as_of_ts`` default: ts of the last applied event)."""
        return len({(f.session_id, f.request_id) for p in self.projectors() for f in p.leaks(max_idle_s, as_of_ts)})

    def leaked_ids_of(self, session_id: str, max_idle_s: float = 30.0) -> list[str]:
        """The request ids of ``session_id`` with a leak finding now, sorted."""
        return sorted(
            {f.request_id or "" for p in self.projectors() for f in p.leaks(max_idle_s) if f.session_id == session_id}
        )
