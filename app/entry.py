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
    try:
        from localchat.app.cli import main as cli_main

        cli_main()
    except KeyboardInterrupt:
        try:
            sys.stderr.write("localchat: interrupted\n")
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):
            pass
        raise SystemExit(EXIT_INTERRUPTED) from None


if __name__ == "__main__":
    main()
