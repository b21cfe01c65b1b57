"""The turns fold's per-session state, as slotted records sized to the work (DOMAIN §5.3–§5.5).

* :class:`StageFacts` — what one stage gave one turn (or the pre-begin buffer): its engine
  snapshots folded into one accumulator with their receipt stamps, and its ledger-derived
  segment (submit or forward, ``StageOutput`` token deltas) with the log positions of its
  stamps (D17);
* :class:`OpenTurn` — the open turn: its ids, arrival, and one :class:`StageFacts` per stage;
* :class:`Terminal` — how a finalized response ended (D9: a second terminal is one warning);
* :class:`SessionTurns` — one session: the segments of its ids (attribution, D1), the
  pre-begin buffer (§5.3), the arrival stamp (§5.3, M16), the open turn, the responses it
  finalized and the connector totals (§5.3 TX);
* :class:`FinalizedResponses` — what the fold keeps of a session it forgot closed: the
  responses it finalized (a late terminal is judged against them, a reopen keeps them known).

Memory (issue 13, a week-long session): everything per id or per response is bounded by
:data:`KEPT_PER_SESSION` except ``SessionTurns.finalized_earlier``, the one per-turn memory the
fold keeps: the id of every response finalized before the kept terminals, so that with
``terminals`` it names EVERY response the session finalized, and a reused id is stale however
long ago it was finalized (DOMAIN §2.1, D9) and never opens a second turn (a second table the
read model, keyed by ``(session_id, response_id)``, would not hold). It costs nothing until a
session has finalized more than :data:`KEPT_PER_SESSION` responses (but an empty set, 216 bytes
a session), then a share of the set's table plus the id string a turn: measured on CPython 3.11,
28-52 bytes of table a turn (it grows in steps) plus ``49 + len(id)`` bytes of string (an ASCII
id), i.e. 110-135 bytes a turn for a 32-char ``resp_...`` id, about 12 MiB for 100,000 turns
(``tests/projections/test_bounded_state.py`` checks at most 64 bytes of table a turn).

Records only: the rules that fill them live in :mod:`projections.attribution` (which turn a
fact joins), :mod:`projections.turns` (open, arrival, terminals) and
:mod:`projections.turn_finalize` (a turn's tables at its end).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from projections.collapse import StageCollapse

Edge = tuple[int, int]
"""A connector edge ``(from_stage, to_stage)``."""

KEPT_PER_SESSION = 256
"""Submitted ids and terminals (how a finalized response ended) a session remembers (to tell a
late fact from an unknown one, and a second terminal's reason); older ones are forgotten, so
memory stays flat. The ids of older finalized responses are all kept
(``SessionTurns.finalized_earlier``)."""


@dataclass(slots=True)
class StageFacts:
    """One stage's facts in one turn (or in the pre-begin buffer). Stamps are wall-clock
    seconds; ``*_position`` the log positions of those stamps (D17: a span that comes out
    negative names both).

    * engine-reported: ``snapshot`` (every ``StageMetricsReported`` of the stage folded, DOMAIN
      §5.4; None = none reported), ``first_ts`` (first snapshot's submit, else its receipt),
      ``last_ts`` (last receipt), ``last_snapshot`` (the last one's identity: the same snapshot
      seen on a second path counts once, M21);
    * ledger-derived (``derived`` True once a submit, forward or output of the stage joined):
      ``submit_ts``/``num_tokens_in`` of the submit or forward, the output token count, the
      first and last token-carrying output and the last output."""

    snapshot: StageCollapse | None = None
    first_ts: float | None = None
    last_ts: float | None = None
    last_snapshot: tuple[str, StageCollapse, float | None] | None = None
    derived: bool = False
    submit_ts: float | None = None
    num_tokens_in: int | None = None
    num_tokens_out: int = 0
    first_token_ts: float | None = None
    last_token_ts: float | None = None
    last_output_ts: float | None = None
    submit_position: int = 0
    first_token_position: int = 0
    last_token_position: int = 0
    last_output_position: int = 0

    def restart_derived(self, submit_ts: float, num_tokens_in: int | None, position: int) -> None:
        """A fresh ledger-derived segment opened by the submit at ``position``."""
        self.derived = True
        self.submit_ts, self.num_tokens_in, self.submit_position = submit_ts, num_tokens_in, position
        self.num_tokens_out = 0
        self.first_token_ts = self.last_token_ts = self.last_output_ts = None
        self.first_token_position = self.last_token_position = self.last_output_position = 0


@dataclass(slots=True)
class OpenTurn:
    """The open turn of a session: ``request_id`` None until an engine id binds it (D8)."""

    response_id: str
    request_id: str | None
    turn_id: int
    arrival_ts: float
    opened_position: int = 0
    arrival_position: int = 0  # the event that set arrival_ts (D17)
    stages: dict[int, StageFacts] = field(default_factory=dict)
    tx_baseline: dict[Edge, tuple[float, int, bool]] = field(default_factory=dict)


@dataclass(slots=True)
class Terminal:
    """How a finalized response ended: its reason and the event kinds of that terminal, and the
    last stale terminal seen after it (its reason and kinds: the second half of an engine pair
    such as ResponseEnded + TurnFinalized joins it without a second warning). ``reason`` None:
    the response was finalized before the terminals kept (:data:`KEPT_PER_SESSION`), its reason
    no longer known; such a record is made again for a late terminal of it, to hold that
    terminal as the stale one."""

    reason: str | None
    kinds: set[str] = field(default_factory=set)
    stale_reason: str | None = None
    stale_kinds: set[str] = field(default_factory=set)


@dataclass(slots=True)
class SessionTurns:
    """One session's turn state (module docstring). Attribution (D1): ``current_id`` (the last
    Stage0 id submitted), ``live`` (id -> position of the submit opening its live segment),
    ``submitted`` (ids submitted, oldest first, bounded), ``forwarded`` (downstream stages each
    live id was forwarded to in its segment; once the log records forwards at all,
    ``forward_seen``, a downstream fact joins only after its forward), ``submits_seen`` (the log
    records Stage0 submits, accepted or refused), ``completed_below`` (the model completed every
    turn below it, ``TurnCompleted``). Buffer before begin: ``pending`` stage facts of
    ``pending_request_id``. Finalized responses: ``terminals`` (how the latest
    :data:`KEPT_PER_SESSION` ended) and ``finalized_earlier`` (the ids of all the older ones,
    unbounded: the module doc's memory note); :meth:`finalized` asks both."""

    session_id: str
    num_stages: int = 2
    open: OpenTurn | None = None
    completed_below: int = 0
    current_id: str | None = None
    live: dict[str, int] = field(default_factory=dict)
    submitted: dict[str, None] = field(default_factory=dict)
    pending_request_id: str | None = None  # the id every pending fact belongs to (D1)
    pending: dict[int, StageFacts] = field(default_factory=dict)
    pending_stamp: float | None = None
    pending_stamp_uncommitted: bool = False  # the stamp is an append's since the last commit
    pending_commit_ts: float | None = None
    pending_stamp_position: int = 0
    pending_commit_position: int = 0
    opened_at: tuple[int, float] | None = None  # SessionOpened (position, ts): session wall time (D17)
    tx_totals: dict[Edge, list[Any]] = field(default_factory=dict)
    terminals: dict[str, Terminal] = field(default_factory=dict)
    finalized_earlier: set[str] = field(default_factory=set)
    closed: bool = False
    forwarded: dict[str, set[int]] = field(default_factory=dict)
    forward_seen: bool = False
    submits_seen: bool = False

    @property
    def pending_rows(self) -> dict[int, StageCollapse]:
        """The buffered snapshot accumulator of each stage (one per stage, M15)."""
        return {k: f.snapshot for k, f in self.pending.items() if f.snapshot is not None}

    def finalized(self, response_id: str) -> bool:
        """Whether the session finalized ``response_id``, however long ago (its terminal kept or
        not): a begin or terminal naming it is stale (DOMAIN §2.1, D9)."""
        return response_id in self.terminals or response_id in self.finalized_earlier

    def clear_pending(self) -> None:
        self.pending_request_id = None
        if self.pending:
            self.pending = {}

    def end_segment(self, request_id: str | None) -> None:
        if request_id is None:
            return
        self.live.pop(request_id, None)
        self.forwarded.pop(request_id, None)
        if self.pending_request_id == request_id:
            self.clear_pending()

    def stamp(self, ts: float, position: int) -> None:
        """The pending arrival stamp, unless one is already set (§5.3, M16)."""
        if self.pending_stamp is None:
            self.pending_stamp, self.pending_stamp_position = ts, position


@dataclass(slots=True)
class FinalizedResponses:
    """What the turns fold keeps of a session it forgot closed (``TurnsFold.forget_closed``):
    its ``terminals`` (at most :data:`KEPT_PER_SESSION`) and ``finalized_earlier`` (the ids of
    every older response it finalized), given back to the session on its next event."""

    terminals: dict[str, Terminal]
    finalized_earlier: set[str]


def remember(kept: dict[Any, Any], key: Any, pinned: dict[Any, Any]) -> list[Any]:
    """Add ``key`` (None: nothing) to the insertion-ordered ``kept`` and drop its oldest entries
    beyond :data:`KEPT_PER_SESSION`, except those in ``pinned`` (ids with a live segment).
    Returns the keys dropped (oldest first; usually none)."""
    if key is not None:
        kept.pop(key, None)
        kept[key] = None
    if len(kept) <= KEPT_PER_SESSION:
        return _NONE_DROPPED  # the usual case: nothing to forget, no copy of the keys
    dropped = [old for old in list(kept)[: len(kept) - KEPT_PER_SESSION] if old not in pinned]
    for old in dropped:
        del kept[old]
    return dropped


_NONE_DROPPED: list[Any] = []  # never appended to
