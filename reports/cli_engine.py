"""CLI commands on live vLLM engines: ``demo``, ``run TRACE.jsonl``, ``model prepare``.

``demo`` / ``run``: parse the trace(s) (every bad line reported, exit 2, before anything
starts), prepare the models, start two :class:`~engine_bridge.vllm_port.VllmStagePort` s
(Stage0 thinker on ``--model``, Stage1 talker on ``--talker-model``, tiny by default), run the
trace against a :class:`~engine_bridge.engine.SessionEngine` on ``--db`` while the
conversation and a progress bar go to stderr, then print to stdout exactly what
``duplex-ledger tables --db URL`` and ``duplex-ledger audit --db URL`` print (the same
functions run), and those two commands. Exit codes: 0 clean audit, 1 leaks, 2 bad trace,
model or database error.

vllm and torch are imported only inside the commands (``reports.cli`` stays light). The
engine processes are spawned by vLLM (the console script's ``main()`` is import-guarded).
vLLM's own logging goes to stderr and is lowered to ERROR unless ``--verbose`` or
``$VLLM_LOGGING_LEVEL`` says otherwise; without ``--verbose`` torch's FutureWarnings and
platform notes are silenced too (``PYTHONWARNINGS``, ``TORCH_CPP_LOG_LEVEL``, ``TORCH_LOGS``,
unless already set), and vLLM's weight-loading bars are off (the demo shows its own).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from engine_bridge.messages import ClientEvent, EngineConfig
from events.store.url import redact
from reports import cli_projections
from reports.cli_errors import checked_url, committed, fail, report
from reports.cli_errors import run as run_body  # `run` is this module's command
from reports.cli_numbers import finite_option
from reports.cli_projections import DB_HELP, AuditFormat, TablesFormat
from reports.escape import terminal
from reports.ledger_check import open_first
from reports.render_text import turn_log_messages
from reports.trace_player import LineOutcome, RunProgress, TraceRunResult
from reports.traces import Trace, TraceError, TraceLine, parse_traces

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"
MODEL_HELP = "Stage0 (thinker) model: smollm2, tiny, or a model directory holding config.json."
DTYPE_HELP = (
    "Engine dtype: float32 (default; CPUs without native fp16 run float16 ~1.6x slower) or float16 "
    "(never bfloat16 on CPU)."
)
METRICS_PORT_HELP = (
    "Serve the Prometheus families (vllm_omni:*, duplex_ledger:*) at http://127.0.0.1:PORT/metrics "
    "from the engines' start until the process exits (0 = any free port)."
)
METRICS_LINGER_HELP = (
    "With --metrics-port: keep serving /metrics this many seconds after the tables and the audit "
    "are printed, so a scraper sees the run's final state."
)
INTERRUPTED = 130
"""Exit code after Ctrl-C (128 + SIGINT, the shell's convention)."""
TABLES_MARK = "== per-turn tables =="
AUDIT_MARK = "== audit =="

model_app = typer.Typer(help="Prepare the models the live engines run.", no_args_is_help=True)


INPUT_CANCEL_NOTE = (
    "finished_reason cancel in the tables; the client's response.cancelled says barge_in, its legacy wire reason: "
    "DOMAIN §2.4"
)
"""What ``run``/``demo`` add to an ``input.cancel`` line that cancelled a response (M17)."""


def cancelled_words(wire_reason: object) -> str:
    """The text of a ``response.cancelled`` line: the client event's wire reason, and the log's
    ``finished_reason`` (the tables' word, DOMAIN §2.4) when that reason maps to another one
    (``client_cancelled`` → ``cancel``, ``disconnect`` → ``close``). A wire ``barge_in`` is a
    barge-in's or an ``input.cancel``'s (M17): the ``input.cancel`` line after it says which."""
    from projections.reasons import reason_for_cancel_source

    wire = str(wire_reason)
    logged = reason_for_cancel_source(wire)
    return f"wire reason {wire}" + (f"; finished_reason {logged} in the tables" if logged != wire else "")


def bundled_traces() -> list[Path]:
    """The demo's traces: ``examples/*.jsonl``, sorted by name."""
    return sorted(EXAMPLES_DIR.glob("*.jsonl"))


def engine_config(model: str, max_tokens: int | None, talker_model: str = "tiny") -> EngineConfig:
    """Turn sizes: the tiny random model never stops by itself, so a stage running it uses
    ``ignore_eos`` (exact lengths); a real model stops at its own EOS within ``max_tokens``
    (default 32)."""
    budget = max_tokens or 32
    return EngineConfig(
        max_tokens=budget,
        talker_max_tokens=budget,
        ignore_eos=_is_tiny(model),
        talker_ignore_eos=_is_tiny(talker_model),
    )


def _is_tiny(model: str) -> bool:
    return model.strip().lower() == "tiny"


def _prepare(spec: str, err: Console) -> Path:
    """resolve_model with a spinner and its progress messages; exit 2 when it cannot."""
    from reports.model_prep import resolve_model

    with err.status(escape(f"preparing model {spec!r}…")) as status:

        def progress(msg: str) -> None:
            status.update(escape(msg))
            err.print(f"  {msg}", highlight=False, markup=False)

        try:
            path = resolve_model(spec, progress=progress)
        except (FileNotFoundError, ImportError, OSError, RuntimeError) as exc:
            fail(f"model {spec!r}: {exc}")
    err.print(f"model {spec!r}: {path}", highlight=False, markup=False)
    return path


def program_name() -> str:
    """How the user can type this command again: ``duplex-ledger`` when that is on PATH and
    is this program, else the path it was started by: relative below the working directory
    (e.g. ``.venv/bin/duplex-ledger``), absolute elsewhere."""
    argv0 = Path(sys.argv[0])
    on_path = shutil.which("duplex-ledger")
    if argv0.name != "duplex-ledger" or (on_path is not None and Path(on_path).resolve() == argv0.resolve()):
        return "duplex-ledger"
    absolute = argv0.absolute()
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:  # not below the working directory
        return str(absolute)


def _parse(paths: list[Path], err: Console) -> Trace:
    try:
        return parse_traces(paths)
    except TraceError as exc:
        report(exc)
    except OSError as exc:
        fail(str(exc))


class _Live:
    """The stderr display: conversation lines above a progress bar."""

    def __init__(self, err: Console, trace: Trace) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=err,
        )
        self.task = self.progress.add_task("trace lines", total=len(trace.lines), status="")
        self.turns = trace.turns
        self.last: RunProgress | None = None

    def say(self, text: str) -> None:
        """One conversation line: model output and ids are log text (no markup, controls escaped)."""
        self.progress.console.print(terminal(text), markup=False, highlight=False, soft_wrap=True)

    def on_progress(self, p: RunProgress) -> None:
        self.last = p
        self.progress.update(
            self.task,
            completed=p.lines_done,
            status=p.status(),
        )

    def finished(self) -> None:
        """Off a terminal (CI, ``| tee``) the bar's last row is cut at the console's width:
        its counts (the README's "kept listening") are then printed whole on a line of their own."""
        if self.last is not None and not self.progress.console.is_terminal:
            done = f"trace lines {self.last.lines_done}/{self.last.lines_total} · {self.last.status()}"
            self.progress.console.print(done, markup=False, highlight=False, soft_wrap=True)

    def on_line(self, line: TraceLine, outcome: LineOutcome) -> None:
        tag = f"[{line.session}]"
        if line.type == "input.append" and line.is_speech:
            self.say(f"{tag} user: {line.text or line.transcript or '(speech)'}")
        elif line.type not in ("input.append", "input.commit"):
            note = f" ({INPUT_CANCEL_NOTE})" if line.type == "input.cancel" and outcome.status == "ok" else ""
            self.say(f"{tag} {line.type}" + (f" — {outcome.detail}" if outcome.detail else "") + note)
        if outcome.status != "ok":
            self.say(f"{tag} line {line.line_no} {line.type}: {outcome.status}: {outcome.detail}")

    def on_event(self, event: ClientEvent) -> None:
        tag = f"[{event.session_id}]"
        if event.type == "response.done":
            self.say(f"{tag} assistant: {(event.data.get('text') or '').strip()}")
        elif event.type == "response.listen":
            self.say(f"{tag} assistant keeps listening")
        elif event.type == "response.cancelled":
            self.say(f"{tag} response cancelled ({cancelled_words(event.data.get('reason'))})")

    def on_turn(self, session, turn) -> None:  # type: ignore[no-untyped-def]
        from reports.render_text import omni_timing_line

        self.say(omni_timing_line(turn))


