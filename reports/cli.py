"""``duplex-ledger`` command line (typer).

Sub-commands live in their own modules and register themselves on :data:`app`; this module
only assembles them. Importing it must not import vllm or torch.
"""

from __future__ import annotations

import typer

from reports import cli_engine, cli_events, cli_metrics, cli_projections, cli_serve, cli_timeline, cli_verify
from reports.cli_errors import OPERATIONAL, REJECTED, say

app = typer.Typer(
    name="duplex-ledger",
    help=(
        "Event-sourced session ledger for full-duplex voice sessions. Every command takes "
        "--db URL (default: $DUPLEX_LEDGER_DB_URL, else sqlite+aiosqlite:///./duplex-ledger.db)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

cli_events.register(app)  # db upgrade|downgrade|current, events import|export|tail, schema

cli_projections.register(app)  # audit, tables, rebuild
cli_verify.register(app)  # verify, digest
# --- further command groups: one line each -------------------------------------------------
cli_engine.register(app)  # demo, run, model prepare
cli_metrics.register(app)  # metrics (Prometheus exposition from the log)
cli_timeline.register(app)  # timeline (one session as a self-contained HTML page)
cli_serve.register(app)  # serve (OpenAI Realtime WebSocket front on live engines)


def main() -> None:
    """Console-script entry point (``duplex-ledger``). A usage error (an unknown option, a value
    out of range) is one line on stderr and exit 2, like every other rejected input
    (:mod:`reports.cli_errors`), not click's multi-line box."""
    try:
        result = app(standalone_mode=False)
    except typer.TyperException as exc:  # click's usage errors (typer's own copy of click)
        if type(exc).__name__ != "NoArgsIsHelpError":  # that one has printed the help already
            ctx = getattr(exc, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            say(f"error: {exc.format_message()}{hint}")  # type: ignore[attr-defined]
        raise SystemExit(getattr(exc, "exit_code", REJECTED)) from None
    except typer.Abort:
        raise SystemExit(OPERATIONAL) from None
    raise SystemExit(result if isinstance(result, int) else 0)


if __name__ == "__main__":
    main()
