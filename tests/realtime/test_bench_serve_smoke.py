"""Smoke run of benchmarks/bench_serve.py (issue 21): ``--quick`` (2 sessions x 1 turn, fake
ports, one of the two clients dropping mid-answer) through both arms. Checks what the
benchmark must always hold, not its timings: every session held, no event lost, and the
ledger's audit clean after the drop, on a log the ledger arm really wrote."""

from benchmarks import bench_serve


def test_quick_run_loses_nothing_and_leaves_a_clean_audit(capsys):
    rows = bench_serve.main(["--quick"])
    assert [row["sessions"] for row in rows] == [2]
    row = rows[0]
    for arm in ("plain", "ledger"):
        assert row[arm]["held"] == 2, row[arm]
        assert row[arm]["lost"] == 0, row[arm]["errors"]
    audit = row["audit"]
    assert audit["sessions"] == 2  # both clients opened a ledger session
    assert audit["clean"], audit
    assert audit["leaks"] == [] and audit["live_ids"] == [] and audit["still_open"] == []
    # two turns logged; the dropped client's answer was closed under it (a disconnect: ``close``)
    reasons = audit["finished_reasons"]
    assert sum(reasons.values()) == 2 and reasons.get("close") == 1, audit
    assert "ledger/plain" in capsys.readouterr().out
