"""Run the real ``localchat`` entry point in a subprocess with a fake engine.

``python tests/app/fake_cli.py ARGS...`` is ``localchat ARGS...`` except that
``ask_cmd.load_engine`` returns a ``FakeEngine``, configured by environment variables:
``FAKE_REPLY`` (the reply; streamed in ``FAKE_CHUNK``-character deltas, default 4),
``FAKE_DELAY`` (seconds before each delta), ``FAKE_LOG`` (a file that receives, as JSON, the
load options, the prompt token ids decoded to text and the sampling params), and
``FAKE_LOAD_SECONDS`` (the load sleeps that long, twice over if interrupted: a stubborn load).
``FAKE_WAIT_FILE`` (the reply starts only once that file exists), ``FAKE_DB=readonly`` opens the history read-only (SQLite's ``mode=ro``, as in a read-only
folder: tests run as root, where permission bits do not bind) and ``FAKE_DB=full`` caps the
file at its current size (``PRAGMA max_page_count``: SQLite's "database or disk is full").
``FAKE_EXIT_SECONDS``: the process's exit takes that long (an ``atexit`` wait, as for the
weight cache's background write), after an ``exiting`` line on stderr.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fake_engine import FakeEngine, decode_ids

from localchat.app import ask_cmd, cli


class LoggingEngine(FakeEngine):
    def __init__(self, options, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.options = options

    def generate(self, prompt_token_ids, sampling_params, request_id=None):
        log = os.environ.get("FAKE_LOG")
        if log:
            Path(log).write_text(json.dumps({
                "options": dataclasses.asdict(self.options),
                "prompt": decode_ids(prompt_token_ids),
                "sampling": dataclasses.asdict(sampling_params),
            }))
        wait = os.environ.get("FAKE_WAIT_FILE")
        while wait and not Path(wait).exists():  # hold the reply until the test says go
            time.sleep(0.02)
        yield from super().generate(prompt_token_ids, sampling_params, request_id)


def fake_load_engine(options):
    seconds = float(os.environ.get("FAKE_LOAD_SECONDS", "0"))
    if seconds:
        from localchat.app import interrupts

        with interrupts.loading_interrupts():
            try:
                sys.stderr.write("loading\n")
                sys.stderr.flush()
                time.sleep(seconds)
            except KeyboardInterrupt:  # a slow clean-up: only a second Ctrl+C cuts it short
                sys.stderr.write("cleaning up\n")
                sys.stderr.flush()
                time.sleep(seconds)
                raise
    reply = os.environ.get("FAKE_REPLY", "Hello world")
    n = int(os.environ.get("FAKE_CHUNK", "4"))
    deltas = [reply[i:i + n] for i in range(0, len(reply), n)] or [""]
    return LoggingEngine(options, deltas, delay=float(os.environ.get("FAKE_DELAY", "0")))


def patch_history_db(mode: str) -> None:
    import sqlite3

    from localchat.app import store

    real = sqlite3.connect

    def connect(path, *args, **kwargs):
        if mode == "readonly" and path != ":memory:":
            return real(f"file:{path}?mode=ro", *args, uri=True, **kwargs)
        db = real(path, *args, **kwargs)
        if mode == "full":
            pages = db.execute("PRAGMA page_count").fetchone()[0]
            db.execute(f"PRAGMA max_page_count = {max(pages, 1)}")
        return db

    import types

    store.sqlite3 = types.SimpleNamespace(**{**vars(sqlite3), "connect": connect})


if __name__ == "__main__":
    if os.environ.get("FAKE_DB"):
        patch_history_db(os.environ["FAKE_DB"])
    ask_cmd.load_engine = fake_load_engine
    if os.environ.get("FAKE_EXIT_SECONDS"):
        import atexit

        def slow_exit() -> None:
            sys.stderr.write("exiting\n")
            sys.stderr.flush()
            time.sleep(float(os.environ["FAKE_EXIT_SECONDS"]))

        atexit.register(slow_exit)
    cli.main(sys.argv[1:])
