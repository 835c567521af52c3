"""The batch-invariance check shared by the CPU quantized-matmul tests (exact and A8 kernels).

The kernels' contract (DESIGN.md: kernels are batch-invariant): row i of an M-row call must
equal the 1-row call on row i bit for bit, whatever M, and the result must not depend on the
thread count.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def assert_batch_invariant(call: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> None:
    """Assert that ``call`` (``[M, K] -> [M, N]``) is batch- and thread-invariant on ``x``.

    With ``R = x.shape[0]`` rows: ``call(x)`` equals the ``R`` one-row calls stacked, every
    prefix ``call(x[:m])`` (``m`` in 1..R-1) equals the first ``m`` rows of ``call(x)``, and a
    call on one thread equals one on two (and ``call(x)``); all bit for bit (``torch.equal``).
    The caller's thread count is restored.
    """
    rows = x.shape[0]
    full = call(x)
    singles = torch.cat([call(x[i:i + 1]) for i in range(rows)])
    assert torch.equal(full, singles), "an M-row call differs from the 1-row calls"
    for m in range(1, rows):
        assert torch.equal(call(x[:m]), full[:m]), f"the {m}-row call differs"
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = call(x)
        torch.set_num_threads(2)
        two = call(x)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two) and torch.equal(one, full), "the result depends on threads"
