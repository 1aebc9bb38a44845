"""Kernel-level confinement of workflow sandboxes: the daemon's side.

The sandbox applies the layers itself before any user code runs (daemon/runtime/sandbox/isolation.py
says what each does); the daemon chooses them, prepares what they need, and cleans up.

`Confinement` (one per daemon) learns what this machine allows by starting probe
sandboxes, the real start-up code with `--probe`, and dropping the layer a failed probe
names until one succeeds; the log says which layers are active and why the others are
not. `AGENTD_SANDBOX_DISABLE=landlock,netns` turns layers off (odd kernels; tests of one
layer at a time).

A `Jail` per run: a uid of its own (root daemon), a pids cgroup, the unix socket the
network namespace's relay reaches the daemon through, the pipe that hands the layers to
the sandbox, and a supervisor that watches the working directory's size where no tmpfs
quota holds it, kills every process the run left once its main process ends (even ones
that left its process group), and records what it did in the run's trace. It holds the
namespaces the sandbox entered from its report until then: their inode numbers are how it
finds the run's processes, and a freed number soon names another run's fresh namespace.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

from sqlalchemy.engine import make_url

from daemon.config import Config
from daemon.runtime import procs
from daemon.runtime.cgroups import PidsCgroups
from daemon.runtime.sandbox import landlock
from daemon.runtime.zygote import REPORT_FD, Forked, ForkServer, ForkServerError

log = logging.getLogger("agentd.confine")

DISABLE_ENV = "AGENTD_SANDBOX_DISABLE"
WATCH_INTERVAL_S = 0.1
PROBE_TIMEOUT_S = 30.0
ALWAYS = ("rlimits",)
NAMESPACES = ("user", "mnt", "net")  # the kinds a sandbox reports (daemon/runtime/sandbox/entry.py)
Event = Callable[..., None]
Process = asyncio.subprocess.Process | Forked  # a sandbox: exec'd, or forked by the server


@dataclass
class Confinement:
    """What this daemon's sandboxes get; `layers` are the ones the sandbox applies."""

    config: Config
    base_url: str
    layers: list[str] = field(default_factory=list)
    missing: dict[str, str] = field(default_factory=dict)
    cgroups: PidsCgroups | None = None
    uids: set[int] = field(default_factory=set)
    audit_hook: bool = True
    landlock_abi: int = 0
    fork_server: ForkServer | None = None  # None: each sandbox is exec'd

    def __post_init__(self) -> None:
        if self.config.runtime_fork_server:
            self.fork_server = ForkServer()

    @property
    def daemon_address(self) -> tuple[str, int]:
        parts = urlsplit(self.base_url)
        host = parts.hostname or "127.0.0.1"
        return ("127.0.0.1" if host in ("0.0.0.0", "::", "") else host), parts.port or 80

    def hidden(self) -> list[str]:
        """Directories a run must not see: shared temp dirs, sockets, the daemon's files."""
        paths = ["/tmp", "/var/tmp", "/dev/shm", "/run", str(Path.home()),
                 str(self.config.data_path), str(self.config.config_path)]
        url = make_url(self.config.db_url)
        if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            paths.append(str(Path(url.database).parent))
        return sorted({os.path.realpath(p) for p in paths})

    def active(self) -> list[str]:
        """Every layer a run gets, as the run's trace and the log name them."""
        names = [f"landlock-abi{self.landlock_abi}" if layer == "landlock" else layer
                 for layer in self.layers]
        if "uid" in self.layers or os.geteuid() != 0:
            names.append("nproc")  # root is exempt from RLIMIT_NPROC
        names.append("tmpfs-quota" if "mountns" in self.layers else "disk-watchdog")
        return [*names, *ALWAYS, *(["audit-hook"] if self.audit_hook else [])]

    def describe(self) -> str:
        active = ", ".join(self.active())
        off = "; ".join(f"{k}: {v}" for k, v in self.missing.items()) or "none"
        return f"sandbox confinement: {active} (not active: {off})"


_shared: Confinement | None = None
_shared_lock: asyncio.Lock | None = None


async def confinement(config: Config, base_url: str) -> Confinement:
    """This daemon's confinement, probed on first use."""
    global _shared, _shared_lock
    _shared_lock = _shared_lock or asyncio.Lock()
    async with _shared_lock:
        if _shared is None or _shared.base_url != base_url:
            _shared = await _probe(Confinement(config, base_url))
            weak = any(k in ("landlock", "mountns") and not v.startswith("turned off")
                       for k, v in _shared.missing.items())
            log.log(logging.WARNING if weak else logging.INFO, _shared.describe())
        return _shared


