"""A run's processes and files as the daemon sees them from outside: find every process
of a run (by its uid, or by a namespace it entered: neither can be left), kill them all
until none is left, pick a free uid, measure a directory.

A namespace's inode number names it only while it lives: the kernel gives a freed number
to the next namespace created anywhere on the machine. `hold_namespaces` keeps a run's
namespaces alive (an open fd of each) so that `marked` finds that run's processes and no
one else's; whoever holds them closes the fds only after the last kill."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

# Run uids: far above login and container-subuid ranges; picked at random, checked free.
UID_BASE, UID_SPAN = 2_000_000_000, 1 << 20


def uid_pids(uid: int | None = None) -> dict[int, int]:
    """pid -> real uid of live (not zombie) processes, of `uid` only if given."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{entry.name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if fields.get("State", "").strip().startswith("Z"):
                continue
            real = int(fields["Uid"].split()[0])
            if uid is None or real == uid:
                out[int(entry.name)] = real
    return out


def kill_uid(uid: int) -> int:
    return len(kill_until_none(lambda: set(uid_pids(uid))))


def marked(marks: dict[str, int]) -> set[int]:
    """Live processes in any of the run's namespaces (a zombie keeps its user namespace,
    but is dead already: its parent or init reaps it)."""
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for kind, inode in marks.items():
                if os.stat(f"/proc/{entry.name}/ns/{kind}").st_ino == inode:
                    with open(f"/proc/{entry.name}/stat") as f:
                        if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                            found.add(int(entry.name))
                    break
    return found


def start_time(pid: int) -> int | None:
    """Clock ticks after boot when `pid` started: with the pid it names one process, even
    once the pid is reused."""
    with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
    return None


def hold_namespaces(pid: int, started: int | None, inodes: dict[str, int]) -> dict[str, int]:
    """kind -> an open fd of each namespace in `inodes` that the process (`pid`, started at
    `started`) is still in. A namespace it already left or that is gone is not held: its
    number may be someone else's by now."""
    held: dict[str, int] = {}
    for kind, inode in inodes.items():
        try:
            fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        if os.fstat(fd).st_ino == inode:
            held[kind] = fd
        else:
            os.close(fd)
    # Still the same process after the opens: then they read its namespaces, not those
    # of a later process that got its pid.
    if held and (started is None or start_time(pid) != started):
        release(held)
        return {}
    return held


def release(held: dict[str, int]) -> None:
    for fd in held.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    held.clear()


def kill_marked(marks: dict[str, int]) -> int:
    return len(kill_until_none(lambda: marked(marks)))


def kill_until_none(find: Callable[[], set[int]]) -> set[int]:
    """SIGKILL what `find` returns until it returns nothing (or 2 s pass); the pids killed."""
    killed: set[int] = set()
    for _ in range(200):
        pids = find()
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed |= pids
        time.sleep(0.01)
    return killed


def free_uid(taken: set[int]) -> int:
    used = set(uid_pids().values()) | taken
    while True:
        uid = UID_BASE + random.randrange(UID_SPAN)
        if uid not in used:
            return uid


def du(path: Path) -> int:
    """Bytes allocated under `path` (blocks, so sparse files count what they use)."""
    total = 0
    stack = [path]
    while stack:
        with contextlib.suppress(OSError), os.scandir(stack.pop()) as it:
            for entry in it:
                with contextlib.suppress(OSError):
                    st = entry.stat(follow_symlinks=False)
                    total += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(Path(entry.path))
    return total
