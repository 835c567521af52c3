"""``localchat serve``: its command-line options, handed to ``server/serve_cmd.run_serve``
(which imports the server and the engine only when it runs, so ``--help`` stays fast)."""

from __future__ import annotations

from typing import Annotated

import typer

from localchat.app.cli_io import DebugOpt, QuantOpt


def serve_command(
    model: Annotated[
        str | None, typer.Option("-m", "--model", help="Model spec (as in ask).",
                                 show_default="settings' default_model")
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Address to bind; other than loopback "
                                      "needs --api-key.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port (0: any free one).")] = 8088,
    api_key: Annotated[
        str | None, typer.Option("--api-key", envvar="LOCALCHAT_API_KEY",
                                 help="Require 'Authorization: Bearer KEY' (the environment "
                                 "keeps the key out of 'ps'; never logged).",
                                 show_default=False)
    ] = None,
    insecure_no_auth: Annotated[
        bool, typer.Option("--insecure-no-auth", help="Allow a non-loopback --host without "
                           "a key (warned).")
    ] = False,
    draft: Annotated[
        str | None, typer.Option("--draft", help="Draft model for speculative decoding "
                                 "('auto', or 'ngram': prompt lookup).", show_default=False)
    ] = None,
    quant: QuantOpt = None,
    max_num_seqs: Annotated[
        int, typer.Option("--max-num-seqs", help="Most requests batched in one step.")
    ] = 16,
    batch_invariant: Annotated[
        bool, typer.Option("--batch-invariant/--no-batch-invariant", help="CPU: each reply "
                           "the same bits whatever else is batched (off: prompts arriving "
                           "together share one forward; faster, replies vary with the batch).")
    ] = True,
    max_model_len: Annotated[
        int | None, typer.Option("--max-model-len", "-C", "--context",
                                 help="Context size in tokens (prompt + reply).",
                                 show_default="config 'context', else the model's, at most "
                                 "8192 on CPU")
    ] = None,
    log_level: Annotated[
        str, typer.Option("--log-level", help="critical|error|warning|info (one line per "
                          "request)|debug (also the request fields ignored).")
    ] = "warning",
    keep_alive: Annotated[
        str | None, typer.Option("--keep-alive", help="Stop after this long without a "
                                 "request (90s, 5m, 1h).", show_default="never")
    ] = None,
    debug: DebugOpt = False,
) -> None:
    """Serve one model over an OpenAI-compatible HTTP API (/v1/chat/completions, ...)."""
    from localchat.app.server.serve_cmd import ServeArgs, run_serve

    run_serve(ServeArgs(model=model, host=host, port=port, api_key=api_key,
                        insecure_no_auth=insecure_no_auth, draft=draft, quant=quant,
                        max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                        log_level=log_level, keep_alive=keep_alive,
                        batch_invariant=batch_invariant))