async def start_ports(
    thinker_dir: Path, talker_dir: Path, dtype: str, err: Console, timings: dict[str, float], ports: list[Any]
) -> list[Any]:
    """Start the Stage0 (thinker) and Stage1 (talker) vLLM engines, a spinner on ``err``;
    their start times (s, monotonic) go to ``timings``. Each started port is appended to
    ``ports`` at once, so a caller that is interrupted (Ctrl-C) or whose talker fails to start
    shuts down exactly what is running; returns ``ports``."""
    from engine_bridge.vllm_port import VllmStagePort

    for stage_id, name, model_dir in ((0, "thinker", thinker_dir), (1, "talker", talker_dir)):
        t1 = time.monotonic()
        err.print(f"starting Stage{stage_id} ({name}) engine… (Ctrl-C stops)", highlight=False, markup=False)
        with err.status(f"starting Stage{stage_id} ({name}) engine…"):
            ports.append(
                await VllmStagePort.start(model_dir, stage_id=stage_id, name=name, dtype=dtype, load_progress=False)
            )
        timings[f"{name}_start_s"] = time.monotonic() - t1
    return ports


def quiet_engines(verbose: bool) -> None:
    """Unless ``verbose``: vLLM logs ERROR only, torch's warnings are silenced (inherited by
    vLLM's engine-core processes; :func:`reports.model_prep.quiet_engine_logs`); vLLM logs to
    stderr either way (stdout carries tables + audit only)."""
    if not verbose:
        from reports.model_prep import quiet_engine_logs

        quiet_engine_logs()
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


