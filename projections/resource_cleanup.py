"""Cleanup rules of the resources fold: releases, aborts and their acknowledgements, lost and
restored keys (DOMAIN §4.2 R1–R3, R6, §5.7 D10).

A key ends by a release, a loss or the ack of an abort that saw it (D10: an ack releases only
the binding its ``AbortRequested`` saw; a late or duplicate ack releases nothing and is one
warning). An id whose keys are all gone after a successful cleanup is retired; a session
remembers :data:`~projections.resource_state.RETIRED_IDS_KEPT` retired ids (R6: flat memory).
A failed abort or release keeps the id "held" for the audit until a later cleanup succeeds (R3).

Handlers are plain functions ``handler(fold, session, stored, event) -> Verdict``; the
resources fold binds them to itself in its dispatch table.
"""

from __future__ import annotations

from events.records import StoredEvent
from events.types import (
    AbortRequested,
    AbortResult,
    ReleaseRequested,
    ReleaseResult,
    StageRequestLost,
    StageRequestReleased,
    StageRequestRestored,
)
from projections.resource_audit import FindingSink, report
from projections.resource_gate import ACCEPTED, Verdict
from projections.resource_state import RETIRED_IDS_KEPT, Binding, IdLife, Key, SessionResources


def drop(s: SessionResources, key: Key, st: StoredEvent, kind: str = "output_after_release") -> None:
    """End the binding ``key``; a later fact of that stage of the id is one ``kind`` warning."""
    if s.bindings.pop(key, None) is None:
        return
    life = s.lives[key[1]]
    life.closed_stages[key[0]] = kind
    if not s.keys_of(key[1]):
        life.keys_dropped_at = (st.position, st.event.ts)


def retire(s: SessionResources, life: IdLife) -> None:
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
            s.failed_ids.pop(old, None)
            s.reported = {key for key in s.reported if key[1] != old}


def released(fold: FindingSink, s: SessionResources, st: StoredEvent, e: StageRequestReleased) -> Verdict:
    """R1: the key is dropped; a finished id whose bindings are gone is cleaned (CASE-02)."""
    life = s.life(e.request_id, st.position, e.ts)
    drop(s, (e.stage_id, e.request_id), st)
    if not s.keys_of(e.request_id) and 0 in life.finished_stages:
        life.cleanup_ok = True
        retire(s, life)
    return ACCEPTED


def restored(fold: FindingSink, s: SessionResources, st: StoredEvent, e: StageRequestRestored) -> Verdict:
    """R3: a key dropped before a failed abort is bound again, exactly as it was."""
    life = s.life(e.request_id, st.position, e.ts)
    fence = e.fence.key() if e.fence is not None else None
    s.bindings[(e.stage_id, e.request_id)] = Binding(
        e.stage_id, e.request_id, fence, e.submitted, e.stage_id in life.finished_stages, st.position, e.ts
    )
    life.keys_dropped_at = None
    life.closed_stages.pop(e.stage_id, None)
    return ACCEPTED


def lost(fold: FindingSink, s: SessionResources, st: StoredEvent, e: StageRequestLost) -> Verdict:
    """The engine no longer knows the key (a restart): nothing of it runs; no cleanup owed."""
    life = s.life(e.request_id, st.position, e.ts)
    drop(s, (e.stage_id, e.request_id), st)
    if not s.keys_of(e.request_id):
        life.cleanup_ok = True
        life.abort_pending.clear()
        life.abort_failed.clear()
    return ACCEPTED


def abort_requested(fold: FindingSink, s: SessionResources, st: StoredEvent, e: AbortRequested) -> Verdict:
    """R2: an abort of every pool named (all of the session's stages and every stage holding
    the id, when none is named) is pending; each remembers the binding it saw (D10)."""
    for request_id in e.request_ids:
        known = request_id in s.lives
        life = s.life(request_id, st.position, e.ts)
        if not known:
            report(fold, s, "abort_of_unknown_id", None, request_id, st, [], "abort of an id the session never held")
        else:
            keys = [s.bindings[k] for k in s.keys_of(request_id)]
            if keys and all(b.finished for b in keys if b.submitted) and any(b.submitted for b in keys):
                report(
                    fold,
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


def abort_result(fold: FindingSink, s: SessionResources, st: StoredEvent, e: AbortResult) -> Verdict:
    """R3, D10: ``failed`` keeps the id held on that pool; any other outcome means nothing of
    the id runs there any more and releases the binding its abort saw. An ack with no abort
    pending releases nothing (one warning)."""
    for request_id in e.request_ids:
        life = s.lives.get(request_id)
        if life is None or e.stage_id not in life.abort_pending:
            report(
                fold,
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
            s.failed_ids[request_id] = None
            life.cleanup_ok = False  # whatever another pool answered, it may still run here (R3)
            continue
        life.abort_failed.pop(e.stage_id, None)
        life.abort_ok[e.stage_id] = (st.position, e.ts)
        binding = s.bindings.get((e.stage_id, request_id))
        if binding is not None and binding.since_position == snapshot:
            drop(s, (e.stage_id, request_id), st, "output_after_abort")  # only the binding its abort saw (D10)
        if not s.keys_of(request_id) and not life.abort_failed:
            life.cleanup_ok = True
            retire(s, life)
    return ACCEPTED


def release_requested(fold: FindingSink, s: SessionResources, st: StoredEvent, e: ReleaseRequested) -> Verdict:
    for request_id in e.request_ids:
        s.life(request_id, st.position, e.ts)
    return ACCEPTED


def release_result(fold: FindingSink, s: SessionResources, st: StoredEvent, e: ReleaseResult) -> Verdict:
    """``ok``: every key of the id is dropped and a failed release is forgiven (a finished id
    needs nothing more); otherwise the release pool (``-1``) holds a failure (R3)."""
    for request_id in e.request_ids:
        life = s.life(request_id, st.position, e.ts)
        if e.outcome == "ok":
            for key in s.keys_of(request_id):
                drop(s, key, st)
            life.abort_failed.pop(-1, None)  # the release went through this time
            if 0 in life.finished_stages:
                life.abort_failed.clear()  # finished on the engine: releasing it is the whole cleanup
            life.cleanup_ok = not life.abort_failed
            if life.cleanup_ok:
                retire(s, life)
        else:
            life.abort_failed[-1] = (st.position, e.ts)  # -1: the release pool (no stage)
            s.failed_ids[request_id] = None
    return ACCEPTED
