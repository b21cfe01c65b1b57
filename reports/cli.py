"""``duplex-ledger`` command line (typer).

Sub-commands live in their own modules, each with a ``register(app)`` that adds its commands
to a typer app. This module imports none of them up front: :data:`COMMANDS` names, for every
top-level command, the module that registers it and the line ``duplex-ledger --help`` shows,
and :class:`LazyCommands` imports that module only when the command runs (or its own
``--help`` is asked for). So ``duplex-ledger --help`` imports no database driver, and an
offline command imports only what it uses (issue 22: every command used to spend ≈ 2.6 s of
CPU importing vllm's neighbours first). Importing this module must not import vllm or torch.

Adding a command: one line in :data:`COMMANDS` (``"name": ("reports.cli_x", "what it does")``,
where ``reports.cli_x.register(app)`` adds ``name``). A module registered eagerly with
``reports.cli_x.register(app)`` below still works; it is simply imported at start-up.

Help is click's plain layout (``rich_markup_mode=None``): it wraps to the terminal and never
cuts an option's help or its default (a rich panel at 80 columns did).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer
from typer import _click as click  # typer's own copy of click (typer >= 0.24)
from typer.core import TyperGroup

from reports.cli_errors import OPERATIONAL, REJECTED, closed_pipe, guard_stderr, output_failed, say

COMMANDS: dict[str, tuple[str, str]] = {
    "db": ("reports.cli_events", "Database schema: upgrade, downgrade, current, grant."),
    "events": ("reports.cli_events", "The event log as JSONL: import, export, tail."),
    "schema": ("reports.cli_events", "JSON Schema of every event kind."),
    "audit": ("reports.cli_projections", "Find leaked engine request ids, with the positions that prove each leak."),
    "tables": ("reports.cli_projections", "Re-project the per-turn --log-stats tables from the log."),
    "rebuild": ("reports.cli_projections", "Drop the read models and rebuild them from the log."),
    "sessions": ("reports.cli_sessions", "List the sessions of the log: state, replica, turns, held ids."),
    "verify": ("reports.cli_verify", "Check the hash chain, the read models and the checkpoint."),
    "digest": ("reports.cli_verify", "Print the log's head position and hash (keep it elsewhere)."),
    "demo": ("reports.cli_engine", "Play the bundled traces on live vLLM engines."),
    "run": ("reports.cli_engine", "Play your own trace(s) on live vLLM engines."),
    "model": ("reports.cli_engine", "Prepare the models the live engines run."),
    "metrics": ("reports.cli_metrics", "The Prometheus families, re-projected from the log."),
    "timeline": ("reports.cli_timeline", "One session as a self-contained HTML page."),
    "serve": ("reports.cli_serve", "Serve sessions over the OpenAI Realtime protocol (WebSocket /v1/realtime)."),
}
"""Top-level command -> (module whose ``register(app)`` adds it, one-line help)."""


class LazyCommands(TyperGroup):
    """The root group: commands of :data:`COMMANDS` are built on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*COMMANDS, *(name for name in self.commands if name not in COMMANDS)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self._load(COMMANDS[cmd_name][0])
        return self.commands.get(cmd_name)

    def _load(self, module_name: str) -> None:
        """Import ``module_name``, let it register its commands on a fresh typer app, and add
        the click commands built from them."""
        holder = typer.Typer(rich_markup_mode=None, add_completion=False, pretty_exceptions_enable=False)
        importlib.import_module(module_name).register(holder)
        holder.callback()(_no_options)  # a group even when the module registers one command
        for name, command in typer.main.get_group(holder).commands.items():
            self.commands.setdefault(name, command)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """Parse the top-level arguments (``--help`` prints here); see :meth:`invoke`."""
        try:
            return super().parse_args(ctx, args)
        except BrokenPipeError:
            raise typer.Exit(closed_pipe()) from None
        except OSError as exc:  # ``duplex-ledger --help > /dev/full``
            raise typer.Exit(output_failed(exc)) from None

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; a closed pipe on stdout/stderr ends it quietly with exit 141
        (:data:`reports.cli_errors.PIPE_CLOSED`), before click's own handler would say 1."""
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise typer.Exit(closed_pipe()) from None
        except OSError as exc:  # stdout on a full disk (> /dev/full): one line, not a traceback
            raise typer.Exit(output_failed(exc)) from None
        except SystemExit as exc:  # a plain rich Console's on_broken_pipe exits 1 while handling it
            if isinstance(exc.__context__, BrokenPipeError):
                raise typer.Exit(closed_pipe()) from None
            raise

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list from :data:`COMMANDS` (nothing is imported to print it)."""
        rows = [
            (name, COMMANDS[name][1] if name in COMMANDS else self._short_help(ctx, name))
            for name in self.list_commands(ctx)
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def _short_help(self, ctx: click.Context, name: str) -> str:
        command = self.get_command(ctx, name)
        return command.get_short_help_str() if command is not None else ""


def _no_options() -> None:
    """(the holder group's callback: no options of its own)"""


app = typer.Typer(
    name="duplex-ledger",
    help=(
        "Event-sourced session ledger for full-duplex voice sessions. Every command takes "
        "--db URL (default: $DUPLEX_LEDGER_DB_URL, else sqlite+aiosqlite:///./duplex-ledger.db)."
    ),
    cls=LazyCommands,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.callback()(_no_options)  # the commands come from COMMANDS, so typer sees none: a group still
# --- commands registered eagerly (imported at start-up; prefer a COMMANDS line) ---------------


def main() -> None:
    """Console-script entry point (``duplex-ledger``). A usage error (an unknown option, a value
    out of range) is one line on stderr and exit 2, like every other rejected input
    (:mod:`reports.cli_errors`), not click's multi-line box. A reader that closed the pipe
    (``duplex-ledger audit | head -1``) ends the command quietly with exit 141, as git does. A
    message that cannot be written to stderr (``2>/dev/full``) changes no exit code
    (:func:`reports.cli_errors.guard_stderr`)."""
    guard_stderr()
    try:
        result = app(standalone_mode=False)
    except typer.TyperException as exc:  # click's usage errors (typer's own copy of click)
        if type(exc).__name__ == "NoArgsIsHelpError":  # `duplex-ledger` alone: the help on stderr, as click's
            try:  # standalone mode shows it (standalone_mode=False only raises it)
                exc.show()  # type: ignore[attr-defined]
            except BrokenPipeError:
                raise SystemExit(closed_pipe()) from None
            except OSError:  # stderr on a full disk: the exit code is all that is left
                pass
        else:
            ctx = getattr(exc, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            say(f"error: {exc.format_message()}{hint}")  # type: ignore[attr-defined]
        raise SystemExit(getattr(exc, "exit_code", REJECTED)) from None
    except typer.Abort:
        raise SystemExit(OPERATIONAL) from None
    except BrokenPipeError:  # a usage error's line to a closed stderr
        raise SystemExit(closed_pipe()) from None
    try:
        if sys.stdout is not None:  # None: started with stdout closed (>&-); click wrote nothing
            sys.stdout.flush()  # what is still buffered meets a closed pipe here, not at exit
    except BrokenPipeError:
        raise SystemExit(closed_pipe()) from None
    except OSError as exc:  # or a full disk
        raise SystemExit(output_failed(exc)) from None
    raise SystemExit(result if isinstance(result, int) else 0)


if __name__ == "__main__":
    main()
