"""CASE-01: running counter returns to zero when every request ends by abort; a failed abort
keeps the id held; a duplicate ack never decrements twice."""

from tests.cases.support import leak_tuples, project
from tests.logbuilder import LogBuilder, eph

SESSIONS = ["S1", "S2", "S3", "S4"]


def build():
    b = LogBuilder()
    for i, s in enumerate(SESSIONS):
        b.add("StageRequestSubmitted", s, 10.0 + i * 0.01, stage_id=0, request_id=eph(s, 0), num_tokens_in=64)
    running_max = b.position  # after #4
    for i, s in enumerate(SESSIONS[:3]):
        t = 11.0 + i * 0.01
        b.add("SessionClosed", s, t, reason="disconnect")
        b.add("AbortRequested", s, t, request_ids=[eph(s, 0)], reason="disconnect")
        b.add("AbortResult", s, t + 0.001, request_ids=[eph(s, 0)], stage_id=0, outcome="ok")
    b.add("SessionClosed", "S4", 11.03, reason="disconnect")
    b.add("AbortRequested", "S4", 11.03, request_ids=[eph("S4", 0)], reason="disconnect")
    b.add(
        "AbortResult",
        "S4",
        11.031,
        request_ids=[eph("S4", 0)],
        stage_id=0,
        outcome="failed",
        error="engine unreachable",
    )
    b.add("AbortResult", "S1", 11.5, request_ids=[eph("S1", 0)], stage_id=0, outcome="ok")  # duplicate ack
    checkpoint_a = b.position
    b.add("AbortRequested", "S4", 12.0, request_ids=[eph("S4", 0)], reason="disconnect")
    b.add("AbortResult", "S4", 12.001, request_ids=[eph("S4", 0)], stage_id=0, outcome="ok")
    return b, running_max, checkpoint_a


def test_max_running_is_four():
    b, running_max, _ = build()
    assert project(b, until=running_max).resources.running() == 4


def test_checkpoint_a_failed_abort_keeps_s4_held():
    b, _, a = build()
    p = project(b, until=a)
    assert p.resources.running() == 1
    assert p.resources.request_resources() == {"S4": {(0, eph("S4", 0)): "submitted"}}
    for s in ("S1", "S2", "S3"):
        assert p.resources.request_resources(s) == {s: {}}
    assert leak_tuples(p) == [("S4", 0, eph("S4", 0), "abort_failed")]


def test_checkpoint_b_all_clean_and_never_negative():
    b, _, _ = build()
    p = project(b)
    assert p.resources.running() == 0
    assert p.resources.request_resources() == {}
    assert leak_tuples(p) == []
    assert p.turn_tables == []  # listen-only: no response began, no table


def test_counter_never_negative_at_any_point():
    b, _, _ = build()
    p = project(b, until=0)
    for stored in b.stored:
        p.apply(stored)
        assert p.resources.running() >= 0
        for s in SESSIONS:
            assert p.resources.running(s) in (0, 1)


def test_replay_gives_same_checkpoint_b():
    b, _, _ = build()
    one, two = project(b), project(b)
    assert one.resources.request_resources() == two.resources.request_resources()
    assert one.findings() == two.findings()
