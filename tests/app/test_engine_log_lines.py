"""``cli_io.engine_log_lines``: the engine's warnings (``localchat.*`` loggers) reach a CLI
user as ``localchat: warning: ...`` lines, like every other line the CLI prints, not as
logging's bare fallback text (a helper's trial saw a stale weight cache's "...; rebuilding"
line without the prefix). The server's logger keeps its own handler."""

from __future__ import annotations

import logging

import pytest

from localchat.app import cli_io


@pytest.fixture
def lines():
    logger = logging.getLogger("localchat")
    before = list(logger.handlers)
    logger.handlers[:] = [h for h in before if not getattr(h, "_localchat_lines", False)]
    cli_io.engine_log_lines()
    cli_io.engine_log_lines()  # idempotent: one handler
    yield [h for h in logger.handlers if getattr(h, "_localchat_lines", False)]
    logger.handlers[:] = before


def test_engine_warnings_are_prefixed_one_line_each(lines, capsys):
    assert len(lines) == 1
    log = logging.getLogger("localchat.engine.quant.cache")
    log.warning("quantized cache %s: %s differs; rebuilding", "/c/m.safetensors", "w\nx")
    log.error("could not write quantized cache %s", "/c/m.safetensors")
    log.info("memory plan: not shown")
    err = capsys.readouterr().err
    assert err == ("localchat: warning: quantized cache /c/m.safetensors: w x differs; "
                   "rebuilding\nlocalchat: error: could not write quantized cache "
                   "/c/m.safetensors\n")
