"""Embedding duplex-ledger's session engine in front of live vLLM engines.

    .venv/bin/python examples/embed.py [--model tiny|smollm2|PATH] [--db sqlite+aiosqlite:///embed.db]

Starts a thinker (Stage0) and a talker (Stage1) engine, runs one two-turn session, prints what
the client received, each turn's tables in vLLM-Omni's --log-stats layout (re-projected from
the ledger, as ``duplex-ledger tables`` prints them) and the audit verdict, then shuts the
engines down. vLLM's and torch's own log lines are kept to errors (``VLLM_LOGGING_LEVEL=INFO``
shows them).
"""

import argparse
import asyncio

from engine_bridge.engine import SessionEngine
from engine_bridge.messages import EngineConfig
from engine_bridge.vllm_port import VllmStagePort
from projections.shell.runner import project_as_of
from reports.model_prep import quiet_engine_logs, resolve_model
from reports.render_text import render_turn_text, turn_log_messages


async def main(model: str, db: str) -> int:
    quiet = {"load_progress": False}  # no weight-loading bars
    thinker = await VllmStagePort.start(resolve_model(model), stage_id=0, name="thinker", **quiet)
    talker = await VllmStagePort.start(resolve_model("tiny"), stage_id=1, name="talker", **quiet)
    try:
        config = EngineConfig(max_tokens=24, ignore_eos=model == "tiny")
        async with await SessionEngine.open(
            db, [thinker, talker], config=config, stats_renderer=turn_log_messages
        ) as engine:  # --log-stats tables to the engine's log (printed below from the ledger)
            session = await engine.open_session("embed-demo")
            for question in ("What is the capital of France?", "And what is it famous for?"):
                await session.append_text(question)
                await session.commit()
                await session.wait_idle(120)
            await session.close()
            async for event in session.events():
                if event.type == "response.done":
                    print(f"assistant: {event.data['text']!r}")
            projector = await project_as_of(engine.store)
            for turn in projector.turn_tables:
                print(render_turn_text(turn), end="")
            leaks = projector.leaks()
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
    # vLLM's configuration dump and CPU notes, torch's warnings: off before vllm is imported
    # (when the first engine starts), so the example prints only the session.
    quiet_engine_logs()
    raise SystemExit(asyncio.run(main(args.model, args.db)))
