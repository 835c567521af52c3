"""``localchat serve``: one resident ``AsyncLLMEngine`` behind an OpenAI-compatible HTTP API,
and the client that ``ask``, ``chat --jsonl`` and the TUI use for a running server or a remote
``--endpoint``.

Modules: ``protocol`` (request bodies, validated), ``errors`` (OpenAI-shaped errors),
``limits`` (body size, auth), ``metrics`` (Prometheus text), ``routes`` (the FastAPI app),
``state`` (the runtime state file a running server leaves), ``serve_cmd`` (the command),
``client`` (an OpenAI-compatible streaming client shaped like the engine).
"""
