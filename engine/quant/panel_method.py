"""What the panel layouts' linear methods share (``PanelMixin``): the int4 (``int4_panel.py``),
int5 (``int5_panel.py``), int6 (``int6_panel.py``) and int8 (``int8_panel.py``) panels
interleave ``ROWS`` = 16 outputs per tile, compute decode and verification rows with their
``kernels.cpu`` op, run longer prompts through the row layout's prefill GEMM over rows
dequantized from the tiles, read rows back from the tiles (a tied embedding, the greedy head)
and compute a vocabulary prefix from their first tiles alone (a draft model's output
layer)."""

from __future__ import annotations

import torch

from .methods import _add_bias, _drop, _set_buffer

ROWS = 16  # outputs per tile


def to_tiles(t: torch.Tensor, n: int, per_row: int) -> torch.Tensor:
    """``[N, C * per_row]`` -> ``[N / 16, C, 16 * per_row]``: the 16 outputs of each tile
    interleaved per column unit."""
    c = t.shape[1] // per_row
    return t.reshape(n // ROWS, ROWS, c, per_row).transpose(1, 2) \
        .reshape(n // ROWS, c, ROWS * per_row).contiguous()


def from_tiles(t: torch.Tensor, per_row: int) -> torch.Tensor:
    """The inverse of :func:`to_tiles`: ``[N / 16, C, 16 * per_row]`` -> ``[N, C * per_row]``."""
    nt, c = t.shape[0], t.shape[1]
    return t.reshape(nt, c, ROWS, per_row).transpose(1, 2).reshape(nt * ROWS, c * per_row) \
        .contiguous()


def _exact_fp32(dtype: torch.dtype) -> bool:
    """Whether activations of ``dtype`` are fp32 outside the integer-dot kernels' reach
    (``kernels.cpu_a8_enabled``): an ``a8_fp32`` engine's prompt step, whose every row count
    then takes the exact GEMM (its KV does not depend on how the prompt is chunked)."""
    from localchat import kernels

    return dtype == torch.float32 and not kernels.cpu_a8_enabled(torch.float32)


class PanelMixin:
    """What the panel layouts' linear methods share once :meth:`to_panel` has run
    (``self.panel``; before that the row-layout base class answers): rows through the
    layout's ``kernels.cpu`` op ``_OP`` over :meth:`_panel`'s tensors, the same call for the
    C++ decoder stack (``decode_plan``), the first tiles alone for ``apply_prefix``, prompts
    of more than ``kernels.CPU_MAX_ROWS`` rows through the row layout's prefill GEMM where
    :meth:`_rows_op` names the C++ op that dequantizes panel tiles to its values, and fewer
    fp32 rows the integer-dot kernels do not take (:func:`_exact_fp32`) through the exact
    fp32 op ``_F32_OP`` over the same tensors (:meth:`_prompt`; without a rows op, through
    ``_OP`` too), rows read back (the greedy head, a tied embedding) from
    :meth:`_dequantize_tiles`, and :meth:`to_rows`
    (a cache entry that could not be mapped). Put before the row-layout method in the bases;
    a subclass gives ``_OP``, ``_PANEL_NAMES`` (or :meth:`_panel_names` and :meth:`_panel`)
    and ``to_panel`` (through :meth:`_install`)."""

    _OP = ""
    # the exact fp32 op over :meth:`_rows_op`'s tensors (``op(x, *tensors, isa)``), for the
    # rows whose activations stay fp32 (panelf.h); layouts with a rows op name one
    _F32_OP = ""
    _PANEL_NAMES: tuple[str, ...] = ()  # the panel buffers, in ``_OP``'s argument order

    def _panel_names(self) -> tuple[str, ...]:
        return self._PANEL_NAMES

    def _panel(self, layer) -> tuple[torch.Tensor | None, ...]:
        return tuple(layer._buffers[name] for name in self._panel_names())

    def _install(self, layer, rows: tuple[str, ...], tensors: list[torch.Tensor],
                 convert=None) -> None:
        """Replace the row-layout buffers ``rows`` by ``tensors`` (named
        :meth:`_panel_names`) once ``convert()`` (the C++ conversion writing them from the
        rows) has run; without it they stay empty, for a cache entry's to be mapped over."""
        if convert is not None:
            convert()
        _drop(layer, *rows)
        for name, tensor in zip(self._panel_names(), tensors):
            _set_buffer(layer, name, tensor)
        self.panel = True

    def to_rows(self, layer, device) -> None:
        """Back to empty row-layout buffers (a cache entry that could not be mapped: the rows
        are filled from the GGUF again)."""
        _drop(layer, *self._panel_names())
        self.create_weights(layer, device)
        self.panel = False

    def exact_cpu_rows(self, layer) -> bool:
        if not self.panel:
            return super().exact_cpu_rows(layer)
        return self._rows_op(layer) is not None  # ``_F32_OP`` runs a short prefill's chunks

    def decode_plan(self, layer, dtype):
        if not self.panel:
            return super().decode_plan(layer, dtype)
        from localchat import kernels

        rows_op = self._rows_op(layer)
        if rows_op is not None and _exact_fp32(dtype):  # an exact fp32 prompt step
            return ([(self._F32_OP, (kernels.INPUT, *rows_op[1], kernels.cpu.active_isa()))],
                    layer.bias)
        return ([(self._OP, (kernels.INPUT, *self._panel(layer),
                             kernels.cpu.active_isa()))], layer.bias)

    def apply_prefix(self, layer, x, n):
        if not self.panel or n % ROWS:
            return super().apply_prefix(layer, x, n)
        from localchat.kernels import cpu

        tiles = [None if t is None else t[: n // ROWS] for t in self._panel(layer)]
        y = getattr(cpu, self._OP)(x.reshape(-1, x.shape[-1]), *tiles)
        bias = None if layer.bias is None else layer.bias[:n]
        return _add_bias(y, bias).reshape(*x.shape[:-1], -1)

    def _gather_op(self, layer) -> tuple[str, tuple[torch.Tensor, ...]] | None:
        """``(name, tensors)``: the ``kernels.cpu`` op that writes single rows of the weight by
        id, the row layout's fp32 values, straight from their tile lanes (``op(*tensors, ids
        [n] int64, out [n, K] fp32)``; ``panel_gather.cpp``), for :meth:`_panel_rows`; None:
        whole tiles are turned back into rows there."""
        return None

    def _rows_op(self, layer) -> tuple[str, tuple[torch.Tensor, ...]] | None:
        """``(name, tensors)``: the ``kernels.cpu`` op that writes rows ``[a, a + b)`` of the
        weight, the row layout's values, from the panel (``op(*tensors, a, out [b, K])``), for
        a prompt's GEMM; None: prompts go through ``_OP`` as every other row count."""
        return None

    def apply(self, layer, x):
        if not self.panel:
            return super().apply(layer, x)
        from localchat.kernels import cpu

        from .cpu_prefill import cpp_prefill

        x2 = x.reshape(-1, x.shape[-1])
        rows_op = self._rows_op(layer)
        if rows_op is not None and (cpp_prefill(x2.shape[0]) or _exact_fp32(x2.dtype)):
            y = self._prompt(layer, x2, *rows_op)
        else:
            y = getattr(cpu, self._OP)(x2, *self._panel(layer))
        return _add_bias(y, layer.bias).reshape(*x.shape[:-1], -1)

    def _prompt(self, layer, x: torch.Tensor, name: str,
                tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """``x [M, K] @ w.T`` -> ``[M, N]``: the row layout's prompt path (``cpu_prefill.
        blockwise_mm``: blocks of rows dequantized, to bf16 for bf16 ``x``, then a GEMM), its
        blocks written from the panel tiles by the op :meth:`_rows_op` names, the row
        layout's values bit for bit. So a prompt's logits do not change with the layout:
        SmolLM2's (Q4_1) first answer token to "What is the capital of France?" is a
        0.085-logit near-tie that the integer-dot kernel's int8 activations flip. Up to
        ``kernels.CPU_MAX_ROWS`` fp32 rows (an fp32 engine's short prompt step, its logits
        rows) take the layout's exact fp32 op (``_F32_OP``, ``kernels/cpu/panelf.h``: the same
        values unpacked in registers, each output one fp32 sum in column order), batch
        invariant: a request's first token then does not depend on the requests beside it
        (``tests/engine/test_step_groups.py``). It replaced a batch-invariant float matmul over
        every tile dequantized into a scratch (SmolLM2's 49152 x 576 Q8_0 head, one row, 2
        threads on the AVX2 Zen 3: 10.5 -> 1.5 ms; a 1536 x 576 Q4_1 layer 0.29 -> 0.04 ms)."""
        from localchat import kernels
        from localchat.kernels import cpu

        from .cpu_prefill import blockwise_mm

        if x.dtype == torch.float32 and x.shape[0] <= kernels.CPU_MAX_ROWS:
            return getattr(cpu, self._F32_OP)(x, *tensors)
        op = getattr(cpu, name)

        def fill(a: int, b: int, w: torch.Tensor) -> None:
            op(*tensors, a, w)

        return blockwise_mm(x, layer.out_features, layer.in_features, fill,
                            key=tensors[0].data_ptr(), align=ROWS,
                            invariant=x.shape[0] <= kernels.CPU_MAX_ROWS)

    def _dequantize_tiles(self, *tiles: torch.Tensor) -> torch.Tensor:
        """Panel tiles (the :meth:`_panel` tensors indexed by tile) -> fp32 ``[16 T, K]``,
        the row layout's dequantized values bit for bit."""
        raise NotImplementedError(f"{type(self).__name__} reads no rows back")

    def _panel_rows(self, layer, rows: slice | torch.Tensor,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Rows ``rows`` (a slice or ids ``[n]``) dequantized from the tiles that hold them:
        ``[n, K]`` in ``dtype`` (the fp32 values, rounded once for a 16-bit ``dtype``). Where
        :meth:`_gather_op` names a C++ op, each row is read from its tile lane by it (the
        1.5B's Q6_K output layer: 370 greedy candidates rescored in 0.8 ms against 35.7 ms
        through its tiles' PyTorch dequantization; a decode step's embedding lookup of
        SmolLM2's tied Q8_0 layer 18 us against 148 us through its tiles' C++ op); else,
        where :meth:`_rows_op` names a C++ op, each tile is written by it straight in fp32
        or bf16; otherwise :meth:`_dequantize_tiles`."""
        ids = torch.arange(layer.out_features)[rows] if isinstance(rows, slice) else rows.cpu()
        gather = self._gather_op(layer)
        if gather is not None:
            from localchat.kernels import cpu

            w = torch.empty(ids.shape[0], layer.in_features, dtype=torch.float32)
            getattr(cpu, gather[0])(*gather[1], ids.to(torch.int64).contiguous(), w)
            return w.to(dtype)
        tiles, inverse = torch.unique(ids // ROWS, return_inverse=True)
        rows_op = self._rows_op(layer)
        if rows_op is None:
            w = self._dequantize_tiles(*(t[tiles] for t in self._panel(layer) if t is not None))
        else:
            from localchat.kernels import cpu

            op, tensors = getattr(cpu, rows_op[0]), rows_op[1]
            out_dtype = dtype if dtype in (torch.float32, torch.bfloat16) else torch.float32
            w = torch.empty(len(tiles) * ROWS, layer.in_features, dtype=out_dtype)
            for i, tile in enumerate(tiles.tolist()):
                op(*tensors, tile * ROWS, w[i * ROWS:(i + 1) * ROWS])
        return w[inverse * ROWS + ids % ROWS].to(dtype)

    def dequantize_rows(self, layer, rows):
        if not self.panel:
            return super().dequantize_rows(layer, rows)
        return self._panel_rows(layer, rows)

    def embed(self, layer, ids, dtype):
        if not self.panel:
            return super().embed(layer, ids, dtype)
        return self._panel_rows(layer, ids.reshape(-1), dtype).reshape(*ids.shape, -1)
