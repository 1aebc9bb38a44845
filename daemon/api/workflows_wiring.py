"""Plugging the workflow runtime into the app: one call, `install_workflows(app)`.

It registers WorkflowsController, and adds a lifespan manager that starts the run
controller (revoking the tokens of runs an earlier daemon process left behind, binding
new runs' tokens to their runs in the app's TokenAuth) and the global control loop once
the daemon's core exists and, on shutdown, stops the loop and cancels live runs (killing
their sandboxes and releasing their programs) before the core stops. Calling it twice
is harmless.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from litestar import Litestar

from daemon.access.names import DEFAULT_TENANT
from daemon.api.workflows_api import CONTROL_KEY, STATE_KEY, WorkflowsController
from daemon.runtime.global_controller import ControlLoop
from daemon.runtime.runs import RunController

INSTALLED = "agentd.workflows.installed"
log = logging.getLogger("agentd.runs")


def install_workflows(app: Litestar) -> None:
    if app.state.get(INSTALLED):
        return
    app.state[INSTALLED] = True
    app.register(WorkflowsController)

    @asynccontextmanager
    async def lifespan(_app: Litestar) -> AsyncIterator[None]:
        daemon: Any = app.state["daemon"]
        core = daemon.get_core()
        cfg = daemon.config
        runs = RunController(core, cfg.data_path, cfg.base_url, cfg.auth,
                             app.state.get("auth"))
        await runs.revoke_stale_tokens()
        await runs.trim_records()
        adopted = await asyncio.to_thread(runs.bundles.adopt_untenanted, DEFAULT_TENANT)
        if adopted:
            log.info("workflow names are per tenant now: moved %d workflow(s) stored before "
                     "tenants to tenant '%s': %s", len(adopted), DEFAULT_TENANT,
                     ", ".join(adopted))
        control = ControlLoop(runs)
        app.state[STATE_KEY] = runs
        app.state[CONTROL_KEY] = control
        control.start()
        try:
            yield
        finally:
            await control.stop()
            await runs.stop()
            app.state[STATE_KEY] = app.state[CONTROL_KEY] = None

    # entered after the daemon's own lifespan, so left (runs stopped) before it
    app._lifespan_managers.append(lifespan)
