"""The cyclic garbage collector paused around bulk work (issue 15).

Decoding and folding a batch of stored events allocates tens of thousands of objects that
all live on (the batch, the fold's state). Every 700 allocations the collector walks the
young ones, and every tenth of those passes the older ones — the whole fold state included:
4–9 µs per event of ``verify`` went to it (bench_verify, gc callbacks). Paused for a batch,
the same objects are walked once when it ends, and full passes become as rare as batches.

Reference counting still frees everything acyclic at once; cyclic garbage made during a
batch waits for the young collection run when the pause ends. Pausing is a no-op when the
collector is already off (nesting, or a caller that turned it off), and it is turned back on
(and the young generation collected) only by the pause that turned it off. The projection
runner pauses it around whole folds too (``projections.shell.runner``).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """``with gc_paused(): ...`` runs the block with the cyclic collector off (module doc)."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()
            gc.collect(0)
