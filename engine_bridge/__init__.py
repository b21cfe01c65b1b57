"""duplex-ledger's session engine and stage ports (the only package that imports vllm)."""

import projections  # noqa: F401  (checks that the top-level events package is duplex-ledger's)
