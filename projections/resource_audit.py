"""The audit's findings about request resources (DOMAIN §4.2 R1–R8, §5.7 D1/D9/D10/D18).

Two kinds of finding come from the resources fold:

* point findings — decided at the event that proves them (a duplicate submit, a stale fence,
  R3/R4/R5 at a new Stage0 submit, a fact of an id the session does not hold…): the fold's
  handlers call :func:`report`, which appends them to the fold's ``point_findings`` in log order;
* state findings — decided at an as-of point from the per-session state
  (:func:`evaluate`: held after close, failed aborts, downstream bindings left after an abort,
  orphans, dropped bindings of ids still running, a retarget still pending).

Pure functions of the state (:mod:`projections.resource_state`); "now" is a ts of the log.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from events.records import StoredEvent
from projections.findings import Finding, severity_of
from projections.resource_state import Binding, IdLife, SessionResources


class FindingSink(Protocol):
    """Where point findings go: the resources fold's list, in log order."""

    point_findings: list[Finding]


def report(
    sink: FindingSink,
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
    """Append one point finding of ``kind`` (its severity from :mod:`projections.findings`;
    KeyError for an unknown kind) proven by ``stored``: first = ``first`` or the event itself,
    last = the event, evidence = ``evidence`` plus the event's position. ``once``: at most one
    finding per (kind, request id, stage) and session."""
    key = (kind, request_id or "", stage_id)
    if once:
        if key in session.reported:
            return
        session.reported.add(key)
    ts = stored.event.ts
    first_pos, first_ts = first if first is not None else (stored.position, ts)
    sink.point_findings.append(
        Finding(
            session.session_id,
            stage_id,
            request_id,
            kind,
            first_pos,
            first_ts,
            stored.position,
            ts,
            tuple(sorted(set(evidence) | {stored.position})),
            detail,
            severity_of(kind),
        )
    )


def evaluate(
    sessions: Iterable[SessionResources], point_findings: Iterable[Finding], now: float, max_idle_s: float
) -> list[Finding]:
    """All findings at ``now`` (a ts of the log): the point findings so far plus every
    session's state findings, sorted by :meth:`Finding.sort_key`."""
    out = list(point_findings)
    for s in sessions:
        out.extend(state_findings(s, now, max_idle_s))
        if s.pending_retarget is not None and s.active_request_id == s.pending_retarget[2]:
            out.append(_not_retargeted(s))
    return sorted(out, key=Finding.sort_key)


def _not_retargeted(s: SessionResources) -> Finding:
    """R5: the active request still names the stale id after a new Stage0 id was submitted."""
    pos, ts, stale, new = s.pending_retarget  # type: ignore[misc]
    return Finding(
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


def state_findings(s: SessionResources, now: float, max_idle_s: float) -> list[Finding]:
    """The leaks one session's state shows at ``now`` (DOMAIN §4.2 R1–R3, R7, orphans)."""
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
                    _detail(b, life),
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


def _detail(b: Binding, life: IdLife) -> str:
    parts = [f"state={b.state}"]
    if life.abort_failed:
        parts.append("abort failed on " + ",".join(str(k) for k in sorted(life.abort_failed)))
    if life.abort_ok:
        parts.append("aborted ok on " + ",".join(str(k) for k in sorted(life.abort_ok)))
    return "; ".join(parts)


def held_at_end(sessions: Mapping[str, SessionResources]) -> list[tuple[str, int, int, float]]:
    """Open sessions that still hold engine ids at the current point (the end of the log
    folded): ``(session_id, ids held, last position, last ts in s)``, by session id. A
    crashed deployment's sessions look like this: nothing after their last event, so with
    "now" the last event's ts (DOMAIN §0) they are not idle yet (§4.2 orphans need
    ``max_idle_s`` of silence)."""
    return [
        (s.session_id, len({k[1] for k in s.bindings}), s.last_position, s.last_ts)
        for _, s in sorted(sessions.items())
        if s.closed_at is None and s.bindings
    ]
