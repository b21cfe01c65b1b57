"""Escaping rules per output medium for text taken from the log (issue 22, part A).

A ledger file is untrusted input: session ids, request and response ids, model output, stats
strings and error texts may hold anything a client or an engine sent. Every renderer takes such
text through the one function of its medium here, never its own copy:

* :func:`terminal` — text tables, audit text, CLI messages: :func:`reports.printable.printable`
  (C0/C1 controls, DEL, bidi overrides and isolates U+202A–202E/U+2066–2069, zero-width and
  other non-printable characters shown as ``\\xNN``/``\\uNNNN``);
* :func:`rich_text` — a cell or line for rich (tables, ``Console.print``): a ``rich.text.Text``
  of :func:`terminal` — never parsed as markup, so ``[bold]`` from the log prints as written
  (``rich.markup.escape`` would double a trailing backslash);
* :func:`html_text` — HTML and plotly labels/hover (plotly reads ``<b>``, ``<a href>``,
  ``<span style>`` in its strings and decodes entities): :func:`terminal`, then
  ``html.escape`` (``& < > " '``). The JSON plotly embeds in ``<script>`` escapes ``<``, ``>``
  and ``/`` itself (``\\u003c/script\\u003e``);
* :func:`markdown_text` — inline Markdown (CommonMark: headings, pipe-table cells, strong
  titles): :func:`terminal`, then ``&``/``<`` as entities (no tag, autolink or entity from the
  log) and a backslash before ``\\``, ``|``, ``*``, `````, ``[``, ``]``, ``~`` and every ``_``
  that is not between two letters or digits (an intraword ``_`` opens or closes no emphasis), so
  the rendered text is the :func:`terminal` text; ids made of letters, digits, ``-``, ``.`` and
  intraword ``_`` come back unchanged;
* :func:`markdown_code` — a code span: :func:`terminal`, in a fence of one backtick more than the
  longest run inside, padded with one space on each side when the text holds a backtick or
  starts and ends with a space (CommonMark §6.1 strips one such pad); plain text keeps a single
  backtick fence and no pad;
* :func:`csv_text` — a CSV cell of text from the log: :func:`terminal`, then a leading ``'``
  when the cell starts with ``=``, ``+``, ``-``, ``@``, tab or CR (OWASP "CSV injection"; the
  tab and CR are already ``\\x09``/``\\x0d`` after :func:`terminal`, listed for any caller).
  Cells written from numbers (a value, a turn id, a stage id — ``-1.5`` is a number to a
  spreadsheet, not a formula) are not text from the log and are written as they are.

JSON keeps the exact values (its own escaping is safe). Clean text (ids of letters, digits,
``-``, ``_``, ``.``, ``:``) is returned unchanged by every function, so the bytes of clean logs'
outputs do not change.
"""

from __future__ import annotations

import html
import re
from functools import lru_cache

from rich.text import Text

from reports.printable import printable

__all__ = [
    "FORMULA_LEADS",
    "csv_text",
    "html_text",
    "markdown_code",
    "markdown_text",
    "rich_text",
    "terminal",
]

FORMULA_LEADS: tuple[str, ...] = ("=", "+", "-", "@", "\t", "\r")
"""A spreadsheet reads a cell starting with one of these as a formula (CSV injection)."""

_MD_PUNCT = re.compile(r"[\\|*`\[\]~]")
_BACKTICK_RUN = re.compile(r"`+")


def terminal(text: str) -> str:
    """``text`` for a terminal: every non-printable character as its escape (str → str)."""
    return printable(text)


def rich_text(text: str) -> Text:
    """``text`` as a rich renderable that is never read as markup: ``Text(terminal(text))``."""
    return Text(printable(text))


def html_text(text: str) -> str:
    """``text`` for HTML content, attribute values or plotly strings: :func:`terminal`, then
    ``html.escape`` (quotes too)."""
    return html.escape(printable(text), quote=True)


def _md_underscore(text: str, i: int) -> str:
    before = text[i - 1] if i > 0 else " "
    after = text[i + 1] if i + 1 < len(text) else " "
    return "_" if before.isalnum() and after.isalnum() else "\\_"


@lru_cache(maxsize=4096)
def markdown_text(text: str) -> str:
    """``text`` as inline CommonMark whose rendering is :func:`terminal` ``(text)`` as text:
    no tag, link, emphasis, code span, entity or table-cell break from it (see the module)."""
    text = printable(text)
    text = _MD_PUNCT.sub(lambda m: "\\" + m.group(0), text)
    text = text.replace("&", "&amp;").replace("<", "&lt;")
    if "_" in text:
        text = "".join(_md_underscore(text, i) if ch == "_" else ch for i, ch in enumerate(text))
    return text


def markdown_code(text: str) -> str:
    """``text`` as one CommonMark code span that no backtick inside can close early."""
    text = printable(text)
    longest = max((len(m.group(0)) for m in _BACKTICK_RUN.finditer(text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if "`" in text or (len(text) > 1 and text.startswith(" ") and text.endswith(" ")) else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def csv_text(text: str) -> str:
    """A CSV cell of text from the log that a spreadsheet shows as text, not a formula."""
    text = printable(text)
    return "'" + text if text.startswith(FORMULA_LEADS) else text
