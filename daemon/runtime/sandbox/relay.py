"""The network namespace's one way out: a relay from 127.0.0.1:<daemon port> inside it
to a unix socket the daemon serves (daemon/runtime/confine.py), which forwards to the
daemon's own port. Pathname unix sockets are reachable across network namespaces;
nothing else leaves, so the daemon URL the runtime uses stays the same."""

from __future__ import annotations

import selectors
import socket
import threading

from daemon.runtime.sandbox import linux


class Relay:
    """127.0.0.1:<daemon port> inside the namespace -> the daemon's unix socket.

    The listening socket is bound before Landlock (which then forbids binding); the
    thread starts after it, so that it is confined like every other thread."""

    def __init__(self, port: int, target: str) -> None:
        self.target = target
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", port))
        self.listener.listen(64)

    def start(self) -> None:
        threading.Thread(target=self._loop, name="agentd-relay", daemon=True).start()

    def _loop(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.listener, selectors.EVENT_READ)
        peer: dict[socket.socket, socket.socket] = {}
        while True:
            for key, _ in sel.select():
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                if sock is self.listener:
                    self._accept(sel, peer)
                    continue
                try:
                    data = sock.recv(65536)
                    if data:
                        peer[sock].sendall(data)
                        continue
                except OSError:
                    pass
                other = peer.pop(sock)
                peer.pop(other, None)
                for s in (sock, other):
                    sel.unregister(s)
                    s.close()

    def _accept(self, sel: selectors.BaseSelector,
                peer: dict[socket.socket, socket.socket]) -> None:
        client, _ = self.listener.accept()
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(self.target)
        except OSError:
            client.close()
            upstream.close()
            return
        peer[client], peer[upstream] = upstream, client
        sel.register(client, selectors.EVENT_READ)
        sel.register(upstream, selectors.EVENT_READ)


def network_namespace(port: int, target: str) -> Relay:
    linux.unshare(linux.CLONE_NEWNET)
    linux.loopback_up()
    return Relay(port, target)
