"""The resources gate: which events count (DOMAIN §5.7 D1, D9, D18).

A :class:`Verdict` is what the resources fold made of one event; the turns fold skips refused
events, so a refused fact is never counted twice (CASE-02). This module holds the gate's
rules that are not part of binding or cleanup:

* writes after the end (D18): after a session's ``SessionClosed`` or ``SessionTakenOver``,
  the kinds in :data:`WRITES_AFTER_END` are refused, one ``after_close`` warning each;
* stale fences (D9, §2.1, §3.1): :func:`stale_fence` says why a fence or id is too old;
* facts of ids the session does not hold (D1/D9): outputs, metrics snapshots, finishes,
  listen units and appends — one warning each, no state change.

Handlers are plain functions ``handler(fold, session, stored, event) -> Verdict``; the
resources fold binds them to itself in its dispatch table.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from events import ids as rid
from events.records import StoredEvent
from events.types import (
    Fence,
    InputAppended,
    ResponseListened,
    StageMetricsReported,
    StageOutput,
    StageRequestFinished,
)
from projections.resource_audit import FindingSink, report
from projections.resource_state import STAGE_CLOSED_WHY, SessionResources

_segment_of = lru_cache(maxsize=4096)(rid.encode_session)
_parsed = lru_cache(maxsize=4096)(rid.try_parse)
"""An id's parts (DOMAIN §1.1), parsed once while the id is in use: a resident id is named by
every append and update of its epoch, an ephemeral one by its turn's submit and forwards."""


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


def after_end(fold: FindingSink, s: SessionResources, st: StoredEvent, ended: tuple[int, float]) -> Verdict:
    """DOMAIN §5.7 D18: a fact written after the session's ``SessionClosed`` (or after another
    replica took it over) binds, opens and counts nothing; one warning naming its request id
    (else its response id), so an operator can still abort what such a writer started."""
    e = st.event
    request_id = getattr(e, "request_id", None) or getattr(e, "response_id", None)
    stage_id = getattr(e, "stage_id", None)
    end = "taken over" if s.closed_at is None else "closed"
    report(
        fold,
        s,
        "after_close",
        stage_id,
        request_id,
        st,
        [ended[0]],
        f"{e.type} after the session was {end} at position {ended[0]}; ignored",  # type: ignore[attr-defined]
    )
    return REFUSED


def stale_fence(s: SessionResources, request_id: str | None, fence: Fence | None) -> str | None:
    """Why a submit/forward/append under ``fence`` naming ``request_id`` is stale (another
    incarnation, or older than the accepted fence or the session's epoch), or None.
    DOMAIN §2.1, §3.1, §5.7 D9. The id's own incarnation and epoch (DOMAIN §1.1) count too
    when it is minted for this session."""
    if fence is not None:
        if fence.incarnation != s.incarnation:
            return f"fence of incarnation {fence.incarnation}; the session is incarnation {s.incarnation}"
        if (fence.epoch, fence.turn_id) < s.accepted_fence:
            return f"fence (epoch {fence.epoch}, turn {fence.turn_id}) older than accepted {s.accepted_fence}"
    parsed = _parsed(request_id) if request_id is not None else None
    if parsed is not None and parsed.session_segment != _segment_of(s.session_id):
        return f"id minted for another session (segment {parsed.session_segment!r}, DOMAIN §1.3)"
    if parsed is not None:
        if parsed.incarnation != s.incarnation:
            return f"id of incarnation {parsed.incarnation}; the session is incarnation {s.incarnation}"
        if parsed.epoch < s.epoch:
            return f"id of epoch {parsed.epoch}; the session is at epoch {s.epoch}"
    return None


