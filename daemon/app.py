"""App assembly: the store, the core, local workers and the Litestar app, built from a Config."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig

from daemon.api.errors import EXCEPTION_HANDLERS
from daemon.api.gateway import GatewayController
from daemon.api.rest import OpsController, RestController
from daemon.config import Config
from daemon.core import Core
from daemon.supervisor import Supervisor
from db.engine import make_engine, make_sessionmaker, upgrade
from db.writer import BatchWriter

log = logging.getLogger("agentd")


class Daemon:
    """Owns every long-lived part; `run()` is the lifespan of the app."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.core: Core | None = None
        self.supervisor: Supervisor | None = None

    @asynccontextmanager
    async def lifespan(self, _app: Litestar) -> AsyncIterator[None]:
        cfg = self.config
        cfg.data_path.mkdir(parents=True, exist_ok=True)
        await upgrade(cfg.db_url)
        engine = make_engine(cfg.db_url)
        writer = BatchWriter(engine)
        writer.start()
        core = Core(cfg, writer, make_sessionmaker(engine))
        await core.load_known_sessions()
        await core.start()
        self.core = core
        writer.trace("daemon.started", endpoint=core.broker.endpoint)
        self.supervisor = Supervisor(cfg, core.broker.endpoint, on_event=writer.trace)
        await self.supervisor.start()
        log.info("agentd serving on %s (store %s, workers on %s)",
                 cfg.base_url, cfg.db_url, core.broker.endpoint)
        try:
            yield
        finally:
            log.info("agentd stopping")
            await self.supervisor.stop()
            await core.stop()
            writer.trace("daemon.stopped")
            await writer.stop()
            await engine.dispose()

    def get_core(self) -> Core:
        assert self.core is not None, "the daemon has not started"
        return self.core


def create_app(config: Config) -> Litestar:
    daemon = Daemon(config)
    return Litestar(
        route_handlers=[GatewayController, RestController, OpsController],
        dependencies={"core": Provide(daemon.get_core, sync_to_thread=False)},
        lifespan=[daemon.lifespan],
        exception_handlers=EXCEPTION_HANDLERS,
        request_max_body_size=config.max_body_bytes,
        openapi_config=OpenAPIConfig(title="agentd", version="0.1.0", path="/schema"),
        debug=False,
        logging_config=None,
        state={"daemon": daemon},
    )


def app_daemon(app: Litestar) -> Any:
    return app.state["daemon"]