async def _drive(
    trace: Trace,
    url: str,
    thinker_dir: Path,
    talker_dir: Path,
    config: EngineConfig,
    speed: float,
    log_stats: bool | None,
    dtype: str,
    err: Console,
    metrics_port: int | None = None,
    servers: list[Any] | None = None,
    closed: list[str] | None = None,
) -> tuple[TraceRunResult, dict[str, float]]:
    """Start the engines, play ``trace``, stop the engines. ``closed`` collects, in order, what
    was closed on the way out (said on Ctrl-C)."""
    closed = [] if closed is None else closed
    from engine_bridge.engine import SessionEngine
    from reports.trace_player import run_trace

    # vLLM starts synchronously, blocking the loop for minutes: asyncio.run's own SIGINT
    # handler (cancel the main task from the loop) would wait for it. Ctrl-C raises at once
    # instead; the finally blocks below close what was started (issue 22).
    interrupt_at_once()
    timings: dict[str, float] = {}
    ports: list[Any] = []
    t0 = time.monotonic()
    try:
        await start_ports(thinker_dir, talker_dir, dtype, err, timings, ports)
        err.print(
            f"engines up in {time.monotonic() - t0:.1f} s; running {len(trace.sessions)} session(s), "
            f"{len(trace.lines)} trace lines",
            highlight=False,
        )
        live = _Live(err, trace)
        engine = await SessionEngine.open(
            url, ports, config=config, on_turn=live.on_turn, stats_renderer=turn_log_messages
        )
        closed.append(f"the ledger {redact(url)} (every open session closed)")  # by aclose, below
        async with engine:
            if metrics_port is not None:  # issues 16/22: served until the process exits, not the engine
                server = engine.metrics.start_server(metrics_port)
                (servers if servers is not None else []).append(server)
                err.print(f"Prometheus metrics on {server.url}", highlight=False)
            with live.progress:
                result = await run_trace(
                    engine,
                    trace,
                    speed=speed,
                    log_stats=log_stats,
                    on_progress=live.on_progress,
                    on_line=live.on_line,
                    on_event=live.on_event,
                )
            live.finished()
        timings["trace_s"] = result.wall_s
    finally:
        for port in reversed(ports):
            await port.shutdown()
            closed.insert(0, f"the Stage{port.stage_id} ({port.name}) engine")
    return result, timings


