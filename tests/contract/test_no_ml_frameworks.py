"""No ML framework is locked or imported: prefect-ito delegates training, it never trains."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FRAMEWORKS = {
    "torch",
    "transformers",
    "accelerate",
    "deepspeed",
    "jax",
    "vllm",
    "trl",
    "lightning",
    "pytorch-lightning",
}


def test_lock_file_holds_no_ml_framework():
    locked = set(re.findall(r'^name = "([^"]+)"', (ROOT / "uv.lock").read_text(), re.MULTILINE))

    assert not locked & FRAMEWORKS


def test_package_imports_no_ml_framework():
    imported: set[str] = set()
    for path in (ROOT / "prefect_ito").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])

    assert imported
    assert not imported & FRAMEWORKS
