"""The few Linux calls the sandbox's confinement needs that the standard library lacks.

Thin ctypes wrappers: each raises OSError naming the call on failure. Only the sandbox's
start-up (daemon/runtime/sandbox/isolation.py) uses them, before any workflow code runs
and before the audit hook (which refuses ctypes) is installed.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_REC = 0x4000
MS_PRIVATE = 0x40000

# Syscall numbers from 424 on are the same on every architecture.
SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
OPEN_TREE_CLONE = 0x1
AT_RECURSIVE = 0x8000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
AT_FDCWD = -100

PR_SET_NO_NEW_PRIVS = 38
_CAP_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def syscall(number: int, *args: object) -> int:
    return int(_libc.syscall(ctypes.c_long(number), *args))


def unshare(flags: int) -> None:
    check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def mount(source: str | None, target: str, fstype: str | None, flags: int,
          data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return None if s is None else os.fsencode(s)

    check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags),
                       enc(data)), f"mount {fstype or ''} on {target}")


def clone_tree(path: str) -> int:
    """A detached copy of the mount tree at `path` (an fd), to attach elsewhere later."""
    flags = OPEN_TREE_CLONE | os.O_CLOEXEC | AT_RECURSIVE
    return check(syscall(SYS_OPEN_TREE, ctypes.c_int(AT_FDCWD), os.fsencode(path),
                          ctypes.c_uint(flags)), f"open_tree {path}")


def attach_tree(fd: int, target: str) -> None:
    check(syscall(SYS_MOVE_MOUNT, ctypes.c_int(fd), b"", ctypes.c_int(AT_FDCWD),
                   os.fsencode(target), ctypes.c_uint(MOVE_MOUNT_F_EMPTY_PATH)),
           f"move_mount onto {target}")


def no_new_privs() -> None:
    check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")


def drop_capabilities() -> None:
    """Empty effective, permitted and inheritable sets (the ambient set follows)."""
    header = struct.pack("Ii", _CAP_VERSION_3, 0)
    data = bytes(24)  # two {effective, permitted, inheritable} u32 triples
    check(_libc.capset(header, data), "capset")


def loopback_up() -> None:
    """Bring `lo` up in a fresh network namespace (it starts down)."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sh22x", b"lo", 0)
        flags = struct.unpack("16sh22x", fcntl.ioctl(s, siocgifflags, req))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sh22x", b"lo", flags | iff_up))
