"""Attention and friends: ``nn.MultiheadAttention``, ``F.scaled_dot_product_attention``, the
matrix products (``torch.matmul/bmm/mm/addmm/baddbmm/einsum``) and ``nn.Embedding``.

pnnx spellings (torch 2.13 exports):

* ``nn.MultiheadAttention attn 1 1 0 7 add_bias_kv=False add_zero_attn=False batch_first=True
  bias=True embed_dim=16 kdim=16 num_heads=4 vdim=16 @in_proj_bias=(48)f32
  @in_proj_weight=(48,16)f32 @out_proj.bias=(16)f32 @out_proj.weight=(16,16)f32``. With kdim or
  vdim different from embed_dim: ``@q_proj_weight @k_proj_weight @v_proj_weight`` instead of
  ``@in_proj_weight``. ``batch_first`` is left out when False. ``bias=False`` drops both biases.
  pnnx also builds this op from hand-written attention it recognises (``fuse_multiheadattention``).
* Its inputs are the distinct tensors among (query, key, value, masks), in the order the traced
  graph first *uses* them: bool masks first (key_padding_mask, then attn_mask), then query, key,
  value (duplicates dropped: self-attention has one data input, ``(x, y, y)`` two), then float
  masks (attn_mask, then key_padding_mask), except that a float mask held in a registered buffer
  (a ``pnnx.Attribute``, CLIP's causal mask) comes before the query. pnnx tags the *last* input
  ``$attn_mask`` whenever any mask was given, which is only right for a float attn_mask; a
  second output (``need_weights``)
  adds the attention weights, averaged over heads or not (only visible from their shape).
  So this layer classifies its inputs by dtype and shape instead of trusting positions: bool
  inputs are masks; the query is the first float input shaped like one (3-D, else 2-D, last axis
  embed_dim); float inputs after the query are data while they look like data (same rank,
  same batch size, feature size kdim/vdim), masks after that; a mask of shape (N, S) is a
  key_padding_mask, (L, S) or (N*num_heads, L, S) an attn_mask; when N == L makes a 2-D mask
  ambiguous, pnnx's order decides; a lone ambiguous mask is read by the shapes the file declares
  (an export whose batch differs from the query length, or whose batch is dynamic, tells them
  apart), else taken as attn_mask with a warning (pnnx writes both the same way).
  Not recoverable from the file: a call with key == query but value different (pnnx keeps two
  data inputs, read here as query and key=value), and ``is_causal=True`` (pnnx drops it).
* ``F.scaled_dot_product_attention ... attn_mask=None dropout_p=0.0 is_causal=True $query=7
  $key=10 $value=13``; with a mask ``$attn_mask=5``; ``scale=0.3`` when given.
* ``nn.Embedding emb 1 1 4 14 embedding_dim=16 num_embeddings=50 sparse=False @weight=(50,16)f32``
  (``F.embedding`` with a module parameter comes out as ``nn.Embedding`` too).
* ``torch.matmul $input $other``, ``torch.bmm`` / ``torch.mm`` ``$input $mat2``, ``torch.addmm
  alpha=1 beta=1 $input $mat1 $mat2``, ``torch.baddbmm alpha=2.0 beta=0.5 $input $batch1
  $batch2``, ``torch.einsum equation=ik,kj->ij`` (operands unnamed).

* ``aten::_transformer_encoder_layer_fwd pnnx_10 20 1 ...``: an ``nn.TransformerEncoderLayer``
  traced in eval mode takes torch's fused path; pnnx keeps it with the weights as
  ``pnnx.Attribute`` inputs and the numbers/flags as constant ``pnnx.Expression`` inputs.

Masks follow torch: in MultiheadAttention a True (bool) entry is *excluded*; in
scaled_dot_product_attention a True entry *takes part*; float masks are added to the scores.
A row whose keys are all masked gives NaN, as torch's MultiheadAttention does.
"""

from __future__ import annotations

import itertools
import math
import warnings
from typing import Any

from kuiper_xp.errors import LayerParameterError, ShapeError

from .base import BuildContext, Layer
from .checks import check_range
from .misc import input_slots, is_float, promote, to_float
from .registry import register


def softmax_last(xp: Any, s: Any, fast: Any = None) -> Any:
    """softmax over the last axis: ``fast`` (a backend's ``softmax_last``) when it takes ``s``."""
    if s.shape[-1] == 0:  # no keys (a max over an empty axis has no identity): empty weights, as torch
        return s
    if fast is not None:
        p = fast(s)
        if p is not None:
            return p
    m = xp.max(s, axis=-1, keepdims=True)
    e = xp.exp(s - m)
    e /= xp.sum(e, axis=-1, keepdims=True)  # e is a fresh temporary
    return e


def attend(xp: Any, q: Any, k: Any, v: Any, scale: float, mask: Any = None, matmul: Any = None,
           fast: Any = None, softmax: Any = None) -> tuple[Any, Any]:
    """softmax(q k^T * scale + mask) v over the last two axes; returns (output, weights).
    ``matmul`` (default ``xp.matmul``) computes the two products. ``fast`` (a backend's
    ``attention``, used when the weights are not wanted) may compute the output instead; the
    weights are then None. ``softmax`` (a backend's ``softmax_last``) may compute the weights."""
    if fast is not None:
        out = fast(q, k, v, scale, mask)
        if out is not None:
            return out, None
    mm = matmul or xp.matmul
    s = mm(q * scale, xp.matrix_transpose(k))
    if mask is not None:
        fits = mask.ndim <= s.ndim and all(
            a in (1, b) for a, b in zip(mask.shape[::-1], s.shape[::-1]))
        if fits and mask.dtype == s.dtype:
            s += mask  # s is a fresh product
        else:
            s = s + mask
    p = softmax_last(xp, s, softmax)
    return mm(p, v), p


def additive_mask(xp: Any, mask: Any, dtype: Any, device: Any, true_means_keep: bool) -> Any:
    """A float mask to add to the scores: bool masks become 0 / -inf, float masks pass."""
    if mask.dtype == xp.bool:
        zero = xp.zeros((), dtype=dtype, device=device)
        ninf = xp.asarray(-math.inf, dtype=dtype, device=device)
        return xp.where(mask, zero, ninf) if true_means_keep else xp.where(mask, ninf, zero)
    return mask if mask.dtype == dtype else xp.astype(mask, dtype)


# ---------------------------------------------------------------------------------------------


