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


def test_cpu_clock_profile_counts_the_ledger_arms_calls_per_turn(tmp_path, capsys, monkeypatch):
    """``--profile PATH --profile-clock cpu``: the server's loop thread profiled on its CPU
    clock during the ledger arm, and its function calls per turn printed (the figure the
    machine's load does not move)."""
    import pstats
    import re
    from pathlib import Path

    monkeypatch.delenv(bench_serve.PROFILE_CLOCK_ENV, raising=False)  # main() sets it for the child
    path = tmp_path / "ledger.pstats"
    bench_serve.main(["--quick", "--profile", str(path), "--profile-clock", "cpu"])
    out = capsys.readouterr().out
    found = re.search(
        r"ledger arm \(cpu clock\): (\d+) function calls \(Python and builtin\) per turn \((\d+) over (\d+) turns\)",
        out,
    )
    assert found, out
    per_turn, total, turns = (int(g) for g in found.groups())
    stats = pstats.Stats(str(path))
    # the turns the CPU figures divide by (the dropped client's answer is not one)
    assert total == stats.total_calls and turns >= 1 and per_turn == round(total / turns)
    # the ledger arm's own path was profiled (not the plain arm's)
    frames = {(Path(file).parent.name, Path(file).name, name) for file, _, name in stats.stats}
    assert ("engine_bridge", "session_log.py", "_apply") in frames
