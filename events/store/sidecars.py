"""The ``-wal`` and ``-shm`` files a read leaves beside a SQLite ledger, removed when SQLite
itself would have removed them.

A connection to a WAL-mode database creates ``<db>-wal`` and ``<db>-shm`` when they are
missing, a ``mode=ro`` connection too (SQLite >= 3.22), and only a connection that can write
removes them, when it is the last one to close (it checkpoints, then deletes them). A read-only
connection cannot: every read command (``audit``, ``sessions``, ``events export`` …) left two
empty files beside the ledger it read, and beside a damaged file it refused. ``immutable=1``
would create nothing, but it also ignores the WAL and every lock: it would miss what a live
writer has committed and not yet checkpointed, and read torn pages while that writer
checkpoints. So reads keep ``mode=ro``, and :func:`sidecars_missing` (before the first
connection) and :func:`remove_new_sidecars` (after the last one closed) take away the files
the read brought, under the conditions SQLite's own close uses:

* no connection of any process, this one included, holds the database: an exclusive lock on
  SQLite's lock bytes of the database file (``PENDING_BYTE`` up to the end of the shared
  range) and on the ``-shm`` file's "DMS" byte is granted. Every open WAL connection holds a
  shared lock on both for as long as it is open; while the exclusive lock is held, no new
  connection can open the database (it waits, busy timeout), so none can start using the
  files being removed;
* the ``-wal`` file is empty: a writer that committed meanwhile and could not checkpoint (the
  read's lock stopped it) left its transactions there, and they are kept;
* only the files that were missing before the read are removed; files that were there (a live
  writer's, a crashed writer's) are left alone.

The locks are Linux open-file-description locks (``F_OFD_SETLK``): they conflict with the
POSIX locks SQLite holds in this very process, and closing their file descriptor does not drop
SQLite's locks. Elsewhere (no ``F_OFD_SETLK``) nothing is removed: the files stay, as before.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator
from pathlib import Path

SIDECAR_SUFFIXES: tuple[str, ...] = ("-wal", "-shm")
"""The files SQLite keeps beside a WAL-mode database while it is open."""

PENDING_BYTE = 0x40000000
"""SQLite's lock bytes in the database file (os_unix.c): the pending byte, the reserved byte,
then the 510-byte shared range; an exclusive lock is a write lock on all of them."""
LOCK_BYTES = 2 + 510
SHM_DMS_BYTE = 128
"""The ``-shm`` byte every connection read-locks while the file is mapped (``UNIX_SHM_DMS``)."""

try:
    import fcntl

    _F_OFD_SETLK: int | None = getattr(fcntl, "F_OFD_SETLK", None)
except ImportError:  # not a POSIX system
    _F_OFD_SETLK = None


def _sidecar(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _database_file(path: Path) -> Path:
    """The file SQLite opens for ``path``: its unix VFS follows symbolic links (every
    component), and puts ``-wal``/``-shm`` beside the file the link names, not beside the link."""
    return Path(os.path.realpath(path))


def sidecars_missing(path: Path) -> tuple[str, ...]:
    """The suffixes of ``path``'s ``-wal``/``-shm`` files (beside the file a symbolic link
    ``path`` names) that do not exist now (call it before the first connection of a read)."""
    path = _database_file(path)
    return tuple(s for s in SIDECAR_SUFFIXES if not os.path.lexists(_sidecar(path, s)))


def _write_lock(fd: int, start: int, length: int) -> bool:
    """An exclusive OFD lock on ``length`` bytes of ``fd`` from ``start``, without waiting;
    False when another holder (any process, this one included) has the range locked. The lock
    lasts until ``fd`` is closed."""
    assert _F_OFD_SETLK is not None
    # struct flock: l_type, l_whence, (pad), l_start, l_len, l_pid (0 for OFD locks), (pad)
    flock = struct.pack("@hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, start, length, 0)
    try:
        fcntl.fcntl(fd, _F_OFD_SETLK, flock)
    except OSError:  # EAGAIN/EACCES: held elsewhere; EINVAL: no OFD locks on this file system
        return False
    return True


def _locked_fd(path: Path, start: int, length: int) -> int | None:
    """A file descriptor of ``path`` holding an exclusive OFD lock on ``length`` bytes from
    ``start``, or None (missing, not openable for writing, or locked elsewhere). A descriptor
    whose lock was refused is kept open, never closed: closing any descriptor of a file drops
    every POSIX lock this process holds on it, and the holder may be a live SQLite connection
    of this process. It is the one tried next time for that file (one kept per file at most)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    fd = _KEPT_OPEN.pop((st.st_dev, st.st_ino), None)
    if fd is None:
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            st = os.fstat(fd)
        except OSError:  # gone, a symlink, or not ours to lock: leave the files
            return None
    if _write_lock(fd, start, length):
        return fd
    _KEPT_OPEN[(st.st_dev, st.st_ino)] = fd
    return None


_KEPT_OPEN: dict[tuple[int, int], int] = {}
"""Descriptors whose lock was refused (:func:`_locked_fd`), by (st_dev, st_ino) of their file."""


def remove_new_sidecars(path: Path, missing: tuple[str, ...]) -> list[Path]:
    """Remove the ``missing`` sidecars of the database ``path`` (from :func:`sidecars_missing`)
    that now exist, when no connection holds the database and the ``-wal`` is empty (module
    doc). Call it after every connection of the read is closed. Never raises: a file that
    cannot be checked or removed stays. Returns the files removed."""
    if _F_OFD_SETLK is None or not missing:
        return []
    path = _database_file(path)
    created = [_sidecar(path, s) for s in missing if os.path.lexists(_sidecar(path, s))]
    if not created:
        return []
    db_fd = _locked_fd(path, PENDING_BYTE, LOCK_BYTES)
    if db_fd is None:
        return []
    # The database's exclusive lock is held: no connection of this process holds a POSIX lock
    # on it or on its -shm (an open WAL connection holds both), so closing is safe from here.
    try:
        shm = _sidecar(path, "-shm")
        shm_fd = None
        if os.path.lexists(shm):
            shm_fd = _locked_fd(shm, SHM_DMS_BYTE, 1)
            if shm_fd is None:
                return []
        try:
            return _unlink_if_wal_empty(path, created)
        finally:
            if shm_fd is not None:
                os.close(shm_fd)
    finally:
        os.close(db_fd)


def _unlink_if_wal_empty(path: Path, created: list[Path]) -> list[Path]:
    """Unlink ``created`` when ``path``'s -wal is empty or gone (the caller holds the locks)."""
    try:
        wal_size = os.lstat(_sidecar(path, "-wal")).st_size
    except FileNotFoundError:
        wal_size = 0
    except OSError:
        return []
    if wal_size != 0:
        return []  # committed transactions no checkpoint has copied yet: kept
    removed: list[Path] = []
    for file in created:
        with contextlib.suppress(OSError):
            file.unlink()
            removed.append(file)
    return removed


@contextlib.contextmanager
def no_new_sidecars(path: Path) -> Iterator[None]:
    """Around a read of the database ``path`` whose connections are all closed at the end:
    :func:`sidecars_missing` before, :func:`remove_new_sidecars` after (also when it raised)."""
    missing = sidecars_missing(path)
    try:
        yield
    finally:
        remove_new_sidecars(path, missing)
