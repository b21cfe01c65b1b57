"""Number options that must be finite (``--max-idle``, ``--idle-timeout-s``, ``--speed``,
``--metrics-linger-s``).

Python's ``float`` reads ``nan``, ``inf`` and ``1e400`` (inf) as numbers, and a range check
then says something untrue of them (``nan`` "should be less than or equal to 31622400"). A
:func:`finite` parser refuses them first, naming the value as typed; click turns the
``BadParameter`` into ``Invalid value for '--max-idle': 'nan' is not a finite number``, one line
and exit 2 (:func:`reports.cli.main`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import typer

from reports.cli_errors import MAX_IDLE_S


def finite(low: float, high: float | None = None, *, low_open: bool = False) -> Callable[[str | float], float]:
    """A typer ``parser`` for a finite float in [``low``, ``high``] (``low_open``: ``low`` itself
    excluded; ``high`` None: no upper bound). Raises ``typer.BadParameter`` naming the value."""
    shown = _range(low, high, low_open)

    def parse(text: str | float) -> float:
        if isinstance(text, float):  # the default, already a float
            return text
        try:
            value = float(text)
        except ValueError:
            raise typer.BadParameter(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise typer.BadParameter(f"{text!r} is not a finite number")
        if value < low or (low_open and value == low) or (high is not None and value > high):
            raise typer.BadParameter(f"{text!r} is not in the range {shown}")
        return value

    return parse


def range_help(low: float, high: float | None = None, *, low_open: bool = False) -> str:
    """The range :func:`finite` accepts, as the option's help says it: ``[0<=x<=31622400]``."""
    return f"[{_range(low, high, low_open)}]"


def _range(low: float, high: float | None, low_open: bool) -> str:
    """click's way of writing a range: ``0<=x<=31622400``, ``x>0``, ``x>=0.001``."""
    if high is None:
        return f"x>{_number(low)}" if low_open else f"x>={_number(low)}"
    return f"{_number(low)}{'<' if low_open else '<='}x<={_number(high)}"


def _number(value: float) -> str:
    """``31622400`` for a whole number (not ``3.16224e+07``), else Python's own ``repr``."""
    return f"{value:.0f}" if value.is_integer() else repr(value)


def finite_option(
    default: float,
    flag: str,
    low: float,
    high: float | None = None,
    *,
    low_open: bool = False,
    metavar: str = "<float range>",
    help: str,
) -> Any:
    """A typer option ``flag`` taking a finite float in [``low``, ``high``] (see :func:`finite`),
    its range appended to ``help``."""
    return typer.Option(
        default,
        flag,
        parser=finite(low, high, low_open=low_open),
        metavar=metavar,
        help=f"{help} {range_help(low, high, low_open=low_open)}",
    )


def max_idle_option(help: str) -> Any:
    """``--max-idle`` (seconds, default 30; finite, 0 to :data:`reports.cli_errors.MAX_IDLE_S`)
    as ``audit``, ``metrics`` and the others that take it declare it."""
    return finite_option(30.0, "--max-idle", 0.0, MAX_IDLE_S, help=help)
