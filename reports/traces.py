"""Client traces: JSONL, one client event per line (Realtime-style names). Format doc:
``examples/README.md``.

Every line is an object with ``t`` (seconds from the trace start, float >= 0), ``session``
(session id, non-empty) and ``type``, one of:

=====================  ===========================================================================
``session.open``       ``capabilities`` {``resumable``: bool=false}, ``mode`` ``auto_response`` |
                       ``response_required`` (default), ``log_stats`` (bool, default true)
``input.append``       ``text`` — or ``audio`` {``duration_ms`` > 0, ``format`` "pcm16",
                       ``sample_rate_hz`` (default 16000)} with ``transcript``; ``is_speech``
                       (default true); ``store_payload`` (default false)
``input.commit``       ``create_response`` (default true), ``overlap_speech_ms`` (>= 0, default 0)
``response.create``    —
``response.cancel``    —
``input.cancel``       —
``barge_in``           —
``output_audio.clear`` —
``session.close``      ``reason`` (default ``session_close``)
``disconnect``         — (closes with reason ``disconnect``)
=====================  ===========================================================================

Any line may carry ``wait``: ``"idle"`` (first wait until the session has no response work) or
``"output"`` (first wait until the running response has streamed output, so the line lands in
the middle of it — it fires at that first output if it comes before ``t``, so a fast machine
cannot finish the response first; no wait when nothing is running). Unknown fields are errors.

``session.update`` is recognised but refused: the engine fixes capabilities and mode at open
(there is no logged update command).

:func:`parse_trace` checks every line, then the order rules (per session: opened before use,
nothing after close until reopened, ``t`` never decreasing) and raises :class:`TraceError`
listing EVERY problem as ``line N: <type>.<field>: <message>``.
"""

from __future__ import annotations

import json
import math
import re
import sys
from array import array
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

__all__ = ["AudioSpec", "Trace", "TraceError", "TraceLine", "parse_trace", "parse_traces", "synthetic_pcm16"]


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    t: float = Field(ge=0.0, allow_inf_nan=False, description="seconds from the trace start")
    session: str = Field(min_length=1)
    wait: Literal["idle", "output"] | None = None
    line_no: int = Field(default=0, exclude=True, description="1-based line in its file (set by the parser)")
    source: str = Field(default="", exclude=True, description="file the line came from (set by the parser)")


class Capabilities(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    resumable: bool = False


class SessionOpen(_Line):
    type: Literal["session.open"]
    capabilities: Capabilities = Capabilities()
    mode: Literal["auto_response", "response_required"] = "response_required"
    log_stats: bool = True


class SessionUpdate(_Line):
    type: Literal["session.update"]

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, data: object) -> object:
        raise ValueError(
            "not supported: capabilities and mode are fixed at session.open (the engine has no logged update command)"
        )


class AudioSpec(BaseModel):
    """Synthetic audio of an append: ``duration_ms`` of 16-bit mono PCM at ``sample_rate_hz``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    duration_ms: float = Field(gt=0, le=600_000, allow_inf_nan=False)
    format: Literal["pcm16"] = "pcm16"
    sample_rate_hz: int = Field(default=16_000, ge=8_000, le=48_000)


class InputAppend(_Line):
    type: Literal["input.append"]
    text: str | None = None
    audio: AudioSpec | None = None
    transcript: str | None = None
    is_speech: bool = True
    store_payload: bool = False

    @model_validator(mode="after")
    def _one_kind(self) -> InputAppend:
        if (self.text is None) == (self.audio is None):
            raise ValueError("give exactly one of text or audio")
        if self.text is not None and self.transcript is not None:
            raise ValueError("transcript goes with audio (a text append is its own transcript)")
        return self


class InputCommit(_Line):
    type: Literal["input.commit"]
    create_response: bool = True
    overlap_speech_ms: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)


class ResponseCreate(_Line):
    type: Literal["response.create"]


class ResponseCancel(_Line):
    type: Literal["response.cancel"]


class InputCancel(_Line):
    type: Literal["input.cancel"]


class BargeIn(_Line):
    type: Literal["barge_in"]


class OutputAudioClear(_Line):
    type: Literal["output_audio.clear"]


class SessionClose(_Line):
    type: Literal["session.close"]
    reason: str = Field(default="session_close", min_length=1)


class Disconnect(_Line):
    type: Literal["disconnect"]


TraceLine = Annotated[
    SessionOpen
    | SessionUpdate
    | InputAppend
    | InputCommit
    | ResponseCreate
    | ResponseCancel
    | InputCancel
    | BargeIn
    | OutputAudioClear
    | SessionClose
    | Disconnect,
    Field(discriminator="type"),
]
_ADAPTER: TypeAdapter[TraceLine] = TypeAdapter(TraceLine)
TYPES = (
    "session.open",
    "input.append",
    "input.commit",
    "response.create",
    "response.cancel",
    "input.cancel",
    "barge_in",
    "output_audio.clear",
    "session.close",
    "disconnect",
)
CLOSING = ("session.close", "disconnect")
TURN_TYPES = ("input.commit", "response.create")


class TraceError(ValueError):
    """Bad trace lines; ``problems`` holds one ``line N: where: message`` string each (file
    name first when several files were parsed)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__(f"{len(problems)} bad trace line(s):\n" + "\n".join(problems))
        self.problems = problems


