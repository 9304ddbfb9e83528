"""Shared test configuration: the test tier follows the folder (``unit/``, ``integration/``, ``e2e/``).

Tests under ``tests/e2e/`` get the ``e2e`` marker (registered in pyproject): ``pytest -m "not e2e"``
skips the end-to-end runs (minutes each on a CPU), ``pytest -m e2e`` runs only them; ``make test`` runs
everything.
"""

from pathlib import Path

import pytest

from tests.support import FIXTURES

_E2E = Path(__file__).resolve().parent / "e2e"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _E2E in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def fixtures_dir() -> Path:
    """``tests/fixtures``: the small local data files (JSONL samples of the hub sets)."""
    return FIXTURES
