"""duplex-ledger's renderers and command line."""

import projections  # noqa: F401  (checks that the top-level events package is duplex-ledger's)
