"""Seeded random models (a small standing version of session 22's random-model fuzzing): DAGs
mixing the patterns that once gave wrong results in the runtime, exported with pnnx at batch 1
and 2 and compared with torch over repeated calls, with earlier results held across later calls,
fused and not. The patterns: activations of transposed square maps and attention whose results
are views in another layout, as pieces of concatenations planned in place (batch 1); values that
are both pieces and outputs; multi-output operators whose outputs the model uses in a random
order (``nn.MaxPool2d(return_indices=True)``, ``nn.MultiheadAttention(need_weights=True)``, pnnx
lists them in the order of first use); ``torch.split`` with sizes from the shape."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from test_layers_misc import export_module
from torch import nn

import kuiper_xp

C, S = 4, 4  # channels; square maps, so a transposed map has the shape of its slot
ACTS = (torch.relu, torch.sigmoid, F.silu, F.gelu, F.hardswish, torch.tanh)


class RandomNet(nn.Module):
    """``steps`` random steps over (N, C, S, S) values, each reading one or two earlier values;
    the last value, two random intermediates and the side results are the outputs."""

    def __init__(self, seed: int, steps: int = 12):
        super().__init__()
        rng = random.Random(seed)
        self.plan: list[tuple] = []
        self.convs, self.pools, self.attns = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        for _ in range(steps):
            kind = rng.choice(("act_t", "tcat", "conv", "cat", "add", "pool", "mha", "split"))
            a, b = rng.randrange(1 << 16), rng.randrange(1 << 16)  # (earlier values, taken mod count)
            if kind == "conv":
                self.convs.append(nn.Sequential(nn.Conv2d(C, C, 3, padding=1), nn.BatchNorm2d(C)))
                arg = len(self.convs) - 1
            elif kind in ("cat", "tcat"):
                self.convs.append(nn.Conv2d(2 * C, C, 1))
                arg = (len(self.convs) - 1, rng.randrange(len(ACTS)))
            elif kind == "pool":
                self.pools.append(nn.MaxPool2d(3, 1, 1, return_indices=True))
                arg = (len(self.pools) - 1, rng.random() < 0.5)  # (module, indices read first)
            elif kind == "mha":
                self.attns.append(nn.MultiheadAttention(C, 2, batch_first=True))
                arg = (len(self.attns) - 1, rng.random() < 0.5)  # (module, weights read first)
            else:
                arg = rng.randrange(len(ACTS))
            self.plan.append((kind, a, b, arg))
        self.picks = (rng.randrange(1 << 16), rng.randrange(1 << 16))
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        vals, side = [x], []
        for kind, a, b, arg in self.plan:
            u, v = vals[a % len(vals)], vals[b % len(vals)]
            if kind == "act_t":
                y = ACTS[arg](u.transpose(2, 3))
            elif kind == "conv":
                y = F.relu(self.convs[arg](u))
            elif kind == "cat":
                c = torch.cat([u, v], 1)
                y = self.convs[arg[0]](c) + c[:, :C]
            elif kind == "tcat":  # a transposed map's activation, a piece of a concatenation, read after it
                t = ACTS[arg[1]](u.transpose(2, 3))
                c = torch.cat([t, v], 1)
                y = self.convs[arg[0]](c)
                side += [c, t]
            elif kind == "add":
                y = u + v
            elif kind == "pool":
                p, idx_first = arg
                val, idx = self.pools[p](u)
                if idx_first:
                    side.append(idx + 1)
                    y = val * 2
                else:
                    y = val * 2
                    side.append(idx + 1)
            elif kind == "mha":
                m, weights_first = arg
                n = u.shape[0]
                t = u.flatten(2).transpose(1, 2)
                o, w = self.attns[m](t, t, t, need_weights=True)
                if weights_first:
                    side.append(w * 3)
                    y = o.transpose(1, 2).reshape(n, C, S, S)
                else:
                    y = o.transpose(1, 2).reshape(n, C, S, S)
                    side.append(w * 3)
            else:  # split with sizes from the shape, pieces joined back the other way round
                p, q = torch.split(u, [1, u.shape[1] - 1], 1)
                y = torch.cat([q, ACTS[arg](p)], 1)
            vals.append(y)
        i, j = self.picks
        return (vals[-1], vals[1 + i % (len(vals) - 1)], vals[1 + j % (len(vals) - 1)], *side)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_random_models_match_torch(tmp_path, seed):
    torch.manual_seed(seed)
    model = RandomNet(seed).eval()
    param = export_module(model, (torch.randn(1, C, S, S),), tmp_path, inputs2=(torch.randn(2, C, S, S),))
    inputs = [torch.randn(1, C, S, S), torch.randn(1, C, S, S), torch.randn(2, C, S, S)]
    with torch.no_grad():
        want = [[o.numpy() for o in model(x)] for x in inputs]
    for fuse in (True, False):
        g = kuiper_xp.load(param, backend="numpy", fuse=fuse)
        held = []
        for call in range(2):  # (from the second call with the same shapes, concatenations in place)
            for x, w in zip(inputs, want):
                outs = g(x.numpy())
                held.append((outs, w))
                assert len(outs) == len(w)
                for k, (a, e) in enumerate(zip(outs, w)):
                    assert np.asarray(a).dtype == e.dtype, f"seed {seed} output {k}"
                    assert_close(a, e, rtol=1e-5, what=f"seed {seed} fuse={fuse} call {call} output {k}")
        for outs, w in held:  # results handed out earlier are not rewritten by later calls
            for k, (a, e) in enumerate(zip(outs, w)):
                assert_close(a, e, rtol=1e-5, what=f"seed {seed} fuse={fuse} held output {k}")
