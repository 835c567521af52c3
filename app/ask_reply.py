"""``ask``'s reply: stream it from the engine (in-process ``LLMEngine`` or a ``RemoteEngine``)
through a writer (``render.py``), then save it (``ask_history``) and print the ``--json`` /
``--stats`` report (``report.py``).

Signals: Ctrl+C, SIGTERM and SIGHUP keep the partial reply (shown, saved as interrupted) and
exit 128 + the signal (130, 143, 129); a closed stdout (``| head``) stops generating and
exits 141 quietly; a stdout that refuses the text (a full disk) stops generating too, keeps the
reply so far and says so in one line (exit 1).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import typer

from localchat.app import cli_io, interrupts, output_errors, render
from localchat.app.ask_history import drop_refused_turn, save_reply
from localchat.app.report import answer_stats, format_stats_line
from localchat.engine.errors import LocalchatError

if TYPE_CHECKING:  # torch stays out of ``localchat --help``
    from localchat.engine.llm_engine import LLMEngine
    from localchat.engine.outputs import RequestOutput
    from localchat.engine.sampling_params import SamplingParams

# The SamplingParams fields ``--json`` reports under "sampling" (the values in use).
SAMPLING_SHOWN = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                  "presence_penalty", "frequency_penalty", "stop", "max_tokens", "seed")


def answer(engine: LLMEngine, prompt_ids: list[int] | list[dict[str, str]],
           sampling: SamplingParams, args: Any, store: Any, conv_id: str | None, model: str,
           parent_id: int | None = None) -> None:
    """Generate and show the reply to ``prompt_ids`` (token ids, or messages for a remote
    engine), then save it and report (``args``: an ``AskArgs``). Raises ``typer.Exit`` with
    128 + the signal after an interrupt (the reply kept) and 141 on a closed stdout."""
    writer = make_writer(args)
    outputs: Iterator[RequestOutput] | None = None
    last: RequestOutput | None = None
    interrupted = False
    guard = interrupts.InterruptGuard()
    try:
        with guard.installed():
            outputs = engine.generate(prompt_ids, sampling)
            for out in outputs:
                with guard.critical():  # shown and recorded together, or neither
                    last = out
                    writer.write(out.text_delta)
                if out.finished:
                    break
    except KeyboardInterrupt:
        interrupted = True
        close_quietly(outputs)
    except BrokenPipeError:  # the reader went away (`| head`): stop generating, quietly
        close_quietly(outputs)
        output_errors.silence_stdout()
        save_reply(store, conv_id, writer.text, True, None, parent_id)
        raise typer.Exit(cli_io.EXIT_BROKEN_PIPE) from None
    except OSError as exc:  # stdout refused the text (`> /dev/full`): keep what came
        said = output_errors.output_error(exc)
        if said is None:
            raise
        close_quietly(outputs)
        output_errors.silence_stdout()
        save_reply(store, conv_id, writer.text, True, None, parent_id)
        raise output_errors.StdoutError(_saved(said, conv_id, "the reply so far is")) from None
    except LocalchatError as exc:  # e.g. the server died mid-reply: keep what came, end its line
        close_quietly(outputs)
        if writer.text:
            save_reply(store, conv_id, writer.text, True, None, parent_id)
            with contextlib.suppress(OSError):
                writer.finish()  # the error line must not start after the partial reply
        elif getattr(exc, "refused", False):  # e.g. too long for the server's context
            drop_refused_turn(store, parent_id)
            raise
        if conv_id is not None and len(exc.args) == 1:  # say what was kept, as Ctrl+C does
            kept = "the reply so far is" if writer.text else "your message is"
            exc.args = (_saved(str(exc), conv_id, kept),)
        raise
    # Finish saving and printing whatever arrives now.
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in interrupts.STOP_SIGNALS}
    try:
        stats = answer_stats(last, len(prompt_ids), interrupted,
                             speculating=getattr(engine, "speculator", None) is not None)
        save_reply(store, conv_id, writer.text, interrupted, stats, parent_id)
        if args.json:
            stats["context"] = _context(engine)  # the value in use
            stats["sampling"] = {k: _shown(getattr(sampling, k)) for k in SAMPLING_SHOWN}
            stats["memory"] = _memory(engine)
        print_answer(writer, args, stats, model, conv_id)
    except BrokenPipeError:
        output_errors.silence_stdout()
        raise typer.Exit(cli_io.EXIT_BROKEN_PIPE) from None
    except OSError as exc:
        said = output_errors.output_error(exc)
        if said is None:
            raise
        output_errors.silence_stdout()
        raise output_errors.StdoutError(_saved(said, conv_id, "the reply is")) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if interrupted:  # 130 after Ctrl+C, 143 after SIGTERM, 129 after SIGHUP
        kept = "the reply so far is" if writer.text else "your message is"
        cli_io.interrupted(f"{kept} saved in conversation {conv_id}"
                           if conv_id is not None else "", guard.signum)
        raise typer.Exit(128 + guard.signum if guard.signum else cli_io.EXIT_INTERRUPTED)


def _shown(value: Any) -> Any:
    """A sampling value as ``--json`` shows it (``stop``'s tuple as a list)."""
    return list(value) if isinstance(value, tuple) else value


def _saved(said: str, conv_id: str | None, kept: str) -> str:
    """``said`` (a failed write to stdout) and where the reply was kept, when it was."""
    return f"{said}; {kept} saved in conversation {conv_id}" if conv_id is not None else said


def make_writer(args: Any) -> Any:
    """Markdown on a terminal (buffered with ``--no-stream``), buffered for ``--json`` and
    ``--extract``, else plain text streamed to stdout. ``TERM=dumb`` (Emacs' shell, some
    editors' terminals) gets plain text: the Markdown writer redraws its line with cursor
    controls such a terminal shows as text."""
    markdown = cli_io.stream_isatty(sys.stdout) and not args.raw \
        and os.environ.get("TERM") != "dumb"
    if args.json or args.extract or (markdown and args.no_stream):
        return render.BufferedWriter()
    if markdown:
        return render.MarkdownWriter()
    return cli_io.AnswerWriter(buffered=args.no_stream)


def print_answer(writer: Any, args: Any, stats: dict[str, Any], model: str,
                 conv_id: str | None) -> None:
    """Finish the output: the code blocks (``--extract``), one JSON object (``--json``), the
    buffered Markdown, or the streamed text's end; then the ``--stats`` line on stderr."""
    text = writer.text
    if args.extract:
        blocks = render.extract_code_blocks(text)
        if not blocks and text.strip() and not args.json:  # --json says it in "content"
            cli_io.note("the answer has no complete fenced code block; printing it whole")
        text = "\n\n".join(blocks) if blocks else text
    # interrupted before any text: nothing, not an empty line, on stdout
    shown = bool(text) or stats.get("finish_reason") != "interrupted"
    if args.json:
        doc = {"content": text, "model": model, "conversation_id": conv_id, **stats}
        sys.stdout.write(cli_io.json_line(doc, sys.stdout))
        sys.stdout.flush()
    elif not shown:
        pass
    elif args.extract:
        plain = cli_io.AnswerWriter(buffered=True)
        plain.write(text)
        plain.finish()
    elif isinstance(writer, render.BufferedWriter):  # --no-stream on a terminal
        markdown = render.MarkdownWriter()
        markdown.write(text)
        markdown.finish()
    else:
        writer.finish()
    if args.stats:
        cli_io.stats_line(format_stats_line(stats))


def close_quietly(outputs: Any) -> None:
    """Close a generator (the engine aborts the request); ignore a second Ctrl+C."""
    close = getattr(outputs, "close", None)
    if close is not None:
        with contextlib.suppress(Exception, KeyboardInterrupt):
            close()


def _context(engine: Any) -> int | None:
    """``--json``'s ``context``: the engine's context size in tokens; with a server
    (``RemoteEngine``), what its ``/v1/models`` entry reports, else None (unknown here)."""
    if getattr(engine, "remote", False):
        server_context = getattr(engine, "server_context", None)
        return server_context() if server_context is not None else None
    return getattr(engine, "max_model_len", None)


def _memory(engine: Any) -> dict[str, Any] | None:
    """``--json``'s ``memory``: the planner's prediction for the engine as loaded beside the
    bytes allocated (``memory_figures.py``); None with a server (``RemoteEngine``), whose
    memory is its own and not measured here."""
    if getattr(engine, "remote", False):
        return None
    try:
        from localchat.app.memory_figures import memory_figures

        return memory_figures(engine)
    except (AttributeError, TypeError, ValueError, OSError):  # a fake engine in tests
        return None
