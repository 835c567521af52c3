"""``localchat plan MODEL``: the memory plan for a model on this machine, before any download.

Prints one row per weight format (weights, KV cache, draft, activations, runtime, total, what
is left of the budget) and the choice the engine would make (``engine/memory/planner.py``), or
the same as JSON with ``--json``. Only ``config.json`` and the safetensors headers of a Hub
repo are fetched (``engine/hub/describe.py``).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from localchat.app import cli_io
from localchat.app.cli_io import CliUsageError

GiB = 2**30
DEFAULT_MAX_CONTEXT = 8192


def plan_command(
    model: Annotated[str, typer.Argument(help="Catalog alias, Hub repo id, HF folder or .gguf.")],
    context: Annotated[
        int | None,
        typer.Option("-C", "--context", help="Tokens per conversation (prompt + reply).",
                     show_default="config 'context', else the model's, at most 8192 on CPU"),
    ] = None,
    memory: Annotated[
        str | None,
        typer.Option("--memory", help="Memory to plan for, e.g. 12GiB.",
                     show_default="free memory minus a margin"),
    ] = None,
    device: Annotated[
        str | None,
        typer.Option("--device", help="cpu or cuda.", show_default="cuda if present, else cpu"),
    ] = None,
    draft: Annotated[
        str | None, typer.Option("--draft", help="Draft model for speculative decoding.",
                                 show_default=False)
    ] = None,
    quant: Annotated[
        str | None, typer.Option("--quant", help="auto, native (a GGUF's own format), none, "
                                 "fp8, int8 or int4.", show_default="config 'quant', else auto")
    ] = None,
    max_num_seqs: Annotated[
        int, typer.Option("--max-num-seqs", help="Conversations held in the KV cache at once.")
    ] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show the full traceback on errors.",
                                        show_default=False)] = False,
) -> None:
    """Plan memory for MODEL: weights, KV cache, draft, activations; pick the weight format."""
    from localchat.app.load_options import (
        LoadOptions,
        bad_value_error,
        check_load_options,
        check_max_num_seqs,
        check_model_argument,
        context_choice,
        flag_or_setting,
    )
    from localchat.app.settings import load_settings
    from localchat.engine.memory.budget import parse_size

    check_model_argument(model)
    # the settings ask and serve read (config.toml, LOCALCHAT_*), so the plan is what they
    # load, checked as they check them
    settings = load_settings()
    context, context_origin = context_choice(context, settings)
    draft, draft_origin = flag_or_setting(draft, settings, "draft")
    quant, quant_origin = flag_or_setting(quant, settings, "quant")
    options = LoadOptions(model=model, draft=draft, quant=quant or "auto", context=context,
                          context_origin=context_origin, draft_origin=draft_origin,
                          quant_origin=quant_origin)
    check_max_num_seqs(max_num_seqs)
    check_load_options(options)
    quant = options.quant
    try:
        budget = parse_size(memory) if memory is not None else None
    except ValueError as e:
        raise CliUsageError(f"--memory: {e}") from None
    spec = _device(device, budget is not None)
    if quant == "fp8" and not spec.fp8:  # the device planned for (check_load_options: this one)
        raise bad_value_error(quant_origin)(
            f"{quant_origin} fp8: needs a CUDA GPU of compute capability 8.9 or newer, and "
            f"the device planned for ({spec.name}) is not one (use int8 or int4)")
    from huggingface_hub.utils import disable_progress_bars
    from huggingface_hub.utils import logging as hf_logging

    disable_progress_bars()  # plan fetches a config and headers: no bars
    if not debug:  # huggingface_hub logs each retry; our one error line says it all
        hf_logging.set_verbosity_error()
    from localchat.kernels.cpu import build

    with build.predict_only():  # sizes only: a plan on a fresh machine builds no kernels
        result = cli_io.guarded(lambda: plan_model(model, draft, spec, budget, context,
                                                   max_num_seqs, quant, context_origin,
                                                   draft_origin))
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        _print_table(result)


def default_context(trained: int, device_type: str) -> int:
    """The context the engine uses when none is given: the model's trained context, at most
    ``DEFAULT_MAX_CONTEXT`` on CPU (as ``LLMEngine.from_path``)."""
    return min(trained, DEFAULT_MAX_CONTEXT) if device_type == "cpu" else trained


def _device(name: str | None, has_budget: bool):
    from localchat.engine.memory.budget import DeviceSpec

    if name is None:
        import torch

        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name not in ("cpu", "cuda"):
        raise CliUsageError(f"--device {name}: choose cpu or cuda")
    try:
        return DeviceSpec.detect(name, allow_hypothetical=has_budget)
    except ValueError as e:
        raise CliUsageError(str(e)) from None


def plan_model(model: str, draft: str | None, device, budget: int | None,
               context: int | None, max_num_seqs: int, quant: str,
               context_origin: str = "--context", draft_origin: str = "--draft"
               ) -> dict[str, Any]:
    """Describe the model (and draft), plan, and return the JSON-ready result.

    Raises:
        CliUsageError: ``context`` is above the model's trained context (both named).
        DraftChoiceError: the draft is the model itself.
        LocalchatError: the model or the draft cannot be described (a draft's message starts
            with ``draft_origin``).
    """
    from localchat.app.settings import cache_dir
    from localchat.engine.hub.describe import describe_model
    from localchat.engine.memory.budget import available_memory_bytes, default_budget_bytes
    from localchat.engine.memory.planner import plan_memory

    target = describe_model(model, cache_dir())
    from localchat.app.engine_loader import NGRAM, draft_spec, kv_cache_setting, naming_the_draft
    from localchat.app.load_options import LoadOptions, check_trained_context

    # --draft auto: the catalog's natural draft, as ask / serve load it
    draft = draft_spec(LoadOptions(model=model, draft=draft, draft_origin=draft_origin), model)
    # prompt lookup (--draft ngram) holds no draft weights or KV cache: nothing to plan
    drafted = None
    if draft and draft.lower() != NGRAM:
        with naming_the_draft(draft_origin):
            drafted = describe_model(draft, cache_dir())
        _refuse_the_model_itself(model, draft, draft_origin)
    if drafted is not None and drafted.config.vocab_size != target.config.vocab_size:
        cli_io.warn(f"draft {drafted.name} has a vocabulary of {drafted.config.vocab_size} "
                    f"tokens, the model {target.config.vocab_size}: not a matching pair")
    available = None
    if budget is None:
        available = available_memory_bytes(device.type)
        budget = default_budget_bytes(device.type, available)
    trained = target.config.max_position_embeddings
    check_trained_context(context_origin, context, target.name, trained)
    ctx = context or default_context(trained, device.type)
    # each file's own format's exact bytes, read once (its tensor table)
    native_bytes = _native_bytes(model, target.config, device)
    draft_native_bytes = _native_bytes(draft, drafted.config, device) if drafted else None
    plan = plan_memory(target.config, budget, ctx, max_num_seqs,
                       drafted.config if drafted else None, device,
                       quant="auto" if quant == "native" else quant,
                       int4_group_size=target.int4_group_size,
                       draft_int4_group_size=drafted.int4_group_size if drafted else None,
                       native_weight_bytes=native_bytes,
                       draft_native_weight_bytes=draft_native_bytes,
                       kv_cache_dtype=kv_cache_setting())
    notes = [*target.notes, *(drafted.notes if drafted else ()), *plan.notes]
    native = _native_row(plan, native_bytes, draft_native_bytes)
    if quant == "native" and native is None:
        raise CliUsageError(f"--quant native: {target.name} is not a local GGUF file, so it "
                            "has no format of its own (choose auto, none, fp8, int8 or int4)")
    return {
        "model": _describe(target),
        "draft": _describe(drafted) if drafted else None,
        "available_bytes": available,
        **plan.to_dict(),
        "native": native,
        "quant": quant,
        "loads": _loaded_format(model, device, plan, native, quant, drafted is not None),
        "notes": notes,
    }


def _refuse_the_model_itself(model: str, draft: str, origin: str) -> None:
    """As ``ask`` refuses it (``engine_loader.refuse_the_model_itself``): a draft on disk that
    is the model's file or folder (links too). Nothing is checked when either is not on disk
    (a Hub repo not downloaded yet)."""
    from localchat.app.engine_loader import refuse_the_model_itself
    from localchat.app.settings import cache_dir
    from localchat.engine.errors import LocalchatError
    from localchat.engine.hub.resolve import resolve_model

    try:
        model_path, draft_path = (resolve_model(spec, cache_dir=cache_dir(), download=False).path
                                  for spec in (model, draft))
    except LocalchatError:
        return
    refuse_the_model_itself(draft, draft_path, model_path, origin)


def _loaded_format(spec: str, device, plan, native: dict[str, Any] | None, quant: str,
                   drafted: bool) -> str:
    """The weight format ``ask`` / ``serve`` load under ``--quant quant``: the GGUF's own
    (``native``) when forced, or under ``auto`` where it holds no more than the planner's
    choice and the device runs it well (``engine.memory.auto.choose_scheme`` and
    ``loader.native.native_is_fast``, the rule the engine applies); else the plan's choice."""
    if native is None or quant not in ("auto", "native"):
        return plan.choice.format
    if quant == "native":
        return "native"
    if native["weight_bytes"] > plan.choice.weight_bytes or (drafted and (
            native["draft_weight_bytes"] is None
            or native["draft_weight_bytes"] > plan.choice.draft_weight_bytes)):
        return plan.choice.format
    from localchat.app.settings import cache_dir
    from localchat.engine.hub.resolve import resolve_model
    from localchat.engine.loader.native import native_is_fast

    path = resolve_model(spec, cache_dir=cache_dir(), download=False).path
    return "native" if native_is_fast(path, device.type, cache_dir()) else plan.choice.format