def _candidates(box: Confinement) -> list[str]:
    disabled = {s.strip() for s in os.environ.get(DISABLE_ENV, "").split(",") if s.strip()}
    root = os.geteuid() == 0
    box.audit_hook = "audit-hook" not in disabled
    box.landlock_abi = landlock.abi()
    if not box.audit_hook:
        box.missing["audit-hook"] = f"turned off by {DISABLE_ENV}"
    box.cgroups, why_no_cgroup = (PidsCgroups.open() if "pids-cgroup" not in disabled
                                  else (None, ""))
    offers = [("pids-cgroup", box.cgroups is not None, why_no_cgroup),
              ("userns", not root, ""), ("mountns", True, ""), ("netns", True, ""),
              ("uid", root, "the daemon is not root"),
              ("landlock", box.landlock_abi > 0, "this kernel has no Landlock, or it is off")]
    wanted = []
    for layer, ok, why in offers:
        if layer in disabled:
            box.missing[layer] = f"turned off by {DISABLE_ENV}"
        elif ok:
            wanted.append(layer)
        elif why:
            box.missing[layer] = why
    return wanted


async def _probe(box: Confinement) -> Confinement:
    wanted = await asyncio.to_thread(_candidates, box)
    for _ in range(len(wanted) + 1):
        box.layers = list(wanted)
        result = await _probe_once(box)
        if result.get("ok"):
            break
        layer = result.get("layer")
        reason = str(result.get("reason"))
        log.info("sandbox probe without %s: %s", layer, reason)
        if layer not in wanted:
            box.missing.update({w: f"the probe sandbox failed: {reason}" for w in wanted})
            wanted = []
            continue
        box.missing[layer] = reason
        wanted.remove(layer)
        if layer == "userns":  # unprivileged namespaces need the user namespace
            for dependent in ("mountns", "netns"):
                if dependent in wanted:
                    wanted.remove(dependent)
                    box.missing[dependent] = "needs a user namespace (not root)"
    box.layers = list(wanted)
    if box.cgroups is not None and "pids-cgroup" not in box.layers:
        box.cgroups.close()
        box.cgroups = None
    if box.cgroups is not None:
        atexit.register(box.cgroups.close)  # empty by then; a crash leaves it to the next start
    return box


def _probe_tree() -> Path:
    """A sandbox root whose workflow returns 1."""
    root = Path(tempfile.mkdtemp(prefix="agentd-probe-"))
    (root / "work").mkdir()
    (root / "work" / "main.py").write_text("def main():\n    return 1\n")
    return root


async def _probe_once(box: Confinement) -> dict[str, Any]:
    root = await asyncio.to_thread(_probe_tree)
    work = root / "work"
    limits = {"memory_mb": 1024, "processes": 64, "disk_mb": 8}
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "AGENTD_DAEMON_URL": box.base_url}
    jail = Jail(box, "probe", limits)
    try:
        with await asyncio.to_thread(open, root / "probe.log", "wb") as log_file:
            proc = await jail.spawn(root, work, log_file, env, probe=True)
            assert isinstance(proc, asyncio.subprocess.Process)  # a probe is always exec'd
            try:
                stdout, _ = await asyncio.wait_for(
                    proc.communicate(json.dumps({"limits": limits}).encode()), PROBE_TIMEOUT_S)
            except TimeoutError:
                await asyncio.to_thread(jail.kill)
                return {"ok": False, "reason": "the probe sandbox did not answer"}
        lines = stdout.decode(errors="replace").strip().splitlines()
        try:
            result: dict[str, Any] = json.loads(lines[-1])
        except (IndexError, ValueError):
            tail = (await asyncio.to_thread((root / "probe.log").read_text,
                                            errors="replace"))[-500:]
            return {"ok": False, "reason": f"exit {proc.returncode}, no result: {tail}"}
        return result
    finally:
        await jail.closed.wait()
        await asyncio.to_thread(_remove_tree, root)


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _read_report(fd: int) -> dict[str, Any] | None:
    """The sandbox's one-line report; None when it ended without one."""
    with os.fdopen(fd, "rb") as f:
        data = f.readline(65536)
    with contextlib.suppress(ValueError):
        report = json.loads(data)
        return report if isinstance(report, dict) else None
    return None


# --- one run ----------------------------------------------------------------------------