@register("nn.MultiheadAttention")
class MultiheadAttention(Layer):
    """torch.nn.MultiheadAttention in eval mode (see the module docstring for how the inputs
    are recognised). Projection weights are transposed once at build time; self-attention uses
    one fused (E, 3E) input projection."""

    def __init__(self, ctx: BuildContext, *, where: str, embed_dim: int, num_heads: int, kdim: int, vdim: int,
                 batch_first: bool, w: dict[str, Any], n_outputs: int, weights_rank: int | None):
        super().__init__(ctx)
        self.where = where
        self.E, self.H, self.kdim, self.vdim = embed_dim, num_heads, kdim, vdim
        self.D = embed_dim // num_heads
        self.scale = 1.0 / math.sqrt(self.D)
        self.batch_first = batch_first
        self.w = w
        self.weights_rank = weights_rank
        self._attention = getattr(ctx.fast, "attention", None)
        self._softmax = getattr(ctx.fast, "softmax_last", None)
        #: what each output is, "out" (attn_output) or "weights", in the file's order (pnnx lists
        #: them in the order the model first uses them: the weights first when they are)
        self.roles: tuple[str, ...] = ("out", "weights")[:n_outputs]
        self._warned_ambiguous = False

    @classmethod
    def from_operator(cls, op, ctx):
        xp = ctx.xp
        E = op.param("embed_dim", int)
        H = op.param("num_heads", int)
        if E <= 0 or H <= 0 or E % H:
            raise LayerParameterError(f"{op.where}: embed_dim={E} must be a positive multiple of num_heads={H}")
        kdim = op.param("kdim", int, default=E)
        vdim = op.param("vdim", int, default=E)
        if len(op.outputs) not in (1, 2):
            raise LayerParameterError(f"{op.where}: expected 1 or 2 outputs, found {len(op.outputs)}")

        def want(name: str, shape: tuple[int, ...], optional: bool = False) -> Any:
            a = op.weight(name, ctx, optional=optional)
            if a is not None and tuple(a.shape) != shape:
                raise LayerParameterError(f"{op.where}: weight {name!r} has shape {tuple(a.shape)}, expected {shape}")
            return a

        # W^T as the backend lays it out for products (numpy: a contiguous copy, the read weight
        # then dropped from the build's cache), else a transposed view
        fast_pack = getattr(ctx.fast, "pack_linear", None)

        def packed(name: str, shape: tuple[int, ...]) -> Any:
            a = want(name, shape)
            if fast_pack is None:
                return xp.matrix_transpose(a)
            ctx.forget(op.weight_ref(name))
            return ctx.derived("pack_linear", a, fast_pack, lambda wt: wt.T)

        w: dict[str, Any] = {}
        if op.weight_ref("in_proj_weight") is not None:
            if kdim != E or vdim != E:
                raise LayerParameterError(f"{op.where}: in_proj_weight needs kdim == vdim == embed_dim")
            w["qkv_t"] = qkv_t = packed("in_proj_weight", (3 * E, E))
            w["q_t"], w["k_t"], w["v_t"] = qkv_t[:, :E], qkv_t[:, E:2 * E], qkv_t[:, 2 * E:]
        else:
            w["q_t"] = packed("q_proj_weight", (E, E))
            w["k_t"] = packed("k_proj_weight", (E, kdim))
            w["v_t"] = packed("v_proj_weight", (E, vdim))
        ipb = want("in_proj_bias", (3 * E,), optional=True)
        if ipb is not None:
            w["qkv_b"] = ipb
            w["q_b"], w["k_b"], w["v_b"] = ipb[:E], ipb[E:2 * E], ipb[2 * E:]
        w["o_t"] = packed("out_proj.weight", (E, E))
        w["o_b"] = want("out_proj.bias", (E,), optional=True)
        has_bias = op.param("bias", bool, default=None)
        if has_bias is not None and has_bias != (ipb is not None) or has_bias is not None and has_bias != (
                w["o_b"] is not None):
            state = {True: "present", False: "absent"}
            raise LayerParameterError(
                f"{op.where}: bias={has_bias}, but in_proj_bias is {state[ipb is not None]} and out_proj.bias is "
                f"{state[w['o_b'] is not None]}")
        if op.param("add_bias_kv", bool, default=False):
            w["bias_k"] = xp.reshape(want("bias_k", (1, 1, E)), (1, 1, E))
            w["bias_v"] = xp.reshape(want("bias_v", (1, 1, E)), (1, 1, E))
        w["zero_attn"] = bool(op.param("add_zero_attn", bool, default=False))
        batch_first = op.param("batch_first", bool, default=False)
        extra = int("bias_k" in w) + int(w["zero_attn"])  # key columns add_bias_kv / add_zero_attn add
        roles, ambiguous = _output_roles(op, E, H, kdim, batch_first, extra)
        if ambiguous:
            warnings.warn(
                f"{op.where}: the declared shapes {[o.shape_str() for o in op.outputs]} do not tell the "
                f"attention output from the attention weights (key length == embed_dim); taken in torch's "
                f"order {list(roles)}. pnnx lists them in the order the model first uses them: read the "
                "output first, or export with a key length other than embed_dim.", stacklevel=2)
        weights_rank = None
        if "weights" in roles and op.outputs[roles.index("weights")].shape is not None:
            weights_rank = len(op.outputs[roles.index("weights")].shape)
        layer = cls(ctx, where=op.where, embed_dim=E, num_heads=H, kdim=kdim, vdim=vdim,
                    batch_first=batch_first, w=w, n_outputs=len(op.outputs), weights_rank=weights_rank)
        layer.mask_hints = _mask_hints(op, E, batch_first)
        layer.query_hint = _query_hint(op, E)
        layer.not_data = tuple(i for i, o in enumerate(op.inputs)
                               if o.shape is not None and len(o.shape) > 0 and o.shape[-1] is None)
        layer.learned = {}  # input position -> mask role seen at a call whose shapes told it
        layer.roles = roles
        return layer

    # -- input recognition ---------------------------------------------------------------

    def _split_inputs(self, inputs: tuple) -> tuple[list[Any], Any, Any]:
        """(data inputs [q, (k, (v))], attn_mask or None, key_padding_mask or None)."""
        xp = self.xp
        bools = [a for a in inputs if a.dtype == xp.bool]
        floats = [a for a in inputs if a.dtype != xp.bool]
        if not floats:
            raise ShapeError(f"{self.where}: no query input among {len(inputs)} inputs")
        # the query: pnnx lists it first among float inputs, except that a float mask held in a
        # pnnx.Attribute (a registered buffer) can come before it. So the first float input when
        # it is shaped like a query (2-D or 3-D, last axis embed_dim: an unbatched query stays
        # the query beside a 3-D mask whose last axis happens to be embed_dim), else the first
        # that is (3-D, then 2-D), what precedes it counted among the masks. (Not "a
        # pnnx.Attribute is never the query": DETR's learned queries are one.)
        qi = 0
        hinted = getattr(self, "query_hint", None)
        if hinted is not None and hinted < len(inputs) and inputs[hinted].dtype != xp.bool:
            qi = next(i for i, a in enumerate(floats) if a is inputs[hinted])
        elif not (floats[0].ndim in (2, 3) and floats[0].shape[-1] == self.E):
            qi = next((i for rank in (3, 2) for i, a in enumerate(floats)
                       if a.ndim == rank and a.shape[-1] == self.E), 0)
        elif floats[0].ndim == 2:
            # a 2-D first input is an unbatched query only if every 3-D one beside it could be
            # a per-head (H, L, S) mask; else it is an (L, S) mask (S == embed_dim) held in a
            # buffer, listed before the batched query
            threes = [i for i, a in enumerate(floats) if a.ndim == 3 and a.shape[-1] == self.E]
            if threes and not all(floats[i].shape[0] == self.H and floats[i].shape[1] == floats[0].shape[0]
                                  for i in threes):
                qi = threes[0]
        q = floats[qi]
        if q.ndim not in (2, 3):
            raise ShapeError(f"{self.where}: query must be 2-D or 3-D, found shape {tuple(q.shape)}")
        batched = q.ndim == 3
        bdim = (0 if self.batch_first else 1) if batched else None
        data = [q]
        rest = floats[qi + 1:]
        masks_only = getattr(self, "not_data", ())
        while rest and len(data) < 3:
            a = rest[0]
            feat_ok = a.shape[-1] == (self.kdim if len(data) == 1 else self.vdim)
            same_batch = bdim is None or a.shape[bdim] == q.shape[bdim]
            # (an input declared with a dynamic last axis is a mask: a key's or value's is kdim/vdim)
            if a.ndim == q.ndim and feat_ok and same_batch and not any(a is inputs[i] for i in masks_only):
                data.append(rest.pop(0))
            else:
                break
        rest = floats[:qi] + rest
        k = data[1] if len(data) > 1 else q
        if batched:
            n = q.shape[bdim]
            seq = 1 if self.batch_first else 0
            L, S = q.shape[seq], k.shape[seq]
        else:
            n, L, S = None, q.shape[0], k.shape[0]
        # roles from shapes: 'kpm', 'attn', or None (ambiguous)
        def role(m: Any) -> str | None:
            if batched:
                is_kpm = tuple(m.shape) == (n, S)
                is_attn = tuple(m.shape) in ((L, S), (n * self.H, L, S))
            else:
                is_kpm = tuple(m.shape) == (S,)
                is_attn = tuple(m.shape) in ((L, S), (self.H, L, S))
            if is_kpm and not is_attn:
                return "kpm"
            if is_attn and not is_kpm:
                return "attn"
            if not (is_kpm or is_attn):
                raise ShapeError(f"{self.where}: input of shape {tuple(m.shape)} is neither a key_padding_mask "
                                 f"{(n, S) if batched else (S,)} nor an attn_mask {(L, S)}")
            return None

        # pnnx's order: bool masks kpm-then-attn, float masks attn-then-kpm
        masks = [(m, role(m), ("kpm", "attn")[j] if len(bools) == 2 else None) for j, m in enumerate(bools)]
        masks += [(m, role(m), ("attn", "kpm")[j] if len(rest) == 2 else None) for j, m in enumerate(rest)]
        if len(masks) > 2:
            raise ShapeError(f"{self.where}: {len(inputs)} inputs: could not tell query/key/value from masks")
        if len(masks) == 2 and len(bools) == 1:  # one bool, one float: bool first in pnnx's order
            masks = [(m, r, ("kpm", "attn")[j]) for j, (m, r, _) in enumerate(masks)]
        attn = kpm = None
        decided = [r for _, r, _ in masks if r is not None]
        hints = getattr(self, "mask_hints", None) or {}
        learned = getattr(self, "learned", None)
        for m, r, by_order in masks:
            pos = next((i for i, a in enumerate(inputs) if a is m), -1)
            if r is not None and learned is not None and len(masks) == 1:
                learned[pos] = r  # a mask's role is fixed for the graph: kept for calls that cannot tell
            if r is None:
                hint = hints.get(pos) or (learned.get(pos) if learned and len(masks) == 1 else None)
                if hint is not None:
                    r = hint
                elif len(masks) == 2 and len(decided) == 1:
                    r = "attn" if decided[0] == "kpm" else "kpm"
                else:
                    r = by_order
                    if r is None:
                        r = "attn"
                        if not self._warned_ambiguous:
                            self._warned_ambiguous = True
                            warnings.warn(
                                f"{self.where}: the lone mask of shape {tuple(m.shape)} may be a key_padding_mask "
                                f"(N, S) or an attn_mask (L, S) (batch == query length, and pnnx writes both "
                                "the same way): taken as attn_mask. Export with a dynamic batch (pnnx's "
                                "inputs2=) or a batch other than the query length to have it read right.",
                                stacklevel=2)
            if r == "attn":
                if attn is not None:
                    raise ShapeError(f"{self.where}: two attn_mask-shaped inputs")
                attn = m
            else:
                if kpm is not None:
                    raise ShapeError(f"{self.where}: two key_padding_mask-shaped inputs")
                kpm = m
        return data, attn, kpm

    # -- compute -------------------------------------------------------------------------

    def forward(self, *inputs: Any) -> Any:
        xp, w = self.xp, self.w
        data, attn_mask, kpm = self._split_inputs(inputs)
        q_in = data[0]
        batched = q_in.ndim == 3
        if batched and not self.batch_first:
            data = [xp.permute_dims(a, (1, 0, 2)) for a in data]
        elif not batched:
            data = [a[None, ...] for a in data]
            if kpm is not None:
                kpm = kpm[None, ...]
        N, L = data[0].shape[0], data[0].shape[1]
        E, H, D = self.E, self.H, self.D
        dt = data[0].dtype

        def proj(x: Any, wt: str, b: str) -> Any:
            # one 2-D GEMM over all N*L rows (a stacked 3-D @ 2-D matmul runs N small ones,
            # measured 1.5x slower on NumPy for ViT-B shapes); the bias goes in place
            wm = w[wt]
            n, ln = x.shape[0], x.shape[1]
            y = self.matmul(xp.reshape(x, (n * ln, x.shape[2])), wm)
            if w.get(b) is not None:
                y += w[b]
            return xp.reshape(y, (n, ln, wm.shape[1]))

        if len(data) == 1 and "qkv_t" in w:
            qkv = proj(data[0], "qkv_t", "qkv_b")
            q, k, v = qkv[..., :E], qkv[..., E:2 * E], qkv[..., 2 * E:]
        else:
            xq = data[0]
            xk = data[1] if len(data) > 1 else xq
            xv = data[2] if len(data) > 2 else xk
            if xv.shape[-1] != self.vdim:
                # two inputs: pnnx writes mha(q, k, q) as mha(q, k, k); where kdim != vdim the
                # features tell (the same call with kdim == vdim cannot be told apart)
                if len(data) == 2 and xq.shape[-1] == self.vdim:
                    xv = xq
                else:
                    raise ShapeError(f"{self.where}: no input has the value's {self.vdim} features (vdim); "
                                     f"inputs {[tuple(a.shape) for a in inputs]}")
            q = proj(xq, "q_t", "q_b")
            k = proj(xk, "k_t", "k_b")
            v = proj(xv, "v_t", "v_b")
        if q.shape[-1] != E or k.shape[-1] != E:
            raise ShapeError(f"{self.where}: projected query/key have {q.shape[-1]}/{k.shape[-1]} features, expected {E}")

        # masks -> one additive float mask broadcastable to (N, H, L, S)
        mask = None
        if attn_mask is not None:
            am = additive_mask(xp, attn_mask, dt, self.device, true_means_keep=False)
            if am.ndim == 3:
                am = xp.reshape(am, (N, H) + tuple(am.shape[1:]))
            mask = am
        if kpm is not None:
            km = additive_mask(xp, kpm, dt, self.device, true_means_keep=False)
            km = xp.reshape(km, (N, 1, 1, km.shape[-1]))
            mask = km if mask is None else mask + km

        def pad_mask(m: Any) -> Any:
            if m is None:
                return None
            shape = tuple(m.shape[:-1]) + (1,)
            return xp.concat([m, xp.zeros(shape, dtype=m.dtype, device=self.device)], axis=-1)

        if "bias_k" in w:
            k = xp.concat([k, xp.broadcast_to(w["bias_k"], (N, 1, E))], axis=1)
            v = xp.concat([v, xp.broadcast_to(w["bias_v"], (N, 1, E))], axis=1)
            mask = pad_mask(mask)

        def heads(t: Any) -> Any:
            return xp.permute_dims(xp.reshape(t, (N, t.shape[1], H, D)), (0, 2, 1, 3))

        q, k, v = heads(q), heads(k), heads(v)
        if w["zero_attn"]:
            z = xp.zeros((N, H, 1, D), dtype=dt, device=self.device)
            k, v = xp.concat([k, z], axis=2), xp.concat([v, z], axis=2)
            mask = pad_mask(mask)

        fast = self._attention if self.roles == ("out",) else None  # weights wanted: the generic steps
        out, p = attend(xp, q, k, v, self.scale, mask, self.matmul, fast, self._softmax)
        out = xp.reshape(xp.permute_dims(out, (0, 2, 1, 3)), (N, L, E))
        out = proj(out, "o_t", "o_b")
        if batched and not self.batch_first:
            out = xp.permute_dims(out, (1, 0, 2))
        elif not batched:
            out = out[0, ...]
        if self.roles == ("out",):
            return out
        per_head = self.weights_rank is not None and self.weights_rank == q_in.ndim + 1
        weights = p if per_head else xp.mean(p, axis=1)
        if not batched:
            weights = weights[0, ...]
        got = {"out": out, "weights": weights}
        return got[self.roles[0]] if len(self.roles) == 1 else tuple(got[r] for r in self.roles)