def _native_bytes(spec: str, config, device) -> int | None:
    """Exact bytes of a local GGUF's own format (float tensors in the device's unquantized
    dtype), or ``None`` (not a local GGUF, or a type native cannot hold)."""
    from localchat.app.settings import cache_dir
    from localchat.engine.errors import LocalchatError
    from localchat.engine.hub.resolve import resolve_model
    from localchat.engine.loader.native import gguf_native_bytes
    from localchat.engine.memory.planner import unquantized_format

    try:
        path = resolve_model(spec, cache_dir=cache_dir(), download=False).path
    except LocalchatError:
        return None
    dtype = _float_dtype(unquantized_format(device))
    return gguf_native_bytes(path, config, device.type, dtype, cache_dir())


def _native_row(plan, native: int | None, draft_native: int | None = None
                ) -> dict[str, Any] | None:
    """The GGUF's own format (``--quant native``) beside the planner's rows: ``native``, its
    exact weight bytes (``_native_bytes``: the local file's tensor table, no tensor read), and
    the plan's choice with those weights instead; ``None`` when the model is not a local GGUF
    (``native`` None). ``draft_native``: the draft's own bytes likewise
    (``draft_weight_bytes``; None when the draft is not a local GGUF: its planned bytes count
    then)."""
    if native is None:
        return None
    c = plan.choice
    total = c.total_bytes - c.weight_bytes + native
    if draft_native is not None:
        total += draft_native - c.draft_weight_bytes
    return {"weight_bytes": native, "draft_weight_bytes": draft_native,
            "context_len": c.context_len, "total_bytes": total,
            "fits": total <= plan.budget_bytes}


