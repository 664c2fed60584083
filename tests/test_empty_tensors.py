"""Empty tensors at run time (an empty batch from a loader or a detector, a sequence of length
0): torch returns empty results, or for attention with no keys zeros through the output
projection; kuiper-xp must give the same shapes and values, not a numpy error from a reduction
or a ``reshape(..., -1)`` over zero elements. Expected values come from torch."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import export_module
from torch import nn

import kuiper_xp


class _MHA(nn.Module):
    def __init__(self):
        super().__init__()
        self.m = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, q, kv):
        return self.m(q, kv, kv, need_weights=False)[0]


class _SDPA(nn.Module):
    def forward(self, q, kv):
        return F.scaled_dot_product_attention(q, kv, kv)


class _GroupNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.g = nn.GroupNorm(2, 4)

    def forward(self, x):
        return self.g(x)


class _Einsum(nn.Module):
    def forward(self, a, b):
        return torch.einsum("bld,ble->bde", a, b)


class _AdaptiveMax3d(nn.Module):
    def forward(self, x):
        v, i = F.adaptive_max_pool3d(x, 2, return_indices=True)
        return v, i


# (module, example inputs, the other example, [empty inputs to run])
CASES = {
    "mha_cross_no_keys": (_MHA, [(2, 5, 8), (2, 6, 8)], [(3, 4, 8), (3, 7, 8)],
                          [[(2, 5, 8), (2, 0, 8)], [(2, 0, 8), (2, 0, 8)], [(0, 5, 8), (0, 6, 8)]]),
    "sdpa_no_keys": (_SDPA, [(2, 5, 8), (2, 6, 8)], [(3, 4, 8), (3, 7, 8)],
                     [[(2, 5, 8), (2, 0, 8)], [(0, 5, 8), (0, 6, 8)]]),
    "group_norm_empty_batch": (_GroupNorm, [(2, 4, 6, 6)], [(3, 4, 5, 7)], [[(0, 4, 6, 6)], [(2, 4, 0, 0)]]),
    "einsum_empty_sum": (_Einsum, [(2, 5, 8), (2, 5, 8)], [(3, 7, 8), (3, 7, 8)],
                         [[(2, 0, 8), (2, 0, 8)], [(0, 5, 8), (0, 5, 8)]]),
    "adaptive_max3d_empty_batch": (_AdaptiveMax3d, [(2, 1, 4, 6, 6)], [(3, 1, 5, 7, 6)], [[(0, 1, 4, 6, 6)]]),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = {}
    for name, (cls, ex1, ex2, _) in CASES.items():
        torch.manual_seed(0)
        m = cls().eval()
        out[name] = (m, export_module(m, [torch.randn(*s) for s in ex1], tmp_path_factory.mktemp(name),
                                      inputs2=[torch.randn(*s) for s in ex2]))
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_empty_tensors_match_torch(exported, name):
    m, param = exported[name]
    with warnings.catch_warnings():
        # (nothing to warn about: the attention's one output has embed_dim last while the key
        # length is dynamic, so it cannot be the weights)
        warnings.simplefilter("error")
        g = kuiper_xp.load(param, backend="numpy")
    for shapes in CASES[name][3]:
        xs = [torch.randn(*s) for s in shapes]
        with torch.no_grad():
            want = m(*xs)
        want = want if isinstance(want, tuple) else (want,)
        got = g(*[x.numpy() for x in xs])
        assert len(got) == len(want)
        for a, b in zip(got, want):
            a = kuiper_xp.to_numpy(a)
            assert a.shape == tuple(b.shape), (name, shapes, a.shape, tuple(b.shape))
            assert a.dtype == b.numpy().dtype
            np.testing.assert_allclose(a, b.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"{name} {shapes}")
