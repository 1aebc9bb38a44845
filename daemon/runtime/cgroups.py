"""A pids cgroup per sandbox: a kernel bound on its processes and threads, for any uid.

RLIMIT_NPROC is per uid and root is exempt from it; a pids cgroup bounds the tasks in it
whatever their uid, and lists every one of them, so a run's last process can be killed
even if it left the process group. One parent per daemon (`agentd-<pid>`) under the
daemon's own cgroup (or the hierarchy's root), one child per run. cgroup v1 (a `pids`
hierarchy) and v2 (`cgroup2` with the pids controller) both work; where neither is
writable (a container, a non-root daemon without delegation) `open()` says why.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from daemon.runtime import procs


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, fstype, super options) of the cgroup mounts."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _, opts = right.split(" ", 2) if right.count(" ") >= 2 else (right, "", "")
            if fstype in ("cgroup", "cgroup2"):
                out.append((left.split()[4], fstype, opts.strip()))
    return out


def _own_path(v2: bool) -> str:
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if (v2 and controllers == "") or (not v2 and "pids" in controllers.split(",")):
                return path
    return "/"


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


class PidsCgroups:
    def __init__(self, parent: Path, v2: bool) -> None:
        self.parent = parent
        self.v2 = v2

    @classmethod
    def open(cls) -> tuple[PidsCgroups | None, str]:
        """The daemon's parent cgroup, or None and the reason none could be made."""
        reasons = []
        for mount, fstype, opts in _mounts():
            v2 = fstype == "cgroup2"
            if not v2 and "pids" not in opts.split(","):
                continue
            own = Path(mount + _own_path(v2))
            for base in dict.fromkeys((own, Path(mount))):
                try:
                    return cls._make(base, v2), ""
                except OSError as exc:
                    reasons.append(f"{base}: {exc.strerror or exc}")
        return None, "; ".join(reasons) or "no pids cgroup hierarchy is mounted"

    @classmethod
    def _make(cls, base: Path, v2: bool) -> PidsCgroups:
        cls._reclaim_stale(base)
        parent = base / f"agentd-{os.getpid()}"
        parent.mkdir(exist_ok=True)
        try:
            if v2:
                for level in (base, parent):
                    control = level / "cgroup.subtree_control"
                    if "pids" not in control.read_text().split():
                        _write(control, "+pids")
            groups = cls(parent, v2)
            groups.remove(groups.create("probe", 8))
        except OSError:
            with contextlib.suppress(OSError):
                parent.rmdir()
            raise
        return groups

    @classmethod
    def _reclaim_stale(cls, base: Path) -> None:
        """Parents left by daemons that died (kill -9): kill what is left, remove them."""
        for old in base.glob("agentd-*"):
            pid = old.name.removeprefix("agentd-")
            if not pid.isdigit() or Path(f"/proc/{pid}").exists():
                continue
            stale = cls(old, (base / "cgroup.controllers").exists())
            for child in [p for p in old.iterdir() if p.is_dir()]:
                stale.remove(child)
            with contextlib.suppress(OSError):
                old.rmdir()

    def create(self, name: str, max_tasks: int) -> Path:
        path = self.parent / name
        path.mkdir(exist_ok=True)
        _write(path / "pids.max", str(max_tasks))
        return path

    def tasks(self, path: Path) -> set[int]:
        with contextlib.suppress(OSError):
            return {int(p) for p in (path / "cgroup.procs").read_text().split()}
        return set()

    def refused(self, path: Path) -> int:
        """How many forks the limit refused (pids.events `max`)."""
        with contextlib.suppress(OSError, ValueError):
            for line in (path / "pids.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "max":
                    return int(value)
        return 0

    def kill(self, path: Path) -> int:
        """SIGKILL every task in the cgroup until it is empty; returns how many."""
        killed: set[int] = set()
        if self.v2 and (path / "cgroup.kill").exists():
            killed = self.tasks(path)
            with contextlib.suppress(OSError):
                _write(path / "cgroup.kill", "1")
        return len(killed | procs.kill_until_none(lambda: self.tasks(path)))

    def remove(self, path: Path) -> int:
        killed = self.kill(path)
        for _ in range(100):
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)  # the last tasks are still exiting
        return killed

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.parent.rmdir()
