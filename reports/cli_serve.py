"""``duplex-ledger serve``: the OpenAI Realtime (GA) WebSocket front on live vLLM engines
(issue 21).

Prepares the models and starts the two stage engines as ``demo``/``run`` do (Stage0 thinker on
``--model``, Stage1 talker on ``--talker-model``), opens a :class:`SessionEngine` on ``--db``
(SQLite by default, as ``run``; several ``serve`` processes on one PostgreSQL ledger are
replicas, issue 14), then serves :func:`realtime.app.build_app` with uvicorn on the same event
loop: ``ws://HOST:PORT/v1/realtime`` (the ``openai`` SDK's ``client.realtime.connect``),
``/v1/models``, ``/health``, ``/metrics``.

SIGTERM or SIGINT: every running response ends — ``close`` in the log, its terminal events and
close 1001 on the wire — then the engines stop and the command exits 0. Exit 2 when the
models, the database or the port cannot be used (nothing served).

vllm, torch, fastapi and uvicorn are imported only inside the command (``reports.cli`` stays
light for the offline tools).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from engine_bridge.messages import EngineConfig
from events.store.url import redact
from reports.cli_engine import DTYPE_HELP, MODEL_HELP, _prepare, engine_config, quiet_engines, start_ports
from reports.cli_errors import checked_url, fail
from reports.cli_errors import run as run_body
from reports.cli_numbers import finite_option
from reports.cli_projections import DB_HELP
from reports.ledger_check import open_first

API_KEY_ENV = "DUPLEX_LEDGER_API_KEY"
DEFAULT_MODEL_NAME = "duplex-ledger"


async def _serve(
    url: str,
    thinker_dir: Path,
    talker_dir: Path,
    dtype: str,
    config: EngineConfig,
    host: str,
    port: int,
    api_key: str | None,
    idle_timeout_s: float | None,
    served_model_name: str,
    duplex: bool,
    verbose: bool,
    err: Console,
) -> str | None:
    """Start the engines, serve until a signal, shut down; returns the signal's name."""
    from engine_bridge.engine import SessionEngine
    from engine_bridge.heap import freeze_startup_heap
    from realtime.app import build_app
    from realtime.connection import ConnectionOptions
    from realtime.server import serve

    timings: dict[str, float] = {}
    t0 = time.monotonic()
    ports: list[Any] = []
    try:
        await start_ports(thinker_dir, talker_dir, dtype, err, timings, ports)
        err.print(f"engines up in {time.monotonic() - t0:.1f} s", highlight=False)
        engine = await SessionEngine.open(url, ports, config=config)
        try:
            options = ConnectionOptions(extensions=duplex, idle_timeout_s=idle_timeout_s, model_name=served_model_name)
            app = build_app(engine, options=options, api_key=api_key)

            def started(bound: int) -> None:
                freeze_startup_heap()  # the startup heap out of the collector's passes (engine_bridge.heap)
                base = f"{host}:{bound}"
                err.print(
                    f"serving ws://{base}/v1/realtime (model {served_model_name!r}"
                    f"{', API key required' if api_key else ''}); http://{base}/metrics, /health, /v1/models; "
                    f"ledger {redact(url)}. Ctrl-C or SIGTERM ends every running answer and stops.",
                    highlight=False,
                    markup=False,
                )

            handle = await serve(
                app, host=host, port=port, on_started=started, log_level="info" if verbose else "warning"
            )
        finally:
            if not engine.closing:
                await engine.aclose()
    finally:
        for stage_port in reversed(ports):
            await stage_port.shutdown()
    return handle.signal_name


def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (loopback by default)."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="TCP port (0 = any free port)."),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    model: str = typer.Option("smollm2", "--model", help=MODEL_HELP),
    talker_model: str = typer.Option("tiny", "--talker-model", help="Stage1 (talker) model; default tiny."),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        envvar=API_KEY_ENV,
        help=f"Require 'Authorization: Bearer KEY' on /v1 (HTTP 401 before the upgrade otherwise); ${API_KEY_ENV}.",
    ),
    max_sessions: int = typer.Option(256, "--max-sessions", min=1, help="Open sessions admitted (then close 1013)."),
    idle_timeout_s: float = finite_option(
        300.0,
        "--idle-timeout-s",
        0.001,
        help="Close a connection silent this long (s), no answer running, as a disconnect (an idle "
        "socket must not hold a --max-sessions slot for ever; vLLM-Omni's default).",
    ),
    max_tokens: int | None = typer.Option(None, "--max-tokens", min=1, help="Tokens per answer (default 32)."),
    served_model_name: str = typer.Option(
        DEFAULT_MODEL_NAME, "--served-model-name", help="The model name ?model= and /v1/models use."
    ),
    duplex: bool = typer.Option(False, "--duplex", help="Offer the duplex dialect (?duplex=1: barge_in, listen...)."),
    dtype: str = typer.Option("float32", "--dtype", help=DTYPE_HELP),
    verbose: bool = typer.Option(False, "--verbose", help="Keep vLLM's and uvicorn's INFO logging."),
) -> None:
    """Serve the OpenAI Realtime API (GA) at ws://HOST:PORT/v1/realtime on live vLLM engines.

    Every session is recorded in the ledger (--db) as with `run`; SIGTERM/Ctrl-C ends running
    answers as `close` and exits 0."""
    err = Console(stderr=True, soft_wrap=True)
    if not served_model_name.strip():
        fail("--served-model-name must not be empty")
    from realtime.server import ListenError, check_listen

    try:
        check_listen(host, port)
    except ListenError as exc:
        fail(str(exc))
    quiet_engines(verbose)
    url = checked_url(db)
    open_first(url)  # a --db that cannot be used is said before any model work
    thinker_dir = _prepare(model, err)
    talker_dir = thinker_dir if talker_model.strip().lower() == model.strip().lower() else _prepare(talker_model, err)
    config = dataclasses.replace(engine_config(model, max_tokens, talker_model), max_sessions=max_sessions)
    signal_name = run_body(
        lambda: _serve(
            url,
            thinker_dir,
            talker_dir,
            dtype,
            config,
            host,
            port,
            api_key or None,
            idle_timeout_s,
            served_model_name,
            duplex,
            verbose,
            err,
        ),
        url,
    )
    err.print(f"stopped ({signal_name or 'server ended'}); every session closed", highlight=False)
    raise typer.Exit(0)


def register(app: typer.Typer) -> None:
    """Add ``serve`` to the main CLI app."""
    app.command("serve")(serve)
