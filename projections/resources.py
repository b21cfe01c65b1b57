"""``request_resources`` and stale-id cleanup as a pure fold (DOMAIN §3, §4).

:class:`ResourcesFold` applies stored events one at a time, in log order. Per session it
keeps the map ``(stage_id, request_id) -> Binding`` (RESERVED / SUBMITTED / FINISHED) and,
per request id, its life (submits, aborts and their per-pool outcomes, releases), from which
the audit's leak and warning findings are decided — at the event that proves them (R3, R4,
R5, duplicate submits) or at an as-of point (:meth:`ResourcesFold.evaluate`: held after
close, failed aborts, downstream bindings left after an abort, orphans, dropped bindings of
ids still running).

The fold has no I/O and no clock: any "now" is the ``ts`` of an event. Counts are derived
from sets, never incremented/decremented, so a duplicate acknowledgement cannot drive them
negative (CASE-01). The session engine makes its live decisions with this same fold.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

from events import ids as rid
from events.records import StoredEvent
from events.types import (
    AbortRequested,
    AbortResult,
    ActiveRequestBound,
    Capabilities,
    CommandRejected,
    EpochAdvanced,
    Fence,
    InputAppended,
    ReleaseRequested,
    ReleaseResult,
    ResponseListened,
    SessionClosed,
    SessionOpened,
    SessionTakenOver,
    StageMetricsReported,
    StageOutput,
    StageRequestFinished,
    StageRequestForwarded,
    StageRequestLost,
    StageRequestReleased,
    StageRequestReserved,
    StageRequestRestored,
    StageRequestSubmitted,
    TurnCompleted,
)
from projections.dispatch import dispatch_table
from projections.findings import Finding, severity_of

_segment_of = lru_cache(maxsize=4096)(rid.encode_session)

RESERVED, SUBMITTED, FINISHED = "reserved", "submitted", "finished"
RETIRED_IDS_KEPT = 256
STAGE_CLOSED_WHY: dict[str, str] = {
    "output_after_release": "its key there was released",
    "output_after_abort": "it was aborted there",
    "output_of_stale_id": "its forward there was refused",
}
"""Why a stage of a still-held id no longer holds it, by the warning kind (IdLife.closed_stages)."""
"""Cleaned-up ids whose life a session remembers (to name a late fact of one ``output_after_*``);
older ones are forgotten, so a session of a million turns folds in flat memory."""


@dataclass(slots=True)
class Binding:
    """One key of request_resources."""

    stage_id: int
    request_id: str
    fence: tuple[int, int, int] | None
    submitted: bool
    finished: bool = False
    since_position: int = 0
    since_ts: float = 0.0

    @property
    def state(self) -> str:
        if not self.submitted:
            return RESERVED
        return FINISHED if self.finished else SUBMITTED


@dataclass(slots=True)
class IdLife:
    """What the log says happened to one request id of a session (orchestrator mirror)."""

    request_id: str
    first_position: int
    first_ts: float
    submitted: bool = False
    last_position: int = 0
    last_ts: float = 0.0
    finished_stages: set[int] = field(default_factory=set)
    cleanup_ok: bool = False  # a successful abort/release/loss acknowledged for the id
    keys_dropped_at: tuple[int, float] | None = None  # when its last key was dropped
    abort_pending: dict[int, tuple[int, float]] = field(default_factory=dict)  # stage -> (pos, ts)
    # stage -> since_position of the binding that existed when the pending abort was logged
    # (None: no binding then). An ack releases only that binding (DOMAIN §5.7 D10).
    abort_snapshot: dict[int, int | None] = field(default_factory=dict)
    abort_ok: dict[int, tuple[int, float]] = field(default_factory=dict)
    abort_failed: dict[int, tuple[int, float]] = field(default_factory=dict)
    # stage -> the warning kind for a fact of that stage: its key of this id ended (released,
    # lost, aborted) or its forward was refused while another stage still holds the id (D1/D9).
    closed_stages: dict[int, str] = field(default_factory=dict)
    evidence: list[int] = field(default_factory=list)

    def touch(self, position: int, ts: float) -> None:
        self.last_position, self.last_ts = position, ts
        self.evidence.append(position)


@dataclass(slots=True)
class SessionResources:
    """Per-session state of the fold."""

    session_id: str
    incarnation: int = 0
    epoch: int = 0  # from EpochAdvanced (DOMAIN §2.1)
    turn_id: int = 0  # from TurnCompleted.new_turn_id (DOMAIN §2.2): the fence's turn
    capabilities: Capabilities = field(default_factory=Capabilities)
    num_stages: int = 2
    closed_at: tuple[int, float] | None = None
    taken_over_at: tuple[int, float] | None = None  # SessionTakenOver of this incarnation (D18)
    bindings: dict[tuple[int, str], Binding] = field(default_factory=dict)
    lives: dict[str, IdLife] = field(default_factory=dict)
    accepted_fence: tuple[int, int] = (-1, -1)  # (epoch, turn_id) high-water mark of this incarnation
    active_request_id: str | None = None
    submits_seen: bool = False  # the log records Stage0 submits (accepted or refused): facts need a held id
    pending_retarget: tuple[int, float, str, str] | None = None  # (pos, ts, stale, new)
    last_position: int = 0
    last_ts: float = 0.0
    reported: set[tuple[str, str, int | None]] = field(default_factory=set)
    retired: dict[str, None] = field(default_factory=dict)  # cleaned-up ids, oldest first (bounded)

    def keys_of(self, request_id: str) -> list[tuple[int, str]]:
        return [k for k in self.bindings if k[1] == request_id]

    def running_ids(self) -> set[str]:
        """Distinct ids with a submitted, unfinished binding (CASE-01 'running')."""
        return {b.request_id for b in self.bindings.values() if b.submitted and not b.finished}

    def holds_anything(self) -> bool:
        if self.bindings:
            return True
        return any(not life.cleanup_ok and (life.abort_pending or life.abort_failed) for life in self.lives.values())

    def forgettable(self) -> bool:
        """Closed, holding nothing, no retarget pending and no id whose keys were dropped
        without a clean-up (that would still be a ``counter_not_decremented`` leak): forgetting
        it changes no finding."""
        return (
            self.closed_at is not None
            and self.pending_retarget is None
            and not self.holds_anything()
            and not any(
                not life.cleanup_ok
                and life.submitted
                and life.keys_dropped_at is not None
                and 0 not in life.finished_stages
                for life in self.lives.values()
            )
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the fold made of one event: ``accepted`` False = refused/ignored (a duplicate
    submit, an update on an ephemeral id, a forward with an old fence). Downstream folds
    (turn tables) skip refused events so they never double count (CASE-02)."""

    accepted: bool = True


