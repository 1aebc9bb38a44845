"""A real, throwaway PostgreSQL server for tests: `initdb` into a temp dir, `postgres` on a
free loopback port (its unix socket in the same dir), one database per test (or module),
dropped afterwards, the server stopped at the end of the session.

The binaries come from PATH or Debian's /usr/lib/postgresql/<version>/bin. Without them the
PostgreSQL tests skip, saying why, unless AGENTD_REQUIRE_POSTGRES=1 (CI), where that is a
failure. initdb refuses to run as root, so as root the server runs as the `postgres` user
(Debian's package makes it) or `nobody`, in a temp dir that user owns.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import pytest

from tests.daemon_process import free_port
from tests.waiting import wait_for

USER = "agentd"  # the database superuser initdb makes; loopback and socket trust it


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("AGENTD_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"AGENTD_REQUIRE_POSTGRES=1 but {reason}")
    pytest.skip(reason)


def find_bin_dir() -> Path | None:
    """The directory holding initdb and postgres: PATH first, then Debian's layout
    (newest version first), which the package does not put on PATH."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("postgres"):
        return Path(on_path).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                      key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
                      reverse=True)
    for bin_dir in versions:
        if (bin_dir / "initdb").exists() and (bin_dir / "postgres").exists():
            return bin_dir
    return None


def _run_as() -> pwd.struct_passwd | None:
    """The unprivileged user to run the server as when we are root; None when not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    unavailable("running as root and neither a 'postgres' nor a 'nobody' user exists")


@dataclass
class PostgresServer:
    bin_dir: Path
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="agentd-pg-")))
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    _names: itertools.count[int] = field(default_factory=itertools.count)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        return self.root / "postgres.log"

    def _popen_kw(self) -> dict[str, object]:
        user = _run_as()
        if user is None:
            return {}
        return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": [],
                "env": {**os.environ, "HOME": str(self.root)}}

    def start(self) -> PostgresServer:
        user = _run_as()
        if user is not None:
            # mkdtemp made it 0700 root's: hand it to the server's user
            os.chown(self.root, user.pw_uid, user.pw_gid)
        kw = self._popen_kw()
        init = subprocess.run(
            [str(self.bin_dir / "initdb"), "-D", str(self.data_dir), "-U", USER,
             "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"],
            capture_output=True, text=True, timeout=120, **kw)  # type: ignore[call-overload]
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed ({init.returncode}): {init.stderr[-2000:]}")
        with open(self.log_path, "wb") as log:
            # durability is not what these tests check: fsync off keeps them fast
            self.proc = subprocess.Popen(
                [str(self.bin_dir / "postgres"), "-D", str(self.data_dir),
                 "-p", str(self.port), "-k", str(self.root),
                 "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                 "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                 "-c", "max_connections=300"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                **kw)  # type: ignore[call-overload]
        wait_for(self._accepting, 60, lambda: f"postgres to accept connections:\n{self.log()}")
        return self

    def _accepting(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"postgres exited with {self.proc.returncode}:\n{self.log()}")
        try:
            self._admin("SELECT 1")
        except Exception:
            return False
        return True

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=USER, dbname="postgres",
                             autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql)

    def create_database(self) -> str:
        """A new empty database; returns its name."""
        name = f"agentd_test_{os.getpid()}_{next(self._names)}"
        self._admin(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        # FORCE: a daemon killed mid-test may leave connections the server has not reaped
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def url(self, database: str, driver: str = "asyncpg") -> str:
        return f"postgresql+{driver}://{USER}@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown: aborts open sessions
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.root, ignore_errors=True)


def start_server() -> PostgresServer:
    bin_dir = find_bin_dir()
    if bin_dir is None:
        unavailable("PostgreSQL's initdb/postgres are not installed (apt-get install postgresql)")
    return PostgresServer(bin_dir).start()
