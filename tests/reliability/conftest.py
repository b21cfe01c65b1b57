"""The reliability suite reuses the store contract's ``store`` fixture (SQLite and PostgreSQL)."""

from tests.store.conftest import store  # noqa: F401 - a fixture, re-exported