class Trace(BaseModel):
    """A parsed trace: ``lines`` in file order (several files: concatenated, each keeping its
    ``source``/``line_no``)."""

    lines: list[TraceLine]

    @property
    def sessions(self) -> list[str]:
        return list(dict.fromkeys(line.session for line in self.lines))

    @property
    def turns(self) -> int:
        """Lines that can start a turn (commits and response.create)."""
        return sum(line.type in TURN_TYPES for line in self.lines)


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "line"


def _line_problems(exc: ValidationError, no: int, prefix: str) -> list[str]:
    out = []
    for err in exc.errors(include_url=False):
        msg = err["msg"].removeprefix("Value error, ")
        loc = err["loc"]
        if err["type"] == "union_tag_not_found":
            loc, msg = ("type",), "Field required (one of " + ", ".join(TYPES) + ")"
        elif err["type"] == "union_tag_invalid":
            loc, msg = (
                ("type",),
                f"unknown type {err['input'].get('type')!r}" if isinstance(err["input"], dict) else msg,
            )
        out.append(f"{prefix}line {no}: {_where(loc)}: {msg}")
    return out


def _parse_lines(
    lines: Iterable[str], source: str = "", *, prefix: str = ""
) -> tuple[list[TraceLine | _BadOpen], list[str]]:
    """Parse raw JSONL lines (blank lines and lines starting with ``#`` are skipped).
    Returns (parsed lines plus a :class:`_BadOpen` per unparsable session.open, problems);
    never raises for bad content."""
    parsed: list[TraceLine | _BadOpen] = []
    problems: list[str] = []
    for no, raw in enumerate(lines, start=1):
        raw = raw.strip()
        if not raw or raw.startswith("#"):
            continue
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            problems.append(f"{prefix}line {no}: invalid JSON: {exc.msg} (column {exc.colno})")
            continue
        except (RecursionError, ValueError) as exc:  # nested too deeply; an over-long integer
            problems.append(
                f"{prefix}line {no}: invalid JSON: {'nested too deeply' if isinstance(exc, RecursionError) else exc}"
            )
            continue
        if not isinstance(data, dict):
            problems.append(f"{prefix}line {no}: line: expected a JSON object, got {type(data).__name__}")
            continue
        if "line_no" in data or "source" in data:
            problems.append(f"{prefix}line {no}: line: fields line_no/source are reserved")
            continue
        try:
            line = _ADAPTER.validate_python(data)
        except ValidationError as exc:
            problems.extend(_line_problems(exc, no, prefix))
            if data.get("type") == "session.open" and isinstance(data.get("session"), str):
                parsed.append(_BadOpen(session=data["session"], line_no=no, source=source))
            continue
        parsed.append(line.model_copy(update={"line_no": no, "source": source}))
    return parsed, problems


class _BadOpen(BaseModel):
    """Placeholder for a session.open line that failed to parse: the order check then treats
    the session as open instead of reporting every later line of it."""

    session: str
    line_no: int
    source: str