ACCEPTED = Verdict(True)
REFUSED = Verdict(False)

WRITES_AFTER_END: frozenset[str] = frozenset(
    {
        "SessionClosed",
        "StageRequestReserved",
        "StageRequestSubmitted",
        "StageRequestForwarded",
        "InputAppended",
        "TurnCommitted",
        "ResponseBegun",
        "ResponseListened",
        "StageOutput",
        "StageMetricsReported",
        "StageRequestFinished",
    }
)
"""Event kinds that, after a session's ``SessionClosed`` or ``SessionTakenOver`` (and before it
is opened again), are writes after the end (DOMAIN §5.7 D18): refused, one warning each. The
close's own cleanup (releases, aborts and their acks, lost, restored) and its terminal
(``CancelRequested``/``TurnFinalized``/``ResponseEnded``, judged by the turns fold) still apply."""


@dataclass(frozen=True, slots=True)
class StaleId:
    """An id that must be cleaned up before a new Stage0 id is submitted (R4): ``finished``
    ids are released (abort optional), unfinished ones aborted on every pool."""

    request_id: str
    keys: tuple[tuple[int, str], ...]
    finished: bool


def stale_before_submit(s: SessionResources, new_id: str) -> list[StaleId]:
    """DOMAIN §4.2 R4 (with R1's "every key of the id"): every other submitted Stage0
    ephemeral id of the session, with all its keys, except bindings still draining under
    ``supports_concurrent_turn_requests``. The resident path never has stale ids (R8).
    Pure; the session engine plans its cleanup with it and the audit judges the log with it."""
    out = []
    for (stage_id, request_id), b in sorted(s.bindings.items()):
        if stage_id != 0 or request_id == new_id or not b.submitted or not rid.is_ephemeral(request_id):
            continue
        keys = tuple(sorted(k for k in s.bindings if k[1] == request_id))
        bindings = [s.bindings[k] for k in keys]
        if s.capabilities.supports_concurrent_turn_requests and any(
            x.stage_id >= 1 and not x.finished for x in bindings
        ):
            continue  # still draining under concurrent turn requests (R4 exception)
        out.append(StaleId(request_id, keys, all(x.finished for x in bindings if x.submitted)))
    return out


def _accept_fence(s: SessionResources, fence: Fence | None) -> None:
    """An accepted submit or forward under ``fence`` makes every older fence stale (DOMAIN §3.1,
    §5.7 D9): a later submit or forward under one is refused and never binds."""
    if fence is not None:
        s.accepted_fence = max(s.accepted_fence, (fence.epoch, fence.turn_id))


