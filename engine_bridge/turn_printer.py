"""Live ``--log-stats``: each finalized turn's tables as their own log messages (DOMAIN §5.2),
only for sessions with log_stats on (M14); the last ones are kept for readers."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from projections.turn_tables import TurnTables

if TYPE_CHECKING:
    from engine_bridge.session import Session


class TurnPrinter:
    """``printed``: the last ``kept`` finalized turns (a long-running engine stays in flat
    memory). ``renderer``: a turn's tables -> log messages for the ``logger_name`` logger, only
    rendered when that logger logs INFO; None: nothing is logged. ``on_turn``: called with the
    session and each printed turn."""

    def __init__(
        self,
        kept: int,
        logger_name: str,
        *,
        on_turn: Callable[[Session, TurnTables], Any] | None,
        renderer: Callable[[TurnTables], list[str]] | None,
    ) -> None:
        self.printed: deque[TurnTables] = deque(maxlen=kept)
        self._on_turn = on_turn
        self._renderer = renderer
        self._logger = logging.getLogger(logger_name)

    def print_turn(self, session: Session, turn: TurnTables) -> None:
        """One finalized turn of ``session``; nothing unless the session has log_stats on."""
        if not session.log_stats:
            return
        self.printed.append(turn)
        if self._renderer is not None and self._logger.isEnabledFor(logging.INFO):  # only when someone reads
            for message in self._renderer(turn):
                self._logger.info(message)
        if self._on_turn is not None:
            self._on_turn(session, turn)
