"""The session's state for its rules, and :func:`evolve` (DOMAIN §2.1, §2.2, §3).

:class:`SessionState` keeps no field of its own that an event changes: incarnation, epoch,
turn, fence, closed and the request bindings are read from the resources fold's per-session
state (:class:`projections.resource_state.SessionResources`), which only folding events changes.
:func:`evolve` is that fold — the live engine and the offline projections run the same code,
so they cannot disagree on any of it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast

from events import ids
from events.records import StoredEvent
from events.structs import struct_type
from events.types import Fence, SessionClosed, SessionOpened, SessionTakenOver
from projections.resource_state import Binding, SessionResources, StaleId, stale_before_submit
from projections.resources import ResourcesFold, reopened_incarnation


@lru_cache(maxsize=4096)
def fence_of(incarnation: int, epoch: int, turn_id: int) -> Fence:
    """The (frozen) fence of these counters, built once: a session reads its fence several
    times a turn (every intent and result carries it), the same value until it moves."""
    return Fence(incarnation=incarnation, epoch=epoch, turn_id=turn_id)


@dataclass(frozen=True, slots=True)
class SessionRules:
    """The settings a session's rules read that no event carries: ``auto_response`` (as in
    ``SessionOpened``) and ``overlap_short_ack_ms`` (DOMAIN §2.3: DEFER_ACTIVE_RESPONSE drops
    overlapping speech up to this long, ms)."""

    auto_response: bool = False
    overlap_short_ack_ms: float = 700.0


@dataclass(frozen=True, slots=True)
class TurnRef:
    """The identity of one committed turn's response work: its Stage0 id, the fence it was
    submitted under (a forward carries it, never a newer one: DOMAIN §3.1) and its response."""

    request_id: str
    turn_id: int
    epoch: int
    incarnation: int
    response_id: str | None = None

    @property
    def fence(self) -> Fence:
        return fence_of(self.incarnation, self.epoch, self.turn_id)


@dataclass(frozen=True, slots=True)
class SessionState:
    """One session as its rules see it: ``fold`` holds the folded events (shared with the
    session's projector), ``rules`` the settings. Queries only; see :func:`evolve`."""

    session_id: str
    fold: ResourcesFold
    rules: SessionRules = SessionRules()

    @property
    def resources(self) -> SessionResources:
        """The fold's per-session state (an empty one before ``SessionOpened`` is folded)."""
        found = self.fold.sessions.get(self.session_id)
        return found if found is not None else SessionResources(self.session_id)

    @property
    def incarnation(self) -> int:
        return self.resources.incarnation

    @property
    def epoch(self) -> int:
        """From ``EpochAdvanced`` (DOMAIN §2.1)."""
        return self.resources.epoch

    @property
    def turn_id(self) -> int:
        """From ``TurnCompleted.new_turn_id`` (DOMAIN §2.2)."""
        return self.resources.turn_id

    @property
    def closed(self) -> bool:
        return self.resources.closed_at is not None

    @property
    def resident(self) -> bool:
        """Capability ``supports_core_resumable_request`` (DOMAIN §3.4), from ``SessionOpened``."""
        return self.resources.capabilities.supports_core_resumable_request

    @property
    def fence(self) -> Fence:
        r = self.resources
        return fence_of(r.incarnation, r.epoch, r.turn_id)

    def stage0_id(self) -> str:
        """The Stage0 id the current fence mints: the resident placeholder ``stage0`` or the
        ephemeral ``stage0_t<N>`` (DOMAIN §1.1)."""
        r = self.resources
        if self.resident:
            return ids.mint_resident(self.session_id, r.incarnation, r.epoch)
        return ids.mint_ephemeral(self.session_id, r.incarnation, r.epoch, r.turn_id)

    def binding(self, request_id: str, stage_id: int = 0) -> Binding | None:
        return self.resources.bindings.get((stage_id, request_id))

    def submitted_before(self, request_id: str) -> bool:
        """Whether the log shows a submit of ``request_id`` (held or not any more: released
        after a failed turn, aborted). Such an id is never submitted again (DOMAIN §1.1)."""
        life = self.resources.lives.get(request_id)
        return life is not None and life.submitted

    def held_ids(self) -> list[str]:
        """Distinct request ids with any binding, sorted."""
        return sorted({key[1] for key in self.resources.bindings})

    def stale_before_submit(self, new_id: str) -> list[StaleId]:
        """DOMAIN §4.2 R4 (see :func:`projections.resource_state.stale_before_submit`)."""
        return stale_before_submit(self.resources, new_id)

    def turn(self, request_id: str, response_id: str | None) -> TurnRef:
        """The turn a submit of ``request_id`` now opens (the current fence)."""
        r = self.resources
        return TurnRef(request_id, r.turn_id, r.epoch, r.incarnation, response_id)


def evolve(state: SessionState, stored: StoredEvent) -> SessionState:
    """Fold one stored event of the session (log order) and return the state. This is
    :meth:`projections.resources.ResourcesFold.apply` — the offline projections' own rules,
    not a copy. The fold is updated in place (a session's state is large; copying it per
    output event would cost more than the event)."""
    state.fold.apply(stored)
    return state


_OPENED = struct_type(SessionOpened)
_ENDS = (struct_type(SessionClosed), struct_type(SessionTakenOver))


def next_incarnation(history: Iterable[Any]) -> int:
    """The incarnation a session opens under, from its earlier events (DOMAIN §2.1): one more
    than the highest incarnation a predecessor ran under, 0 for a first open. A predecessor's
    incarnation is the one the resources fold judged it by: a reopen after a close that stated
    no higher one ran as the next (:func:`projections.resources.reopened_incarnation`); an open
    of a session still open (no close or takeover since its open) is refused by the fold
    (``open_while_open``): the open session's incarnation stands, and the refused open's only
    raises the bound. Ids of a closed predecessor (or of a refused open) can then never be
    confused with the new session's."""
    highest: int | None = None
    current: int | None = None
    ended = False
    for e in history:
        if isinstance(e, _OPENED):
            stated = cast(SessionOpened, e).incarnation
            if current is not None and not ended:  # open_while_open: the fold keeps ``current``
                highest = stated if highest is None else max(highest, stated)
                continue
            current = reopened_incarnation(current, stated) if ended and current is not None else stated
            highest = current if highest is None else max(highest, current)
            ended = False
        elif isinstance(e, _ENDS):
            ended = True
            if current is None:  # an end before any open ends the fold's incarnation 0
                current = highest = 0
    return 0 if highest is None else highest + 1
