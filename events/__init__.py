"""duplex-ledger's events package: event types, request-id grammar, the append-only store.

``DUPLEX_LEDGER_EVENTS`` marks it as duplex-ledger's own: PyPI has an unrelated package named
``events``, and :mod:`projections` checks the marker so a clash is an ImportError that says so
(``docs/design.md``, "The top-level name ``events``")."""

DUPLEX_LEDGER_EVENTS = True
