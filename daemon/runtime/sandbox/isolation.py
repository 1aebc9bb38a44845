"""Kernel-level confinement of a sandbox process, applied by itself before any user code.

The daemon decides which layers a run gets (daemon/runtime/confine.py probes what this
machine allows) and hands them over on a private pipe; `apply()` puts them in place in
this order, and fails closed: a layer that was asked for and cannot be applied ends the
run with a ConfinementError naming the layer, never a run with less confinement.

1. pids-cgroup: join the run's cgroup, whose pids.max bounds processes and threads.
2. userns (daemon not root): a user namespace mapping only our own uid, so that the
   mount and network namespaces below need no privilege.
3. mountns: a private mount namespace. Empty read-only tmpfs over the directories the run
   must not see (/tmp, /run, the daemon's home, data and config dirs...), with the Python
   code it needs mounted back; the working directory becomes a tmpfs of `disk_mb`, so
   filling it fills neither the disk nor anything else.
4. netns: a network namespace with only loopback; the daemon is reachable through a unix
   socket the daemon serves, relayed by a thread on 127.0.0.1:<daemon port>.
5. uid (daemon is root): a uid/gid of its own for the run, no supplementary groups, so
   RLIMIT_NPROC counts only the run's processes, and file modes keep it from the daemon's
   files and from other runs.
6. nproc: RLIMIT_NPROC (root ignores it, so only with uid, userns, or a non-root daemon).
7. landlock: read-only code and system paths, read-write working directory, no execve at
   all, TCP connect to the daemon's port only, no signals or abstract sockets outside.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import stat
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from daemon.runtime.sandbox import landlock, linux
from daemon.runtime.sandbox.relay import Relay, network_namespace

# Read-only system paths a Python program legitimately needs (libraries, certificates,
# time zones, resolver files, its own /proc entry). Shared with the audit hook.
SYSTEM_READ = ("/usr", "/lib", "/lib64", "/lib32", "/etc/ssl", "/etc/ca-certificates",
               "/etc/pki", "/etc/localtime", "/etc/hosts", "/etc/resolv.conf",
               "/etc/nsswitch.conf", "/etc/host.conf", "/etc/gai.conf", "/etc/ld.so.cache",
               "/etc/mime.types", "/dev/null", "/dev/urandom", "/dev/random", "/dev/zero",
               "/proc/self", "/sys/devices/system/cpu")
HIDDEN_TMPFS = "size=64k,nr_inodes=1024,mode=0755"


class ConfinementError(Exception):
    def __init__(self, layer: str, message: str) -> None:
        super().__init__(message)
        self.layer = layer


@dataclass
class Confined:
    layers: list[str] = field(default_factory=list)
    relay: Relay | None = None


def _dirs(paths: set[str]) -> list[str]:
    return sorted({os.path.realpath(p) for p in paths if p and os.path.isdir(p)})


# What a run imports after confinement: the SDK and the pure scheduling code it uses.
SDK_PACKAGES = ("agentd", "scheduling")


def package_dirs(names: tuple[str, ...] = SDK_PACKAGES) -> list[str]:
    """The packages' directories, found without importing them."""
    dirs = []
    for name in names:
        spec = importlib.util.find_spec(name)
        dirs += list(spec.submodule_search_locations or []) if spec is not None else []
    return dirs


def install_roots() -> list[str]:
    """The interpreter's installation: prefixes, stdlib, site dirs, this sandbox's own code
    and the packages a run imports (SDK_PACKAGES)."""
    paths = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths |= {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(__file__).parent),
              *package_dirs()}
    return _dirs(paths)


def code_roots() -> list[str]:
    """Everything code is read from: the installation and the rest of sys.path."""
    return _dirs({*install_roots(), *sys.path})


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _outermost(paths: list[str]) -> list[str]:
    out: list[str] = []
    for p in sorted(set(paths), key=len):
        if not any(_under(p, q) for q in out):
            out.append(p)
    return out


