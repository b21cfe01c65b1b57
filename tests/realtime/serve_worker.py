"""``serve`` as a child process on the scripted FAKE engine (no vllm), for the signal tests:

    python -m tests.realtime.serve_worker URL

Opens a :class:`SessionEngine` on ``URL`` with FAKE stage ports giving 2,000-token answers,
serves :func:`realtime.app.build_app` through :func:`realtime.server.serve` on 127.0.0.1:0
(signals handled by serve, as ``duplex-ledger serve`` does), prints ``PORT <n>`` once
listening and ``STOPPED <signal>`` after the shutdown; exits 0.
"""

from __future__ import annotations

import asyncio
import sys

from engine_bridge.engine import SessionEngine
from engine_bridge.messages import EngineConfig
from realtime.app import build_app
from realtime.server import serve
from tests.fakes.fake_port import FakeStagePort

LONG = EngineConfig(max_tokens=2000, talker_max_tokens=4, flush_interval_s=0.005)


async def main(url: str) -> None:
    ports = [FakeStagePort(0, "thinker", token_delay_s=0.002), FakeStagePort(1, "talker", token_delay_s=0.002)]
    engine = await SessionEngine.open(url, ports, config=LONG)
    handle = await serve(build_app(engine), on_started=lambda port: print(f"PORT {port}", flush=True))
    print(f"STOPPED {handle.signal_name}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