def _output_roles(op: Any, E: int, H: int, kdim: int, batch_first: bool,
                  extra: int = 0) -> tuple[tuple[str, ...], bool]:
    """The roles of a MultiheadAttention's outputs in the file's order, and whether the
    declared shapes left that open: pnnx lists the outputs in the order the model first uses
    them, so the attention weights come first (or alone) when the model reads them first (or
    only them). Told apart by the declared shapes against the query's (and key's): attn_output
    ``(N, L, E)`` / ``(L, N, E)`` / ``(L, E)``, the weights ``(N, L, S)`` / ``(L, S)`` or per head
    ``(N, H, L, S)`` / ``(H, L, S)`` (``?`` fits any size; S counts the ``extra`` key columns of
    add_bias_kv / add_zero_attn). Torch's order where several fit."""
    n_out = len(op.outputs)
    default = ("out", "weights")[:n_out]
    shapes = [o.shape for o in op.outputs]
    ins = [sh for sh in (i.shape for i in op.inputs if i.dtype != "bool") if sh is not None]  # (masks: not queries)
    queries = [sh for sh in ins if len(sh) in (2, 3) and sh[-1] == E]
    if any(sh is None or len(sh) == 0 for sh in shapes) or not queries:
        return default, False
    hinted = _query_hint(op, E)
    q = queries[0] if hinted is None else op.inputs[hinted].shape
    keys = [sh for sh in ins if len(sh) == len(q) and sh[-1] == kdim and sh is not q]
    k = keys[0] if keys and (kdim != E or len(queries) > 1) else q
    if len(q) == 3:
        n, L = (q[0], q[1]) if batch_first else (q[1], q[0])
        S = k[1] if batch_first else k[0]
        S = None if S is None else S + extra
        want = {"out": [(n, L, E) if batch_first else (L, n, E)], "weights": [(n, L, S), (n, H, L, S)]}
    else:
        L, S = q[0], (None if k[0] is None else k[0] + extra)
        want = {"out": [(L, E)], "weights": [(L, S), (H, L, S)]}

    def fits(sh: tuple, role: str) -> bool:
        if role == "out" and sh[-1] != E:  # (embed_dim is fixed: never '?' in the output's shape)
            return False
        if role == "weights" and S is None and sh[-1] is not None:
            return False  # (a key length that differed between the examples is '?' in the weights too)
        return any(len(sh) == len(w) and all(a is None or b is None or a == b for a, b in zip(sh, w))
                   for w in want[role])

    orders = [o for o in itertools.permutations(("out", "weights"), n_out)
              if all(fits(sh, r) for sh, r in zip(shapes, o))]
    if not orders:
        return default, False
    return orders[0], len(orders) > 1


