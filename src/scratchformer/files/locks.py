"""A lock file that marks an output (a run's folder, a features file) as in use by one process.

The lock holds the owner's pid, host and start time, as JSON. It is made whole beside its place and
hard-linked into it, so it appears complete or not at all, and two processes never both take it.
A second process is refused at once, the owner named. A lock whose owner died (a SIGKILL leaves
it behind) is stale: on the same host the dead pid is detected, named on stderr, and the lock taken
over. A lock from another host cannot be checked from here: it is refused, the host named; delete
the file by hand once that run is known to be gone (``overwrite`` does not break a lock: it would
delete the files of a run still writing them).

The owner's process may take its own lock again (a task checks its run, then its Trainer does); it
is released by :func:`release`, or when the process exits.

:func:`widen_to_umask` belongs to the same care for outputs: what an atomic write makes privately
is readable as the umask says.

This module imports nothing of the package (``files/`` is the layer that both data/ and training/
may use).
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["acquire", "held", "holds", "release", "widen_to_umask"]

_HELD: set[Path] = set()  # the locks this process took (released at exit)


def acquire(lock: str | Path, what: str) -> bool:
    """Take ``lock`` (a file path) for this process, ``what`` naming the output it guards in errors.
    True if taken now; False if this process held it already. A live owner is a FileExistsError."""
    lock = Path(lock).absolute()
    mine = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    for _ in range(3):  # a stale lock removed, or the owner releasing it meanwhile: try again
        if _link(lock, mine):
            _HELD.add(lock)
            return True
        owner = _owner(lock, what)
        if owner is None:
            continue
        pid, host, started = owner.get("pid"), owner.get("host"), owner.get("started")
        if pid == mine["pid"] and host == mine["host"]:
            _HELD.add(lock)
            return False
        if host == mine["host"] and isinstance(pid, int) and not _alive(pid):
            print(
                f"{lock}: stale lock of process {pid} (started {started}), which is no longer running: "
                "taking it over",
                file=sys.stderr,
            )
            lock.unlink(missing_ok=True)
            continue
        raise FileExistsError(
            f"{what} is in use by another run (process {pid} on host {host}, started {started}; lock "
            f"{lock}): wait for it to end or choose another output"
            + (f" (if it is gone, delete {lock})" if host != mine["host"] else "")
        )
    raise FileExistsError(f"{what}: could not take the lock {lock} (other runs took it meanwhile)")


@contextmanager
def held(lock: str | Path, what: str) -> Iterator[None]:
    """``with held(lock, what):`` the lock taken for the block (see :func:`acquire`), then given back
    (unless this process held it before)."""
    taken = acquire(lock, what)
    try:
        yield
    finally:
        if taken:
            release(lock)


def holds(lock: str | Path) -> bool:
    """True if this process holds ``lock``."""
    return Path(lock).absolute() in _HELD


def release(lock: str | Path) -> None:
    """Give ``lock`` back, if this process holds it (a lock taken over by another is left alone)."""
    lock = Path(lock).absolute()
    if lock not in _HELD:
        return
    _HELD.discard(lock)
    try:
        if json.loads(lock.read_text()).get("pid") == os.getpid():
            lock.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def widen_to_umask(path: str | Path) -> None:
    """Give ``path`` (a file or a directory, with its files) the permissions the umask gives a new one:
    the temporaries of atomic writes are private (mkdtemp's 0700, safetensors' 0600), the outputs
    they become must not be (a team's shared folder)."""
    umask = os.umask(0o022)  # (read by setting it and putting it back)
    os.umask(umask)
    path = Path(path)
    for p in [path, *(path.iterdir() if path.is_dir() else [])]:
        p.chmod((0o777 if p.is_dir() else 0o666) & ~umask)


@atexit.register
def _release_all() -> None:
    for lock in list(_HELD):
        release(lock)


def _link(lock: Path, mine: dict[str, Any]) -> bool:
    """Make the lock whole beside ``lock``, then link it into place: False if a lock is there."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    tmp = lock.with_name(f".{lock.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(mine) + "\n")
    try:
        os.link(tmp, lock)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def _owner(lock: Path, what: str) -> dict[str, Any] | None:
    """The lock's content (None if it vanished); an unreadable lock is refused, naming the file."""
    try:
        owner = json.loads(lock.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise FileExistsError(
            f"{what}: unreadable lock file {lock} ({e}); delete it if no run uses it"
        ) from None
    if not isinstance(owner, dict):
        raise FileExistsError(f"{what}: unreadable lock file {lock}; delete it if no run uses it")
    return owner


def _alive(pid: int) -> bool:
    """True if process ``pid`` runs on this host (a zombie, killed but not yet reaped, is dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
