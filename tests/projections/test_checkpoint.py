"""Checkpoints are plain data (projections.shell.checkpoint): a fold resumed from a decoded
checkpoint equals a straight fold; anything forged, unreadable, from another version or bound
to another log is refused and rebuilt from the events; a pickle is never executed."""

from __future__ import annotations

import asyncio
import os
import pickle
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from benchmarks.synthetic import generate
from events import structs
from events.stats import StageRequestStats
from events.store.rows import ImportRow
from events.store.store import EventStore
from events.types import Capabilities, parse_event
from projections import projector as projector_module
from projections.collapse import StageCollapse
from projections.findings import Finding
from projections.projector import Projector
from projections.resource_state import Binding, IdLife
from projections.resources import ResourcesFold
from projections.shell import checkpoint, readmodels
from projections.shell.runner import FOLD_VERSION, ProjectionRunner
from reports.cli import app
from tests.histories import as_read_back
from tests.histories import generate as generate_history
from tests.projections.test_runner import mixed_log


def _stored() -> list:
    events = [parse_event({"type": t, "session_id": sid, "ts": ts, **p}) for ts, t, sid, p in generate(12, 5)]
    events += mixed_log().events
    rows = []
    from events.store.rows import NewRow, StoredRow, decode_rows

    versions: dict[str, int] = {}
    for pos, e in enumerate(events, 1):
        n = NewRow.from_event(e)
        versions[n.stream_id] = versions.get(n.stream_id, 0) + 1
        rows.append(
            StoredRow(pos, n.stream_id, versions[n.stream_id], n.event_id, n.type, n.schema_version, n.ts_us, 0, n.data)
        )
    return decode_rows(rows)


STORED = _stored()
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)  # a history's cuts are slow to shrink


def _straight() -> Projector:
    return Projector().apply_all(STORED)