def _step(layer: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except ConfinementError:
        raise
    except Exception as exc:
        raise ConfinementError(layer, f"{type(exc).__name__}: {exc}") from exc


# --- layers -----------------------------------------------------------------------


def join_cgroup(path: str) -> None:
    with open(os.path.join(path, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    with open("/proc/self/cgroup") as f:
        if path.rstrip("/").rsplit("/", 1)[-1] not in f.read():
            raise OSError("the process is not in the run's cgroup after joining it")


def enter_user_namespace() -> None:
    uid, gid = os.getuid(), os.getgid()
    linux.unshare(linux.CLONE_NEWUSER)
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                       ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def _untraversable(roots: list[str]) -> list[str]:
    """The first ancestor of each root that another uid could not walk through."""
    out = []
    for root in roots:
        parts = Path(root).parts
        for i in range(2, len(parts) + 1):
            ancestor = str(Path(*parts[:i]))
            if not os.stat(ancestor).st_mode & stat.S_IXOTH:
                out.append(ancestor)
                break
    return out


def _snapshot(workdir: Path) -> list[tuple[str, bytes | None, int]]:
    """The bundle copy (at most ~1 MiB), to write back onto the tmpfs mounted over it."""
    items: list[tuple[str, bytes | None, int]] = []
    for dirpath, dirnames, filenames in os.walk(workdir):
        for d in dirnames:
            full = os.path.join(dirpath, d)
            items.append((os.path.relpath(full, workdir), None, os.stat(full).st_mode))
        for name in filenames:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as f:
                items.append((os.path.relpath(full, workdir), f.read(), os.stat(full).st_mode))
    return items


def _restore(items: list[tuple[str, bytes | None, int]], workdir: Path,
             owner: tuple[int, int] | None) -> None:
    for rel, data, mode in items:
        path = workdir / rel
        if data is None:
            path.mkdir(mode=stat.S_IMODE(mode), exist_ok=True)
        else:
            path.write_bytes(data)
            path.chmod(stat.S_IMODE(mode))
        if owner is not None:
            os.chown(path, *owner)


def private_mounts(conf: dict[str, Any], workdir: Path, roots: list[str]) -> None:
    linux.unshare(linux.CLONE_NEWNS)
    linux.mount(None, "/", None, linux.MS_REC | linux.MS_PRIVATE)
    owner = (conf["uid"], conf["gid"]) if conf.get("uid") is not None else None
    hide = [os.path.realpath(h) for h in conf.get("hide", []) if os.path.isdir(h)]
    if owner is not None:
        hide += _untraversable(roots)
    hide = [h for h in _outermost(hide) if h != "/"]
    keep = [r for r in roots if any(_under(r, h) for h in hide)]
    if conf.get("relay"):
        keep.append(conf["relay"])
    clones = [(p, linux.clone_tree(p), os.path.isdir(p)) for p in _outermost(keep)]
    files = _snapshot(workdir)
    flags = linux.MS_NOSUID | linux.MS_NODEV | linux.MS_NOEXEC
    for h in hide:
        linux.mount("tmpfs", h, "tmpfs", flags, HIDDEN_TMPFS)
    for path, fd, is_dir in clones:
        if is_dir:
            os.makedirs(path, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(path), mode=0o711, exist_ok=True)
            open(path, "ab").close()
        linux.attach_tree(fd, path)
        os.close(fd)
    os.makedirs(workdir.parent, mode=0o711, exist_ok=True)
    os.makedirs(workdir, exist_ok=True)
    mb = int(conf["disk_mb"])
    quota = f"size={mb}m,nr_inodes={max(4096, mb * 64)},mode=0700"
    if owner is not None:
        quota += f",uid={owner[0]},gid={owner[1]}"
    linux.mount("tmpfs", str(workdir), "tmpfs", flags, quota)
    _restore(files, workdir, owner)
    for h in hide:
        linux.mount(None, h, None, linux.MS_REMOUNT | linux.MS_RDONLY | flags)
    os.chdir(workdir)


def drop_to_uid(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getgroups():
        raise OSError("the uid change did not take")


def _tasks_of(uid: int) -> int:
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        if int(fields.get("Uid", "-1 0").split()[0]) == uid:
            count += int(fields.get("Threads", "1"))
    return count


def limit_processes(processes: int, own_uid: bool) -> None:
    """RLIMIT_NPROC counts every process and thread of the real uid: with a uid or user
    namespace of its own that is the run's alone; else the uid's others count too."""
    limit = processes if own_uid else _tasks_of(os.getuid()) + processes
    resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))


def restrict_with_landlock(workdir: Path, roots: list[str], daemon_port: int) -> list[str]:
    rules = landlock.Ruleset(landlock.abi())
    for path in (*roots, *SYSTEM_READ):
        rules.allow_path(path, landlock.READ)
    rules.allow_path("/dev/null", landlock.READ_FILE | landlock.WRITE_FILE)
    rules.allow_path(str(workdir), landlock.WRITE)
    rules.allow_connect(daemon_port)
    rules.restrict()
    return rules.layers()


# --- self-checks (probe mode) -------------------------------------------------------


def check_code_readable() -> None:
    """The files a run imports are readable: the stdlib, the SDK, a third-party package."""
    spec = importlib.util.find_spec("httpx")
    files = [os.path.join(sysconfig.get_paths()["stdlib"], "os.py"),
             *(os.path.join(d, "__init__.py") for d in package_dirs()),
             spec.origin if spec is not None and spec.origin else ""]
    for path in files:
        with open(path, "rb") as f:
            f.read(1)


def check_workdir(workdir: Path, disk_mb: int | None) -> None:
    probe = workdir / ".probe"
    probe.write_bytes(b"ok")
    if probe.read_bytes() != b"ok":
        raise OSError("cannot write the working directory")
    probe.unlink()
    if disk_mb is not None:
        st = os.statvfs(workdir)
        size_mb = st.f_blocks * st.f_frsize / 2**20
        if abs(size_mb - disk_mb) > 1:
            raise OSError(f"the working directory holds {size_mb:.0f} MiB, not {disk_mb}")


# --- all of it ----------------------------------------------------------------------


def apply(conf: dict[str, Any], workdir: Path) -> Confined:
    want = set(conf.get("layers", ()))
    probe = bool(conf.get("probe"))
    done = Confined()
    roots = code_roots()
    if "pids-cgroup" in want:
        _step("pids-cgroup", join_cgroup, conf["cgroup"])
        done.layers.append("pids-cgroup")
    if "userns" in want:
        _step("userns", enter_user_namespace)
        done.layers.append("userns")
    if "mountns" in want:
        _step("mountns", private_mounts, conf, workdir, roots)
        if probe:
            _step("mountns", check_workdir, workdir, int(conf["disk_mb"]))
            _step("mountns", check_code_readable)
        done.layers += ["mountns", "tmpfs-quota"]
    if "netns" in want:
        target = conf["relay"]
        done.relay = _step("netns", network_namespace, int(conf["daemon_port"]), target)
        done.layers.append("netns")
    if "uid" in want:
        _step("uid", drop_to_uid, int(conf["uid"]), int(conf["gid"]))
        if probe:
            _step("uid", check_code_readable)
            _step("uid", check_workdir, workdir, None)
        done.layers.append("uid")
    if "userns" in want:
        _step("userns", linux.drop_capabilities)
    if conf.get("processes") and (os.getuid() != 0 or "uid" in want):
        own = "uid" in want or "userns" in want
        # With the cgroup too, it binds exactly (and counts refusals); this is the backstop.
        slack = 16 if "pids-cgroup" in want else 0
        _step("nproc", limit_processes, int(conf["processes"]) + slack, own)
        done.layers.append("nproc")
    if "landlock" in want:
        port = int(conf["daemon_port"])
        done.layers += _step("landlock", restrict_with_landlock, workdir, roots, port)
        if probe:
            _step("landlock", check_code_readable)
            _step("landlock", check_workdir, workdir, None)
    return done
