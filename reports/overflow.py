"""Numbers a report cannot show: sums that overflowed (issue L13).

A metric summed over hostile or corrupt input can leave the range the formats carry: a float
sum becomes ``inf`` (``1.7e308`` twice) or NaN, an integer sum grows past 64 bits
(``2**63 - 1`` plus more tokens). The rule, the same for every output format: such a value
*overflows* (:func:`overflows`) and is written ``null`` in JSON, an empty cell in CSV and
``overflow`` in text and Markdown; the ``tables`` command prints one warning on stderr
counting them (:func:`count_overflows`). Pure functions.
"""

from __future__ import annotations

import math
from typing import Any

from events.limits import INT64_MAX, INT64_MIN

OVERFLOW_TEXT = "overflow"


def overflows(value: Any) -> bool:
    """True for a float that is not finite and an int (not bool) outside signed 64 bits."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return not INT64_MIN <= value <= INT64_MAX
    return isinstance(value, float) and not math.isfinite(value)


def number_text(value: float, spec: str, unit: str = "") -> str:
    """``format(value, spec) + unit``, or ``overflow`` (no unit) for a value that overflows."""
    return OVERFLOW_TEXT if overflows(value) else format(value, spec) + unit


def nulled(obj: Any) -> Any:
    """A copy of a JSON-shaped value (dicts, lists, tuples, scalars) with every overflowing
    number replaced by None."""
    if isinstance(obj, dict):
        return {key: nulled(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [nulled(value) for value in obj]
    return None if overflows(obj) else obj


def count_overflows(obj: Any) -> int:
    """How many numbers in a JSON-shaped value overflow."""
    if isinstance(obj, dict):
        return sum(count_overflows(value) for value in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(count_overflows(value) for value in obj)
    return int(overflows(obj))