def _query_hint(op: Any, E: int) -> int | None:
    """The position of the query where the declared shapes settle what the arrays at a call
    may not: a fully static 2-D input shaped (L, E) listed before a 3-D one with a dynamic size
    is a mask held in a buffer, not an unbatched query (whose masks would share its sizes)."""
    shapes = [o.shape if o.dtype != "bool" else None for o in op.inputs]
    first = next((i for i, sh in enumerate(shapes) if sh is not None and len(sh) in (2, 3) and sh[-1] == E), None)
    if first is None or len(shapes[first]) != 2 or None in shapes[first]:
        return None
    return next((i for i, sh in enumerate(shapes) if sh is not None and len(sh) == 3 and sh[-1] == E
                 and None in sh), None)


def _mask_hints(op: Any, E: int, batch_first: bool) -> dict[int, str]:
    """Input position -> ``"kpm"`` / ``"attn"`` for each 2-D input beside a 3-D query whose
    declared first dimension tells which it is: the batch's (``?`` in a dynamic export) and not
    the query length's, or the other way round. Used where the arrays' shapes at a call do not
    tell (batch == query length), instead of pnnx's usual order, which a mask held in a buffer
    breaks (it is listed first)."""
    shapes = [o.shape for o in op.inputs]
    q = next((sh for o, sh in zip(op.inputs, shapes) if sh is not None and len(sh) == 3 and sh[-1] == E
              and o.dtype != "bool"), None)
    if q is None:
        return {}
    n, length = (q[0], q[1]) if batch_first else (q[1], q[0])
    hints = {}
    for i, sh in enumerate(shapes):
        if sh is None or len(sh) != 2:
            continue
        if sh[0] == n and sh[0] != length:
            hints[i] = "kpm"
        elif sh[0] == length and sh[0] != n:
            hints[i] = "attn"
    return hints


