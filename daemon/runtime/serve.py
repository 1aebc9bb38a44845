"""`python -m daemon.runtime.serve start ...`: `agentd start` with the workflow runtime.

Until `install_workflows(app)` is wired into daemon/app.py's create_app, this entry point
runs the same daemon (same CLI, same flags) with the workflow routes installed; the
integration tests use it. Once wired, it is equivalent to `python -m daemon.cli`.
"""

from __future__ import annotations

import sys
from typing import Any

from daemon import app as app_module
from daemon import cli
from daemon.runtime.wiring import install_workflows

_create_app = app_module.create_app


def create_app(config: Any) -> Any:
    app = _create_app(config)
    install_workflows(app)
    return app


def main() -> int:
    app_module.create_app = create_app  # cmd_start imports create_app at call time
    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
