"""pytest rewrites the asserts of the suite's own modules only.

pytest marks every module of each installed plugin's package for assert rewriting when it
discovers the plugin, and a rewritten module is parsed and compiled again in every worker (its
bytecode is not cached where PYTHONDONTWRITEBYTECODE is set). ``addopts`` names the plugins the
suite uses instead, so their packages load as installed.
"""

from __future__ import annotations

import importlib

import pytest
from _pytest.assertion.rewrite import AssertionRewritingHook

PLUGIN_PACKAGES = ["anyio", "hypothesis.core", "schemathesis.core", "xdist.remote"]


@pytest.mark.parametrize("name", PLUGIN_PACKAGES)
def test_an_installed_plugin_s_package_loads_as_installed(name):
    module = importlib.import_module(name)
    assert module.__spec__ is not None
    assert not isinstance(module.__spec__.loader, AssertionRewritingHook), name


def test_the_suite_s_own_modules_are_still_rewritten():
    assert isinstance(__spec__.loader, AssertionRewritingHook)
