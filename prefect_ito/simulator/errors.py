"""The contract error a simulator route answers with."""

from __future__ import annotations

from prefect_ito.contract import ErrorCode

__all__ = ["SimError"]


class SimError(Exception):
    """A contract error the simulator answers with: code, safe message, offending field."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.headers = headers or {}