def test_resuming_from_a_decoded_checkpoint_equals_a_straight_fold() -> None:
    expected = _straight()
    cuts = list(range(1, len(STORED), max(1, len(STORED) // 40)))
    inside_open_turn = 0
    for cut in cuts:
        first = Projector()
        for s in STORED[:cut]:
            first.apply(s)
        done = first.turns.take_finalized()
        inside_open_turn += any(t.open is not None for t in first.turns.sessions.values())
        blob = checkpoint.seal(
            checkpoint.encode_state(first), fold_version=FOLD_VERSION, position=cut, log_hash=b"h" * 32
        )
        sealed = checkpoint.open_blob(blob, fold_version=FOLD_VERSION, expect=Projector)
        resumed = sealed.state
        assert (sealed.position, sealed.log_hash) == (cut, b"h" * 32)
        assert checkpoint.same_state(resumed, first)
        resumed.apply_all(STORED[cut:])
        assert done + resumed.turn_tables == expected.turn_tables
        assert resumed.findings() == expected.findings()
        assert resumed.resources.running() == expected.resources.running()
    assert inside_open_turn >= 5  # the cuts do fall inside open turns


def resumed_at(stored: list, cut: int) -> tuple[list, Projector]:
    """Fold ``stored[:cut]``, checkpoint (encode, seal, open), continue with the rest: the
    finalized turns of the first leg and the resumed projector."""
    first = Projector()
    for s in stored[:cut]:
        first.apply(s)
    done = first.turns.take_finalized()
    blob = checkpoint.seal(checkpoint.encode_state(first), fold_version=FOLD_VERSION, position=cut, log_hash=b"h" * 32)
    resumed = checkpoint.open_blob(blob, fold_version=FOLD_VERSION, expect=Projector).state
    assert checkpoint.same_state(resumed, first)
    return done, resumed.apply_all(stored[cut:])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], phases=NO_SHRINK)
@given(rnd=st.randoms(use_true_random=False), sessions=st.integers(1, 3), sweep=st.integers(2, 40))
def test_every_cut_of_a_generated_history_resumes_to_the_straight_fold(rnd, sessions: int, sweep: int) -> None:
    """fold(log) == continue(decode(encode(fold(prefix))), rest) for every cut, with the fold's
    sweep of closed sessions every ``sweep`` positions, so that closed sessions are forgotten
    and then receive late events (the generator's close-then-cancel, reopen, closed
    incarnation's output) — the false checkpoint difference of issue 12. Partitions of the
    sessions folded apart and merged (projections.shell.parallel) give the same state."""
    stored = as_read_back(generate_history(rnd, sessions).log.stored)
    with _sweep_every(sweep):
        straight = Projector().apply_all(stored)
        for cut in range(1, len(stored), max(1, len(stored) // 25)):
            done, resumed = resumed_at(stored, cut)
            resumed.turn_tables[:0] = done
            assert resumed.turn_tables == straight.turn_tables, cut
            assert resumed.findings() == straight.findings(), cut
            assert checkpoint.same_state(resumed, straight), cut
        sids = sorted({s.stream_id for s in stored})
        parts = [Projector().apply_all([s for s in stored if s.stream_id in sids[i::2]]) for i in range(2)]
        merged = Projector.merged(parts)
        assert merged.findings() == straight.findings()
        assert checkpoint.same_state(merged.turns.sessions, straight.turns.sessions)
        assert checkpoint.same_state(merged.resources.sessions, straight.resources.sessions)


def test_generated_histories_do_forget_sessions_that_get_late_events() -> None:
    """The property above is not vacuous: with a small sweep interval, sessions are forgotten
    while closed and then receive another event (which a straight fold without sweeps
    would attribute to the old state)."""
    late = 0
    with _sweep_every(3):
        for seed in range(20):
            stored = as_read_back(generate_history(random.Random(seed), 2).log.stored)
            p = Projector()
            for s in stored:
                forgotten = s.stream_id not in p.turns.sessions and s.stream_id in {
                    x.stream_id for x in stored[: s.position - 1]
                }
                late += forgotten and s.event.type != "SessionOpened"
                p.apply(s)
    assert late >= 5


@contextmanager
def _sweep_every(n: int) -> Iterator[None]:
    was = projector_module.SWEEP_EVERY
    projector_module.SWEEP_EVERY = n
    try:
        yield
    finally:
        projector_module.SWEEP_EVERY = was


def test_codec_round_trips_every_supported_kind() -> None:
    twin_stats = msgspec.convert({"num_tokens_in": 3, "stage_stats": {"a": 1.5}}, structs.StageRequestStats)
    values = [
        None,
        True,
        7,
        -(2**63),
        1.25,
        float("inf"),
        "ü",
        b"\x00\xff",
        [1, [2]],
        (1, (2.5, "x")),
        {3, 4},
        frozenset({"a"}),
        {(0, "r"): [1], 5: {"k": None}},
        Binding(0, "r", (1, 2, 3), True, since_ts=2.5),  # slots dataclass, tuple field
        IdLife("r", 1, 1.0, finished_stages={0, 1}, abort_ok={0: (3, 4.0)}),
        Finding("S", 0, "r", "orphan", 1, 1.0, 2, 2.0, (1, 2), "d"),  # frozen slots dataclass
        StageCollapse(segments=2, values=(1.0, None, (1.0, 2.0), {"k": 1})),  # frozen slots, tuple field
        Capabilities(supports_concurrent_turn_requests=True),  # pydantic (events.types)
        StageRequestStats(num_tokens_in=4, stage_stats={"x": 2.0}),  # pydantic (events.stats)
        twin_stats,  # msgspec twin (events.structs)
    ]
    decoded = checkpoint.decode_state(checkpoint.encode_state(values))
    assert decoded == values
    assert [type(v) for v in decoded] == [type(v) for v in values]
    assert decoded[-1].model_fields_set if hasattr(decoded[-1], "model_fields_set") else True


def test_encoder_refuses_what_it_cannot_write_faithfully() -> None:
    shared = [1]
    with pytest.raises(ValueError, match="shares a mutable list"):
        checkpoint.encode_state([shared, shared])
    with pytest.raises(ValueError, match="not in projections.shell.checkpoint.registry"):
        checkpoint.encode_state([Path("/")])
    life = IdLife("r", 1, 1.0)
    with pytest.raises(ValueError, match="shares a mutable IdLife"):  # a mutable dataclass, twice
        checkpoint.encode_state([life, life])
    finding = Finding("S", 0, "r", "orphan", 1, 1.0, 2, 2.0, (1, 2), "d")  # frozen: a value, may repeat
    assert checkpoint.decode_state(checkpoint.encode_state([finding, finding])) == [finding, finding]


def _body(tree) -> bytes:
    return msgspec.msgpack.encode(tree)


def _forged_closed_sessions(record: list) -> bytes:
    """A fresh fold's body with ``ResourcesFold.closed_sessions`` replaced by ``record``."""
    body = msgspec.msgpack.decode(checkpoint.encode_state(ResourcesFold()))
    body[2]["closed_sessions"] = record
    return msgspec.msgpack.encode(body)


@pytest.mark.parametrize(
    "body, why",
    [
        (_body(["D", "os:system", {}]), "not allowed"),
        (_body(["D", "projections.resource_state:Binding", {"stage_id": 0}]), "fields"),
        (
            _body(
                [
                    "D",
                    "projections.resource_state:Binding",
                    {
                        "stage_id": "zero",
                        "request_id": "r",
                        "fence": None,
                        "submitted": True,
                        "finished": False,
                        "since_position": 0,
                        "since_ts": 0.0,
                    },
                ]
            ),
            "does not fit",
        ),
        (_body(["O", "projections.projector:Projector", {"position": 1}]), "fields"),
        (_body(["P", "events.types:Capabilities", ["d", "bogus", 1]]), "unreadable"),
        (_body(["x", 1]), "malformed"),
        (_body({"a": 1}), "unexpected"),
        (b"\xc1garbage", "unreadable"),
        (_body(["l"] * 1 + [["l"]] * 3), ""),  # a well-formed list is fine
    ],
)
def test_forged_bodies_are_refused(body: bytes, why: str) -> None:
    if not why:
        assert checkpoint.decode_state(body) == [[], [], []]
        return
    with pytest.raises(checkpoint.CheckpointRefused, match=why):
        checkpoint.decode_state(body)


@pytest.mark.parametrize("record", [["t", 7, "late"], ["t", 7], ["t", 7, 1.5], "closed", ["l", 7, 1.5]])
def test_a_forged_close_record_is_refused(record) -> None:
    """DOMAIN §5.7 D18's record of forgotten closed sessions is checked entry by entry: a
    (position, ts, incarnation) triple or the checkpoint is refused (and the runner rebuilds)."""
    good = checkpoint.decode_state(_forged_closed_sessions(["d", "s1", ["t", 7, 1.5, 2]]))
    assert good.closed_sessions == {"s1": (7, 1.5, 2)}
    with pytest.raises(checkpoint.CheckpointRefused, match="closed_sessions: dict does not fit"):
        checkpoint.decode_state(_forged_closed_sessions(["d", "s1", record]))


def test_headers_are_checked() -> None:
    body = checkpoint.encode_state(Projector())
    good = checkpoint.seal(body, fold_version=FOLD_VERSION, position=0, log_hash=b"")
    assert type(checkpoint.open_blob(good, fold_version=FOLD_VERSION).state) is Projector
    with pytest.raises(checkpoint.CheckpointRefused, match="fold version"):
        checkpoint.open_blob(good, fold_version=FOLD_VERSION + 1)
    with pytest.raises(checkpoint.CheckpointRefused, match="format"):
        checkpoint.open_blob(_body([checkpoint.MAGIC, 99, FOLD_VERSION, 0, b"", body]), fold_version=FOLD_VERSION)
    with pytest.raises(checkpoint.CheckpointRefused, match="not a"):
        checkpoint.open_blob(pickle.dumps(Projector()), fold_version=FOLD_VERSION)
    with pytest.raises(checkpoint.CheckpointRefused, match="not a Projector"):
        checkpoint.open_blob(
            checkpoint.seal(checkpoint.encode_state([1]), fold_version=FOLD_VERSION, position=0, log_hash=b""),
            fold_version=FOLD_VERSION,
            expect=Projector,
        )


# ------------------------------------------------------------------ on a ledger file
class Boom:
    """A pickle that runs a shell command when loaded (the attack of issue 12)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


async def _ledger(path: Path) -> str:
    url = f"sqlite+aiosqlite:///{path}"
    store = await EventStore.open(url, create=True)
    try:
        await store.append_records([ImportRow.from_event(e) for e in mixed_log().events])
        await ProjectionRunner(store).catch_up()
    finally:
        await store.close()
    return url


def _set_state(url: str, blob: bytes) -> None:
    engine = sa.create_engine(url.replace("+aiosqlite", ""))
    with engine.begin() as conn:
        conn.execute(readmodels.checkpoints.update().values(state=blob))
    engine.dispose()


def test_a_malicious_pickle_checkpoint_never_runs_and_the_audit_still_succeeds(tmp_path: Path) -> None:
    url = asyncio.run(_ledger(tmp_path / "copy.db"))
    clean = CliRunner().invoke(app, ["audit", "--db", url, "--format", "json"])
    assert clean.exit_code in (0, 1) and '"position"' in clean.stdout
    marker = tmp_path / "owned"
    _set_state(url, pickle.dumps(Boom(marker)))
    assert not marker.exists()
    result = CliRunner().invoke(app, ["audit", "--db", url, "--format", "json"])
    assert not marker.exists(), "the checkpoint's pickle was executed"
    assert result.exit_code == clean.exit_code
    assert result.stdout == clean.stdout
    assert "derived state in the ledger differs from its log: checkpoint: refused: not a checkpoint" in result.stderr
    again = CliRunner().invoke(app, ["audit", "--db", url, "--format", "json"])
    assert "differs" in again.stderr and again.stdout == clean.stdout  # the file is left as found (evidence)
    assert not marker.exists()


async def test_a_checkpoint_bound_to_another_log_is_discarded(tmp_path: Path) -> None:
    url = await _ledger(tmp_path / "l.db")
    notes: list[str] = []
    store = await EventStore.open(url)
    try:
        position, fold, blob = await store.recorder.backend.run_read(readmodels.load_checkpoint, "ledger")
        sealed = checkpoint.open_blob(blob, fold_version=fold)
        assert sealed.log_hash == await store.recorder.backend.run_read(readmodels.log_hash_at, position)
        forged = checkpoint.seal(blob_body(blob), fold_version=fold, position=position, log_hash=b"\x01" * 32)
        await store.recorder.backend.run_write(
            lambda c: c.execute(readmodels.checkpoints.update().values(state=forged))
        )
        runner = ProjectionRunner(store, note=notes.append)
        await runner.load()
        assert runner.position == 0 and "built on another log" in notes[0]
        assert await store.recorder.backend.run_read(readmodels.load_turns) == []  # dropped, to be rebuilt
        await runner.catch_up()
        assert runner.position == position
        assert checkpoint.same_state(runner.projector, sealed.state)
    finally:
        await store.close()


def blob_body(blob: bytes) -> bytes:
    return msgspec.msgpack.decode(blob)[5]


@pytest.mark.parametrize("batch_size", [97, 1000])
async def test_the_runner_trusts_its_own_checkpoints(tmp_path: Path, batch_size: int) -> None:
    """Every checkpoint the runner writes on a realistic log (pre-begin buffers, open turns,
    leaks) loads again without a note: a false refusal would rebuild on every run."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'l.db'}"
    store = await EventStore.open(url, create=True)
    try:
        events = [parse_event({"type": t, "session_id": sid, "ts": ts, **p}) for ts, t, sid, p in generate(40, 8)]
        await store.append_records([ImportRow.from_event(e) for e in events])
        notes: list[str] = []
        head = await store.head_position()
        position = 0
        while position < head:
            runner = ProjectionRunner(store, batch_size=batch_size, note=notes.append)
            await runner.load()
            assert runner.position == position, notes
            position = await runner.catch_up(until_position=position + batch_size)
        assert notes == []
    finally:
        await store.close()


_TERMINAL = "projections.turn_state:Terminal"  # reason: str | None, kinds: set[str]


@pytest.mark.parametrize(
    "fields, fits",
    [
        ({"reason": "stop", "kinds": ["s", "ResponseEnded"], "stale_reason": None, "stale_kinds": ["s"]}, True),
        ({"reason": 7, "kinds": ["s"], "stale_reason": None, "stale_kinds": ["s"]}, False),  # str | None
        ({"reason": b"stop", "kinds": ["s"], "stale_reason": None, "stale_kinds": ["s"]}, False),
        ({"reason": None, "kinds": ["s", "ResponseEnded", 3], "stale_reason": None, "stale_kinds": ["s"]}, False),
        ({"reason": None, "kinds": ["l", "ResponseEnded"], "stale_reason": None, "stale_kinds": ["s"]}, False),
        ({"reason": None, "kinds": ["s"], "stale_reason": None, "stale_kinds": ["s", None]}, False),  # set[str]
    ],
)
def test_union_and_set_fields_are_checked_element_by_element(fields, fits) -> None:
    """The compiled checks of a union of plain classes (one isinstance) and of a list/set/frozenset
    (each element) refuse what the annotation does not allow, as the general checks did."""
    body = _body(["D", _TERMINAL, fields])
    if fits:
        terminal = checkpoint.decode_state(body)
        assert (terminal.reason, terminal.kinds, terminal.stale_kinds) == ("stop", {"ResponseEnded"}, set())
    else:
        with pytest.raises(checkpoint.CheckpointRefused, match="does not fit"):
            checkpoint.decode_state(body)
