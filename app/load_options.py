"""Options for loading the engine that come from ``--draft`` and ``--quant`` (or settings).

The CLI passes them on as strings in ``LoadOptions``; the engine loader takes them once
speculative decoding and quantized weights land (the engine's issues). Until then
``check_load_options`` is the one place that refuses what the engine cannot do yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from localchat.app.cli_io import CliUsageError

# --quant values the engine honours today: "auto" and "none" both load the weights dequantized.
AVAILABLE_QUANT = ("auto", "none")


@dataclass(frozen=True)
class LoadOptions:
    """What to load: ``model`` (a model spec), ``draft`` (a draft model spec for speculative
    decoding, or None) and ``quant`` (``auto|none|fp8|int8|int4``), as the user gave them."""

    model: str
    draft: str | None = None
    quant: str = "auto"


def check_load_options(options: LoadOptions, from_flags: dict[str, bool] | None = None) -> None:
    """Refuse options the engine does not offer yet.

    ``from_flags`` says which of ``draft``/``quant`` came from a flag (else from the settings),
    so the message names where to change it.

    Raises:
        CliUsageError: a ``draft`` is set, or ``quant`` is not ``auto`` or ``none`` (exit 2).
    """
    from_flags = from_flags or {}

    def where(name: str) -> str:
        return f"--{name}" if from_flags.get(name) else f"{name} (from the config or environment)"

    if options.draft and options.draft.lower() != "none":
        raise CliUsageError(f"{where('draft')} {options.draft}: speculative decoding is not "
                            "available yet")
    if options.quant not in AVAILABLE_QUANT:
        raise CliUsageError(f"{where('quant')} {options.quant}: quantized weights are not "
                            f"available yet (use {' or '.join(AVAILABLE_QUANT)})")
