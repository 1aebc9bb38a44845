"""The errors the daemon's parts raise for a client to see: CoreError from the core and its
collaborators, ApiError from request handling (a leaf: it imports nothing of the daemon, so
every part can raise them without importing the core or the API; daemon/api/errors.py
translates both into answers)."""

from __future__ import annotations


class CoreError(Exception):
    """An error a client caused or must know about; status is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 400, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, code: str = "invalid_request", param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}
