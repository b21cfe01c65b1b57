"""Whether the read models and the checkpoint found in a ledger equal a fresh fold of its log
(``duplex-ledger verify``). Derived state in a copied file is untrusted: an edited
``rm_audit_findings`` row could hide a leak, so it is recomputed, never believed.

:class:`FreshFold` folds the log's rows up to the checkpoint position exactly as the runner
does (:func:`projections.shell.readmodels.fold_batch`); :func:`compare` then checks, in this order,
``rm_turn_tables``, ``rm_request_resources``, ``rm_audit_findings`` (findings at
``max_idle_s``, the runner's default 30 s) and the checkpoint's fold state, and returns the
first difference as a :class:`Mismatch` (None when everything is equal).

The fold forgets closed sessions at fixed log positions (:mod:`projections.projector`), not
at batch boundaries, so the runner's checkpoint equals one fresh fold exactly, including a
session whose log goes on after it was forgotten.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from events.gc_pause import gc_paused
from events.store.rows import StoredRow, decode_rows
from projections.projector import Projector
from projections.shell import checkpoint, readmodels


@dataclass(frozen=True, slots=True)
class Mismatch:
    """What differs: ``what`` (a table, or ``checkpoint``), the row ``key`` and a sentence.
    ``outdated``: the derived state was built on this very log by an older fold version (its
    checkpoint's row and sealed header agree on that version, its position and the log's chain
    hash there): an upgrade, not an edit (:func:`built_by_older_fold`)."""

    what: str
    key: str
    detail: str
    outdated: bool = False

    def __str__(self) -> str:
        return f"{self.what} {self.key}: {self.detail}" if self.key else f"{self.what}: {self.detail}"


@dataclass(frozen=True, slots=True)
class StoredModels:
    """The read models and checkpoint row as found: rows as dicts, checkpoint as
    ``(position, fold_version, blob)`` or None."""

    turns: list[dict[str, Any]]
    resources: list[dict[str, Any]]
    findings: list[dict[str, Any]]
    checkpoint: tuple[int, int, bytes] | None


def load_models(conn: Connection) -> StoredModels:
    """Read every read-model row and the checkpoint (a sync read function)."""

    def rows(table: sa.Table) -> list[dict[str, Any]]:
        return [dict(r._mapping) for r in conn.execute(sa.select(table))]

    return StoredModels(
        rows(readmodels.turn_tables),
        rows(readmodels.request_resources),
        rows(readmodels.audit_findings),
        readmodels.load_checkpoint(conn, "ledger"),
    )


class FreshFold:
    """A projector fed stored rows with position <= ``until`` (the checkpoint's position),
    collecting the turn rows as the runner writes them."""

    def __init__(
        self, until: int, projector: Projector | None = None, turn_rows: list[dict[str, Any]] | None = None
    ) -> None:
        """A fold to be fed, or (``projector``, ``turn_rows``) already folded to ``until``."""
        self.until = until
        self.projector = Projector() if projector is None else projector
        self.turn_rows: list[dict[str, Any]] = [] if turn_rows is None else turn_rows

    def feed(self, rows: Sequence[StoredRow]) -> None:
        """Fold the rows of ``rows`` up to :attr:`until`. Raises what decoding raises."""
        if not rows or rows[0].position > self.until:
            return
        batch = rows if rows[-1].position <= self.until else [r for r in rows if r.position <= self.until]
        turn_rows, _ = readmodels.fold_batch(self.projector, decode_rows(batch))
        self.turn_rows.extend(turn_rows)


def _diff_rows(
    what: str, key_cols: Sequence[str], found: Iterable[Mapping[str, Any]], fresh: Iterable[Mapping[str, Any]]
) -> Mismatch | None:
    def keyed(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[Any, ...], Mapping[str, Any]]:
        # The first row of a key wins, as the read models' INSERT OR IGNORE keeps it: a response
        # id reused after the fold forgot it (KEPT_PER_SESSION) yields a second table of that key.
        out: dict[tuple[Any, ...], Mapping[str, Any]] = {}
        for r in rows:
            out.setdefault(tuple(r[c] for c in key_cols), r)
        return out

    have, want = keyed(found), keyed(fresh)
    if have == want:  # the common case, compared in bulk (C): rows are searched only when not
        return None
    for key in sorted(have.keys() | want.keys(), key=repr):
        shown = "(" + ", ".join(map(str, key)) + ")"
        if key not in want:
            return Mismatch(what, shown, "row not in a fresh fold of the log (inserted)")
        if key not in have:
            return Mismatch(what, shown, "row of a fresh fold is missing (deleted)")
        cols = [c for c in want[key] if have[key].get(c) != want[key][c]]
        if cols:
            c = cols[0]
            return Mismatch(
                what, shown, f"{c} is {_short(have[key].get(c))}, a fresh fold gives {_short(want[key][c])}"
            )
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "…"


def compare(
    found: StoredModels, fresh: FreshFold, *, fold_version: int, log_hash: bytes, max_idle_s: float = 30.0
) -> Mismatch | None:
    """The first difference between ``found`` and ``fresh`` (module docstring), else None.
    ``log_hash``: the log's chain hash at the checkpoint position. The checkpoint row itself
    is checked first (:func:`_checkpoint_fault`), so a deleted, moved or swapped checkpoint is
    named as the checkpoint, not as the read-model rows a fold at its position disagrees with."""
    # The collector paused (events.gc_pause): decoding the checkpoint builds the whole fold state
    # anew, and its passes walked every object of both states.
    with gc_paused():
        return _compare(found, fresh, fold_version=fold_version, log_hash=log_hash, max_idle_s=max_idle_s)


def built_by_older_fold(found: StoredModels, fold_version: int, log_hash: bytes) -> bool:
    """True when the checkpoint found was sealed by an OLDER fold version on this log: its row and
    its blob's header name the same version (below ``fold_version``) and position, and the header
    carries the log's chain hash at that position (``log_hash``). Such derived state is outdated
    by an upgrade; anything else that names another version is compared as tampering."""
    if found.checkpoint is None:
        return False
    position, version, blob = found.checkpoint
    header = checkpoint.sealed_header(blob)
    return (
        type(version) is int
        and version < fold_version
        and header is not None
        and header == (version, position, log_hash)
        and bool(log_hash)
    )


def _compare(
    found: StoredModels, fresh: FreshFold, *, fold_version: int, log_hash: bytes, max_idle_s: float
) -> Mismatch | None:
    if found.checkpoint is not None and found.checkpoint[1] != fold_version:
        # Derived state that does not match this build (or a version number edited to make a
        # reader skip the comparison): the rows are compared all the same, and the version is
        # named whether they differ or not.
        version = f"the checkpoint says fold version {found.checkpoint[1]!r}, this code folds version {fold_version}"
        outdated = built_by_older_fold(found, fold_version, log_hash)
        rows = _diff_models(found, fresh, max_idle_s)
        if rows is not None:
            return Mismatch(rows.what, rows.key, f"{rows.detail} ({version})", outdated)
        return Mismatch("checkpoint", "", f"{version}: derived state that does not match this build", outdated)
    fault, sealed = _checkpoint_fault(found, fold_version, log_hash)
    if fault is not None:
        return fault
    mismatch = _diff_models(found, fresh, max_idle_s)
    if mismatch is not None or sealed is None:
        return mismatch
    return _diff_state(sealed.state, fresh.projector)


def _diff_models(found: StoredModels, fresh: FreshFold, max_idle_s: float) -> Mismatch | None:
    """The first read-model row of ``found`` that differs from ``fresh``'s."""
    projector = fresh.projector
    resources = readmodels.resource_rows(projector.resources, sorted(projector.resources.sessions))
    findings = readmodels.finding_rows(projector.findings(max_idle_s))
    return (
        _diff_rows("rm_turn_tables", ("session_id", "response_id"), found.turns, fresh.turn_rows)
        or _diff_rows("rm_request_resources", ("session_id", "stage_id", "request_id"), found.resources, resources)
        or _diff_rows("rm_audit_findings", ("finding_no",), found.findings, findings)
    )


def _checkpoint_fault(
    found: StoredModels, fold_version: int, log_hash: bytes
) -> tuple[Mismatch | None, checkpoint.Sealed | None]:
    """(what is wrong with the checkpoint row, its opened blob). The runner writes read-model
    rows and the checkpoint in one transaction, so rows without a checkpoint mean it was
    deleted; a row whose position is not the one its blob was sealed at was moved; a read-model
    row from past the checkpoint's position means an older checkpoint was put back."""
    if found.checkpoint is None:
        if found.turns or found.resources or found.findings:
            return Mismatch("checkpoint", "", "missing while the read models hold rows (deleted)"), None
        return None, None
    position, _, blob = found.checkpoint
    try:
        sealed = checkpoint.open_blob(blob, fold_version=fold_version, expect=Projector)
    except checkpoint.CheckpointRefused as exc:
        return Mismatch("checkpoint", "", f"refused: {exc}"), None
    if sealed.position != position:
        return Mismatch("checkpoint", "", f"moved: its row says position {position}, its state was sealed at "
                        f"position {sealed.position}"), None  # fmt: skip
    if sealed.log_hash != log_hash:
        return Mismatch(
            "checkpoint", "", f"bound to another log (position {sealed.position}, hash {sealed.log_hash.hex()[:16]}…)"
        ), None
    latest = max(
        (
            *(r["finalize_position"] for r in found.turns),
            *(r["since_position"] for r in found.resources),
            *(r["last_position"] for r in found.findings),
        ),
        default=0,
    )
    if latest > position:
        return Mismatch(
            "checkpoint", "", f"at position {position}, behind its read models (a row of position {latest})"
        ), None
    return None, sealed


def _diff_state(found: Projector, fresh: Projector) -> Mismatch | None:
    for name, a, b in (
        ("resources", found.resources.sessions, fresh.resources.sessions),
        ("turns", found.turns.sessions, fresh.turns.sessions),
    ):
        for sid in sorted(a.keys() | b.keys()):
            if sid not in a or sid not in b or not checkpoint.same_state(a[sid], b[sid]):
                return Mismatch("checkpoint", f"({name}, {sid})", "fold state differs from a fresh fold")
    if not checkpoint.same_state(found, fresh):
        return Mismatch("checkpoint", "", "fold state differs from a fresh fold")
    return None
