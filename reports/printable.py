"""Text from the log made safe for a terminal, a Markdown viewer or a spreadsheet.

Session, request and response ids, reasons and error texts are user data (a ledger file is
untrusted input). Printed raw, an ESC sequence in a session id can recolour or rewrite the
operator's terminal, a BEL rings it, and a bidi override (U+202E) can make an id read as
another one ("Trojan Source", CVE-2021-42574). :func:`printable` shows each such character as
its escape instead. The text, Markdown, CSV and audit-table renderings apply it to every cell
and title taken from the log; JSON keeps the exact values (its own escaping is safe).
"""

from __future__ import annotations

from functools import lru_cache


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


@lru_cache(maxsize=4096)
def printable(text: str) -> str:
    """``text`` with every character Python does not call printable written as ``\\xNN``,
    ``\\uNNNN`` or ``\\UNNNNNNNN``: controls (C0, DEL, C1, including newline and tab), format
    characters (bidi overrides, zero-width), separators other than the space, private-use and
    unassigned code points. A backslash already in the text is kept as it is. Shape: str → str;
    ordinary text comes back as the same string (one scan)."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)
