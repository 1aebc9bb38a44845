"""The worker key: the shared secret an engine worker presents when it registers.

Reaching the worker socket (the ipc file in the data dir, or a `worker_bind` TCP port)
is not enough to receive prompts: a worker must also be able to read the key file,
which the daemon creates mode 0600 next to its operator token on first start. Workers
the supervisor starts get its path; workers on other machines get a copy
(`agentd worker --key-file FILE`). On TCP the same key also keys the socket's CurveZMQ
encryption (daemon/workers/curve.py), so rotating it (delete the file, restart the
daemon) cuts off old copies at the handshake.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from daemon.config import default_config_dir

log = logging.getLogger("agentd.worker_key")

WORKER_KEY_FILE = "worker.key"


class WorkerKeyError(Exception):
    """The key file cannot be used; the message says which file and why."""


def key_path(config_dir: Path) -> Path:
    return config_dir / WORKER_KEY_FILE


def default_key_path(env: Mapping[str, str] | None = None) -> Path:
    """Where a worker on the daemon's own host finds the key: the daemon's config dir."""
    env = os.environ if env is None else env
    config_dir = env.get("AGENTD_CONFIG_DIR") or default_config_dir()
    return key_path(Path(config_dir))


def ensure_worker_key(config_dir: Path) -> str:
    """The daemon's key, created on first start; kept across restarts so that remote
    workers that outlive a crashed daemon register again with the key they hold (local
    ones die with it: daemon/workers/local.py)."""
    # Imported here: daemon.access.auth imports the API layer, which imports the core, which
    # imports this module.
    from daemon.access.auth import write_token_file

    path = key_path(config_dir)
    if not path.exists():
        write_token_file(path, "agw_" + secrets.token_urlsafe(32))
        log.info("created the worker key %s; remote workers need a copy (--key-file)", path)
    return read_worker_key(path)


def read_worker_key(path: Path) -> str:
    try:
        key = path.read_text().strip()
    except OSError as exc:
        raise WorkerKeyError(
            f"cannot read the worker key file {path}: {exc.strerror or exc}; copy "
            f"<config dir>/{WORKER_KEY_FILE} from the daemon's host and pass --key-file"
        ) from exc
    if not key:
        raise WorkerKeyError(f"the worker key file {path} is empty")
    return key


def key_matches(expected: str, presented: str) -> bool:
    # Constant time, so response timing does not reveal how much of a guess was right.
    return hmac.compare_digest(expected.encode(), presented.encode())
