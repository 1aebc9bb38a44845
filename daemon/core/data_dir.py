"""The daemon's data and config dirs, and its SQLite store, are its owner's alone from the
first start, before anything is written to them: the dirs 0700, the database file and
SQLite's side files 0600 (db/engine.py `make_private`). Dirs an older version left open
are tightened the same way. Sandboxes run as other uids, and other local users are not
trusted with the store (docs/threat-model.md)."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from daemon.config import Config
from db.engine import make_private

log = logging.getLogger("agentd")


def prepare(cfg: Config) -> None:
    """Everything the daemon keeps on disk, made private before it serves."""
    private_dir(cfg.data_path)
    if cfg.config_path.is_dir():  # else created 0700 with the first token file
        private_dir(cfg.config_path)
    make_private(cfg.db_url)


def private_dir(path: Path) -> None:
    """Create `path` 0700, or take group and other users' access from it. A dir this user
    does not own, or a shared one (sticky bit, like /tmp), keeps its mode: it is not ours
    to close."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = path.stat()
    mode = stat.S_IMODE(st.st_mode)
    if not mode & 0o077:
        return
    if st.st_uid != os.geteuid() or mode & stat.S_ISVTX:
        log.warning("%s is open to other users (mode %o) and is not the daemon's own dir to "
                    "close; give the daemon a dir of its own", path, mode)
        return
    path.chmod(mode & 0o700)
    log.info("removed other users' access to %s (was mode %o)", path, mode)
