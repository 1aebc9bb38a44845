"""App assembly: the store, the core, local workers and the Litestar app, built from a Config."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar, Router
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig

from daemon.access import auth
from daemon.api import drain, tenants
from daemon.api.content_api import ContentController
from daemon.api.contexts import ContextsController
from daemon.api.drilldown import DrilldownController
from daemon.api.errors import EXCEPTION_HANDLERS, ErrorSchemaPlugin
from daemon.api.gateway import GatewayController
from daemon.api.history_api import HistoryController
from daemon.api.limits import Limits
from daemon.api.policies_api import install_policies
from daemon.api.responses import ResponsesController
from daemon.api.rest import OperatorController, OpsController, RestController
from daemon.api.scheduling_api import SchedulingController
from daemon.api.tools_api import ToolsController
from daemon.api.whoami import WhoamiController
from daemon.api.workflows_wiring import install_workflows
from daemon.config import Config
from daemon.content import settings as content_settings
from daemon.content.capture import ContentCapture
from daemon.core import data_dir, interpreter_tuning, recovery
from daemon.core.core import Core
from daemon.history.http_tally import HttpTally
from daemon.history.service import History
from daemon.toolsvc.service import ToolService
from daemon.workers import placement
from db.engine import make_engine, make_sessionmaker, upgrade
from db.lease import application_name, this_instance
from db.writer import BatchWriter
from webui import create_ui_router

log = logging.getLogger("agentd")


class Daemon:
    """Owns every long-lived part; `run()` is the lifespan of the app."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.core: Core | None = None
        self.placement: placement.Placement | None = None
        self.tools: ToolService | None = None
        self.auth = auth.TokenAuth(enabled=config.auth)
        self.limits = Limits(config)
        self.tally = HttpTally()  # the API's 5xx answers, for the history
        self.history: History | None = None

    @asynccontextmanager
    async def lifespan(self, _app: Litestar) -> AsyncIterator[None]:
        cfg = self.config
        await asyncio.to_thread(data_dir.prepare, cfg)  # private before the first write
        await upgrade(cfg.db_url)
        # named, so that a standby taking the store's lease over fences them off (db/lease.py)
        engine = make_engine(cfg.db_url, application_name(this_instance()))
        writer = BatchWriter(engine)
        writer.start()
        sessions = make_sessionmaker(engine)
        self.auth.bind(sessions)
        if cfg.auth:
            await auth.ensure_first_token(sessions, cfg.config_path)
        recovered = await recovery.recover(sessions, writer)
        core = Core(cfg, writer, sessions)
        # prompts, completions and tool arguments of the tenants that trace content
        core.on_request_end.append(ContentCapture(
            content_settings.from_config(cfg), core.slo.tagging.tenants.get, writer.insert,
            core.clock).request_ended)
        await core.load_known_sessions()
        await core.start()
        self.history = History(core, self.tally)
        self.history.start()  # before daemon.started: that trace is its first event
        await core.expiry.load_stored()  # live programs the last run left: they expire too
        self.core = core
        self.tools = ToolService(core, cfg)
        await self.tools.start()
        writer.trace("daemon.started", endpoint=core.broker.endpoint,
                     **recovered.started_fields())
        pid_file = drain.write_pid_file(cfg.data_path, cfg.base_url)
        # local child processes, or Ray actors on a cluster's nodes ([placement])
        self.placement = placement.make(cfg, core.broker.endpoint, core.worker_key,
                                        writer.trace)
        await self.placement.start()
        tuned = interpreter_tuning.settle_after_startup()
        log.info("agentd serving on %s (store %s, workers on %s)",
                 cfg.base_url, cfg.db_url, core.broker.endpoint)
        try:
            yield
        finally:
            log.info("agentd stopping")
            await self.placement.stop()
            await self.tools.stop()
            await core.stop()
            await self.history.stop()
            writer.trace("daemon.stopped")
            await writer.stop()
            await engine.dispose()
            drain.remove_pid_file(pid_file)
            interpreter_tuning.release_on_stop(tuned)

    def get_tools(self) -> ToolService:
        assert self.tools is not None, "the daemon has not started"
        return self.tools

    def get_history(self) -> History:
        assert self.history is not None, "the daemon has not started"
        return self.history

    def get_core(self) -> Core:
        assert self.core is not None, "the daemon has not started"
        return self.core


def create_app(config: Config) -> Litestar:
    daemon = Daemon(config)
    app = Litestar(
        route_handlers=[GatewayController, ResponsesController, ContextsController,
                        RestController,
                        OperatorController, OpsController, ToolsController, SchedulingController,
                        DrilldownController, WhoamiController, HistoryController,
                        ContentController,
                        drain.DrainController, create_ui_router(config.base_url)],
        before_request=drain.refuse_while_draining,
        guards=[auth.require_scope, tenants.require_owner],
        dependencies={"core": Provide(daemon.get_core, sync_to_thread=False),
                      "tools": Provide(daemon.get_tools, sync_to_thread=False),
                      "history": Provide(daemon.get_history, sync_to_thread=False)},
        middleware=[daemon.tally.middleware],
        lifespan=[daemon.lifespan],
        exception_handlers=EXCEPTION_HANDLERS,
        plugins=[ErrorSchemaPlugin()],
        request_max_body_size=config.max_body_bytes,
        openapi_config=OpenAPIConfig(title="agentd", version="0.1.0", openapi_router=Router(
            path="/schema", route_handlers=[], opt={"scope": auth.READ})),
        debug=False,
        logging_config=None,
        state=State({"daemon": daemon, "auth": daemon.auth, "limits": daemon.limits}),
    )
    install_policies(app)
    install_workflows(app)
    return app