@register("F.scaled_dot_product_attention")
class ScaledDotProductAttention(Layer):
    """softmax(q k^T * scale + mask) v with an optional attn_mask input (bool: True takes part;
    float: added), ``is_causal`` (top-left aligned lower triangle, cached per (L, S)), ``scale``
    (default 1/sqrt(E)) and ``enable_gqa`` (key/value heads repeated to the query's)."""

    def __init__(self, ctx: BuildContext, pos: dict[str, int], causal: bool, scale: float | None, gqa: bool, where: str):
        super().__init__(ctx)
        self.pos, self.causal, self.scale, self.gqa, self.where = pos, causal, scale, gqa, where
        self._attention = getattr(ctx.fast, "attention", None)
        self._softmax = getattr(ctx.fast, "softmax_last", None)
        self._causal: dict[tuple[int, int, str], Any] = {}

    @classmethod
    def from_operator(cls, op, ctx):
        pos = input_slots(op, ("query", "key", "value", "attn_mask"))
        if not {"query", "key", "value"} <= set(pos):
            raise LayerParameterError(f"{op.where}: needs query, key and value inputs")
        if "is_causal" in op.params and op.params["is_causal"] is None:
            raise LayerParameterError(f"{op.where}: is_causal=None; it should be True or False")
        causal = op.param("is_causal", bool, default=False)
        if causal and "attn_mask" in pos:
            raise LayerParameterError(f"{op.where}: is_causal=True with an attn_mask (torch rejects this too)")
        return cls(ctx, pos, causal, op.param("scale", float, default=None),
                   op.param("enable_gqa", bool, default=False), op.where)

    def _causal_mask(self, L: int, S: int, dtype: Any) -> Any:
        key = (L, S, str(dtype))
        m = self._causal.get(key)
        if m is None:
            xp = self.xp
            keep = xp.tril(xp.ones((L, S), dtype=xp.bool, device=self.device))
            m = additive_mask(xp, keep, dtype, self.device, true_means_keep=True)
            self._causal[key] = m
        return m

    def forward(self, *inputs: Any) -> Any:
        xp = self.xp
        q, k, v = inputs[self.pos["query"]], inputs[self.pos["key"]], inputs[self.pos["value"]]
        if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
            raise ShapeError(f"{self.where}: query/key/value must be at least 2-D")
        if self.gqa and q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
            hq, hk = q.shape[-3], k.shape[-3]
            if hq % hk or v.shape[-3] != hk:
                raise ShapeError(f"{self.where}: enable_gqa needs query heads ({hq}) divisible by key/value heads ({hk})")
            k, v = xp.repeat(k, hq // hk, axis=k.ndim - 3), xp.repeat(v, hq // hk, axis=v.ndim - 3)
        scale = self.scale if self.scale is not None else 1.0 / math.sqrt(q.shape[-1])
        mask = None
        if self.causal:
            mask = self._causal_mask(q.shape[-2], k.shape[-2], q.dtype)
        elif "attn_mask" in self.pos:
            mask = additive_mask(xp, inputs[self.pos["attn_mask"]], q.dtype, self.device, true_means_keep=True)
        out, _ = attend(xp, q, k, v, scale, mask, self.matmul, self._attention, self._softmax)
        if mask is not None and not self.causal:
            # torch's SDPA gives zeros, not NaN, for a query whose mask keeps no key (the padded
            # rows of a left-padded batch); nn.MultiheadAttention keeps its NaN
            dead = xp.all(mask == -math.inf, axis=-1, keepdims=True)
            out = xp.where(dead, xp.zeros((), dtype=out.dtype, device=self.device), out)
        return out


# ---------------------------------------------------------------------------------------------
# matrix products


class _Product(Layer):
    KEYS: tuple[str, ...] = ()

    def __init__(self, ctx: BuildContext, pos: dict[str, int], alpha: float, beta: float, where: str):
        super().__init__(ctx)
        self.pos, self.alpha, self.beta, self.where = pos, alpha, beta, where

    @classmethod
    def from_operator(cls, op, ctx):
        pos = input_slots(op, cls.KEYS)
        missing = [k for k in cls.KEYS if k not in pos]
        if missing:
            raise LayerParameterError(f"{op.where}: missing input(s) {missing}")
        return cls(ctx, pos, op.param("alpha", float, default=1.0), op.param("beta", float, default=1.0), op.where)

    def _mm(self, a: Any, b: Any) -> Any:
        a, b = promote(self.xp, a, b)
        return self.matmul(a, b)


@register("torch.matmul")
class MatMul(_Product):
    """``torch.matmul`` (1-D, 2-D and batched operands, broadcasting)."""

    KEYS = ("input", "other")

    def forward(self, *inputs: Any) -> Any:
        return self._mm(inputs[self.pos["input"]], inputs[self.pos["other"]])


@register("torch.mm", "torch.bmm")
class BatchMatMul(_Product):
    """``torch.mm`` (2-D) and ``torch.bmm`` (3-D, no broadcasting)."""

    KEYS = ("input", "mat2")

    def forward(self, *inputs: Any) -> Any:
        a, b = inputs[self.pos["input"]], inputs[self.pos["mat2"]]
        if a.ndim != b.ndim or a.ndim not in (2, 3) or a.shape[-1] != b.shape[-2] or \
                (a.ndim == 3 and a.shape[0] != b.shape[0]):
            raise ShapeError(f"{self.where}: cannot multiply shapes {tuple(a.shape)} and {tuple(b.shape)}")
        return self._mm(a, b)


class _AddProduct(_Product):
    def _add(self, c: Any, ab: Any) -> Any:
        """``beta * c + alpha * ab``; ``ab`` is the product just made (a fresh array), so a bias
        of its dtype that broadcasts to it is added in place (GPT-2's ``Conv1D`` is an addmm)."""
        if self.alpha != 1.0:
            ab = ab * self.alpha
        if self.beta == 0.0:  # torch ignores input (even NaN) when beta is 0
            return ab
        if (self.beta == 1.0 and getattr(c, "dtype", None) == ab.dtype and c.ndim <= ab.ndim
                and all(d in (1, e) for d, e in zip(reversed(c.shape), reversed(ab.shape)))):
            ab += c
            return ab
        c, ab = promote(self.xp, c, ab)
        return ab + (c * self.beta if self.beta != 1.0 else c)


@register("torch.addmm")
class AddMM(_AddProduct):
    """beta * input + alpha * (mat1 @ mat2)."""

    KEYS = ("input", "mat1", "mat2")

    def forward(self, *inputs: Any) -> Any:
        return self._add(inputs[self.pos["input"]], self._mm(inputs[self.pos["mat1"]], inputs[self.pos["mat2"]]))


@register("torch.baddbmm")
class BAddBMM(_AddProduct):
    """beta * input + alpha * (batch1 @ batch2)."""

    KEYS = ("input", "batch1", "batch2")

    def forward(self, *inputs: Any) -> Any:
        return self._add(inputs[self.pos["input"]], self._mm(inputs[self.pos["batch1"]], inputs[self.pos["batch2"]]))


def _parse_einsum(eq: str, ndims: list[int], where: str) -> tuple[list[str], str]:
    """Terms with '...' replaced by fresh upper-case letters, and the output term (an index
    repeated within one term, a diagonal, stays repeated: see :func:`_einsum_diagonal`)."""
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ndims):
        raise LayerParameterError(f"{where}: equation {eq!r} has {len(terms)} operands, the op has {len(ndims)} inputs")
    fresh = iter("ZYXWVUTSRQPONMLKJIHGFEDCBA")
    ell_len = 0
    for t, nd in zip(terms, ndims):
        if "..." in t:
            ell_len = max(ell_len, nd - (len(t) - 3))
    ell = "".join(next(fresh) for _ in range(ell_len))
    out_terms = []
    for t, nd in zip(terms, ndims):
        if "..." in t:
            n = nd - (len(t) - 3)
            t = t.replace("...", ell[ell_len - n:] if n else "")
        if len(t) != nd or not t.isalpha():
            hint = (" (pnnx drops the '...' of an einsum equation and renames its letters: write the "
                    "subscripts out in the model)" if len(t) < nd and "..." not in eq else "")
            raise ShapeError(f"{where}: einsum term {t!r} does not match a {nd}-D operand{hint}")
        out_terms.append(t)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts: dict[str, int] = {}
        for t in out_terms:
            for c in t:
                counts[c] = counts.get(c, 0) + 1
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    if not out.isalpha() and out:
        raise LayerParameterError(f"{where}: bad einsum output {rhs!r}")
    seen = set("".join(out_terms))
    if len(set(out)) != len(out) or not set(out) <= seen:
        raise LayerParameterError(f"{where}: einsum output {rhs!r} repeats an index or has one no operand has "
                                  f"(equation {eq!r})")
    return out_terms, out


def _einsum_diagonal(xp: Any, a: Any, term: str, where: str) -> tuple[Any, str]:
    """Take the diagonal over each index that ``term`` repeats (``ii`` -> ``i``): the repeated
    axes go last, are merged into one of n**r items, and every (1 + n + ... + n**(r-1))-th item
    is kept (the Array API has no ``diagonal``). Returns the array and its term, each index once
    (the diagonal ones at the end)."""
    for c in dict.fromkeys(term):
        axes = [j for j, t in enumerate(term) if t == c]
        if len(axes) < 2:
            continue
        n = a.shape[axes[0]]
        for j in axes[1:]:
            if a.shape[j] != n:
                raise ShapeError(f"{where}: einsum subscript {c!r} is repeated in one operand but the sizes "
                                 f"differ, {n} != {a.shape[j]}")
        rest = [j for j in range(a.ndim) if j not in axes]
        perm = tuple(rest + axes)
        if perm != tuple(range(a.ndim)):
            a = xp.permute_dims(a, perm)
        r = len(axes)
        a = xp.reshape(a, tuple(a.shape[:len(rest)]) + (n ** r,))
        a = a[..., ::sum(n ** p for p in range(r)) or 1]
        term = "".join(term[j] for j in rest) + c
    return a, term