def _float_dtype(fmt: str):
    import torch

    return torch.bfloat16 if fmt == "bf16" else torch.float32


def _describe(d) -> dict[str, Any]:
    import torch

    from localchat.engine.memory.footprint import weight_bytes

    return {"spec": d.spec, "name": d.name, "architecture": d.config.architecture,
            "parameters": weight_bytes(d.config, "none", "cpu", torch.float32) // 4,
            "checkpoint_parameters": d.checkpoint_params, "checkpoint_bytes": d.checkpoint_bytes,
            "checkpoint_local": d.source == "local",
            "checkpoint_dtypes": d.checkpoint_dtypes,
            "max_position_embeddings": d.config.max_position_embeddings,
            "int4_group_size": d.int4_group_size}


def _print_table(r: dict[str, Any]) -> None:
    m, dev = r["model"], r["device"]
    typer.echo(f"model:   {m['name']} ({m['architecture']}, {m['parameters'] / 1e9:.2f}B "
               "parameters" + (f", {'on disk' if m.get('checkpoint_local') else 'download'} "
                               f"{cli_io.human_size(m['checkpoint_bytes'])}"
                               if m["checkpoint_bytes"] else "") + ")")
    if r["draft"]:
        typer.echo(f"draft:   {r['draft']['name']} ({r['draft']['parameters'] / 1e9:.2f}B)")
    budget = f"{_gib(r['budget_bytes'])}"
    if r["available_bytes"] is not None:
        budget += f" ({_gib(r['available_bytes'])} free minus a margin)"
    typer.echo(f"device:  {dev['name']}, budget {budget}")
    typer.echo(f"context: {r['requested_context_len']} tokens x {r['max_num_seqs']} "
               f"sequence{'s' if r['max_num_seqs'] > 1 else ''}")
    header = ("FORMAT", "WEIGHTS", "KV", "DRAFT", "ACTIVATIONS", "RUNTIME", "TOTAL", "LEFT",
              "FITS")
    rows = [(row["format"], _gib(row["weight_bytes"]), _gib(row["kv_bytes"]),
             _gib(row["draft_weight_bytes"] + row["draft_kv_bytes"]),
             _gib(row["activation_bytes"]), _gib(row["overhead_bytes"]),
             _gib(row["total_bytes"]), _gib(row["margin_bytes"]), "yes" if row["fits"] else "no")
            for row in r["rows"]]
    widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        typer.echo("  ".join(c.rjust(w) if i else c.ljust(w)
                             for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    if r.get("native"):
        n = r["native"]
        draft = n.get("draft_weight_bytes")
        rule = ("auto's pick when it is no bigger than the choice" if draft is not None
                or not r["draft"] else "not auto's pick: the draft is no GGUF")
        typer.echo(f"native:  {_gib(n['weight_bytes'])} weights"
                   f"{f' (draft {_gib(draft)})' if draft is not None else ''} in the GGUF's own format "
                   f"(--quant native; {rule}): "
                   f"{_gib(n['total_bytes'])} in all at {n['context_len']} tokens, "
                   f"{'fits' if n['fits'] else 'does not fit'}")
    c = r["choice"]
    how = "forced" if r["forced"] else "best that fits"
    if r["loads"] == "native" and r.get("native") and c["format"] != "native":
        n = r["native"]
        why = "forced" if r["quant"] == "native" else \
            f"auto: the GGUF's own format, no bigger than {c['format']}"
        typer.echo(f"choice:  native at {n['context_len']} tokens ({why}; "
                   f"{_gib(n['total_bytes'])} of {_gib(r['budget_bytes'])})")
    else:
        typer.echo(f"choice:  {c['format']} at {c['context_len']} tokens ({how}; "
                   f"{_gib(c['total_bytes'])} of {_gib(r['budget_bytes'])})")
    for note in [r["note"], *r["notes"]]:
        if note:
            typer.echo(f"note:    {note}")


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"
