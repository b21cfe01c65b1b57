"""duplex-ledger's projections: pure folds over the log and their runner.

Importing this package first checks that the top-level ``events`` module is duplex-ledger's and
not PyPI's unrelated ``events`` package installed in the same environment (the ImportError names
the module found and the way out)."""

import events as _events

if not getattr(_events, "DUPLEX_LEDGER_EVENTS", False):
    raise ImportError(
        f"the top-level module 'events' at {getattr(_events, '__file__', '?')} is not duplex-ledger's: another "
        "package named 'events' (PyPI's) shadows it in this environment. Install duplex-ledger in an environment "
        'of its own (see docs/design.md, "The top-level name events").'
    )
