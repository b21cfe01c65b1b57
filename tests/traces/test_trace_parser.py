"""Trace format: the bundled examples parse and cover the issue's cases; every bad line is
reported with its line number and field before anything runs (CLI exit 2)."""

import hashlib
import json

import pytest
from typer.testing import CliRunner

from engine_bridge.plugin import TextPlugin
from reports import cli_engine
from reports.cli import app
from reports.traces import AudioSpec, TraceError, parse_trace, parse_traces, synthetic_pcm16


def bundled():
    return parse_traces(cli_engine.bundled_traces())


def write(tmp_path, lines, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


OPEN = {"t": 0, "session": "s", "type": "session.open"}


def test_bundled_traces_parse_and_cover_the_cases():
    trace = bundled()
    assert len(cli_engine.bundled_traces()) >= 3
    assert len(trace.sessions) >= 3 and trace.turns >= 12
    types = {line.type for line in trace.lines}
    assert {
        "barge_in",
        "response.cancel",
        "disconnect",
        "input.cancel",
        "output_audio.clear",
        "response.create",
        "session.close",
    } <= types
    opens = [line for line in trace.lines if line.type == "session.open"]
    assert {o.capabilities.resumable for o in opens} == {True, False}
    auto = {o.session for o in opens if o.mode == "auto_response"}
    spoken = [line for line in trace.lines if line.type == "input.append" and line.audio is not None]
    assert spoken and all(line.transcript or not line.is_speech for line in spoken)
    backchannels = [
        line
        for line in trace.lines
        if line.type == "input.append"
        and line.session in auto
        and TextPlugin().decide(line.text or line.transcript or "") == "listen"
        and line.is_speech
    ]
    assert backchannels, "a listen-only turn in an auto_response session"


def test_every_bad_line_is_reported_with_line_and_field(tmp_path):
    path = write(
        tmp_path,
        [
            OPEN,
            {"t": 1, "session": "s", "type": "input.append", "text": "hello"},
            {"t": 2, "session": "s", "type": "input.commit", "overlap_speech_ms": "lots"},
            "# a comment",
            "",
            "{not json",
            {"t": -1, "session": "s", "type": "barge_in"},
            {"t": 3, "session": "s", "type": "nope"},
            {"t": 3, "session": "s", "type": "input.append"},
            {"t": 3, "session": "s", "type": "input.append", "text": "x", "audio": {"duration_ms": 5}},
            {"t": 3, "session": "s", "type": "session.close", "resaon": "typo"},
            {"t": 4, "session": "s", "type": "session.update", "mode": "auto_response"},
            {"t": 4, "session": "s", "type": "input.append", "audio": {"duration_ms": 0}, "transcript": "a"},
            {"t": 5, "session": "other", "type": "input.commit"},
            {"t": 0.5, "session": "s", "type": "input.commit"},
        ],
    )
    with pytest.raises(TraceError) as info:
        parse_trace(path)
    problems = info.value.problems
    assert (
        "line 3: input.commit.overlap_speech_ms: Input should be a valid number, unable to parse string as a "
        "number" in problems
    )
    expected_prefixes = [
        "line 6: invalid JSON",
        "line 7: barge_in.t: Input should be greater than or equal to 0",
        "line 8: type: unknown type 'nope'",
        "line 9: input.append: give exactly one of text or audio",
        "line 10: input.append: give exactly one of text or audio",
        "line 11: session.close.resaon: Extra inputs are not permitted",
        "line 12: session.update: not supported",
        "line 13: input.append.audio.duration_ms: Input should be greater than 0",
        "line 14: input.commit: session 'other' is not open",
        "line 15: input.commit.t: 0.5 is earlier than the session's previous line (1.0)",
    ]
    for prefix in expected_prefixes:
        assert any(p.startswith(prefix) for p in problems), (prefix, problems)
    assert len(problems) == 1 + len(expected_prefixes)
    line_numbers = [int(p.split(":")[0].removeprefix("line ")) for p in problems]
    assert line_numbers == sorted(line_numbers)  # reported in line order, whichever check found them


def test_order_rules_and_reopen(tmp_path):
    ok = write(
        tmp_path,
        [
            OPEN,
            {"t": 1, "session": "s", "type": "disconnect"},
            {"t": 2, "session": "s", "type": "session.open"},
            {"t": 3, "session": "s", "type": "session.close"},
        ],
    )
    assert [line.type for line in parse_trace(ok).lines][-2:] == ["session.open", "session.close"]
    bad = write(
        tmp_path,
        [OPEN, OPEN, {"t": 1, "session": "s", "type": "session.close"}, {"t": 2, "session": "s", "type": "barge_in"}],
        "bad.jsonl",
    )
    problems = sorted(p.split(":")[0] for p in pytest.raises(TraceError, parse_trace, bad).value.problems)
    assert problems == ["line 2", "line 4"]


def test_a_bad_open_line_does_not_cascade(tmp_path):
    path = write(tmp_path, [{**OPEN, "mode": "auto"}, {"t": 1, "session": "s", "type": "input.append", "text": "hi"}])
    assert pytest.raises(TraceError, parse_trace, path).value.problems == [
        "line 1: session.open.mode: Input should be 'auto_response' or 'response_required'"
    ]


def test_several_files_name_the_file_and_keep_sessions_apart(tmp_path):
    a = write(tmp_path, [OPEN], "a.jsonl")
    b = write(tmp_path, [OPEN, {"t": 1, "session": "s", "type": "bogus"}], "b.jsonl")
    problems = pytest.raises(TraceError, parse_traces, [a, b]).value.problems
    assert problems[0] == "b.jsonl: line 1: session: 's' is already used by a.jsonl"
    assert problems[-1] == "b.jsonl: line 2: type: unknown type 'bogus'"  # in line order


def test_empty_trace_is_an_error(tmp_path):
    assert pytest.raises(TraceError, parse_trace, write(tmp_path, ["# nothing"])).value.problems


def test_synthetic_audio_is_deterministic_pcm16():
    spec = AudioSpec(duration_ms=250, sample_rate_hz=16000)
    speech = synthetic_pcm16(spec)
    assert len(speech) == 2 * 4000 and speech == synthetic_pcm16(spec)
    assert hashlib.sha256(speech).hexdigest() == hashlib.sha256(synthetic_pcm16(spec)).hexdigest()
    assert any(speech) and not any(synthetic_pcm16(spec, is_speech=False))


def test_cli_exits_2_on_bad_lines_before_anything_runs(tmp_path, monkeypatch):
    def must_not_run(*a, **k):
        raise AssertionError("a model was prepared for a bad trace")

    monkeypatch.setattr(cli_engine, "_prepare", must_not_run)
    path = write(
        tmp_path,
        [
            OPEN,
            {"t": 1, "session": "s", "type": "input.commit", "overlap_speech_ms": "x"},
            {"t": 2, "session": "s", "type": "barge_in", "extra": True},
        ],
    )
    db = tmp_path / "ledger.db"
    result = CliRunner().invoke(app, ["run", str(path), "--db", f"sqlite+aiosqlite:///{db}", "--model", "tiny"])
    assert result.exit_code == 2, result.output
    assert "line 2: input.commit.overlap_speech_ms: Input should be a valid number" in result.output
    assert "line 3: barge_in.extra: Extra inputs are not permitted" in result.output
    assert "nothing was run" in result.output
    assert not db.exists()


def test_program_name_is_what_the_user_can_type_again(tmp_path, monkeypatch):
    """The demo prints its re-projection commands with this: they must run as printed."""
    from reports.cli_engine import program_name

    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "duplex-ledger"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setattr("sys.argv", [str(script)])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.chdir(tmp_path)
    assert program_name() == "venv/bin/duplex-ledger"  # below the working directory: relative
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert program_name() == str(script)  # elsewhere: absolute
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin")
    assert program_name() == "duplex-ledger"  # on PATH and the same program
