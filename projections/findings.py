"""Audit findings: leaks (fail the audit) and warnings (reported, not leaks).

A finding names the session, stage and request id, its kind, the first and last log
position and ts where it holds, and the positions of the events that prove it. A finding about
a response rather than an engine request (``stale_finalize``) carries the response id in the
id field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["leak", "warning"]

#: Leak kinds (DOMAIN §4.2 R1–R8, issue 3) -> one-line meaning.
LEAK_KINDS: dict[str, str] = {
    "held_after_close": "binding still held after its session closed (R7)",
    "finished_not_released": "finished ephemeral id still held when the next turn's id was submitted (R4/R6)",
    "stale_not_aborted": "unfinished earlier ephemeral id still held when the next turn's id was submitted (R4)",
    "downstream_left_after_abort": "binding of an id left behind after the id was aborted on another stage (R1/R2)",
    "abort_failed": "abort did not succeed and the id is still held at close (R3/R7)",
    "abort_failed_not_restored": "abort failed after the keys were dropped and they were never restored (R3)",
    "submit_after_failed_abort": "a new Stage0 id was submitted while an earlier id's abort had failed (R3)",
    "active_not_retargeted": "active request still names the stale id after the new id was submitted (R5)",
    "orphan": "submitted, no terminal event, session idle longer than max-idle",
    "counter_not_decremented": "bindings dropped while the id still ran on the engine, no successful cleanup",
}

#: Warning kinds -> one-line meaning.
WARNING_KINDS: dict[str, str] = {
    "duplicate_submit": "second submit of an id that is still held was refused (CASE-02)",
    "update_on_ephemeral": "submit_update on an ephemeral id was refused (E10)",
    "append_to_unknown_id": "submit_update of an id that is not bound was refused",
    "forward_ignored": "forward with a fence older than the accepted fence was ignored (DOMAIN §3.1)",
    "reserve_conflict": "reserve of an existing key with a different identity was refused",
    "abort_after_finish": "abort of an id whose every binding had finished",
    "abort_of_unknown_id": "abort of an id the session never held",
    "stale_finalize": "a terminal event (end, finalize, cancel) or begin naming a response the session does not "
    "hold: a second terminal of a finalized response, or an unknown response (D9)",
    "clock_domain_mismatch": "metrics snapshot mixes wall-clock and engine-monotonic stamps; ignored (CASE-08)",
    "command_rejected": "the session engine refused a command",
    "stale_fence": "submit or append under a fence (or id) of another incarnation or an older epoch was refused (D9)",
    "output_after_abort": "output, metrics, finish or listen unit of an aborted id; ignored (D1/D9)",
    "output_after_release": "output, metrics, finish or listen unit of a released id; ignored (D1/D9)",
    "output_of_stale_id": "fact of an id the session never held or of an older epoch/incarnation; ignored (D1/D9)",
    "output_outside_segment": "fact of a held id outside its current segment (after its turn ended, or not the "
    "session's current id); joins no turn (D1)",
    "duplicate_ack": "abort result with no abort pending for that pool; releases nothing (D10)",
    "append_after_release": "append naming a Stage0 id the session no longer holds; ignored (D9)",
    "begin_of_unheld_id": "a begin naming an id with no live segment in a log that records submits (aborted, "
    "released, older epoch, never submitted): opens nothing, no row (D19/D9)",
    "after_close": "a fact (submit, forward, reserve, append, commit, begin, output, snapshot, finish, listen "
    "unit, second close) written after its session's SessionClosed or SessionTakenOver, before it was opened "
    "again: binds, opens and counts nothing (D18, D9)",
    "clock_stepped_back": "a span between two wall-clock stamps came out negative (the host's clock stepped "
    "back): shown and observed as 0; first/last position name its two stamps (D17)",
    "incarnation_not_advanced": "a reopen after a close or takeover states an incarnation not above the ended "
    "session's: judged as the next one, so the closed session's ids stay refused (DOMAIN §2.1)",
    "open_while_open": "an open of a session already open (no close or takeover since its open): opens, "
    "counts and changes nothing; the open session's incarnation, fences and ids stand (DOMAIN §2.1)",
    "session_taken_over": "the session's replica died (lease expired) and another replica closed it and settled "
    "its ids (issue 14)",
}


@dataclass(frozen=True, slots=True)
class Finding:
    session_id: str
    stage_id: int | None
    request_id: str | None
    kind: str
    first_position: int
    first_ts: float
    last_position: int
    last_ts: float
    evidence: tuple[int, ...] = ()
    detail: str = ""
    severity: Severity = field(default="leak")

    def sort_key(self) -> tuple[Any, ...]:
        return (
            self.first_position,
            self.session_id,
            self.stage_id if self.stage_id is not None else -1,
            self.request_id or "",
            self.kind,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "kind": self.kind,
            "session_id": self.session_id,
            "stage_id": self.stage_id,
            "request_id": self.request_id,
            "first_position": self.first_position,
            "first_ts": self.first_ts,
            "last_position": self.last_position,
            "last_ts": self.last_ts,
            "evidence_positions": list(self.evidence),
            "detail": self.detail,
        }


def severity_of(kind: str) -> Severity:
    """Severity of a kind; raises KeyError for an unknown kind."""
    if kind in LEAK_KINDS:
        return "leak"
    if kind in WARNING_KINDS:
        return "warning"
    raise KeyError(f"unknown finding kind {kind!r}")
