"""Options for loading the engine that come from ``--draft``, ``--num-speculative-tokens``,
``--quant`` and ``--context`` (or the settings), checked before any model is resolved or loaded.

``engine_loader.load`` turns them into an ``EngineConfig``. The weight format's and k's ranges
and defaults are the engine config's own (``QuantConfig``, ``SpeculativeConfig``):
``check_load_options`` builds those parts before any model is resolved and turns their
``ValueError`` into a usage error that names the flag (or config key).
"""

from __future__ import annotations

from dataclasses import dataclass

from localchat.app.cli_io import CliUsageError


@dataclass(frozen=True)
class LoadOptions:
    """What to load: ``model`` (a model spec), ``draft`` (a draft model spec for speculative
    decoding, ``auto`` for the catalog's pairing, or None), ``num_speculative_tokens`` (k, the
    most draft tokens per step; None: ``SpeculativeConfig``'s default) and ``quant``
    (``auto|native|none|fp8|int8|int4``), as the
    user gave them; ``context`` the context size in tokens (prompt + reply; None: the model's,
    at most 8192 on CPU) and ``context_origin`` where it came from (named in errors)."""

    model: str
    draft: str | None = None
    quant: str = "auto"
    num_speculative_tokens: int | None = None
    context: int | None = None
    context_origin: str = "--context"


def check_load_options(options: LoadOptions, from_flags: dict[str, bool] | None = None) -> None:
    """Refuse values the engine does not take, as the engine's config checks them.

    ``from_flags`` says which of ``draft``/``quant`` came from a flag (else from the settings),
    so the message names where to change it.

    Raises:
        CliUsageError: ``QuantConfig`` refuses ``quant``, ``fp8`` without a CUDA GPU of
            compute capability >= 8.9 (checked before any model loads),
            ``SpeculativeConfig`` refuses ``num_speculative_tokens`` (the engine's reason in
            the message), or ``context`` is below 1 (exit 2).
    """
    from localchat.engine.config import QuantConfig, SpeculativeConfig

    from_flags = from_flags or {}

    def where(name: str) -> str:
        return f"--{name}" if from_flags.get(name) else f"{name} (from the config or environment)"

    try:
        QuantConfig(scheme=options.quant)
    except ValueError as exc:
        raise CliUsageError(f"{where('quant')} {options.quant}: {exc}") from None
    if options.context is not None and options.context < 1:
        raise CliUsageError(f"{options.context_origin} {options.context}: the context must be "
                            "a positive number of tokens")
    if options.quant == "fp8":
        from localchat.engine.quant.schemes import fp8_supported

        if not fp8_supported("cuda"):
            raise CliUsageError(f"{where('quant')} fp8: needs a CUDA GPU of compute capability "
                                "8.9 or newer, and none is available (use int8 or int4)")
    k = options.num_speculative_tokens
    if k is not None:
        try:
            SpeculativeConfig(num_speculative_tokens=k)
        except ValueError as exc:
            raise CliUsageError(f"--num-speculative-tokens {k}: {exc}") from None


def context_choice(flag: int | None, settings: object) -> tuple[int | None, str]:
    """The context size to use and where it came from: ``--context`` > ``LOCALCHAT_CONTEXT``
    > ``context`` in config.toml > None (the model's, at most 8192 on CPU)."""
    if flag is not None:
        return flag, "--context"
    value = getattr(settings, "context", None)
    source = getattr(settings, "sources", {}).get("context")
    origin = ("LOCALCHAT_CONTEXT" if source == "env" else "context (config.toml)")
    return value, origin
