"""A test module runs on its own: it imports helpers only from its own folder or from tests/.

pytest puts a test module's folder on the path as it collects it, so a module that imports from
another test folder collects only when that folder's modules happened to be collected first (the
whole suite), and fails when run alone.
"""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_no_test_module_imports_from_another_test_folder():
    where = {path.stem: path.parent for path in TESTS.rglob("*.py") if path.stem != "conftest"}
    crossing = []
    for path in TESTS.rglob("*.py"):
        for name in re.findall(r"^(?:from|import) (\w+)", path.read_text(), re.MULTILINE):
            folder = where.get(name)
            if folder is not None and folder not in (TESTS, path.parent):
                crossing.append(f"{path.relative_to(TESTS)} imports {name} from {folder.name}/")
    assert not crossing, crossing
