"""CLI command ``metrics``: the Prometheus exposition re-projected from the log (issue 16).

The same fold the live engine feeds (``projections.metrics`` through ``engine_bridge.prometheus``)
runs over the stored events, so a log gives the samples the live ``/metrics`` showed for it
(``running_counter_drift`` needs live engines and is left out). Needs neither vllm nor torch.
Exit 0, 1 when the log's hash chain is broken (after the output: the edited log's account),
or 2 for a missing ledger or a data error.
"""

from __future__ import annotations

import typer

from engine_bridge.prometheus import LedgerMetrics
from events.chain_walk import ChainFault, chain_fault
from events.limits import MAX_POSITION, overflows
from events.store.store import EventStore
from reports.cli_errors import checked_url, echo_text, exit_if_tampered, run
from reports.cli_numbers import max_idle_option
from reports.cli_projections import DB_HELP


async def project_metrics(db: str | None, until_position: int | None = None, max_idle_s: float = 30.0) -> LedgerMetrics:
    """Fold the log (up to ``until_position``) into a fresh :class:`LedgerMetrics`."""
    return (await _fold(db, until_position, max_idle_s, check_chain=False))[0]


async def _fold(
    db: str | None, until_position: int | None, max_idle_s: float, *, check_chain: bool
) -> tuple[LedgerMetrics, ChainFault | None]:
    """(the metrics folded up to ``until_position``, the first fault of the hash chain of the
    rows folded — checked only when ``check_chain``; None: intact or not checked)."""
    metrics = LedgerMetrics(max_idle_s=max_idle_s)
    async with await EventStore.open(db, read_only=True) as store:
        head = await store.head_position()
        until = head if until_position is None else min(until_position, head)
        fault = await chain_fault(store, until) if check_chain else None
        async for stored in store.read_all(0, until_position=until):
            metrics.apply(stored)
    return metrics, fault


def metrics(
    db: str | None = typer.Option(None, "--db", help=DB_HELP),
    until_position: int | None = typer.Option(
        None, "--until-position", min=0, max=MAX_POSITION, help="Re-project as of this position (time travel)."
    ),
    max_idle: float = max_idle_option("As audit --max-idle, for duplex_ledger:request_ids_leaked."),
) -> None:
    """Print the Prometheus exposition (vllm_omni:* and duplex_ledger:* families) re-projected
    from the log: the samples the live engine's /metrics gives for the same events."""
    url = checked_url(db)
    result, fault = run(lambda: _fold(url, until_position, max_idle, check_chain=True), url)
    text = result.exposition()
    if n := overflowed_samples(result):
        typer.echo(
            f"warning: {n} sample(s) overflowed (a sum over the log that is not finite or beyond 64 bits); "
            "Prometheus carries them as floats, so they are printed, but they are no exact totals",
            err=True,
        )
    echo_text(text, nl=not text.endswith("\n"))
    exit_if_tampered(fault, url)


def overflowed_samples(result: LedgerMetrics) -> int:
    """How many samples of the registry overflow by the tables' rule (:mod:`reports.overflow`:
    not finite, or an integer total beyond signed 64 bits), ``*_created`` stamps aside."""
    return sum(
        overflows(sample.value) or overflows(int(sample.value))  # int(): only once finite
        for metric in result.registry.collect()
        for sample in metric.samples
        if not sample.name.endswith("_created")
    )


def register(app: typer.Typer) -> None:
    """Add ``metrics`` to the main CLI app."""
    app.command("metrics")(metrics)