class ResourcesFold:
    """Pure fold: ``apply(stored) -> Verdict``; queries: :meth:`request_resources`,
    :meth:`running`, :meth:`evaluate`."""

    closed_sessions: dict[str, tuple[int, float]]  # annotated: a checkpoint's copy is checked entry by entry

    def __init__(self) -> None:
        self.sessions: dict[str, SessionResources] = {}
        self.closed_sessions: dict[str, tuple[int, float]] = {}
        """Sessions forgotten closed (:meth:`forget_closed`) -> their ``SessionClosed`` (position,
        ts): a fact arriving on one however late is still refused (DOMAIN §5.7 D18) until a new
        ``SessionOpened``. One small entry per closed session; the working state is gone."""
        self.point_findings: list[Finding] = []
        self.position = 0
        self.ts = 0.0
        self._handlers = dispatch_table(
            {
                SessionOpened: self._opened,
                SessionClosed: self._closed,
                StageRequestReserved: self._reserved,
                StageRequestSubmitted: self._submitted,
                StageRequestForwarded: self._forwarded,
                StageOutput: self._output,
                StageRequestFinished: self._finished,
                StageRequestReleased: self._released,
                StageRequestRestored: self._restored,
                StageRequestLost: self._lost,
                AbortRequested: self._abort_requested,
                AbortResult: self._abort_result,
                ReleaseRequested: self._release_requested,
                ReleaseResult: self._release_result,
                ActiveRequestBound: self._active_bound,
                CommandRejected: self._rejected,
                EpochAdvanced: self._epoch_advanced,
                TurnCompleted: self._turn_completed,
                InputAppended: self._appended,
                StageMetricsReported: self._metrics,
                ResponseListened: self._listened,
                SessionTakenOver: self._taken_over,
            }
        )

    # ------------------------------------------------------------------ apply
    def apply(self, stored: StoredEvent) -> Verdict:
        """Apply one stored event (log order). Returns its :class:`Verdict`."""
        event = stored.event
        self.position, self.ts = stored.position, event.ts
        session = self.sessions.get(event.session_id)
        if session is None:
            session = self.sessions[event.session_id] = SessionResources(event.session_id)
            closed_at = self.closed_sessions.pop(event.session_id, None)
            if closed_at is not None:  # forgotten closed: back as it was, holding nothing (D18)
                session.closed_at = closed_at
        etype = event.type  # type: ignore[attr-defined]
        if session.pending_retarget is not None and etype != "ActiveRequestBound":
            self._check_retarget(session, stored)
        ended = session.closed_at or session.taken_over_at
        if ended is not None and etype in WRITES_AFTER_END and (etype != "SessionClosed" or session.closed_at):
            # (the new owner's own SessionClosed after its SessionTakenOver is the takeover's close)
            verdict = self._after_end(session, stored, ended)
        else:
            handler = self._handlers.get(type(event))
            verdict = handler(session, stored, event) if handler is not None else ACCEPTED
        session.last_position, session.last_ts = stored.position, event.ts
        return verdict

    def _after_end(self, s: SessionResources, st: StoredEvent, ended: tuple[int, float]) -> Verdict:
        """DOMAIN §5.7 D18: a fact written after the session's ``SessionClosed`` (or after another
        replica took it over) binds, opens and counts nothing; one warning naming its request id
        (else its response id), so an operator can still abort what such a writer started."""
        e = st.event
        request_id = getattr(e, "request_id", None) or getattr(e, "response_id", None)
        stage_id = getattr(e, "stage_id", None)
        end = "taken over" if s.closed_at is None else "closed"
        self._point(
            s,
            "after_close",
            stage_id,
            request_id,
            st,
            [ended[0]],
            f"{e.type} after the session was {end} at position {ended[0]}; ignored",  # type: ignore[attr-defined]
        )
        return REFUSED

    def _life(self, session: SessionResources, request_id: str, stored: StoredEvent) -> IdLife:
        life = session.lives.get(request_id)
        if life is None:
            life = session.lives[request_id] = IdLife(request_id, stored.position, stored.event.ts)
        life.touch(stored.position, stored.event.ts)
        return life

    @staticmethod
    def _retire(s: SessionResources, life: IdLife) -> None:
        """Remember ``life`` as cleaned up; forget the oldest cleaned ids beyond
        :data:`RETIRED_IDS_KEPT` (their lives and report marks), keeping memory flat (R6)."""
        s.retired.pop(life.request_id, None)
        s.retired[life.request_id] = None
        while len(s.retired) > RETIRED_IDS_KEPT:
            old = next(iter(s.retired))
            del s.retired[old]
            gone = s.lives.get(old)
            if gone is not None and gone.cleanup_ok and not gone.abort_pending and not s.keys_of(old):
                del s.lives[old]
                s.reported = {key for key in s.reported if key[1] != old}

    def _point(
        self,
        session: SessionResources,
        kind: str,
        stage_id: int | None,
        request_id: str | None,
        stored: StoredEvent,
        evidence: Iterable[int],
        detail: str,
        first: tuple[int, float] | None = None,
        once: bool = False,
    ) -> None:
        key = (kind, request_id or "", stage_id)
        if once:
            if key in session.reported:
                return
            session.reported.add(key)
        first_pos, first_ts = first if first is not None else (stored.position, stored.event.ts)
        self.point_findings.append(
            Finding(
                session.session_id,
                stage_id,
                request_id,
                kind,
                first_pos,
                first_ts,
                stored.position,
                stored.event.ts,
                tuple(sorted(set(evidence) | {stored.position})),
                detail,
                severity_of(kind),
            )
        )

    # ------------------------------------------------------------------ lifecycle
    def _opened(self, s: SessionResources, st: StoredEvent, e: SessionOpened) -> Verdict:
        if s.closed_at is not None and not s.holds_anything():
            # A reopen (new incarnation) of a closed session that holds nothing starts fresh.
            s = self.sessions[e.session_id] = SessionResources(e.session_id)
        if e.incarnation != s.incarnation:
            s.epoch, s.turn_id, s.accepted_fence = 0, 0, (-1, -1)  # a new incarnation starts its own fences
        s.incarnation = e.incarnation
        s.capabilities = e.capabilities
        s.num_stages = e.num_stages
        s.closed_at = None
        s.taken_over_at = None
        return ACCEPTED

    def _closed(self, s: SessionResources, st: StoredEvent, e: SessionClosed) -> Verdict:
        s.closed_at = (st.position, e.ts)
        return ACCEPTED

    def _epoch_advanced(self, s: SessionResources, st: StoredEvent, e: EpochAdvanced) -> Verdict:
        """DOMAIN §2.1: outputs, appends, submits and forwards of an older epoch are dropped from
        here on; the accepted fence moves to (new epoch, 0) at least."""
        new_epoch = e.new_epoch
        if new_epoch > s.epoch:
            s.epoch = new_epoch
            s.accepted_fence = max(s.accepted_fence, (new_epoch, 0))
        return ACCEPTED

    def _turn_completed(self, s: SessionResources, st: StoredEvent, e: TurnCompleted) -> Verdict:
        """DOMAIN §2.2: the session's turn moves to ``new_turn_id`` (never back); the next
        ephemeral Stage0 id is minted under it."""
        s.turn_id = max(s.turn_id, e.new_turn_id)
        return ACCEPTED

    # ------------------------------------------------------------------ stale ids (D1, D9)
    def _stale_fence(self, s: SessionResources, request_id: str | None, fence: Fence | None) -> str | None:
        """Why a submit/forward/append under ``fence`` naming ``request_id`` is stale (another
        incarnation, or older than the accepted fence or the session's epoch), or None.
        DOMAIN §2.1, §3.1, §5.7 D9. The id's own incarnation and epoch (DOMAIN §1.1) count too
        when it is minted for this session."""
        if fence is not None:
            if fence.incarnation != s.incarnation:
                return f"fence of incarnation {fence.incarnation}; the session is incarnation {s.incarnation}"
            if (fence.epoch, fence.turn_id) < s.accepted_fence:
                return f"fence (epoch {fence.epoch}, turn {fence.turn_id}) older than accepted {s.accepted_fence}"
        parsed = rid.try_parse(request_id) if request_id is not None else None
        if parsed is not None and parsed.session_segment != _segment_of(s.session_id):
            return f"id minted for another session (segment {parsed.session_segment!r}, DOMAIN §1.3)"
        if parsed is not None:
            if parsed.incarnation != s.incarnation:
                return f"id of incarnation {parsed.incarnation}; the session is incarnation {s.incarnation}"
            if parsed.epoch < s.epoch:
                return f"id of epoch {parsed.epoch}; the session is at epoch {s.epoch}"
        return None

    def _gate_fact(
        self, s: SessionResources, st: StoredEvent, stage_id: int | None, request_id: str | None, what: str
    ) -> Verdict:
        """DOMAIN §5.7 D1/D9: a fact (output, metrics snapshot, finish, listen unit) of an id the
        session does not hold — aborted, released, or of an older epoch/incarnation — changes
        nothing and is one warning. So is a fact of an id the session never held, once the log
        records Stage0 submits, whatever the id's grammar. In a log that records no submits,
        facts pass: the turns fold attributes them by the turn's own id."""
        if request_id is None or (stage_id, request_id) in s.bindings:
            return ACCEPTED  # the hot path: a fact of a held key (one dict look-up per output event)
        held_elsewhere = s.keys_of(request_id)
        if not rid.is_duplex(request_id) and (held_elsewhere or not s.submits_seen):
            return ACCEPTED
        life = s.lives.get(request_id)
        if held_elsewhere:  # held on another stage: this stage's key may have ended
            closed = life.closed_stages.get(stage_id) if life is not None and stage_id is not None else None
            if closed is None:
                return ACCEPTED  # a stage the log never bound (no forwards recorded): attributed by id
            self._point(
                s,
                closed,
                stage_id,
                request_id,
                st,
                [life.last_position] if life else [],
                f"{what} of an id the session does not hold on stage {stage_id} ({STAGE_CLOSED_WHY[closed]}); ignored",
            )
            return REFUSED
        stale = self._stale_fence(s, request_id, None)
        if life is None and stale is None and not s.submits_seen:
            return ACCEPTED  # a log that records no submits: the turns fold attributes by id
        if life is not None and life.abort_ok:
            kind, why = "output_after_abort", "the id was aborted"
        elif life is not None and life.submitted:
            kind, why = "output_after_release", "the id was released"
        else:
            kind, why = "output_of_stale_id", stale or "the session never held the id"
        self._point(
            s,
            kind,
            stage_id,
            request_id,
            st,
            [life.last_position] if life else [],
            f"{what} of an id the session does not hold ({why}); ignored",
        )
        return REFUSED

    # ------------------------------------------------------------------ binding
    def _reserved(self, s: SessionResources, st: StoredEvent, e: StageRequestReserved) -> Verdict:
        key = (e.stage_id, e.request_id)
        fence = e.fence.key()
        existing = s.bindings.get(key)
        if existing is not None:
            if existing.fence is not None and existing.fence[:2] != fence[:2]:
                self._point(
                    s,
                    "reserve_conflict",
                    e.stage_id,
                    e.request_id,
                    st,
                    [existing.since_position],
                    f"held with fence {existing.fence}, reserve asked {fence}",
                )
                return REFUSED
            return ACCEPTED
        self._life(s, e.request_id, st)
        s.bindings[key] = Binding(e.stage_id, e.request_id, fence, False, False, st.position, e.ts)
        return ACCEPTED

    def _bind(
        self, s: SessionResources, st: StoredEvent, stage_id: int, request_id: str, fence: Fence | None
    ) -> IdLife:
        key = (stage_id, request_id)
        life = self._life(s, request_id, st)
        life.submitted = True
        life.cleanup_ok = False
        life.keys_dropped_at = None
        life.closed_stages.pop(stage_id, None)
        existing = s.bindings.get(key)
        fence_key = fence.key() if fence is not None else (existing.fence if existing else None)
        s.bindings[key] = Binding(stage_id, request_id, fence_key, True, False, st.position, st.event.ts)
        _accept_fence(s, fence)
        return life

    def _submitted(self, s: SessionResources, st: StoredEvent, e: StageRequestSubmitted) -> Verdict:
        if e.stage_id == 0:
            s.submits_seen = True  # refused or not (the turns fold keeps the same flag, D1)
        key = (e.stage_id, e.request_id)
        existing = s.bindings.get(key)
        ephemeral = rid.is_ephemeral(e.request_id)
        stale = self._stale_fence(s, e.request_id, e.fence)
        if stale is not None:
            self._point(
                s,
                "stale_fence",
                e.stage_id,
                e.request_id,
                st,
                [],
                f"submit ({e.kind}) refused: {stale} (DOMAIN §2.1, §5.7 D9)",
            )
            return REFUSED
        if e.kind == "update":
            if ephemeral:
                self._point(
                    s,
                    "update_on_ephemeral",
                    e.stage_id,
                    e.request_id,
                    st,
                    [],
                    "submit_update on an ephemeral (turn-scoped) id is refused (DOMAIN §3.4, E10)",
                )
                return REFUSED
            if existing is None or not existing.submitted:
                self._point(
                    s,
                    "append_to_unknown_id",
                    e.stage_id,
                    e.request_id,
                    st,
                    [],
                    "submit_update of an id that was never submitted",
                )
                return REFUSED
            self._life(s, e.request_id, st)
            existing.finished = False
            _accept_fence(s, e.fence)  # the update opens the turn's segment: older fences are stale now
            return ACCEPTED
        if existing is not None and existing.submitted:
            state = existing.state
            self._point(
                s,
                "duplicate_submit",
                e.stage_id,
                e.request_id,
                st,
                [existing.since_position],
                f"id still held ({state} since position {existing.since_position}); submit refused",
            )
            return REFUSED
        self._bind(s, st, e.stage_id, e.request_id, e.fence)
        if e.stage_id == 0 and ephemeral:
            self._check_next_submit(s, st, e.request_id)
        return ACCEPTED

    def _check_next_submit(self, s: SessionResources, st: StoredEvent, new_id: str) -> None:
        """R3 and R4 at the submit of a new ephemeral Stage0 id (DOMAIN §4.2)."""
        for life in list(s.lives.values()):
            if life.request_id != new_id and not life.cleanup_ok and life.abort_failed:
                self._point(
                    s,
                    "submit_after_failed_abort",
                    None,
                    life.request_id,
                    st,
                    [p for p, _ in life.abort_failed.values()],
                    f"{new_id} submitted while the abort of {life.request_id} had failed (R3)",
                    once=True,
                )
        for stale in stale_before_submit(s, new_id):
            if stale.request_id in s.lives and s.lives[stale.request_id].abort_failed:
                continue  # reported above
            stage0 = s.bindings[(0, stale.request_id)]
            keys = [s.bindings[k] for k in stale.keys]
            kind = "finished_not_released" if stale.finished else "stale_not_aborted"
            self._point(
                s,
                kind,
                0,
                stale.request_id,
                st,
                [b.since_position for b in keys],
                f"still held ({', '.join(f'({b.stage_id}, {b.state})' for b in keys)}) when {new_id} was submitted",
                first=(stage0.since_position, stage0.since_ts),
                once=True,
            )
        active = s.active_request_id
        if active is not None and active != new_id and (0, active) not in s.bindings:
            s.pending_retarget = (st.position, st.event.ts, active, new_id)

    def _check_retarget(self, s: SessionResources, st: StoredEvent) -> None:
        pos, ts, stale, new = s.pending_retarget  # type: ignore[misc]
        s.pending_retarget = None
        if s.active_request_id == stale:
            self._point(
                s,
                "active_not_retargeted",
                0,
                stale,
                st,
                [pos],
                f"active request still {stale} after {new} was submitted (R5)",
                first=(pos, ts),
                once=True,
            )

    def _forwarded(self, s: SessionResources, st: StoredEvent, e: StageRequestForwarded) -> Verdict:
        stale = self._stale_fence(s, e.request_id, e.fence)
        if stale is not None:
            self._point(s, "forward_ignored", e.stage_id, e.request_id, st, [], f"forward ignored: {stale}")
            life = s.lives.get(e.request_id)
            if life is not None and (e.stage_id, e.request_id) not in s.bindings:
                life.closed_stages[e.stage_id] = "output_of_stale_id"  # its facts there join nothing
            return REFUSED
        existing = s.bindings.get((e.stage_id, e.request_id))
        if existing is not None and existing.submitted and not existing.finished:
            return ACCEPTED  # repeated forward of a running downstream request: same binding
        self._bind(s, st, e.stage_id, e.request_id, e.fence)
        return ACCEPTED

    def _output(self, s: SessionResources, st: StoredEvent, e: StageOutput) -> Verdict:
        verdict = self._gate_fact(s, st, e.stage_id, e.request_id, "output")
        if not verdict.accepted:
            return verdict
        binding = s.bindings.get((e.stage_id, e.request_id))
        if binding is None:
            return ACCEPTED
        life = s.lives[e.request_id]
        life.last_position, life.last_ts = st.position, e.ts
        if e.finished:
            binding.finished = True
            life.finished_stages.add(e.stage_id)
        return ACCEPTED

    def _finished(self, s: SessionResources, st: StoredEvent, e: StageRequestFinished) -> Verdict:
        verdict = self._gate_fact(s, st, e.stage_id, e.request_id, "finish")
        if not verdict.accepted:
            return verdict
        life = self._life(s, e.request_id, st)
        life.finished_stages.add(e.stage_id)
        binding = s.bindings.get((e.stage_id, e.request_id))
        if binding is not None:
            binding.finished = True
        return ACCEPTED

    def _metrics(self, s: SessionResources, st: StoredEvent, e: StageMetricsReported) -> Verdict:
        return self._gate_fact(s, st, e.stage_id, e.request_id, "metrics snapshot")

    def _listened(self, s: SessionResources, st: StoredEvent, e: ResponseListened) -> Verdict:
        return self._gate_fact(s, st, 0, e.request_id, "listen unit")

    def _appended(self, s: SessionResources, st: StoredEvent, e: InputAppended) -> Verdict:
        """DOMAIN §5.7 D9: an append under a stale fence, or naming an id the session does not
        hold (released, aborted, never reserved), changes nothing (no arrival stamp) and is
        one warning."""
        stale = self._stale_fence(s, e.request_id, e.fence)
        if stale is not None:
            self._point(s, "stale_fence", 0, e.request_id, st, [], f"append refused: {stale}")
            return REFUSED
        if e.request_id is None or not rid.is_duplex(e.request_id) or (0, e.request_id) in s.bindings:
            return ACCEPTED
        life = s.lives.get(e.request_id)
        kind = "append_after_release" if life is not None else "append_to_unknown_id"
        self._point(
            s,
            kind,
            0,
            e.request_id,
            st,
            [life.last_position] if life else [],
            "append names a Stage0 id the session does not hold; ignored",
        )
        return REFUSED

    # ------------------------------------------------------------------ removal
    def _drop(
        self, s: SessionResources, key: tuple[int, str], st: StoredEvent, kind: str = "output_after_release"
    ) -> None:
        """End the binding ``key``; a later fact of that stage of the id is one ``kind`` warning."""
        if s.bindings.pop(key, None) is None:
            return
        life = s.lives[key[1]]
        life.closed_stages[key[0]] = kind
        if not s.keys_of(key[1]):
            life.keys_dropped_at = (st.position, st.event.ts)

    def _released(self, s: SessionResources, st: StoredEvent, e: StageRequestReleased) -> Verdict:
        life = self._life(s, e.request_id, st)
        self._drop(s, (e.stage_id, e.request_id), st)
        if not s.keys_of(e.request_id) and self._all_finished(s, life):
            life.cleanup_ok = True  # a finished id whose bindings are gone is cleaned (CASE-02)
            self._retire(s, life)
        return ACCEPTED

    @staticmethod
    def _all_finished(s: SessionResources, life: IdLife) -> bool:
        return 0 in life.finished_stages

    def _taken_over(self, s: SessionResources, st: StoredEvent, e: SessionTakenOver) -> Verdict:
        """Issue 14: the owner died and another replica closed the session; reported (a
        warning naming both replicas), its ids are settled by the events that follow."""
        previous = (
            "no replica" if e.previous_replica_id is None else f"{e.previous_replica_id}#{e.previous_incarnation}"
        )
        self._point(
            s,
            "session_taken_over",
            None,
            None,
            st,
            [],
            f"owner {previous} dead ({e.detected}); taken over by {e.replica_id}#{e.replica_incarnation}",
        )
        if s.closed_at is None:
            s.taken_over_at = (st.position, e.ts)  # the old owner's later writes count nowhere (D18)
        return ACCEPTED

    def _restored(self, s: SessionResources, st: StoredEvent, e: StageRequestRestored) -> Verdict:
        life = self._life(s, e.request_id, st)
        fence = e.fence.key() if e.fence is not None else None
        s.bindings[(e.stage_id, e.request_id)] = Binding(
            e.stage_id, e.request_id, fence, e.submitted, e.stage_id in life.finished_stages, st.position, e.ts
        )
        life.keys_dropped_at = None
        life.closed_stages.pop(e.stage_id, None)
        return ACCEPTED

    def _lost(self, s: SessionResources, st: StoredEvent, e: StageRequestLost) -> Verdict:
        life = self._life(s, e.request_id, st)
        self._drop(s, (e.stage_id, e.request_id), st)
        if not s.keys_of(e.request_id):
            life.cleanup_ok = True
            life.abort_pending.clear()
            life.abort_failed.clear()
        return ACCEPTED

    def _abort_requested(self, s: SessionResources, st: StoredEvent, e: AbortRequested) -> Verdict:
        for request_id in e.request_ids:
            known = request_id in s.lives
            life = self._life(s, request_id, st)
            if not known:
                self._point(s, "abort_of_unknown_id", None, request_id, st, [], "abort of an id the session never held")
            else:
                keys = [s.bindings[k] for k in s.keys_of(request_id)]
                if keys and all(b.finished for b in keys if b.submitted) and any(b.submitted for b in keys):
                    self._point(
                        s,
                        "abort_after_finish",
                        None,
                        request_id,
                        st,
                        [b.since_position for b in keys],
                        "every binding had finished before the abort",
                    )
            stages = set(e.stage_ids) if e.stage_ids is not None else set(range(s.num_stages))
            stages |= {k[0] for k in s.keys_of(request_id)} if e.stage_ids is None else set()
            for stage_id in stages:
                life.abort_pending[stage_id] = (st.position, e.ts)
                binding = s.bindings.get((stage_id, request_id))
                life.abort_snapshot[stage_id] = binding.since_position if binding is not None else None
        return ACCEPTED

    def _abort_result(self, s: SessionResources, st: StoredEvent, e: AbortResult) -> Verdict:
        for request_id in e.request_ids:
            life = s.lives.get(request_id)
            if life is None or e.stage_id not in life.abort_pending:
                # D10: a late or duplicate ack answers no pending abort and releases nothing.
                self._point(
                    s,
                    "duplicate_ack" if life is not None else "abort_of_unknown_id",
                    e.stage_id,
                    request_id,
                    st,
                    [life.last_position] if life else [],
                    f"abort result ({e.outcome}) with no abort pending on stage {e.stage_id}; ignored",
                )
                continue
            life.touch(st.position, e.ts)
            life.abort_pending.pop(e.stage_id)
            snapshot = life.abort_snapshot.pop(e.stage_id, None)
            if e.outcome == "failed":
                life.abort_failed[e.stage_id] = (st.position, e.ts)
                life.cleanup_ok = False  # whatever another pool answered, it may still run here (R3)
                continue
            # ok / not_running / unknown_id: nothing of the id runs on that pool any more.
            life.abort_failed.pop(e.stage_id, None)
            life.abort_ok[e.stage_id] = (st.position, e.ts)
            binding = s.bindings.get((e.stage_id, request_id))
            if binding is not None and binding.since_position == snapshot:
                self._drop(
                    s, (e.stage_id, request_id), st, "output_after_abort"
                )  # only the binding its abort saw (D10)
            if not s.keys_of(request_id) and not life.abort_failed:
                life.cleanup_ok = True
                self._retire(s, life)
        return ACCEPTED

    def _release_requested(self, s: SessionResources, st: StoredEvent, e: ReleaseRequested) -> Verdict:
        for request_id in e.request_ids:
            self._life(s, request_id, st)
        return ACCEPTED

    def _release_result(self, s: SessionResources, st: StoredEvent, e: ReleaseResult) -> Verdict:
        for request_id in e.request_ids:
            life = self._life(s, request_id, st)
            if e.outcome == "ok":
                for key in s.keys_of(request_id):
                    self._drop(s, key, st)
                life.abort_failed.pop(-1, None)  # the release went through this time
                if 0 in life.finished_stages:
                    life.abort_failed.clear()  # finished on the engine: releasing it is the whole cleanup
                life.cleanup_ok = not life.abort_failed
                if life.cleanup_ok:
                    self._retire(s, life)
            else:
                life.abort_failed[-1] = (st.position, e.ts)  # -1: the release pool (no stage)
        return ACCEPTED

    def _active_bound(self, s: SessionResources, st: StoredEvent, e: ActiveRequestBound) -> Verdict:
        s.active_request_id = e.request_id
        if s.pending_retarget is not None and s.active_request_id == s.pending_retarget[3]:
            s.pending_retarget = None
        return ACCEPTED

    def _rejected(self, s: SessionResources, st: StoredEvent, e: CommandRejected) -> Verdict:
        self._point(s, "command_rejected", None, e.request_id, st, [], f"{e.command}: {e.error_code}: {e.message}")
        return ACCEPTED

    # ------------------------------------------------------------------ queries
    def request_resources(self, session_id: str | None = None) -> dict[str, dict[tuple[int, str], str]]:
        """``{session: {(stage_id, request_id): state}}`` for sessions holding anything (or the
        one asked, possibly empty)."""
        if session_id is not None:
            s = self.sessions.get(session_id)
            return {session_id: {k: b.state for k, b in sorted(s.bindings.items())} if s else {}}
        return {
            sid: {k: b.state for k, b in sorted(s.bindings.items())}
            for sid, s in sorted(self.sessions.items())
            if s.bindings
        }

    def held(self, session_id: str | None = None) -> int:
        """Orchestrator counter (DOMAIN §3.3): distinct ids with any binding, per session or
        global. Equals :meth:`running` unless finished ids are still held (R4/R6)."""
        sessions = (
            [self.sessions[session_id]]
            if session_id in self.sessions
            else ([] if session_id is not None else list(self.sessions.values()))
        )
        return sum(len({k[1] for k in s.bindings}) for s in sessions)

    def held_at_end(self) -> list[tuple[str, int, int, float]]:
        """Open sessions that still hold engine ids at the current point (the end of the log
        folded): ``(session_id, ids held, last position, last ts in s)``, by session id. A
        crashed deployment's sessions look like this: nothing after their last event, so with
        "now" the last event's ts (DOMAIN §0) they are not idle yet (§4.2 orphans need
        ``max_idle_s`` of silence)."""
        return [
            (s.session_id, len({k[1] for k in s.bindings}), s.last_position, s.last_ts)
            for _, s in sorted(self.sessions.items())
            if s.closed_at is None and s.bindings
        ]

    def running(self, session_id: str | None = None) -> int:
        """Running ids (distinct, submitted, not finished/aborted/released), per session or global."""
        if session_id is not None:
            s = self.sessions.get(session_id)
            return len(s.running_ids()) if s else 0
        return sum(len(s.running_ids()) for s in self.sessions.values())

    def evaluate(self, max_idle_s: float = 30.0, as_of_ts: float | None = None) -> list[Finding]:
        """All findings at the current point: the point findings so far plus the state
        findings at ``as_of_ts`` (default: ts of the last applied event), sorted."""
        now = self.ts if as_of_ts is None else as_of_ts
        out = list(self.point_findings)
        for s in self.sessions.values():
            out.extend(self._state_findings(s, now, max_idle_s))
            if s.pending_retarget is not None and s.active_request_id == s.pending_retarget[2]:
                pos, ts, stale, new = s.pending_retarget
                out.append(
                    Finding(
                        s.session_id,
                        0,
                        stale,
                        "active_not_retargeted",
                        pos,
                        ts,
                        s.last_position,
                        s.last_ts,
                        (pos,),
                        f"active request still {stale} after {new} was submitted (R5)",
                        "leak",
                    )
                )
        return sorted(out, key=Finding.sort_key)

    def _state_findings(self, s: SessionResources, now: float, max_idle_s: float) -> list[Finding]:
        out: list[Finding] = []
        closed = s.closed_at is not None
        idle = now - s.last_ts > max_idle_s
        for (stage_id, request_id), b in sorted(s.bindings.items()):
            life = s.lives[request_id]
            kind = None
            if stage_id in life.abort_failed or -1 in life.abort_failed:
                kind = "abort_failed" if closed else None
            elif life.abort_ok and stage_id not in life.abort_ok:
                latest_ok = max(ts for _, ts in life.abort_ok.values())
                if closed or now - latest_ok > max_idle_s:
                    kind = "downstream_left_after_abort"
            elif stage_id in life.abort_pending and now - life.abort_pending[stage_id][1] <= max_idle_s:
                kind = None  # abort in flight
            elif closed:
                kind = "held_after_close"
            elif b.submitted and not b.finished and idle:
                kind = "orphan"
            if kind is not None:
                first_pos, first_ts = (
                    s.closed_at
                    if s.closed_at is not None and kind == "held_after_close"
                    else (b.since_position, b.since_ts)
                )
                out.append(
                    Finding(
                        s.session_id,
                        stage_id,
                        request_id,
                        kind,
                        first_pos,
                        first_ts,
                        s.last_position,
                        s.last_ts,
                        tuple(sorted(set(life.evidence))),
                        self._detail(b, life),
                        "leak",
                    )
                )
        for life in s.lives.values():
            if life.cleanup_ok or not life.submitted or s.keys_of(life.request_id) or life.keys_dropped_at is None:
                continue
            if 0 in life.finished_stages and not life.abort_failed and not life.abort_pending:
                continue
            dropped_pos, dropped_ts = life.keys_dropped_at
            if not (closed or now - dropped_ts > max_idle_s):
                continue
            kind = "abort_failed_not_restored" if life.abort_failed else "counter_not_decremented"
            out.append(
                Finding(
                    s.session_id,
                    None,
                    life.request_id,
                    kind,
                    dropped_pos,
                    dropped_ts,
                    life.last_position,
                    life.last_ts,
                    tuple(sorted(set(life.evidence))),
                    "bindings dropped but no successful abort/release of the running id",
                    "leak",
                )
            )
        return out

    @staticmethod
    def _detail(b: Binding, life: IdLife) -> str:
        parts = [f"state={b.state}"]
        if life.abort_failed:
            parts.append("abort failed on " + ",".join(str(k) for k in sorted(life.abort_failed)))
        if life.abort_ok:
            parts.append("aborted ok on " + ",".join(str(k) for k in sorted(life.abort_ok)))
        return "; ".join(parts)

    def forget_closed(self) -> list[str]:
        """Drop closed sessions that hold nothing (bounded memory); returns their ids. Each leaves
        only its close point in :attr:`closed_sessions` (DOMAIN §5.7 D18 outlives the state)."""
        gone = [sid for sid, s in self.sessions.items() if s.forgettable()]
        for sid in gone:
            closed_at = self.sessions.pop(sid).closed_at
            assert closed_at is not None  # forgettable() says so
            self.closed_sessions[sid] = closed_at
        return gone
