"""``logs.RedactFilter``: the API key never reaches a handler's output, whether it is in a log
call's message or its arguments; other records pass unchanged."""

from __future__ import annotations

import io
import logging
import sys

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


class _Recorder(logging.StreamHandler):
    """A stream handler that keeps the errors ``handleError`` would print as
    ``--- Logging error ---``."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self.errors: list[BaseException] = []

    def handleError(self, record) -> None:
        import sys

        self.errors.append(sys.exc_info()[1])


def _access_handler(secret: str) -> tuple[_Recorder, io.StringIO]:
    from uvicorn.logging import AccessFormatter

    stream = io.StringIO()
    handler = _Recorder(stream)
    handler.setFormatter(AccessFormatter(
        '%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s',
        use_colors=False))
    handler.addFilter(RedactFilter(secret))
    return handler, stream


def test_uvicorns_access_line_with_the_key_in_the_url_is_redacted():
    """uvicorn's ``AccessFormatter`` unpacks the record's five arguments: redaction keeps
    them (it had set ``args = None``: "cannot unpack non-iterable NoneType", a logging
    error). The key in the query string, plain or URL-encoded, becomes ``***``."""
    secret = "s3cr/t+KEY"
    handler, stream = _access_handler(secret)
    logger = logging.getLogger("localchat.test.access")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    fmt = '%s - "%s %s HTTP/%s" %d'  # uvicorn's access call (h11_impl / httptools_impl)
    try:
        logger.info(fmt, "127.0.0.1:5000", "GET", f"/v1/models?api_key={secret}", "1.1", 200)
        logger.info(fmt, "127.0.0.1:5000", "GET", "/v1/models?api_key=s3cr%2Ft%2BKEY", "1.1",
                    401)
        logger.info(fmt, "127.0.0.1:5000", "GET", "/v1/models?api_key=s3cr%2Ft+KEY", "1.1",
                    401)
        logger.info(fmt, "127.0.0.1:5000", "GET", "/v1/models", "1.1", 200)
    finally:
        logger.removeHandler(handler)
    assert handler.errors == []
    assert stream.getvalue().splitlines() == [
        'INFO:     127.0.0.1:5000 - "GET /v1/models?api_key=*** HTTP/1.1" 200 OK',
        'INFO:     127.0.0.1:5000 - "GET /v1/models?api_key=*** HTTP/1.1" 401 Unauthorized',
        'INFO:     127.0.0.1:5000 - "GET /v1/models?api_key=*** HTTP/1.1" 401 Unauthorized',
        'INFO:     127.0.0.1:5000 - "GET /v1/models HTTP/1.1" 200 OK']


def test_a_traceback_and_odd_arguments_are_redacted():
    stream = io.StringIO()
    handler = _Recorder(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.addFilter(RedactFilter("k3y9"))
    logger = logging.getLogger("localchat.test.redact2")
    logger.propagate = False
    logger.addHandler(handler)

    class Shows:
        def __str__(self) -> str:
            return "object holding k3y9"

    try:
        try:
            raise ValueError("bad token k3y9")
        except ValueError:
            logger.exception("failed for %s", Shows())
        logger.warning("%(who)s sent %(key)s", {"who": "client", "key": "k3y9"})
        logger.warning("status %d", 4)
    finally:
        logger.removeHandler(handler)
    out = stream.getvalue()
    assert handler.errors == []
    assert "k3y9" not in out
    assert "failed for object holding ***" in out and "ValueError: bad token ***" in out
    assert "client sent ***" in out and "status 4" in out


def _reset_server_logger() -> None:
    """Undo ``configure_logging``'s handler on the ``localchat.server`` logger."""
    server_logger = logging.getLogger("localchat.server")
    for handler in list(server_logger.handlers):
        if getattr(handler, "_localchat", False):
            server_logger.removeHandler(handler)
    server_logger.propagate = True
    server_logger.setLevel(logging.NOTSET)


def test_a_live_server_logs_the_access_line_with_the_key_redacted(tmp_path, capfd):
    """``localchat serve --api-key K --log-level info`` as ``serve_cmd`` sets it up (uvicorn's
    own logging config, then ``configure_logging``), a request carrying the key in its URL:
    one access line, the key as ``***``, no logging error."""
    import httpx

    from localchat.app.server.logs import configure_logging
    from localchat.app.server.routes import ServerOptions, create_app
    from tests.app.fake_engine import FakeEngine
    from tests.app.server.live import ServerThread

    secret = "s3cr3tKEY"
    app = create_app(FakeEngine(["x"]), ServerOptions(model_id="m", api_key=secret))
    server = ServerThread(app, log_level="info", access_log=True)
    configure_logging("info", secret)
    access = logging.getLogger("uvicorn.access")
    stream = io.StringIO()
    errors: list = []
    for handler in access.handlers:
        handler.setStream(stream)
        handler.handleError = errors.append  # type: ignore[method-assign]
    server.start()
    try:
        r = httpx.get(f"{server.url}/v1/models?api_key={secret}", timeout=30,
                      headers={"Authorization": f"Bearer {secret}"})
        assert r.status_code == 200
        r = httpx.get(f"{server.url}/v1/models?api_key={secret}", timeout=30)
        assert r.status_code == 401
    finally:
        server.stop()
        for handler in access.handlers:
            handler.filters.clear()
        _reset_server_logger()
    lines = stream.getvalue().splitlines()
    assert errors == []
    assert [line for line in lines if "/v1/models" in line] == [
        line for line in lines if "/v1/models?api_key=*** HTTP/1.1" in line]
    assert len(lines) == 2
    assert lines[0].endswith(" 200 OK") and lines[1].endswith(" 401 Unauthorized")
    captured = capfd.readouterr()
    assert secret not in stream.getvalue() + captured.out + captured.err
    assert "Logging error" not in captured.err


def test_uvicorns_handlers_write_to_stderr_after_configure_logging():
    """uvicorn's own logging config sends its access lines to stdout; after
    ``configure_logging`` (as ``serve_cmd`` calls it) every uvicorn handler writes to stderr,
    so ``localchat serve --log-level info > file`` leaves the file free of log lines."""
    import uvicorn

    from localchat.app.server.logs import configure_logging

    uvicorn.Config(lambda scope: None, log_level="info", access_log=True)  # its dictConfig
    before = [h.stream for n in ("uvicorn.access",) for h in logging.getLogger(n).handlers]
    assert sys.stdout in before  # uvicorn's default, which the call below must change
    configure_logging("info", None)
    try:
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
            streams = [h.stream for h in logging.getLogger(name).handlers
                       if isinstance(h, logging.StreamHandler)]
            assert all(s is sys.stderr for s in streams), name
    finally:
        _reset_server_logger()
