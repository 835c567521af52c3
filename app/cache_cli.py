"""``localchat cache``: what the cache folder holds beside the models, and pruning it.

``show`` lists the files loads derive from the models (repacked weights, kernel builds:
``engine/cache_gc.py``) with their size, when each was last used and why it is stale, if it
is; ``prune`` removes the stale ones (``--all``: every one but a write or kernel build in
progress, each rebuilt by the next load that needs it). The downloaded models are never
touched: ``pull`` fetched them, ``models`` lists them and ``rm`` removes one.
"""

from __future__ import annotations

import time
from typing import Annotated

import typer

from localchat.app import cli_io

cache_app = typer.Typer(
    name="cache", help="Show and prune what loads derive from the models (repacked weights, "
    "kernel builds).", no_args_is_help=True, add_completion=False,
)


def _entries(max_age_days: float):
    from localchat.app.settings import cache_dir
    from localchat.engine.cache_gc import scan
    from localchat.kernels.cpu.build import build_name

    return cache_dir(), scan(cache_dir(), kernel_build=build_name(), max_age_days=max_age_days)


AgeOpt = Annotated[int, typer.Option(
    "--max-age", help="Days unused after which a repacked file is stale.", min=0)]


@cache_app.command()
def show(max_age: AgeOpt = 30) -> None:
    """List each entry: kind, name, size, last use, and why it is stale (if it is)."""
    from localchat.app.history_cli import print_table

    folder, entries = _entries(max_age)
    rows = [(e.kind, cli_io.one_line(e.path.name), cli_io.human_size(e.bytes),
             time.strftime("%Y-%m-%d", time.localtime(e.last_used)),
             "in progress" if e.busy else e.stale or "") for e in entries]
    if rows:
        print_table(("KIND", "NAME", "SIZE", "USED", "STALE"), rows)
    stale = [e for e in entries if e.stale]
    cli_io.note(f"{folder}: {cli_io.human_size(sum(e.bytes for e in entries))} in "
                f"{len(entries)} entries beside the models; "
                + (f"{cli_io.human_size(sum(e.bytes for e in stale))} stale in {len(stale)} "
                   "('localchat cache prune' removes them)" if stale else "none stale"))


@cache_app.command()
def prune(
    max_age: AgeOpt = 30,
    everything: Annotated[bool, typer.Option(
        "--all", help="Every entry but a write or build in progress, not only the stale ones "
        "(each is rebuilt when needed).")
    ] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Only list what would be removed.")] = False,
) -> None:
    """Remove the stale entries (never the models); prints each one removed."""
    from localchat.engine.cache_gc import remove

    folder, entries = _entries(max_age)
    chosen = [e for e in entries if e.stale or (everything and not e.busy)]
    for e in chosen:
        typer.echo(f"{e.path}  {cli_io.human_size(e.bytes)}  {e.stale or 'not stale'}")
    if dry_run:
        cli_io.note(f"would remove {len(chosen)} entries, "
                    f"{cli_io.human_size(sum(e.bytes for e in chosen))}")
        return
    removed = remove(chosen)
    left = len(chosen) - len(removed)
    cli_io.note(f"removed {len(removed)} entries, "
                f"{cli_io.human_size(sum(e.bytes for e in removed))} freed in {folder}"
                + (f"; {left} could not be removed" if left else ""))
    if left:
        raise typer.Exit(cli_io.EXIT_RUNTIME)
