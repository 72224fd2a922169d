"""Runtime knobs, read from ``PREFECT_INTEGRATIONS_ITO_*`` environment variables.

They can also be set under ``[integrations.ito]`` in ``prefect.toml``,
``[tool.prefect.integrations.ito]`` in ``pyproject.toml``, a ``.env`` file or the active Prefect
profile, as for every Prefect integration: :class:`ItoSettings` reads them as Prefect does.
Settings are read when a settings object is made, so each use sees the current environment.

Importing Prefect costs a command about two seconds, more than the commands that never run a
flow take in all; so :func:`current_settings` reads the environment alone (with
:class:`ItoSettingsBase`, without Prefect) when none of those files can hold these settings,
and :class:`ItoSettings` is only built, importing Prefect, when first asked for.
"""

from __future__ import annotations

import functools
import os
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from prefect_ito.backend._retry import DEFAULT_MAX_RETRIES, DEFAULT_TIMEOUT

__all__ = ["ENV_PREFIX", "ItoSettings", "ItoSettingsBase", "current_settings"]

ENV_PREFIX = "PREFECT_INTEGRATIONS_ITO_"


class ItoSettingsBase(BaseSettings):
    """The knobs, read from the environment alone (prefix ``PREFECT_INTEGRATIONS_ITO_``)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

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

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Read arguments and the environment only: the files are Prefect's to read."""
        return init_settings, env_settings

    def timeout(self, request_timeout_seconds: float | None = None) -> httpx.Timeout:
        """Return the client timeouts these settings describe.

        Args:
            request_timeout_seconds: Overrides :attr:`request_timeout_seconds` when given.
        """
        if request_timeout_seconds is None:
            request_timeout_seconds = self.request_timeout_seconds
        return httpx.Timeout(request_timeout_seconds, connect=self.connect_timeout_seconds)


if TYPE_CHECKING:
    from prefect.settings.base import PrefectBaseSettings

    class ItoSettings(PrefectBaseSettings, ItoSettingsBase):
        """Settings for prefect-ito, from every source Prefect reads its own settings from."""


def __getattr__(name: str) -> Any:
    # PEP 562: `ItoSettings` imports Prefect, so it is built when first asked for.
    if name == "ItoSettings":
        return _prefect_settings()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _prefect_settings() -> type[ItoSettingsBase]:
    from prefect.settings.base import PrefectBaseSettings, build_settings_config

    class ItoSettings(PrefectBaseSettings, ItoSettingsBase):
        """Settings for prefect-ito, from every source Prefect reads its own settings from."""

        model_config = build_settings_config(("integrations", "ito"))

    ItoSettings.__module__ = __name__
    ItoSettings.__qualname__ = "ItoSettings"
    return ItoSettings


def current_settings() -> ItoSettingsBase:
    """Return the settings in force now.

    They come from :class:`ItoSettings` (every source Prefect reads) when Prefect is loaded
    anyway or a file it reads could hold them; otherwise only the environment can set them,
    and it is read without importing Prefect. Either way the values are the same.
    """
    if "prefect" in sys.modules or _files_may_set_them():
        return _prefect_settings()()
    return ItoSettingsBase()


def _files_may_set_them() -> bool:
    """Tell whether a file Prefect reads settings from could hold these (when in doubt, yes)."""
    if Path(".env").exists() or Path("prefect.toml").exists():
        return True
    if _pyproject_has_prefect_table(Path("pyproject.toml")):
        return True
    return any(_mentions_these_settings(path) for path in _profile_paths())


def _pyproject_has_prefect_table(path: Path) -> bool:
    try:
        with path.open("rb") as file:
            tool = tomllib.load(file).get("tool", {})
    except FileNotFoundError:
        return False
    except (OSError, tomllib.TOMLDecodeError):
        return True
    return not isinstance(tool, dict) or "prefect" in tool


def _profile_paths() -> list[Path]:
    """Where Prefect may find its profiles (``prefect.toml`` and ``.env`` were ruled out)."""
    paths = [Path.home() / ".prefect" / "profiles.toml"]
    if home := os.environ.get("PREFECT_HOME"):
        paths.append(Path(home) / "profiles.toml")
    if profiles := os.environ.get("PREFECT_PROFILES_PATH"):
        paths.append(Path(profiles))
    return paths


def _mentions_these_settings(path: Path) -> bool:
    try:
        return ENV_PREFIX in path.read_text(encoding="utf-8", errors="replace").upper()
    except FileNotFoundError:
        return False
    except OSError:
        return True
