"""Logging for ``localchat serve``: one stderr handler for the server's own logger and
uvicorn's, at the ``--log-level`` asked for, with the API key redacted.

The key is never passed to a log call; ``RedactFilter`` is the second line of defence: any
record whose message, arguments or traceback would contain it (plainly or URL-encoded, as
in ``?api_key=...``) is rewritten with ``***`` before a handler writes it (uvicorn's access
and error lines included). Levels: ``critical``, ``error``,
``warning`` (the default), ``info`` (adds one access line per request), ``debug`` (adds the
request fields a route accepted and ignored).
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping
from typing import Any

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
SERVER_LOGGER = "localchat.server"
_UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")
REDACTED = "***"


class RedactFilter(logging.Filter):
    """Replace ``secret`` (plain or URL-encoded, each character either way, as a query
    string may carry it) by ``***`` in a record before a handler writes it; never drops a
    record.

    The record keeps its shape: a format string's arguments are redacted one by one and stay
    a tuple (or mapping) of the same length, because formatters may read them (uvicorn's
    ``AccessFormatter`` unpacks its five). Only when that cannot hide the secret (an
    argument whose type the format needs, such as ``%d``, shows it) is the message
    pre-formatted. A traceback or stack attached to the record is redacted too.
    """

    def __init__(self, secret: str) -> None:
        super().__init__()
        self.secret = secret
        self._pattern = re.compile("".join(_char_forms(c) for c in secret)) if secret else None

    def _has(self, text: str) -> bool:
        return self._pattern is not None and self._pattern.search(text) is not None

    def _redact(self, text: str) -> str:
        return self._pattern.sub(REDACTED, text) if self._pattern is not None else text

    def _redact_arg(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._redact(value)
        if isinstance(value, (int, float, type(None))) and not self._has(str(value)):
            return value
        try:
            text = str(value)
        except Exception:  # noqa: BLE001 - an unprintable argument: leave it to the handler
            return value
        return self._redact(text) if self._has(text) else value

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secret:
            return True
        self._redact_attachments(record)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is the handler's to report
            return True
        if not self._has(message):
            return True
        if isinstance(record.msg, str):
            record.msg = self._redact(record.msg)
        args = record.args
        if isinstance(args, Mapping):
            record.args = {k: self._redact_arg(v) for k, v in args.items()}
        elif isinstance(args, tuple):
            record.args = tuple(self._redact_arg(v) for v in args)
        try:
            hidden = not self._has(record.getMessage())
        except Exception:  # noqa: BLE001 - a redacted argument no longer fits its format
            hidden = False
        if not hidden:  # last resort: the whole message, formatted and redacted
            record.msg, record.args = self._redact(message), ()
        return True

    def _redact_attachments(self, record: logging.LogRecord) -> None:
        """Redact a traceback (formatted now, as a ``Formatter`` would) and ``stack_info``."""
        text = record.exc_text
        if record.exc_info and not text:
            try:
                text = logging.Formatter().formatException(record.exc_info)
            except Exception:  # noqa: BLE001 - left to the handler's own formatter
                text = None
        if text and self._has(text):  # set only then: other records keep their formatter's
            record.exc_text = self._redact(text)
        if record.stack_info and self._has(record.stack_info):
            record.stack_info = self._redact(record.stack_info)


def _char_forms(char: str) -> str:
    """A regex for ``char`` as it may appear in a URL: itself, percent-encoded (either hex
    case, its UTF-8 bytes) or, for a space, ``+``."""
    hexes = "".join("%" + "".join(f"[{d.upper()}{d.lower()}]" if d.isalpha() else d
                                  for d in f"{b:02X}") for b in char.encode("utf-8"))
    forms = [re.escape(char), hexes] + (["\\+"] if char == " " else [])
    return "(?:" + "|".join(forms) + ")"


def configure_logging(level: str, secret: str | None) -> None:
    """Send ``localchat.server`` records at ``level`` and above to stderr (prefixed
    ``localchat serve:``), uvicorn's there too (its access lines included), and redact ``secret`` there and in uvicorn's handlers (call after
    ``uvicorn.Config`` has set up its own).

    Raises:
        ValueError: ``level`` is not one of ``LOG_LEVELS``.
    """
    if level not in LOG_LEVELS:
        raise ValueError(f"log level {level!r}: one of {', '.join(LOG_LEVELS)}")
    logger = logging.getLogger(SERVER_LOGGER)
    logger.setLevel(level.upper())
    logger.propagate = False
    if not any(getattr(h, "_localchat", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("localchat serve: %(levelname)s %(message)s"))
        handler._localchat = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    for name in _UVICORN_LOGGERS:  # uvicorn's access lines go to stdout by its own config
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout:
                handler.setStream(sys.stderr)
    if not secret:
        return
    redact = RedactFilter(secret)
    for name in (SERVER_LOGGER, *_UVICORN_LOGGERS):
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(redact)
