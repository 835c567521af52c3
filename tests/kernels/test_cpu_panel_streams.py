"""One row through the AVX2 panel kernels reads two tiles side by side (``panel_avx2.h``'s
``tiles_avx2``: a thread's tile range split in halves, an odd tile last): each output must
still equal the portable kernel's bit for bit, for every panel kind, whatever the number of
tiles a thread gets (even, odd, one) and the number of threads."""

from __future__ import annotations

import pytest
import torch

from localchat.engine.quant.int4_panel import to_panel
from localchat.engine.quant.int5_panel import to_panel5
from localchat.engine.quant.int6_panel import to_panel6
from localchat.engine.quant.int8_panel import to_panel8
from localchat.kernels import cpu

from .test_cpu_kscales import kscale_weights
from .test_cpu_panel5 import _weights as int5_weights
from .test_cpu_panel6 import _weights as int6_weights
from .test_cpu_panel8 import q8_weights
from .test_cpu_quant_a8 import activations, built  # noqa: F401

KINDS = {
    "int4": (lambda n, k: to_panel(*kscale_weights(n, k, seed=n)), cpu.int4_panel_a8, 512),
    "int5": (lambda n, k: to_panel5(*int5_weights(n, k, seed=n)), cpu.int5_panel_a8, 256),
    "int6": (lambda n, k: to_panel6(*int6_weights(n, k, seed=n)), cpu.int6_panel_a8, 512),
    "int8": (lambda n, k: to_panel8(*q8_weights(n, k, seed=n)), cpu.int8_panel_a8, 160),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tiles", [1, 2, 5, 8, 13])
def test_one_row_equals_the_portable_kernel(built, kind, tiles):  # noqa: F811
    if cpu.best_isa() < 1:
        pytest.skip("no AVX2 on this CPU: only the portable kernel runs")
    make, op, k = KINDS[kind]
    panel = make(16 * tiles, k)
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, 2, 3):
            torch.set_num_threads(n_threads)
            for seed in range(3):
                x = activations(1, k, seed=seed)
                for dtype in (torch.float32, torch.bfloat16):
                    assert torch.equal(op(x.to(dtype), *panel, isa=1),
                                       op(x.to(dtype), *panel, isa=0)), (n_threads, seed, dtype)
    finally:
        torch.set_num_threads(threads)
