"""``localchat pull``, ``models`` and ``rm``: fetch a model into the cache, list the catalog and
what was downloaded from the Hub, remove a downloaded model with what loads derived from it."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from localchat.app import cli_io
from localchat.app.cli_io import DebugOpt
from localchat.app.history_cli import print_table


def pull_command(
    model: Annotated[str, typer.Argument(help="Catalog alias, Hub repo id, or local path.")],
    debug: DebugOpt = False,
) -> None:
    """Download a model into the cache (progress on stderr) and print its local path."""
    from localchat.app.load_options import check_model_argument

    check_model_argument(model)
    source = cli_io.guarded(lambda: _checked(_resolve(model)))
    typer.echo(str(source.path))


def models_command(debug: DebugOpt = False) -> None:
    """List the catalog models and the Hub models downloaded: alias, source, size, cached,
    local path."""
    from localchat.app.settings import cache_dir
    from localchat.engine.hub.catalog import CATALOG
    from localchat.engine.hub.local_models import hub_downloads
    from localchat.engine.hub.resolve import list_models

    rows = [_model_row(info) for info in list_models(cache_dir())]
    shown = {e.repo_id for e in CATALOG.values() if e.bundle is None}  # (under their alias)
    rows += [(d.spec, "hub (downloaded)", cli_io.human_size(d.size_bytes), "✓", str(d.path))
             for d in hub_downloads() if d.spec not in shown]
    print_table(("ALIAS", "SOURCE", "SIZE", "CACHED", "PATH"), rows)


def rm_command(
    models: Annotated[list[str], typer.Argument(
        help="Downloaded models to remove: aliases, Hub repo ids, org/name:TAG.")],
    debug: DebugOpt = False,
) -> None:
    """Remove downloaded models and the files loads derived from them (never a local file)."""
    from localchat.app.settings import cache_dir
    from localchat.engine.errors import LocalchatError
    from localchat.engine.hub.local_models import remove_model

    failed = 0
    for spec in models:
        try:
            removed = remove_model(spec, cache_dir())
        except (LocalchatError, OSError) as exc:
            failed += 1
            said = exc.strerror if isinstance(exc, OSError) else None
            cli_io.error(f"{spec}: {said}" if said else str(exc))
            continue
        derived = (f"; and {len(removed.derived)} derived files "
                   f"({cli_io.human_size(removed.derived_bytes)})" if removed.derived else "")
        cli_io.note(f"removed {spec}: {', '.join(str(p) for p in removed.paths)} "
                    f"({cli_io.human_size(removed.bytes)} freed){derived}")
    if failed:
        raise typer.Exit(cli_io.EXIT_RUNTIME)


def _resolve(spec: str) -> Any:
    """Resolve a model spec to a local ``ModelSource``, downloading with progress on stderr."""
    from localchat.app.settings import cache_dir
    from localchat.engine.hub.resolve import resolve_model

    return resolve_model(
        spec, cache_dir=cache_dir(), download=True, progress=cli_io.stderr_progress
    )


def _checked(source: Any) -> Any:
    """``source`` once a GGUF's header and tensor table are read and checked against the
    file's size (corrupt or truncated: ``ModelLoadError``, the line ``ask`` and ``plan``
    give): a ``pull`` of a broken GGUF must not print its path and succeed. An HF folder is
    taken as downloaded (a repo may hold weights alone; ``ask`` names what it lacks)."""
    if source.format == "gguf":
        from pathlib import Path

        from localchat.engine.loader.gguf_header import read_gguf_header

        read_gguf_header(Path(source.path))
    return source


def _model_row(info: Any) -> tuple[str, str, str, str, str]:
    """One ``models`` table row from a hub ``ModelInfo``."""
    return (
        info.alias,
        info.source,
        cli_io.human_size(info.size_bytes),
        "✓" if info.cached else "—",
        str(info.path) if info.path else "—",
    )
