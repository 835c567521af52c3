"""AsyncLLMEngine on SmolLM2-135M: concurrent streams equal the synchronous engine's output,
cancelling a stream aborts its request and frees its blocks, errors reach the caller."""

from __future__ import annotations

import asyncio
import time

import pytest

from localchat.engine.async_engine import AsyncLLMEngine, EngineDeadError
from localchat.engine.errors import ContextLengthError
from localchat.engine.request import FinishReason
from localchat.engine.sampling_params import SamplingParams

from .kv_cache.test_prefix_caching_model import variant

PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture
def async_engine(smollm2_engine):
    eng = AsyncLLMEngine(variant(smollm2_engine, block_size=16))
    yield eng
    eng.shutdown()


def prompt(eng, text: str) -> list[int]:
    return eng.tokenizer.apply_chat_template([{"role": "user", "content": text}])


async def collect(eng, ids, params=PARAMS, rid=None):
    outs = [out async for out in eng.generate(ids, params, rid)]
    return outs


def test_concurrent_streams_equal_the_sync_engine(async_engine, smollm2_engine):
    texts = ["Name a color.", "Name an animal.", "Name a city."]
    sync = {}
    for t in texts:
        *_, last = smollm2_engine.generate(prompt(smollm2_engine, t), PARAMS)
        sync[t] = (last.output_token_ids, last.text)

    async def main():
        return await asyncio.gather(*(collect(async_engine, prompt(async_engine, t))
                                      for t in texts))

    results = asyncio.run(main())
    for t, outs in zip(texts, results):
        last = outs[-1]
        assert last.finished and last.finish_reason is FinishReason.LENGTH
        assert (last.output_token_ids, last.text) == sync[t]
        assert "".join(o.text_delta for o in outs) == last.text
        assert last.metrics.ttft is not None and last.metrics.queue_time is not None
    stats = async_engine.get_stats()
    assert stats.kv_cache_usage == 0.0 and stats.num_running == 0


def wait_for(cond, timeout=30.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.01)


def test_leaving_the_stream_aborts_and_frees_blocks(async_engine):
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)

    async def main():
        seen = 0
        async for out in async_engine.generate(prompt(async_engine, "Tell a story."), params,
                                               "long"):
            seen += 1
            if seen == 2:
                break
        return seen

    assert asyncio.run(main()) == 2
    inner = async_engine.engine
    wait_for(lambda: not inner.scheduler.requests)
    wait_for(lambda: async_engine.get_stats().kv_cache_usage == 0.0)


def test_cancelled_task_aborts_its_request(async_engine):
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)

    async def main():
        started = asyncio.Event()

        async def consume():
            async for _ in async_engine.generate(prompt(async_engine, "Count."), params, "c"):
                started.set()

        task = asyncio.create_task(consume())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    wait_for(lambda: not async_engine.engine.scheduler.requests)
    assert async_engine.engine.kv_cache_manager.usage == 0.0


def test_explicit_abort_ends_the_stream_with_abort(async_engine):
    params = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)

    async def main():
        outs = []
        async for out in async_engine.generate(prompt(async_engine, "Hi"), params, "x"):
            outs.append(out)
            if len(outs) == 1:
                async_engine.abort("x")
        return outs

    outs = asyncio.run(main())
    assert outs[-1].finished and outs[-1].finish_reason is FinishReason.ABORT
    assert len(outs[-1].output_token_ids) < 200


def test_errors_reach_the_caller(async_engine):
    too_long = [1] * async_engine.max_model_len

    async def main():
        with pytest.raises(ContextLengthError):
            await collect(async_engine, too_long)
        # The engine keeps serving after a rejected request.
        return await collect(async_engine, prompt(async_engine, "Hi"))

    assert asyncio.run(main())[-1].finished
    async_engine.shutdown()
    assert not async_engine.is_running

    async def after():
        await collect(async_engine, [1, 2, 3])

    with pytest.raises(EngineDeadError):
        asyncio.run(after())
