"""Array-API kernels for the convolution, pooling and linear layers.

Everything here takes arrays of any Array API namespace ``xp`` (passed keyword-only) and uses only
standard functions: slicing, ``stack``, ``reshape``, ``matmul``, ``take``, ``maximum``. These are
the reference implementations; ``backends/numpy_fast.py`` holds faster NumPy-only versions that
the layers prefer when ``ctx.fast`` provides them, and the tests compare the two.

Layouts are PyTorch's: activations ``(N, C, H, W)`` (1-D layers are run as 2-D with ``H = 1``),
convolution weights ``(O, C/groups, kh, kw)``, transposed-convolution weights
``(C, O/groups, kh, kw)``. Paddings are ``((top, bottom), (left, right))`` pairs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kuiper_xp.errors import ShapeError
from kuiper_xp.limits import check_elements

Pads = tuple[tuple[int, int], ...]

PAD_MODES = ("zeros", "reflect", "replicate", "circular")


# -- sizes -------------------------------------------------------------------------------------
def conv_out_size(size: int, k: int, s: int, d: int, pad: tuple[int, int]) -> int:
    """Output length of a convolution along one axis (floor division, as torch)."""
    return (size + pad[0] + pad[1] - d * (k - 1) - 1) // s + 1


def conv_transpose_out_size(size: int, k: int, s: int, d: int, p: int, out_pad: int) -> int:
    return (size - 1) * s - 2 * p + d * (k - 1) + out_pad + 1


def pool_out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """torch's ``pooling_output_shape``: the last window must start inside the (left-padded)
    input when ``ceil_mode`` rounds up."""
    span = size + 2 * p - d * (k - 1) - 1
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def same_pads(kernel: Sequence[int], dilation: Sequence[int]) -> Pads:
    """torch's ``padding='same'``: total ``d*(k-1)``, the odd element on the high side."""
    out = []
    for k, d in zip(kernel, dilation):
        total = d * (k - 1)
        out.append((total // 2, total - total // 2))
    return tuple(out)


def adaptive_bounds(size: int, out: int) -> list[tuple[int, int]]:
    """torch's adaptive windows: ``[floor(i*size/out), ceil((i+1)*size/out))``."""
    check_elements(out, "adaptive pooling", "output size along one axis")
    return [((i * size) // out, -((-(i + 1) * size) // out)) for i in range(out)]


# -- padding -----------------------------------------------------------------------------------
def _pad_index(n: int, lo: int, hi: int, mode: str) -> list[int]:
    idx = []
    for i in range(-lo, n + hi):
        if 0 <= i < n:
            j = i
        elif mode == "reflect":
            j = -i if i < 0 else 2 * (n - 1) - i
        elif mode == "replicate":
            j = 0 if i < 0 else n - 1
        else:  # circular
            j = i % n
        idx.append(j)
    return idx


def check_pad(shape: Sequence[int], pads: Pads, mode: str) -> None:
    """Raise ShapeError where torch refuses a padding for this input size."""
    spatial = tuple(shape)[-len(pads):]
    for n, (lo, hi) in zip(spatial, pads):
        if mode == "reflect" and (lo >= n or hi >= n) and (lo or hi):
            raise ShapeError(f"reflect padding {(lo, hi)} must be smaller than the input size {n} "
                             f"(input shape {tuple(shape)})")
        if mode == "circular" and (lo > n or hi > n):
            raise ShapeError(f"circular padding {(lo, hi)} must not exceed the input size {n} "
                             f"(input shape {tuple(shape)})")
        if mode == "replicate" and n == 0 and (lo or hi):
            raise ShapeError(f"replicate padding of an empty axis (input shape {tuple(shape)})")


def pad(x: Any, pads: Pads, mode: str = "zeros", value: float = 0.0, *, xp: Any) -> Any:
    """Pad the last ``len(pads)`` axes; ``mode`` is one of :data:`PAD_MODES` (``zeros`` pads with
    ``value``). Negative pads are not allowed."""
    if not any(lo or hi for lo, hi in pads):
        return x
    nd = len(pads)
    shape = tuple(x.shape)
    lead = shape[: x.ndim - nd]
    if mode in ("zeros", "constant"):
        new = lead + tuple(n + lo + hi for n, (lo, hi) in zip(shape[-nd:], pads))
        check_elements(math.prod(max(0, d) for d in new), "pad")
        out = xp.full(new, value, dtype=x.dtype, device=x.device)
        key = (...,) + tuple(slice(lo, lo + n) for n, (lo, _) in zip(shape[-nd:], pads))
        out[key] = x
        return out
    check_pad(shape, pads, mode)
    check_elements(math.prod(lead) * math.prod(n + lo + hi for n, (lo, hi) in zip(shape[-nd:], pads)), "pad")
    for axis_from_end, (lo, hi) in enumerate(reversed(pads)):
        if not (lo or hi):
            continue
        axis = x.ndim - 1 - axis_from_end
        idx = xp.asarray(_pad_index(shape[axis], lo, hi, mode), dtype=xp.int64, device=x.device)
        x = xp.take(x, idx, axis=axis)
    return x


def lowest(dtype: Any, *, xp: Any) -> float | int:
    """The value max-pooling pads with: -inf for floats, the minimum for integers."""
    if xp.isdtype(dtype, "real floating"):
        return -math.inf
    return int(xp.iinfo(dtype).min)


def _taps(x: Any, kernel, stride, dilation, out_hw) -> list[Any]:
    """Strided views of a padded NCHW array, one per kernel tap, each ``(N, C, Ho, Wo)``."""
    (kh, kw), (sh, sw), (dh, dw), (ho, wo) = kernel, stride, dilation, out_hw
    return [x[:, :, i * dh: i * dh + sh * (ho - 1) + 1: sh, j * dw: j * dw + sw * (wo - 1) + 1: sw]
            for i in range(kh) for j in range(kw)]


# -- convolution -------------------------------------------------------------------------------
def conv2d(x: Any, weight: Any, bias: Any = None, stride=(1, 1), pads: Pads = ((0, 0), (0, 0)),
           dilation=(1, 1), groups: int = 1, *, xp: Any) -> Any:
    """2-D cross-correlation as torch's ``conv2d`` with zero padding ``pads``.

    im2col from strided slices: the ``kh*kw`` taps are stacked into ``(N, G, C/G*kh*kw, Ho*Wo)``
    (channel-major, then kernel row, column: the order of ``weight.reshape(O, -1)``) and one
    batched ``matmul`` with the ``(G, O/G, C/G*kh*kw)`` weights gives every group at once.
    """
    x = pad(x, pads, "zeros", xp=xp)
    n, c, h, w = x.shape
    o, cg, kh, kw = weight.shape
    ho = (h - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (w - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    if ho <= 0 or wo <= 0:
        raise ShapeError(f"convolution output would be empty: padded input {tuple(x.shape)}, kernel "
                         f"{(kh, kw)}, dilation {tuple(dilation)}, stride {tuple(stride)}")
    if kh == kw == 1:
        cols = x[:, :, ::stride[0], ::stride[1]] if stride != (1, 1) else x
        cols = cols[:, :, :ho, :wo]
    else:
        cols = xp.stack(_taps(x, (kh, kw), stride, dilation, (ho, wo)), axis=2)
    cols = xp.reshape(cols, (n, groups, cg * kh * kw, ho * wo))
    wm = xp.reshape(weight, (groups, o // groups, cg * kh * kw))
    y = xp.reshape(xp.matmul(wm, cols), (n, o, ho, wo))
    if bias is not None:
        y = y + xp.reshape(bias, (1, o, 1, 1))
    return y


def conv_transpose2d(x: Any, weight: Any, bias: Any = None, stride=(1, 1), padding=(0, 0),
                     output_padding=(0, 0), dilation=(1, 1), groups: int = 1, *, xp: Any) -> Any:
    """torch's ``conv_transpose2d`` as col2im: one batched ``matmul`` maps every input pixel to
    its ``O/G*kh*kw`` contributions, then each kernel tap is added into a strided slice of the
    full (uncropped) output, which is finally cropped by ``padding``."""
    n, c, h, w = x.shape
    _, og, kh, kw = weight.shape
    cg = c // groups
    o = og * groups
    (sh, sw), (dh, dw), (ph, pw) = stride, dilation, padding
    hf = (h - 1) * sh + dh * (kh - 1) + 1 + output_padding[0]
    wf = (w - 1) * sw + dw * (kw - 1) + 1 + output_padding[1]
    ho, wo = hf - 2 * ph, wf - 2 * pw
    if ho <= 0 or wo <= 0:
        raise ShapeError(f"transposed convolution output would be empty for input {tuple(x.shape)}")
    wm = xp.permute_dims(xp.reshape(weight, (groups, cg, og * kh * kw)), (0, 2, 1))
    cols = xp.matmul(wm, xp.reshape(x, (n, groups, cg, h * w)))  # (N, G, og*kh*kw, H*W)
    cols = xp.reshape(cols, (n, o, kh, kw, h, w))
    full = xp.zeros((n, o, hf, wf), dtype=x.dtype, device=x.device)
    for i in range(kh):
        for j in range(kw):
            key = (slice(None), slice(None), slice(i * dh, i * dh + sh * (h - 1) + 1, sh),
                   slice(j * dw, j * dw + sw * (w - 1) + 1, sw))
            full[key] = full[key] + cols[:, :, i, j, :, :]
    y = full[:, :, ph: ph + ho, pw: pw + wo]
    if bias is not None:
        y = y + xp.reshape(bias, (1, o, 1, 1))
    return y


# -- pooling -----------------------------------------------------------------------------------
def _pool_geometry(shape, kernel, stride, padding, dilation, ceil_mode):
    h, w = shape[-2:]
    out = tuple(pool_out_size(n, k, s, p, d, ceil_mode)
                for n, k, s, p, d in zip((h, w), kernel, stride, padding, dilation))
    if out[0] <= 0 or out[1] <= 0:
        raise ShapeError(f"pooling output would be empty: input {tuple(shape)}, kernel {tuple(kernel)}, "
                         f"stride {tuple(stride)}, padding {tuple(padding)}, dilation {tuple(dilation)}")
    # the last window may reach past the padded input in ceil mode: pad the high side further
    pads = tuple((p, max(p, (o - 1) * s + d * (k - 1) + 1 - n - p))
                 for n, o, k, s, p, d in zip((h, w), out, kernel, stride, padding, dilation))
    return out, pads


def max_pool2d(x: Any, kernel, stride, padding=(0, 0), dilation=(1, 1), ceil_mode=False,
               return_indices=False, *, xp: Any):
    """torch's ``max_pool2d``; with ``return_indices`` also the flat ``h*W + w`` int64 indices
    into each input plane (first maximum in row-major window order; in a window with NaNs, its
    last NaN, as torch)."""
    out, pads = _pool_geometry(x.shape, kernel, stride, padding, dilation, ceil_mode)
    xpad = pad(x, pads, "zeros", lowest(x.dtype, xp=xp), xp=xp)
    taps = _taps(xpad, kernel, stride, dilation, out)
    if not return_indices:
        y = taps[0]
        for t in taps[1:]:
            y = xp.maximum(y, t)
        return y
    # torch's scan: from -inf (the first real element's index), a tap replaces the maximum when
    # greater or NaN; one pass per tap (stacking the taps for an argmax took 2x torch's time)
    h, w = x.shape[-2:]
    dev = x.device
    start_r = xp.arange(out[0], dtype=xp.int64, device=dev) * stride[0] - padding[0]
    start_c = xp.arange(out[1], dtype=xp.int64, device=dev) * stride[1] - padding[1]
    idx = xp.reshape(xp.clip(start_r, 0, None), (-1, 1)) * w + xp.reshape(xp.clip(start_c, 0, None), (1, -1))
    idx = xp.broadcast_to(idx, tuple(taps[0].shape))
    best = xp.full(tuple(taps[0].shape), lowest(x.dtype, xp=xp), dtype=x.dtype, device=dev)
    nan = xp.isdtype(x.dtype, "real floating") and bool(xp.any(xp.isnan(x)))
    t = 0
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            v = taps[t]
            t += 1
            at = (xp.reshape(start_r + i * dilation[0], (-1, 1)) * w
                  + xp.reshape(start_c + j * dilation[1], (1, -1)))
            take = (v > best) | xp.isnan(v) if nan else v > best
            best = xp.where(take, v, best)
            idx = xp.where(take, at, idx)
    return best, idx


def window_argmax(r: Any, axis: int, *, xp: Any) -> Any:
    """The position along ``axis`` that torch's max-pooling kernels report: the first maximum,
    or, where the window holds a NaN, its last NaN (they scan with ``val > max || isnan(val)``;
    ``argmax`` gives the first NaN)."""
    t = xp.astype(xp.argmax(r, axis=axis), xp.int64)
    if not xp.isdtype(r.dtype, "real floating"):
        return t
    nan = xp.isnan(r)
    if not bool(xp.any(nan)):
        return t
    last = (r.shape[axis] - 1) - xp.astype(xp.argmax(xp.astype(xp.flip(nan, axis=axis), xp.int8), axis=axis), xp.int64)
    return xp.where(xp.any(nan, axis=axis), last, t)


def _max_with_indices(taps, table, out, *, xp):
    stacked = xp.stack(taps, axis=2)  # (N, C, T, Ho, Wo)
    n, c = stacked.shape[:2]
    y = xp.max(stacked, axis=2)
    t = window_argmax(stacked, 2, xp=xp)
    ho, wo = out
    flat_pos = xp.reshape(t * (ho * wo), (n, c, ho * wo)) + xp.arange(ho * wo, dtype=t.dtype, device=t.device)
    tbl = xp.reshape(xp.asarray(table, dtype=xp.int64, device=t.device), (-1,))
    idx = xp.take(tbl, xp.reshape(xp.astype(flat_pos, xp.int64), (-1,)))
    return y, xp.reshape(idx, (n, c, ho, wo))


def avg_pool2d(x: Any, kernel, stride, padding=(0, 0), ceil_mode=False, count_include_pad=True,
               divisor_override: int | None = None, *, xp: Any) -> Any:
    """torch's ``avg_pool2d``: a window's divisor counts padding up to ``size + pad`` when
    ``count_include_pad``, only real elements otherwise, or is ``divisor_override``."""
    h, w = x.shape[-2:]
    out, pads = _pool_geometry(x.shape, kernel, stride, padding, (1, 1), ceil_mode)
    xpad = pad(x, pads, "zeros", 0.0, xp=xp)
    taps = _taps(xpad, kernel, stride, (1, 1), out)
    y = taps[0]
    for t in taps[1:]:
        y = y + t
    if divisor_override:
        return y / float(divisor_override)
    per_axis = []
    for n, o, k, s, p in zip((h, w), out, kernel, stride, padding):
        div = []
        for i in range(o):
            a = i * s - p
            b = min(a + k, n + p)
            full = b - a
            a, b = max(a, 0), min(b, n)
            div.append(full if count_include_pad else max(b - a, 0))
        per_axis.append(div)
    if all(v == per_axis[0][0] for v in per_axis[0]) and all(v == per_axis[1][0] for v in per_axis[1]):
        return y / float(per_axis[0][0] * per_axis[1][0])
    divisor = [[max(a * b, 1) for b in per_axis[1]] for a in per_axis[0]]
    return y / xp.asarray(divisor, dtype=y.dtype, device=y.device)


def adaptive_avg_pool2d(x: Any, out_hw: tuple[int, int], *, xp: Any) -> Any:
    """torch's ``adaptive_avg_pool2d``: a mean for the global and the divisible cases, otherwise
    the window sums along each axis as taps (``min(start + t, end - 1)``, the repeats of a short
    window's last element masked out) divided by the window lengths. (Products with averaging
    matrices, as this was first written, multiplied every element by the zeros outside its
    windows: one inf in the input made NaN of outputs whose windows do not hold it.)"""
    h, w = x.shape[-2:]
    ho, wo = out_hw
    if (ho, wo) == (h, w):
        return x
    if (ho, wo) == (1, 1):
        return xp.mean(x, axis=(-2, -1), keepdims=True)
    lead = tuple(x.shape[:-2])
    if h % ho == 0 and w % wo == 0:
        r = xp.reshape(x, lead + (ho, h // ho, wo, w // wo))
        return xp.mean(r, axis=(-3, -1))
    y = x
    if wo != w:
        y = _adaptive_mean_axis(y, w, wo, y.ndim - 1, xp=xp)
    if ho != h:
        y = _adaptive_mean_axis(y, h, ho, y.ndim - 2, xp=xp)
    return y


def _adaptive_mean_axis(x: Any, n: int, o: int, axis: int, *, xp) -> Any:
    """The means of torch's adaptive windows of ``n`` elements into ``o`` along ``axis``."""
    bounds = adaptive_bounds(n, o)
    k = max(b - a for a, b in bounds)
    trail = (1,) * (x.ndim - 1 - axis)
    acc = None
    for j in range(k):
        idx = xp.asarray([min(a + j, b - 1) for a, b in bounds], dtype=xp.int64, device=x.device)
        t = xp.take(x, idx, axis=axis)
        if any(a + j >= b for a, b in bounds):  # (a where, not a weight 0: 0 * inf is NaN)
            keep = xp.asarray([a + j < b for a, b in bounds], dtype=xp.bool, device=x.device)
            t = xp.where(xp.reshape(keep, (o,) + trail), t, xp.zeros((), dtype=x.dtype, device=x.device))
        acc = t if acc is None else acc + t
    lengths = xp.asarray([b - a for a, b in bounds], dtype=x.dtype, device=x.device)
    return acc / xp.reshape(lengths, (o,) + trail)


def adaptive_max_pool2d(x: Any, out_hw: tuple[int, int], return_indices=False, *, xp: Any):
    """torch's ``adaptive_max_pool2d``. Windows differ in length, so each tap gathers
    ``min(start + t, end - 1)`` (repeating a window's last element is harmless for a maximum)."""
    h, w = x.shape[-2:]
    ho, wo = out_hw
    bh, bw = adaptive_bounds(h, ho), adaptive_bounds(w, wo)
    kh = max(b - a for a, b in bh)
    kw = max(b - a for a, b in bw)
    if not return_indices:
        if h % ho == 0 and w % wo == 0:
            r = xp.reshape(x, tuple(x.shape[:-2]) + (ho, h // ho, wo, w // wo))
            return xp.max(r, axis=(-3, -1))
        y = None
        for j in range(kw):  # reduce along W first, then along H: max is separable
            idx = xp.asarray([min(a + j, b - 1) for a, b in bw], dtype=xp.int64, device=x.device)
            t = xp.take(x, idx, axis=x.ndim - 1)
            y = t if y is None else xp.maximum(y, t)
        z = None
        for i in range(kh):
            idx = xp.asarray([min(a + i, b - 1) for a, b in bh], dtype=xp.int64, device=x.device)
            t = xp.take(y, idx, axis=x.ndim - 2)
            z = t if z is None else xp.maximum(z, t)
        return z
    if h % ho == 0 and w % wo == 0:
        # equal windows: one reshape and an argmax over each window in (row, column) order, the
        # order of the taps below (DGCNN's adaptive_max_pool1d(x, 1) with indices over 256
        # values: 2.5 ms as 256 gathered taps)
        kh, kw = h // ho, w // wo
        lead = tuple(x.shape[:-2])
        nl = len(lead)
        r = xp.reshape(x, lead + (ho, kh, wo, kw))
        r = xp.reshape(xp.permute_dims(r, tuple(range(nl)) + (nl, nl + 2, nl + 1, nl + 3)), lead + (ho, wo, kh * kw))
        t = window_argmax(r, r.ndim - 1, xp=xp)  # first maximum (NaN: as the taps' argmax)
        y = xp.max(r, axis=-1)
        rows = xp.reshape(xp.arange(ho, dtype=xp.int64, device=x.device) * kh, (ho, 1)) + t // kw
        cols = xp.reshape(xp.arange(wo, dtype=xp.int64, device=x.device) * kw, (1, wo)) + t % kw
        return y, rows * w + cols
    taps, table = [], []
    for i in range(kh):
        ri = [min(a + i, b - 1) for a, b in bh]
        xi = xp.take(x, xp.asarray(ri, dtype=xp.int64, device=x.device), axis=2)
        for j in range(kw):
            cj = [min(a + j, b - 1) for a, b in bw]
            taps.append(xp.take(xi, xp.asarray(cj, dtype=xp.int64, device=x.device), axis=3))
            table.append([[r * w + c for c in cj] for r in ri])
    return _max_with_indices(taps, table, (ho, wo), xp=xp)


# -- linear ------------------------------------------------------------------------------------
def linear(x: Any, weight_t: Any, bias: Any = None, *, xp: Any) -> Any:
    """``x @ weight_t + bias`` over the last axis; ``weight_t`` is ``(in, out)``. Leading axes are
    folded into one so a batched input is a single matrix product."""
    lead = tuple(x.shape[:-1])
    k = x.shape[-1]
    if x.ndim > 2:
        x = xp.reshape(x, (math.prod(lead), k))
    y = xp.matmul(x, weight_t)
    if bias is not None:
        y = y + bias
    if len(lead) != 1:
        y = xp.reshape(y, lead + (weight_t.shape[1],))
    return y