class Jail:
    def __init__(self, box: Confinement, run_id: str, limits: dict[str, Any],
                 on_event: Event | None = None) -> None:
        self.box = box
        self.run_id = run_id
        self.limits = limits
        self.layers = list(box.layers)
        self.on_event = on_event
        self.uid: int | None = None
        self.cgroup: Path | None = None
        self.relay_path: Path | None = None
        self.relay: asyncio.AbstractServer | None = None
        self.proc: Process | None = None
        self.work: Path | None = None
        self.killed_for: str | None = None
        self.marks: dict[str, int] = {}  # namespace type -> inode that marks the run's processes
        self.held: dict[str, int] = {}  # namespace type -> fd keeping it alive until the reap
        self.started: int | None = None  # the sandbox's start time (procs.start_time)
        self.closed = asyncio.Event()
        self._supervisor: asyncio.Task[None] | None = None

    async def spawn(self, root: Path, work: Path, stderr: IO[bytes], env: dict[str, str],
                    probe: bool = False) -> Process:
        """The sandbox, forked by the fork server (exec'd for a probe, when the config turns
        the server off, or when it failed): waiting for its spec on stdin."""
        self.work = work
        report_fd = -1
        try:
            conf = {**await self._prepare(root, work), "probe": probe}
            env = self._env(env)
            proc: Process | None = None
            server = None if probe else self.box.fork_server
            if server is not None:
                try:
                    proc, report_fd = await self._start(
                        conf, lambda confine_fd, report_write_fd: server.spawn(
                            work, env, stderr.fileno(), confine_fd, report_write_fd),
                        report_at=REPORT_FD)
                except (ForkServerError, OSError) as exc:
                    log.warning("run %s: the fork server failed (%s); exec'ing its sandbox",
                                self.run_id, exc)
            if proc is None:
                proc, report_fd = await self._start(
                    conf, lambda confine_fd, report_write_fd: self._exec(
                        work, env, stderr, confine_fd, report_write_fd, probe))
            self.proc = proc
            # Now the sandbox waits for its spec on stdin, so this pid is surely it.
            self.started = procs.start_time(proc.pid)
        except BaseException:
            if report_fd >= 0:
                os.close(report_fd)
            await self._close()
            raise
        self._supervisor = asyncio.create_task(self._supervise(proc, report_fd),
                                               name=f"jail-{self.run_id}")
        return proc

    async def _start(self, conf: dict[str, Any],
                     launch: Callable[[int, int], Awaitable[Process]],
                     report_at: int | None = None) -> tuple[Process, int]:
        """Hand the layers to a sandbox `launch` starts (given the confinement pipe's and
        the report pipe's child ends): the report's fd as the child sees it is `report_at`
        where the fork server moves it, else the same number. Answers the process and the
        report's read end."""
        read_fd, write_fd = os.pipe()
        report_fd, report_write_fd = os.pipe()
        try:
            conf = {**conf, "report_fd": report_write_fd if report_at is None else report_at}
            os.write(write_fd, json.dumps(conf).encode())
            os.close(write_fd)
            write_fd = -1
            proc = await launch(read_fd, report_write_fd)
        except BaseException:
            os.close(report_fd)
            raise
        finally:
            for fd in (read_fd, report_write_fd, write_fd):
                if fd >= 0:
                    os.close(fd)
        return proc, report_fd

    async def _exec(self, work: Path, env: dict[str, str], stderr: IO[bytes], confine_fd: int,
                    report_fd: int, probe: bool) -> asyncio.subprocess.Process:
        argv = [sys.executable, "-I", "-m", "daemon.runtime.sandbox", "--confine-fd",
                str(confine_fd), *(["--probe"] if probe else [])]
        return await asyncio.create_subprocess_exec(
            *argv, cwd=work, env=env, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=stderr, start_new_session=True,
            pass_fds=(confine_fd, report_fd))

    async def _prepare(self, root: Path, work: Path) -> dict[str, Any]:
        if "uid" in self.layers:
            self.uid = await asyncio.to_thread(procs.free_uid, self.box.uids)
            self.box.uids.add(self.uid)
            await asyncio.to_thread(_hand_over, root, work, self.uid)
        if "pids-cgroup" in self.layers and self.box.cgroups is not None:
            self.cgroup = self.box.cgroups.create(f"run-{self.run_id}-{os.getpid()}"
                                                  f"-{random.randrange(1 << 30)}",
                                                  int(self.limits.get("processes", 128)))
        if "netns" in self.layers:
            await self._serve_relay(root / "daemon.sock")
        return {"layers": self.layers, "uid": self.uid, "gid": self.uid,
                "cgroup": str(self.cgroup) if self.cgroup else None,
                "hide": self.box.hidden(),
                "relay": str(self.relay_path) if self.relay_path else None,
                "daemon_port": self.box.daemon_address[1],
                "disk_mb": int(self.limits.get("disk_mb", 256)),
                "processes": int(self.limits.get("processes", 128)),
                "audit_hook": self.box.audit_hook}

    def _env(self, env: dict[str, str]) -> dict[str, str]:
        host, port = self.box.daemon_address
        if "netns" in self.layers:
            host = "127.0.0.1"  # the relay listens there inside the namespace
        return {**env, "AGENTD_DAEMON_URL": f"http://{host}:{port}"}

    async def _serve_relay(self, path: Path) -> None:
        host, port = self.box.daemon_address

        async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            writer.close()

        async def connection(reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
            try:
                up_reader, up_writer = await asyncio.open_connection(host, port)
            except OSError:
                writer.close()
                return
            await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

        self.relay = await asyncio.start_unix_server(connection, path=str(path))
        self.relay_path = path
        if self.uid is not None:
            os.chown(path, self.uid, self.uid)
        os.chmod(path, 0o600)

    # --- while it runs, and after -------------------------------------------------------

    def _take_report(self, fd: int) -> dict[str, Any] | None:
        """The sandbox's own account, written before user code: the layers it applied and
        the namespaces it entered. Those that differ from the daemon's mark its processes,
        once held: at once, in this thread, as the sandbox goes on and could soon end."""
        report = _read_report(fd)
        if report is None or self.proc is None:
            return report
        entered = {kind: inode for kind, inode in (report.get("ns") or {}).items()
                   if kind in NAMESPACES and isinstance(inode, int)
                   and inode != os.stat(f"/proc/self/ns/{kind}").st_ino}
        self.held = procs.hold_namespaces(self.proc.pid, self.started, entered)
        self.marks = {kind: entered[kind] for kind in self.held}
        if len(self.held) < len(entered):
            log.warning("run %s ended before its namespaces (%s) could be held; what it left "
                        "there is found by process group, cgroup and uid only", self.run_id,
                        ", ".join(sorted(set(entered) - set(self.held))))
        return report

    def _on_report(self, report: dict[str, Any]) -> None:
        layers = list(report.get("layers") or [])
        if "tmpfs-quota" not in layers:
            layers.append("disk-watchdog")
        layers += [*ALWAYS, *(["audit-hook"] if self.box.audit_hook else [])]
        if self.on_event is not None:
            self.on_event("run.confined", layers=layers, uid=self.uid,
                          not_active=self.box.missing)

    async def _supervise(self, proc: Process, report_fd: int) -> None:
        try:
            report = await asyncio.to_thread(self._take_report, report_fd)
            if report is not None:
                self._on_report(report)
            if "mountns" not in self.layers:
                await self._watch_disk(proc)
            await proc.wait()
        finally:
            try:
                killed, refused = await asyncio.to_thread(self._reap)
            except Exception:
                log.exception("could not reap the processes of run %s", self.run_id)
                killed, refused = -1, -1
            if self.on_event is not None:
                self.on_event("run.reaped", processes_killed=killed, forks_refused=refused)
            await self._close()

    async def _watch_disk(self, proc: Process) -> None:
        """No tmpfs quota: measure the working directory and stop the run past its quota.
        It can overshoot by what the run writes in one interval (RLIMIT_FSIZE bounds each
        file); the tmpfs quota cannot."""
        limit = int(self.limits.get("disk_mb", 256)) * 2**20
        while self.work is not None and proc.returncode is None:
            used = await asyncio.to_thread(procs.du, self.work)
            if used > limit:
                self.killed_for = (f"disk quota exceeded ({limit >> 20} MiB working directory; "
                                   f"{used >> 20} MiB written)")
                await asyncio.to_thread(self.kill)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), WATCH_INTERVAL_S)

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self.cgroup is not None and self.box.cgroups is not None:
            self.box.cgroups.kill(self.cgroup)

    def _reap(self) -> tuple[int, int]:
        """Kill whatever the run left behind: by cgroup, by uid, by process group."""
        killed, refused = 0, 0
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self.cgroup is not None and self.box.cgroups is not None:
            refused = self.box.cgroups.refused(self.cgroup)
            killed = self.box.cgroups.remove(self.cgroup)
        if self.uid is not None:
            killed = max(killed, procs.kill_uid(self.uid))
        if self.marks:
            killed = max(killed, procs.kill_marked(self.marks))
        return killed, refused

    async def _close(self) -> None:
        procs.release(self.held)  # after the last kill by mark: see the module docstring
        if self.relay is not None:
            self.relay.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.relay.wait_closed(), 5)
        if self.uid is not None:
            self.box.uids.discard(self.uid)
        self.closed.set()

    def explain(self, outcome: dict[str, Any]) -> dict[str, Any]:
        """The run's outcome, with the reason when this jail is what stopped it."""
        if self.killed_for is None:
            return outcome
        return {"ok": False, "kind": "system", "reason": self.killed_for}


def _hand_over(root: Path, work: Path, uid: int) -> None:
    """The run's uid owns its working directory; the run root stays the daemon's (the log
    file is there), enterable but not listable."""
    root.chmod(0o711)
    work.chmod(0o700)  # other runs' uids must not read its bundle or what it writes
    for dirpath, dirnames, filenames in os.walk(work):
        os.chown(dirpath, uid, uid)
        for name in [*dirnames, *filenames]:
            os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)
