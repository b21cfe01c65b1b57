"""Where the tests read the project's shared inputs (field cases, golden files).

``$DUPLEX_LEDGER_SHARED`` (a checkout of the spec's ``shared/`` directory) when set, else the
snapshot committed under ``tests/data/shared/`` (refresh it with ``cp`` from ``shared/``), so a
fresh clone runs every test without a ``shared/`` beside it.
"""

from __future__ import annotations

import os
from pathlib import Path

SNAPSHOT_DIR = Path(__file__).resolve().parent / "data" / "shared"


def shared_dir() -> Path:
    """``$DUPLEX_LEDGER_SHARED``, else ``tests/data/shared``."""
    env = os.environ.get("DUPLEX_LEDGER_SHARED")
    return Path(env) if env else SNAPSHOT_DIR
