"""``kernels.a8_two_pass``: a quantized linear through the integer-dot kernels at almost fp32
precision (the activations' int8 rounding and its remainder in one call of twice the rows).

Against the exact fp32-activation kernel (the independent reference here): one integer-dot
pass errs by the activations' int8 rounding; two passes must cut that error by well over an
order of magnitude (the remainder's step is 254x smaller; the bound asks for 20x, and for an
absolute error far under the one-pass one). Also: row i of a T-row call equals the 1-row call
bit for bit (rows go 8 at a time, each row's result its own), and where the linear takes the
exact kernel the two halves sum back to it within fp32 rounding.
"""

from __future__ import annotations

import pytest
import torch

from localchat import kernels
from localchat.kernels import cpu

from .test_quant_matmul import quantize_int4, quantize_int8

pytestmark = pytest.mark.skipif(not cpu.available(), reason="C++ CPU kernels not built")


def _weights(kind: str, n: int, k: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen)
    if kind == "int4":
        packed, s, mins, _ = quantize_int4(w, 32)
        return lambda x: kernels.int4_matmul(x, packed, s, mins, 32)
    q, s, mins = quantize_int8(w, 32, False)
    return lambda x: kernels.int8_matmul(x, q, s, mins, 32)


def _activations(t: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k, generator=gen)
    x[:, :32] *= 8  # blocks of different magnitude
    return x


@pytest.mark.parametrize("kind", ["int4", "int8"])
@pytest.mark.parametrize("t", [1, 3, 11])
def test_two_passes_are_near_exact(kind, t):
    fn = _weights(kind, 96, 576, seed=t)
    x = _activations(t, 576, seed=t + 1)
    with kernels.a8_fp32(False):
        exact = fn(x)
    with kernels.a8_fp32():
        one = fn(x)
        two = kernels.a8_two_pass(fn, x)
    err1 = (one - exact).abs().max().item()
    err2 = (two - exact).abs().max().item()
    assert err1 > 1e-2  # the one-pass path really rounds the activations
    assert err2 < err1 / 20, (err1, err2)


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_two_passes_are_batch_invariant(kind):
    fn = _weights(kind, 64, 256, seed=5)
    x = _activations(11, 256, seed=6)
    with kernels.a8_fp32():
        full = kernels.a8_two_pass(fn, x)
        for i in (0, 7, 8, 10):
            assert torch.equal(kernels.a8_two_pass(fn, x[i:i + 1])[0], full[i])


def test_on_the_exact_kernel_the_halves_sum_back():
    fn = _weights("int4", 64, 256, seed=7)
    x = _activations(4, 256, seed=8)
    with kernels.a8_fp32(False):
        torch.testing.assert_close(kernels.a8_two_pass(fn, x), fn(x), rtol=1e-5, atol=1e-4)


def test_odd_width_falls_back_to_one_call():
    calls = []

    def fn(x):
        calls.append(x.shape)
        return x.sum(-1, keepdim=True)

    x = torch.randn(3, 40)
    assert torch.equal(kernels.a8_two_pass(fn, x), x.sum(-1, keepdim=True))
    assert calls == [(3, 40)]
