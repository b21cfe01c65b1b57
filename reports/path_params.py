"""The parser of the CLI's file options (``--output``, ``--digest``).

typer turns a path of ``''`` into ``Path('.')`` before it checks it, so ``--output ''`` was
refused as "file '' is a directory". This parser sees the text as typed: an empty path is
exit 2 saying it is empty; a directory is refused in typer's own words. Imports nothing but
the standard library and typer (``--help`` stays cheap).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import typer


def file_path(*, dash: bool = False) -> Callable[[str], Path]:
    """A typer ``parser`` for a file option: the path as typed. Raises typer.BadParameter (exit
    2, the option named) for an empty path and for a directory. ``dash``: ``-`` means standard
    output and is passed through unchecked (:func:`reports.output_file.named_output`)."""
    hint = "name a file, or '-' for standard output" if dash else "name a file"

    def parse(value: str) -> Path:
        if value == "":
            raise typer.BadParameter(f"the path is empty: {hint}")
        if not (dash and value == "-") and os.path.isdir(value):
            raise typer.BadParameter(f"file {value!r} is a directory.")
        return Path(value)

    return parse
