"""The engine tier: tests that start real vLLM engines (in process, in doctor children, served).

Every test collected under this folder gets the ``engine`` marker here, so ``-m "not engine"``
leaves the tier out and no file has to remember the marker. Engine starts are the suite's cost
(10-60 s each on 2 CPU cores): share one engine through a session-scoped fixture where tests
can (``served_engine`` in tests/conftest.py, ``engine`` in test_engine_live.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.engine)
