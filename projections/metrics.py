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

The jobs live in modules of their own (this one dispatches the events and keeps the
per-session records): the family declarations (:mod:`projections.metrics_families`), the sinks
(:mod:`projections.metrics_sinks`), per-turn observations (:mod:`projections.metrics_turns`),
the request gauges (:mod:`projections.metrics_requests`), the session gauges
(:mod:`projections.metrics_sessions`) and the session record and rollup
(:mod:`projections.metrics_rollup`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from events.records import StoredEvent
from events.types import (
    AbortResult,
    ResponseBegun,
    ResponseListened,
    SessionClosed,
    SessionOpened,
    StageOutput,
    StageRequestForwarded,
    StageRequestSubmitted,
    TurnCommitted,
    TurnCompleted,
)
from projections.dispatch import dispatch_table
from projections.metrics_families import FAMILIES, OFFLINE_FAMILIES, UNKNOWN_MODEL, Family
from projections.metrics_requests import RequestGauges, structs_of
from projections.metrics_rollup import Distribution, SessionRollup, SessionTally, close_rollup
from projections.metrics_sessions import SessionGauges, holds_slot
from projections.metrics_sinks import MetricsSink, TallySink
from projections.metrics_turns import TurnObservations, is_audio_output
from projections.projector import Projector
from projections.resources import SessionResources
from projections.turn_tables import TurnTables

__all__ = [
    "FAMILIES",
    "OFFLINE_FAMILIES",
    "UNKNOWN_MODEL",
    "Distribution",
    "Family",
    "MetricsFold",
    "MetricsSink",
    "SessionRollup",
    "TallySink",
    "holds_slot",
    "is_audio_output",
]

_CLOSES = structs_of(SessionClosed)
"""``SessionClosed``'s struct: the event that fixes a session's rollup."""
_OUTPUTS = structs_of(StageOutput)


class MetricsFold:
    """Pure fold from stored events to metric updates (see the module docstring).

    ``apply(stored)`` returns the turn tables the event finalized. ``rollups`` collects a
    :class:`SessionRollup` per ``SessionClosed``."""

    def __init__(self, sink: MetricsSink, projector: Projector | None = None) -> None:
        self.sink = sink
        self.projector = projector or Projector()
        self.sessions: dict[str, SessionTally] = {}
        self.rollups: list[SessionRollup] = []
        self.turn_observations = TurnObservations(sink)
        self.requests = RequestGauges(sink)
        self.session_gauges = SessionGauges(sink)
        self._models: set[str] = set()
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

    @property
    def admitted(self) -> int:
        """Sessions opened and not closed (``duplex_ledger:sessions_admitted``)."""
        return self.session_gauges.admitted

    @property
    def cleanup_pending(self) -> int:
        """Closed sessions whose slot is not settled (``duplex_ledger:sessions_cleanup_pending``)."""
        return self.session_gauges.cleanup_pending

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
            s = self.sessions[sid] = SessionTally()
        etype = type(event)
        handler = self._handlers.get(etype)
        self._woke = False
        if handler is not None and accepted:
            handler(s, stored, event)
            s = self.sessions[sid]  # a SessionOpened starts a fresh incarnation
        for turn in turns:
            self.turn_observations.count(s, turn)
        if accepted and etype in _CLOSES:
            # after its close's turn
            self._close_rollup(sid, s, stored, event)  # type: ignore[arg-type]
        if s.close_reason is not None:
            self.session_gauges.settle(s, resources)
        # Running/waiting change only when an id starts or stops running or gives its first
        # output since its submit/forward: not on the other events (nor on every output).
        requests = self.requests
        if (
            self.gauges_every_event
            or etype not in requests.quiet
            or (etype in _OUTPUTS and (self._woke or event.finished))  # type: ignore[attr-defined]
        ):
            requests.update(sid, s.model_name, resources)

    def apply_all(self, events: Sequence[StoredEvent] | Any) -> MetricsFold:
        for stored in events:
            self.apply(stored)
        return self

    # ------------------------------------------------------------------ raw facts
    def _opened(self, s: SessionTally, st: StoredEvent, e: SessionOpened) -> None:
        model = e.model or UNKNOWN_MODEL
        fresh = SessionTally(model_name=model, opened_ts=e.ts, admitted=True)
        fresh.close_reason = s.close_reason  # a previous incarnation's slot may still be pending
        self.sessions[e.session_id] = fresh
        self.session_gauges.opened(s)
        if model not in self._models:
            self._models.add(model)
            self.turn_observations.declare_model(model)
            self.requests.declare_model(model)

    def _closed(self, s: SessionTally, st: StoredEvent, e: SessionClosed) -> None:
        self.session_gauges.closed(s, e.reason)
        self._end_listen_turns(s, None)

    def _listened(self, s: SessionTally, st: StoredEvent, e: ResponseListened) -> None:
        s.listen_units += 1
        s.listened_turns.add(e.turn_id)
        self.sink.inc("duplex_ledger:listen_units_total", (), 1)

    def _begun(self, s: SessionTally, st: StoredEvent, e: ResponseBegun) -> None:
        s.answered_turns.add(e.turn_id)

    def _committed(self, s: SessionTally, st: StoredEvent, e: TurnCommitted) -> None:
        if e.response_id is not None and e.create_response:
            s.answered_turns.add(e.turn_id)

    def _turn_completed(self, s: SessionTally, st: StoredEvent, e: TurnCompleted) -> None:
        self._end_listen_turns(s, e.completed_turn_id)

    def _end_listen_turns(self, s: SessionTally, turn_id: int | None) -> None:
        """Turns that listened and never began a response end (all of them when ``turn_id`` is
        None: the session closed): each adds one listen-only turn (DOMAIN M11)."""
        ended = s.listened_turns if turn_id is None else s.listened_turns & {turn_id}
        for t in ended:
            if t not in s.answered_turns:
                self.sink.inc("duplex_ledger:listen_only_turns_total", (), 1)
        s.listened_turns -= set(ended)

    def _segment(self, s: SessionTally, st: StoredEvent, e: StageRequestSubmitted | StageRequestForwarded) -> None:
        self.turn_observations.segment(s, e.request_id, e.stage_id)
        self.requests.submitted(e.session_id, e.request_id)
        self._declare_stage(s.model_name, e.stage_id)

    def _output(self, s: SessionTally, st: StoredEvent, e: StageOutput) -> None:
        if self.requests.output(e.session_id, e.request_id):
            self._woke = True  # the id's first output since its submit/forward: it runs now
        self.turn_observations.output(s, e)

    def _abort_result(self, s: SessionTally, st: StoredEvent, e: AbortResult) -> None:
        if e.outcome == "failed":
            self.sink.inc("duplex_ledger:abort_failures_total", (str(e.stage_id),), 1)

    def _declare_stage(self, model: str, stage_id: int) -> None:
        """A stage's children (``abort_failures_total``, the model's ``audio_ttfp_s``) exist
        from the stage's first submit/forward on."""
        if (model, stage_id) in self._stages:
            return
        if not any(stage == stage_id for _, stage in self._stages):
            self.sink.inc("duplex_ledger:abort_failures_total", (str(stage_id),), 0)
        self._stages.add((model, stage_id))
        self.sink.declare("vllm_omni:audio_ttfp_s", (model, str(stage_id)))

    # ------------------------------------------------------------------ close
    def _close_rollup(self, session_id: str, s: SessionTally, st: StoredEvent, e: SessionClosed) -> None:
        """Fix the session's :class:`SessionRollup` and observe its duration and turns."""
        rollup = close_rollup(session_id, s, st.position, e)
        self.rollups.append(rollup)
        if rollup.session_wall_ms is not None:
            self.sink.observe("duplex_ledger:session_duration_s", (), rollup.session_wall_ms / 1000.0)
        self.sink.observe("duplex_ledger:session_turns", (), float(sum(s.reasons.values())))

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