@register("torch.einsum")
class Einsum(Layer):
    """``torch.einsum`` for any number of operands, with '...' and implicit output, contracted
    pairwise through ``matmul``; an index repeated within one operand takes its diagonal first
    (``ii->i``, ``ii`` the trace, ``bjj->bj``)."""

    def __init__(self, ctx: BuildContext, equation: str, where: str):
        super().__init__(ctx)
        self.equation, self.where = equation, where
        self._plans: dict[Any, Any] = {}  # by operand shapes and dtypes (see _plan)

    @classmethod
    def from_operator(cls, op, ctx):
        eq = op.param("equation", str)
        if not isinstance(eq, str) or not eq.strip():
            raise LayerParameterError(f"{op.where}: parameter 'equation' should be an einsum equation, found {eq!r}")
        if not op.inputs:
            raise LayerParameterError(f"{op.where}: einsum needs at least one input")
        return cls(ctx, eq, op.where)

    def forward(self, *ops: Any) -> Any:
        key = tuple((a.shape, a.dtype) for a in ops)  # (dtype objects hash; their names cost ~2 us each)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(ops)
            if len(self._plans) >= 32:
                self._plans.clear()
            self._plans[key] = plan
        if plan is _DIAGONAL:
            return self._forward_diagonal(ops)
        return self._run(plan, ops)

    def _run(self, plan: tuple, ops: Any) -> Any:
        xp = self.xp
        dt, pre, pairs, final_drop, final = plan
        arrs = list(ops) if dt is None else [a if a.dtype == dt else xp.astype(a, dt) for a in ops]
        for i, axes in pre:
            arrs[i] = xp.sum(arrs[i], axis=axes)
        a = arrs[0]
        for i, (arr_a, arr_b, shape_a, shape_b, contract, shape_out) in enumerate(pairs, start=1):
            a2 = xp.reshape(_apply_arrange(xp, a, arr_a), shape_a)
            b2 = xp.reshape(_apply_arrange(xp, arrs[i], arr_b), shape_b)
            # nothing contracted (an outer product per batch item, 'bnhd,bnhe->bnhde'): a
            # broadcast multiply, not a stack of rank-1 products (1.4 against 0.3 ms for
            # 1024 items of 32x32 here)
            a = xp.reshape(self.matmul(a2, b2) if contract else a2 * b2, shape_out)
        if final_drop:
            a = xp.sum(a, axis=final_drop)
        return _apply_arrange(xp, a, final)

    def _plan(self, ops: Any, parsed: tuple[list[str], str] | None = None) -> Any:
        """What :meth:`forward` does for operands of these shapes and dtypes, worked out once
        (parsing, sizes, the pairwise contraction order, each permutation and reshape: ~35 us
        of a small einsum's ~40): ``(dtype, pre-sums, pairs, final sum axes, final arrangement)``,
        or _DIAGONAL for an equation with a repeated index within a term (not planned)."""
        xp = self.xp
        terms, out = parsed or _parse_einsum(self.equation, [a.ndim for a in ops], self.where)
        if any(len(set(t)) != len(t) for t in terms):
            return _DIAGONAL
        sizes: dict[str, int] = {}
        for t, a in zip(terms, ops):
            for c, s in zip(t, a.shape):
                if sizes.get(c, 1) != 1 and s != 1 and sizes[c] != s:
                    raise ShapeError(f"{self.where}: index {c!r} has sizes {sizes[c]} and {s}")
                if s != 1 or c not in sizes:  # (a size 1 broadcasts; 0 is a size too, an empty one)
                    sizes[c] = s
        dt = None
        if len(ops) > 1:
            dt = ops[0].dtype
            for a in ops[1:]:
                _, probe = promote(xp, xp.zeros((), dtype=dt, device=self.device), a)
                dt = probe.dtype
        shapes = [tuple(a.shape) for a in ops]
        terms_live = list(terms)

        def needed(skip: int) -> set[str]:
            s = set(out)
            for j, t in enumerate(terms_live):
                if j != skip:
                    s |= set(t)
            return s
        pre = []
        # sum out indices that only one operand has and the output does not
        for i in range(len(ops)):
            keep = needed(i)
            drop = tuple(a for a, c in enumerate(terms_live[i]) if c not in keep)
            if drop:
                pre.append((i, drop))
                shapes[i] = tuple(s for a, s in enumerate(shapes[i]) if a not in drop)
                terms_live[i] = "".join(c for c in terms_live[i] if c in keep)
        pairs = []
        shape, ta = shapes[0], terms_live[0]
        for i in range(1, len(ops)):
            tb = terms_live[i]
            later = set(out)
            for t in terms_live[i + 1:]:
                later |= set(t)
            batch = [c for c in ta if c in tb and c in later]
            contract = [c for c in ta if c in tb and c not in later]
            a_only = [c for c in ta if c not in tb]
            b_only = [c for c in tb if c not in ta]
            nb = tuple(sizes[c] for c in batch)
            m = math.prod(sizes[c] for c in a_only)
            kk = math.prod(sizes[c] for c in contract)
            n = math.prod(sizes[c] for c in b_only)
            out_shape = nb + tuple(sizes[c_] for c_ in a_only + b_only)
            pairs.append((_arrangement(shape, ta, batch + a_only + contract, sizes),
                          _arrangement(shapes[i], tb, batch + contract + b_only, sizes),
                          nb + (m, kk), nb + (kk, n), bool(contract), out_shape))
            shape, ta = out_shape, "".join(batch + a_only + b_only)
        # final: sum anything not in the output, then permute
        final_drop = tuple(j for j, c in enumerate(ta) if c not in out)
        if final_drop:
            shape = tuple(s for j, s in enumerate(shape) if j not in final_drop)
            ta = "".join(c for c in ta if c in out)
        final = _arrangement(shape, ta, list(out), sizes) if ta != out else (None, None)
        return dt, tuple(pre), tuple(pairs), final_drop, final

    def _forward_diagonal(self, ops: tuple) -> Any:
        """An equation with an index repeated within a term: its diagonal first, then the
        contraction of what is left (planned per call: these are rare)."""
        xp = self.xp
        terms, out = _parse_einsum(self.equation, [a.ndim for a in ops], self.where)
        ops, terms = list(ops), list(terms)
        for i, t in enumerate(terms):
            if len(set(t)) != len(t):
                ops[i], terms[i] = _einsum_diagonal(xp, ops[i], t, self.where)
        return self._run(self._plan(ops, (terms, out)), ops)


_DIAGONAL = object()  # Einsum plan marker: an index repeated within a term


def _arrangement(shape: tuple[int, ...], have: str, want: list[str],
                 sizes: dict[str, int]) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """``(perm, broadcast target)`` taking an array of ``shape`` (indices ``have``) to the order
    ``want`` with size-1 axes broadcast; None where a step is not needed."""
    perm = tuple(have.index(c) for c in want)
    permuted = tuple(shape[p] for p in perm)
    target = tuple(sizes[c] for c in want)
    return (None if perm == tuple(range(len(perm))) else perm), (None if permuted == target else target)


def _apply_arrange(xp: Any, a: Any, arrangement: tuple) -> Any:
    perm, target = arrangement
    if perm is not None:
        a = xp.permute_dims(a, perm)
    if target is not None:
        a = xp.broadcast_to(a, target)
    return a


# ---------------------------------------------------------------------------------------------


