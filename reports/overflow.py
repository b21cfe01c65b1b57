"""Numbers a report cannot show: sums that overflowed (issue L13).

A metric summed over hostile or corrupt input can leave the range the formats carry: a float
sum becomes ``inf`` (``1.7e308`` twice) or NaN, an integer sum grows past 64 bits
(``2**63 - 1`` plus more tokens). The rule, the same for every output format: such a value
*overflows* (:func:`overflows`) and is written ``null`` in JSON (the turn then lists the paths
of its overflowed numbers under ``"overflowed"``, so they are not taken for "not reported"),
``overflow`` in CSV, text and Markdown; a figure derived from such a sum (a rate, a KiB
size) overflows too (:func:`events.limits.derived`). The ``tables`` command prints one
warning on stderr counting them (:func:`count_overflows`), ``metrics`` one for its samples.
Pure functions.
"""

from __future__ import annotations

from typing import Any

from events.limits import overflows as overflows  # the rule itself, shared with the folds

OVERFLOW_TEXT = "overflow"


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


def overflow_paths(obj: Any, path: str = "") -> list[str]:
    """Where the numbers that overflow sit in a JSON-shaped value, as paths
    (``summary.e2e_avg_tokens_per_s``, ``stages[0].num_tokens_in``), in document order. The
    JSON output lists them per turn under ``"overflowed"``, so a reader can tell an overflow
    from a ``null`` that means "not reported" (hostile N2)."""
    if isinstance(obj, dict):
        return [p for key, value in obj.items() for p in overflow_paths(value, f"{path}.{key}" if path else str(key))]
    if isinstance(obj, (list, tuple)):
        return [p for i, value in enumerate(obj) for p in overflow_paths(value, f"{path}[{i}]")]
    return [path] if overflows(obj) else []


def count_overflows(obj: Any) -> int:
    """How many numbers in a JSON-shaped value overflow."""
    return len(overflow_paths(obj))


def json_row(doc: dict[str, Any]) -> dict[str, Any]:
    """A turn's ``to_dict()`` (or a session rollup's row) as the JSON outputs write it:
    overflowing numbers ``null``, and, only when there are some, ``"overflowed"``: their paths
    (:func:`overflow_paths`)."""
    paths = overflow_paths(doc)
    return {**nulled(doc), "overflowed": paths} if paths else doc
