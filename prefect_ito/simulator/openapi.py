"""Generate the contract's OpenAPI 3.1 document from the simulator app.

Run ``uv run python -m prefect_ito.simulator.openapi`` to rewrite the committed document; a test
fails when it is stale. The admin routes and the HTML device page are left out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect_ito.simulator.app import create_app

DOCUMENT_PATH = Path(__file__).resolve().parents[2] / "docs/contract/ito-training-v0.openapi.json"


def openapi_document() -> dict[str, Any]:
    """Return the OpenAPI document of contract v0."""
    return create_app().openapi()


def render() -> str:
    """Return the document as committed: indented JSON with a final newline."""
    return json.dumps(openapi_document(), indent=2, ensure_ascii=False) + "\n"


def main() -> None:
    """Write the document to :data:`DOCUMENT_PATH`."""
    DOCUMENT_PATH.write_text(render(), encoding="utf-8")
    print(f"wrote {DOCUMENT_PATH}")


if __name__ == "__main__":
    main()
