"""Shared live-engine fixtures (a pytest plugin module; usable from any test package).

* ``tiny_model_dir`` (session): ``resolve_model("tiny")`` — the tiny random Qwen2, built once
  and cached (``$DUPLEX_LEDGER_MODEL_CACHE`` or ``~/.cache/duplex-ledger/models``).
* ``live_ports`` (session, session event loop): two :class:`VllmStagePort` s on the tiny model,
  ``LivePorts(thinker=stage 0, talker=stage 1)``, started once per test session and shut down
  at its end. Skips (with the reason) when vllm is not importable, so offline runs stay green.

Tests using ``live_ports`` must run in the session loop and carry the ``vllm`` marker::

    pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]

Registration: ``tests/engine/conftest.py`` registers this module for tests/engine; to use it
from other packages add ``pytest_plugins = ["tests.engine.fixtures"]`` to ``tests/conftest.py``
(the conftest then sees it is registered and does nothing, so the engines start only once).
Engines are shared: a test must leave no request running on them (abort what it started).
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import NamedTuple

import pytest
import pytest_asyncio

VLLM_SKIP = (
    "vllm is not installed in this environment (live engine tests need "
    "`scripts/install-vllm.sh`); offline tests still run"
)


class LivePorts(NamedTuple):
    """The session's two live stage ports and how long each took to start (s)."""

    thinker: object  # VllmStagePort, stage 0
    talker: object  # VllmStagePort, stage 1
    start_s: tuple[float, float]


def vllm_available() -> bool:
    """True when ``import vllm`` can work (checked without importing it)."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        pytest.skip("the tiny model needs torch and transformers")
    from reports.model_prep import resolve_model

    return resolve_model("tiny")


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def live_ports(request: pytest.FixtureRequest) -> AsyncIterator[LivePorts]:
    if not vllm_available():
        pytest.skip(VLLM_SKIP)
    tiny_model_dir: Path = request.getfixturevalue("tiny_model_dir")  # only once vllm is there
    from engine_bridge.vllm_port import VllmStagePort

    t0 = time.monotonic()
    thinker = await VllmStagePort.start(tiny_model_dir, stage_id=0, name="thinker")
    t1 = time.monotonic()
    try:
        talker = await VllmStagePort.start(tiny_model_dir, stage_id=1, name="talker")
    except BaseException:
        await thinker.shutdown()
        raise
    t2 = time.monotonic()
    try:
        yield LivePorts(thinker, talker, (round(t1 - t0, 2), round(t2 - t1, 2)))
    finally:
        await talker.shutdown()
        await thinker.shutdown()
