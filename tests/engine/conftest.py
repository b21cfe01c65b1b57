"""tests/engine: registers the shared live-engine fixtures of :mod:`tests.engine.fixtures`
(``tiny_model_dir``, ``live_ports``) unless ``tests/conftest.py`` already did via
``pytest_plugins = ["tests.engine.fixtures"]`` — one registration, so the engines start once."""

from __future__ import annotations

PLUGIN = "tests.engine.fixtures"


def pytest_configure(config) -> None:
    if not config.pluginmanager.has_plugin(PLUGIN):
        config.pluginmanager.import_plugin(PLUGIN)
