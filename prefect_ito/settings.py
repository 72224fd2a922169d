"""Runtime knobs, read from ``PREFECT_INTEGRATIONS_ITO_*`` environment variables.

They can also be set under ``[integrations.ito]`` in ``prefect.toml`` or
``[tool.prefect.integrations.ito]`` in ``pyproject.toml``, as for every Prefect integration.
Settings are read when :class:`ItoSettings` is instantiated, so each use sees the current
environment.
"""

from __future__ import annotations

import httpx
from prefect.settings.base import PrefectBaseSettings, build_settings_config
from pydantic import Field

from prefect_ito.backend._retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT

__all__ = ["ItoSettings"]


class ItoSettings(PrefectBaseSettings):
    """Settings for prefect-ito (environment prefix ``PREFECT_INTEGRATIONS_ITO_``)."""

    model_config = build_settings_config(("integrations", "ito"))

    allow_plaintext_keyring: bool = Field(
        default=False,
        description="Allow a keyring backend that stores secrets in a plaintext file "
        "(such as keyrings.alt's PlaintextKeyring). Meant for tests and throwaway machines.",
    )
    poll_wait_seconds: float = Field(
        default=30.0,
        gt=0,
        description="How long one long-poll read of a training run may wait for a change.",
    )
    state_poll_seconds: float = Field(
        default=5.0,
        gt=0,
        description="How often a supervising flow checks its own Prefect state (for a "
        "cancellation) and, while paused, whether a person answered.",
    )
    request_timeout_seconds: float = Field(
        default=DEFAULT_TIMEOUT.read or 30.0,
        gt=0,
        description="Read, write and pool timeout of each request to the backend.",
    )
    connect_timeout_seconds: float = Field(
        default=DEFAULT_TIMEOUT.connect or 5.0,
        gt=0,
        description="Timeout for connecting to the backend.",
    )
    max_retries: int = Field(
        default=DEFAULT_MAX_RETRIES,
        ge=0,
        description="Retries of one call after transient failures (429, 503, transport errors).",
    )

    def timeout(self, request_timeout_seconds: float | None = None) -> httpx.Timeout:
        """Return the client timeouts these settings describe.

        Args:
            request_timeout_seconds: Overrides :attr:`request_timeout_seconds` when given.
        """
        if request_timeout_seconds is None:
            request_timeout_seconds = self.request_timeout_seconds
        return httpx.Timeout(request_timeout_seconds, connect=self.connect_timeout_seconds)
