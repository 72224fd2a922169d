"""Session-wide isolation: every test runs against throwaway Prefect and keyring state.

Prefect reads its settings once, at import, so the environment is set here before any test module
imports it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

_SESSION_HOME = Path(tempfile.mkdtemp(prefix="prefect-ito-tests-"))
(_SESSION_HOME / "prefect").mkdir()
(_SESSION_HOME / "xdg-data").mkdir()

os.environ.update(
    {
        "PREFECT_HOME": str(_SESSION_HOME / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
        "PREFECT_API_BLOCKS_REGISTER_ON_START": "false",
        # A file keyring in a temporary directory: never the developer's own keyring.
        "XDG_DATA_HOME": str(_SESSION_HOME / "xdg-data"),
        "PYTHON_KEYRING_BACKEND": "keyrings.alt.file.PlaintextKeyring",
        "PREFECT_INTEGRATIONS_ITO_ALLOW_PLAINTEXT_KEYRING": "true",
    }
)
for _name in ("ITO_COMPUTE_TOKEN", "ITO_COMPUTE_API_URL", "PREFECT_API_URL", "PREFECT_API_KEY"):
    os.environ.pop(_name, None)