def _order_problems(lines: list, prefix_of) -> list[str]:  # type: ignore[no-untyped-def]
    """Per session: open first, nothing after close until reopened, ``t`` non-decreasing."""
    problems = []
    is_open: dict[str, bool] = {}
    last_t: dict[str, float] = {}
    for line in lines:
        if isinstance(line, _BadOpen):
            is_open[line.session] = True
            continue
        where = f"{prefix_of(line)}line {line.line_no}: {line.type}"
        if line.t < last_t.get(line.session, 0.0):
            problems.append(f"{where}.t: {line.t} is earlier than the session's previous line ({last_t[line.session]})")
        last_t[line.session] = max(line.t, last_t.get(line.session, 0.0))
        if line.type == "session.open":
            if is_open.get(line.session):
                problems.append(f"{where}: session {line.session!r} is already open")
            is_open[line.session] = True
        elif not is_open.get(line.session):
            problems.append(f"{where}: session {line.session!r} is not open (needs a session.open line first)")
        elif line.type in CLOSING:
            is_open[line.session] = False
    return problems


_PLACE = re.compile(r"(.*?)line (\d+):")


def _problem_place(problem: str, prefixes: list[str]) -> tuple[int, int]:
    """(file index, line number) of a ``[file: ]line N: …`` problem, for sorting."""
    m = _PLACE.match(problem)
    if m is None:
        return (len(prefixes), 0)
    prefix = m.group(1)
    return (prefixes.index(prefix) if prefix in prefixes else len(prefixes), int(m.group(2)))


def _text_lines(raw: bytes, prefix: str) -> tuple[list[str], list[str]]:
    """The file's lines as text (a line that is not UTF-8 as a blank one, so the other lines
    are still checked), and a problem naming each line that is not UTF-8."""
    lines: list[str] = []
    problems: list[str] = []
    for no, line in enumerate(raw.splitlines(), start=1):
        try:
            lines.append(line.decode("utf-8"))
        except UnicodeDecodeError as exc:
            problems.append(f"{prefix}line {no}: not UTF-8: byte 0x{line[exc.start]:02x} at byte {exc.start + 1}")
            lines.append("")
    return lines, problems


def parse_trace(path: str | Path) -> Trace:
    """Parse one JSONL trace file. Raises TraceError (every problem) or OSError."""
    return parse_traces([path])


def parse_traces(paths: Iterable[str | Path]) -> Trace:
    """Parse several trace files into one trace (run concurrently). With several files each
    problem is prefixed by its file name. A session id may appear in one file only. Raises
    TraceError listing every problem of every file at once (bytes that are not UTF-8, bad
    JSON, bad fields, order), OSError when a file cannot be read."""
    files = [Path(p) for p in paths]
    several = len(files) > 1
    lines: list[TraceLine | _BadOpen] = []
    problems: list[str] = []
    owner: dict[str, str] = {}
    for path in files:
        prefix = f"{path.name}: " if several else ""
        text, not_utf8 = _text_lines(path.read_bytes(), prefix)
        parsed, bad = _parse_lines(text, str(path), prefix=prefix)
        problems += not_utf8 + bad
        for line in parsed:
            if isinstance(line, _BadOpen):
                continue
            if owner.setdefault(line.session, str(path)) != str(path):
                problems.append(
                    f"{prefix}line {line.line_no}: session: {line.session!r} is already used by "
                    f"{Path(owner[line.session]).name}"
                )
        lines += parsed
    by_source = {str(p): (f"{p.name}: " if several else "") for p in files}
    problems += _order_problems(lines, lambda line: by_source.get(line.source, ""))
    if not lines and not problems:
        problems.append("line 0: trace: no events")
    if problems:
        order = list(by_source.values())
        raise TraceError(sorted(problems, key=lambda p: _problem_place(p, order)))
    return Trace(lines=[line for line in lines if not isinstance(line, _BadOpen)])


def synthetic_pcm16(audio: AudioSpec, *, is_speech: bool = True) -> bytes:
    """Deterministic 16-bit little-endian mono PCM of ``audio.duration_ms``: a 220 Hz tone with
    a slow 3 Hz envelope for speech, digital silence otherwise. Same input, same bytes."""
    n = int(round(audio.sample_rate_hz * audio.duration_ms / 1000.0))
    if not is_speech:
        return bytes(2 * n)
    rate = audio.sample_rate_hz
    samples = array(
        "h",
        (
            int(8000 * (0.6 + 0.4 * math.sin(2 * math.pi * 3 * i / rate)) * math.sin(2 * math.pi * 220 * i / rate))
            for i in range(n)
        ),
    )
    if samples.itemsize != 2:  # pragma: no cover - array('h') is 16-bit on every CPython platform
        raise RuntimeError("array('h') is not 16-bit here")
    if sys.byteorder != "little":  # pragma: no cover
        samples.byteswap()
    return samples.tobytes()
