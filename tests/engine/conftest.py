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


# files whose engines keep every core of a 2-core box busy for minutes (a TP=2 server: a worker
# bound to each core, serving requests the whole module): they run last, so that `make test`'s
# other stream, whose bad-input tests bound each doctor process at 30 s, has finished by then
# (side by side, tests/unit/test_malformed_corpus.py's doctor processes outlast that bound)
LAST = frozenset({"test_channel_tp2_served.py"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.engine)
    items.sort(key=lambda item: item.path.name in LAST and HERE in item.path.resolve().parents)  # stable
