"""The ``localchat`` console script: imports the CLI (``cli.py``: typer, the command modules)
and runs it, so that a Ctrl+C while those imports run (the first 0.1-0.3 s of every
command) ends with the CLI's one line and exit 130 rather than a Python traceback. This
module imports nothing but ``sys`` before that."""

from __future__ import annotations

import sys

EXIT_INTERRUPTED = 130  # cli_io.EXIT_INTERRUPTED, not imported: this runs before anything


def main() -> None:
    """Run ``localchat.app.cli.main``; a KeyboardInterrupt outside its own handling (while the
    CLI is imported or built) prints ``localchat: interrupted`` and exits 130."""
    if sys.stderr is None:
        _stand_in_for_closed_stderr()
    try:
        from localchat.app.cli import main as cli_main

        cli_main()
    except SystemExit as exc:
        _exit_now_if_torch(exc.code)
        raise
    except KeyboardInterrupt:
        try:
            sys.stderr.write("localchat: interrupted\n")
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass
        raise SystemExit(EXIT_INTERRUPTED) from None


def _stand_in_for_closed_stderr() -> None:
    """Started with descriptor 2 closed (``2>&-``): Python set ``sys.stderr`` to None, so a
    ``print(..., file=sys.stderr)`` would write to stdout, into the answer (a trial found
    ``serve``'s status lines there), and the next file opened would take descriptor 2, where
    C code writes its warnings. ``/dev/null`` takes the descriptor and ``sys.stderr`` instead:
    what would go to stderr is dropped, as the user asked."""
    import os

    try:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (held to the end of the process)
    except OSError:
        pass


def _exit_now_if_torch(code: object) -> None:
    """End the process at once, without the interpreter's teardown, once a command that
    imported torch is done: that teardown (PyTorch's and the loaded model's destructors,
    every module's garbage) costs 0.15-0.2 s of a 2 s ``ask``, and a one-shot process
    has nothing left for it to do. The exit handlers run and stdout and stderr are flushed
    first, so nothing written is lost. Left to the normal exit (returns): a command that
    never imported torch (its teardown is quick), a thread other than this one still
    running (it would be cut off), an exit code that is not an int (SystemExit prints
    it), or stdout that cannot be flushed (a closed pipe: the normal path reports it)."""
    import threading

    if "torch" not in sys.modules or not (code is None or isinstance(code, int)):
        return
    if any(t is not threading.main_thread() and not t.daemon and t.is_alive()
           for t in threading.enumerate()):
        return
    import atexit
    import os

    try:
        _flush(sys.stdout)
    except (OSError, ValueError):
        return
    atexit._run_exitfuncs()  # (it prints, not raises, a handler's error)
    try:
        _flush(sys.stdout)
        _flush(sys.stderr)
    except (OSError, ValueError):
        pass
    os._exit(code or 0)


def _flush(stream) -> None:
    """Flush ``stream``; None (the descriptor was closed at start: ``2>&-``) has nothing to
    flush. Raises what the stream's ``flush`` raises."""
    if stream is not None:
        stream.flush()


if __name__ == "__main__":
    main()
