"""A trace with several bad lines reports all of them in one go (issue 22): a line that is not
UTF-8 no longer hides the JSON, field and order problems of the other lines, in any file."""

from __future__ import annotations

import pytest

from reports.traces import TraceError, parse_traces

GOOD_OPEN = b'{"t": 0, "session": "a", "type": "session.open"}\n'


def test_every_kind_of_problem_is_named_in_one_error(tmp_path):
    trace = tmp_path / "bad.jsonl"
    trace.write_bytes(
        GOOD_OPEN
        + b"not json\n"
        + b'{"t": 1, "session": "a", "type": "bogus"}\n'
        + b"\xff\xfe\n"
        + b'{"t": 0.5, "session": "b", "type": "input.commit"}\n'
        + b'{"t": 1, "session": "a", "type": "input.append", "text": "x", "zzz": 1}\n'
    )
    with pytest.raises(TraceError) as caught:
        parse_traces([trace])
    lines = [p.split(":")[0] for p in caught.value.problems]
    assert lines == ["line 2", "line 3", "line 4", "line 5", "line 6"]
    assert "not UTF-8" in caught.value.problems[2]


def test_problems_of_several_files_are_reported_together(tmp_path):
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    one.write_bytes(GOOD_OPEN + b"\xc3\n")
    two.write_bytes(b'{"t": 0, "session": "b", "type": "session.open"}\n{"t": 1, "session": "b"}\n')
    with pytest.raises(TraceError) as caught:
        parse_traces([one, two])
    assert [p.split(":")[0] for p in caught.value.problems] == ["one.jsonl", "two.jsonl"]
