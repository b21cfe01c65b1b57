"""Embedding duplex-ledger's session engine in front of live vLLM engines.

    .venv/bin/python examples/embed.py [--model tiny|smollm2|PATH] [--db sqlite+aiosqlite:///embed.db]

Starts a thinker (Stage0) and a talker (Stage1) engine, runs one two-turn session, prints what
the client received and the audit verdict, then shuts the engines down.
"""

import argparse
import asyncio
import os

from engine_bridge.engine import SessionEngine
from engine_bridge.messages import EngineConfig
from engine_bridge.vllm_port import VllmStagePort
from projections.runner import project_as_of
from reports.model_prep import resolve_model
from reports.render_text import turn_log_messages


async def main(model: str, db: str) -> int:
    thinker = await VllmStagePort.start(resolve_model(model), stage_id=0, name="thinker")
    talker = await VllmStagePort.start(resolve_model("tiny"), stage_id=1, name="talker")
    try:
        config = EngineConfig(max_tokens=24, ignore_eos=model == "tiny")
        async with await SessionEngine.open(
            db, [thinker, talker], config=config, stats_renderer=turn_log_messages
        ) as engine:  # --log-stats layout
            session = await engine.open_session("embed-demo")
            for question in ("What is the capital of France?", "And what is it famous for?"):
                await session.append_text(question)
                await session.commit()
                await session.wait_idle(120)
            await session.close()
            async for event in session.events():
                if event.type == "response.done":
                    print(f"assistant: {event.data['text']!r}")
            leaks = (await project_as_of(engine.store)).leaks()
            print(f"audit: {'clean' if not leaks else f'{len(leaks)} leak(s)'}")
            return 1 if leaks else 0
    finally:
        await talker.shutdown()
        await thinker.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--db", default="sqlite+aiosqlite:///embed.db")
    args = parser.parse_args()
    # vLLM logs its engine configuration at INFO; keep the example's output readable (vllm is
    # imported when the first engine starts, so the setting still applies).
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    raise SystemExit(asyncio.run(main(args.model, args.db)))
