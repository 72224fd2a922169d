"""The contract error a simulator route answers with."""

from __future__ import annotations

from typing import Any

from prefect_ito.contract import ErrorCode

__all__ = ["SimError"]


class SimError(Exception):
    """A contract error the simulator answers with: code, safe message, field and details."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.headers = headers or {}
        self.details = details
