"""prefect-ito: run ML training on a completed Itô compute booking by delegating to the desk backend."""

from __future__ import annotations

__version__ = "0.1.0"