@register("nn.Embedding", "F.embedding")
class Embedding(Layer):
    """Row lookup ``weight[index]`` for an integer index tensor of any shape; ``max_norm``
    rescales looked-up rows whose ``norm_type``-norm exceeds it (torch renormalises the weight
    in place, which gives the same outputs). An index out of range is a ShapeError (on a GPU
    reported when the pass ends: kuiper_xp.layers.checks)."""

    def __init__(self, ctx: BuildContext, weight: Any, pos: dict[str, int], max_norm: float | None,
                 norm_type: float, where: str):
        super().__init__(ctx)
        self.weight, self.pos, self.max_norm, self.norm_type, self.where = weight, pos, max_norm, norm_type, where
        self._fast = getattr(ctx.fast, "embedding", None) if max_norm is None else None

    @classmethod
    def from_operator(cls, op, ctx):
        pos = input_slots(op, ("input", "weight"))
        weight = None
        if "weight" not in pos:
            weight = op.weight("weight", ctx)
            if weight.ndim != 2:
                raise LayerParameterError(f"{op.where}: weight should be 2-D, found shape {tuple(weight.shape)}")
            n, d = op.param("num_embeddings", int, default=None), op.param("embedding_dim", int, default=None)
            if (n is not None and n != weight.shape[0]) or (d is not None and d != weight.shape[1]):
                raise LayerParameterError(f"{op.where}: weight shape {tuple(weight.shape)} does not match "
                                          f"num_embeddings={n} embedding_dim={d}")
        return cls(ctx, weight, pos, op.param("max_norm", float, default=None),
                   op.param("norm_type", float, default=2.0), op.where)

    def forward(self, *inputs: Any) -> Any:
        xp = self.xp
        idx = inputs[self.pos["input"]]
        weight = self.weight if self.weight is not None else inputs[self.pos["weight"]]
        if self._fast is not None:  # (None for ids it does not take, or out of range: named below)
            rows = self._fast(weight, idx)
            if rows is not None:
                return rows
        if is_float(xp, idx.dtype) or idx.dtype == xp.bool:
            raise ShapeError(f"{self.where}: embedding indices must be integers, found {idx.dtype}")
        flat = xp.reshape(idx, (-1,))
        if flat.dtype != xp.int64:
            flat = xp.astype(flat, xp.int64)
        n = weight.shape[0]  # (torch raises; take would wrap a negative id, CuPy's any id)
        flat, _ = check_range(xp, flat, 0, n, lambda bad: f"{self.where}: index "
                              f"{'' if bad is None else f'{bad} '}is out of range for an embedding "
                              f"table of {n} rows")
        rows = xp.take(weight, flat, axis=0)
        if self.max_norm is not None:
            p = self.norm_type
            a = xp.abs(rows)
            norm = xp.sqrt(xp.sum(a * a, axis=-1, keepdims=True)) if p == 2.0 else \
                xp.sum(a ** p, axis=-1, keepdims=True) ** (1.0 / p)
            scale = xp.where(norm > self.max_norm, self.max_norm / (norm + 1e-7),
                             xp.ones((), dtype=rows.dtype, device=self.device))
            rows = rows * scale
        return xp.reshape(rows, tuple(idx.shape) + (weight.shape[1],))


@register("aten::embedding")
class AtenEmbedding(Embedding):
    """``F.embedding`` as pnnx leaves it when ``padding_idx`` is negative: ``aten::embedding
    (weight, indices, padding_idx, scale_grad_by_freq, sparse)``; the last three only matter for
    training, so this is the row lookup of :class:`Embedding`."""

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.inputs) < 2:
            raise LayerParameterError(f"{op.where}: expected inputs (weight, indices, ...), found {len(op.inputs)}")
        return cls(ctx, None, {"weight": 0, "input": 1}, None, 2.0, op.where)


@register("aten::_transformer_encoder_layer_fwd")
class TransformerEncoderLayerFwd(Layer):
    """``nn.TransformerEncoderLayer`` as torch's fused inference path traces it (eval mode,
    batch_first, no grad: pnnx keeps ``aten::_transformer_encoder_layer_fwd``). Its 20 inputs, in
    the aten signature's order: src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
    proj_bias, use_gelu, norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
    ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask, mask_type; the weights arrive as
    ``pnnx.Attribute`` values, the numbers and flags as constant expressions.

    Computed as torch does: self-attention (softmax(q k^T / sqrt(head_dim)) v, heads merged,
    output projection), residual, LayerNorm, then linear -> GELU (exact) or ReLU -> linear,
    residual, LayerNorm (the norms first when ``norm_first``). An attention mask (a causal
    ``src_mask``, which torch merges to (N, H, L, L), mask_type 2) or a key-padding mask
    (``src_key_padding_mask`` alone, (N, L), mask_type 1) is added to the scores, -inf where a
    boolean one is True; padded positions are computed like the others, as torch's fused layer
    does on a dense tensor (a row with every key masked gives NaN there too). Only
    ``nn.TransformerEncoder``'s nested-tensor path drops them, and pnnx does not export it."""

    N_INPUTS = 20

    def __init__(self, ctx: BuildContext, where: str):
        super().__init__(ctx)
        self.where = where
        self._ctx = ctx
        self._norms: dict[tuple[int, float], Any] = {}
        self._attention = getattr(ctx.fast, "attention", None)
        self._softmax = getattr(ctx.fast, "softmax_last", None)
        from .activation import GELU, Clamp

        self._gelu, self._relu = GELU(ctx, "none"), Clamp(ctx, 0, None)
        self._fast_linear = getattr(ctx.fast, "linear", None)  # (numpy, cupy: the activation fused)

    @classmethod
    def from_operator(cls, op, ctx):
        if len(op.inputs) != cls.N_INPUTS:
            raise LayerParameterError(f"{op.where}: expected {cls.N_INPUTS} inputs (the aten signature), "
                                      f"found {len(op.inputs)}")
        return cls(ctx, op.where)

    def _norm(self, x: Any, w: Any, b: Any, eps: float) -> Any:
        key = (x.shape[-1], eps)
        ln = self._norms.get(key)
        if ln is None:  # eps arrives at run time; one LayerNorm layer per value, made once
            from .norm import LayerNorm

            ln = self._norms[key] = LayerNorm(self._ctx, None, 1, None, 2, self.where, (x.shape[-1],), eps)
        return ln.forward(x, w, b)

    def _linear(self, x: Any, w: Any, b: Any, activation: str | None = None) -> Any:
        """``x @ w^T + b``, then ``activation`` ("gelu", "relu" or None): fused by the backend's
        fast linear where it has one, else the activation layers on the result."""
        xp = self.xp
        if self._fast_linear is not None:
            return self._fast_linear(x, xp.matrix_transpose(w), b, activation)
        lead = tuple(x.shape[:-1])
        y = self.matmul(xp.reshape(x, (-1, x.shape[-1])), xp.matrix_transpose(w))
        y += b
        y = xp.reshape(y, lead + (w.shape[0],))
        if activation is None:
            return y
        return self._gelu.forward(y) if activation == "gelu" else self._relu.forward(y)

    def forward(self, *inputs: Any) -> Any:
        from .misc import to_int

        xp = self.xp
        (src, e, h, qkv_w, qkv_b, proj_w, proj_b, use_gelu, norm_first, eps,
         n1w, n1b, n2w, n2b, f1w, f1b, f2w, f2b, mask, _mask_type) = inputs
        e, h, eps = to_int(e, "embed_dim"), to_int(h, "num_heads"), to_float(eps, "eps")
        use_gelu, norm_first = bool(to_int(use_gelu, "use_gelu")), bool(to_int(norm_first, "norm_first"))
        if src.ndim != 3 or src.shape[-1] != e or e % h:
            raise ShapeError(f"{self.where}: src of shape {tuple(src.shape)} does not fit embed_dim={e}, "
                             f"num_heads={h} (expected (batch, seq, embed_dim), batch first)")
        if mask is not None:
            if _mask_type is None:
                raise ShapeError(f"{self.where}: a mask input without its mask_type")
            if to_int(_mask_type, "mask_type") == 1:  # key padding, (N, L): for every query and head
                if tuple(mask.shape) != tuple(src.shape[:2]):
                    raise ShapeError(f"{self.where}: key-padding mask of shape {tuple(mask.shape)} does not "
                                     f"fit (batch, seq) = {tuple(src.shape[:2])}")
                mask = xp.reshape(mask, (src.shape[0], 1, 1, src.shape[1]))
            # an attention mask (mask_type 0: (L, L); 2: merged, (N, H, L, L)): added to the
            # scores when float, -inf where True when bool
            if mask.dtype == xp.bool:
                mask = xp.where(mask, xp.asarray(-math.inf, dtype=src.dtype, device=self.device),
                                xp.asarray(0.0, dtype=src.dtype, device=self.device))
            full = (src.shape[0], h, src.shape[1], src.shape[1])
            if mask.ndim > 4 or any(a not in (1, b) for a, b in zip(mask.shape[::-1], full[::-1])):
                raise ShapeError(f"{self.where}: attention mask of shape {tuple(mask.shape)} does not fit "
                                 f"(batch, heads, seq, seq) = {full}")
        if tuple(qkv_w.shape) != (3 * e, e) or tuple(proj_w.shape) != (e, e):
            raise ShapeError(f"{self.where}: qkv_weight {tuple(qkv_w.shape)} / proj_weight "
                             f"{tuple(proj_w.shape)} do not fit embed_dim={e}")
        n, length, d = src.shape[0], src.shape[1], e // h
        x = self._norm(src, n1w, n1b, eps) if norm_first else src
        qkv = self._linear(x, qkv_w, qkv_b)

        def heads(t: Any) -> Any:
            return xp.permute_dims(xp.reshape(t, (n, length, h, d)), (0, 2, 1, 3))

        q, k, v = heads(qkv[..., :e]), heads(qkv[..., e:2 * e]), heads(qkv[..., 2 * e:])
        out, _ = attend(xp, q, k, v, 1.0 / math.sqrt(d), mask, self.matmul, self._attention, self._softmax)
        out = xp.reshape(xp.permute_dims(out, (0, 2, 1, 3)), (n, length, e))
        x = self._linear(out, proj_w, proj_b) + src
        if not norm_first:
            x = self._norm(x, n1w, n1b, eps)
        y = self._norm(x, n2w, n2b, eps) if norm_first else x
        y = self._linear(y, f1w, f1b, "gelu" if use_gelu else "relu")
        y = self._linear(y, f2w, f2b) + x
        return y if norm_first else self._norm(y, n2w, n2b, eps)


