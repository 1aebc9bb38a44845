"""Docker SDK calls, run off the event loop, with the SDK's exceptions translated once here."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import docker.errors
import requests.exceptions

from tools.errors import Reason, ToolError

P = ParamSpec("P")
T = TypeVar("T")

# Docker answers 404 for a missing container, exec, volume, image *and* file; only the
# message tells them apart, and the caller needs to know which one it was.
_NOT_FOUND = (
    ("no such image", Reason.UNKNOWN_IMAGE),
    ("no such container", Reason.DEAD),
    ("no such exec", Reason.DEAD),
    ("no such volume", Reason.DEAD),
)


def map_error(exc: Exception) -> ToolError:
    # `explanation` is the engine's own sentence, without the URL noise around it.
    text = str(getattr(exc, "explanation", None) or exc)
    if isinstance(exc, docker.errors.ImageNotFound):
        return ToolError(Reason.UNKNOWN_IMAGE, text)
    if isinstance(exc, docker.errors.NotFound):
        lowered = text.lower()
        reason = next((r for key, r in _NOT_FOUND if key in lowered), Reason.BAD_PATH)
        return ToolError(reason, text)
    if isinstance(exc, docker.errors.APIError) and "is not running" in text:
        return ToolError(Reason.DEAD, text)
    if isinstance(exc, requests.exceptions.ConnectionError) or (
        isinstance(exc, docker.errors.DockerException)
        and not isinstance(exc, docker.errors.APIError)
    ):
        return ToolError(Reason.ENGINE_DOWN, f"docker engine unreachable: {text}")
    return ToolError(Reason.ENGINE_ERROR, text)


async def call(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run one blocking SDK call in a thread; docker failures become `ToolError`."""
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise map_error(exc) from exc
