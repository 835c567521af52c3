"""``logs.RedactFilter``: the API key never reaches a handler's output, whether it is in a log
call's message or its arguments; other records pass unchanged."""

from __future__ import annotations

import io
import logging

from localchat.app.server.logs import REDACTED, RedactFilter


def test_the_key_is_redacted_from_message_and_arguments():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactFilter("sk-abc123"))
    logger = logging.getLogger("localchat.test.redact")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        logger.warning("header Authorization: Bearer %s from %s", "sk-abc123", "127.0.0.1")
        logger.error("key sk-abc123 in the message itself")
        logger.info("nothing secret: %d requests", 3)
    finally:
        logger.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert lines == [f"header Authorization: Bearer {REDACTED} from 127.0.0.1",
                     f"key {REDACTED} in the message itself", "nothing secret: 3 requests"]
