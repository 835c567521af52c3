"""Loading the engine for the TUI, off the UI thread, with errors as one line.

``load_async_engine`` resolves a model spec (catalog alias, Hub repo, HF folder, ``.gguf``),
downloading it when missing (``hub.resolve_model``, progress lines to a callback), and starts
an ``AsyncLLMEngine`` on it (its step loop runs on its own thread). The app calls it from a
thread worker, so the UI never blocks while weights load. ``plan_for`` predicts a cached model's
memory with the planner (``engine/memory/planner.py``) when that module is present.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from localchat.engine.errors import LocalchatError

Progress = Callable[[str], None]
# transformers' lazy module is not safe to import from two threads at once (a model load and a
# memory plan would race: "cannot import name 'AutoConfig'"), so the TUI's worker threads take
# this lock around anything that may import it.
ENGINE_LOCK = threading.RLock()


def load_async_engine(spec: str, *, quant: str | None = None, draft: str | None = None,
                      progress: Progress | None = None, context: int | None = None,
                      context_origin: str = "--context", endpoint: str | None = None) -> Any:
    """Resolve ``spec`` (downloading with ``progress`` lines) and load an ``AsyncLLMEngine``.

    ``quant`` is a weight format (None: ``auto``); ``draft`` a draft model spec for
    speculative decoding (``auto``: the catalog's pairing; None/``none``: off); ``context``
    the context size in tokens (None: the model's, at most 8192 on CPU); ``endpoint`` an
    OpenAI-compatible server URL (over the settings' ``endpoint``) to chat with instead. It is
    ``engine_loader.load``, the one load path, with progress to the callback: the TUI owns
    the terminal, so nothing may be written to stderr.

    Raises:
        LocalchatError: unknown model, download or load failure, a bad draft (one line).
        CliUsageError: ``context`` is above the model's trained context (both named).
    """
    remote = _remote(spec, quant, draft, context, endpoint)
    if remote is not None:
        return remote
    with ENGINE_LOCK:
        return _load(spec, quant, draft, progress, context, context_origin)


def _remote(spec: str, quant: str | None, draft: str | None, context: int | None,
            endpoint: str | None = None) -> Any:
    """An ``AsyncRemoteEngine`` when an endpoint is given (``--endpoint``,
    ``LOCALCHAT_ENDPOINT`` or ``endpoint`` in config.toml) or a ``localchat serve`` for
    ``spec`` runs (and no weight format, draft or context was asked for: the server's own
    would apply); else None."""
    from localchat.app.server.async_client import connect
    from localchat.app.server.state import find_server
    from localchat.app.settings import load_settings

    settings = load_settings()
    endpoint = endpoint or settings.endpoint
    if endpoint:
        return connect(endpoint, settings.api_key, spec)
    if quant not in (None, "auto") or draft not in (None, "", "none", "off") or context:
        return None
    info = find_server(spec)
    if info is None or (info.auth and not settings.api_key):
        return None
    try:
        return connect(info.url, settings.api_key, info.model)
    except LocalchatError:
        return None


def check_async_load(spec: str, *, quant: str | None = None, draft: str | None = None,
                     context: int | None = None, context_origin: str = "--context",
                     endpoint: str | None = None) -> None:
    """Refuse, before anything is unloaded, what ``load_async_engine`` would refuse with the
    same arguments without downloading or loading (``engine_loader.check_before_load``: a
    model or draft that names no model, a draft that is the model itself, a bad weight
    format). With an endpoint (the argument or the settings') the server judges the model,
    and nothing is checked here.

    Raises:
        LocalchatError, CliUsageError: the value's problem, in the words ``ask`` uses.
    """
    from localchat.app import engine_loader
    from localchat.app.settings import load_settings

    if endpoint or load_settings().endpoint:
        return
    engine_loader.check_before_load(_options(spec, quant, draft, context, context_origin))


def _options(spec: str, quant: str | None, draft: str | None, context: int | None,
             context_origin: str) -> Any:
    from localchat.app.load_options import LoadOptions

    return LoadOptions(model=spec, draft=draft, quant=quant or "auto", context=context,
                       context_origin=context_origin, draft_origin="the draft setting",
                       quant_origin="the quant setting")  # the TUI has no such flags


def _load(spec: str, quant: str | None, draft: str | None, progress: Progress | None,
          context: int | None = None, context_origin: str = "--context") -> Any:
    from localchat.app import engine_loader

    options = _options(spec, quant, draft, context, context_origin)
    return engine_loader.load(options, progress=progress or _quiet, use_async=True)


def _quiet(line: str) -> None:
    """Progress that goes nowhere (never stderr: the TUI owns the terminal)."""


def describe_error(exc: BaseException) -> str:
    """One line for a notification: a ``LocalchatError``'s message, else the type and text."""
    from localchat.app.cli_io import CliUsageError

    if isinstance(exc, (LocalchatError, CliUsageError)):
        text = str(exc)
    elif isinstance(exc, MemoryError) or "out of memory" in str(exc).lower():
        text = f"out of memory: {exc}".rstrip(": ")
    else:
        text = f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())


def plan_for(path: Any, context_len: int | None = None) -> str | None:
    """The memory plan of a cached model as a short text, or None when the planner is not in
    this build. Reads only the model's config and tensor table (cached under the user's
    cache), never its weights. Waits for a model load in progress (``ENGINE_LOCK``).

    The same plan as ``localchat plan`` and the engine: ``context_len`` (None: the engine's
    default, the model's trained context, at most 8192 on CPU: ``plan_cli.default_context``),
    the device the engine would use (CUDA when present, else CPU) and its default budget."""
    with ENGINE_LOCK:
        return _plan_text(path, context_len)


def _plan_text(path: Any, context_len: int | None) -> str | None:
    """``localchat plan``'s plan of ``path`` (``plan_cli.plan_model``: the weight format the
    engine loads under the ``quant`` setting, a GGUF's own ``native`` format included), as the
    picker's text."""
    try:
        import torch

        from localchat.app.plan_cli import plan_model
        from localchat.app.settings import load_settings
        from localchat.engine.memory.budget import DeviceSpec
    except ImportError:
        return None
    try:
        kind = "cuda" if torch.cuda.is_available() else "cpu"
        quant = getattr(load_settings(), "quant", None) or "auto"
        r = plan_model(str(path), None, DeviceSpec.detect(kind), None, context_len, 1, quant)
    except Exception as exc:  # noqa: BLE001 - shown as text, never raised into the UI
        return f"no plan: {describe_error(exc)}"
    choice = r["choice"]
    head = (f"format {r['loads']} at {choice['context_len']} tokens of context "
            f"(budget {r['budget_bytes'] / 2**30:.1f} GiB)")
    lines = [head]
    native = r["native"]
    if native is not None:
        mark = "fits" if native["fits"] else "too big"
        lines.append(f"  native weights {native['weight_bytes'] / 2**20:,.0f} MiB, "
                     f"total {native['total_bytes'] / 2**30:.2f} GiB ({mark}, the file's own)")
    for row in r["rows"]:
        mark = "fits" if row["fits"] else "too big"
        lines.append(f"  {row['format']:6} weights {row['weight_bytes'] / 2**20:,.0f} MiB, "
                     f"KV {row['kv_bytes'] / 2**20:,.0f} MiB, total "
                     f"{row['total_bytes'] / 2**30:.2f} GiB ({mark})")
    if r["note"]:
        lines.append(r["note"])
    return "\n".join(lines)