def gate_fact(
    fold: FindingSink, s: SessionResources, st: StoredEvent, stage_id: int | None, request_id: str | None, what: str
) -> Verdict:
    """DOMAIN §5.7 D1/D9: a fact (output, metrics snapshot, finish, listen unit) of an id the
    session does not hold — aborted, released, or of an older epoch/incarnation — changes
    nothing and is one warning. So is a fact of an id the session never held, once the log
    records Stage0 submits, whatever the id's grammar. In a log that records no submits,
    facts pass: the turns fold attributes them by the turn's own id."""
    if request_id is None or (stage_id, request_id) in s.bindings:
        return ACCEPTED
    held_elsewhere = s.keys_of(request_id)
    if not rid.is_duplex(request_id) and (held_elsewhere or not s.submits_seen):
        return ACCEPTED
    life = s.lives.get(request_id)
    if held_elsewhere:  # held on another stage: this stage's key may have ended
        closed = life.closed_stages.get(stage_id) if life is not None and stage_id is not None else None
        if closed is None:
            return ACCEPTED  # a stage the log never bound (no forwards recorded): attributed by id
        report(
            fold,
            s,
            closed,
            stage_id,
            request_id,
            st,
            [life.last_position] if life else [],
            f"{what} of an id the session does not hold on stage {stage_id} ({STAGE_CLOSED_WHY[closed]}); ignored",
        )
        return REFUSED
    stale = stale_fence(s, request_id, None)
    if life is None and stale is None and not s.submits_seen:
        return ACCEPTED  # a log that records no submits: the turns fold attributes by id
    if life is not None and life.abort_ok:
        kind, why = "output_after_abort", "the id was aborted"
    elif life is not None and life.submitted:
        kind, why = "output_after_release", "the id was released"
    else:
        kind, why = "output_of_stale_id", stale or "the session never held the id"
    report(
        fold,
        s,
        kind,
        stage_id,
        request_id,
        st,
        [life.last_position] if life else [],
        f"{what} of an id the session does not hold ({why}); ignored",
    )
    return REFUSED


# ------------------------------------------------------------------ handlers (facts)
def output(fold: FindingSink, s: SessionResources, st: StoredEvent, e: StageOutput) -> Verdict:
    """The hot path (most events of a log): one look-up of the held key, the id's last event
    moves, a finished output finishes the binding."""
    request_id = e.request_id
    binding = s.bindings.get((e.stage_id, request_id))
    if binding is None:
        return gate_fact(fold, s, st, e.stage_id, request_id, "output")
    life = s.lives[request_id]
    life.last_position, life.last_ts = st.position, e.ts
    if e.finished:
        binding.finished = True
        life.finished_stages.add(e.stage_id)
    return ACCEPTED


def finished(fold: FindingSink, s: SessionResources, st: StoredEvent, e: StageRequestFinished) -> Verdict:
    """A late finish of a held id is a resource fact (the binding finishes), no warning."""
    verdict = gate_fact(fold, s, st, e.stage_id, e.request_id, "finish")
    if not verdict.accepted:
        return verdict
    life = s.life(e.request_id, st.position, e.ts)
    life.finished_stages.add(e.stage_id)
    binding = s.bindings.get((e.stage_id, e.request_id))
    if binding is not None:
        binding.finished = True
    return ACCEPTED


def metrics(fold: FindingSink, s: SessionResources, st: StoredEvent, e: StageMetricsReported) -> Verdict:
    if (e.stage_id, e.request_id) in s.bindings:
        return ACCEPTED  # the hot path: a snapshot of a held key
    return gate_fact(fold, s, st, e.stage_id, e.request_id, "metrics snapshot")


def listened(fold: FindingSink, s: SessionResources, st: StoredEvent, e: ResponseListened) -> Verdict:
    return gate_fact(fold, s, st, 0, e.request_id, "listen unit")


def appended(fold: FindingSink, s: SessionResources, st: StoredEvent, e: InputAppended) -> Verdict:
    """DOMAIN §5.7 D9: an append under a stale fence, or naming an id the session does not
    hold (released, aborted, never reserved), changes nothing (no arrival stamp) and is
    one warning."""
    request_id = e.request_id
    if e.fence is not None or request_id is not None:
        stale = stale_fence(s, request_id, e.fence)
        if stale is not None:
            report(fold, s, "stale_fence", 0, request_id, st, [], f"append refused: {stale}")
            return REFUSED
    if request_id is None or not rid.is_duplex(request_id) or (0, request_id) in s.bindings:
        return ACCEPTED
    life = s.lives.get(request_id)
    kind = "append_after_release" if life is not None else "append_to_unknown_id"
    report(
        fold,
        s,
        kind,
        0,
        request_id,
        st,
        [life.last_position] if life else [],
        "append names a Stage0 id the session does not hold; ignored",
    )
    return REFUSED
