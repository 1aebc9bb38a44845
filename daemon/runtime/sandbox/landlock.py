"""Landlock (Linux 5.13+): a kernel-enforced allow-list of paths and TCP ports.

A ruleset handles every access right the running kernel knows (its ABI version says
which); anything handled and not granted by a rule is refused with EACCES, to root as
well. `restrict()` applies it to the calling thread and every thread and process it
starts afterwards, never to threads that already exist: call it before starting any.

ABI 1-3: files (3 adds truncate) · 4: TCP bind/connect by port · 5: device ioctls ·
6: scoping of abstract unix sockets and signals to the sandbox's own domain.
"""

from __future__ import annotations

import ctypes
import os
import stat
import struct

from daemon.runtime.sandbox import linux

_CREATE, _ADD_RULE, _RESTRICT = 444, 445, 446
_CREATE_VERSION = 1
_RULE_PATH, _RULE_PORT = 1, 2

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
BIND_TCP, CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1

READ = READ_FILE | READ_DIR
# Everything a program may do inside its own directory, except executing files.
WRITE = (READ | WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_DIR | MAKE_REG | MAKE_SOCK
         | MAKE_FIFO | MAKE_SYM | REFER | TRUNCATE)
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV


def abi() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is missing or disabled."""
    try:
        version = linux.syscall(_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_VERSION))
    except OSError:
        return 0
    return max(0, version)


def _handled_fs(version: int) -> int:
    mask = (1 << 13) - 1
    if version >= 2:
        mask |= REFER
    if version >= 3:
        mask |= TRUNCATE
    if version >= 5:
        mask |= IOCTL_DEV
    return mask


class Ruleset:
    def __init__(self, version: int) -> None:
        if version < 1:
            raise OSError(95, "Landlock is not available in this kernel")
        self.version = version
        self.handled_fs = _handled_fs(version)
        self.handles_net = version >= 4
        net = BIND_TCP | CONNECT_TCP if self.handles_net else 0
        scoped = SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL if version >= 6 else 0
        attr = struct.pack("QQQ", self.handled_fs, net, scoped)
        size = 24 if version >= 6 else 16 if version >= 4 else 8
        self.fd = linux.check(linux.syscall(_CREATE, attr[:size], ctypes.c_size_t(size),
                                             ctypes.c_uint32(0)), "landlock_create_ruleset")

    def allow_path(self, path: str, access: int) -> bool:
        """Grant `access` beneath `path` (or on the file); False if it does not exist."""
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            access &= self.handled_fs
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                access &= _FILE_RIGHTS
            rule = struct.pack("=Qi", access, fd)
            linux.check(linux.syscall(_ADD_RULE, ctypes.c_int(self.fd), ctypes.c_int(_RULE_PATH),
                                       rule, ctypes.c_uint32(0)), f"landlock rule for {path}")
        finally:
            os.close(fd)
        return True

    def allow_connect(self, port: int) -> None:
        if not self.handles_net:
            return
        rule = struct.pack("QQ", CONNECT_TCP, port)
        linux.check(linux.syscall(_ADD_RULE, ctypes.c_int(self.fd), ctypes.c_int(_RULE_PORT),
                                   rule, ctypes.c_uint32(0)), f"landlock rule for port {port}")

    def restrict(self) -> None:
        linux.no_new_privs()
        try:
            linux.check(linux.syscall(_RESTRICT, ctypes.c_int(self.fd), ctypes.c_uint32(0)),
                         "landlock_restrict_self")
        finally:
            os.close(self.fd)

    def layers(self) -> list[str]:
        names = ["landlock-fs"]
        if self.handles_net:
            names.append("landlock-net")
        if self.version >= 6:
            names.append("landlock-scope")
        return names
