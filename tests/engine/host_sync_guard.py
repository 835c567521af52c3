"""A ``TorchFunctionMode`` that records (or refuses) host reads of tensor values and host
tensor creation: what breaks a CUDA-graph capture or costs a sync per call on a GPU.

On CPU every tensor is a host tensor, so the guard judges the *operation*: ``.item()``,
``.tolist()``, ``bool()``/``int()``/``float()``/``__index__`` of a tensor, ``.cpu()``,
``.numpy()``, ``torch.tensor``/``as_tensor``/``from_numpy`` (host data), a factory without an
explicit ``device=`` (it lands on the host), and indexing with a Python list (a host index
tensor). With ``blocking_copies=True`` only reads and host data sent to a device without
``non_blocking`` count (for code that stages host values on purpose: the sampler's per-row
settings). Inside ``localchat.kernels`` ops the guard can pause (``pause_in_kernels``): there the
CPU stands in for the Triton launchers, which never read device values (their launch
arguments are shapes and strides); the guard checks the engine code around them.
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy"}
HOST_DATA = {"tensor", "as_tensor", "from_numpy", "asarray"}
FACTORIES = {"empty", "zeros", "ones", "full", "arange", "rand", "randn", "randint", "eye",
             "linspace", "empty_strided"}
KERNEL_OPS = ("store_kv_cache", "paged_attention_decode", "prefill_attention", "rms_norm",
              "fused_add_rms_norm", "apply_rope", "int8_matmul", "int4_matmul")


class HostSyncError(AssertionError):
    """A host read or host tensor creation where none is allowed."""


class HostSyncGuard(TorchFunctionMode):
    """Record offending ops in ``self.events`` (name strings); raise ``HostSyncError`` at the
    first one when ``strict``. ``paused`` (a counter) suspends the guard."""

    def __init__(self, strict: bool = True, reads_only: bool = False,
                 blocking_copies: bool = False) -> None:
        super().__init__()
        self.strict = strict
        self.reads_only = reads_only
        self.blocking_copies = blocking_copies
        self.events: list[str] = []
        self.paused = 0

    @staticmethod
    def _blocking_copy(name: str, args, kwargs) -> bool:
        """Host data sent to a device without ``non_blocking``: ``torch.tensor(data,
        device=...)`` (a pageable copy plus a stream sync on CUDA) or ``t.to(device)`` /
        ``t.cuda()`` with ``non_blocking`` false. Host tensors built first (pinned, no
        ``device=``) and sent with ``non_blocking=True`` pass."""
        if name in HOST_DATA:
            return kwargs.get("device") is not None
        if name in ("to", "cuda"):
            target = name == "cuda" or kwargs.get("device") is not None or any(
                isinstance(a, (torch.device, str)) for a in args[1:])
            return target and not kwargs.get("non_blocking", False)
        return False

    def _offends(self, name: str, args, kwargs) -> bool:
        if name in READS:
            return True
        if self.blocking_copies:
            return self._blocking_copy(name, args, kwargs)
        if self.reads_only:
            return False
        if name in HOST_DATA:
            return True
        if name in FACTORIES and kwargs.get("device") is None:
            return True
        if name == "__getitem__" and len(args) > 1:
            idx = args[1] if isinstance(args[1], tuple) else (args[1],)
            return any(isinstance(i, list) for i in idx)
        return False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.paused:
            name = getattr(func, "__name__", "")
            if self._offends(name, args, kwargs):
                self.events.append(name)
                if self.strict:
                    raise HostSyncError(f"host sync or host tensor in a sync-free region: "
                                        f"{name}")
        return func(*args, **kwargs)

    @contextlib.contextmanager
    def pause(self):
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1


def pause_in_kernels(monkeypatch, guard: HostSyncGuard) -> None:
    """Wrap every ``localchat.kernels`` op so that ``guard`` pauses while it runs."""
    from localchat import kernels

    for name in KERNEL_OPS:
        op = getattr(kernels, name)

        def wrapped(*args, _op=op, **kwargs):
            with guard.pause():
                return _op(*args, **kwargs)

        monkeypatch.setattr(kernels, name, wrapped)


def pause_in_cpu_only(monkeypatch, guard: HostSyncGuard) -> None:
    """Pause ``guard`` inside code the engine runs on CPU tensors only: the sampler's top-k
    candidate filter (``sampler._filter_candidates``, taken when ``logits.is_cpu``; on CUDA
    the full sort runs instead), whose host reads decide whether the candidates suffice."""
    from localchat.engine import sampler

    fn = sampler._filter_candidates

    def wrapped(logits, *args, **kwargs):
        assert logits.is_cpu, "the candidate filter runs on CPU logits only"
        with guard.pause():
            return fn(logits, *args, **kwargs)

    monkeypatch.setattr(sampler, "_filter_candidates", wrapped)


def pause_in_staging(monkeypatch, guard: HostSyncGuard) -> None:
    """Pause ``guard`` inside ``StagingBuffers`` (host-side packing by design: it writes a
    pinned host buffer and issues the step's one asynchronous copy)."""
    from localchat.engine.step_inputs import StagingBuffers

    for name in ("take", "copy", "to_device"):
        method = getattr(StagingBuffers, name)

        def wrapped(self, *args, _m=method, **kwargs):
            with guard.pause():
                return _m(self, *args, **kwargs)

        monkeypatch.setattr(StagingBuffers, name, wrapped)
