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


class _Scatter(nn.Module):
    def forward(self, x, idx):
        return (torch.zeros_like(x).scatter_add(1, idx, x[:, :3]),
                x.scatter_reduce(1, idx, x[:, :3], "amax", include_self=False))


class _ScatterArgsort(nn.Module):
    def forward(self, s):
        return torch.zeros_like(s).scatter_add(2, s.argsort(2), s)


class _SortGather(nn.Module):  # a detector's post-process: order by score, gather the boxes
    def forward(self, s):
        _, i = s.amax(2).sort(1, descending=True)
        return torch.gather(s, 1, i.unsqueeze(2).expand(-1, -1, 8))


class _Deconv(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.ConvTranspose1d(8, 3, 3, stride=2)
        self.c2 = nn.ConvTranspose2d(8, 3, 3, stride=2)

    def forward(self, s, x):
        return self.c1(s), self.c2(x)


class _GridSample(nn.Module):
    def forward(self, x, g):
        return F.grid_sample(x, g, align_corners=False)


class _InfNorm(nn.Module):
    def forward(self, s):
        return torch.linalg.vector_norm(s, ord=float("inf"), dim=1)


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
    "scatter_empty_index": (_Scatter, [(2, 6), "int6:2,3"], [(3, 6), "int6:3,3"], [[(0, 6), "int6:0,3"]]),
    "scatter_argsort_empty_batch": (_ScatterArgsort, [(2, 5, 8)], [(3, 7, 8)], [[(0, 5, 8)], [(2, 0, 8)]]),
    "sort_gather_empty_batch": (_SortGather, [(2, 5, 8)], [(3, 7, 8)], [[(0, 5, 8)], [(2, 0, 8)], [(0, 0, 8)]]),
    "deconv_empty_batch_and_map": (_Deconv, [(2, 8, 5), (2, 8, 4, 4)], [(3, 8, 6), (3, 8, 5, 5)],
                                   [[(0, 8, 5), (0, 8, 4, 4)], [(0, 8, 0), (0, 8, 0, 0)]]),
}

# where torch raises (an empty map with images in the batch, an inf norm over nothing),
# kuiper-xp raises a ShapeError naming the operator, not a numpy error
REFUSED = {
    "deconv_empty_map": (_Deconv, [(2, 8, 5), (2, 8, 4, 4)], [(3, 8, 6), (3, 8, 5, 5)], [(2, 8, 0), (2, 8, 0, 0)],
                         r"ConvTranspose2d 'c2': input of shape \(2, 8, 0, 0\) has an empty spatial dimension; only an empty batch"),
    "grid_sample_empty_map": (_GridSample, [(2, 4, 6, 6), (2, 5, 5, 2)], [(3, 4, 7, 7), (3, 5, 5, 2)],
                              [(2, 4, 0, 0), (2, 5, 5, 2)], "grid_sample.*empty spatial dimension"),
    "inf_norm_empty_dim": (_InfNorm, [(2, 5, 8)], [(3, 7, 8)], [(2, 0, 8)], "inf norm over an empty dim"),
}


def _make(spec):
    """A tensor for a shape, or for "intN:shape" int64 ids in [0, N)."""
    if isinstance(spec, str):
        hi, shape = spec[3:].split(":")
        return torch.randint(0, int(hi), tuple(int(s) for s in shape.split(",")))
    return torch.randn(*spec)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = {}
    for name, (cls, ex1, ex2, *_) in (CASES | REFUSED).items():
        torch.manual_seed(0)
        m = cls().eval()
        out[name] = (m, export_module(m, [_make(s) for s in ex1], tmp_path_factory.mktemp(name),
                                      inputs2=[_make(s) for s in ex2]))
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
        xs = [_make(s) for s in shapes]
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


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_empty_tensors_torch_refuses_are_shape_errors(exported, name):
    from kuiper_xp.errors import ShapeError

    m, param = exported[name]
    xs = [_make(s) for s in REFUSED[name][3]]
    with pytest.raises(Exception):  # noqa: B017  (torch's own error types vary)
        m(*xs)
    g = kuiper_xp.load(param, backend="numpy")
    with pytest.raises(ShapeError, match=REFUSED[name][4]):
        g(*[x.numpy() for x in xs])
