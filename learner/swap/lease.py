"""The publish lease: one publisher of policy versions at a time, across processes.

The learner's publishes, `onthejob rollback` and the admin API's rollback and promote all
hold it while they reserve a version ordinal, swap, verify and record, so none of them can
take an ordinal another is about to use, or swap weights under another's feet. It is a
lease in the store, renewed while held: a holder killed mid-publish blocks the others for at
most TTL (and a restarted learner takes over its predecessor's lease at once). A holder
that is plainly dead, a process of this boot's process namespace that exists no more, is
taken over at once by anyone: its name says where it ran (`holder_name`). Where that cannot
be told (another host, another container, a process we may not signal), it is waited out.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

from sqlalchemy import Engine

from store import publish_lease
from store.publish_lease import LeaseHolder

TTL = timedelta(seconds=60)
# a wait this long outlasts the lease of a holder that was killed holding it
OUTLASTS_TTL = TTL.total_seconds() + 5.0


class LeaseBusy(Exception):
    """Someone else is publishing, for longer than we were willing to wait."""


def holder_name(kind: str) -> str:
    """A holder id naming the process: `learner@host:pid:random:pidspace`, where pidspace
    says which kernel boot and process namespace the pid is counted in: containers on the
    host's network share its host name but not its pids, and two machines may share a host
    name (and the first namespace's number, which is the same on every Linux)."""
    return f"{kind}@{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}:{_pid_space()}"


@functools.cache  # the same for the whole process: read once, not at every look
def _pid_space() -> str:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return ""  # not Linux, or no /proc: no holder of ours is ever judged dead
    return f"{boot[:16]}-{namespace}" if boot else ""


def is_dead_here(holder: str) -> bool:
    """Whether `holder` names a process of this host and process namespace that is gone
    (or a zombie, killed and not yet reaped). False whenever that cannot be told."""
    parts = holder.partition("@")[2].split(":")
    if len(parts) != 4:
        return False  # not a name of ours, or one from before names said their namespace
    host, pid, _random, space = parts
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    if not space or space != _pid_space():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, someone else's
    try:
        # the state follows the command name in parentheses, which may hold spaces
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state == "Z"


def try_acquire(engine: Engine, holder: str, *, steal_prefix: str | None = None) -> bool:
    """Take the lease if it is free, expired, ours, held by a process that is plainly dead,
    or (steal_prefix) held by a predecessor."""
    return publish_lease.claim(
        engine, holder, ttl=TTL, steal_prefix=steal_prefix, is_dead=is_dead_here
    )


def acquire(
    engine: Engine,
    holder: str,
    *,
    wait: float,
    steal_prefix: str | None = None,
    on_wait: Callable[[LeaseHolder], None] | None = None,
) -> None:
    """Take the lease, waiting up to `wait` seconds for it; `on_wait` hears once who holds
    it when we have to wait (someone waiting a minute should know why)."""
    deadline = time.monotonic() + wait
    to_tell = on_wait  # None once told
    while not try_acquire(engine, holder, steal_prefix=steal_prefix):
        if to_tell is not None and (current := who(engine)) is not None:
            to_tell(current)
            to_tell = None
        if time.monotonic() >= deadline:
            current = who(engine)
            raise LeaseBusy(
                f"another publish is in progress ({current or 'unknown holder'}); "
                "retry when it is done"
            )
        time.sleep(0.1)


def renew(engine: Engine, holder: str) -> bool:
    return publish_lease.renew(engine, holder, ttl=TTL)


def release(engine: Engine, holder: str) -> None:
    publish_lease.release(engine, holder)


def who(engine: Engine) -> LeaseHolder | None:
    """The current holder, unless the lease is free or expired."""
    return publish_lease.holder(engine)


@contextlib.contextmanager
def held(
    engine: Engine,
    holder: str,
    *,
    wait: float,
    steal_prefix: str | None = None,
    on_wait: Callable[[LeaseHolder], None] | None = None,
) -> Iterator[None]:
    """Hold the lease for the block, renewed in the background (a swap may outlast TTL)."""
    acquire(engine, holder, wait=wait, steal_prefix=steal_prefix, on_wait=on_wait)
    stop = threading.Event()

    def keep() -> None:
        while not stop.wait(TTL.total_seconds() / 3):
            with contextlib.suppress(Exception):  # a store that is away: try again later
                renew(engine, holder)

    renewer = threading.Thread(target=keep, name="publish-lease", daemon=True)
    renewer.start()
    try:
        yield
    finally:
        stop.set()
        renewer.join()
        with contextlib.suppress(Exception):  # unreleased, it expires
            release(engine, holder)