# ---------------------------------------------------------------------------------------------
# explicit attention written as operators (timm's ViT, hand-written BERT-style blocks)


def einsum_attention_form(equation: str, second: bool) -> str | None:
    """How an einsum reads as one product of an attention chain: a plain matrix product
    ``'...ic,...cj->...ij'`` ("kt": ``q @ kt`` for the scores, ``p @ v`` after the softmax), or
    for the scores ``'...ic,...jc->...ij'`` ("k": q with the keys themselves, LDM's
    ``'b i d, b j d -> b i j'``). The same batch letters lead each term; None for anything else."""
    eq = equation.replace(" ", "")
    if eq.count("->") != 1 or "." in eq:
        return None
    lhs, out = eq.split("->")
    terms = lhs.split(",")
    n = len(out) - 2
    if len(terms) != 2 or n < 1 or any(len(t) != n + 2 or t[:n] != out[:n] for t in terms):
        return None
    (ai, ac), (b0, b1), (i, j) = terms[0][n:], terms[1][n:], out[n:]
    if len(set(out[:n])) != n or len(set(out[:n]) | {i, j, ac}) != n + 3 or ai != i:
        return None
    if (b0, b1) == (ac, j):
        return "kt"
    return "k" if (b0, b1) == (j, ac) and not second else None


def score_transform(tree: Any, scores: int) -> tuple[float, int | None] | None:
    """What a ``pnnx.Expression`` between ``q @ k^T`` and the softmax does to the scores (input
    ``@scores``): ``(scale, mask input or None)`` for ``@s``, ``mul(@s, c)`` / ``mul(c, @s)`` /
    ``div(@s, c)`` (nested), optionally inside an outermost ``add(.., @j)`` / ``add(@j, ..)`` of
    another input (an additive mask, added after the scaling); None for anything else."""

    def scaled(node: Any) -> float | None:
        if node.kind == "input":
            return 1.0 if node.value == scores else None
        if node.kind != "call" or node.value not in ("mul", "div") or len(node.args) != 2:
            return None
        a, b = node.args
        consts = [n for n in (a, b) if n.kind == "const" and type(n.value) in (int, float)]
        if len(consts) != 1:
            return None
        c = float(consts[0].value)
        inner = scaled(b if consts[0] is a else a)
        if inner is None or not math.isfinite(c):
            return None
        if node.value == "mul":
            return inner * c
        return inner / c if consts[0] is b and c != 0.0 else None  # (c / @s is no scaling)

    s = scaled(tree)
    if s is not None:
        return s, None
    if tree.kind == "call" and tree.value == "add" and len(tree.args) == 2:
        for x, m in (tree.args, tree.args[::-1]):
            s = scaled(x)
            if s is not None and m.kind == "input" and m.value != scores:
                return s, m.value
    return None


class FusedAttention(Layer):
    """The runtime's stand-in for ``matmul(q, kt) -> [scale / mask expression] -> softmax(-1) ->
    matmul(., v)`` written as separate operators: the backend's fast attention (scores computed
    a block of heads at a time and soft-maxed while in cache, never stored whole) where it takes
    the operands, else the original layers one after the other (the reference). Its inputs are
    ``(q, kt, v)`` and the mask, if any; ``steps`` lists each original layer with where its
    arguments come from (an input index, or None for the previous step's result)."""

    def __init__(self, ctx: BuildContext, steps: list[tuple[Layer, list[int | None]]], scale: float,
                 has_mask: bool, names: tuple[str, ...], replace: tuple | None = None,
                 keys_given: bool = False, transposed: bool = False):
        super().__init__(ctx)
        self.steps, self.scale, self.has_mask, self.names = steps, scale, has_mask, names
        #: the second input is k itself (an einsum's ``'bid,bjd->bij'``), not k transposed
        self.keys_given = keys_given
        #: the chain ends in ``v @ p^T`` (v given as (..., Dv, S)): the result is transposed
        self.transposed = transposed
        #: a ``torch.where`` / ``masked_fill`` step before the softmax: (condition input, fill
        #: input or None, fill constant, True when the scores are replaced where the condition
        #: holds (masked_fill, where(c, fill, w)), False where it does not (where(c, w, fill)))
        self.replace = replace
        self._attention = getattr(ctx.fast, "attention", None)

    def _fast(self, q: Any, kt: Any, v: Any, mask: Any, inputs: tuple) -> Any:
        if self._attention is None or q.ndim < 3 or kt.ndim != q.ndim or v.ndim != q.ndim:
            return None
        drop, fill = None, 0.0
        if self.replace is not None:
            cond_at, fill_at, fill, when_true = self.replace
            cond = inputs[cond_at]
            if fill_at is not None:
                if getattr(inputs[fill_at], "ndim", 0) > q.ndim:  # (it would broadcast the result up)
                    return None
                try:
                    fill = to_float(inputs[fill_at])
                except ShapeError:  # not one number: the original layers say so
                    return None
            if not hasattr(cond, "dtype") or cond.dtype != self.xp.bool:
                return None
            drop = cond if when_true else self.xp.logical_not(cond)
        xp = self.xp
        k = kt if self.keys_given else xp.matrix_transpose(kt)
        if self.transposed:  # (v as (..., Dv, S); the result (..., Dv, L))
            out = self._attention(q, k, xp.matrix_transpose(v), self.scale, mask, drop, fill)
            return None if out is None else xp.matrix_transpose(out)
        return self._attention(q, k, v, self.scale, mask, drop, fill)

    def forward(self, *inputs: Any) -> Any:
        out = self._fast(inputs[0], inputs[1], inputs[2], inputs[3] if self.has_mask else None, inputs)
        if out is not None:
            return out
        prev = None
        for layer, sources in self.steps:
            try:
                prev = layer.forward(*(prev if k is None else inputs[k] for k in sources))
            except Exception as exc:
                exc.add_note(f"in {layer.op_type} {layer.op_name!r}, one step of the attention "
                             f"chain {' -> '.join(self.names)} run as one")
                raise
        return prev