def interrupt_at_once() -> None:
    """SIGINT raises KeyboardInterrupt where the main thread is, even inside a synchronous
    call that blocks the event loop (vLLM's start-up). Main thread only."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _live_run(
    paths: list[Path],
    db: str | None,
    model: str,
    talker_model: str,
    speed: float,
    log_stats: bool | None,
    max_tokens: int | None,
    dtype: str,
    verbose: bool,
    metrics_port: int | None = None,
    metrics_linger_s: float = 0.0,
) -> None:
    """Shared body of ``demo`` and ``run`` (see the module docstring); raises typer.Exit."""
    servers: list[Any] = []  # the /metrics server: it outlives the engine (issue 22)
    err = Console(stderr=True, soft_wrap=True)
    started = time.monotonic()
    trace = _parse(paths, err)
    if speed <= 0:
        fail("--speed must be > 0")
    quiet_engines(verbose)
    url = checked_url(db)
    open_first(url)  # a --db that cannot be used is said before any model work
    closed: list[str] = []
    try:
        thinker_dir = _prepare(model, err)
        talker_dir = (
            thinker_dir if talker_model.strip().lower() == model.strip().lower() else _prepare(talker_model, err)
        )
        config = engine_config(model, max_tokens, talker_model)
        result, timings = run_body(
            lambda: _drive(
                trace, url, thinker_dir, talker_dir, config, speed, log_stats, dtype, err, metrics_port, servers, closed
            ),
            url,
        )
    except KeyboardInterrupt:
        what = ", ".join(closed) if closed else "nothing was running yet (no engine started, nothing written)"
        err.print(f"interrupted (Ctrl-C); closed: {what}", highlight=False, markup=False)
        raise typer.Exit(INTERRUPTED) from None
    problems = result.problems
    if problems:
        err.print(f"[yellow]{len(problems)} trace line(s) did not do what they asked:[/]", markup=True)
        for o in problems:
            err.print(
                terminal(f"  {Path(o.source).name} line {o.line_no} [{o.session}] {o.type}: {o.status}: {o.detail}"),
                markup=False,
                highlight=False,
            )
    prog = program_name()
    codes: list[int] = []

    def closing_report() -> None:
        typer.echo(TABLES_MARK)
        cli_projections.tables(db=url, session=None, response=None, until_position=None, fmt=TablesFormat.text)
        typer.echo(AUDIT_MARK)
        codes.append(_audit_code(url))
        typer.echo("Re-project them later from the same ledger:")
        typer.echo(f"  {prog} tables --db {redact(url)}")
        typer.echo(f"  {prog} audit --db {redact(url)}")

    what = f"the run (its sessions are in {redact(url)}; `{prog} tables` and `{prog} audit` re-project them)"
    if not committed(closing_report, what) and not codes:
        codes.append(_audit_code(url))  # stdout now goes to /dev/null: the audit's verdict still sets the code
    code = codes[0]
    err.print(
        f"done in {time.monotonic() - started:.1f} s (thinker start {timings.get('thinker_start_s', 0):.1f} s, "
        f"talker start {timings.get('talker_start_s', 0):.1f} s, trace {timings.get('trace_s', 0):.1f} s)",
        highlight=False,
    )
    if servers and metrics_linger_s > 0:
        err.print(f"serving {servers[0].url} for {metrics_linger_s:g} s more (--metrics-linger-s)", highlight=False)
        time.sleep(metrics_linger_s)
    raise typer.Exit(code)


def _audit_code(url: str) -> int:
    """Print the audit of the ledger at ``url`` (what ``duplex-ledger audit`` prints) and
    return its exit code: 0 clean, 1 leaks or a broken chain."""
    try:
        cli_projections.audit(db=url, session=None, max_idle=30.0, until_position=None, fmt=AuditFormat.text, now=None)
    except typer.Exit as exc:
        return int(exc.exit_code)
    return 0


def demo(
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    model: str = typer.Option("smollm2", "--model", help=MODEL_HELP),
    talker_model: str = typer.Option("tiny", "--talker-model", help="Stage1 (talker) model; default tiny."),
    speed: float = finite_option(
        1.0, "--speed", 0.0, low_open=True, metavar="<float>", help="Time scale of the traces (2 = twice as fast)."
    ),
    max_tokens: int | None = typer.Option(None, "--max-tokens", min=1, help="Tokens per answer (default 32)."),
    dtype: str = typer.Option("float32", "--dtype", help=DTYPE_HELP),
    verbose: bool = typer.Option(False, "--verbose", help="Keep vLLM's own INFO logging."),
    metrics_port: int | None = typer.Option(None, "--metrics-port", min=0, max=65535, help=METRICS_PORT_HELP),
    metrics_linger_s: float = finite_option(0.0, "--metrics-linger-s", 0.0, 86400.0, help=METRICS_LINGER_HELP),
) -> None:
    """Run the bundled example conversations on live vLLM engines; print tables and audit.

    The traces in examples/*.jsonl run concurrently; exit 1 if the audit is not clean."""
    _live_run(
        bundled_traces(),
        db,
        model,
        talker_model,
        speed,
        None,
        max_tokens,
        dtype,
        verbose,
        metrics_port,
        metrics_linger_s,
    )


def run(
    trace: Path = typer.Argument(..., help="JSONL trace (format: examples/README.md)."),
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    model: str = typer.Option("smollm2", "--model", help=MODEL_HELP),
    talker_model: str = typer.Option("tiny", "--talker-model", help="Stage1 (talker) model; default tiny."),
    log_stats: bool | None = typer.Option(
        None, "--log-stats/--no-log-stats", help="Override every session's log_stats (default: the trace's)."
    ),
    speed: float = finite_option(
        1.0, "--speed", 0.0, low_open=True, metavar="<float>", help="Time scale of the trace (2 = twice as fast)."
    ),
    max_tokens: int | None = typer.Option(None, "--max-tokens", min=1, help="Tokens per answer (default 32)."),
    dtype: str = typer.Option("float32", "--dtype", help=DTYPE_HELP),
    verbose: bool = typer.Option(False, "--verbose", help="Keep vLLM's own INFO logging."),
    metrics_port: int | None = typer.Option(None, "--metrics-port", min=0, max=65535, help=METRICS_PORT_HELP),
    metrics_linger_s: float = finite_option(0.0, "--metrics-linger-s", 0.0, 86400.0, help=METRICS_LINGER_HELP),
) -> None:
    """Run a client trace on live vLLM engines; print the per-turn tables and the leak audit.

    Exit 2 (nothing run) on bad trace lines, 1 when the audit after the run is not clean."""
    _live_run(
        [trace], db, model, talker_model, speed, log_stats, max_tokens, dtype, verbose, metrics_port, metrics_linger_s
    )


@model_app.command("prepare")
def prepare(spec: str = typer.Argument("smollm2", help="smollm2, tiny, or a model directory.")) -> None:
    """Prepare a model (build tiny / convert SmolLM2 into the cache); prints its directory."""
    path = _prepare(spec, Console(stderr=True))
    typer.echo(str(path))


def register(app: typer.Typer) -> None:
    """Add ``demo``, ``run`` and ``model prepare`` to the main CLI app."""
    app.command("demo")(demo)
    app.command("run")(run)
    app.add_typer(model_app, name="model")
