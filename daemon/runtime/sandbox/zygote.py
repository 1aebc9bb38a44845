"""`python -I -m daemon.runtime.sandbox.zygote FD`: the daemon's fork server for sandboxes.

A sandbox started by exec pays a Python start and its imports each time: about 0.2 s of
CPU, which 32 runs started together queue behind each other on a small machine. This
process pays them once and forks a sandbox per run; the child then does exactly what an
exec'd sandbox does (daemon/runtime/sandbox/entry.py: confine itself, then run the entry).

It holds nothing of any run. It is started with the sandboxes' fixed environment, and a
request carries only the five descriptors the child is to use. The run's environment and
working directory reach the child as the first line of its own stdin, and the spec after
it, written by the daemon straight into that socket: never through this process, whose
memory every later child inherits. It stays single-threaded, so that a child may unshare a
user namespace as an exec'd sandbox does.

Protocol on FD (a SOCK_SEQPACKET socketpair end): the daemon sends b"spawn" with the fds
[stdin, stdout (socket pairs), stderr (the run's log), confine, report (pipes)] (SCM_RIGHTS);
this answers b"pid N"; when a child ends, b"exit N CODE" (CODE negative: the signal, as
subprocess reports it). End of file on FD: the daemon is gone, so this exits; its children
run on to their own ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import sys
import traceback

# What every sandbox imports before its entry runs: paid here once.
import agentd.context
import agentd.future
import agentd.runtime  # noqa: F401
from daemon.runtime.sandbox import entry

FDS = 5  # stdin, stdout, stderr, the confinement pipe, the report pipe
CONFINE_FD, REPORT_FD = 3, 4  # where a child finds the last two


def _child(server: socket.socket, fds: list[int]) -> None:
    """In the forked child: become what `python -I -m daemon.runtime.sandbox` would be."""
    server.close()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    # Above every target first, so that no dup2 overwrites a descriptor still to be moved.
    high = [os.dup(fd) for fd in fds]
    for target, fd in enumerate(high):
        os.dup2(fd, target)
    os.closerange(FDS, os.sysconf("SC_OPEN_MAX"))
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 (the process's stdin for its life)
    start = json.loads(sys.stdin.readline())
    os.chdir(start["cwd"])
    os.environ.clear()
    os.environ.update(start["env"])
    sys.argv = [entry.__file__, "--confine-fd", str(CONFINE_FD)]
    code = 70  # EX_SOFTWARE: the entry failed before writing its result
    try:
        code = entry.main()
    except BaseException:
        traceback.print_exc()  # to fd 2: the run's log
    finally:
        os._exit(code)


def _reap(server: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        with contextlib.suppress(OSError):
            server.send(f"exit {pid} {code}".encode())


def serve(server: socket.socket) -> None:
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd is what wakes the loop
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fileobj == wake_r:
                os.read(wake_r, 512)
                _reap(server)
                continue
            message, fds, _, _ = socket.recv_fds(server, 64, FDS)
            if not message:
                return  # the daemon closed its end
            if message != b"spawn" or len(fds) != FDS:
                for fd in fds:
                    os.close(fd)
                server.send(b"error bad request")
                continue
            try:
                pid = os.fork()
            except OSError as exc:
                server.send(f"error {exc}".encode())
            else:
                if pid == 0:
                    _child(server, fds)
                server.send(f"pid {pid}".encode())
            finally:
                for fd in fds:
                    os.close(fd)


def main() -> int:
    server = socket.socket(fileno=int(sys.argv[1]))
    serve(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
