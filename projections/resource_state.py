"""Per-session resource state: what the session's decider reads (DOMAIN §3, §4.2).

One :class:`SessionResources` per session holds the map ``(stage_id, request_id) ->``
:class:`Binding` (RESERVED / SUBMITTED / FINISHED, DOMAIN §3.3 ``request_resources``) and, per
request id of the session, its :class:`IdLife` (submits, aborts and their per-pool outcomes,
releases). Only the resources fold (:mod:`projections.resources`) changes them, one event at
a time; the decider (:mod:`decider.state`, :mod:`decider.cleanup`, :mod:`decider.recovery`),
the Prometheus fold and the audit read them. :func:`stale_before_submit` is R4's query, shared
by the live plan and the audit.

Records are slotted dataclasses holding plain values, so a checkpoint writes them as data
(:mod:`projections.shell.checkpoint`). Counts are derived from sets, never incremented or
decremented, so a duplicate acknowledgement cannot drive them negative (CASE-01).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from events import ids as rid
from events.types import Capabilities

RESERVED, SUBMITTED, FINISHED = "reserved", "submitted", "finished"

RETIRED_IDS_KEPT = 256
"""Cleaned-up ids whose life a session remembers (to name a late fact of one ``output_after_*``);
older ones are forgotten, so a session of a million turns folds in flat memory."""

STAGE_CLOSED_WHY: dict[str, str] = {
    "output_after_release": "its key there was released",
    "output_after_abort": "it was aborted there",
    "output_of_stale_id": "its forward there was refused",
}
"""Why a stage of a still-held id no longer holds it, by the warning kind (IdLife.closed_stages)."""

Key = tuple[int, str]
"""A key of request_resources: ``(stage_id, request_id)``."""


@dataclass(slots=True)
class Binding:
    """One key of request_resources: its fence key ``(incarnation, epoch, turn_id)`` (None for
    a binding restored without one), whether it was submitted and has finished, and the log
    position and ts it was bound at."""

    stage_id: int
    request_id: str
    fence: tuple[int, int, int] | None
    submitted: bool
    finished: bool = False
    since_position: int = 0
    since_ts: float = 0.0

    @property
    def state(self) -> str:
        """``reserved`` / ``submitted`` / ``finished`` (DOMAIN §3.3)."""
        if not self.submitted:
            return RESERVED
        return FINISHED if self.finished else SUBMITTED


@dataclass(slots=True)
class IdLife:
    """What the log says happened to one request id of a session (orchestrator mirror).
    Positions are log positions, ts seconds; pool ``-1`` in ``abort_failed`` is the release pool."""

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
    """One session's resource state (module doc). ``accepted_fence``: the ``(epoch, turn_id)``
    high-water mark of this incarnation (DOMAIN §3.1); ``closed_at``/``taken_over_at``: the
    ``(position, ts)`` of its ``SessionClosed``/``SessionTakenOver`` (D18)."""

    session_id: str
    incarnation: int = 0
    epoch: int = 0  # from EpochAdvanced (DOMAIN §2.1)
    turn_id: int = 0  # from TurnCompleted.new_turn_id (DOMAIN §2.2): the fence's turn
    capabilities: Capabilities = field(default_factory=Capabilities)
    num_stages: int = 2
    opened: bool = False  # a SessionOpened of this session was accepted (a second one needs a close first)
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
    # Ids whose abort or release failed at some point, first failure first: the few lives R3's
    # check at a new submit looks at (a superset of those still failed; retired ids leave it).
    failed_ids: dict[str, None] = field(default_factory=dict)

    def life(self, request_id: str, position: int, ts: float) -> IdLife:
        """The life of ``request_id`` (a new one at ``position``/``ts`` if the session has none
        yet), touched by the event at ``position``: it becomes the life's last event and evidence."""
        life = self.lives.get(request_id)
        if life is None:
            life = self.lives[request_id] = IdLife(request_id, position, ts)
        life.last_position, life.last_ts = position, ts
        life.evidence.append(position)
        return life

    def keys_of(self, request_id: str) -> list[tuple[int, str]]:
        """Every key of ``request_id`` the session holds (any stage), in binding order."""
        return [k for k in self.bindings if k[1] == request_id]

    def running_ids(self) -> set[str]:
        """Distinct ids with a submitted, unfinished binding (CASE-01 'running')."""
        return {b.request_id for b in self.bindings.values() if b.submitted and not b.finished}

    def holds_anything(self) -> bool:
        """A binding, or an id whose abort is pending or failed and not cleaned since."""
        if self.bindings:
            return True
        return any(not life.cleanup_ok and (life.abort_pending or life.abort_failed) for life in self.lives.values())

    def forgettable(self) -> bool:
        """Closed, holding nothing, no retarget pending, no abort still waiting for a pool's
        answer (its ack is expected: forgotten, it would read as an unknown id's) and no id whose
        keys were dropped without a clean-up (that would still be a ``counter_not_decremented``
        leak): forgetting it changes no finding."""
        return (
            self.closed_at is not None
            and self.pending_retarget is None
            and not self.holds_anything()
            and not any(life.abort_pending for life in self.lives.values())
            and not any(
                not life.cleanup_ok
                and life.submitted
                and life.keys_dropped_at is not None
                and 0 not in life.finished_stages
                for life in self.lives.values()
            )
        )


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
