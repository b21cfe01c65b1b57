"""DOMAIN §1: request-id grammar."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from events import ids

sessions = st.text(min_size=1, max_size=40) | st.sampled_from(["s1", "user:42/a.b", "a.b.c", "日本語/セッション", "::"])
roles = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)
nonneg = st.integers(min_value=0, max_value=10**6)


def test_domain_examples():
    assert ids.encode_session("s1") == "czE"
    assert ids.mint_resident("s1", 0, 0) == "duplex-s.czE.i.0.e.0.r.stage0"
    assert ids.mint_ephemeral("s1", 0, 0, 3) == "duplex-s.czE.i.0.e.0.r.stage0_t3"
    assert ids.encode_session("user:42/a.b") == "dXNlcjo0Mi9hLmI"
    assert ids.mint_resident("user:42/a.b", 0, 0) == "duplex-s.dXNlcjo0Mi9hLmI.i.0.e.0.r.stage0"


@given(sessions, nonneg, nonneg, roles)
def test_round_trip_any_session(session, incarnation, epoch, role):
    request_id = ids.mint(session, incarnation, epoch, role)
    assert len(request_id.split(".")) == 8
    parsed = ids.parse(request_id)
    assert (parsed.session_id, parsed.incarnation, parsed.epoch, parsed.role) == (session, incarnation, epoch, role)
    assert ids.is_duplex(request_id)
    assert ids.belongs_to(request_id, session)
    assert not ids.belongs_to(request_id, session + "x")


@given(sessions, nonneg, nonneg, nonneg)
def test_resident_vs_ephemeral_by_exact_equality(session, incarnation, epoch, turn):
    resident = ids.mint_resident(session, incarnation, epoch)
    ephemeral = ids.mint_ephemeral(session, incarnation, epoch, turn)
    assert ids.is_resident(resident, session, incarnation, epoch)
    assert not ids.is_resident(ephemeral, session, incarnation, epoch)
    assert not ids.is_resident(resident, session, incarnation, epoch + 1)
    assert ids.is_ephemeral(ephemeral) and not ids.is_ephemeral(resident)
    assert ids.parse(ephemeral).ephemeral_stage_turn == (0, turn)


def test_suffix_lookalike_is_not_resident():
    # A session whose id ends like a role must not be taken for the resident placeholder.
    fake = "duplex-s.czE.i.0.e.1.r.stage0"  # epoch 1, not the epoch-0 resident
    assert not ids.is_resident(fake, "s1", 0, 0)


@pytest.mark.parametrize("role", ["", "stage.0", "stage 0", "stäge", "a/b"])
def test_bad_role_raises(role):
    with pytest.raises(ids.RequestIdError, match="role"):
        ids.mint("s1", 0, 0, role)


@pytest.mark.parametrize("bad", ["", None])
def test_empty_session_raises(bad):
    with pytest.raises(ids.RequestIdError, match="session_id"):
        ids.mint_resident(bad, 0, 0)


def test_negative_counters_raise():
    with pytest.raises(ids.RequestIdError, match="epoch"):
        ids.mint_resident("s1", 0, -1)


@pytest.mark.parametrize(
    "request_id",
    [
        "chatcmpl-123",
        "duplex-sid-e0-stage0",
        "duplex-s.czE.e.0.r.stage0",
        "duplex-s.czE.i.0.e.0.x.stage0",
        "duplex-s.czE.i.0.e.0.r",
        "",
        None,
        42,
    ],
)
def test_not_duplex(request_id):
    assert not ids.is_duplex(request_id)
    assert not ids.belongs_to(request_id, "s1")


def test_legacy_six_part_form_is_recognised_never_minted():
    legacy = ids.parse_legacy("duplex-s.czE.e.2.r.stage0-turn4")
    assert legacy is not None and legacy.legacy and legacy.epoch == 2 and legacy.incarnation is None
    assert legacy.session_id == "s1"
    assert legacy.ephemeral_stage_turn == (0, 4)
    assert ids.parse_legacy("duplex-s.czE.e.0.r.stage0_t1").ephemeral_stage_turn == (0, 1)
    assert ids.parse_legacy(ids.mint_resident("s1", 0, 0)) is None


def test_belongs_to_rejects_bad_ints_and_undecodable_segment():
    assert not ids.belongs_to("duplex-s.czE.i.x.e.0.r.stage0", "s1")
    assert ids.decode_session("***") is None
    assert ids.decode_session("czF") is None  # non-canonical trailing bits
