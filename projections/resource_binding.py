"""Binding rules of the resources fold: reserve, submit, update, forward, retarget
(DOMAIN §3, §4.2 R1/R4/R5/R8, §5.7 D9).

A submit or forward under a stale fence, a second submit of a held id, an update of an
ephemeral or unsubmitted id are refused (one warning each, no state change). An accepted
submit or forward binds its key and makes every older fence stale. At the submit of a new
ephemeral Stage0 id the audit judges what the session still holds (R3, R4) and whether the
active request moved to the new id (R5, judged at the next event).

Handlers are plain functions ``handler(fold, session, stored, event) -> Verdict``; the
resources fold binds them to itself in its dispatch table.
"""

from __future__ import annotations

from events import ids as rid
from events.records import StoredEvent
from events.types import (
    ActiveRequestBound,
    Fence,
    StageRequestForwarded,
    StageRequestReserved,
    StageRequestSubmitted,
)
from projections.resource_audit import FindingSink, report
from projections.resource_gate import ACCEPTED, REFUSED, Verdict, stale_fence
from projections.resource_state import Binding, IdLife, SessionResources, stale_before_submit


def accept_fence(s: SessionResources, fence: Fence | None) -> None:
    """An accepted submit or forward under ``fence`` makes every older fence stale (DOMAIN §3.1,
    §5.7 D9): a later submit or forward under one is refused and never binds."""
    if fence is not None:
        s.accepted_fence = max(s.accepted_fence, (fence.epoch, fence.turn_id))


def bind(s: SessionResources, st: StoredEvent, stage_id: int, request_id: str, fence: Fence | None) -> IdLife:
    """Bind ``(stage_id, request_id)`` as submitted at ``st`` (a binding without a fence keeps
    the one it had); the id is running again until a finish or a cleanup."""
    key = (stage_id, request_id)
    life = s.life(request_id, st.position, st.event.ts)
    life.submitted = True
    life.cleanup_ok = False
    life.keys_dropped_at = None
    life.closed_stages.pop(stage_id, None)
    existing = s.bindings.get(key)
    fence_key = fence.key() if fence is not None else (existing.fence if existing else None)
    s.bindings[key] = Binding(stage_id, request_id, fence_key, True, False, st.position, st.event.ts)
    accept_fence(s, fence)
    return life


def reserved(fold: FindingSink, s: SessionResources, st: StoredEvent, e: StageRequestReserved) -> Verdict:
    """A reserve binds a new key RESERVED; one of a held key with another fence is refused."""
    key = (e.stage_id, e.request_id)
    fence = e.fence.key()
    existing = s.bindings.get(key)
    if existing is not None:
        if existing.fence is not None and existing.fence[:2] != fence[:2]:
            report(
                fold,
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
    s.life(e.request_id, st.position, e.ts)
    s.bindings[key] = Binding(e.stage_id, e.request_id, fence, False, False, st.position, e.ts)
    return ACCEPTED


def submitted(fold: FindingSink, s: SessionResources, st: StoredEvent, e: StageRequestSubmitted) -> Verdict:
    """DOMAIN §3.4, §5.7 D9, CASE-02: a stale fence, an update of an ephemeral or unsubmitted
    id and a second submit of a held id are refused; an initial submit binds."""
    if e.stage_id == 0:
        s.submits_seen = True  # refused or not (the turns fold keeps the same flag, D1)
    key = (e.stage_id, e.request_id)
    existing = s.bindings.get(key)
    ephemeral = rid.is_ephemeral(e.request_id)
    stale = stale_fence(s, e.request_id, e.fence)
    if stale is not None:
        report(
            fold,
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
            report(
                fold,
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
            report(
                fold,
                s,
                "append_to_unknown_id",
                e.stage_id,
                e.request_id,
                st,
                [],
                "submit_update of an id that was never submitted",
            )
            return REFUSED
        s.life(e.request_id, st.position, e.ts)
        existing.finished = False
        accept_fence(s, e.fence)  # the update opens the turn's segment: older fences are stale now
        return ACCEPTED
    if existing is not None and existing.submitted:
        report(
            fold,
            s,
            "duplicate_submit",
            e.stage_id,
            e.request_id,
            st,
            [existing.since_position],
            f"id still held ({existing.state} since position {existing.since_position}); submit refused",
        )
        return REFUSED
    bind(s, st, e.stage_id, e.request_id, e.fence)
    if e.stage_id == 0 and ephemeral:
        check_next_submit(fold, s, st, e.request_id)
    return ACCEPTED


def check_next_submit(fold: FindingSink, s: SessionResources, st: StoredEvent, new_id: str) -> None:
    """R3 and R4 at the submit of a new ephemeral Stage0 id (DOMAIN §4.2); R5 is judged at the
    next event (:func:`check_retarget`)."""
    for request_id in list(s.failed_ids):
        life = s.lives[request_id]
        if request_id != new_id and not life.cleanup_ok and life.abort_failed:
            report(
                fold,
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
        report(
            fold,
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


def check_retarget(fold: FindingSink, s: SessionResources, st: StoredEvent) -> None:
    """R5: the event after a new Stage0 submit (other than its ``ActiveRequestBound``) finds
    the active request still naming the stale id: one ``active_not_retargeted`` leak."""
    pos, ts, stale, new = s.pending_retarget  # type: ignore[misc]
    s.pending_retarget = None
    if s.active_request_id == stale:
        report(
            fold,
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


def forwarded(fold: FindingSink, s: SessionResources, st: StoredEvent, e: StageRequestForwarded) -> Verdict:
    """DOMAIN §3.1: a forward under a stale fence is ignored (its facts on that stage join
    nothing); a repeated forward of a running downstream request keeps its binding."""
    stale = stale_fence(s, e.request_id, e.fence)
    if stale is not None:
        report(fold, s, "forward_ignored", e.stage_id, e.request_id, st, [], f"forward ignored: {stale}")
        life = s.lives.get(e.request_id)
        if life is not None and (e.stage_id, e.request_id) not in s.bindings:
            life.closed_stages[e.stage_id] = "output_of_stale_id"  # its facts there join nothing
        return REFUSED
    existing = s.bindings.get((e.stage_id, e.request_id))
    if existing is not None and existing.submitted and not existing.finished:
        return ACCEPTED  # repeated forward of a running downstream request: same binding
    bind(s, st, e.stage_id, e.request_id, e.fence)
    return ACCEPTED


def active_bound(fold: FindingSink, s: SessionResources, st: StoredEvent, e: ActiveRequestBound) -> Verdict:
    """R5: the active request moves; a pending retarget to this id is done."""
    s.active_request_id = e.request_id
    if s.pending_retarget is not None and s.active_request_id == s.pending_retarget[3]:
        s.pending_retarget = None
    return ACCEPTED
