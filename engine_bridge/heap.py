"""The serving process's startup heap kept out of the cyclic garbage collector's way.

A serving process starts with a large heap that lives as long as it does: imported modules
(vLLM, torch, FastAPI, SQLAlchemy, pydantic's validators), the engines, the recovered fold.
Every session allocates objects by the thousand, so the collector runs its young passes often,
and every tenth of those a middle pass; each time enough objects have survived, a full pass
walks that whole heap again. On the Realtime server (bench_serve, fake ports, 32 sessions) those
full passes cost the ledger arm 0.1-1.4 ms a turn, the plain arm next to nothing (it allocates
far less). Frozen once the process has started (``gc.freeze``: the objects alive then move to
a permanent generation no pass walks), the passes walk only what was made since.

Reference counting still frees everything acyclic; cyclic garbage made after the freeze is
collected as before. What the freeze keeps alive is what was alive at startup (a collection
runs first, so no garbage of the startup is frozen).
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect once, then move every object alive into the collector's permanent generation.
    For a serving process once it has started (engines up, ledger opened and recovered, app
    built), called once; returns how many objects are frozen. Not for a library's caller that
    keeps creating and dropping engines (a test process): what is frozen is never collected."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
