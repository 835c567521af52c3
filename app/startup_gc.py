"""The garbage collector around ``ask``'s one model load (``ask_cmd.load_engine``).

Importing torch and building the model create several hundred thousand long-lived objects;
the collector's automatic passes walk them again and again while they are created (three
full passes and ~400 younger ones, ~0.3 s of a cached ``ask`` on 2 shared cores), and the
interpreter's final passes at exit walk them once more and free the model piece by piece
(~0.5-1 s between the last ``atexit`` handler and the process's end). ``collected_after_load``
turns automatic collection off for the load and then freezes everything that exists
(``gc.freeze``: the permanent generation, which no later pass visits), so generation's
collections walk only what generation creates, and exit leaves the loaded model to the
operating system. Nothing is skipped: ``atexit`` handlers, module teardown and reference
counting run as before; only cyclic garbage made during the load stays until exit (a
one-shot process). The TUI and the server, long-lived processes, do not use it.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collected_after_load() -> Iterator[None]:
    """Automatic collection off inside the block; on leaving it (also on an error), every
    object tracked so far is frozen and the collector's previous state comes back."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
