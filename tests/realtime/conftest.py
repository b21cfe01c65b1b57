"""Realtime front fixtures: a FAKE engine (tests/fakes: scripted stage ports, no vLLM), the
server (:func:`tests.realtime.server_fixture.serve_app`) and the official ``openai`` SDK
client pointed at it."""

from __future__ import annotations

import pytest
from openai import AsyncOpenAI

from engine_bridge.engine import SessionEngine
from engine_bridge.messages import EngineConfig
from realtime.connection import ConnectionOptions
from tests.fakes.fake_port import FakeStagePort
from tests.realtime.server_fixture import make_app, serve_app

SHORT = EngineConfig(max_tokens=6, talker_max_tokens=4, flush_interval_s=0.005)
LONG = EngineConfig(max_tokens=2000, talker_max_tokens=4, flush_interval_s=0.005)  # >= 4 s: cancels land mid-reply


REPLY = "Hi, I am a test."  # 5 words: under SHORT.max_tokens, so a reply ends with stop


async def fake_engine(
    tmp_path, config: EngineConfig, reply: str | None = None, *, max_model_len: int = 1024
) -> SessionEngine:
    """Fake ports; the thinker says ``reply`` (stops, ``stop``), else runs to its budget
    (``length``); a prompt over ``max_model_len`` fake tokens fails the turn."""
    ports = [
        FakeStagePort(0, "thinker", token_delay_s=0.002, reply=reply, max_model_len=max_model_len),
        FakeStagePort(1, "talker", token_delay_s=0.002),
    ]
    return await SessionEngine.open(f"sqlite+aiosqlite:///{tmp_path}/ledger.db", ports, config=config)


@pytest.fixture
async def engine(tmp_path):
    eng = await fake_engine(tmp_path, SHORT, REPLY)
    yield eng
    await eng.aclose()


@pytest.fixture
async def long_engine(tmp_path):
    eng = await fake_engine(tmp_path, LONG)
    yield eng
    await eng.aclose()


@pytest.fixture
def options() -> ConnectionOptions:
    return ConnectionOptions()


@pytest.fixture
def app(engine, options):
    return make_app(engine, options)


@pytest.fixture
def long_app(long_engine, options):
    return make_app(long_engine, options)


@pytest.fixture
def state(app):
    return app.state.realtime


@pytest.fixture
def long_state(long_app):
    return long_app.state.realtime


@pytest.fixture
async def port(engine, options, app):
    async with serve_app(engine, options, app=app) as port:
        yield port


@pytest.fixture
async def long_port(long_engine, options, long_app):
    async with serve_app(long_engine, options, app=long_app) as port:
        yield port


def sdk_client(port: int) -> AsyncOpenAI:
    return AsyncOpenAI(api_key="test-key", websocket_base_url=f"ws://127.0.0.1:{port}/v1")


@pytest.fixture
def client(port) -> AsyncOpenAI:
    """The official SDK, pointed at the test server (``client.realtime.connect(...)``)."""
    return sdk_client(port)


def pytest_configure(config) -> None:
    """The live-engine fixtures (``live_ports``) for test_live_*.py, registered once (as
    tests/engine/conftest.py does)."""
    if not config.pluginmanager.has_plugin("tests.engine.fixtures"):
        config.pluginmanager.import_plugin("tests.engine.fixtures")
