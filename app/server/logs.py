"""Logging for ``localchat serve``: one stderr handler for the server's own logger and
uvicorn's, at the ``--log-level`` asked for, with the API key redacted.

The key is never passed to a log call; ``RedactFilter`` is the second line of defence: any
record whose message or arguments would contain it is rewritten with ``***`` before a handler
writes it (uvicorn's access and error lines included). Levels: ``critical``, ``error``,
``warning`` (the default), ``info`` (adds one access line per request), ``debug`` (adds the
request fields a route accepted and ignored).
"""

from __future__ import annotations

import logging
import sys

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
SERVER_LOGGER = "localchat.server"
_UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")
REDACTED = "***"


class RedactFilter(logging.Filter):
    """Replace ``secret`` in a record's formatted message by ``***`` (never drops a record)."""

    def __init__(self, secret: str) -> None:
        super().__init__()
        self.secret = secret

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is the handler's to report
            return True
        if self.secret and self.secret in message:
            record.msg, record.args = message.replace(self.secret, REDACTED), None
        return True


def configure_logging(level: str, secret: str | None) -> None:
    """Send ``localchat.server`` records at ``level`` and above to stderr (prefixed
    ``localchat serve:``) and redact ``secret`` there and in uvicorn's handlers (call after
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
    if not secret:
        return
    redact = RedactFilter(secret)
    for name in (SERVER_LOGGER, *_UVICORN_LOGGERS):
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(redact)
