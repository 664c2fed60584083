"""NumPy-only fast paths. Each function mirrors a generic Array API implementation elsewhere,
which stays the reference; layers reach these through ``backend.fast`` and fall back when absent.

Convolution (``conv2d_plan``) picks, once at build, one of:

* ``1x1``: a 1x1 convolution without padding is a plain matmul over each ``(C, H*W)`` image;
  strided ones, small batched images and biases worth folding (O >= C) go through one copy into a
  workspace with a row of ones that meets the bias column of the packed weights.
* ``depthwise``: one input channel per group accumulates the ``kh*kw`` shifted slices times
  per-channel weights, each tap one contiguous slice of a flattened (polyphase for strides)
  padded input; no GEMM. Maps of at most ``DEPTHWISE_NHWC_MAX_PIXELS`` output pixels run
  channels-last instead (long contiguous inner loops over channels); big kernels (5x5, 7x7) at
  stride 1 run as one einsum over a channels-last window view up to 28x28 outputs, as banded
  GEMMs (one per channel, the kernel rows in its inner dimension) on larger maps. A fused activation is
  applied inside the cache-sized blocks.
* ``winograd``: F(4x4, 3x3) or F(2x2, 3x3) (by output size) for 3x3 stride-1 ungrouped float32
  convolutions with enough channels, where it measured faster than the GEMM (see
  :func:`choose_algorithm`); the transforms are small GEMMs, the tiles one strided copy each way,
  small images of a batch share the GEMMs; calls with very few output pixels run the GEMM.
* ``patch``: stride == kernel without padding (ViT's patch embedding): the patch matrix is one
  strided copy of the input, then one GEMM.
* ``gemm``: im2col into a per-thread workspace laid out ``(C/G*kh*kw + 1, rows*Wo)`` (blocks of
  output rows of ~4 MiB; strided convolutions read unit-stride runs from the input's polyphase
  split; the extra row of ones carries the bias), then one ``(O, K+1) @ (K+1, rows*Wo)`` matmul
  per block written straight into the NCHW output (several small images share one matmul).

Threads: inside a forward pass (:class:`compute_scope`, entered by the runtime) numpy's OpenBLAS
runs on one thread and kuiper-xp splits the GEMMs, copies and elementwise passes itself over a
team of persistent workers (as many threads as OpenBLAS had, or ``set_num_threads`` /
``$KUIPER_XP_NUM_THREADS``; numpy releases the GIL in all of them): one pool of threads instead of
two fighting for the cores. Scratch buffers are per-thread, outputs are always fresh arrays, so
plans are thread-safe.
``activation_inplace`` applies a layer's ``fused_activation`` on the fresh output; ``unary`` and
the named kernels it shares with it (sigmoid, SiLU, hardswish, hardsigmoid, GELU erf/tanh) run
in L2-sized chunks with chunk-sized temporaries, warning-free and NaN/Inf-exact as torch.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import sys
import threading
import time
import warnings
import weakref
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .base import concat_shape

__all__ = [
    "conv2d_plan",
    "conv_transpose2d_plan",
    "depthwise3d_plan",
    "choose_algorithm",
    "Conv2dPlan",
    "pad",
    "max_pool2d",
    "avg_pool2d",
    "linear",
    "concat",
    "matmul",
    "pack_linear",
    "rnn_sequence",
    "segment_scatter",
    "activation_inplace",
    "clamp",
    "unary",
    "UNARY_ACTIVATIONS",
    "set_num_threads",
    "get_num_threads",
    "compute_scope",
    "BufferPool",
    "layer_norm",
    "scale_shift",
    "resize_taps",
    "pixel_shuffle",
    "use_numba",
    "numba_enabled",
]

#: Winograd is used for 3x3 stride-1 ungrouped float32 convolutions when both channel counts are
#: at least this (below it the transforms cost more than the multiplications they save), and
#: between WINOGRAD_SMALL_MIN_CHANNELS and this on outputs of at least WINOGRAD_SMALL_MIN_SIZE
#: pixels a side. With the per-thread blocks (``_Winograd._blocks``), 2 AVX-512 Xeon cores, SiLU
#: fused, F(4x4) against the GEMM: 32 channels at batch 1 1.2x at 28 pixels a side, 0.93-1.03
#: at 40, 0.90 at 56, 0.80 at 80, 0.71 at 160; at batch 4 0.76-0.88 from 28 on; 48 -> 32 and
#: 32 -> 64 0.65-0.89 (one thread: 0.9-1.0). (Before the blocks, the GEMM was 0.8-0.9x of
#: F(4x4)'s time at 32 channels.) 64 -> 32 at 128x128, which took the "shift" algorithm: 4.6 ->
#: 3.9 ms on two threads.
WINOGRAD_MIN_CHANNELS = 48
WINOGRAD_SMALL_MIN_CHANNELS = 32
WINOGRAD_SMALL_MIN_SIZE = 40
#: F(4x4) from this output side on, else F(2x2)
WINOGRAD_F4_MIN_SIZE = 20
#: a call with fewer output pixels (batch * Ho * Wo) than this runs the GEMM instead
WINOGRAD_MIN_PIXELS = 150
#: set to False to use the GEMM path everywhere
USE_WINOGRAD = True
#: a dilated 3x3 convolution (dilation d in both axes, padding d: torch's "same") runs as an
#: undilated Winograd convolution over the d*d polyphase sub-images of its input
#: (``Conv2dPlan._run_winograd_phases``) when they are at least this many pixels a side and both
#: channel counts at least WINOGRAD_DILATED_MIN_CHANNELS (F(4x4), from a WINOGRAD_F4_MIN_SIZE
#: side) or WINOGRAD_DILATED_F2_MIN_CHANNELS (F(2x2)). 2 AMD EPYC cores, batch 1, time against the
#: GEMM path's: dilation 2 over 56x56, 64/96/128 channels 0.91-0.95/0.77/0.64 (undilated F(4x4):
#: 0.76/-/0.52: the two polyphase copies); 28x28 (F(2x2) on 14x14 sub-images) 128 channels 1.04,
#: 256 0.76, 256 -> 512 0.73, 512 0.58, batch 8 0.76; 14x14 (7x7 sub-images) 256 channels 1.21
WINOGRAD_DILATED_MIN_SIDE = 14
WINOGRAD_DILATED_MIN_CHANNELS = 128
WINOGRAD_DILATED_F2_MIN_CHANNELS = 256
#: im2col blocks of output rows are sized to about this many bytes (smaller blocks keep the patches
#: in L2 but make the GEMMs too small to be efficient; 4 MiB measured best on Zen 3)
GEMM_BLOCK_BYTES = 4 << 20
#: with several threads, each takes whole blocks of output rows with about this many bytes of
#: patches (its own im2col, GEMM and fused activation, in its cache); 1-2 MiB measured best for
#: YOLOv5n's strided convolutions on Zen 3
GEMM_ROWS_BYTES = 2 << 20
#: 1x1 convolutions with a channels-last result work on blocks of pixel rows of about this many
#: bytes of result per thread (GEMM, bias and activation in cache; 1 MiB measured best for
#: MobileNetV2's shapes on a 2-core AVX-512 Xeon with 2 MiB L2, 512 KiB 10-40% slower at batch 8)
CONV1X1_BLOCK_BYTES = 1 << 20
#: ... and are split over the threads from this many multiply-adds (or PARALLEL_MIN_ELEMENTS
#: outputs; below, one thread was faster: 0.13 against 0.20 ms for MobileNetV2's 64 -> 384 at
#: 14x14, batch 1, 4.8 M multiply-adds, 75 K outputs)
CONV1X1_SPLIT_MIN_MACS = 1 << 24
#: Winograd processes as many images at once as fit in about this many bytes of transformed tiles
WINOGRAD_CHUNK_BYTES = 4 << 20
#: ... unless the call has at least this many tiles per channel of the wider side (``N * tiles >=
#: ratio * max(C, O)``: enough tiles beside the transformed weights, which every thread then
#: reads): then each thread takes blocks of tile rows of about WINOGRAD_BLOCK_BYTES of
#: transformed tiles and runs all five steps on them, bias and activation included
#: (``_Winograd._blocks``), instead of every step being split over the threads in turn. 2
#: AVX-512 Xeon cores, ReLU fused, against torch 2.13: 64 channels at 56x56 batch 8 10.5 -> 8.1
#: ms (torch 5.9), batch 1 1.7 -> 1.1 (1.1); 128 at 28x28 batch 8 6.1 -> 5.1 (6.1); 256 at 14x14
#: batch 8 (F(2x2)) 7.4 -> 5.5 (5.7). One image (its tile rows split): 0.74-0.81 of the steps'
#: time from ratio 0.8 (80 channels at 30x30) up, 1.14-1.4 at 0.2-0.77 (64 at 28x28, 128 at
#: 28x28, 256 at 14x14); two images and more: 0.81-0.95 from 0.25 (512 at 7x7 batch 8), 1.05
#: at 0.12-0.19 (1024 at 7x7 batch 8, 512 at 14x14 batch 2).
WINOGRAD_BLOCKS_MIN_RATIO = 0.8
WINOGRAD_BLOCKS_BATCH_MIN_RATIO = 0.25
WINOGRAD_BLOCK_BYTES = 2 << 20
#: batched images with fewer output pixels than this share one GEMM (small GEMMs are inefficient)
GEMM_MIN_COLUMNS = 1024
#: an im2col GEMM whose patches are in the weight's own (c, i, j) order (one block: stride 1)
#: multiplies the weight itself, a view, from this many multiply-adds per output (C*kh*kw) on,
#: and adds the bias to each block of results with the activation; below it (and for strided
#: convolutions, whose taps are regrouped by phase) a packed (O, K + 1) copy carries the bias as
#: a column met by a row of ones. The copy was the first call's largest cost: ResNet-18 at batch
#: 1 packed 3 x 9.4 MB for its 7x7 layers, 76 of that call's 232 ms in a slow hour (its steady
#: pass: 53; the call 0.10 -> 0.08 s in a quiet one), and kept them beside the weights (peak RSS
#: 174 -> 147 MiB); the bias pass instead costs ~0.1 ns an output in cache against
#: K * ~0.02 ns of GEMM
GEMM_WEIGHT_VIEW_MIN_K = 1024
#: transposed convolutions of at least two images of at least this many input pixels each give
#: each thread whole images (``ConvTranspose2dPlan``; measured winning from 8x8 inputs)
CONVT_IMAGES_MIN_PIXELS = 64
#: ... and each thread takes its own blocks of them (``Conv2dPlan._run_gemm_images``) unless the
#: weights are more than this many times a block's patches: then the blocks' GEMMs, each thread
#: reading all the weights, give way to shared GEMMs over as many images as the weights weigh
#: (2 threads: CapsNet's 9x9 stride-2 256 -> 256 on 20x20, 21 MiB of weights, 3 MiB of patches
#: an image, batch 4 11.4 -> 9.4 ms, batch 2 6.8 -> 5.2; 1024 -> 1024 3x3 at 7x7 batch 4 21 ->
#: 16; 384 -> 384 at 13x13, weights 2.3x the patches, kept: 7.9-8.1 against 8.3-8.5 shared);
#: 1x1 convolutions compare their output channels with an image's pixels the same way
GEMM_IMAGES_MAX_WEIGHT_RATIO = 4
#: convolutions (GEMM, Winograd and tap algorithms) of at most this many multiply-adds, whose
#: patch matrix has at most SMALL_CONV_PATCH_ELEMENTS, run as one plain im2col and GEMM on the
#: calling thread (``Conv2dPlan._run_small``; GEMMs this small are not split over the threads
#: anyway): the blocked and polyphase machinery's set-up was most of such a layer's time. One
#: Xeon core, ReLU fused: a 28x28 autoencoder's 1 -> 16 stride-2 3x3 73 -> 17 us, 16 -> 32
#: stride 2 at 14x14 82 -> 26, 3x3 16 -> 16 at 14x14 49 -> 33, 48 -> 48 at 8x8 (Winograd)
#: 78 -> 56. (Above the limit it still gained on one core, DQN's 8x8 stride-4 4 -> 32 at 84x84,
#: 4 M multiply-adds, 158 -> 140 us; left to the split paths for two threads.)
SMALL_CONV_MACS = 1 << 21
SMALL_CONV_PATCH_ELEMENTS = 1 << 19
#: depthwise convolutions work on blocks of channels (all images of the batch) of about this many
#: bytes of padded input and accumulators (L2-sized blocks measured slower with numpy's per-call
#: overheads; 4 MiB measured best for MobileNetV2 shapes at batch 1 and 8: 8.1 / 64 ms against
#: 8.9 / 97 ms for whole-tensor passes)
DEPTHWISE_BLOCK_BYTES = 4 << 20
#: depthwise convolutions with at most this many output pixels per image run channels-last
#: (measured for MobileNetV2 at batch 8: 7x7x960 1.8 ms against 3.9 planar, 14x14x576 5.1 / 6.6,
#: 28x28x192 even, 56x56x144 35 / 14)
DEPTHWISE_NHWC_MAX_PIXELS = 256
#: depthwise tap passes (channels-last and planar) are split over the threads only when a
#: thread's passes each cover at least this many elements: shorter numpy calls from two threads at
#: once pass the GIL back and forth at every call (2 Zen 3 vCPUs, 3x3 taps, alternated against
#: one thread, channels-last: (3, 64, 16, 16) 2.45x and (8, 128, 8, 8) 2.06x the time of one
#: thread with 16-32 K-element passes; (8, 960, 7, 7) 0.91x, (8, 384, 14, 14) 0.62x,
#: (4, 576, 14, 14) 0.65x with 188-301 K). A channels-last stride-2 pass counts 4x its outputs
#: ((8, 576, 14, 14) to 7x7: 113 K outputs a pass, 1.08x the time of the split on one thread).
#: Planar, the rule against the old split, alternated: (2, 24, 56, 56) 0.67, (4, 32, 40, 40)
#: 0.70, (2, 64, 32, 32) 0.71, (4, 72, 56, 56) stride 2 0.87, (4, 16, 112, 112) stride 2 0.89
DEPTHWISE_PASS_SPLIT_MIN = 1 << 17
#: stride-1 undilated depthwise convolutions with at least this many taps run as banded GEMMs
#: on maps of more than DEPTHWISE_BAND_MIN_PIXELS output pixels (``Conv2dPlan._run_depthwise_band``):
#: 2 threads of an AMD EPYC, batch 1, against the tap passes (torch 2.13 in brackets): 7x7 over
#: 96x56x56 1.4 against 2.8-3.2 ms (0.5-0.65), 192x28x28 0.9 against 2.2 (0.5), 32x112x112 1.7
#: against 3.1 (0.7); 5x5 over 96x56x56 1.2 against 1.5, 192x28x28 0.74 against 1.16; 3x3 kernels
#: slower (32x112x112 0.9-1.0 against 0.7-0.75)
DEPTHWISE_BAND_MIN_TAPS = 25
#: ... and more than this many output pixels (smaller maps take the einsum of
#: ``_run_depthwise_einsum``). 2 threads of an AMD EPYC without AVX-512 (Zen 3, the AVX2 kind
#: of machine of issue 8), einsum against the banded GEMMs (one GEMM per channel, kernel rows in
#: the inner dimension), same process, alternated, medians of 9: 7x7 over 192x28x28 1.9 against
#: 2.4 ms (batch 8: 14.1 / 15.5), 384x28x28 3.2 / 4.4, 192x24x24 1.4 / 2.1; 5x5 over 512x28x28
#: 2.6 / 3.9; the bands ahead from 32x32 at batch 8 (9x9 over 256 channels 34.6 / 26.0, 7x7
#: 25.3 / 19.4) and at 56x56 (96 channels 4.2 / 3.9, batch 8 31.6 / 27.4); fresh processes
#: alternated, 9x9 over 256x32x32 at batch 1: einsum 4.0-4.5 ms, bands 3.0-4.2
DEPTHWISE_BAND_MIN_PIXELS = 784
#: stride-1 undilated depthwise convolutions with at least this many taps run as one einsum per
#: block of output rows over a channels-last window view (``Conv2dPlan._run_depthwise_einsum``;
#: 3x3 kernels gained little and stay on the tap passes)
DEPTHWISE_EINSUM_MIN_TAPS = 25
#: output elements per einsum call of ``_run_depthwise_einsum`` (its window view of one block)
EINSUM_ROWS_ELEMENTS = 1 << 16
#: most output columns per band of a banded depthwise convolution (the band matrix is
#: (width + kw - 1) x width per kernel row: wider bands waste more multiply-adds on its zeros,
#: narrower ones make smaller GEMMs)
DEPTHWISE_BAND_WIDTH = 16
#: banded depthwise convolutions work on blocks of channels of one image with about this many
#: bytes of workspace (1, 2 and 4 MiB within the noise of a 2-vCPU VM; 4 the most often ahead)
DEPTHWISE_BAND_BLOCK_BYTES = 4 << 20
#: a banded depthwise convolution keeps its band matrices (``kh*(bw + kw - 1)*bw`` values per
#: channel) when they take at most this many bytes, else copies them per block of channels
DEPTHWISE_BAND_CACHE_BYTES = 4 << 20
#: planar depthwise convolutions are split over the threads from this many tap-elements (output
#: elements times taps)
DEPTHWISE_SPLIT_MIN = 1 << 20
#: depthwise convolutions whose kernel covers much of a small map run as one matrix product per
#: channel (``Conv2dPlan._run_depthwise_dense``): the (H*W, Ho*Wo) matrix of each channel's
#: taps, when all channels' take at most this many bytes and the map has at most
#: DEPTHWISE_DENSE_RATIO times the kernel's taps (DEPTHWISE_DENSE_RATIO_BATCHED from batch
#: DEPTHWISE_DENSE_MIN_BATCH on). Measured on 2 Xeon (AVX-512) threads against the tap passes:
#: 9x9 over 128x9x9 (ConvMixer) 0.13 against 0.48 ms at batch 1, 0.27 against 3.9 at batch 8;
#: 7x7 over 768x7x7 (ConvNeXt's last stage) 0.31 / 0.79 and 0.58 / 5.3; 5x5 over 1152x7x7 0.45 /
#: 0.58 and 0.85 / 4.5; 3x3 over 960x7x7 0.37 / 0.17 (slower: the 9 MiB of matrices are read for
#: one image) and 0.75 / 1.7 at batch 8; 3x3 over 240x14x14 slower at both
DEPTHWISE_DENSE_MAX_BYTES = 16 << 20
DEPTHWISE_DENSE_RATIO = 2
DEPTHWISE_DENSE_RATIO_BATCHED = 6
DEPTHWISE_DENSE_MIN_BATCH = 4
#: a stride-1 convolution with one group whose taps read real (not padding) input for at most
#: this fraction of kh*kw*Ho*Wo runs one GEMM per tap over just those pixels (Conv2dPlan._run_taps)
#: instead of the im2col GEMM (dilated convolutions on small maps); measured on 2 AMD EPYC cores,
#: 512 -> 256 channels at 28x28, batch 1 (torch 2.13 in brackets): rate 36 (0.11 of the taps'
#: pixels real) 1.3 against 15.1 ms (9.7), rate 18 (0.33) 5.3 against 14.4 (3.5), rate 12 (0.51)
#: 7.3 against 13.9 (5.4), rate 6 (0.73) 9.4 against 13.2 (7.0); rate 12 at batch 4 28.9 against
#: 44.3 (37.6)
TAPS_MAX_FRACTION = 0.8
#: ... and when the products it skips come to at least this many multiply-adds per tap GEMM it
#: runs (each is a few Python-issued calls): on small undilated maps the padding is much of the
#: patch area too, but one im2col GEMM beats a hundred tiny ones (TimesNet's 16 -> 16 5x5 over
#: 4x24 maps at batch 4: 0.88 ms as taps against torch's 0.08)
TAPS_MIN_SAVED_MACS = 1 << 19
#: stride-1 undilated convolutions with at most 1/SHIFT_MAX_OUT_RATIO as many outputs as input
#: channels (and no Winograd) run "shift": one GEMM of all taps' weights stacked, ``(kh*kw*O, C)``, with
#: the flattened padded input, then kh*kw shifted adds of the small ``(O, pixels)`` pieces: no
#: im2col, whose ``9*C*pixels`` copy dominates when O is small (DenseNet-style 64 -> 16 3x3 at
#: 48x48: 0.5 ms against 1.7 ms for im2col + GEMM, 2 threads)
SHIFT_MAX_OUT_RATIO = 2
#: set to False to use im2col + GEMM instead
USE_SHIFT = True
#: shift convolutions work on blocks of output rows with about this many bytes of GEMM result
SHIFT_BLOCK_BYTES = 2 << 20
#: strided GEMM convolutions read their patches from the input's polyphase split
GEMM_POLYPHASE = True
#: ... when no stride is larger than this: each phase is its own patch block, filled by its own
#: calls, and many small ones cost more than the strided reads they save (2 threads, min of 7:
#: an STFT as Conv1d(1, 258, 256, stride=128) over 16000 samples 1.66 ms in 128 phases against
#: 0.24 in one block; Conv1d(1, 402, 400, stride=160) at batch 4 2.76 against 0.84; a 5x5
#: stride-4 16 -> 32 at 64x64 1.24 against 0.70; stride 2 kept: ResNet-18's 7x7/2 stem at
#: batch 8 17.2 against 23.8 ms, YOLOv5n's 16 -> 32 3x3/2 at 320x320 4.7 against 5.7)
GEMM_POLYPHASE_MAX_STRIDE = 2
#: max and average pooling work on blocks of (image, channel) planes of about this many bytes
#: (2 AMD EPYC cores, 1 MiB L2 each: ResNet-18's 3x3/2 max pool at batch 8 3.5 ms against 5.5
#: with 256 KiB blocks, 0.50 against 0.75 at batch 1; a 3x3/1 average over 768x112x112 12 against
#: 20 ms; YOLOv5's SPPF 5x5 on 128x20x20 unchanged at 0.23; 2 MiB no better)
POOL_BLOCK_BYTES = 1 << 20
#: the cost of combining one element through a view strided along its rows, in unit-stride
#: elements (see _window_reduce's rows_first)
POOL_STRIDED_COST = 3
#: below this many elements an elementwise pass is not worth splitting over threads
PARALLEL_MIN_ELEMENTS = 1 << 18
#: numpy's ufunc buffer size (elements) inside a compute scope and on the team's threads. numpy's
#: default of 8192 makes a ufunc over rows shorter than the buffer (a (C, L) block times a
#: per-channel (C, 1) weight, L a few hundred to a few thousand) go through its buffers: the
#: depthwise tap passes over 28x28 maps ran 1.8x slower than with 1024 (rows of 63 elements
#: want the buffer, rows of 224 to 12544 do not; 1024 serves both)
UFUNC_BUFSIZE = 1024
try:  # KUIPER_XP_BUFSIZE=N changes it; 0 leaves numpy's own (a value that is not a number: ignored)
    UFUNC_BUFSIZE = max(0, int(os.environ.get("KUIPER_XP_BUFSIZE", UFUNC_BUFSIZE)))
except ValueError:
    pass

_tls = threading.local()
_HAS_AFFINITY = hasattr(os, "sched_setaffinity") and hasattr(threading, "get_native_id")
_NUMBA_AT_IMPORT = os.environ.get("KUIPER_XP_NUMBA", "").strip().lower() in ("1", "true", "yes", "on")
_MKL_AT_IMPORT = os.environ.get("KUIPER_XP_MKL", "").strip().lower() in ("1", "true", "yes", "on")


# -- threads and scratch ---------------------------------------------------------------------------
# kuiper-xp schedules its own threads: inside a forward pass (``compute_scope``) numpy's OpenBLAS
# is pinned to one thread and every GEMM, copy and elementwise pass is split over a small team of
# persistent workers that sleep on a lock between jobs. OpenBLAS's own workers spin (with
# sched_yield) for a while after every GEMM, so letting BLAS thread the GEMMs while kuiper-xp
# threads the rest had the two pools fight for the cores (MobileNetV2, 2 cores: 25.6 ms with one
# thread of ours, 29.0 ms with two); the spinning also slowed the next engine of an interleaved
# benchmark. Where OpenBLAS cannot be found (numpy on MKL or Accelerate), BLAS keeps its threads
# and ours default to 1.

def _env_threads() -> int | None:
    """``$KUIPER_XP_NUM_THREADS``: a positive integer, at most the CPUs this process may use (more
    threads than CPUs only wait on each other: 1000 made a call 8x slower); a value that is not
    one is ignored with a warning."""
    env = os.environ.get("KUIPER_XP_NUM_THREADS", "").strip()
    if not env:
        return None
    try:
        n = int(env)
    except ValueError:
        n = 0
    if n < 1:
        warnings.warn(f"KUIPER_XP_NUM_THREADS={env!r} is not a positive integer: ignored", stacklevel=2)
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if n > cpus:
        warnings.warn(f"KUIPER_XP_NUM_THREADS={n} is more than the {cpus} CPU(s) this process may use: "
                      f"using {cpus}", stacklevel=2)
        n = cpus
    return n


class _OpenBLAS:
    """ctypes handles on the OpenBLAS numpy links against (found in /proc/self/maps; symbols with
    scipy-openblas's ``scipy_`` prefix and ``64_`` suffix too), or ``ok = False``."""

    def __init__(self) -> None:
        self.ok = False
        self._get = self._set = None
        try:
            import ctypes

            with open("/proc/self/maps") as f:
                paths = {line.split(None, 5)[-1].strip() for line in f if "openblas" in line.lower()}
            for path in sorted(p for p in paths if p.startswith("/")):
                lib = ctypes.CDLL(path)
                for pre in ("scipy_", ""):
                    for suf in ("64_", ""):
                        get = getattr(lib, f"{pre}openblas_get_num_threads{suf}", None)
                        put = getattr(lib, f"{pre}openblas_set_num_threads{suf}", None)
                        if get is not None and put is not None:
                            get.restype, get.argtypes = ctypes.c_int, []
                            put.restype, put.argtypes = None, [ctypes.c_int]
                            self._get, self._set, self.ok = get, put, True
                            return
        except (OSError, ValueError, AttributeError):
            self.ok = False

    def get(self) -> int:
        return int(self._get()) if self.ok else 1

    def set(self, n: int) -> None:
        if self.ok:
            self._set(int(n))


_explicit_threads: int | None = _env_threads()
_blas: _OpenBLAS | None = None
_scope_lock = threading.Lock()
_scope_depth = 0
_scope_saved = 1
_scope_threads = 1   # threads of ours inside a compute scope
_gemm_split = False  # inside a scope with BLAS pinned to one thread: GEMMs are split by us


def _get_blas() -> _OpenBLAS:
    global _blas
    if _blas is None:
        _blas = _OpenBLAS()
    return _blas


class _Worker:
    """A persistent thread that runs one ``fn(lo, hi)`` per ``start``; a pair of locks hands the
    job over and back (about 20 us, against 55 us for a ThreadPoolExecutor round trip)."""

    def __init__(self, k: int) -> None:
        self.go = threading.Lock()
        self.go.acquire()
        self.done = threading.Lock()
        self.done.acquire()
        self.job: tuple | None = None
        self.error: BaseException | None = None
        self.tid: int | None = None  # the OS thread id (for its CPU mask)
        self.excluded: int | None = None  # the CPU its mask leaves out (see _place_team)
        ready = threading.Event()
        threading.Thread(target=self._loop, args=(ready,), name=f"kuiper-xp-{k}", daemon=True).start()
        ready.wait()

    def _loop(self, ready: threading.Event) -> None:
        if UFUNC_BUFSIZE:
            np.setbufsize(UFUNC_BUFSIZE)
        np.seterr(all="ignore")  # (this thread only computes inside forward passes: silent, as torch)
        _tls.worker = True
        self.tid = threading.get_native_id()
        ready.set()
        while True:
            self.go.acquire()
            fn, lo, hi = self.job
            try:
                fn(lo, hi)
            except BaseException as e:  # handed back to the caller by finish()
                self.error = e
            # drop the job before waiting for the next: a closure kept alive here would hold
            # views of its arrays, so the buffer pool would never see them free
            self.job = fn = None
            self.done.release()

    def start(self, fn, lo: int, hi: int) -> None:
        self.error = None
        self.job = (fn, lo, hi)
        self.go.release()

    def finish(self) -> BaseException | None:
        self.done.acquire()
        return self.error


_team: list[_Worker] = []
_team_lock = threading.Lock()  # held while the team runs a job; a nested or concurrent call runs inline

# -- where the team runs -------------------------------------------------------------------------
# Linux wakes a thread on the CPU of the thread that woke it when it judges that cheaper
# ("wake affine"). Once a worker has been woken onto the caller's CPU, every later hand-off puts
# it there again: the caller runs its share, then the worker runs its share on the same CPU, and
# the split work runs serially while the other core idles. Measured on the 2-core VM: after an
# idle gap (a sleep, or another engine running between calls) a (197, 192) x (192, 576) product
# split over two threads took 545 us instead of 305 (one thread: 500); MobileNetV2 at batch 1
# with 50 ms pauses between calls 29 ms instead of 23.5, ResNet-18 43 instead of 35. So inside a
# compute scope the thread dispatching the team's jobs is held on the CPU it is running on, and
# the workers' masks leave that CPU out (they still float over the others); the dispatching
# thread's own mask is restored when the scope ends. ``KUIPER_XP_PIN_THREADS=0`` turns this off.
PLACE_TEAM = os.environ.get("KUIPER_XP_PIN_THREADS", "1").strip().lower() not in ("0", "false", "no", "off")
_placed: dict = {}  # {"tid": the held thread's id, "mask": its own mask to restore}

# On a machine busy with other work the placement is harmful: the held thread cannot leave a CPU
# another process is using, nor can a worker move to the one the caller left. With other jobs
# keeping the 2 vCPUs busy (load ~4), MobileNetV2 at batch 4 took 180-245 ms placed against
# 107-117 left to the OS, MNASNet 102-134 against 32-38. So the team is placed only while the
# other runnable threads (/proc/loadavg, sampled at most every LOAD_SAMPLE_S seconds, smoothed)
# leave it a CPU per thread; otherwise the workers' masks are given back too.
LOAD_SAMPLE_S = 0.25
_load = {"t": float("-inf"), "others": 0.0}


def _read_runnable() -> int | None:
    """Threads runnable on the machine now, this one included (the fourth field of
    /proc/loadavg); None where unknown."""
    try:
        with open("/proc/loadavg", "rb") as f:
            return int(f.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return None


def _cpus_busy(k: int, cpus: int) -> bool:
    """Whether other runnable threads (smoothed over the last samples) and a team of ``k`` need
    more than the ``cpus`` this process may use."""
    now = time.monotonic()
    if now - _load["t"] >= LOAD_SAMPLE_S:
        r = _read_runnable()
        if r is not None:
            others = float(max(0, r - 1))  # (this thread is running while it reads)
            first = _load["t"] == float("-inf")
            _load["others"] = others if first else 0.5 * (_load["others"] + others)
        _load["t"] = now
    return _load["others"] + min(k, cpus) > cpus + 0.5


def _current_cpu() -> int | None:
    """The CPU the calling thread runs on (glibc's sched_getcpu), None where unknown."""
    global _sched_getcpu
    if _sched_getcpu is None:
        try:
            import ctypes

            f = ctypes.CDLL(None, use_errno=True).sched_getcpu
            f.restype = ctypes.c_int
            f.argtypes = []
            _sched_getcpu = f
        except (OSError, AttributeError):
            _sched_getcpu = False
    if _sched_getcpu is False:
        return None
    cpu = _sched_getcpu()
    return cpu if cpu >= 0 else None


_sched_getcpu: Any = None


def _place_team(k: int) -> None:
    """Hold the calling thread on its CPU and keep workers ``1..k-1`` off it (see above); a no-op
    when it is already so, when the thread may run on one CPU only, or off Linux. Errors (a
    mask the OS refuses) leave the placement to the OS."""
    tid = threading.get_native_id()
    if _placed.get("tid") == tid:
        return
    with _place_lock:
        try:
            _unplace_locked()
            allowed = os.sched_getaffinity(0)
            cpu = _current_cpu()
            if len(allowed) < 2 or cpu is None or cpu not in allowed:
                return
            if _cpus_busy(k, len(allowed)):  # (see LOAD_SAMPLE_S): let the workers float again
                _tls.unplaced = True  # (for the rest of this thread's scope)
                for w in _team:
                    if w.excluded is not None:
                        os.sched_setaffinity(w.tid, allowed)
                        w.excluded = None
                return
            os.sched_setaffinity(0, {cpu})
            _placed.update(tid=tid, mask=allowed)
            rest = allowed - {cpu}
            for w in _team[:k - 1]:
                if w.excluded != cpu:
                    os.sched_setaffinity(w.tid, rest)
                    w.excluded = cpu
        except OSError:
            pass


def _unplace() -> None:
    """Give the held thread (if any) its own mask back."""
    with _place_lock:
        _unplace_locked()


def _unplace_locked() -> None:
    tid = _placed.pop("tid", None)
    mask = _placed.pop("mask", None)
    if tid is not None:
        try:
            os.sched_setaffinity(0 if tid == threading.get_native_id() else tid, mask)
        except OSError:  # (the thread has ended)
            pass


_place_lock = threading.Lock()


def _forget_team_after_fork() -> None:
    # a forked child inherits the worker objects but not their threads: start afresh
    global _team, _team_lock, _scope_lock, _scope_depth, _gemm_split, _place_lock
    _team = []
    _placed.clear()
    _team_lock = threading.Lock()
    _place_lock = threading.Lock()
    _scope_lock = threading.Lock()
    _scope_depth = 0
    _gemm_split = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_team_after_fork)


def set_num_threads(n: int | None) -> int | None:
    """Threads kuiper-xp uses for GEMMs, copies and elementwise passes (None: the default, which
    is numpy's OpenBLAS thread count at the start of each forward pass, else 1 when numpy's BLAS
    is not OpenBLAS; ``$KUIPER_XP_NUM_THREADS`` sets it at import). Returns the previous setting,
    for restoring it."""
    global _explicit_threads
    old = _explicit_threads
    _explicit_threads = None if n is None else max(1, int(n))
    return old


def get_num_threads() -> int:
    """The thread count a forward pass started now would use."""
    if _scope_depth:
        return _scope_threads
    if _explicit_threads is not None:
        return _explicit_threads
    blas = _get_blas()
    return blas.get() if blas.ok else 1


_numba = None  # backends.numba_kernels while the optional compiled kernels are switched on


def use_numba(flag: bool = True) -> bool:
    """Switch the optional numba kernels (``backends.numba_kernels``: depthwise convolution,
    float32 GELU, SiLU, sigmoid and softmax, LayerNorm) on or off for the whole process; returns the previous setting. Off by default (``KUIPER_XP_NUMBA=1``
    switches them on at import); the numpy paths stay the reference. Raises ImportError naming
    the package when numba is not installed."""
    global _numba
    old = _numba is not None
    if flag and _numba is None:
        try:
            from . import numba_kernels
        except ImportError as e:
            raise ImportError(f"the optional numba kernels need numba (pip install numba): {e}") from e
        _numba = numba_kernels
    elif not flag:
        _numba = None
    return old


def numba_enabled() -> bool:
    return _numba is not None


_mkl = None  # a backends.mkl_kernels.MKL while the optional MKL paths are switched on


def use_mkl(flag: bool = True) -> bool:
    """Switch the optional MKL paths (``backends.mkl_kernels``: the 2-D GEMMs of linear layers,
    matmul and convolutions, on kuiper-xp's threads; erf and exp of the GELU, SiLU and sigmoid
    kernels) on or off for the whole process; returns the previous setting. Off by default
    (``KUIPER_XP_MKL=1`` switches them on at import); numpy's matmul and ufuncs stay the
    reference. Raises ImportError naming the package when MKL's library is not installed."""
    global _mkl
    old = _mkl is not None
    if flag and _mkl is None:
        from . import mkl_kernels

        try:
            _mkl = mkl_kernels.MKL()
        except ImportError as e:
            raise ImportError(f"the optional MKL paths need the mkl package (pip install mkl): {e}") from e
    elif not flag:
        _mkl = None
    return old


def mkl_enabled() -> bool:
    return _mkl is not None


def optional_paths() -> list[tuple[str, bool, bool, str]]:
    """The numpy backend's optional fast paths, as ``(name, installed, on, how)``: the numba
    kernels and the MKL products and vector math (off by default; ``how`` says how to get or
    switch one on)."""
    import importlib.util

    from . import mkl_kernels

    lib = mkl_kernels.find_library()  # (this Python's prefix, its base installation's, conda's)
    return [("numba kernels", importlib.util.find_spec("numba") is not None, numba_enabled(),
             "KUIPER_XP_NUMBA=1 switches it on; pip install -e '.[numba]'"),
            ("MKL products and vector math", lib is not None, mkl_enabled(),
             f"{'found at ' + lib + '; ' if lib else ''}KUIPER_XP_MKL=1 switches it on; pip install -e '.[mkl]'")]


def _mm(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``np.matmul(a, b, out=out)`` on the calling thread: through MKL when :func:`use_mkl` is on
    and the operands fit it (2-D, float32/float64), else numpy's."""
    if _mkl is not None and _mkl.matmul(a, b, out):
        return out
    return np.matmul(a, b, out=out)


class compute_scope:
    """Context manager around a forward pass: pins numpy's OpenBLAS to one thread and lets
    :func:`_parallel` and :func:`_gemm` split work over ``get_num_threads()`` threads of ours;
    restores the BLAS thread count on exit. Re-entrant and thread-safe (counted). With a
    :class:`BufferPool`, outputs made on this thread inside the scope come from that pool."""

    __slots__ = ("pool", "_saved_pool", "_es")

    def __init__(self, pool: BufferPool | None = None) -> None:
        self.pool = pool
        self._saved_pool = None

    def __enter__(self):
        global _scope_depth, _scope_saved, _scope_threads, _gemm_split
        tls = _tls
        self._saved_pool = getattr(tls, "pool", None)
        tls.pool = self.pool
        tls.depth = getattr(tls, "depth", 0) + 1
        # floating-point conditions are silent during the pass, as in torch (log(0), 0/0 in a
        # model's own arithmetic printed numpy RuntimeWarnings), and the ufunc buffer size is
        # set: one prepared numpy error state (np.errstate and np.setbufsize took 1.4 of a
        # one-operator call's 12.7 us)
        if _EXTOBJ is not None:
            self._es = _EXTOBJ_VAR.set(_EXTOBJ)
        else:
            self._es = np.errstate(all="ignore")
            self._es.__enter__()
            if UFUNC_BUFSIZE:
                np.setbufsize(UFUNC_BUFSIZE)
        with _scope_lock:
            if _scope_depth == 0:
                blas = _blas if _blas is not None else _get_blas()
                saved = blas.get() if blas.ok else 1
                threads = _explicit_threads if _explicit_threads is not None else (saved if blas.ok else 1)
                _scope_saved, _scope_threads = saved, max(1, threads)
                _gemm_split = blas.ok and _scope_threads > 1
                if blas.ok and saved != 1:  # (with one thread of ours too: a pass asked to run on
                    blas.set(1)             # one thread had OpenBLAS's workers woken every step)
            _scope_depth += 1
        return self

    def __exit__(self, *exc):
        global _scope_depth, _gemm_split
        tls = _tls
        tls.pool = self._saved_pool
        tls.depth -= 1
        if tls.depth == 0:
            tls.unplaced = False
            if _placed and _placed.get("tid") == threading.get_native_id():
                _unplace()  # this thread's call is over (another thread's scope may still run)
        if _EXTOBJ is not None:
            _EXTOBJ_VAR.reset(self._es)
        else:
            self._es.__exit__(None, None, None)
        with _scope_lock:
            _scope_depth -= 1
            if _scope_depth == 0:
                if _scope_saved != 1:
                    _get_blas().set(_scope_saved)
                _gemm_split = False
        return False


def _prepared_errstate() -> tuple[Any, Any]:
    """numpy's error-state context variable and the state a forward pass runs in (all floating
    point conditions ignored, the buffer size UFUNC_BUFSIZE), made once; (None, None) where this
    numpy keeps them elsewhere (then :class:`compute_scope` uses np.errstate and np.setbufsize)."""
    try:
        from numpy._core.umath import _extobj_contextvar, _make_extobj

        kw = {"all": "ignore"}
        if UFUNC_BUFSIZE:
            kw["bufsize"] = UFUNC_BUFSIZE
        return _extobj_contextvar, _make_extobj(**kw)
    except (ImportError, AttributeError, TypeError, ValueError):
        return None, None


_EXTOBJ_VAR, _EXTOBJ = _prepared_errstate()


def _threads_now() -> int:
    if _scope_depth:
        return _scope_threads
    return _explicit_threads if _explicit_threads is not None else 1


#: the hand-off time GEMM_SPLIT_MIN_MACS was tuned for: a job's round trip to a worker on the
#: EPYC VM
HANDOFF_REF_US = 20.0
#: GEMM_SPLIT_MIN_MACS's multiplier on this machine: its measured round trip over
#: HANDOFF_REF_US (1 to 8), set when the team is made
_gemm_split_scale = 1.0


def _noop(lo: int, hi: int) -> None:
    pass


def _calibrate_handoff(worker) -> None:
    """Set :data:`_gemm_split_scale` from the median round trip of an empty job to ``worker``.
    A halted vCPU of the AVX-512 Xeon VM takes ~70-90 us to wake (the EPYC VM's ~20): there a
    64x256x256 product took 148 us split over two threads against 77 on one, and products of
    up to ~16 M multiply-adds gained nothing from the split (the elementwise thresholds are
    left alone: raised alike, ResNet-18 at batch 8 took 206-222 ms instead of 187)."""
    global _gemm_split_scale
    times = []
    for _ in range(11):
        t0 = time.perf_counter()
        worker.start(_noop, 0, 1)
        worker.finish()
        times.append((time.perf_counter() - t0) * 1e6)
    _gemm_split_scale = min(8.0, max(1.0, sorted(times)[len(times) // 2] / HANDOFF_REF_US))


def _worth_splitting(work: int, share: float) -> int:
    """``work``, or 0 (one thread) when it is under PARALLEL_MIN_ELEMENTS times the calibrated
    hand-off scale over ``share`` (at least 1: unchanged where a hand-off is quick). For passes
    made of many short numpy calls (LayerNorm's blocks: ``share`` 2; the chunked activations: 4),
    where the second thread waits on the first's calls as much as it computes. 2 AMD EPYC (Zen
    3) threads whose idle vCPUs take ~70 us to wake (scale 4-5.5), one thread against two:
    LayerNorm over 196x384 (DeiT-S) 0.15-0.20 against 0.34-0.45 ms, over 128x768 (BERT-base)
    0.15-0.17 against 0.39-0.50, over 400x768 even; GELU over 150 K elements 0.67 against 0.78
    (medians of 6), 300 K 1.47 / 1.33 (split), 450 K even."""
    return work if work >= PARALLEL_MIN_ELEMENTS * max(1.0, _gemm_split_scale / share) else 0


def _tap_work(work: int, count: int, chunk: int, per_unit: int) -> int:
    """``work`` for :func:`_parallel` over ``count`` units taken ``chunk`` at a time, each unit
    ``per_unit`` elements of a tap pass; 0 (one thread) where a thread's share would make passes
    shorter than DEPTHWISE_PASS_SPLIT_MIN elements."""
    share = min(chunk, -(-count // max(1, _threads_now()))) * per_unit
    return work if share >= DEPTHWISE_PASS_SPLIT_MIN else 0


def _parallel(fn, n: int, work: int) -> None:
    """Call ``fn(lo, hi)`` over ``[0, n)`` split into up to ``_threads_now()`` chunks (the caller
    runs the first); ``work`` (elements touched) below PARALLEL_MIN_ELEMENTS, or a call made
    while the team is busy (nested, or from another thread), runs in one call."""
    k = min(_threads_now(), n)
    if k <= 1 or work < PARALLEL_MIN_ELEMENTS or not _team_lock.acquire(blocking=False):
        fn(0, n)
        return
    try:
        new_team = not _team
        while len(_team) < k - 1:
            _team.append(_Worker(len(_team) + 1))
        if PLACE_TEAM and _HAS_AFFINITY and getattr(_tls, "depth", 0) and not getattr(_tls, "unplaced", False):
            # (inside this thread's scope, not left to the OS for it)
            _place_team(k)
        if new_team:  # (once the workers are placed, as every later job finds them)
            _calibrate_handoff(_team[0])
        bounds = [(n * i) // k for i in range(k + 1)]
        for i in range(1, k):
            _team[i - 1].start(fn, bounds[i], bounds[i + 1])
        error = None
        try:
            fn(bounds[0], bounds[1])
        except BaseException as e:
            error = e
        for i in range(1, k):
            e = _team[i - 1].finish()
            error = error or e
        if error is not None:
            raise error
    finally:
        _team_lock.release()


#: GEMMs of fewer multiply-adds than this are not split over threads (~40 us on one core)
GEMM_SPLIT_MIN_MACS = 1 << 21
#: a split over columns gives each thread at least this many (else rows, at least a quarter as many)
GEMM_SPLIT_MIN_COLUMNS = 64
#: columns are split in blocks of this many (64 bytes of float32)
GEMM_SPLIT_STEP = 16


def _gemm_worth_splitting(macs: int) -> bool:
    """Whether a product of ``macs`` multiply-adds pays for a hand-off to the team (the
    threshold scaled by the calibrated hand-off, see :func:`_calibrate_handoff`)."""
    return macs >= GEMM_SPLIT_MIN_MACS * _gemm_split_scale


def _gemm(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``np.matmul(a, b, out=out)``, split over our threads inside a compute scope (BLAS is on
    one thread there): over the stack axis of a batched product with enough matrices, else over
    the longer of the columns and the rows of ``out`` (each thread packing all of a tall ``a``
    for half the columns measured 2.7x slower than splitting its rows). Slices keep unit inner strides, so
    every piece is still one BLAS call."""
    k = _threads_now() if _gemm_split else 1
    m, nn = out.shape[-2], out.shape[-1]
    macs = out.size * a.shape[-1]
    if k <= 1 or not _gemm_worth_splitting(macs):
        # (outside a compute scope numpy's BLAS keeps its threads: MKL, sequential, would not)
        return _mm(a, b, out) if _scope_depth else np.matmul(a, b, out=out)
    min_rows = max(1, GEMM_SPLIT_MIN_COLUMNS // 4)
    if out.ndim == 3 and out.shape[0] >= 2 * k:
        def part(lo, hi):
            np.matmul(a[lo:hi] if a.ndim == 3 and a.shape[0] > 1 else a,
                      b[lo:hi] if b.ndim == 3 and b.shape[0] > 1 else b, out=out[lo:hi])
        _parallel(part, out.shape[0], 1 << 62)
    elif nn >= GEMM_SPLIT_MIN_COLUMNS * k and (nn >= m or m < min_rows * k):
        step = GEMM_SPLIT_STEP

        def part(lo, hi):
            lo, hi = lo * step, min(nn, hi * step)
            _mm(a, b[..., lo:hi], out[..., lo:hi])
        _parallel(part, -(-nn // step), 1 << 62)
    elif m >= min_rows * k:
        def part(lo, hi):
            _mm(a[..., lo:hi, :], b, out[..., lo:hi, :])
        _parallel(part, m, 1 << 62)
    else:
        _mm(a, b, out)
    return out


class BufferPool:
    """Output buffers of one graph, handed back by the runtime when it drops a value and reused
    for later outputs of the same size (in the same call or the next): large fresh arrays cost a
    page fault per 4 KiB on first touch, which measured ~10 ms of a 30 ms max-pool at batch 8. A
    buffer is taken back only when nothing else refers to it (no view, no other slot): the
    reference counts are compared with those measured on a private probe at construction, so a
    Python whose counting differs simply recycles nothing. Arrays under ``MIN_BYTES`` are left
    to malloc. ``max_bytes`` caps what is kept idle; ``clear()`` frees it."""

    MIN_BYTES = 1 << 18
    GRAIN = 1 << 12

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes = int(max_bytes)
        self.idle_bytes = 0
        self._free: dict[int, list[np.ndarray]] = {}
        self._ours: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._lent: list[np.ndarray] = []  # buffers behind results handed to the caller
        self._lock = threading.Lock()
        self._expect = self._calibrate()
        probe = [np.empty(8, dtype=np.uint8)]
        self._lent_expect = self._lent_count(probe, 0)

    def _calibrate(self):
        view = np.empty(64, dtype=np.uint8)[:8].view(np.float32).reshape(2)
        return self._probe(view)  # the same call shape as give(v) from the runtime

    def _probe(self, a):
        counts = self._sole_counts(a)
        return counts

    def empty(self, shape, dtype) -> np.ndarray:
        dt = np.dtype(dtype)
        n = int(math.prod(shape)) * dt.itemsize
        if n < self.MIN_BYTES:
            return np.empty(shape, dtype=dt)
        key = -(-n // self.GRAIN) * self.GRAIN
        buf = None
        with self._lock:
            # best fit: the smallest idle buffer of at least the size, within 2x of it
            fit = min((k for k, lst in self._free.items() if lst and key <= k <= 2 * key), default=None)
            if fit is not None:
                buf = self._free[fit].pop()
                self.idle_bytes -= fit
        if buf is None:
            buf = np.empty(key, dtype=np.uint8)
            self._ours[id(buf)] = buf
        return buf[:n].view(dt).reshape(shape)

    @staticmethod
    def _sole_counts(a: np.ndarray):
        buf = a.base
        if buf is None:
            return None
        return sys.getrefcount(a), sys.getrefcount(buf)

    def give(self, a: Any) -> None:
        """Take back ``a``'s buffer if it is one of ours and the caller's one local reference
        to ``a`` is the only user of the buffer (call as ``v = slot; slot = None; give(v)``)."""
        if type(a) is not np.ndarray:
            return
        counts = self._sole_counts(a)
        if counts is None or counts != self._expect:
            return
        buf = a.base
        # (the pool's buffers are bytes: a view of anything else is not ours, known without the
        # weak dictionary's lookup, a third of this call)
        if type(buf) is not np.ndarray or buf.dtype != np.uint8 or self._ours.get(id(buf)) is not buf:
            return
        key = buf.nbytes
        with self._lock:
            if self.idle_bytes + key > self.max_bytes:
                return
            self._free.setdefault(key, []).append(buf)
            self.idle_bytes += key

    @staticmethod
    def _lent_count(lst: list, i: int) -> int:
        buf = lst[i]
        return sys.getrefcount(buf)

    def lend(self, values) -> None:
        """Note the buffers behind results handed to the caller (arrays of ours, or views of
        them): :meth:`reclaim` takes each back once the caller has dropped every array on it."""
        flat, todo = [], list(values)
        while todo:  # results may be (nested) tuples/lists of arrays: prim::TupleConstruct
            v = todo.pop()
            if isinstance(v, (tuple, list)):
                todo.extend(v)
            elif type(v) is np.ndarray and v.base is not None:
                flat.append(v)  # (the pool hands out views: an array owning its data is not ours)
        if not flat:
            return
        with self._lock:
            known = {id(b) for b in self._lent}
            for v in flat:
                buf = v.base
                while isinstance(buf, np.ndarray) and buf.base is not None:
                    buf = buf.base
                if buf is not None and self._ours.get(id(buf)) is buf and id(buf) not in known:
                    self._lent.append(buf)
                    known.add(id(buf))

    def reclaim(self) -> None:
        """Take back lent buffers nothing refers to any more (the caller dropped the results of
        an earlier call): the next outputs of their size reuse them instead of fresh pages."""
        if not self._lent:
            return
        with self._lock:
            keep = []
            for i in range(len(self._lent)):
                if self._lent_count(self._lent, i) != self._lent_expect:
                    keep.append(self._lent[i])
                    continue
                buf = self._lent[i]
                if self.idle_bytes + buf.nbytes <= self.max_bytes:
                    self._free.setdefault(buf.nbytes, []).append(buf)
                    self.idle_bytes += buf.nbytes
            self._lent = keep

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self._lent = []  # forgotten, never reused (the caller may still hold them)
            self.idle_bytes = 0


def _out(shape, dtype) -> np.ndarray:
    """A fresh output array: the destination :func:`set_destination` named when it has this
    shape and dtype (once), else from the calling thread's graph pool inside a compute scope."""
    dest = getattr(_tls, "dest", None)
    if dest is not None and dest.shape == tuple(shape) and dest.dtype == dtype:
        _tls.dest = None
        return dest
    return _pooled(shape, dtype)


def _small_out(x: np.ndarray) -> np.ndarray:
    """A fresh array like the small C-contiguous ``x`` (under TINY_ELEMENTS: below any pooled
    buffer's size), or the destination :func:`set_destination` named for it (a concatenation's
    slot); :func:`_out` without its pool lookup."""
    dest = getattr(_tls, "dest", None)
    if dest is not None and dest.shape == x.shape and dest.dtype == x.dtype:
        _tls.dest = None
        return dest
    return np.empty_like(x)


def _pooled(shape, dtype) -> np.ndarray:
    """A fresh array from the calling thread's graph pool (or numpy), never the destination
    :func:`set_destination` named: for outputs returned as a view in another layout."""
    pool = getattr(_tls, "pool", None)
    if pool is None:
        return np.empty(shape, dtype=dtype)
    return pool.empty(shape, dtype)


def _workspace(shape: tuple[int, ...], dtype: Any, slot: int = 0) -> np.ndarray:
    """A per-thread scratch array (reused across calls; never returned to callers)."""
    dt = np.dtype(dtype)
    n = math.prod(shape) * dt.itemsize  # (np.prod on a tuple: ~4 us of a 6 us call)
    bufs = getattr(_tls, "bufs", None)
    if bufs is None:
        bufs = _tls.bufs = {}
        with _workspaces_lock:
            _workspaces.append(bufs)
    buf = bufs.get(slot)
    if buf is None or buf.nbytes < n:
        buf = np.empty(max(n, 64), dtype=np.uint8)
        bufs[slot] = buf
    return buf[:n].view(dt).reshape(shape)


def _operand_workspace(shape: tuple[int, ...], dtype: Any, slot: int = 0) -> np.ndarray:
    """:func:`_workspace` for the right-hand operand of a GEMM (im2col patches): when a row of
    ``shape[-1]`` elements is a multiple of 256 bytes, the rows are spaced 64 bytes further
    apart (the result is a view with that leading dimension). OpenBLAS packs such an operand
    15-25% slower, its rows landing in the same cache sets (2 AVX-512 Xeon cores, one thread:
    (32, 289) x (289, 3136) 0.72 ms against 0.53 with rows 3152 apart, (64, 577) x (577, 3136)
    1.83 against 1.62, (16, 145) x (145, 8192) 0.47 against 0.41; no change when the width is
    not such a multiple, as 784 or 196)."""
    dt = np.dtype(dtype)
    width = shape[-1]
    if (width * dt.itemsize) % OPERAND_ALIASING_BYTES or width * dt.itemsize < OPERAND_ALIASING_BYTES:
        return _workspace(shape, dt, slot)
    ld = width + OPERAND_ROW_PAD_BYTES // dt.itemsize
    return _workspace(tuple(shape[:-1]) + (ld,), dt, slot)[..., :width]


#: GEMM operand rows of a multiple of this many bytes are spaced further apart by
#: :func:`_operand_workspace`, by OPERAND_ROW_PAD_BYTES
OPERAND_ALIASING_BYTES = 256
OPERAND_ROW_PAD_BYTES = 64


_workspaces: list[dict] = []  # every thread's scratch arrays, for release_workspaces()
_workspaces_lock = threading.Lock()


def release_workspaces() -> int:
    """Drop the scratch arrays of every thread (Winograd tiles, im2col patches: up to a few
    hundred MiB after a large model's first call); returns their bytes. A pass running now keeps
    what it holds; the next one allocates afresh."""
    freed = 0
    with _workspaces_lock:
        for bufs in _workspaces:
            for key in list(bufs):
                buf = bufs.pop(key, None)
                freed += 0 if buf is None else buf.nbytes
    return freed


def _view(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``a`` reshaped without a copy (raises instead of silently copying): ``reshape(copy=False)``
    on numpy >= 2.1 (setting ``.shape`` warns from numpy 2.5), the ``.shape`` setter before."""
    if _RESHAPE_NO_COPY:
        return np.reshape(a, shape, copy=False)
    v = a.view()
    v.shape = shape
    return v


_RESHAPE_NO_COPY = tuple(int(p) for p in np.__version__.split(".")[:2]) >= (2, 1)


def _copy_channels(dst: np.ndarray, src: np.ndarray, axis: int = 0) -> None:
    """``dst[...] = src`` split over ``axis`` on the thread pool."""
    def part(lo, hi):
        key = (slice(None),) * axis + (slice(lo, hi),)
        np.copyto(dst[key], src[key])
    _parallel(part, dst.shape[axis], dst.size)


def _phase_copies(ph: np.ndarray, img: np.ndarray, d: int, to_phases: bool) -> None:
    """Between ``ph`` (N, d, d, C, H/d, W/d), the polyphase sub-images, and ``img`` (N, C, H/d, d,
    W/d, d), the image: one strided copy per phase and block of channels (3x faster than one copy
    of the 6-D transposed view, whose innermost axis would be the phase's)."""
    def part(lo, hi):
        for r in range(d):
            for s in range(d):
                if to_phases:
                    np.copyto(ph[:, r, s, lo:hi], img[:, lo:hi, :, r, :, s])
                else:
                    np.copyto(img[:, lo:hi, :, r, :, s], ph[:, r, s, lo:hi])
    _parallel(part, ph.shape[3], ph.size)


def _fill_phase(dst: np.ndarray, x: np.ndarray, p: int, q: int, sh: int, sw: int, t: int, l: int,
                hh: int, ww: int) -> None:
    """Fill stride phase (p, q) of the zero-padded input: phase rows/cols r map to padded rows
    sh*r + p, i.e. input rows sh*r + p - t (columns likewise); outside the input is zero."""
    hq, wq = dst.shape[-2:]
    r_a = max(0, -(-(t - p) // sh))
    r_b = min(hq, -(-(t + hh - p) // sh))
    c_a = max(0, -(-(l - q) // sw))
    c_b = min(wq, -(-(l + ww - q) // sw))
    dst[:, :, :r_a] = 0
    dst[:, :, max(r_a, r_b):] = 0
    dst[:, :, r_a:r_b, :c_a] = 0
    dst[:, :, r_a:r_b, max(c_a, c_b):] = 0
    if r_b > r_a and c_b > c_a:
        dst[:, :, r_a:r_b, c_a:c_b] = x[:, :, sh * r_a + p - t: sh * (r_b - 1) + p - t + 1: sh,
                                        sw * c_a + q - l: sw * (c_b - 1) + q - l + 1: sw]


def _pad_into(dst: np.ndarray, src: np.ndarray, starts: tuple[int, ...]) -> None:
    """``src`` written into ``dst`` at offsets ``starts`` along their last ``len(starts)`` axes,
    zeros around it (a zero-padded copy into a workspace): the slabs before and after ``src``
    along each axis in turn, inside those already covered, then the copy."""
    lead = dst.ndim - len(starts)
    inner: tuple = (slice(None),) * lead
    for ax, s0 in enumerate(starts):
        s1 = s0 + src.shape[lead + ax]
        if s0 > 0:
            dst[inner + (slice(0, s0),)] = 0
        if s1 < dst.shape[lead + ax]:
            dst[inner + (slice(s1, None),)] = 0
        inner += (slice(s0, s1),)
    dst[inner] = src


def _pad_zeros(x: np.ndarray, pads) -> np.ndarray:
    (t, b), (l, r) = pads
    if not (t or b or l or r):
        return x
    n, c, h, w = x.shape
    out = _out((n, c, h + t + b, w + l + r), x.dtype)

    def part(lo, hi):
        _pad_into(out.reshape(n * c, h + t + b, w + l + r)[lo:hi], x.reshape(n * c, h, w)[lo:hi], (t, l))
    _parallel(part, n * c, out.size)
    return out


_NP_MODES = {"zeros": "constant", "constant": "constant", "reflect": "reflect", "replicate": "edge",
             "circular": "wrap"}


def pad(x: np.ndarray, pads, mode: str = "zeros", value: float = 0.0) -> np.ndarray:
    """Mirror of ``functional.pad`` (torch's reflect/replicate/circular are numpy's
    reflect/edge/wrap)."""
    if not any(lo or hi for lo, hi in pads):
        return x
    width = [(0, 0)] * (x.ndim - len(pads)) + [tuple(p) for p in pads]
    m = _NP_MODES[mode]
    if m == "constant":
        if value == 0 and x.ndim == 4 and len(pads) == 2:
            return _pad_zeros(x, pads)
        return np.pad(x, width, mode="constant", constant_values=value)
    return np.pad(x, width, mode=m)


# -- elementwise activations -------------------------------------------------------------------
# numpy's clip ufunc called directly. For float arrays it is the fast way to bound them on one
# side too: np.maximum(x, 0) with a scalar runs a loop that is not vectorised here (0.5 ns per
# element on 2 Zen 3 cores, numpy 2.4), clip(x, 0, inf) 0.17-0.24; np.clip's Python wrapper adds
# about 3 us per call (0.35 ns per element on 16 Ki chunks). Same values, NaN propagated.
try:
    from numpy._core.umath import clip as _uclip
except ImportError:  # numpy 1
    from numpy.core.umath import clip as _uclip
_INF = math.inf
#: float32 and float64 as dtype objects: ``x.dtype in _FLOATS`` compares dtypes (96 ns), where a
#: tuple of the scalar types converted each one first (340 ns, a few of them in every small call)
_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

#: elements per chunk of the chunked elementwise kernels: the chunk and its temporaries stay in
#: cache, so each kernel costs about one pass over memory however many ufunc steps it takes
#: (128 Ki measured best on 2 Zen 3 threads: GELU on 400x3072 3.0 ms against 3.5 at 64 Ki and
#: 5.1 at 32 Ki, where the per-call overheads of the 27 ufunc steps (17 now) take over;
#: SiLU/sigmoid even; 2 threads of an AMD EPYC with the 17-step GELU: 1.34 ms at 128 Ki, 1.26 at
#: 256 Ki, 1.56 at 64 Ki, 1.95 at 32 Ki; on one thread 64 Ki and 32 Ki are best, 2.5 against 3.0)
UNARY_CHUNK = 1 << 17
#: the activations :func:`unary` and :func:`activation_inplace` compute (float32/float64 arrays)
UNARY_ACTIVATIONS = frozenset({"sigmoid", "silu", "hardswish", "hardsigmoid", "gelu", "gelu_tanh", "mish",
                               "tanh"})
_SQRT1_2 = 0.70710678118654752440
_SQRT_2_PI = 0.79788456080286535588
# logit(Phi(x)) ~ x P(x^2) on [0, 5.5], P's coefficients from the constant term up: a weighted
# least-squares fit against scipy.special.ndtr (float64), reweighted towards the largest error
# of x Phi(x) relative to max(1, |x|); float32 GELU built on it is within 1.6e-7 of torch's
# float64 GELU relative to max(1, |x|) (the erf form: 2.6e-7), 5.9e-7 absolute on [-10, 10]
_GELU_G = (1.595768985262065, 0.07266782185701863, -6.59086840199152e-05, -0.00011055616166297343,
           7.946266436675246e-06, -2.672962779007414e-07, 3.6187844204553907e-09)
_GELU_NEG_G = tuple(-c for c in _GELU_G)


def _exp_inplace(a):
    """``np.exp(a, out=a)``, by MKL's vector math when :func:`use_mkl` is on."""
    if _mkl is None or not _mkl.unary("exp", a, a):
        np.exp(a, out=a)


def _k_sigmoid(s, d, tmp):
    np.negative(s, out=d)
    _exp_inplace(d)  # overflows to inf below -log(max): 1 / inf = 0, as torch gives
    d += 1
    np.reciprocal(d, out=d)


def _k_silu(s, d, tmp):
    t = tmp(0)
    np.negative(s, out=t)
    _exp_inplace(t)
    t += 1
    np.divide(s, t, out=d)  # x / (1 + exp(-x)): -inf / inf is NaN, as torch's -inf * 0


def _k_tanh(s, d, tmp):
    np.tanh(s, out=d)


def _k_hardswish(s, d, tmp):
    t = tmp(0)
    np.add(s, 3, out=t)
    _uclip(t, 0.0, 6.0, out=t)  # clip propagates NaN
    np.multiply(s, t, out=d)
    np.divide(d, 6, out=d)


def _k_hardsigmoid(s, d, tmp):
    np.add(s, 3, out=d)
    _uclip(d, 0.0, 6.0, out=d)
    np.divide(d, 6, out=d)


def _k_gelu_tanh(s, d, tmp):
    if s.dtype == np.float32 and _use_chords():
        _k_chords("gelu_tanh", s, d, tmp)
        return
    t = tmp(0)
    np.multiply(s, s, out=t)
    t *= s
    t *= 0.044715
    t += s
    t *= _SQRT_2_PI
    np.tanh(t, out=t)
    t += 1
    np.multiply(s, 0.5, out=d)
    d *= t


@functools.lru_cache(maxsize=None)
def _numpy_avx512() -> bool:
    """Whether numpy's own SIMD loops run with AVX-512F here (its float32 ``exp`` 8 lanes wider)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as feats
    except ImportError:  # (numpy 1.x)
        from numpy.core._multiarray_umath import __cpu_features__ as feats  # type: ignore[no-redef]
    return bool(feats.get("AVX512F"))


#: float32 GELU (both forms) by a table of chords (:func:`_chord_table`): None = where numpy's
#: loops lack AVX-512 (its float32 ``exp`` then costs ~1.3-2 ns an element on Zen 3, ``tanh``
#: ~3, and a numpy pass ~0.1-0.2); True / False force it on / off. (tanh itself by a table, its
#: input clipped first: 1.9-2.1 ms against np.tanh's 1.7 over (400, 3072) on two threads.)
CHORD_TABLES: bool | None = None
#: the tables' knots are CHORD_STEP apart
CHORD_STEP = 1.0 / 1024
_chord_tabs: dict = {}
_CHORD_SLOT = 48


def _phi64(v: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + expr_erf(v * _SQRT1_2))  # (float64: Cody's erf, within 1e-16)


def _phi_tanh64(v: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(_SQRT_2_PI * (v + 0.044715 * v * v * v)))


#: name -> (float64 function g of an array with GELU(x) = x g(x), edge E): the tables hold chords
#: of g, so that GELU = x (a + b x) keeps its relative accuracy near 0 (chords of x g(x) itself
#: had a slope of g(h) = 0.5 + 0.4 h through 0: 8e-4 relative error for |x| < 1e-3, which six
#: unnormalised conv + GELU layers of a wav2vec2 feature encoder grew to 3e-5 of its output).
#: g is 0 left of -E - h/2 (|x g(x)| < 6e-9 there) and 1 from E on (x g(x) rounds to x in
#: float32 from 6, the tanh form alike); -inf gives -inf * 0 = NaN, torch's -inf * 0, and +inf
#: gives +inf
_CHORD_SPECS = {
    "gelu": (_phi64, 6.0),
    "gelu_tanh": (_phi_tanh64, 6.0),
}


def _chord_table(name: str) -> tuple:
    """``(a, b, n, scale, offset, lo, hi)`` for :data:`_CHORD_SPECS` ``name``: piece i (1..n)
    is the chord ``a[i] + b[i] x`` of g (float64, kept as two float32 tables) between knots ``-E
    + (i - 1) h`` and ``-E + i h`` (h = CHORD_STEP); piece 0 (x below -E - h/2) is 0, piece n +
    1 (x from E on) is 1. x is clipped to [lo, hi] = [-E - h/2, E] before the lookup and ``x *
    scale + offset`` is then in [0.5, n + 1]. A chord is within h^2 / 8 * max|g''| of g (3e-8,
    relative to x times that in GELU); with float32 rounding, GELU is within 1.9e-7 of max(1,
    |x|) of torch's float64 GELU over [-8, 8], and within 4e-7 of it relatively for |x| < 1."""
    got = _chord_tabs.get(name)
    if got is None:
        fn, edge = _CHORD_SPECS[name]
        h = CHORD_STEP
        n = int(round(2 * edge / h))
        xs = -edge + h * np.arange(n + 1, dtype=np.float64)  # (h a power of two: exact knots)
        g = fn(xs)
        b = np.zeros(n + 2, np.float64)
        a = np.zeros(n + 2, np.float64)
        b[1:n + 1] = (g[1:] - g[:-1]) / h
        a[1:n + 1] = g[:-1] - b[1:n + 1] * xs[:-1]
        a[n + 1] = 1.0
        got = _chord_tabs[name] = (a.astype(np.float32), b.astype(np.float32), n, 1.0 / h, edge / h + 1.0,
                                   -edge - h / 2, edge)
    return got


def _use_chords() -> bool:
    if CHORD_TABLES is not None:
        return CHORD_TABLES
    return not _numpy_avx512()


def _k_chords(name, s, d, tmp):
    """float32 ``name`` = x g(x) by its chord tables of g in 10 passes, two of them gathers (see
    _chord_table): the piece's index as int32, then widened to int64 (``take`` converts int32
    indices itself, a hidden pass that cost more; float32 to int64 has no vector instruction
    under AVX2: 0.75 ns an element against 0.21 + 0.29 through int32, the kernel 0.75-0.9 of its
    time over 64 Ki elements on one Zen 3 thread), then b and a each from its own table, so that
    the products read contiguous arrays
    (one gather of (a, b) pairs as float64 left two strided passes: 0.75-0.8 ns an element
    each against 0.15-0.3; the whole 0.65-0.85 of that form's time over 600 K elements on one
    Zen 3 thread, the same values). 2 Zen 3 threads, the chords of GELU itself (7 passes)
    against the polynomial form: 0.85-0.87 of its time over (400, 3072), (3136, 384), (1, 256,
    56, 56) and (8, 197, 3072); the tanh form 0.78-0.92 of its np.tanh form's. NaN stays NaN
    through the clip, takes piece 0 (its cast is out of range, and ``take`` clips) and gives 0 *
    NaN."""
    a, b, n, scale, offset, lo, hi = _chord_table(name)
    xc, t = tmp(0), tmp(1)
    _uclip(s, lo, hi, out=xc)
    np.multiply(xc, scale, out=t)
    t += offset
    i32 = _workspace((s.size,), np.int32, slot=_CHORD_SLOT + 1)
    np.copyto(i32, t, casting="unsafe")  # t >= 0.5: truncation is the floor
    idx = _workspace((s.size,), np.int64, slot=_CHORD_SLOT)
    np.copyto(idx, i32)
    np.take(b, idx, out=t, mode="clip")
    t *= xc
    np.take(a, idx, out=xc, mode="clip")
    t += xc
    np.multiply(s, t, out=d)


def _k_gelu(s, d, tmp):
    if _mkl is not None:  # x (1 + erf(x / sqrt 2)) / 2 with MKL's erf: 4 passes and one call
        t = tmp(0)
        np.multiply(s, _SQRT1_2, out=t)
        if _mkl.unary("erf", t, t):
            t += 1
            t *= s  # -inf: 0 * -inf is NaN, as torch gives
            np.multiply(t, 0.5, out=d)
            return
    if s.dtype == np.float32 and _use_chords():
        _k_chords("gelu", s, d, tmp)
        return
    if s.dtype != np.float32:
        e = expr_erf(s * _SQRT1_2)
        e += 1
        np.multiply(s, 0.5, out=d)
        d *= e
        return
    # x Phi(x) = x / (1 + exp(-g(x))), g = logit(Phi) fitted as x P(x^2) (degree 6, _GELU_G):
    # 17 passes against the 27 of the erf form, and np.exp has SIMD loops under AVX2 as under
    # AVX-512 (np.tanh in float32 only under the latter). No clip: g rises monotonically past the
    # fit, so exp overflows to inf below -8 (x / inf = -0) and underflows to 0 above (x);
    # -inf gives -inf / inf = NaN, as torch's -inf * 0
    x2, p = tmp(0), tmp(1)
    np.multiply(s, s, out=x2)
    np.multiply(x2, _GELU_NEG_G[6], out=p)
    p += _GELU_NEG_G[5]
    for c in _GELU_NEG_G[4::-1]:
        p *= x2
        p += c
    p *= s
    _exp_inplace(p)
    p += 1
    np.divide(s, p, out=d)


def _k_mish(s, d, tmp):
    # x * n (n + 2) / (n (n + 2) + 2), n = exp(min(x, 20)): tanh(softplus(x)) from one exp (see
    # kuiper_xp.layers.activation.Mish)
    n, p = tmp(0), tmp(1)
    _uclip(s, -_INF, 20.0, out=n)
    np.exp(n, out=n)
    np.add(n, 2.0, out=p)
    p *= n
    np.add(p, 2.0, out=n)
    p /= n
    np.multiply(s, p, out=d)


_KERNELS = {"sigmoid": _k_sigmoid, "silu": _k_silu, "hardswish": _k_hardswish,
            "hardsigmoid": _k_hardsigmoid, "gelu": _k_gelu, "gelu_tanh": _k_gelu_tanh, "mish": _k_mish,
            "tanh": _k_tanh}


def _memory_order(x: np.ndarray):
    """``(perm, inverse)`` such that ``x.transpose(perm)`` lists x's axes by decreasing stride
    (C order when x is a permuted view of a contiguous array)."""
    perm = sorted(range(x.ndim), key=lambda a: -abs(x.strides[a]))
    inv = [0] * x.ndim
    for i, a in enumerate(perm):
        inv[a] = i
    return perm, inv


_N_TEMPS = {"sigmoid": 0, "silu": 1, "hardswish": 1, "hardsigmoid": 0, "gelu": 2, "gelu_tanh": 2, "mish": 2,
            "tanh": 0}
#: weights of the kernels' size against PARALLEL_MIN_ELEMENTS when deciding whether to split a
#: map over the threads: the transcendental ones pay from 128 Ki elements on (measured on 2 Zen 3
#: threads: GELU at 200 Ki 0.77 -> 0.62 ms, at 100 Ki 0.37 -> 0.44; smaller pieces lose more to
#: the GIL hand-offs between their many short ufunc calls than the second thread gives)
_COST = {"sigmoid": 2, "silu": 2, "hardswish": 1, "hardsigmoid": 1, "gelu": 2, "gelu_tanh": 2, "mish": 2,
         "tanh": 2}


def _row_block(rows: int, width: int, work: int) -> int:
    """Rows per block for a pass over ``rows`` rows of ``width`` elements costing ``work``:
    about NORM_BLOCK_ELEMENTS per block, and when the pass is split over the threads, the same
    number of blocks for each (3 blocks on 2 threads left one thread doing two thirds: ViT-B's
    400x768 LayerNorm took as long on two threads as on one)."""
    blocks = -(-rows // max(1, NORM_BLOCK_ELEMENTS // width))
    k = _threads_now()
    if k > 1 and work >= PARALLEL_MIN_ELEMENTS and rows >= k:
        blocks = -(-blocks // k) * k
    return -(-rows // blocks)


def _chunk_step(n: int, work: int, chunk: int = 0) -> int:
    """Chunk length for a flat pass over ``n`` elements costing ``work``: at most ``chunk``
    (0: UNARY_CHUNK), and when the pass is split over the threads, the same number of equal
    chunks for each (a ViT-Tiny GELU map of 151 Ki elements was one chunk of 128 Ki and one of
    23 Ki, or none split at all: one thread did nearly everything)."""
    chunk = chunk or UNARY_CHUNK
    k = _threads_now()
    if k <= 1 or work < PARALLEL_MIN_ELEMENTS or n < 2 * k:
        return chunk
    per_thread = -(-n // (chunk * k))  # chunks each
    return -(-n // (per_thread * k))


def _run_unary(name: str, src: np.ndarray, dst: np.ndarray) -> None:
    """Kernel ``name`` over flat C-contiguous ``src``/``dst`` (may be the same array) in chunks
    of UNARY_CHUNK elements, with per-thread chunk-sized temporaries."""
    n = src.size
    compiled = _numba.UNARY.get(name) if _numba is not None and src.dtype == np.float32 else None
    if compiled is not None:  # the optional numba kernel: one pass
        step = _chunk_step(n, n)

        def run(c0, c1):
            compiled(src[c0 * step: c1 * step], dst[c0 * step: c1 * step])
        _parallel(run, -(-n // step), n)
        return
    _run_kernel(_KERNELS[name], _N_TEMPS[name], n * _COST[name], src, dst)


#: arrays of at most this many elements skip the chunking and threading machinery (its ~10 us
#: per call is most of the cost of the 1x1 convolutions and activations of squeeze-and-excite
#: blocks, which run on (1, C, 1, 1) maps)
TINY_ELEMENTS = 4096


def _silent():
    """A context silencing floating-point warnings: nothing to do on a thread that is silent
    already (inside a compute scope, or one of the team's workers); np.errstate elsewhere. (Its
    ~2 us a call was a fifth of a small activation's time.)"""
    if getattr(_tls, "depth", 0) or getattr(_tls, "worker", False):
        return _ALREADY_SILENT
    return np.errstate(all="ignore")


class _AlreadySilent:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_ALREADY_SILENT = _AlreadySilent()


def _run_kernel(kernel, n_tmp: int, work: int, src: np.ndarray, dst: np.ndarray) -> None:
    """``kernel(src_chunk, dst_chunk, tmp)`` over flat C-contiguous ``src``/``dst`` (may be the
    same array) in chunks of at most UNARY_CHUNK elements split over the threads when ``work``
    is worth it; ``tmp(k)`` is the k-th of ``n_tmp`` per-thread chunk-sized temporaries."""
    n = src.size
    dt = src.dtype
    if n <= TINY_ELEMENTS:  # (an SE block's few hundred channels: the chunk machinery is the cost)
        tmps = [np.empty(n, dt) for _ in range(n_tmp)]
        with _silent():
            kernel(src, dst, tmps.__getitem__)
        return
    work = _worth_splitting(work, 4)
    step = _chunk_step(n, work)

    def part(c0, c1):
        lo, hi = c0 * step, min(n, c1 * step)
        bufs = [_workspace((step,), dt, slot=40 + k) for k in range(n_tmp)]
        full = bufs.__getitem__
        with _silent():
            for i in range(lo, hi, step):
                j = min(hi, i + step)
                if j - i == step:
                    kernel(src[i:j], dst[i:j], full)
                else:
                    kernel(src[i:j], dst[i:j], lambda k, m=j - i: bufs[k][:m])
    _parallel(part, -(-n // step), work)


def _fresh_like(x: np.ndarray, fill) -> np.ndarray:
    """A fresh pooled array laid out like ``x`` (a permuted view gives a permuted result, as
    torch's elementwise ops do), written by ``fill(src_flat, dst_flat)`` in memory order."""
    if x.flags.c_contiguous:  # (most calls: no axes to sort; ~4 us of a tiny map's ~10)
        out = _out(x.shape, x.dtype)
        fill(x.reshape(-1), out.reshape(-1))
        return out
    perm, inv = _memory_order(x)
    xt = x.transpose(perm)
    # (not _out: a concatenation's slot of the permuted shape, when that equals the result's
    # (square maps), would hold this transposed view, which finishing the concatenation rewrites)
    out = _pooled(xt.shape, x.dtype)
    if xt.flags.c_contiguous:
        fill(xt.reshape(-1), out.reshape(-1))
        return out.transpose(inv)
    # a strided source (a slice x[..., :-k], TCN's causal crop): per block of leading rows, the
    # rows copied into the result's own and the kernel run there in place while they are in
    # cache (a whole contiguous copy first: ReLU of (4, 64, 1000) from (4, 64, 1008) 120 us,
    # against 54 for a contiguous input)
    lead = 0
    while lead < xt.ndim - 1 and xt.shape[lead] == 1:
        lead += 1  # (split where there are rows to split: a batch of one)
    sel = (0,) * lead

    def part(lo, hi):
        o = out[sel][lo:hi]
        np.copyto(o, xt[sel][lo:hi])
        f = o.reshape(-1)
        fill(f, f)
    _parallel(part, xt.shape[lead], x.size)
    return out.transpose(inv)


def unary(name: str, x: np.ndarray) -> np.ndarray:
    """One of :data:`UNARY_ACTIVATIONS` of a float32/float64 array, as a fresh array laid out
    like ``x``."""
    x = np.asarray(x)
    if x.ndim == 0:
        return unary(name, x.reshape(1)).reshape(())
    if x.size <= TINY_ELEMENTS and x.flags.c_contiguous and (_numba is None or x.dtype != np.float32):
        # (an SE block's gate, a chain of tiny ops: the kernel straight on a fresh array, ~3 us
        # instead of ~8 through the chunk machinery; a concatenation's slot when one is set)
        out = _small_out(x)
        tmps = [np.empty(x.size, x.dtype) for _ in range(_N_TEMPS[name])]
        with _silent():
            _KERNELS[name](x.reshape(-1), out.reshape(-1), tmps.__getitem__)
        return out
    return _fresh_like(x, lambda src, dst: _run_unary(name, src, dst))


def _clamp_into(a: np.ndarray, lo, hi, out: np.ndarray) -> None:
    """``out = min(max(a, lo), hi)``, either bound None (NaN stays NaN)."""
    if lo is None and hi is None:
        np.copyto(out, a)
    elif a.dtype.kind == "f":  # (float bounds: an int 0 made a ReLU on 64 values 2.2 us, not 1.6)
        _uclip(a, -_INF if lo is None else float(lo), _INF if hi is None else float(hi), out=out)
    elif hi is None:
        np.maximum(a, lo, out=out)
    elif lo is None:
        np.minimum(a, hi, out=out)
    else:
        np.clip(a, lo, hi, out=out)


def _clamp_flat(src: np.ndarray, dst: np.ndarray, lo, hi) -> None:
    """:func:`_clamp_into` over flat arrays (may be the same) in chunks split over the threads."""
    if src.size <= TINY_ELEMENTS:  # (one call: the chunking cost 1.7 us of a fused 1x64 ReLU's 2.2)
        _clamp_into(src, lo, hi, dst)
        return
    step = _chunk_step(src.size, src.size)

    def part(c0, c1):
        _clamp_into(src[c0 * step: c1 * step], lo, hi, dst[c0 * step: c1 * step])
    _parallel(part, -(-src.size // step), src.size)


def clamp(x: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray | None:
    """``min(max(x, lo), hi)`` (either bound None; NaN stays NaN) of a float32/float64 array as a
    fresh array laid out like ``x``, from the graph's buffer pool, split over the threads (ReLU
    after a residual add: a fresh 6 MiB array per call at batch 8 cost a page fault per 4 KiB).
    None for other dtypes."""
    x = np.asarray(x)
    if x.dtype not in _FLOATS or x.ndim == 0:
        return None
    if x.size <= TINY_ELEMENTS and x.flags.c_contiguous:  # (as in unary)
        out = _small_out(x)
        _clamp_into(x, lo, hi, out)
        return out
    return _fresh_like(x, lambda src, dst: _clamp_flat(src, dst, lo, hi))


_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply}


#: elements per chunk (at most) of :func:`binary` with an activation: the activation runs on each
#: chunk of the sum just written. Against the sum and then a separate ReLU pass into a pooled
#: array, 2 AMD EPYC (Zen 3) threads, medians of 60 alternated: (8, 256, 56, 56) 0.73 of the
#: time, (8, 64, 56, 56) 0.75-0.80, (4, 128, 28, 28) 0.67-0.70, (1, 256, 56, 56) 0.72-0.77,
#: (1, 64, 56, 56) 0.85; 128 Ki: 0.75-0.96; 32 Ki: 0.97-1.28 and 16 Ki 1.1-1.8 (the calls of
#: two threads then mostly wait on each other); 1 Mi about as 512 Ki
BINARY_ACTIVATION_CHUNK = 1 << 19


def _clamp_bounds(spec: Any) -> tuple | None:
    """``(lo, hi)`` of a ReLU (``"relu"``) or ``("clamp", lo, hi)`` spec (either bound None),
    else None."""
    if spec == "relu":
        return 0, None
    if isinstance(spec, tuple) and spec[0] == "clamp":
        return spec[1], spec[2]
    return None


def binary(name: str, a: Any, b: Any, activation: Any = None) -> np.ndarray | None:
    """``add``/``sub``/``mul`` of two C-contiguous float arrays of one shape and dtype (a
    residual connection) into a pooled output, split over the threads; None otherwise (the
    expression evaluator then computes it). The pooled output is what lets the sum be written
    straight into a concatenation (YOLO's C3 blocks) and not allocated afresh per call.
    ``activation`` (an elementwise spec of :func:`activation_inplace`, or None) is applied to
    each chunk of the result while it is in cache (a residual block's add and ReLU: one pass
    over memory instead of two)."""
    if (type(a) is not np.ndarray or type(b) is not np.ndarray or a.shape != b.shape
            or a.dtype != b.dtype or a.dtype not in _FLOATS or a.ndim == 0
            or not (a.flags.c_contiguous and b.flags.c_contiguous)):
        return None
    ufunc = _BINARY[name]
    out = _out(a.shape, a.dtype)
    fa, fb, fo = a.reshape(-1), b.reshape(-1), out.reshape(-1)
    step = _chunk_step(a.size, a.size, BINARY_ACTIVATION_CHUNK if activation is not None else 0)
    bounds = _clamp_bounds(activation)  # (ReLU and clamp straight on the chunk: through
    # activation_inplace's own chunks they took 1.04-1.19x the time)

    def part(c0, c1):
        if activation is None:
            ufunc(fa[c0 * step: c1 * step], fb[c0 * step: c1 * step], out=fo[c0 * step: c1 * step])
            return
        for k in range(c0, c1):
            chunk = fo[k * step: (k + 1) * step]
            ufunc(fa[k * step: (k + 1) * step], fb[k * step: (k + 1) * step], out=chunk)
            if bounds is not None:
                _clamp_into(chunk, bounds[0], bounds[1], chunk)
            else:
                _activate_block(chunk, activation)
    _parallel(part, -(-a.size // step), a.size)
    return out


def _leaky_block(a: np.ndarray, slope: float, tmp: np.ndarray) -> None:
    """LeakyReLU in place: max(x, s x) for 0 < s <= 1, min(x, s x) above 1, else s x where x < 0
    (a slope of 0 would make inf * 0 a NaN for +inf, which torch keeps); NaN stays NaN."""
    np.multiply(a, slope, out=tmp)
    if 0.0 < slope <= 1.0:
        np.maximum(a, tmp, out=a)
    elif slope > 1.0:
        np.minimum(a, tmp, out=a)
    else:
        np.copyto(a, tmp, where=a < 0)


def _leaky_inplace(y: np.ndarray, slope: float) -> np.ndarray:
    """``("leaky", slope)`` on the fresh array ``y``: in place in chunks split over the threads
    (the layer's own form made two fresh arrays on one thread)."""
    if y.dtype.kind != "f" or not y.flags.c_contiguous:
        _leaky_block(y, slope, np.empty_like(y))
        return y
    flat = y.reshape(-1)
    _run_kernel(lambda s, d, tmp: _leaky_block(d, slope, tmp(0)), 1, flat.size, flat, flat)
    return y


def _elu_block(a: np.ndarray, alpha: float, scale: float, div: float, t: np.ndarray, w: np.ndarray) -> None:
    """``scale * (max(x, 0) + alpha * expm1(min(x, 0) / div))`` in place, expm1 of m <= 0 as
    2t / (1 - t) with t = tanh(m / 2) (numpy's float32 expm1 is a scalar loop; this is the
    layers' own formula, exact near 0); NaN stays NaN, -inf gives -alpha * scale."""
    _uclip(a, -_INF, 0.0, out=t)
    t *= 0.5 / div
    np.tanh(t, out=t)
    np.subtract(1.0, t, out=w)
    t += t
    t /= w
    t *= alpha
    _uclip(a, 0.0, _INF, out=a)
    a += t
    if scale != 1.0:
        a *= scale


def _elu_inplace(y: np.ndarray, alpha: float, scale: float, div: float) -> np.ndarray:
    """``("elu", alpha, scale, div)`` on the fresh float array ``y``, in place in chunks split over
    the threads (ELU, CELU, SELU fused into their producer)."""
    if not y.flags.c_contiguous:
        _elu_block(y, alpha, scale, div, np.empty_like(y), np.empty_like(y))
        return y
    flat = y.reshape(-1)
    _run_kernel(lambda s, d, tmp: _elu_block(d, alpha, scale, div, tmp(0), tmp(1)), 2, flat.size * 2, flat, flat)
    return y


def activation_inplace(y: np.ndarray, spec: Any) -> np.ndarray:
    """Apply a fused activation (``"relu"``, ``("clamp", lo, hi)``, ``("leaky", slope)``,
    ``("elu", alpha, scale, divisor)``, a name from
    :data:`UNARY_ACTIVATIONS`, or a callable) to the fresh array ``y``, in place where it can."""
    if isinstance(spec, str) and spec in _KERNELS:
        if y.dtype not in _FLOATS:
            return unary(spec, y.astype(np.float32)).astype(y.dtype)
        if not y.flags.c_contiguous:
            return unary(spec, y)
        flat = y.reshape(-1)
        _run_unary(spec, flat, flat)
        return y
    if isinstance(spec, tuple) and spec[0] == "leaky":
        return _leaky_inplace(y, spec[1])
    if isinstance(spec, tuple) and spec[0] == "elu":
        if y.dtype.kind != "f":  # (producers make float outputs; as torch, ELU of ints is float)
            y = y.astype(np.float32)
        return _elu_inplace(y, *spec[1:])
    bounds = _clamp_bounds(spec)
    if bounds is None:
        return spec(y)
    lo, hi = bounds
    if y.flags.c_contiguous:
        flat = y.reshape(-1)
        _clamp_flat(flat, flat, lo, hi)
    else:
        _clamp_into(y, lo, hi, y)
    return y


def _activate_block(a: np.ndarray, spec: Any) -> None:
    """:func:`activation_inplace` on the contiguous block ``a`` of a larger output, the result
    always left in ``a`` (float16 kernels compute in float32 and return a new array)."""
    res = activation_inplace(a, spec)
    if res is not a:
        a[...] = res


def _bias_activate(a: np.ndarray, bias, activation) -> None:
    """``a += bias`` (None: nothing), then :func:`_activate_block` (None: nothing): in place on
    ``a``, a block of a larger output."""
    if bias is not None:
        a += bias
    if activation is not None:
        _activate_block(a, activation)


def _channels_by_pixels(x: np.ndarray) -> np.ndarray | None:
    """An (N, C, H, W) array as its (N, C, H*W) view: a reshape when planar, a transposed view of
    the (N, H*W, C) rows when channels-last; None for any other layout (no copy is made)."""
    n, c, h, w = x.shape
    if x.flags.c_contiguous:
        return x.reshape(n, c, h * w)
    if _is_channels_last(x):
        return x.transpose(0, 2, 3, 1).reshape(n, h * w, c).transpose(0, 2, 1)
    return None


def _is_channels_last(x: np.ndarray) -> bool:
    """An (N, C, H, W) view of a C-contiguous (N, H, W, C) array, as the depthwise convolutions
    on small maps return (a C-contiguous x is not one)."""
    return x.ndim == 4 and not x.flags.c_contiguous and x.transpose(0, 2, 3, 1).flags.c_contiguous


# -- convolution -------------------------------------------------------------------------------
def choose_algorithm(o: int, cg: int, kernel, stride, dilation, groups: int, pads, dtype,
                     input_hw=None) -> tuple[str, int]:
    """``(algorithm, winograd tile)`` for a convolution. ``input_hw`` (when the model file gives
    it) picks the Winograd tile: F(4x4) from a 20-pixel output side, else F(2x2) (whose tiles fit
    7x7 and 14x14 maps exactly); a Winograd plan still runs the GEMM when a call has fewer than
    ``WINOGRAD_MIN_PIXELS`` output pixels (one small image: the transforms do not pay there).

    Measured on 2 Zen 3 cores (OpenBLAS 0.3.31, torch 2.13 with oneDNN as the reference), single
    image: F(4x4) beats the GEMM from 48-64 channels at 28x28 and above (0.65-0.75x of its time
    at 64 channels; 32-47 channels only from 40 pixels a side, see WINOGRAD_MIN_CHANNELS), F(2x2)
    at 14x14 (0.8x), the GEMM wins at 7x7; batch 4-8 at 7x7: F(2x2) 0.8x of the GEMM.
    """
    kh, kw = kernel
    if (kh, kw) == (1, 1) and tuple(dilation) == (1, 1) and groups == 1 and not any(a or b for a, b in pads):
        return "1x1", 0
    if cg == 1 and groups > 1:
        return "depthwise", 0
    if (groups == 1 and tuple(stride) == (kh, kw) and kh * kw > 1 and tuple(dilation) == (1, 1)
            and not any(a or b for a, b in pads)):
        return "patch", 0
    d = tuple(dilation)
    few = WINOGRAD_SMALL_MIN_CHANNELS <= min(o, cg) < WINOGRAD_MIN_CHANNELS and d == (1, 1) and \
        input_hw is not None and None not in tuple(input_hw) and \
        min(input_hw[0] + sum(pads[0]), input_hw[1] + sum(pads[1])) - 2 >= WINOGRAD_SMALL_MIN_SIZE
    if (USE_WINOGRAD and groups == 1 and (kh, kw) == (3, 3) and tuple(stride) == (1, 1)
            and (d == (1, 1) or _same_dilated(d, pads)) and (min(o, cg) >= WINOGRAD_MIN_CHANNELS or few)
            and np.dtype(dtype) == np.float32):
        unknown = input_hw is None or None in tuple(input_hw)
        if d == (1, 1):
            if unknown:
                return "winograd", 4
            (t, b), (l, r) = pads
            side = min(input_hw[0] + t + b - 2, input_hw[1] + l + r - 2)
            return "winograd", 4 if side >= WINOGRAD_F4_MIN_SIZE else 2
        # (dilated: the side of a polyphase sub-image; an unknown size is decided per call)
        side = WINOGRAD_F4_MIN_SIZE if unknown else min(-(-input_hw[0] // d[0]), -(-input_hw[1] // d[0]))
        if side >= WINOGRAD_F4_MIN_SIZE and min(o, cg) >= WINOGRAD_DILATED_MIN_CHANNELS:
            return "winograd", 4
        if side >= WINOGRAD_DILATED_MIN_SIDE and min(o, cg) >= WINOGRAD_DILATED_F2_MIN_CHANNELS:
            return "winograd", 2
    if (USE_SHIFT and groups == 1 and tuple(stride) == (1, 1) and tuple(dilation) == (1, 1)
            and kh * kw > 1 and o * SHIFT_MAX_OUT_RATIO <= cg and np.dtype(dtype).kind == "f"):
        # (dilated: the GEMM would also run over the wide padding, ~2x the work at d=12 on 64x64)
        return "shift", 0
    return "gemm", 0


def _same_dilated(dilation, pads) -> bool:
    """Dilation d > 1 in both axes with padding d on every side (a 3x3 kernel's "same")."""
    d = dilation[0]
    return d > 1 and tuple(dilation) == (d, d) and tuple(map(tuple, pads)) == ((d, d), (d, d))


def _progression(taps) -> slice:
    """The slice selecting ``taps`` (an increasing arithmetic progression)."""
    step = taps[1] - taps[0] if len(taps) > 1 else 1
    assert all(b - a == step for a, b in zip(taps, taps[1:]))
    return slice(taps[0], taps[-1] + 1, step)


class _GemmBlock:
    """A run of patch rows (one K block) read from one array: taps ``taps_i x taps_j`` of every
    channel; rows ``oi0 + si*a + rs*r``, columns ``oj0 + sj*b + cs*col`` of ``phase``'s array."""

    __slots__ = ("phase", "taps_i", "taps_j", "ni", "nj", "oi0", "oj0", "si", "sj", "rs", "cs", "koff", "size")

    def __init__(self, phase, taps_i, taps_j, oi0, oj0, si, sj, rs, cs, koff, cg):
        self.phase, self.taps_i, self.taps_j = phase, tuple(taps_i), tuple(taps_j)
        self.ni, self.nj = len(taps_i), len(taps_j)
        self.oi0, self.oj0, self.si, self.sj, self.rs, self.cs = oi0, oj0, si, sj, rs, cs
        self.koff, self.size = koff, cg * self.ni * self.nj


def _gemm_blocks(kh, kw, stride, dilation, cg) -> list[_GemmBlock]:
    """The im2col layout: one block for a stride-1 convolution (taps in (c, i, j) order, read
    from the padded input); for a strided one, one block per input phase ``(p, q)`` holding the
    taps that land on it, in (c, i, j) order inside the block (the weights are permuted alike).
    Tap i lands on phase ``i*dh % sh`` at phase row ``i*dh // sh``; those rows step evenly."""
    (sh, sw), (dh, dw) = stride, dilation
    if (sh, sw) == (1, 1) or kh * kw == 1 or not GEMM_POLYPHASE or max(sh, sw) > GEMM_POLYPHASE_MAX_STRIDE:
        return [_GemmBlock(None, range(kh), range(kw), 0, 0, dh, dw, sh, sw, 0, cg)]
    blocks, koff = [], 0
    for p in range(sh):
        ti = [i for i in range(kh) if (i * dh) % sh == p]
        if not ti:
            continue
        for q in range(sw):
            tj = [j for j in range(kw) if (j * dw) % sw == q]
            if not tj:
                continue
            si = (ti[1] - ti[0]) * dh // sh if len(ti) > 1 else 1
            sj = (tj[1] - tj[0]) * dw // sw if len(tj) > 1 else 1
            blk = _GemmBlock((p, q), ti, tj, ti[0] * dh // sh, tj[0] * dw // sw, si, sj, 1, 1, koff, cg)
            blocks.append(blk)
            koff += blk.size
    return blocks


def _all_finite(y: np.ndarray) -> bool:
    """Whether every element of the float array ``y`` is finite, by one sum (no temporary the
    size of ``y``; a sum that overflows only sends a finite result to the slower exact path)."""
    with _silent():
        return bool(np.isfinite(y.sum()))


class Conv2dPlan:
    """A convolution with its weights packed for one algorithm; ``plan(x)`` runs it on an NCHW
    array (zero padding ``pads`` applied here) and returns a fresh C-contiguous array, or for a
    depthwise convolution on a small map a fresh channels-last array seen as (N, C, H, W) (see
    ``_run_depthwise_nhwc``)."""

    def __init__(self, weight, bias, stride, dilation, groups, pads, algo: str | None = None,
                 input_hw=None, tile: int | None = None):
        w = np.asarray(weight)
        self.o, self.cg, self.kh, self.kw = w.shape
        self.stride, self.dilation, self.groups = tuple(stride), tuple(dilation), int(groups)
        self.pads = tuple(tuple(p) for p in pads)
        self.dtype = w.dtype
        self.bias = None if bias is None else np.ascontiguousarray(np.asarray(bias), dtype=w.dtype)
        self.in_channels = self.cg * self.groups
        og = self.o // self.groups
        auto_algo, auto_tile = choose_algorithm(self.o, self.cg, (self.kh, self.kw), self.stride,
                                                self.dilation, self.groups, self.pads, w.dtype, input_hw)
        # tiny calls of a plan whose algorithm was chosen here take _run_small (one named by
        # the caller, as the tests of each algorithm do, always runs)
        self.small_ok = algo is None
        if algo is None:
            algo = auto_algo
        if algo == "winograd":
            tile = tile or auto_tile or 4
        if algo not in self.ALGORITHMS:
            raise ValueError(f"unknown convolution algorithm {algo!r} (one of {sorted(self.ALGORITHMS)})")
        if algo == "1x1" and ((self.kh, self.kw) != (1, 1) or self.groups != 1 or any(a or b for a, b in self.pads)):
            raise ValueError("the 1x1 algorithm needs a 1x1 kernel, one group and no padding")
        if algo == "depthwise" and self.cg != 1:
            raise ValueError("the depthwise algorithm needs one input channel per group")
        self.algo, self.tile = algo, tile
        k = self.cg * self.kh * self.kw
        if algo == "1x1":
            # (O, C): the weights as they came when read-only (a graph's, maybe shared with an
            # equal convolution), no copy: a load no longer copies every 1x1 kernel (MobileNetV2's
            # 10 MB); the (O, C + 1) matrix with the bias column is made by the first call that
            # folds the bias into the GEMM (see _folded)
            wm = w.reshape(self.o, self.cg)
            self.wmat = wm if not wm.flags.writeable and wm.flags.c_contiguous else wm.copy()
            self._wfold = None
        elif algo == "patch":
            if self.stride != (self.kh, self.kw) or self.dilation != (1, 1) or self.groups != 1 \
                    or any(a or b for a, b in self.pads):
                raise ValueError("the patch algorithm needs stride == kernel, no dilation, groups or padding")
            # (O, C*kh*kw + 1) in the natural (c, i, j) order; the last column is the bias
            self.wmat = np.zeros((self.o, k + 1), dtype=w.dtype)
            self.wmat[:, :k] = w.reshape(self.o, k)
            if self.bias is not None:
                self.wmat[:, k] = self.bias
        elif algo == "depthwise":
            self.mult = og  # output channels per input channel
            # (kh*kw, O, 1): per-tap per-channel multipliers
            self.wtaps = np.ascontiguousarray(w.reshape(self.o, self.kh * self.kw).T).reshape(
                self.kh * self.kw, self.o, 1)
            self.wnumba = self.bnumba = None  # (O, kh, kw) weights and a bias for numba_kernels
            self._wtiles: dict[int, np.ndarray] = {}  # channels-last weights per output width
            self._bands: dict[int, tuple] = {}  # per band width: see _band_source
            self._dense: dict[tuple[int, int], np.ndarray] = {}  # per input size: see _dense_matrix
        elif algo == "shift":
            if self.stride != (1, 1) or self.groups != 1:
                raise ValueError("the shift algorithm needs stride 1 and groups 1")
            # (kh*kw*O, C): row t*O + o holds w[o, :, i, j] for tap t = i*kw + j
            self.wshift = np.ascontiguousarray(w.transpose(2, 3, 0, 1).reshape(self.kh * self.kw * self.o, self.cg))
        else:
            self.blocks = _gemm_blocks(self.kh, self.kw, self.stride, self.dilation, self.cg)
            self._weight = w
            self.wmat = None
            # (False: the GEMM multiplies the weight as it is and the bias is added after it)
            self.bias_column = not (len(self.blocks) == 1 and self.blocks[0].phase is None
                                    and k >= GEMM_WEIGHT_VIEW_MIN_K)
            if algo == "winograd":
                if (self.kh, self.kw) != (3, 3) or self.stride != (1, 1) or self.groups != 1 or not (
                        self.dilation == (1, 1) or _same_dilated(self.dilation, self.pads)):
                    raise ValueError("Winograd needs a 3x3 kernel, stride 1, one group, and a dilation "
                                     "d > 1 only with padding d on every side")
                # the transformed weights are made on the first call big enough for the
                # transforms, the GEMM weights on the first call too small for them: at batch 1
                # ResNet-18's 7x7 layers only ever use the latter (their F(2,3) weights, 16.8
                # MiB each, took 22 of its 108 ms load)
                self.wino = None
            else:
                self._pack_gemm()

    def _pack_gemm(self) -> np.ndarray:
        """(G, O/G, K + 1) GEMM weights: the last column is the bias, met by a row of ones in the
        patches; taps in each block's order. Without ``bias_column``: (G, O/G, K), the weight
        itself (a view of a C-contiguous one)."""
        if self.wmat is None and not self.bias_column:
            wm = self._weight.reshape(self.groups, self.o // self.groups, self.cg * self.kh * self.kw)
            self.wmat = wm if wm.flags.c_contiguous else np.ascontiguousarray(wm)
        if self.wmat is None:
            og, k = self.o // self.groups, self.cg * self.kh * self.kw
            wm = np.empty((self.groups, og, k + 1), dtype=self.dtype)
            wg = self._weight.reshape(self.groups, og, self.cg, self.kh, self.kw)
            for blk in self.blocks:
                # a block's taps are an arithmetic progression: a strided view, one copy
                si, sj = _progression(blk.taps_i), _progression(blk.taps_j)
                _view(wm[:, :, blk.koff: blk.koff + blk.size], (self.groups, og, self.cg, blk.ni, blk.nj))[...] = \
                    wg[:, :, :, si, sj]
            wm[:, :, k] = 0 if self.bias is None else self.bias.reshape(self.groups, og)
            self.wmat = wm  # one assignment: a concurrent first call at worst packs twice
        return self.wmat

    def out_size(self, h: int, w: int) -> tuple[int, int]:
        (t, b), (l, r) = self.pads
        ho = (h + t + b - self.dilation[0] * (self.kh - 1) - 1) // self.stride[0] + 1
        wo = (w + l + r - self.dilation[1] * (self.kw - 1) - 1) // self.stride[1] + 1
        return ho, wo

    def __call__(self, x: np.ndarray, activation: Any = None, channels_last: bool = False) -> np.ndarray:
        """The convolution of ``x``; ``activation`` (a non-callable spec of
        :func:`activation_inplace`) is applied to the output, inside the cache-sized blocks where
        the algorithm has them (depthwise), else on the whole output at the end.
        ``channels_last`` asks a stride-1 1x1 convolution for a channels-last result seen as (N, C,
        H, W) (what a depthwise convolution on a small map reads without a transposing copy)."""
        if channels_last and self.algo == "1x1" and self.stride == (1, 1):
            y = self._run_1x1_channels_last(np.asarray(x), activation)
            if y is not None:
                return y
        y = self._conv(x, activation)
        if activation is not None and self.algo not in self._FUSES:
            y = activation_inplace(y, activation)
        return y

    #: algorithms that apply the fused activation themselves
    _FUSES = frozenset({"depthwise", "gemm", "1x1", "winograd"})
    #: the algorithms a plan can be made for (``algo=``; None picks one)
    ALGORITHMS = frozenset({"1x1", "patch", "depthwise", "shift", "taps", "gemm", "winograd"})

    def _conv(self, x: np.ndarray, activation: Any = None) -> np.ndarray:
        x = np.asarray(x)
        if x.dtype != self.dtype:
            x = x.astype(self.dtype)
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            from kuiper_xp.errors import ShapeError

            raise ShapeError(f"convolution input of shape {x.shape}: expected (N, {self.in_channels}, H, W)")
        n, c, h, w = x.shape
        ho, wo = self.out_size(h, w)
        if ho <= 0 or wo <= 0:
            from kuiper_xp.errors import ShapeError

            raise ShapeError(f"convolution output would be empty for input {x.shape}, kernel "
                             f"{(self.kh, self.kw)}, pads {self.pads}, stride {self.stride}")
        patch = n * ho * wo * c * self.kh * self.kw
        if self.small_ok and self.algo in self._SMALL and patch * (self.o // self.groups) <= SMALL_CONV_MACS \
                and patch <= SMALL_CONV_PATCH_ELEMENTS:
            return self._run_small(x, ho, wo, activation if self.algo in self._FUSES else None)
        if self.algo in self._FUSES:
            return getattr(self, "_run_" + self.algo)(x, ho, wo, activation)
        return getattr(self, "_run_" + self.algo)(x, ho, wo)

    #: algorithms whose tiny convolutions take :meth:`_run_small`
    _SMALL = frozenset({"gemm", "winograd", "taps"})

    def _run_small(self, x, ho, wo, activation=None):
        """A tiny convolution (SMALL_CONV_MACS) on this thread: the zero-padded input in a
        workspace, its patches gathered by one copy of a strided view into a (C*kh*kw, N*Ho*Wo)
        matrix in the weight's own (c, i, j) order, one GEMM per group, the bias, the
        activation."""
        n, c, h, w = x.shape
        g, cg, og, kh, kw = self.groups, self.cg, self.o // self.groups, self.kh, self.kw
        (sh, sw), (dh, dw) = self.stride, self.dilation
        (t, b), (l, r) = self.pads
        dt = self.dtype
        hp, wp = h + t + b, w + l + r
        xp = _workspace((n, c, hp, wp), dt, slot=90)
        _pad_into(xp, x, (t, l))
        ln = ho * wo
        cols = _workspace((c, kh, kw, n, ho, wo), dt, slot=91)
        # every patch element as one strided view of the padded input (the ndarray constructor
        # on its buffer: as_strided's own wrapping cost ~5 us), gathered by one copy
        e = dt.itemsize
        patches = np.ndarray((c, kh, kw, n, ho, wo), dtype=dt, buffer=xp,
                             strides=(hp * wp * e, dh * wp * e, dw * e, c * hp * wp * e, sh * wp * e, sw * e))
        np.copyto(cols, patches)
        wm = self._weight.reshape(g, og, cg * kh * kw)
        y = _out((n, self.o, ho, wo), dt)
        if n == 1:
            res = y.reshape(g, og, ln)
        else:
            res = _workspace((g, og, n * ln), dt, slot=92)
        np.matmul(wm, cols.reshape(g, cg * kh * kw, n * ln), out=res)
        if self.bias is not None:
            res += self.bias.reshape(g, og, 1)
        if n > 1:
            np.copyto(y.reshape(n, g, og, ln), res.reshape(g, og, n, ln).transpose(2, 0, 1, 3))
        return y if activation is None else activation_inplace(y, activation)

    def _patches(self, columns: int, slot: int = 0) -> np.ndarray:
        """The (G, K, columns) im2col workspace, with ``bias_column`` (G, K + 1, columns) and
        its last row ones."""
        k = self.cg * self.kh * self.kw
        cols = _operand_workspace((self.groups, k + self.bias_column, columns), self.dtype, slot=slot)
        if self.bias_column:
            cols[:, k] = 1
        return cols

    def _late_bias(self, res: np.ndarray) -> None:
        """The bias added to ``res`` (G, O/G, columns), a block of GEMM results, where the GEMM
        did not carry it (``bias_column`` False)."""
        if not self.bias_column and self.bias is not None:
            res += self.bias.reshape(res.shape[0], res.shape[1], 1)

    def _add_bias(self, y: np.ndarray) -> None:
        if self.bias is None:
            return
        n, o = y.shape[:2]
        b = self.bias.reshape(o, 1, 1)

        def part(lo, hi):
            for i in range(n):
                y[i, lo:hi] += b[lo:hi]
        _parallel(part, o, y.size)

    # -- algorithms --------------------------------------------------------------------------
    def _run_1x1(self, x, ho, wo, activation=None):
        """Stride 1 on a planar or channels-last input (no copy: each image is the ``(C, H*W)``
        operand of the GEMMs, a transposed one for channels-last): the threads take blocks of
        pixels (see _each_pixel_block), a one-thread GEMM straight into the output, bias and
        activation on the block while it is in cache. Against one GEMM per image split over the
        threads followed by bias and activation passes over the whole result, or a copy of small
        images side by side into one GEMM: 0.57 against 1.27 ms for MobileNetV2's 384 -> 64 at
        14x14 (channels-last input), batch 8, 0.98 against 1.74 for 576 -> 96 (2 threads).
        Otherwise (stride 2, tiny outputs, and batched small maps whose output channels are over
        GEMM_IMAGES_MAX_WEIGHT_RATIO times an image's pixels, where every block would read all
        the weights: ResNet-50's 512 -> 2048 and 2048 -> 512 at 7x7, batch 8, 4.4-4.9 -> 3.6 ms,
        torch 3.4) see _run_1x1_copy."""
        n, c = x.shape[:2]
        o = self.o
        ln = ho * wo
        heavy = n > 1 and ln < GEMM_MIN_COLUMNS and o > GEMM_IMAGES_MAX_WEIGHT_RATIO * ln  # (weights o*c, input c*ln)
        x3 = _channels_by_pixels(x) if self.stride == (1, 1) and n * o * ln > TINY_ELEMENTS and not heavy else None
        if x3 is None:
            y = self._run_1x1_copy(x, ho, wo)
            return y if activation is None else activation_inplace(y, activation)
        y = _out((n, o, ho, wo), self.dtype)
        y3 = y.reshape(n, o, ln)
        wm = self.wmat[:, :c]
        bias = None if self.bias is None else self.bias[:, None]

        def block(i, p0, p1):
            # a whole image is contiguous: the activation runs on it in place; a block of
            # columns goes through a contiguous workspace for it
            out = y3[i, :, p0:p1]
            staged = activation is not None and p1 - p0 < ln
            res = _workspace((o, p1 - p0), self.dtype, slot=18) if staged else out
            _mm(wm, x3[i, :, p0:p1], res)
            _bias_activate(res, bias, activation)
            if staged:
                out[...] = res
        self._each_pixel_block(n, ln, c, block)
        return y

    def _run_1x1_copy(self, x, ho, wo):
        """Strided, tiny or oddly laid out: a plain GEMM on the input when it is contiguous and
        stride 1; otherwise (stride 2, several small images side by side, or a bias worth
        folding because O >= C) the input is first copied into a ``(C + 1, images*Ho*Wo)``
        workspace whose last row of ones meets the bias column of the weights."""
        n, c = x.shape[:2]
        o = self.o
        sh, sw = self.stride
        ln = ho * wo
        src = x if (sh, sw) == (1, 1) else x[:, :, ::sh, ::sw][:, :, :ho, :wo]
        y = _out((n, o, ho, wo), self.dtype)
        batched = n > 1 and ln < GEMM_MIN_COLUMNS
        direct = src is x and x.flags.c_contiguous and not batched
        fold = self.bias is not None and not (direct and o < c)
        if direct and y.size <= TINY_ELEMENTS:  # (squeeze-and-excite: (1, C, 1, 1))
            np.matmul(self.wmat[:, :c], x.reshape(n, c, ln), out=y.reshape(n, o, ln))
            if self.bias is not None:
                y.reshape(n, o, ln)[...] += self.bias[:, None]
            return y
        if direct and not fold:
            for i in range(n):
                _gemm(self.wmat[:, :c], x[i].reshape(c, ln), y[i].reshape(o, ln))
            self._add_bias(y)
            return y
        kk = c + 1 if fold else c
        wm = self._folded() if fold else self.wmat[:, :c]
        nb = n if batched else 1
        for i0 in range(0, n, nb):
            b = min(nb, n - i0)
            cols = _operand_workspace((kk, b * ln), self.dtype)
            if fold:
                cols[c] = 1
            _copy_channels(_view(cols[:c], (c, b, ho, wo)), src[i0:i0 + b].transpose(1, 0, 2, 3))
            if b == 1:
                _gemm(wm, cols, y[i0].reshape(o, ln))
            else:
                res = _workspace((o, b * ln), self.dtype, slot=11)
                _gemm(wm, cols, res)
                _copy_channels(y[i0:i0 + b].reshape(b, o, ln), res.reshape(o, b, ln).transpose(1, 0, 2), axis=1)
        return y

    def _folded(self) -> np.ndarray:
        """A 1x1 plan's (O, C + 1) weights whose last column is the bias (met by a row of ones
        in the copied input), made on first use."""
        f = self._wfold
        if f is None:
            f = np.empty((self.o, self.cg + 1), dtype=self.dtype)
            f[:, :self.cg] = self.wmat
            f[:, self.cg] = 0 if self.bias is None else self.bias
            self._wfold = f  # (one assignment: two first calls at once at worst make it twice)
        return f

    def _each_pixel_block(self, n: int, ln: int, c: int, block) -> None:
        """``block(i, p0, p1)`` for blocks of pixels ``[p0, p1)`` of each image ``i`` of a 1x1
        convolution (``n`` images of ``ln`` pixels, ``c`` channels): blocks of at most about
        CONV1X1_BLOCK_BYTES of result (whole images when they fit), run on the threads from
        CONV1X1_SPLIT_MIN_MACS multiply-adds or PARALLEL_MIN_ELEMENTS outputs on (the bias and
        activation), each image cut finer when there are fewer blocks than threads."""
        o, k = self.o, _threads_now()
        step = max(1, min(ln, CONV1X1_BLOCK_BYTES // max(1, o * self.dtype.itemsize)))
        split = n * ln * c * o >= CONV1X1_SPLIT_MIN_MACS or n * ln * o >= PARALLEL_MIN_ELEMENTS
        if split and 0 < n and n * -(-ln // step) < k:
            step = max(min(ln, 16), -(-ln // -(-k // n)))
        nblk = -(-ln // step)

        def part(lo, hi):
            for t in range(lo, hi):
                i, b = divmod(t, nblk)
                block(i, b * step, min(ln, b * step + step))
        _parallel(part, n * nblk, 1 << 62 if split else 0)

    def _run_1x1_channels_last(self, x, activation):
        """``y^T = x^T W^T`` into a channels-last pooled array (the GEMM reads the planar input,
        or a channels-last one, as a transposed operand), returned as its (N, C, H, W) view. The
        threads take blocks of pixel rows (whole images when there are enough of them; at most
        about CONV1X1_BLOCK_BYTES of result each): a one-thread GEMM straight into the output,
        bias and activation on the block while it is in cache. Against one GEMM per image split
        over the threads, then bias and activation as passes over the whole result: 0.66 against
        1.78 ms for MobileNetV2's 64 -> 384 at 14x14, batch 8; 0.11 against 0.22 at batch 1
        (2 threads). None when x does not fit."""
        if x.dtype != self.dtype or x.ndim != 4:
            return None
        n, c, h, w = x.shape
        ln = h * w
        x3 = _channels_by_pixels(x)
        if x3 is None:
            return None
        src = x3.transpose(0, 2, 1)  # (n, pixels, channels)
        o = self.o
        y = _pooled((n, h, w, o), self.dtype)
        y3 = y.reshape(n, ln, o)
        wt = self.wmat[:, :c].T

        def block(i, p0, p1):  # rows of pixels: contiguous
            _mm(src[i, p0:p1], wt, y3[i, p0:p1])
            _bias_activate(y3[i, p0:p1], self.bias, activation)
        self._each_pixel_block(n, ln, c, block)
        return y.transpose(0, 3, 1, 2)

    def reads_channels_last(self, input_hw) -> bool:
        """True when this (depthwise) plan runs channels-last on an input of ``input_hw``: the
        layer making its input may then hand it over channels-last."""
        if self.algo != "depthwise" or self.mult != 1 or input_hw is None or None in tuple(input_hw):
            return False
        ho, wo = self.out_size(*input_hw)
        return 0 < ho * wo <= DEPTHWISE_NHWC_MAX_PIXELS and _numba is None

    def _run_patch(self, x, ho, wo):
        """Non-overlapping patches (stride == kernel, no padding: ViT's patch embedding): the
        patch matrix is one strided copy of the input, ``(C*kh*kw + 1, images*Ho*Wo)``, with a
        row of ones for the bias; then one GEMM per block of images."""
        n, c = x.shape[:2]
        kh, kw = self.kh, self.kw
        k = c * kh * kw
        ln = ho * wo
        y = _out((n, self.o, ho, wo), self.dtype)
        s0, s1, s2, s3 = x.strides
        item = self.dtype.itemsize
        nb = max(1, min(n, (GEMM_BLOCK_BYTES * 4) // max(1, (k + 1) * ln * item)))
        for i0 in range(0, n, nb):
            b = min(nb, n - i0)
            cols = _workspace((k + 1, b * ln), self.dtype)
            cols[k] = 1
            src = as_strided(x[i0:], shape=(c, kh, kw, b, ho, wo),
                             strides=(s1, s2, s3, s0, kh * s2, kw * s3), writeable=False)
            _copy_channels(_view(cols[:k], (c, kh, kw, b, ho, wo)), src)
            if b == 1:
                _gemm(self.wmat, cols, y[i0].reshape(self.o, ln))
            else:
                res = _workspace((self.o, b * ln), self.dtype, slot=11)
                _gemm(self.wmat, cols, res)
                _copy_channels(y[i0:i0 + b].reshape(b, self.o, ln),
                               res.reshape(self.o, b, ln).transpose(1, 0, 2), axis=1)
        return y

    def _run_shift(self, x, ho, wo):
        """``Z = W_taps @ xpad`` (all taps' weights stacked: one GEMM over the flattened padded
        input, rows of length Wp), then ``y[o, p] = sum_t Z[t*O + o, p + off_t]`` with
        ``off_t = i*dh*Wp + j*dw``: kh*kw adds of contiguous slices; columns ``Wo..Wp-1`` of each
        row are junk and dropped when the block is written out (with the bias). Blocks of output
        rows; with enough blocks each thread takes whole ones (own GEMM, adds, write-out)."""
        n, c = x.shape[:2]
        o, kh, kw = self.o, self.kh, self.kw
        dh, dw = self.dilation
        xp = _pad_zeros(x, self.pads)
        if not xp.flags.c_contiguous:
            xp = np.ascontiguousarray(xp)
        hp, wp = xp.shape[2:]
        flat = xp.reshape(n, c, hp * wp)
        y = _out((n, o, ho, wo), self.dtype)
        t_n = kh * kw
        halo = (kh - 1) * dh
        extra = (kw - 1) * dw
        item = self.dtype.itemsize
        # the GEMM of a block also covers its halo rows: at least 3 useful rows per halo row
        rows = max(1, min(ho, max(SHIFT_BLOCK_BYTES // max(1, t_n * o * wp * item) - halo, 3 * halo)))
        nblk = -(-ho // rows)
        offs = [i * dh * wp + j * dw for i in range(kh) for j in range(kw)]
        bias = None if self.bias is None else self.bias.reshape(o, 1, 1)
        threads = _threads_now()
        per_thread = n * nblk >= 2 * threads

        def block(i, r0, split):
            nr = min(ho, r0 + rows) - r0
            lin = (nr + halo) * wp
            z = _workspace((t_n * o, lin + extra), self.dtype, slot=19)
            if extra:
                z[:, lin:] = 0
            src = flat[i, :, r0 * wp: r0 * wp + lin]
            if split:
                _gemm(self.wshift, src, z[:, :lin])
            else:
                _mm(self.wshift, src, z[:, :lin])
            acc = _workspace((o, nr * wp), self.dtype, slot=20)
            ln = nr * wp

            def adds(lo, hi):
                a = acc[lo:hi]
                if t_n == 1:  # a 1x1 kernel forced onto this algorithm
                    np.copyto(a, z[lo:hi, offs[0]: offs[0] + ln])
                else:
                    np.add(z[lo:hi, offs[0]: offs[0] + ln], z[o + lo: o + hi, offs[1]: offs[1] + ln], out=a)
                for t in range(2, t_n):
                    a += z[t * o + lo: t * o + hi, offs[t]: offs[t] + ln]
                src3 = a.reshape(hi - lo, nr, wp)[:, :, :wo]
                dst = y[i, lo:hi, r0: r0 + nr]
                if bias is None:
                    np.copyto(dst, src3)
                else:
                    np.add(src3, bias[lo:hi], out=dst)
            if split:
                _parallel(adds, o, acc.size * t_n)
            else:
                adds(0, o)

        if per_thread:
            def part(lo, hi):
                for t in range(lo, hi):
                    i, b = divmod(t, nblk)
                    block(i, b * rows, False)
            _parallel(part, n * nblk, 1 << 62)
        else:
            for i in range(n):
                for b in range(nblk):
                    block(i, b * rows, True)
        return y

    def _tap_rects(self, h: int, w: int, ho: int, wo: int) -> list[tuple[int, ...]] | None:
        """For a stride-1 convolution with one group: per tap ``(t, r0, r1, c0, c1, di, dj)``,
        the output rectangle whose input (output + ``(di, dj)``) lies inside the map, when all
        taps together cover at most TAPS_MAX_FRACTION of ``kh*kw*ho*wo`` (dilated convolutions
        on small maps: DeepLab's rates); else None. Kept per input size."""
        if self.stride != (1, 1) or self.groups != 1 or self.kh * self.kw == 1:
            return None
        cache = self.__dict__.setdefault("_rects", {})
        key = (h, w, TAPS_MAX_FRACTION, TAPS_MIN_SAVED_MACS)
        if key not in cache:
            if len(cache) >= 16:
                cache.clear()
            cache[key] = self._find_tap_rects(h, w, ho, wo)
        return cache[key]

    def _find_tap_rects(self, h: int, w: int, ho: int, wo: int) -> list[tuple[int, ...]] | None:
        (pt, _), (pl, _) = self.pads
        dh, dw = self.dilation
        rects, used = [], 0
        for i in range(self.kh):
            di = i * dh - pt
            r0, r1 = max(0, -di), min(ho, h - di)
            for j in range(self.kw):
                dj = j * dw - pl
                c0, c1 = max(0, -dj), min(wo, w - dj)
                if r1 > r0 and c1 > c0:
                    rects.append((i * self.kw + j, r0, r1, c0, c1, di, dj))
                    used += (r1 - r0) * (c1 - c0)
        full = self.kh * self.kw * ho * wo
        if used > TAPS_MAX_FRACTION * full or (full - used) * self.o * self.cg < TAPS_MIN_SAVED_MACS * len(rects):
            return None
        return rects

    def _run_taps(self, x, ho, wo, rects, activation=None):
        """One GEMM per tap over just the output pixels whose input lies inside the map, added
        into the output: the im2col GEMM would multiply the zero padding too, which is most of
        the work of a large dilation on a small map (DeepLab's rate 18 on 28x28: a third of the
        taps' pixels are real, rate 36 only the centre tap). A tap reading whole input rows
        takes them as a view; others copy their rectangle first (C values per O*C products)."""
        n, c, h, w = x.shape
        o = self.o
        if getattr(self, "wtap", None) is None:
            # (kh*kw, O, C): tap t's weights as one matrix
            self.wtap = np.ascontiguousarray(self._weight.transpose(2, 3, 0, 1).reshape(self.kh * self.kw, o, c))
        wtap = self.wtap
        y = _out((n, o, ho, wo), self.dtype)
        bias = None if self.bias is None else self.bias.reshape(o, 1, 1)
        for i in range(n):
            yi = y[i]
            if bias is None:
                yi.fill(0)
            else:
                _copy_channels(yi, np.broadcast_to(bias, yi.shape))
            for t, r0, r1, c0, c1, di, dj in rects:
                nr, nc = r1 - r0, c1 - c0
                src = x[i, :, r0 + di: r1 + di, c0 + dj: c1 + dj]
                if nc == w and src.strides[2] == src.itemsize and src.strides[1] == w * src.itemsize:
                    cols = src.reshape(c, nr * nc)  # whole rows: a view (leading dimension H*W)
                else:
                    cols = _workspace((c, nr * nc), self.dtype, slot=21)
                    _copy_channels(cols.reshape(c, nr, nc), src)
                z = _workspace((o, nr * nc), self.dtype, slot=22)
                _gemm(wtap[t], cols, z)
                z3, dst = z.reshape(o, nr, nc), yi[:, r0:r1, c0:c1]

                def add(lo, hi, z3=z3, dst=dst):
                    dst[lo:hi] += z3[lo:hi]
                _parallel(add, o, z.size)
        return y if activation is None else activation_inplace(y, activation)

    def _run_gemm(self, x, ho, wo, activation=None):
        rects = self._tap_rects(x.shape[2], x.shape[3], ho, wo) if self.algo == "gemm" else None
        if rects is not None:
            return self._run_taps(x, ho, wo, rects, activation)
        wmat = self._pack_gemm()
        n, c = x.shape[:2]
        g, cg = self.groups, self.cg
        og = self.o // g
        k = cg * self.kh * self.kw
        y = _out((n, self.o, ho, wo), self.dtype)
        bases = self._gemm_bases(x, ho, wo)
        item = self.dtype.itemsize

        # every block's patches of every image and output row, as one strided view each (made
        # once per call: as_strided costs ~10 us, and the row pipeline fills ~20 blocks per map)
        srcs = []
        for blk in self.blocks:
            base = bases[blk.phase]
            s0, s1, s2, s3 = base.strides
            srcs.append(as_strided(base[:, :, blk.oi0:, blk.oj0:], shape=(g, cg, blk.ni, blk.nj, n, ho, wo),
                                   strides=(cg * s1, s1, blk.si * s2, blk.sj * s3, s0, blk.rs * s2, blk.cs * s3),
                                   writeable=False))

        def fill(cols, i0, b, r0, rows, inline=False):
            """im2col of images [i0, i0+b), output rows [r0, r0+rows) into cols[:, :k]
            (``inline``: on the calling thread, as a row-pipeline worker does)."""
            for blk, src in zip(self.blocks, srcs):
                dst = _view(cols[:, blk.koff: blk.koff + blk.size], (g, cg, blk.ni, blk.nj, b, rows, wo))
                part = src[:, :, :, :, i0:i0 + b, r0:r0 + rows]
                if inline:
                    np.copyto(dst, part)
                else:
                    _copy_channels(dst, part, axis=1)

        if n > 1 and ho * wo < GEMM_MIN_COLUMNS:
            # small images: several images side by side in one GEMM (N = images * Ho*Wo), the
            # result scattered back to NCHW with one copy
            ln = ho * wo
            threads = _threads_now()
            per_image = (k + 1) * ln * item  # patch bytes
            weight_bytes = self.o * (k + 1) * item
            if GEMM_ROWS_BYTES and threads > 1:
                nb = max(1, min(n, GEMM_ROWS_BYTES // max(1, per_image)))
                nblk = -(-n // nb)
                # (one block per thread will do when they share evenly: TCN's 64-channel Conv1d over
                # 1000 steps at batch 4, two blocks of two, 1.0 -> 0.80-0.87 ms, 32 channels at
                # 28x28 batch 4 0.84 -> 0.68-0.73; each thread reads all the weights per block: not
                # when they are several times its patches, see GEMM_IMAGES_MAX_WEIGHT_RATIO)
                if (nblk >= 2 * threads or nblk % threads == 0 and nblk >= threads) \
                        and weight_bytes <= GEMM_IMAGES_MAX_WEIGHT_RATIO * nb * per_image:
                    return self._run_gemm_images(y, fill, ln, nb, activation)
            nb = max(1, min(n, GEMM_BLOCK_BYTES // max(1, per_image)))
            # weights larger than a block's patches are read once for as many images as they
            # weigh (CapsNet's 9x9 stride-2 256 -> 256 on 20x20 maps, 21 MiB of weights and 3 MiB
            # of patches an image, batch 4: 11.4 -> 9.4 ms on 2 threads; torch 9.3)
            nb = max(nb, min(n, -(-weight_bytes // max(1, per_image))))
            for i0 in range(0, n, nb):
                b = min(nb, n - i0)
                cols = self._patches(b * ln)
                fill(cols, i0, b, 0, ho)
                res = _workspace((g, og, b * ln), self.dtype, slot=11)
                _gemm(wmat, cols, res)
                self._late_bias(res)
                _copy_channels(y[i0:i0 + b].reshape(b, g, og, ln),
                               res.reshape(g, og, b, ln).transpose(2, 0, 1, 3), axis=2)
            return y if activation is None else activation_inplace(y, activation)
        threads = _threads_now()
        row_bytes = g * (k + 1) * wo * item  # patches of one output row, all groups
        if GEMM_ROWS_BYTES and threads > 1:
            rows = max(1, min(ho, GEMM_ROWS_BYTES // max(1, row_bytes)))
            if n * -(-ho // rows) >= 2 * threads:  # else too few blocks: split each GEMM instead
                return self._run_gemm_rows(x, y, fill, ho, wo, rows, activation)
        rows = max(1, min(ho, GEMM_BLOCK_BYTES // max(1, row_bytes)))
        for r0 in range(0, ho, rows):
            nr = min(ho, r0 + rows) - r0
            cols = self._patches(nr * wo)
            for i in range(n):
                fill(cols, i, 1, r0, nr)
                out = y[i].reshape(g, og, ho * wo)[:, :, r0 * wo: (r0 + nr) * wo]
                if g == 1:
                    _gemm(wmat[0], cols[0], out[0])
                else:
                    _gemm(wmat, cols, out)
                self._late_bias(out)
        return y if activation is None else activation_inplace(y, activation)

    def _run_gemm_images(self, y, fill, ln, nb, activation):
        """Small images at batch > 1, as :meth:`_run_gemm_rows` does rows: each thread takes
        whole blocks of ``nb`` images side by side, its own im2col, a one-thread GEMM, the fused
        activation and the copy into the output, one hand-off for the whole convolution (the
        shared steps made three per block: 34 hand-offs for 32 images of 28x28, 32 -> 48
        channels, 9.2 ms on two threads against 9.7 on one, on a VM where each costs ~90 us)."""
        n = y.shape[0]
        g = self.groups
        og = self.o // g
        wm = self._pack_gemm()
        nblk = -(-n // nb)

        def part(lo, hi):
            for t in range(lo, hi):
                i0 = t * nb
                b = min(nb, n - i0)
                cols = self._patches(b * ln, slot=16)
                res = self._patch_product(wm, fill, cols, i0, b, 0, y.shape[2], activation)
                np.copyto(y[i0:i0 + b].reshape(b, g, og, ln), res.reshape(g, og, b, ln).transpose(2, 0, 1, 3))
        _parallel(part, nblk, 1 << 62)
        return y

    def _patch_product(self, wm, fill, cols, i0: int, b: int, r0: int, nr: int, activation):
        """On the calling thread: ``cols`` (its last row already ones with ``bias_column``)
        filled with the patches of images [i0, i0+b), output rows [r0, r0+nr), times the GEMM
        weights ``wm`` into a per-thread (groups, outputs per group, columns) result, the bias
        (without ``bias_column``) and ``activation`` applied in place."""
        g = self.groups
        fill(cols, i0, b, r0, nr, inline=True)
        res = _workspace((g, self.o // g, cols.shape[2]), self.dtype, slot=17)
        _mm(wm[0], cols[0], res[0]) if g == 1 else np.matmul(wm, cols, out=res)
        self._late_bias(res)
        return res if activation is None else activation_inplace(res, activation)  # (contiguous: in place)

    def _run_gemm_rows(self, x, y, fill, ho, wo, rows, activation):
        """Each thread takes whole blocks of output rows of one image (about GEMM_ROWS_BYTES of
        patches, so they stay in its cache): its own im2col, a one-thread GEMM (one per group)
        into its own contiguous result, the fused activation there, one copy into the output.
        Measured against im2col and GEMM each split over the threads for YOLOv5n's 6x6 stride-2
        stem (1x3x640x640, 16 outputs, SiLU): 7.7 against 9.4 ms on 2 cores; ResNeXt's grouped
        3x3 (128 channels in 32 groups at 56x56): 1.3 against 2.1 ms, whose whole-image patches
        (15 MiB) left the cache between the copy and the GEMM. Used when there are at least two
        blocks per thread (a 7x7 map is one block: one thread would do all of its GEMM)."""
        n = x.shape[0]
        g = self.groups
        og = self.o // g
        wm = self._pack_gemm()
        nblk = -(-ho // rows)

        def part(lo, hi):
            cols = self._patches(rows * wo, slot=16)
            for t in range(lo, hi):
                i, r0 = divmod(t, nblk)
                r0 *= rows
                nr = min(ho, r0 + rows) - r0
                c = cols[:, :, :nr * wo] if nr < rows else cols
                res = self._patch_product(wm, fill, c, i, 1, r0, nr, activation)
                y[i].reshape(g, og, ho * wo)[:, :, r0 * wo: (r0 + nr) * wo] = res
        _parallel(part, n * nblk, 1 << 62)  # the copies and activation inside run inline per thread
        return y

    def _gemm_bases(self, x, ho, wo):
        """The arrays the im2col reads: the zero-padded input, or for a strided convolution its
        ``sh*sw`` phases ``xpad[:, :, p::sh, q::sw]`` stored contiguously (then every patch row
        is a unit-stride run)."""
        (sh, sw) = self.stride
        if (sh, sw) == (1, 1) or len(self.blocks) == 1 and self.blocks[0].phase is None:
            return {None: _pad_zeros(x, self.pads)}
        n, c, h, w = x.shape
        hq = ho + max(blk.oi0 + (blk.ni - 1) * blk.si for blk in self.blocks)
        wq = wo + max(blk.oj0 + (blk.nj - 1) * blk.sj for blk in self.blocks)
        (t, _), (l, _) = self.pads
        hh, ww = max(0, min(h, sh * hq - t)), max(0, min(w, sw * wq - l))
        ph = _workspace((sh, sw, n, c, hq, wq), self.dtype, slot=12)

        def part(lo, hi):
            for p in range(sh):
                for q in range(sw):
                    _fill_phase(ph[p, q, :, lo:hi], x[:, lo:hi], p, q, sh, sw, t, l, hh, ww)
        _parallel(part, c, ph.size)
        return {(p, q): ph[p, q] for p in range(sh) for q in range(sw)}

    def _run_depthwise(self, x, ho, wo, activation=None):
        """Stride and dilation are handled by a polyphase split: tap (i, j) reads phase
        ``(i*dh % sh, j*dw % sw)`` of the padded input at offset ``(i*dh // sh, j*dw // sw)``, a
        stride-1 access. Each phase is stored flat with row length ``wq``, so every tap is one
        contiguous slice of length ``ho*wq`` (the ``wq - wo`` extra columns are dropped at the
        end, fused with the bias add). Channels are processed in L2-sized blocks on the pool."""
        n, c = x.shape[:2]
        if _numba is not None and self.dtype in _FLOATS:
            return self._run_depthwise_numba(x, ho, wo, activation)
        # the dense and band paths multiply whole rows by matrices holding zeros: an inf or NaN
        # in the input would reach outputs that do not read it (0 * inf), so a result that is
        # not all finite is made again by the taps below (torch's NaN and inf where torch has them)
        if self._dense_ok(n, x.shape[2], x.shape[3], ho, wo):
            y = self._run_depthwise_dense(x, ho, wo, activation)
            if _all_finite(y):
                return y
        elif self._banded(ho, wo):
            y = self._run_depthwise_band(x, ho, wo, activation)
            if _all_finite(y):
                return y
        if (self.mult == 1 and self.stride == (1, 1) and self.dilation == (1, 1)
                and self.dtype in _FLOATS
                and (self.kh * self.kw >= DEPTHWISE_EINSUM_MIN_TAPS
                     or (ho * wo > DEPTHWISE_NHWC_MAX_PIXELS and _is_channels_last(x)))):
            # (a large map already channels-last, the (B, C, H, W) view of a transformer's tokens:
            # PVT-v2's and Twins' positional 3x3s, no transposing gather per channel block:
            # 256x56x56 at batch 4 18.4 -> 5.7 ms; small maps keep the channels-last taps)
            return self._run_depthwise_einsum(x, ho, wo, activation)
        if self.mult == 1 and ho * wo <= DEPTHWISE_NHWC_MAX_PIXELS:
            return self._run_depthwise_nhwc(x, ho, wo, activation)
        if self.mult != 1:
            x = np.repeat(x, self.mult, axis=1)
        h, w = x.shape[2:]
        (sh, sw), (dh, dw) = self.stride, self.dilation
        (t, _), (l, _) = self.pads
        o = self.o
        taps = [((i * dh) % sh, (j * dw) % sw, (i * dh) // sh, (j * dw) // sw)
                for i in range(self.kh) for j in range(self.kw)]
        hq = ho + max(tp[2] for tp in taps) + 1  # one spare row for the flat overrun
        wq = wo + max(tp[3] for tp in taps)
        hp, wp = sh * hq, sw * wq
        hh, ww = max(0, min(h, hp - t)), max(0, min(w, wp - l))
        y = _out((n, o, ho, wo), self.dtype)
        bias = None if self.bias is None else self.bias.reshape(o, 1, 1)
        per_channel = (hp * wp + 2 * ho * wq) * self.dtype.itemsize
        # blocks of channels of one image at a time (several images per block only when one
        # image's channels are small): the accumulators stay in cache between the tap passes
        per_image = o * per_channel
        ni = max(1, min(n, DEPTHWISE_BLOCK_BYTES // max(1, per_image)))
        block = max(1, min(o, DEPTHWISE_BLOCK_BYTES // max(1, ni * per_channel)))

        def part(c0, c1):
            for i0, b0 in ((i0, b0) for i0 in range(0, n, ni) for b0 in range(c0, c1, block)):
                i1 = min(n, i0 + ni)
                b1 = min(c1, b0 + block)
                self._depthwise_block(x, y, bias, i0, i1, b0, b1, ho, wo, hq, wq, hh, ww, taps, activation)
        # split over the threads only when the tap passes are long: two threads making the
        # short calls of a small map at once run slower than one (16 channels 112 -> 56, stride
        # 2: 361 us on one thread, 505 on two; 32 channels at 112x112: 1401 against 678), in all
        # and per call (see DEPTHWISE_PASS_SPLIT_MIN)
        work = y.size * len(taps)
        _parallel(part, o, _tap_work(work if work >= DEPTHWISE_SPLIT_MIN else 0, o, block, ni * ho * wq))
        return y

    def _dense_ok(self, n: int, h: int, w: int, ho: int, wo: int) -> bool:
        """Whether a call runs :meth:`_run_depthwise_dense` (see DEPTHWISE_DENSE_MAX_BYTES)."""
        if self.mult != 1 or self.dtype not in _FLOATS:
            return False
        if self.o * h * w * ho * wo * self.dtype.itemsize > DEPTHWISE_DENSE_MAX_BYTES:
            return False
        ratio = DEPTHWISE_DENSE_RATIO_BATCHED if n >= DEPTHWISE_DENSE_MIN_BATCH else DEPTHWISE_DENSE_RATIO
        return h * w <= ratio * self.kh * self.kw

    def _dense_matrix(self, h: int, w: int, ho: int, wo: int) -> np.ndarray:
        """(C, H*W, Ho*Wo): entry ``[c, p, q]`` is the weight of channel c's tap that carries
        input pixel p to output pixel q (0 where none does); made once per input size."""
        m = self._dense.get((h, w))
        if m is None:
            (sh, sw), (dh, dw) = self.stride, self.dilation
            (t, _), (l, _) = self.pads
            m = np.zeros((self.o, h * w, ho * wo), dtype=self.dtype)
            oy, ox = np.arange(ho), np.arange(wo)
            for i in range(self.kh):
                iy = oy * sh - t + i * dh
                ry = (iy >= 0) & (iy < h)
                for j in range(self.kw):
                    ix = ox * sw - l + j * dw
                    rx = (ix >= 0) & (ix < w)
                    if not (ry.any() and rx.any()):
                        continue  # a tap that only ever reads padding
                    src = (iy[ry][:, None] * w + ix[rx][None, :]).ravel()
                    dst = (oy[ry][:, None] * wo + ox[rx][None, :]).ravel()
                    # (taps reach distinct (input, output) pairs: the offset names the tap)
                    m[:, src, dst] = self.wtaps[i * self.kw + j]
            if len(self._dense) >= 2:  # inputs of ever new sizes: keep the memory bounded
                self._dense.clear()
            self._dense[(h, w)] = m
        return m

    def _run_depthwise_dense(self, x, ho, wo, activation=None):
        """Each channel's convolution as one matrix product of its (images, H*W) pixels with
        its (H*W, Ho*Wo) tap matrix (:meth:`_dense_matrix`): for kernels covering much of a
        small map, one batched GEMM call instead of two numpy calls per tap."""
        n, c, h, w = x.shape
        m = self._dense_matrix(h, w, ho, wo)
        xv = _channels_by_pixels(x)
        if xv is None:
            xv = np.ascontiguousarray(x).reshape(n, c, h * w)
        y = _out((n, c, ho, wo), self.dtype)
        yv = y.reshape(n, c, ho * wo)
        bias = None if self.bias is None else self.bias.reshape(c, 1, 1)

        def part(c0, c1):
            t = _workspace((c1 - c0, n, ho * wo), self.dtype, slot=28)
            np.matmul(xv[:, c0:c1].transpose(1, 0, 2), m[c0:c1], out=t)
            _bias_activate(t, None if bias is None else bias[c0:c1], activation)
            np.copyto(yv[:, c0:c1], t.transpose(1, 0, 2))
        _parallel(part, c, n * c * h * w * ho * wo // 8)
        return y

    def _banded(self, ho: int, wo: int) -> bool:
        """Whether a call with an ``ho x wo`` output runs :meth:`_run_depthwise_band` (not on
        maps small enough for the channels-last taps, where one band is a few rows of a few
        pixels: 7x7 kernel over 384x14x14 1.24 against 1.48 ms, over 768x7x7 0.92 against 0.51;
        nor up to DEPTHWISE_BAND_MIN_PIXELS, where the einsum is faster)."""
        return (self.mult == 1 and self.kh * self.kw >= DEPTHWISE_BAND_MIN_TAPS
                and ho * wo > max(DEPTHWISE_NHWC_MAX_PIXELS, DEPTHWISE_BAND_MIN_PIXELS)
                and self.stride == (1, 1) and self.dilation == (1, 1)
                and self.dtype in _FLOATS)

    def _run_depthwise_band(self, x, ho, wo, activation=None):
        """A stride-1 depthwise convolution as GEMMs: the output row is cut into ``nb`` bands of
        ``bw`` columns; band ``b`` of output row ``r`` is ``sum_i X[r + i, b] @ T_i``, where
        ``X[p, b]`` holds the ``L = bw + kw - 1`` padded input columns the band reads from padded
        row ``p`` and ``T_i`` is the channel's ``(L, bw)`` banded (Toeplitz) matrix of kernel row
        ``i``. The sum over ``i`` is folded into the GEMM's inner dimension: one strided copy lays
        out ``[X[r, b], X[r + 1, b], ..., X[r + kh - 1, b]]`` as the rows of a ``(Ho*nb, kh*L)``
        matrix, multiplied by the ``(kh*L, bw)`` stack of the ``T_i``: one GEMM per channel
        instead of kh GEMMs and kh - 1 accumulating passes (2 threads of a Zen 3, batch 1: 9x9
        over 256x32x32 3.9 -> 2.8 ms, 7x7 over 96x56x56 3.7 -> 2.8). About ``L/kw`` (~3) times
        the multiply-adds of the taps, at BLAS speed instead of ``2*kh*kw`` elementwise passes.
        Blocks of (image, channels) are split over the threads; the bias and fused activation
        are applied per block."""
        n, _, h, w = x.shape
        kh, kw, o = self.kh, self.kw, self.o
        (t, _), (l, _) = self.pads
        nb = -(-wo // DEPTHWISE_BAND_WIDTH)
        bw = -(-wo // nb)
        L = bw + kw - 1
        hp, wq = ho + kh - 1, nb * bw + kw - 1
        hh, ww = max(0, min(h, hp - t)), max(0, min(w, wq - l))
        dt, item = self.dtype, self.dtype.itemsize
        y = _out((n, o, ho, wo), dt)
        exact = nb * bw == wo
        src, bands = self._band_source(bw)
        bias = None if self.bias is None else self.bias.reshape(o, 1, 1)
        per_channel = (hp * wq + ho * nb * kh * L + (0 if bands is not None else kh * L * bw)
                       + (0 if exact else ho * nb * bw)) * item
        cb = max(1, min(o, DEPTHWISE_BAND_BLOCK_BYTES // per_channel))
        nblocks = -(-o // cb)
        es0, es1, es2 = src.strides

        def part(lo, hi):
            for job in range(lo, hi):
                i, k = divmod(job, nblocks)
                c0 = k * cb
                c1 = min(o, c0 + cb)
                m = c1 - c0
                xp = _workspace((m, hp, wq), dt, slot=23)
                xp[:, :t] = 0
                xp[:, t + hh:] = 0
                xp[:, t:t + hh, :l] = 0
                xp[:, t:t + hh, l + ww:] = 0
                xp[:, t:t + hh, l:l + ww] = x[i, c0:c1, :hh, :ww]
                s0, s1, s2 = xp.strides
                # xb[c, r, b, i, v] = padded input row r + i, column b*bw + v
                xb = _workspace((m, ho, nb, kh, L), dt, slot=24)
                np.copyto(xb, as_strided(xp, (m, ho, nb, kh, L), (s0, s1, bw * s2, s1, s2), writeable=False))
                if bands is not None:
                    tb = bands[c0:c1]
                else:  # T_i[v, u] = w[i, v - u] (zero outside the kernel): src[c, i, bw - 1 + v - u]
                    tb = _workspace((m, kh, L, bw), dt, slot=25)
                    np.copyto(tb, as_strided(src[c0:c1, :, bw - 1:], (m, kh, L, bw), (es0, es1, es2, -es2),
                                             writeable=False))
                acc = (y[i, c0:c1].reshape(m, ho * nb, bw) if exact
                       else _workspace((m, ho * nb, bw), dt, slot=27))
                np.matmul(xb.reshape(m, ho * nb, kh * L), tb.reshape(m, kh * L, bw), out=acc)
                if bias is not None:
                    acc += bias[c0:c1]
                if activation is not None:
                    _activate_block(acc, activation)
                if not exact:
                    y[i, c0:c1] = acc.reshape(m, ho, nb * bw)[:, :, :wo]
        _parallel(part, n * nblocks, y.size * kh * kw)
        return y

    def _band_source(self, bw: int) -> tuple[np.ndarray, np.ndarray | None]:
        """For band width ``bw``: (O, kh, kw + 2*bw - 2), each kernel row between ``bw - 1`` zeros
        on either side, the array the band matrices are strided views of; and the band matrices
        themselves, (O, kh, bw + kw - 1, bw), when they take at most DEPTHWISE_BAND_CACHE_BYTES
        (else None: each block copies its own; that strided copy cost more than the GEMMs on
        14x14 maps, 0.13 ms per 88 channels of a 7x7 kernel)."""
        got = self._bands.get(bw)
        if got is None:
            kh, kw = self.kh, self.kw
            src = np.zeros((self.o, kh, kw + 2 * bw - 2), self.dtype)
            src[:, :, bw - 1: bw - 1 + kw] = self.wtaps.reshape(kh, kw, self.o).transpose(2, 0, 1)
            shape = (self.o, kh, bw + kw - 1, bw)
            bands = None
            if math.prod(shape) * self.dtype.itemsize <= DEPTHWISE_BAND_CACHE_BYTES:
                s0, s1, s2 = src.strides
                bands = np.ascontiguousarray(as_strided(src[:, :, bw - 1:], shape, (s0, s1, s2, -s2),
                                                        writeable=False))
            got = self._bands[bw] = (src, bands)  # a concurrent first call at worst makes it twice
        return got

    def _run_depthwise_numba(self, x, ho, wo, activation=None):
        """The compiled kernel (``numba_kernels.depthwise_channels``) per image, channels split
        over the threads; ReLU/clamp fused in the kernel, other activations applied after."""
        n = x.shape[0]
        o = self.o
        if self.wnumba is None:
            self.wnumba = np.ascontiguousarray(self.wtaps.reshape(self.kh, self.kw, o).transpose(2, 0, 1))
            self.bnumba = np.zeros(o, self.dtype) if self.bias is None else self.bias
        x = np.ascontiguousarray(x)
        y = _out((n, o, ho, wo), self.dtype)
        clamp, lo, hi = False, 0.0, 0.0
        if activation == "relu":
            clamp, lo, hi, activation = True, 0.0, np.inf, None
        elif isinstance(activation, tuple) and activation[0] == "clamp":
            lo = -np.inf if activation[1] is None else float(activation[1])
            hi = np.inf if activation[2] is None else float(activation[2])
            clamp, activation = True, None
        (sh, sw), (dh, dw), ((t, _), (l, _)) = self.stride, self.dilation, self.pads
        kernel = _numba.depthwise_channels

        def part(c0, c1):
            for i in range(n):
                kernel(x[i], self.wnumba, self.bnumba, y[i], c0, c1, self.mult, sh, sw, dh, dw, t, l, clamp, lo, hi)
        _parallel(part, o, y.size * self.kh * self.kw)
        return y if activation is None else activation_inplace(y, activation)

    def _run_depthwise_einsum(self, x, ho, wo, activation=None):
        """Stride-1 depthwise convolutions with large kernels on small maps (ConvNeXt's 7x7 at
        28x28, 14x14 and 7x7; maps of more than DEPTHWISE_BAND_MIN_PIXELS outputs take the
        banded GEMMs), channels-last: the padded input is
        copied once to (N, Hp, Wp, C), and each block of output rows is one
        ``einsum('hwcij,ijc->hwc')`` over a strided (rows, Wo, C, kh, kw) window view of it, the
        kh*kw taps summed inside numpy's loop instead of 2*kh*kw passes over the output (2
        threads, batch 1, the machine loaded alike: 512x14x14 1.79 -> 0.77 ms, 1024x7x7 0.61 ->
        0.47; torch 0.31 / 0.19). Returned as the (N, C, H, W) view of the channels-last
        result, as :meth:`_run_depthwise_nhwc` does."""
        n, c, h, w = x.shape
        (t, b), (l, r) = self.pads
        hp, wp = h + t + b, w + l + r
        kh, kw = self.kh, self.kw
        if self._wtiles.get("einsum") is None:  # (kh, kw, C), made once
            self._wtiles["einsum"] = np.ascontiguousarray(self.wtaps.reshape(kh, kw, c))
        wt = self._wtiles["einsum"]
        xp = _workspace((n, hp, wp, c), self.dtype, slot=14)
        xp[:, :t] = 0
        xp[:, t + h:] = 0
        xp[:, t:t + h, :l] = 0
        xp[:, t:t + h, l + w:] = 0
        xn = x.transpose(0, 2, 3, 1)

        def fill(lo, hi):  # (the channels-last copy, split over the threads by rows)
            for u in range(lo, hi):
                i, row = divmod(u, h)
                xp[i, t + row, l:l + w] = xn[i, row]
        _parallel(fill, n * h, x.size)
        y = _pooled((n, ho, wo, c), self.dtype)
        s0, s1, s2, s3 = xp.strides
        bias, step = self.bias, max(1, EINSUM_ROWS_ELEMENTS // max(1, wo * c))

        def part(lo, hi):
            for u0 in range(lo, hi, step):
                u1 = min(hi, u0 + step)
                for i in range(u0 // ho, (u1 - 1) // ho + 1):  # (a block may span two images)
                    r0, r1 = max(u0 - i * ho, 0), min(u1 - i * ho, ho)
                    win = as_strided(xp[i, r0:], shape=(r1 - r0, wo, c, kh, kw), strides=(s1, s2, s3, s1, s2),
                                     writeable=False)
                    acc = y[i, r0:r1]
                    np.einsum("hwcij,ijc->hwc", win, wt, out=acc)
                    if bias is not None:
                        acc += bias
                    if activation is not None:
                        _activate_block(acc, activation)
        _parallel(part, n * ho, y.size * kh * kw)
        return y.transpose(0, 3, 1, 2)

    def _run_depthwise_nhwc(self, x, ho, wo, activation=None):
        """Small maps (many channels, few pixels): channels-last, so that every tap pass runs
        along contiguous channel vectors (the planar form's rows of 7 or 14 pixels make numpy's
        inner loops too short). The padded input is one copy per block of images (a plain copy
        when ``x`` is itself a channels-last view). The result is computed in a channels-last
        pooled array and returned as its (N, C, H, W) view: a 1x1 convolution reads that as a
        transposed operand, and copying it back to planar took longer than the taps (122 of 450
        us for 384 channels at 14x14). At stride 1 each tap's weights are tiled along the output
        row, so a tap pass is one multiply over runs of ``wo*C`` values, not ``C``."""
        n, c, h, w = x.shape
        (sh, sw), (dh, dw) = self.stride, self.dilation
        (t, b), (l, r) = self.pads
        hp, wp = h + t + b, w + l + r
        item = self.dtype.itemsize
        per_image = (hp * wp + 2 * ho * wo) * c * item
        ni = max(1, min(n, DEPTHWISE_BLOCK_BYTES // max(1, per_image)))
        y = _pooled((n, ho, wo, c), self.dtype)
        bias = self.bias
        taps = [(i * dh, j * dw) for i in range(self.kh) for j in range(self.kw)]
        if sw == 1:
            wts = self._wtiles.get(wo)
            if wts is None:  # (taps, wo, C): made once per output width
                wts = self._wtiles[wo] = np.ascontiguousarray(
                    np.broadcast_to(self.wtaps[:, None, :, 0], (len(taps), wo, c)))
        else:
            wts = self.wtaps[:, :, 0]
        xn = x.transpose(0, 2, 3, 1)

        def part(lo, hi):
            for i0 in range(lo, hi, ni):
                i1 = min(hi, i0 + ni)
                m = i1 - i0
                xp = _workspace((m, hp, wp, c), self.dtype, slot=13)
                xp[:, :t] = 0
                xp[:, t + h:] = 0
                xp[:, t:t + h, :l] = 0
                xp[:, t:t + h, l + w:] = 0
                xp[:, t:t + h, l:l + w] = xn[i0:i1]
                acc = y[i0:i1]
                tmp = _workspace((m, ho, wo, c), self.dtype, slot=15)
                for k, (oi, oj) in enumerate(taps):
                    v = xp[:, oi: oi + sh * (ho - 1) + 1: sh, oj: oj + sw * (wo - 1) + 1: sw]
                    if k == 0:
                        np.multiply(v, wts[k], out=acc)
                    else:
                        np.multiply(v, wts[k], out=tmp)
                        acc += tmp
                if bias is not None:
                    acc += bias
                if activation is not None:
                    _activate_block(acc, activation)
        # split over the threads only when each tap pass of a thread's share stays long (see
        # DEPTHWISE_PASS_SPLIT_MIN; a strided pass reads sh*sw times the span of its outputs)
        _parallel(part, n, _tap_work(y.size * len(taps), n, ni, ho * wo * c * sh * sw))
        return y.transpose(0, 3, 1, 2)

    def _depthwise_block(self, x, y, bias, i0, i1, b0, b1, ho, wo, hq, wq, hh, ww, taps, activation):
        """Images [i0, i1), channels [b0, b1) of a depthwise convolution (see _run_depthwise)."""
        (sh, sw) = self.stride
        (t, _), (l, _) = self.pads
        hp, wp = sh * hq, sw * wq
        nph = sh * sw
        n = i1 - i0
        x = x[i0:i1]
        y = y[i0:i1]
        nb = b1 - b0
        if nph == 1:
            xp = _workspace((n, nb, hp, wp), self.dtype, slot=7)
            _pad_into(xp, x[:, b0:b1, :hh, :ww], (t, l))
            phases = xp.reshape(1, n, nb, hq * wq)
        else:
            # the phases of the zero-padded input, written straight from the input: phase
            # (p, q) row r / column cc is padded row sh*r + p, i.e. input row sh*r + p - t
            phases = _workspace((sh, sw, n, nb, hq, wq), self.dtype, slot=8)
            for p in range(sh):
                for q in range(sw):
                    _fill_phase(phases[p, q], x[:, b0:b1], p, q, sh, sw, t, l, hh, ww)
            phases = phases.reshape(nph, n, nb, hq * wq)
        acc = _workspace((n, nb, ho * wq), self.dtype, slot=9)
        tmp = _workspace((n, nb, ho * wq), self.dtype, slot=10)
        for k, (p, q, oi, oj) in enumerate(taps):
            off = oi * wq + oj
            v = phases[p * sw + q, :, :, off: off + ho * wq]
            wt = self.wtaps[k, b0:b1]
            if k == 0:
                np.multiply(v, wt, out=acc)
            else:
                np.multiply(v, wt, out=tmp)
                acc += tmp
        if activation is not None:  # bias and activation while the block is in cache
            if bias is not None:
                acc += bias[b0:b1, :, 0]
            acc = activation_inplace(acc, activation)  # in place but for float16
            y[:, b0:b1] = acc.reshape(n, nb, ho, wq)[:, :, :, :wo]
            return
        src = acc.reshape(n, nb, ho, wq)[:, :, :, :wo]
        if bias is None:
            y[:, b0:b1] = src
        else:
            np.add(src, bias[b0:b1], out=y[:, b0:b1])

    def _run_winograd(self, x, ho, wo, activation=None):
        d = self.dilation[0]
        if d > 1:
            n, c, h, w = x.shape
            hd, wd = -(-h // d), -(-w // d)
            if min(hd, wd) < WINOGRAD_DILATED_MIN_SIDE or n * h * w < WINOGRAD_MIN_PIXELS:
                return self._run_gemm(x, ho, wo, activation)
        elif x.shape[0] * ho * wo < WINOGRAD_MIN_PIXELS:
            return self._run_gemm(x, ho, wo, activation)
        wino = self.wino
        if wino is None:  # a concurrent first call at worst transforms twice
            wino = self.wino = _Winograd(self._weight, self.bias, self.tile)
        finite: list[bool] = []
        if d == 1:
            y = wino(x, self.pads, ho, wo, finite=finite, activation=activation)
        else:
            y = self._run_winograd_phases(wino, x, d, hd, wd, finite)
            if all(finite) and activation is not None:
                y = activation_inplace(y, activation)
        if all(finite):
            return y
        # the transforms mix each tile (an inf or NaN reaches every output of its tile, and
        # inputs over ~1e36 overflow F(4x4, 3x3)'s): a result that is not all finite is made
        # again as a GEMM, whose inf and NaN are torch's
        return self._run_gemm(x, ho, wo, activation)

    def _run_winograd_phases(self, wino, x, d, hd, wd, finite: list | None = None):
        """A 3x3 convolution of dilation d and padding d as an undilated one with padding 1 over
        the d*d polyphase sub-images ``x[:, :, r::d, s::d]`` side by side in one batch: output
        ``(d*i + r, d*j + s)`` reads inputs ``(d*(i + a - 1) + r, d*(j + b - 1) + s)``, all in
        sub-image (r, s). An input whose sides are not multiples of d is extended with zeros
        (what the padding would read anyway) and the output cropped."""
        n, c, h, w = x.shape
        o = self.o
        hp, wp = hd * d, wd * d
        ph = _workspace((n, d, d, c, hd, wd), x.dtype, slot=70)
        src = x
        if (hp, wp) != (h, w):
            src = _workspace((n, c, hp, wp), x.dtype, slot=71)
            src[:, :, h:] = 0
            src[:, :, :h, w:] = 0
            _copy_channels(src[:, :, :h, :w], x, axis=1)
        _phase_copies(ph, _view(src, (n, c, hd, d, wd, d)), d, to_phases=True)
        yp = wino(_view(ph, (n * d * d, c, hd, wd)), ((1, 1), (1, 1)), hd, wd,
                  out=_workspace((n * d * d, o, hd, wd), x.dtype, slot=72), finite=finite)
        y = _out((n, o, h, w), x.dtype)
        full = y if (hp, wp) == (h, w) else _workspace((n, o, hp, wp), x.dtype, slot=71)
        _phase_copies(_view(yp, (n, d, d, o, hd, wd)), _view(full, (n, o, hd, d, wd, d)), d, to_phases=False)
        if full is not y:
            _copy_channels(y, full[:, :, :h, :w], axis=1)
        return y


def conv2d_plan(weight, bias=None, *, stride=(1, 1), dilation=(1, 1), groups=1,
                pads=((0, 0), (0, 0)), algo: str | None = None, input_hw=None,
                tile: int | None = None, transient: bool = False) -> Conv2dPlan | None:
    """A :class:`Conv2dPlan` for float weights, or None (the caller then uses the generic path).
    ``algo`` forces ``"gemm"``, ``"1x1"``, ``"depthwise"`` or ``"winograd"`` (with ``tile`` 2 or 4);
    ``input_hw`` is the input's spatial size when known at build. ``transient`` plans (weights
    that arrive as graph inputs, planned per call) never pick Winograd, whose weight transform
    would not be amortised."""
    w = np.asarray(weight)
    if w.ndim != 4 or w.dtype.kind != "f":
        return None
    auto = algo is None
    if transient and algo is None:
        algo, _ = choose_algorithm(w.shape[0], w.shape[1], w.shape[2:], stride, dilation, groups, pads,
                                   w.dtype, input_hw)
        algo = "gemm" if algo == "winograd" else algo
    plan = Conv2dPlan(w, bias, stride, dilation, groups, pads, algo, input_hw, tile)
    plan.small_ok = auto
    return plan


# -- Winograd F(m x m, 3x3) -----------------------------------------------------------------------
def _winograd_matrices(m: int):
    """B^T, G, A^T of Lavin & Gray for F(2,3) (points 0, 1, -1) and F(4,3) (0, 1, -1, 2, -2)."""
    if m == 2:
        bt = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
        g = [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]]
        at = [[1, 1, 1, 0], [0, 1, -1, -1]]
    elif m == 4:
        bt = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
              [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]
        g = [[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
             [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]
        at = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]
    else:
        raise ValueError(f"Winograd tile must be 2 or 4, got {m}")
    return (np.array(bt, dtype=np.float64), np.array(g, dtype=np.float64), np.array(at, dtype=np.float64))


class _Winograd:
    """F(m x m, 3x3) for 3x3 stride-1 convolutions, every step a BLAS call or one strided copy:

    1. copy the overlapping (m+2)^2 input tiles of each channel into ``d`` laid out
       ``((m+2)^2, C*T)`` (T tiles per image; one ``np.copyto`` from an ``as_strided`` view);
    2. ``V = (B^T kron B^T) @ d``; 3. ``M[k] = U[k] @ V[k]`` for the (m+2)^2 transformed kernels
       ``U = G g G^T`` (packed ``((m+2)^2, O, C)`` at build); the bias is added to the one
       component that A^T spreads evenly over the tile, ``M[(1, 1)]`` (A^T's column 1 is all ones);
    4. ``Y = (A^T kron A^T) @ M`` and one strided copy of the ``m x m`` output tiles into NCHW.

    It replaces the 9 multiplications per output of the direct method by (m+2)^2/m^2 (4 for
    F(2,3), 2.25 for F(4,3)), at the price of the transforms and a larger rounding error
    (measured against torch in float32: about 1e-6 of max|y| for F(2,3), 1e-5 for F(4,3)).
    """

    def __init__(self, w: np.ndarray, bias, m: int):
        bt, g, at = _winograd_matrices(m)
        self.m, self.a = m, m + 2
        o, c = w.shape[:2]
        # U[a, b, o, c] = sum_ij G[a, i] w[o, c, i, j] G[b, j], as one GEMM with kron(G, G)
        # (einsum without BLAS took ~30 ms per ResNet layer at load)
        # (in the weights' precision: a float64 pass made float64 temporaries of 36*O*C values
        # and doubled ResNet-18's load time; the transform's rounding, ~1e-7 of |w|, is far
        # below the Winograd transforms' own at run time)
        gg = np.kron(g, g).astype(w.dtype)  # (a*a, 9)
        self.u = (gg @ w.reshape(o * c, 9).T).reshape(self.a * self.a, o, c)
        self.bk = np.kron(bt, bt).astype(w.dtype)
        ak = np.kron(at, at)
        # one more row, the sum of the others: each tile's outputs summed by the output GEMM
        # itself, so that whether the result is all finite is a reduction over 1/m**2 of it
        self.ak = np.concatenate([ak, ak.sum(axis=0, keepdims=True)]).astype(w.dtype)
        self.bias = None if bias is None else np.asarray(bias, dtype=w.dtype).reshape(o, 1)
        self.o, self.c = o, c

    def __call__(self, x: np.ndarray, pads, ho: int, wo: int, out: np.ndarray | None = None,
                 finite: list | None = None, activation: Any = None) -> np.ndarray:
        """The convolution, ``activation`` applied (a spec of :func:`activation_inplace`);
        ``finite``, a list, receives whether every output is finite (from the tiles' sums, see
        ``ak``; an activation cannot hide a non-finite value there, it comes before it)."""
        n, c = x.shape[:2]
        nt = -(-ho // self.m) * -(-wo // self.m)
        ratio = WINOGRAD_BLOCKS_MIN_RATIO if n == 1 else WINOGRAD_BLOCKS_BATCH_MIN_RATIO
        if n * nt >= ratio * max(c, self.o):
            return self._blocks(x, pads, ho, wo, out, finite, activation)
        y = self._steps(x, pads, ho, wo, out, finite)
        return y if activation is None else activation_inplace(y, activation)

    def _steps(self, x, pads, ho, wo, out, finite):
        """Chunks of images, each of the five steps split over the threads."""
        m, a, o = self.m, self.a, self.o
        n, c, h, w = x.shape
        th, tw = -(-ho // m), -(-wo // m)
        nt = th * tw
        (t, _), (l, _) = pads
        hp, wp = m * th + 2, m * tw + 2
        hh, ww = min(h, hp - t), min(w, wp - l)
        item = x.dtype.itemsize
        # images per chunk: small images share the GEMMs (their tiles side by side)
        nb = max(1, min(n, WINOGRAD_CHUNK_BYTES // max(1, a * a * max(c, o) * nt * item)))
        y = _out((n, o, ho, wo), x.dtype) if out is None else out
        exact = ho == m * th and wo == m * tw
        for i0 in range(0, n, nb):
            i1 = min(n, i0 + nb)
            b = i1 - i0
            xp = _workspace((b, c, hp, wp), x.dtype, slot=4)
            d = _workspace((a * a, c * b * nt), x.dtype, slot=1)
            v = _workspace((a * a, c * b * nt), x.dtype, slot=2)
            mm = _workspace((a * a, o, b * nt), x.dtype, slot=3)
            yy = _workspace((m * m + 1, o * b * nt), x.dtype, slot=6)
            s = xp.strides
            tiles = as_strided(xp, shape=(a, a, c, b, th, tw),
                               strides=(s[2], s[3], s[1], s[0], m * s[2], m * s[3]), writeable=False)
            d6 = d.reshape(a, a, c, b, th, tw)
            xs = x[i0:i1]

            def load(lo, hi, xs=xs, xp=xp, tiles=tiles, d6=d6):
                _pad_into(xp[:, lo:hi], xs[:, lo:hi, :hh, :ww], (t, l))
                np.copyto(d6[:, :, lo:hi], tiles[:, :, lo:hi])
            _parallel(load, c, d.size)
            _gemm(self.bk, d, v)
            _gemm(self.u, v.reshape(a * a, c, b * nt), mm)
            if self.bias is not None:
                mm[a + 1] += self.bias
            _gemm(self.ak, mm.reshape(a * a, o * b * nt), yy)
            if finite is not None:
                finite.append(_all_finite(yy[m * m]))
            full = y[i0:i1] if exact else _workspace((b, o, m * th, m * tw), x.dtype, slot=5)
            st = full.strides
            dst = as_strided(full, shape=(m, m, o, b, th, tw),
                             strides=(st[2], st[3], st[1], st[0], m * st[2], m * st[3]))
            _copy_channels(dst, yy[:m * m].reshape(m, m, o, b, th, tw), axis=2)
            if not exact:
                _copy_channels(y[i0:i1], full[:, :, :ho, :wo], axis=1)
        return y

    def _items(self, n: int, th: int, tw: int, c: int, item: int, k: int) -> list[tuple[int, int, int, int]]:
        """Work items ``(i0, i1, r0, r1)`` of :meth:`_blocks`: images ``[i0, i1)``, tile rows
        ``[r0, r1)``. With at least ``k`` images and one fitting WINOGRAD_BLOCK_BYTES, whole
        images, a multiple of ``k`` items where the batch allows; else even runs of tile rows of
        one image, at least ``k`` items (a multiple of ``k`` where the rows allow)."""
        cap = max(1, WINOGRAD_BLOCK_BYTES // (self.a * self.a * max(c, self.o) * item))  # tiles
        if n >= k and th * tw <= cap:
            count = -(-n // max(1, min(n, cap // (th * tw))))
            count = min(n, -(-count // k) * k)
            nb = -(-n // count)
            return [(i, min(n, i + nb), 0, th) for i in range(0, n, nb)]
        per = max(-(-th // max(1, cap // tw)), -(-k // n))  # items per image
        while (n * per) % k and per < th:
            per += 1
        nr = -(-th // per)  # (rows spread evenly over them)
        return [(i, i + 1, r, min(th, r + nr)) for i in range(n) for r in range(0, th, nr)]

    def _blocks(self, x, pads, ho, wo, out, finite, activation):
        """Each thread takes the next block of tile rows (:meth:`_items`) and runs on it, in
        its own workspaces: the zero-padded rows, the tile copy, ``V = B d``, ``M = U V`` (bias
        on ``M[(1, 1)]``), ``Y = A M``, the finite test, the copy into NCHW and the activation."""
        m, a, o = self.m, self.a, self.o
        n, c, h, w = x.shape
        th, tw = -(-ho // m), -(-wo // m)
        (t, _), (l, _) = pads
        wp = m * tw + 2
        ww = min(w, wp - l)
        dt = x.dtype
        y = _out((n, o, ho, wo), dt) if out is None else out
        k = _threads_now()
        items = self._items(n, th, tw, c, dt.itemsize, k)
        bk, u, ak, bias = self.bk, self.u, self.ak, self.bias
        ok = [True]
        next_item = itertools.count().__next__  # (atomic under the GIL: threads take items in turn)

        def work(_lo, _hi):
            while True:
                j = next_item()
                if j >= len(items):
                    return
                i0, i1, r0, r1 = items[j]
                nb, nr = i1 - i0, r1 - r0
                tiles = nb * nr * tw
                hb = m * nr + 2
                # padded rows [m*r0, m*r0 + hb) are input rows - t; rows [q0, q1) of xb hold input
                xb = _workspace((nb, c, hb, wp), dt, slot=110)
                p0 = m * r0
                in0, in1 = max(0, p0 - t), min(h, p0 + hb - t)
                _pad_into(xb, x[i0:i1, :, in0:max(in0, in1), :ww], (in0 - p0 + t, l))
                d = _workspace((a * a, c * tiles), dt, slot=111)
                s = xb.strides
                np.copyto(_view(d, (a, a, c, nb, nr, tw)),
                          np.ndarray((a, a, c, nb, nr, tw), dtype=dt, buffer=xb,
                                     strides=(s[2], s[3], s[1], s[0], m * s[2], m * s[3])))
                v = _workspace((a * a, c * tiles), dt, slot=112)
                np.matmul(bk, d, out=v)
                mm = _workspace((a * a, o, tiles), dt, slot=111)  # (d is spent)
                np.matmul(u, _view(v, (a * a, c, tiles)), out=mm)
                if bias is not None:
                    mm[a + 1] += bias
                yy = _workspace((m * m + 1, o * tiles), dt, slot=112)  # (v is spent)
                np.matmul(ak, _view(mm, (a * a, o * tiles)), out=yy)
                if ok[0] and not _all_finite(yy[m * m]):
                    ok[0] = False
                if activation is not None:  # (on the contiguous tiles, before they are scattered)
                    _activate_block(yy[:m * m], activation)
                rows = min(ho - p0, m * nr)
                exact = rows == m * nr and wo == m * tw
                blk = y[i0:i1, :, p0:p0 + rows]
                full = blk if exact else _workspace((nb, o, m * nr, m * tw), dt, slot=113)
                st = full.strides
                np.copyto(as_strided(full, shape=(m, m, o, nb, nr, tw),
                                     strides=(st[2], st[3], st[1], st[0], m * st[2], m * st[3])),
                          _view(yy[:m * m], (m, m, o, nb, nr, tw)))
                if not exact:
                    np.copyto(blk, full[:, :, :rows, :wo])
        _parallel(work, min(k, len(items)), 1 << 62)
        if finite is not None:
            finite.append(ok[0])
        return y


# -- transposed convolution ------------------------------------------------------------------------
class ConvTranspose2dPlan:
    """One GEMM per image maps each input pixel to its ``O/G*kh*kw`` contributions (``cols``);
    col2im then works per output phase ``(py, px)`` (the outputs ``sh*m + py, sw*n + px``): each
    tap that lands on the phase adds one shifted window of its ``cols`` plane, a run of whole
    rows, into a phase buffer started at the bias; the phases are then written into the cropped
    output, one strided copy each (stride 1: the phase buffer is the output). Against adding
    every tap into strided slices of an uncropped output, then cropping and adding the bias:
    64->32 channels, kernel 4, stride 2 on 56x56: 2.4 -> 2.0 ms on 2 cores (torch 1.75; the
    GEMM is 1.4 of it)."""

    def __init__(self, weight, bias, stride, padding, output_padding, dilation, groups):
        w = np.asarray(weight)
        self.c, self.og, self.kh, self.kw = w.shape
        self.groups = int(groups)
        self.cg = self.c // self.groups
        self.o = self.og * self.groups
        self.stride, self.padding = tuple(stride), tuple(padding)
        self.output_padding, self.dilation = tuple(output_padding), tuple(dilation)
        self.dtype = w.dtype
        # (G, og*kh*kw, cg)
        self.wmat = np.ascontiguousarray(
            w.reshape(self.groups, self.cg, self.og * self.kh * self.kw).transpose(0, 2, 1))
        self.bias = None if bias is None else np.asarray(bias, dtype=w.dtype)
        self._bias_col = None if self.bias is None else self.bias.reshape(self.o, 1, 1)

    @staticmethod
    def _phase_taps(size: int, out: int, k: int, s: int, d: int, p: int):
        """Per output phase ``r`` (outputs ``s*m + r``): its length and the ``(tap, offset)``
        pairs landing on it (input row ``m + offset``), with the range of m each one covers."""
        phases = []
        for r in range(min(s, out)):
            length = -(-(out - r) // s)
            taps = []
            for a in range(k):
                t = r + p - a * d
                if t % s:
                    continue
                off = t // s
                m0, m1 = max(0, -off), min(length, size - off)
                if m1 > m0:
                    taps.append((a, off, m0, m1))
            phases.append((r, length, taps))
        return phases

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        if x.dtype != self.dtype:
            x = x.astype(self.dtype)
        n, c, h, w = x.shape
        (sh, sw), (dh, dw), (ph, pw) = self.stride, self.dilation, self.padding
        hf = (h - 1) * sh + dh * (self.kh - 1) + 1 + self.output_padding[0]
        wf = (w - 1) * sw + dw * (self.kw - 1) + 1 + self.output_padding[1]
        ho, wo = hf - 2 * ph, wf - 2 * pw
        if ho <= 0 or wo <= 0:
            from kuiper_xp.errors import ShapeError

            raise ShapeError(f"transposed convolution output would be empty for input {x.shape}")
        y = _out((n, self.o, ho, wo), self.dtype)
        rows = self._phase_taps(h, ho, self.kh, sh, dh, ph)
        cols_ = self._phase_taps(w, wo, self.kw, sw, dw, pw)
        direct = (sh, sw) == (1, 1)
        g = self.groups
        bias = self._bias_col
        hw = h * w
        if n >= 2 and hw >= CONVT_IMAGES_MIN_PIXELS:
            # each thread takes whole images: its own GEMM and col2im, one hand-off a call
            # (against the GEMM and the col2im of each image split over the threads in turn: U-Net's
            # 32 -> 16, kernel 2, stride 2 from 64x64 at batch 4 2.1 -> 1.1 ms on 2 threads, 64 ->
            # 32 from 32x32 1.33 -> 0.86, 128 -> 64 from 16x16 0.80 -> 0.68; kernel 4: 64 -> 32 from
            # 16x16 at batch 8 2.24 -> 1.86, 256 -> 128 from 8x8 at batch 4 2.05 -> 1.88)
            def images(lo, hi):
                for i in range(lo, hi):
                    cols = _workspace((g, self.og * self.kh * self.kw, hw), self.dtype, slot=63)
                    np.matmul(self.wmat, x[i].reshape(g, self.cg, hw), out=cols)
                    self._col2im(y[i], cols.reshape(self.o, self.kh, self.kw, h, w), rows, cols_, 0, self.o,
                                 direct, bias, slot=64)
            _parallel(images, n, 1 << 62)
            return y
        # small maps: several images share one GEMM (SimpleBaseline's 16x12 deconvolutions at
        # batch 4 grew linearly with the batch, image by image) and one col2im, each step over
        # all of them (a DCGAN generator's 4x4 -> 8x8 at batch 8: 5.4 -> 1.5 ms a layer, the
        # col2im's short numpy calls and hand-offs image by image were most of it)
        per = max(1, min(n, GEMM_MIN_COLUMNS // hw)) if hw < GEMM_MIN_COLUMNS else 1
        for i0 in range(0, n, per):
            m = min(per, n - i0)
            cols = _workspace((g, self.og * self.kh * self.kw, m * hw), self.dtype)
            if m == 1:
                xi = np.ascontiguousarray(x[i0]).reshape(g, self.cg, hw)
            else:
                xi = np.ascontiguousarray(x[i0:i0 + m].reshape(m, g, self.cg, hw).transpose(1, 2, 0, 3))
                xi = xi.reshape(g, self.cg, m * hw)
            _gemm(self.wmat, xi, cols)
            cols6 = cols.reshape(self.o, self.kh, self.kw, m, h, w)
            yb = y[i0:i0 + m].transpose(1, 0, 2, 3)  # (O, m, Ho, Wo)

            def col2im(lo, hi, yb=yb, cols6=cols6):
                self._col2im(yb, cols6, rows, cols_, lo, hi, direct, bias, slot=60)
            _parallel(col2im, self.o, cols6.size)
        return y

    def _col2im(self, yi, cols5, rows, cols_, lo: int, hi: int, direct: bool, bias, slot: int) -> None:
        """Output channels [lo, hi) of one image ``yi`` (O, Ho, Wo) from its (O, kh, kw, H, W)
        contributions ``cols5``, phase by phase (see the class docstring); or of several images
        at once, ``yi`` (O, m, Ho, Wo) and ``cols5`` (O, kh, kw, m, H, W)."""
        sh, sw = self.stride
        mid = yi.shape[1:-2]  # () or (m,)
        for r, lr, taps_r in rows:
            for q, lq, taps_q in cols_:
                buf = yi[lo:hi] if direct else _workspace((hi - lo,) + mid + (lr, lq), self.dtype, slot=slot)
                if bias is None:
                    buf[...] = 0
                else:
                    buf[...] = bias[lo:hi].reshape((hi - lo,) + (1,) * len(mid) + (1, 1))
                for a, oa, m0, m1 in taps_r:
                    for b, ob, n0, n1 in taps_q:
                        buf[..., m0:m1, n0:n1] += cols5[lo:hi, a, b, ..., m0 + oa: m1 + oa, n0 + ob: n1 + ob]
                if not direct:
                    yi[lo:hi, ..., r::sh, q::sw] = buf


def conv_transpose2d_plan(weight, bias=None, *, stride=(1, 1), padding=(0, 0), output_padding=(0, 0),
                          dilation=(1, 1), groups=1) -> ConvTranspose2dPlan | None:
    w = np.asarray(weight)
    if w.ndim != 4 or w.dtype.kind != "f":
        return None
    return ConvTranspose2dPlan(w, bias, stride, padding, output_padding, dilation, groups)


# -- depthwise 3-D convolution ---------------------------------------------------------------------
#: a depthwise 3-D convolution works on blocks of channels of one image of about this many bytes
#: of padded input and accumulators (2 AVX-512 Xeon cores, 54 channels of 8x56x56, 3x3x3: 1 MiB
#: 10.2 ms, 2 MiB 7.5, 4 MiB 10.1: smaller blocks make more short passes, larger leave the cache)
DEPTHWISE3D_BLOCK_BYTES = 2 << 20


class Depthwise3dPlan:
    """A depthwise 3-D convolution (one input channel per group, as many outputs), stride 1, no
    dilation, zero padding: per block of channels the zero-padded volume is stored flat (rows of
    ``Wo + kw - 1``, planes of ``Ho + kh - 1`` rows), so that every tap ``(a, i, j)`` is one
    contiguous slice of it at offset ``(a*rows + i)*width + j``; one multiply and one add per tap
    over the block, then the bias and one copy of the valid part. Against the per-depth-tap 2-D
    convolutions of the stacked depth slices (X3D's 54 channels of 8x56x56, 3x3x3, 2 AVX-512 Xeon
    cores): 15 -> 7.5-10 ms, torch 3.4-3.9."""

    def __init__(self, weight, bias, pads):
        w = np.asarray(weight)
        self.c, _, self.kd, self.kh, self.kw = w.shape
        self.dtype = w.dtype
        self.taps = np.ascontiguousarray(w.reshape(self.c, -1).T).reshape(-1, self.c, 1)
        self.bias = None if bias is None else np.asarray(bias, dtype=w.dtype).reshape(self.c, 1, 1, 1)
        self.pads = tuple(tuple(int(v) for v in p) for p in pads)

    def out_size(self, d: int, h: int, w: int) -> tuple[int, int, int]:
        (f, b), (t, bo), (l, r) = self.pads
        return d + f + b - self.kd + 1, h + t + bo - self.kh + 1, w + l + r - self.kw + 1

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        if x.dtype != self.dtype:
            x = x.astype(self.dtype)
        n, c, d, h, w = x.shape
        do, ho, wo = self.out_size(d, h, w)
        if min(do, ho, wo) <= 0 or c != self.c:
            from kuiper_xp.errors import ShapeError

            raise ShapeError(f"depthwise 3-D convolution of input {x.shape}: expected (N, {self.c}, D, H, W) "
                             f"giving a non-empty output, kernel {(self.kd, self.kh, self.kw)}, pads {self.pads}")
        (f, _), (t, _), (l, _) = self.pads
        dp, hq, wq = do + self.kd - 1, ho + self.kh - 1, wo + self.kw - 1
        plane = hq * wq
        length = do * plane  # (the flat overrun of the last taps lands in one spare plane)
        dd, hh, ww = max(0, min(d, dp - f)), max(0, min(h, hq - t)), max(0, min(w, wq - l))
        offs = [(a * hq + i) * wq + j for a in range(self.kd) for i in range(self.kh) for j in range(self.kw)]
        y = _out((n, c, do, ho, wo), self.dtype)
        if y.size == 0:
            return y
        per_channel = ((dp + 1) * plane + 2 * length) * self.dtype.itemsize
        block = max(1, min(c, DEPTHWISE3D_BLOCK_BYTES // per_channel))
        taps, bias = self.taps, self.bias

        def part(c0, c1):
            for i in range(n):
                for b0 in range(c0, c1, block):
                    b1 = min(c1, b0 + block)
                    nb = b1 - b0
                    xb = _workspace((nb, dp + 1, hq, wq), self.dtype, slot=120)
                    _pad_into(xb, x[i, b0:b1, :dd, :hh, :ww], (f, t, l))
                    flat = _view(xb, (nb, (dp + 1) * plane))
                    acc = _workspace((nb, length), self.dtype, slot=121)
                    tmp = _workspace((nb, length), self.dtype, slot=122)
                    for k, off in enumerate(offs):
                        if k == 0:
                            np.multiply(flat[:, off:off + length], taps[k, b0:b1], out=acc)
                        else:
                            np.multiply(flat[:, off:off + length], taps[k, b0:b1], out=tmp)
                            acc += tmp
                    src = _view(acc, (nb, do, hq, wq))[:, :, :ho, :wo]
                    if bias is None:
                        y[i, b0:b1] = src
                    else:
                        np.add(src, bias[b0:b1], out=y[i, b0:b1])
        _parallel(part, c, y.size * len(offs))
        return y


def depthwise3d_plan(weight, bias=None, *, stride=(1, 1, 1), dilation=(1, 1, 1), groups=1,
                     pads=((0, 0), (0, 0), (0, 0))) -> Depthwise3dPlan | None:
    """A :class:`Depthwise3dPlan` for a float (C, 1, kd, kh, kw) weight in C groups, stride 1
    and no dilation; None otherwise (the caller keeps its own path)."""
    w = np.asarray(weight)
    if (w.ndim != 5 or w.dtype.kind != "f" or w.shape[1] != 1 or groups != w.shape[0]
            or tuple(stride) != (1, 1, 1) or tuple(dilation) != (1, 1, 1)):
        return None
    return Depthwise3dPlan(w, bias, pads)


# -- pooling -------------------------------------------------------------------------------------
def _pool_out(size, k, s, p, d, ceil_mode):
    span = size + 2 * p - d * (k - 1) - 1
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def max_pool2d(x: np.ndarray, kernel, stride, padding, dilation, ceil_mode) -> np.ndarray:
    """Separable running ``np.maximum`` over the ``kw`` strided column views of each row and the
    ``kh`` row views, the rows first where that does less of the work through strided columns
    (ResNet's 3x3 stride-2 pool over 64x112x112 on 2 threads of a Zen 3: 0.93 -> 0.71 ms at
    batch 1, 4.9 -> 4.1 at batch 8; torch 3.7 and 28), in cache-sized blocks of planes split
    over the threads, without a padded copy (NaN propagates, as in torch)."""
    x = np.asarray(x)
    low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    return _window_reduce(x, kernel, stride, padding, dilation, ceil_mode, np.maximum, low, rows_first=None)


def avg_pool2d(x: np.ndarray, kernel, stride, padding, ceil_mode, count_include_pad,
               divisor_override=None) -> np.ndarray | None:
    """torch's ``avg_pool2d`` for float arrays as :func:`max_pool2d` computes its maximum: a
    separable running sum over the taps inside the input (padding adds nothing), divided in the
    same cache-sized blocks by ``divisor_override``, or per output position by the window's
    size (``count_include_pad``: up to ``size + pad``) or its count of real elements. An
    Inception-style 3x3 stride-1 average over 768x112x112: 92 ms on the generic path (a padded
    copy and nine fresh sums), 6 here. None for other dtypes (the generic path)."""
    x = np.asarray(x)
    if x.dtype.kind != "f" or x.ndim != 4:
        return None
    h, w = x.shape[2:]
    ho = _pool_out(h, kernel[0], stride[0], padding[0], 1, ceil_mode)
    wo = _pool_out(w, kernel[1], stride[1], padding[1], 1, ceil_mode)
    if (tuple(kernel[:1]) == (1,) and kernel[1] >= AVG_RUNNING_MIN_TAPS and tuple(stride) == (1, 1)
            and tuple(padding) == (0, 0) and wo > 0 and x.dtype in _FLOATS):
        return _avg_rows_running(x, kernel[1], divisor_override or kernel[1])
    if divisor_override or ho <= 0 or wo <= 0:  # (an empty output: _window_reduce says so)
        div: Any = x.dtype.type(divisor_override or 1)
    else:
        per_axis = []
        for n, o, k, st, p in zip((h, w), (ho, wo), kernel, stride, padding):
            counts = []
            for i in range(o):  # (as torch: a window is cut at size + pad, then at the input)
                a0 = i * st - p
                b0 = min(a0 + k, n + p)
                counts.append(b0 - a0 if count_include_pad else max(min(b0, n) - max(a0, 0), 0))
            per_axis.append(np.array(counts, dtype=np.float64))
        grid = np.maximum(np.outer(per_axis[0], per_axis[1]), 1.0).astype(x.dtype)
        div = grid.flat[0] if (grid == grid.flat[0]).all() else grid

    def finish(yb):
        yb /= div
    return _window_reduce(x, kernel, stride, padding, (1, 1), ceil_mode, np.add, 0, finish)


#: adaptive average pools (other than the global one) run as one GEMM with their 0/1 window
#: matrix when it takes at most this many bytes (``(H*W) * (Ho*Wo)`` values)
ADAPTIVE_AVG_MATRIX_BYTES = 4 << 20
_adaptive_windows: dict = {}


def _adaptive_window_matrix(h: int, w: int, ho: int, wo: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """``(M, counts)``: M (H*W, Ho*Wo) is 1 where input pixel p lies in output q's adaptive window
    (torch's ``[floor(i*n/o), ceil((i+1)*n/o))`` along each axis), counts (Ho*Wo,) the windows'
    sizes; kept per size (a few at most)."""
    key = (h, w, ho, wo, np.dtype(dtype).str)
    got = _adaptive_windows.get(key)
    if got is None:
        def axis(n, o):
            m = np.zeros((n, o), np.float64)
            for i in range(o):
                m[(i * n) // o: -((-(i + 1) * n) // o), i] = 1
            return m
        mh, mw = axis(h, ho), axis(w, wo)
        mat = np.kron(mh, mw).astype(dtype)  # [(y, x), (i, j)] = mh[y, i] * mw[x, j]
        counts = np.outer(mh.sum(axis=0), mw.sum(axis=0)).ravel().astype(dtype)
        if len(_adaptive_windows) >= 8:
            _adaptive_windows.clear()
        got = _adaptive_windows[key] = (mat, counts)
    return got


def adaptive_avg_pool2d(x: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray | None:
    """torch's ``adaptive_avg_pool2d`` for a float (N, C, H, W) array as one matrix product: the
    (N*C, H*W) pixels times a column of ones for the global mean, else times the 0/1 matrix of
    the windows (:func:`_adaptive_window_matrix`), the sums then divided by the windows' sizes
    (as torch: sum, then divide). 2 threads of a Zen 3: 256x32x32 to 3x3 1.47 -> 0.13 ms (torch
    0.15), to 6x6 1.08 -> 0.35 (0.18), 64x56x56 to 7x7 0.85 -> 0.50 (0.12), the global mean of
    8x2048x7x7 0.60 -> 0.15 (0.16). None (the generic path) for other dtypes, empty arrays, a
    window matrix over ADAPTIVE_AVG_MATRIX_BYTES, and a result not all finite: the matrix's zeros times an inf or
    NaN would spread NaN to windows without it, and the generic path gives torch's values."""
    if not isinstance(x, np.ndarray) or x.ndim != 4 or x.dtype not in _FLOATS or x.size == 0:
        return None
    n, c, h, w = x.shape
    ho, wo = out_hw
    if (ho, wo) == (h, w) or ho <= 0 or wo <= 0:
        return None
    glob = (ho, wo) == (1, 1)
    if not glob and h * w * ho * wo * x.itemsize > ADAPTIVE_AVG_MATRIX_BYTES:
        return None
    a = x.reshape(n * c, h * w)  # (a copy when x is a channels-last view)
    y = _out((n, c, ho, wo), x.dtype)
    yv = y.reshape(n * c, ho * wo)
    if glob:
        _row_sums(a, yv, mean=True)
        return y
    mat, counts = _adaptive_window_matrix(h, w, ho, wo, x.dtype)
    _gemm(a, mat, yv)
    yv /= counts
    return y if _all_finite(yv) else None


#: stride-1 unpadded average pools along rows (AvgPool1d: a (1, k) window) from this many taps on
#: take running sums instead of one add per tap
AVG_RUNNING_MIN_TAPS = 12


def _avg_rows_running(x: np.ndarray, k: int, div) -> np.ndarray:
    """The stride-1 average over ``k`` consecutive elements of each row of (N, C, 1, W) ``x``
    (any layout) in a fixed handful of passes for any k (Autoformer's AvgPool1d(25) over (4, 64,
    120) took 25 strided adds): each row cut into blocks of k, float64 running sums inside each
    block forwards (P) and backwards (S); a window starting inside a block is the tail of that
    block (S) plus the head of the next (P), one starting on a block boundary is one block's P.
    Only the window's own elements enter its sum, and nothing is subtracted: an inf or a 1e20
    elsewhere in the row leaves the other windows as torch computes them (differences of running
    sums over the whole row, as this was first written, made every later window NaN or 0)."""
    n, c, h, w = x.shape
    rows = x.reshape(n * c * h, w) if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(n * c * h, w)
    m = w - k + 1
    y = _out((n, c, h, m), x.dtype)
    yr = y.reshape(n * c * h, m)
    nb = -(-w // k)
    length = nb * k
    step = max(1, (1 << 16) // max(1, length))  # rows per block: the running sums stay in cache

    def part(r0, r1):
        pre = _workspace((step, length), np.float64, slot=29)
        suf = _workspace((step, length), np.float64, slot=33)
        for a in range(r0, r1, step):
            b = min(r1, a + step)
            p, s = pre[: b - a], suf[: b - a]
            p[:, :w] = rows[a:b]
            p[:, w:] = 0.0
            pb = p.reshape(b - a, nb, k)
            sb = s.reshape(b - a, nb, k)
            np.cumsum(pb[:, :, ::-1], axis=2, out=sb[:, :, ::-1])
            np.cumsum(pb, axis=2, out=pb)
            sb[:, :, 0] = 0.0  # (a window starting on a boundary is one whole block: P alone)
            d = np.add(s[:, :m], p[:, k - 1: k - 1 + m], out=s[:, :m])
            d /= div
            yr[a:b] = d
    _parallel(part, rows.shape[0], x.size * 6)
    return y


def _window_reduce(x, kernel, stride, padding, dilation, ceil_mode, combine, init, finish=None,
                   rows_first=False):
    """The separable window reduction of :func:`max_pool2d` and :func:`avg_pool2d`: ``combine``
    (np.maximum, np.add) over the ``kw`` strided column views of each row and over the ``kh``
    row views, one after the other, in cache-sized blocks of planes split over the threads,
    without a padded copy; ``finish(block)`` then runs on each output block in place.

    The columns go first, unless ``rows_first`` is True; None (for an order-free ``combine``:
    the maximum) takes the rows first when that does less of the work through strided columns.
    A row view is whole rows, unit-stride runs that numpy's SIMD loops take, while a column view
    with a stride of 2 is not (ResNet's 3x3 stride-2 pool over 64x112x112: the row pass over
    56x112 and then the column pass over 56x56, against the column pass over 112x56 first). The
    sums of the average keep their order (another would move their rounding)."""
    n, c, h, w = x.shape
    ho = _pool_out(h, kernel[0], stride[0], padding[0], dilation[0], ceil_mode)
    wo = _pool_out(w, kernel[1], stride[1], padding[1], dilation[1], ceil_mode)
    if ho <= 0 or wo <= 0:
        from kuiper_xp.errors import ShapeError

        raise ShapeError(f"pooling output would be empty for input {x.shape}, kernel {tuple(kernel)}")
    (kh, kw), (sh, sw), (dh, dw), (ph, pw) = kernel, stride, dilation, padding
    y = _out((n, c, ho, wo), x.dtype)
    planes = x.reshape(n * c, h, w) if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(n * c, h, w)
    yf = y.reshape(n * c, ho, wo)
    # the padding is never materialised: tap j of output column q reads input column
    # q*sw - pw + j*dw, which is inside the input for q in cols[j] (likewise rows); every output
    # has at least one tap inside (torch's padding <= kernel/2 rule), so taps that fall outside
    # are simply skipped, as -inf (max) or 0 (sum) would be
    cols = [_tap_range(wo, sw, j * dw - pw, w) for j in range(kw)]
    rows = [_tap_range(ho, sh, i * dh - ph, h) for i in range(kh)]
    full_c = any(a == 0 and b == wo for a, b in cols)
    full_r = any(a == 0 and b == ho for a, b in rows)
    if rows_first is None:
        # elements combined through strided views (a stride > 1 along a row) weigh
        # POOL_STRIDED_COST unit-stride ones
        sc = POOL_STRIDED_COST if sw > 1 or dw > 1 else 1
        rows_first = kh * ho * w + sc * kw * ho * wo < sc * kw * h * wo + kh * ho * wo
    mid = (ho, w) if rows_first else (h, wo)
    per_plane = (mid[0] * mid[1] + ho * wo) * x.dtype.itemsize
    block = max(1, POOL_BLOCK_BYTES // max(1, per_plane))

    def sweep(dst, src, ranges, step, off, axis, full):
        # taps in order, a full-range one first when there is one (it initialises dst by a
        # copy); otherwise dst starts at ``init``
        if not full:
            dst.fill(init)
        for k, (a, b) in enumerate(ranges):
            if a >= b:
                continue
            start = a * step + off[k]
            sl = slice(start, start + step * (b - a - 1) + 1, step)
            v = src[:, :, sl] if axis == 2 else src[:, sl]
            d = dst[:, :, a:b] if axis == 2 else dst[:, a:b]
            if full and k == 0:
                np.copyto(d, v)
            else:
                combine(d, v, out=d)

    offs_c = [j * dw - pw for j in range(kw)]
    offs_r = [i * dh - ph for i in range(kh)]
    # the first full-range tap goes first, so that it initialises the accumulator with a copy
    order_c = sorted(range(kw), key=lambda j: not (cols[j] == (0, wo)))
    order_r = sorted(range(kh), key=lambda i: not (rows[i] == (0, ho)))

    # (ranges, step, offsets, axis, full) of the column and the row pass, in the order they run
    passes = [([cols[j] for j in order_c], sw, [offs_c[j] for j in order_c], 2, full_c),
              ([rows[i] for i in order_r], sh, [offs_r[i] for i in order_r], 1, full_r)]
    if rows_first:
        passes.reverse()

    def part(lo, hi):
        # separable: the first pass into a workspace of ``mid`` planes, the second from it
        for b0 in range(lo, hi, block):
            b1 = min(hi, b0 + block)
            tmp = _workspace((b1 - b0,) + mid, x.dtype, slot=16)
            sweep(tmp, planes[b0:b1], *passes[0])
            sweep(yf[b0:b1], tmp, *passes[1])
            if finish is not None:
                finish(yf[b0:b1])
    _parallel(part, n * c, y.size * (kh + kw))
    return y


def _tap_range(n_out: int, stride: int, offset: int, size: int) -> tuple[int, int]:
    """Outputs ``q`` in ``[a, b)`` for which ``q*stride + offset`` lies in ``[0, size)``."""
    a = max(0, -(offset // stride))  # ceil(-offset / stride)
    b = min(n_out, (size - 1 - offset) // stride + 1) if size - 1 - offset >= 0 else 0
    return a, max(a, b)


# -- matrix products -------------------------------------------------------------------------------
def matmul(a, b):
    """``np.matmul(a, b)``; inside a compute scope float products of 2-D or stacked operands go
    through :func:`_gemm` (split over the threads; stacks with equal leading dims are flattened to
    one stack, a view when their strides allow). Anything else is numpy's own matmul."""
    a, b = np.asarray(a), np.asarray(b)
    if (not _gemm_split or a.ndim < 2 or b.ndim < 2 or a.dtype != b.dtype or a.dtype.kind != "f"
            or a.shape[-1] != b.shape[-2] or a.size == 0 or b.size == 0):
        return np.matmul(a, b)  # (empty operands too: the stack flattening cannot infer a -1 there)
    m, n = a.shape[-2], b.shape[-1]
    if (max(a.ndim, b.ndim) > 2 and np.may_share_memory(a, b)
            and (m >= 256 or m <= 16 or a.shape[-1] <= 32)):
        # a stack times itself transposed (feature interactions, Gram matrices, k-NN distances):
        # numpy's matmul takes its syrk path per matrix (half the products, then a copy of the
        # triangle), slow for many small matrices and for large ones; a copy of b in its own
        # layout makes them GEMMs. 2 threads, copy / syrk: DLRM's (4096, 9, 32) 0.45, (1024,
        # 16, 64) 0.79, (64, 49, 32) 0.83, (32, 256, 32) 0.49, (8, 512, 64) 0.59, (4, 2048, 32)
        # 0.20; but (96, 50, 64) 1.34-1.49 and (16, 197, 64) 1.3, (8, 128, 64) and (12, 50, 64)
        # 1.0: those keep syrk
        b = np.array(b, order="K")
    if a.ndim <= 3 and b.ndim <= 3:
        lead = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        return _gemm(a, b, _out(lead + (m, n), a.dtype))
    if a.shape[:-2] != b.shape[:-2]:
        return np.matmul(a, b)
    lead = a.shape[:-2]
    a3 = a.reshape((-1,) + a.shape[-2:])
    b3 = b.reshape((-1,) + b.shape[-2:])
    out = _out((a3.shape[0], m, n), a.dtype)
    return _gemm(a3, b3, out).reshape(lead + (m, n))


def attention(q, k, v, scale: float, mask=None, drop=None, fill: float = 0.0):
    """``softmax(q k^T * scale + mask) v`` over the last two axes of float ``q`` (..., L, D),
    ``k`` (..., S, D), ``v`` (..., S, Dv) (equal leading dims, any strides: the per-head views
    of a fused QKV projection need no copies), ``mask`` None or a float array broadcastable to
    (..., L, S); ``drop`` None or a bool array broadcastable alike: those scores replaced by
    ``fill`` after the scale and the mask (``torch.where(keep, w, fill)``, ``masked_fill``,
    as GPT-2 and its kin write a causal mask). Threads take whole stacks of heads (with one leading item axis and small heads,
    all heads of several items: one stacked product per block); each computes its scores into a workspace,
    the softmax there while in cache, and the product straight into the output, which is laid
    out (..., L, heads, Dv) and returned as the (..., heads, L, Dv) view: merging the heads
    afterwards is then free. ViT-B/32 at batch 8: 1.1 against 2.8 ms per layer for the generic
    steps (stacked products on copied heads, a softmax over the whole score tensor, a copy to
    merge the heads). None when the shapes or dtypes do not fit (the caller's generic path)."""
    if not all(type(a) is np.ndarray for a in (q, k, v)):
        return None
    dt = q.dtype
    if (dt not in _FLOATS or k.dtype != dt or v.dtype != dt or q.ndim < 3
            or k.ndim != q.ndim or v.ndim != q.ndim or q.shape[:-2] != k.shape[:-2]
            or k.shape[:-2] != v.shape[:-2] or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]
            or q.size == 0 or k.shape[-2] == 0):
        return None
    lead = q.shape[:-2]
    L, S, Dv = q.shape[-2], k.shape[-2], v.shape[-1]
    if mask is not None:
        if type(mask) is not np.ndarray or mask.dtype != dt or mask.ndim > q.ndim:
            return None
        try:
            mask = np.broadcast_to(mask, lead + (L, S))
        except ValueError:
            return None
    if drop is not None:
        if type(drop) is not np.ndarray or drop.dtype != np.bool_ or drop.ndim > q.ndim:
            return None
        try:
            drop = np.broadcast_to(drop, lead + (L, S))
        except ValueError:
            return None
    if q.ndim > 4:
        # several item axes (Twins' and NesT's (batch, windows, heads, N, d)): merged into one, so
        # that blocks of items are stacked products (4 x 64 windows: 10.0 -> 2.9 ms; item by
        # item it took 3x the unfused layers)
        def merged(a):
            return None if a is None else a.reshape((-1,) + a.shape[-3:])
        y = attention(merged(q), merged(k), merged(v), scale, merged(mask), merged(drop), fill)
        return None if y is None else y.reshape(lead[:-1] + y.shape[1:])
    outer, H = lead[:-1], lead[-1]
    buf = _pooled(outer + (L, H, Dv), dt)  # (not _out: returned as a view, see _fresh_like)
    out = np.swapaxes(buf, -3, -2)
    items = list(np.ndindex(*outer)) if outer else [()]
    per_head = L * S * dt.itemsize
    hb = max(1, min(H, ATTENTION_BLOCK_BYTES // per_head))
    threads = _threads_now()
    # elements touched, roughly: the softmax steps (~4 passes over the scores) and the two
    # products, whose 2 (D + Dv) flops per score cost about (D + Dv) / 8 such passes. (Without
    # the products' share, ViT-B/32's 8 x 12 heads of 50 tokens stayed on one thread where the
    # VM's hand-offs are slow: 3.1-3.6 ms against 1.9-2.1 split, 2 AMD EPYC (Zen 3) threads.)
    work = len(items) * H * L * S * (4 + (q.shape[-1] + Dv) // 8)
    if work < PARALLEL_MIN_ELEMENTS * _gemm_split_scale:
        # one thread: on a VM whose idle vCPUs wake slowly the hand-off costs more than half the
        # work saves (Gemma-size (4, 4, 64, 32) causal: 0.32 ms split, 0.20 on one thread; on
        # the Zen 3 VM 0.92 against 0.52)
        work = 0
    row_parts = 1
    if len(items) * -(-H // hb) < threads and work >= PARALLEL_MIN_ELEMENTS:
        if L >= 8 * threads:
            # fewer blocks of heads than threads: each thread takes every head for a share of
            # the query rows (timm's ViT-Tiny, 3 heads of 197 tokens: 0.59 ms as 2 heads + 1)
            row_parts = threads
        else:
            hb = max(1, -(-H // threads))
    rows_at = [(L * j) // row_parts for j in range(row_parts + 1)]
    units = [(it, h0, min(H, h0 + hb), rows_at[j], rows_at[j + 1])
             for it in items for h0 in range(0, H, hb) for j in range(row_parts)]
    ones = np.ones((S, 1), dt)
    D = k.shape[-1]
    nn_copy = _attention_nn_copy()

    def group(gu):
        """One block of units: their scores side by side in one workspace, so each softmax
        step is one ufunc call over all of them (calls on ~30 Ki elements do not run
        concurrently on two threads here; 128 Ki ones do)."""
        rows = sum((h1 - h0) * (r1 - r0) for _, h0, h1, r0, r1 in gu)
        sc_all = _workspace((rows, S), dt, slot=50)
        views, r = [], 0
        for it, h0, h1, r0, r1 in gu:
            nh, nl = h1 - h0, r1 - r0
            sc = _view(sc_all[r: r + nh * nl], (nh, nl, S))
            r += nh * nl
            if nn_copy:
                kt = _workspace((nh, D, S), dt, slot=51)
                np.copyto(kt, np.swapaxes(k[it][h0:h1], -1, -2))
            else:
                kt = np.swapaxes(k[it][h0:h1], -1, -2)
            np.matmul(q[it][h0:h1, r0:r1], kt, out=sc)
            if mask is not None or drop is not None:
                if scale != 1.0:
                    sc *= scale
                if mask is not None:
                    sc += mask[it][h0:h1, r0:r1]
                if drop is not None:
                    np.copyto(sc, fill, where=drop[it][h0:h1, r0:r1])
            views.append(sc)
        if mask is None and drop is None and scale != 1.0:  # (1: the scale was applied to q already, timm's way)
            sc_all *= scale
        tot = _exp_rows(sc_all, sc_all, ones, ATTENTION_NO_SHIFT)  # normalised after the product: (L, Dv)
        r = 0
        for (it, h0, h1, r0, r1), sc in zip(gu, views):
            o = out[it][h0:h1, r0:r1]
            np.matmul(sc, v[it][h0:h1], out=o)
            o /= _view(tot[r: r + sc.shape[0] * sc.shape[1]], sc.shape[:2] + (1,))
            r += sc.shape[0] * sc.shape[1]

    if len(outer) == 1 and hb == H and row_parts == 1:
        # whole heads of several items per block: one stacked product over all of them (Swin's
        # 128 windows of 49 tokens: 4.7 ms as one product per window and head group, 0.5 block)
        nb = max(1, min(len(items), ATTENTION_BLOCK_BYTES // max(1, H * per_head)))
        if -(-len(items) // nb) < threads and work >= PARALLEL_MIN_ELEMENTS:
            nb = max(1, -(-len(items) // threads))
        blocks = -(-len(items) // nb)

        def run_items(lo, hi):
            with _silent():
                for bi in range(lo, hi):
                    i0, i1 = bi * nb, min(len(items), (bi + 1) * nb)
                    m = i1 - i0
                    sc = _workspace((m, H, L, S), dt, slot=50)
                    if nn_copy:
                        kt = _workspace((m, H, D, S), dt, slot=51)
                        np.multiply(np.swapaxes(k[i0:i1], -1, -2), scale, out=kt)  # the scale on k: S*D, not L*S
                        np.matmul(q[i0:i1], kt, out=sc)
                    else:
                        np.matmul(q[i0:i1], np.swapaxes(k[i0:i1], -1, -2), out=sc)
                        if scale != 1.0:
                            sc *= scale
                    if mask is not None:
                        sc += mask[i0:i1]
                    if drop is not None:
                        np.copyto(sc, fill, where=drop[i0:i1])
                    scores = _view(sc, (m * H * L, S))
                    tot = _exp_rows(scores, scores, ones, ATTENTION_NO_SHIFT)
                    o = out[i0:i1]
                    np.matmul(sc, v[i0:i1], out=o)
                    o /= _view(tot, (m, H, L, 1))
        _parallel(run_items, blocks, work)
        return out

    def part(lo, hi):
        with _silent():
            gu, size = [], 0
            for u in units[lo:hi]:
                b = (u[2] - u[1]) * (u[4] - u[3]) * S * dt.itemsize
                if gu and size + b > ATTENTION_BLOCK_BYTES:
                    group(gu)
                    gu, size = [], 0
                gu.append(u)
                size += b
            if gu:
                group(gu)
    _parallel(part, len(units), work)  # ViT-B/32 at batch 1 (120 Ki): faster on one thread
    return out


#: :func:`attention` works on blocks of heads whose scores take about this many bytes
ATTENTION_BLOCK_BYTES = 1 << 20
#: :func:`attention` copies k^T into a workspace so that the scores are an N-N product (measured
#: ~1.7x faster on 2 AVX-512 Xeon cores when the fast path was written) or reads k through a
#: transposed view: None = copy where numpy's loops have AVX-512 (a proxy for OpenBLAS's AVX-512
#: kernels), True / False force it. On an AMD EPYC (Zen 3, AVX2) thread the view was 0.5-0.9 of
#: the copy's time for the scores of a block (ViT-B/32's 4 x 12 heads of 50 tokens 0.57-0.68 ->
#: 0.26-0.35 ms, BERT's 12 x 128 0.55-0.62 -> 0.34-0.41, 4 heads of 500 1.9-2.4 -> 1.6-2.1, keys 4x longer
#: than queries 2.7x faster, one query against 200 keys 10-17x), the scale then on the scores;
#: whole calls on 2 threads, three runs: ViT-B/32 at batch 8 1.39-1.82 -> 1.13-1.59 ms, BERT
#: (4, 12, 128, 64) 3.6-4.0 -> 2.8-3.6
ATTENTION_NN_COPY: bool | None = None


def _attention_nn_copy() -> bool:
    return _numpy_avx512() if ATTENTION_NN_COPY is None else ATTENTION_NN_COPY
#: a softmax skips the per-row max shift when every value lies within +-this: exp stays under
#: 5.6e34 and over 1.8e-35 (no row underflows whole); the row sums are checked against overflow
#: too (rows of more than ~6e3 values at 80 would reach float32's max)
SOFTMAX_NO_SHIFT = 80.0
#: :func:`attention`'s range for that, ``(lo, hi)``: its unnormalised weights multiply ``v``
#: before the division, so they must neither overflow that product (at 80, |v| ~ 6e3 made inf)
#: nor underflow it (weights of 1e-35 times a v of 1e-30 gave 0): within (e^-30, e^20) that
#: takes a |v| over ~1e29 / keys or under ~1e-25
ATTENTION_NO_SHIFT = (-30.0, 20.0)
#: a softmax of at most this many rows (and TINY_ELEMENTS elements) is plain numpy
SOFTMAX_PLAIN_MAX_ROWS = 16
#: shifted softmax inputs below this give float32 exponentials under the smallest normal
#: (exp(-87.34) = 1.18e-38): they are taken as 0 (their weight against a row sum of at least 1)
SOFTMAX_SUBNORMAL_BELOW = -87.3


# -- segments --------------------------------------------------------------------------------------
def segment_sum(rows: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray | None:
    """``out[b] = rows[starts[b]:ends[b]].sum(0)`` (zeros for an empty segment) for segments
    that follow each other (non-decreasing starts, each ending where the next begins), summed
    in order as torch's embedding_bag does: one ``np.add.reduceat``; None for other layouts."""
    if rows.ndim != 2 or starts.ndim != 1 or starts.shape != ends.shape:
        return None
    n = starts.shape[0]
    out = np.zeros((n, rows.shape[1]), rows.dtype)
    if n == 0 or rows.shape[0] == 0:
        return out
    if np.any(starts[1:] < starts[:-1]) or np.any(ends[:-1] != starts[1:]) or ends[-1] != rows.shape[0]:
        return None
    full = ends > starts
    if full.any():
        out[full] = np.add.reduceat(rows, starts[full], axis=0)
    return out


# -- concatenation ---------------------------------------------------------------------------------
def set_destination(a: np.ndarray | None) -> None:
    """Name the array the next output of ``a``'s shape and dtype that this thread asks for
    (through ``_out``) is to be: the runtime passes a slice of a concatenation's buffer to the
    layer producing that piece, so the piece is computed in place and never copied. None forgets
    it. The layer may still return another array; :func:`concat_into` then copies that one."""
    _tls.dest = a


def concat_buffer(axis: int, dtype, shapes, within: np.ndarray | None = None) -> np.ndarray | None:
    """The output of concatenating arrays of ``shapes`` along ``axis``: ``within``, a piece of
    an enclosing concatenation's buffer, when it holds as many elements (reshaped: the
    concatenation may reach that piece through a reshape), is contiguous and of the dtype
    (the pieces are then copied into their final place); else from the graph's pool when each
    piece of it is C-contiguous (every dim before ``axis`` is 1, as at batch 1 along channels),
    so a layer can write a piece as its own output; None otherwise."""
    first = shapes[0]
    shape = list(first)
    shape[axis] = sum(s[axis] for s in shapes)
    if (within is not None and within.size == math.prod(shape) and within.dtype == dtype
            and within.flags.c_contiguous):
        return within.reshape(shape)
    if math.prod(first[:axis]) != 1:
        return None
    pool = getattr(_tls, "pool", None)
    return np.empty(shape, dtype) if pool is None else pool.empty(shape, dtype)


def piece_result(out: Any, slot: np.ndarray) -> Any:
    """A layer's result ``out`` for a concatenation's ``slot`` it was offered
    (:func:`set_destination`): as it is when it is that slot, or lies elsewhere; a copy when it
    lies in the slot in another layout (a transposed view of it): :func:`concat_into` would
    rewrite the slot under it, changing that value for its other readers and the caller."""
    if type(out) is not np.ndarray or out is slot or not np.may_share_memory(out, slot):
        return out
    if (out.__array_interface__["data"][0] == slot.__array_interface__["data"][0] and out.shape == slot.shape
            and (out.strides == slot.strides or (out.flags.c_contiguous and slot.flags.c_contiguous))):
        return out
    return out.copy()


def concat_piece(buf: np.ndarray, axis: int, shapes, k: int) -> np.ndarray:
    """Piece ``k`` of a :func:`concat_buffer`."""
    off = sum(s[axis] for s in shapes[:k])
    return buf[(slice(None),) * axis + (slice(off, off + shapes[k][axis]),)]


def concat_into(buf: np.ndarray, xs, axis: int) -> np.ndarray | None:
    """Finish a :func:`concat_buffer`: copy in the pieces not already computed in their place.
    None (nothing written) when the pieces do not match the buffer (the caller then
    concatenates as usual)."""
    if len(xs) == 0 or not 0 <= axis < buf.ndim:
        return None
    off, pieces, overlap = 0, [], []
    lo, hi, dt, nd = buf.shape[:axis], buf.shape[axis + 1:], buf.dtype, buf.ndim
    lead = (slice(None),) * axis
    start, step = buf.__array_interface__["data"][0], buf.strides[axis]
    for a in xs:
        if (not isinstance(a, np.ndarray) or (a.dtype is not dt and a.dtype != dt) or a.ndim != nd
                or a.shape[:axis] != lo or a.shape[axis + 1:] != hi):
            return None
        m = a.shape[axis]
        dst = buf[lead + (slice(off, off + m),)]
        # in place: inside the buffer, at this piece's address, with its layout (one address
        # read a piece, ~1 us; 49 pieces of a cost volume took 240 us comparing two views)
        shares = bool(m) and np.may_share_memory(a, buf)
        if m and not (shares and a.__array_interface__["data"][0] == start + off * step
                      and (a.strides == dst.strides or (a.flags.c_contiguous and dst.flags.c_contiguous))):
            pieces.append((dst, a))
            overlap.append(shares)
        off += m
    if off != buf.shape[axis]:
        return None
    # a piece overlapping the buffer elsewhere (a view of another piece) is copied out first
    pieces = [(d, a.copy() if o else a) for (d, a), o in zip(pieces, overlap)]
    _fill_pieces(buf, pieces, axis)
    return buf


def _fill_pieces(out: np.ndarray, pieces, axis: int) -> None:
    nd, shape = out.ndim, out.shape
    if out.size < PARALLEL_MIN_ELEMENTS or _threads_now() <= 1:
        # one thread: a copy per piece, no per-part slicing (49 pieces of 16x16 cost 240 us
        # through the split loop below)
        for dst, a in pieces:
            np.copyto(dst, a)
        return
    if axis == nd - 1 and nd > 1:
        # along the last axis each row of a piece becomes one item of a void dtype as wide as
        # the row: one strided loop of memcpy's, not a loop per row over a few values (YOLO's
        # cat([xy(2), wh(2), conf(81)], -1) over 3x80x80 rows: 596 -> 335 us on one thread)
        rows = [(_row_items(d), _row_items(a)) for d, a in pieces]
        if all(d is not None and a is not None for d, a in rows):
            pieces = rows  # (still split below over an axis other than the last)
    k = _threads_now()
    split = next((d for d in range(nd) if d != axis and shape[d] >= 2 * k), None)
    if split is None:
        for dst, a in pieces:
            _copy_channels(dst, a, axis=axis)
        return

    def part(lo, hi):
        key = (slice(None),) * split + (slice(lo, hi),)
        for dst, a in pieces:
            np.copyto(dst[key], a[key])
    _parallel(part, shape[split], out.size)


def _row_items(a: np.ndarray) -> np.ndarray | None:
    """``a`` with its last axis folded into one void item (a view), None when that axis is not
    unit-stride."""
    if a.strides[-1] != a.itemsize and a.shape[-1] > 1:
        return None
    try:
        return a.view(np.dtype((np.void, a.shape[-1] * a.itemsize)))
    except ValueError:
        return None


def concat(xs, axis: int):
    """``np.concatenate(xs, axis)`` for same-dtype, same-rank arrays whose other dims agree (None
    otherwise: the caller's generic path then reports the mismatch), split over the threads along
    the first other axis long enough (the batch, else rows), so that narrow pieces such as YOLO's
    ``cat([xy(2), wh(2), conf(81)], dim=-1)`` are copied in parallel too."""
    shape = concat_shape(xs, axis, np.ndarray)
    if shape is None:
        return None
    out = _out(shape, xs[0].dtype)
    if out.size < PARALLEL_MIN_ELEMENTS:  # (one thread anyway: one call for every piece)
        return np.concatenate(xs, axis=axis, out=out)
    pieces, off = [], 0
    for a in xs:
        m = a.shape[axis]
        if m:
            pieces.append((out[(slice(None),) * axis + (slice(off, off + m),)], a))
        off += m
    _fill_pieces(out, pieces, axis)
    return out


# -- normalisation ---------------------------------------------------------------------------------
#: layer_norm, softmax_last and the per-plane passes (scale_shift, group_norm, prelu) work on
#: blocks of about this many elements. Their blocks take a dozen short ufunc and BLAS calls, and
#: two threads making short calls at once mostly wait on each other (the GIL, OpenBLAS's own
#: locks): fewer, longer calls split better. On 2 cores, 256 Ki against 128 Ki: ViT-B's 400x768
#: LayerNorm 0.30 -> 0.22 ms (one thread 0.28; torch 0.07), softmax over 4x3x197x197 0.59 -> 0.52,
#: the BatchNorm of 8x64x56x56 0.34 -> 0.27; 32 Ki: 0.52 ms for that LayerNorm.
NORM_BLOCK_ELEMENTS = 1 << 18
#: layer_norm keeps rows of at least this many elements on one thread: on 2 AMD EPYC (Zen 3)
#: threads, one thread against two (medians of 200, best of 3 rounds): 400x768 (ViT-B/32 at
#: batch 8) 0.34-0.40 against 0.43-0.55 ms, 1576x768 1.29 against 1.69, 2048x768 1.78 against
#: 2.01, 1000x1024 0.85 against 1.06, 600x2048 1.15 against 1.23; narrower rows still gain from
#: two (5000x192 1.47 -> 1.23, 2500x384 1.39 -> 1.18, 2000x512 1.69 -> 1.35, 25088x96 4.9 -> 3.2)
NORM_SPLIT_MAX_WIDTH = 640


def layer_norm(x: np.ndarray, d: int, weight=None, bias=None, eps: float = 1e-5) -> np.ndarray | None:
    """LayerNorm over the trailing ``d`` elements of each row of a float32/float64 array (weight
    and bias of ``d`` elements, of x's dtype, or None): blocks of rows split over the threads,
    each block normalised while in cache (mean, then the variance of the centred values, as the
    generic path and torch compute it). None when the arguments do not fit this path."""
    x = np.asarray(x)
    if x.dtype not in _FLOATS or d <= 0 or x.size % d or x.size == 0:
        return None
    for a in (weight, bias):
        if a is not None and (not isinstance(a, np.ndarray) or a.dtype != x.dtype or a.size != d):
            return None
    src = np.ascontiguousarray(x).reshape(-1, d)
    rows = src.shape[0]
    y = _out(x.shape, x.dtype)
    dst = y.reshape(rows, d)
    w = None if weight is None else weight.reshape(d)
    b = None if bias is None else bias.reshape(d)
    if _numba is not None:  # the optional compiled kernel: one loop per step and row
        step = _row_block(rows, d, x.size * 4)
        wn = np.ones(d, x.dtype) if w is None else w
        bn = np.zeros(d, x.dtype) if b is None else b
        e = x.dtype.type(eps)

        def run(c0, c1):
            r0, r1 = c0 * step, min(rows, c1 * step)
            _numba.layer_norm_rows(src[r0:r1], wn, bn, dst[r0:r1], e)
        _parallel(run, -(-rows // step), x.size)
        return y
    ones = _ones_column(d, x.dtype)
    work = _worth_splitting(x.size * 4, 2) if d < NORM_SPLIT_MAX_WIDTH else 0
    step = _row_block(rows, d, work)

    def part(c0, c1):
        for r0 in range(c0 * step, min(rows, c1 * step), step):
            r1 = min(rows, r0 + step)
            xs, ys = src[r0:r1], dst[r0:r1]
            ys *= _centre_rows(xs, ys, ones, eps)  # times 1/std, as torch does
            if w is not None:
                ys *= w
            if b is not None:
                ys += b
    if x.size <= TINY_ELEMENTS:  # (a few tokens of a small model: the threading is the cost)
        with _silent():
            part(0, -(-rows // step))
    else:
        _parallel(part, -(-rows // step), work)
    return y


_ONES: dict = {}


def _ones_column(d: int, dtype) -> np.ndarray:
    """A read-only ``(d, 1)`` column of ones (the row sums of layer_norm as a product), kept."""
    key = (d, np.dtype(dtype))
    col = _ONES.get(key)
    if col is None:
        if len(_ONES) >= 64:
            _ONES.clear()
        col = np.ones((d, 1), dtype)
        col.flags.writeable = False
        _ONES[key] = col
    return col


def _centre_rows(xs: np.ndarray, ys: np.ndarray, ones: np.ndarray, eps: float) -> np.ndarray:
    """``ys = xs - mean`` per row of the 2-D block ``xs``; returns the rows' ``1 / sqrt(var +
    eps)`` as a ``(rows, 1)`` column (the two-pass variance of the centred values). ``ones`` is
    an ``(n, 1)`` column: the row sums as a product, 2.5x faster than add.reduce on 768-long
    rows."""
    n = xs.shape[1]
    mean = xs @ ones
    mean /= n
    np.subtract(xs, mean, out=ys)
    rstd = _row_dots(ys)
    rstd /= n
    rstd += eps
    np.sqrt(rstd, out=rstd)
    np.reciprocal(rstd, out=rstd)
    return rstd


def _row_dots(a: np.ndarray) -> np.ndarray:
    """``(rows, 1)``: each row of the 2-D ``a`` dotted with itself (numpy 2's ``vecdot``: 0.6 of
    ``einsum``'s time on rows of 192-768 values; einsum on numpy 1)."""
    if _vecdot is not None:
        return _vecdot(a, a)[:, None]
    return np.einsum("ij,ij->i", a, a)[:, None]


_vecdot = getattr(np, "vecdot", None)


def _plane_blocks(rows: int, rest: int, work: int, fn) -> None:
    """``fn(r0, r1)`` over blocks of whole planes (rows of ``rest`` elements) of about
    NORM_BLOCK_ELEMENTS, the rows split over the threads."""
    planes = max(1, NORM_BLOCK_ELEMENTS // max(1, rest))

    def part(lo, hi):
        for r0 in range(lo, hi, planes):
            fn(r0, min(hi, r0 + planes))
    _parallel(part, rows, work)


def _affine_rows(src: np.ndarray, scale: np.ndarray, shift: np.ndarray, dst: np.ndarray,
                 activation: Any = None) -> None:
    """``dst = src * scale + shift`` for 2-D ``src``/``dst`` with one scale and shift per row
    (``(rows, 1)`` columns), ``activation`` (a spec of :func:`activation_inplace`) applied to
    each block while it is in cache."""
    def block(r0, r1):
        d = dst[r0:r1]
        np.multiply(src[r0:r1], scale[r0:r1], out=d)
        d += shift[r0:r1]
        if activation is not None:
            _activate_block(d, activation)
    _plane_blocks(src.shape[0], src.shape[1], src.size, block)


def scale_shift(x: np.ndarray, scale: np.ndarray, shift: np.ndarray) -> np.ndarray | None:
    """``x * scale + shift`` with one value per channel (axis 1) of a float32/float64 array: an
    inference BatchNorm that could not be folded into a producer (pre-activation blocks: BN after
    a concat). Output from the graph's pool, blocks of (image, channel) planes over the threads.
    None when the arguments do not fit (the generic path then runs)."""
    x = np.asarray(x)
    if (x.dtype not in _FLOATS or x.ndim < 2 or not x.flags.c_contiguous
            or not isinstance(scale, np.ndarray) or not isinstance(shift, np.ndarray)
            or scale.dtype != x.dtype or shift.dtype != x.dtype or scale.shape != (x.shape[1],)
            or shift.shape != (x.shape[1],) or x.size == 0):
        return None
    n, c = x.shape[:2]
    src = x.reshape(n * c, -1)
    y = _out(x.shape, x.dtype)
    dst = y.reshape(n * c, -1)
    rows_s = np.broadcast_to(scale, (n, c)).reshape(n * c, 1)
    rows_b = np.broadcast_to(shift, (n, c)).reshape(n * c, 1)
    _affine_rows(src, rows_s, rows_b, dst)
    return y


def group_norm(x: np.ndarray, groups: int, weight=None, bias=None, eps: float = 1e-5,
               activation: Any = None) -> np.ndarray | None:
    """GroupNorm (InstanceNorm is ``groups = C``) of a C-contiguous float32/float64 (N, C, ...)
    array. Each group of an image is one contiguous run, so blocks of whole groups (about
    NORM_BLOCK_ELEMENTS; one group when a group is larger) are normalised while in cache: the
    row sums as a product with a column of ones, the deviations from the mean written straight
    into the output, their squares summed as row dot products (the two-pass variance, not
    E[x^2] - mean^2, which float32 loses when the mean is large against the spread), then per
    channel ``* (w * rstd) + b`` and ``activation`` (a spec of :func:`activation_inplace`) on the
    block. Three passes over the block instead of six: (8, 64, 32, 32) in 32 groups 0.95 ->
    0.68 ms on the AVX-512 Xeon VM (torch 0.20: numpy's broadcast multiplies by a per-row
    column run at about half the speed of a same-shape multiply there). Groups larger than a
    block, fewer than two per thread, go to :func:`_group_norm_chunked`. None when the
    arguments do not fit (the generic path then runs)."""
    if (type(x) is not np.ndarray or x.dtype not in _FLOATS or x.ndim < 2
            or not x.flags.c_contiguous or x.size == 0 or groups <= 0 or x.shape[1] % groups):
        return None
    n, c = x.shape[:2]
    for a in (weight, bias):
        if a is not None and (type(a) is not np.ndarray or a.shape != (c,)):
            return None
    dt = x.dtype
    per_group = x.size // (n * groups)
    rest = per_group * groups // c
    per = c // groups
    rows = n * groups
    if per_group > NORM_BLOCK_ELEMENTS and rows < 2 * _threads_now():
        return _group_norm_chunked(x, groups, weight, bias, eps, activation)
    flat = x.reshape(rows, per_group)
    y = _out(x.shape, dt)
    yflat = y.reshape(rows, per_group)
    # per (image, channel) row of the (n*c, rest) view: the channel's weight and bias
    w_rows = None if weight is None else np.tile(weight.astype(dt, copy=False), n).reshape(n * c, 1)
    b_rows = None if bias is None else np.tile(bias.astype(dt, copy=False), n).reshape(n * c, 1)
    ones = np.ones((per_group, 1), dt)
    gb = max(1, NORM_BLOCK_ELEMENTS // per_group)  # whole groups per block
    e = dt.type(eps)
    # (MKL's exp and the numba kernel have SiLU's own fast paths)
    silu_signed = activation == "silu" and _mkl is None and _numba is None

    def block(r0: int, r1: int) -> None:
        xs, ys = flat[r0:r1], yflat[r0:r1]
        rstd = _centre_rows(xs, ys, ones, e)
        yc = _view(ys, ((r1 - r0) * per, rest))  # (channel rows of these groups; never a copy)
        scale = np.repeat(rstd, per, axis=0) if per > 1 else rstd
        if w_rows is not None:
            scale *= w_rows[r0 * per: r1 * per]
        if silu_signed:
            # SiLU from the negated affine: t = -(z) = ys * -scale - b, then z / (1 + e^-z) as
            # t / (-1 - e^t): the same values bit for bit (every step only flips signs), one pass
            # fewer than the affine and then SiLU's negation (a 256 Ki block: 0.38 -> 0.34 ms)
            np.negative(scale, out=scale)
            yc *= scale
            if b_rows is not None:
                yc -= b_rows[r0 * per: r1 * per]
            ex = _workspace(yc.shape, dt, slot=62)
            np.exp(yc, out=ex)
            np.subtract(-1.0, ex, out=ex)
            np.divide(yc, ex, out=yc)
            return
        yc *= scale
        if b_rows is not None:
            yc += b_rows[r0 * per: r1 * per]
        if activation is not None:
            _activate_block(yc, activation)

    def part(lo: int, hi: int) -> None:
        with _silent():
            for r0 in range(lo * gb, min(rows, hi * gb), gb):
                block(r0, min(rows, r0 + gb))
    _parallel(part, -(-rows // gb), x.size * 3)
    return y


def _group_norm_chunked(x: np.ndarray, groups: int, weight, bias, eps: float, activation: Any) -> np.ndarray:
    """:func:`group_norm` for groups larger than a block when there are too few of them to give
    every thread one (GroupNorm(1, C) at batch 1: PoolFormer): the statistics over segments of
    about NORM_BLOCK_ELEMENTS on the threads (the sums; then the squared deviations from the
    mean, summed), partial sums combined in float64, then one pass of ``x * scale + shift`` per
    (image, channel), ``activation`` applied to each block while it is in cache."""
    n, c = x.shape[:2]
    dt = x.dtype
    per_group = x.size // (n * groups)
    rest = per_group * groups // c
    rows = n * groups
    flat = x.reshape(rows, per_group)
    # segments of about NORM_BLOCK_ELEMENTS: several whole groups, or one chunk of a large group;
    # one ufunc call per segment and pass (calls of a few Ki elements on two threads mostly wait
    # for each other's GIL hand-offs: slower than one thread, measured)
    chunks = -(-per_group // NORM_BLOCK_ELEMENTS)
    step = -(-per_group // chunks)
    rb = _row_block(rows, per_group, x.size) if chunks == 1 else 1
    segs = [(r0, min(rows, r0 + rb), k) for r0 in range(0, rows, rb) for k in range(chunks)]
    sums = np.zeros((rows, chunks))
    sq = np.zeros((rows, chunks))

    def sum_part(lo, hi):
        for r0, r1, k in segs[lo:hi]:
            sums[r0:r1, k] = flat[r0:r1, k * step:(k + 1) * step].sum(axis=1)
    _parallel(sum_part, len(segs), x.size)
    mean = sums.sum(axis=1) / per_group
    mean_dt = mean.astype(dt).reshape(rows, 1)

    def dev_part(lo, hi):
        for r0, r1, k in segs[lo:hi]:
            seg = flat[r0:r1, k * step:(k + 1) * step]
            d = _workspace(seg.shape, dt, slot=60)
            np.subtract(seg, mean_dt[r0:r1], out=d)
            np.multiply(d, d, out=d)
            sq[r0:r1, k] = d.sum(axis=1)
    _parallel(dev_part, len(segs), x.size)
    var = sq.sum(axis=1) / per_group
    rstd = 1.0 / np.sqrt(var + eps)
    # per (image, channel): scale = w * rstd, shift = b - mean * scale (float64, then dt)
    per = c // groups
    scale = np.repeat(rstd.reshape(n, groups), per, axis=1)
    shift = -np.repeat(mean.reshape(n, groups), per, axis=1) * scale
    if weight is not None:
        scale *= weight
        shift *= weight
    if bias is not None:
        shift += bias
    scale = scale.reshape(n * c, 1).astype(dt)
    shift = shift.reshape(n * c, 1).astype(dt)
    y = _out(x.shape, dt)
    _affine_rows(x.reshape(n * c, rest), scale, shift, y.reshape(n * c, rest), activation)
    return y


def prelu(x: np.ndarray, w: np.ndarray) -> np.ndarray | None:
    """PReLU ``max(x, 0) + w[c] * min(x, 0)`` of a C-contiguous float32/float64 (N, C, ...)
    array with one slope per channel (``w`` of C values): blocks of (image, channel) planes on
    the threads, each in four passes while in cache (the generic path makes three whole-size
    temporaries on one thread: 3.2 ms against torch's 0.23 on 64x128x128). None otherwise."""
    if (type(x) is not np.ndarray or x.dtype not in _FLOATS or x.ndim < 2
            or not x.flags.c_contiguous or x.size == 0 or type(w) is not np.ndarray
            or w.size != x.shape[1]):
        return None
    n, c = x.shape[:2]
    rest = x.size // (n * c)
    src = x.reshape(n * c, rest)
    y = _out(x.shape, x.dtype)
    dst = y.reshape(n * c, rest)
    slopes = np.broadcast_to(w.reshape(1, c).astype(x.dtype), (n, c)).reshape(n * c, 1)

    def block(r0, r1):
        neg = _workspace((r1 - r0, rest), x.dtype, slot=61)
        _uclip(src[r0:r1], -_INF, 0.0, out=neg)
        neg *= slopes[r0:r1]
        _uclip(src[r0:r1], 0.0, _INF, out=dst[r0:r1])
        dst[r0:r1] += neg
    _plane_blocks(n * c, rest, x.size, block)
    return y


def softmax_last(x: np.ndarray) -> np.ndarray | None:
    """Softmax over the last axis of a C-contiguous float32/float64 array (timm-style attention
    scores, classifier heads): blocks of whole rows of about NORM_BLOCK_ELEMENTS, the same
    number for each thread, each through :func:`_softmax_rows` (``exp(x)``, shifted by the row
    max only where the block's values could overflow or underflow it, row sums as a product with
    ones, one division). NaN and all-``-inf`` rows give NaN, as torch's. None when the argument
    does not fit."""
    if (type(x) is not np.ndarray or x.dtype not in _FLOATS or x.ndim == 0
            or x.size == 0):
        return None
    if not x.flags.c_contiguous:
        # a permuted view (CaiT's talking heads: scores mixed over the heads by a linear layer on
        # (B, N, N, H), permuted back): one copy into the output, then the softmax there in
        # place. 2 threads, against the generic steps on the view: (4, 4, 64, 64) 0.22 against
        # 1.26 ms, (4, 6, 197, 197) 2.4 against 12.9
        y = _out(x.shape, x.dtype)
        _copy_channels(y, x, axis=0 if x.shape[0] > 1 or x.ndim == 1 else 1)
        return _softmax_last_into(y, y)
    return _softmax_last_into(x, None)


def _softmax_last_into(x: np.ndarray, y: np.ndarray | None) -> np.ndarray:
    """:func:`softmax_last` of the C-contiguous ``x`` into ``y`` (which may be ``x``; None: a
    fresh array)."""
    dt = x.dtype
    n = x.shape[-1]
    rows = x.size // n
    src = x.reshape(rows, n)
    if rows <= SOFTMAX_PLAIN_MAX_ROWS and x.size <= TINY_ELEMENTS:
        # a few rows (a classifier head, DIN's (1, 30) scores): plain shifted numpy; the checks
        # below cost more than they save (1x30: 7.7 us, 13 with a -1e9 mask; this 3.3, torch 1.4)
        y = _small_out(x) if y is None else y
        with _silent():  # (the ufuncs' reduce: ndarray.max and .sum add a Python wrapper, ~0.7 us each)
            np.subtract(x, np.maximum.reduce(x, axis=-1, keepdims=True), out=y)
            np.exp(y, out=y)
            y /= np.add.reduce(y, axis=-1, keepdims=True)
        return y
    if x.size <= TINY_ELEMENTS and (_numba is None or dt != np.float32):  # one block, this thread
        y = _small_out(x) if y is None else y
        with _silent():
            _softmax_rows(src, y.reshape(rows, n), np.ones((n, 1), dt))
        return y
    if y is None:
        y = _out(x.shape, dt)
    dst = y.reshape(rows, n)
    work = x.size * 2  # exp-bound: weighted as the transcendental activations in _COST
    rb = _row_block(rows, n, work)
    if _numba is not None and dt == np.float32:  # the optional compiled kernel: one pass
        def run(b0, b1):
            r0, r1 = b0 * rb, min(rows, b1 * rb)
            _numba.softmax_rows_f32(src[r0:r1], dst[r0:r1])
        _parallel(run, -(-rows // rb), x.size)
        return y
    ones = np.ones((n, 1), dt)

    def part(b0, b1):
        with _silent():
            for r0 in range(b0 * rb, min(rows, b1 * rb), rb):
                r1 = min(rows, r0 + rb)
                _softmax_rows(src[r0:r1], dst[r0:r1], ones)
    _parallel(part, -(-rows // rb), work)
    return y


def log_softmax_last(x: np.ndarray) -> np.ndarray | None:
    """log_softmax over the last axis of a small C-contiguous float32/float64 array (at most
    SOFTMAX_PLAIN_MAX_ROWS rows and TINY_ELEMENTS elements: a classifier's last layer) in plain
    numpy on this thread: ``(x - max) - log(sum(exp(x - max)))``, as torch and the generic path
    compute it (1x10: 12 -> 5 us a call through the layer; the generic path's namespace wrappers
    and its extra temporary were most of it). None otherwise (the generic path)."""
    if (type(x) is not np.ndarray or x.dtype not in _FLOATS or x.ndim == 0
            or not x.flags.c_contiguous or x.size == 0 or x.size > TINY_ELEMENTS
            or x.size // x.shape[-1] > SOFTMAX_PLAIN_MAX_ROWS):
        return None
    y = _small_out(x)
    with _silent():
        np.subtract(x, x.max(axis=-1, keepdims=True), out=y)
        lse = np.exp(y).sum(axis=-1, keepdims=True)
        np.log(lse, out=lse)
        y -= lse
    return y


_LOG_MAX = {np.dtype(np.float32): math.log(float(np.finfo(np.float32).max)),
            np.dtype(np.float64): math.log(float(np.finfo(np.float64).max))}


def _softmax_rows(src: np.ndarray, dst: np.ndarray, ones: np.ndarray) -> None:
    """Softmax along the rows of the 2-D block ``src`` into ``dst`` (may be ``src``); ``ones``
    is an (n, 1) column of ones. The shift by each row's max only guards exp against overflow
    (and a row against underflowing whole): when every value lies within +-SOFTMAX_NO_SHIFT
    there is none, and the two whole-block reductions that check it cost a seventh of a max per
    short row and of the broadcast subtraction (ViT-Tiny's 3x197x197 scores: 0.26 -> 0.21 ms
    on one thread)."""
    dst /= _exp_rows(src, dst, ones)


def _exp_rows(src: np.ndarray, dst: np.ndarray, ones: np.ndarray,
              no_shift: tuple[float, float] = (-SOFTMAX_NO_SHIFT, SOFTMAX_NO_SHIFT)) -> np.ndarray:
    """:func:`_softmax_rows` without the division: ``dst`` holds each row's exponentials (shifted
    by the row max unless every value lies within ``no_shift`` and the row sums cannot overflow)
    and the ``(rows, 1)`` row sums are returned (a per-thread workspace), for the caller to
    divide a smaller product by (attention: the (L, Dv) output instead of the (L, S) scores)."""
    hi, lo = src.max(), src.min()
    top = min(no_shift[1], _LOG_MAX[dst.dtype] - math.log(max(1, src.shape[-1])) - 1.0)
    if no_shift[0] < lo and hi < top:  # NaN and -inf fail this
        np.exp(src, out=dst)
    else:
        np.subtract(src, np.max(src, axis=-1, keepdims=True), out=dst)
        if dst.dtype == np.float32 and lo - hi < SOFTMAX_SUBNORMAL_BELOW:
            # exponentials under float32's smallest normal (a Swin window mask of -100) are
            # flushed to 0: the products after a softmax ran 8-10x slower on subnormal weights
            # (Swin-T's masked attention @ v: 4.5 ms against 0.5)
            np.copyto(dst, -np.inf, where=dst < SOFTMAX_SUBNORMAL_BELOW)
        np.exp(dst, out=dst)
    tot = _workspace((dst.shape[0], 1), dst.dtype, slot=52)
    np.matmul(dst, ones, out=tot)  # row sums as a product: 3x faster on short rows
    return tot


# -- resize ----------------------------------------------------------------------------------------
def resize_taps(x: np.ndarray, plan) -> np.ndarray | None:
    """Interpolation (``kuiper_xp.layers.resize``) of an (N, C, spatial...) float array with the
    layer's per-axis plan (None, or taps ``(index, weight or None)``), in the generic path's order
    (axis by axis; per axis ``take(i0) * w0 + take(i1) * w1 + ...``), so the results are the same
    (but for short axes of finite inputs, taken as matrix products: see RESIZE_MATMUL_MAX_IN);
    planes split over the threads, the intermediate in a workspace and the result
    from the graph's pool (the generic path made ~6 fresh arrays per call, a page fault per
    4 KiB each). None when nothing is resized or the dtype is not float32/float64."""
    x = np.asarray(x)
    active = [k for k, taps in enumerate(plan) if taps is not None]
    if x.dtype not in _FLOATS or not active or x.ndim != len(plan) + 2 or x.size == 0:
        return None
    n, c = x.shape[:2]
    cur = np.ascontiguousarray(x).reshape((n * c,) + x.shape[2:])
    finite = None
    for j, k in enumerate(active):
        taps = plan[k]
        axis = 1 + k
        shape = list(cur.shape)
        shape[axis] = int(taps[0][0].shape[0])
        if j == len(active) - 1:  # asked for in the output's own shape (a concat's piece fits)
            out = _view(_out((n, c) + tuple(shape[1:]), x.dtype), tuple(shape))
        else:
            out = _workspace(tuple(shape), x.dtype, slot=30 + j % 2)
        if (len(taps) >= 2 and axis >= cur.ndim - 2 and out.size >= RESIZE_MATMUL_MIN_OUT
                and (cur.shape[axis] <= RESIZE_MATMUL_MAX_IN
                     or (axis == cur.ndim - 1 and _tap_bands(taps, cur.shape[axis], cur.dtype)))):
            if finite is None:  # (a product with the tap matrix would spread inf and NaN)
                finite = bool(np.isfinite(x).all())
            if finite:
                _resize_axis_matmul(cur, out, taps, axis)
                cur = out
                continue
        bshape = (-1,) + (1,) * (len(shape) - 1 - axis)

        def part(lo, hi, src=cur, dst=out, taps=taps, axis=axis, bshape=bshape):
            s, d = src[lo:hi], dst[lo:hi]
            with _silent():  # inf * 0-weight taps: NaN, as torch
                for t, (idx, w) in enumerate(taps):
                    tgt = d if t == 0 else _workspace(d.shape, d.dtype, slot=32)
                    np.take(s, idx, axis=axis, out=tgt, mode="clip")  # indices are in range
                    if w is not None:
                        tgt *= w.reshape(bshape)
                    if t:
                        d += tgt
        _parallel(part, n * c, out.size * len(taps))
        cur = out
    return cur.reshape((n, c) + cur.shape[1:])


#: a resized axis of at most this many input samples (and an output of RESIZE_MATMUL_MIN_OUT
#: elements or more) is interpolated as a product with its (in, out) tap matrix rather than by a
#: gather, a multiply and an add per tap (ICNet's bilinear x4 of (4, 8, 32, 32): 1.38 -> ~0.4 ms,
#: torch 0.79); finite inputs only, within float rounding of the gather form
RESIZE_MATMUL_MAX_IN = 64
RESIZE_MATMUL_MIN_OUT = 1 << 14


_TAP_MATRICES: dict[int, tuple] = {}  # id of a plan's first index array -> (that array, n_in, dtype, matrix)


def _tap_matrix(taps, n_in: int, dtype) -> np.ndarray:
    """The (n_in, n_out) matrix of one axis's taps (equal indices add up), kept for the plan's
    taps (the layers cache their plans per shape): 18 us to build for 64 -> 512."""
    key = id(taps[0][0])
    hit = _TAP_MATRICES.get(key)
    if hit is not None and hit[0] is taps[0][0] and hit[1] == n_in and hit[2] == dtype:
        return hit[3]
    n_out = taps[0][0].shape[0]
    m = np.zeros((n_in, n_out), dtype=dtype)
    cols = np.arange(n_out)
    for idx, w in taps:
        np.add.at(m, (idx, cols), 1.0 if w is None else w)
    if len(_TAP_MATRICES) >= 64:
        _TAP_MATRICES.clear()
    _TAP_MATRICES[key] = (taps[0][0], n_in, dtype, m)
    return m


#: a last axis of more than RESIZE_MATMUL_MAX_IN input samples is still taken as matrix products
#: when its taps are local: one per block of RESIZE_BAND_COLUMNS output columns, with the rows of
#: the tap matrix that block reads (at most RESIZE_BAND_MAX_K on average: a bilinear x2 reads 17
#: for 32 outputs, a /2 reduction 65). 2 Zen 3 threads, bands against the gathers (and the whole
#: matrix at 64 samples), the two alternated call by call, medians: bilinear (4, 32, 49, 66) to
#: 97x131 0.62-0.70 of the time, (1, 256, 64, 64) to 128x128 0.84-0.92, (1, 128, 100, 100) to
#: 200x200 0.75-0.84, (8, 64, 100, 100) 0.79, (1, 64, 120, 160) to 240x320 0.73-0.75, bicubic
#: (1, 3, 224, 224) to 448x448 0.52-0.56 (without the row blocks below, (1, 256, 64, 64) took
#: 0.95-1.19 and (8, 64, 100, 100) 1.07-1.12: each band read all the rows from memory)
RESIZE_BAND_COLUMNS = 32
RESIZE_BAND_MAX_K = 96
#: ... the bands of a block of rows of about this many bytes (input and output rows) at a time
#: (1-8 MiB measured alike; 256 KiB made too many small products)
RESIZE_BAND_ROWS_BYTES = 4 << 20
_TAP_BANDS: dict[int, tuple] = {}


def _tap_bands(taps, n_in: int, dtype) -> list | None:
    """``[(j0, j1, c0, c1, block)]``: output columns [j0, j1) of one axis's taps read input
    samples [c0, c1) only, ``block`` the (c1 - c0, j1 - j0) piece of the tap matrix; None when
    the blocks read too much of the input (on average more than RESIZE_BAND_MAX_K samples or
    half of them: a short axis is then one product with its whole matrix). Kept per plan, as
    _tap_matrix."""
    key = id(taps[0][0])
    hit = _TAP_BANDS.get(key)
    if hit is not None and hit[0] is taps[0][0] and hit[1] == n_in and hit[2] == dtype:
        return hit[3]
    m = _tap_matrix(taps, n_in, dtype)
    n_out = m.shape[1]
    lo = np.minimum.reduce([np.asarray(i) for i, _ in taps])
    hi = np.maximum.reduce([np.asarray(i) for i, _ in taps]) + 1
    bands: list | None = []
    width = 0
    for j0 in range(0, n_out, RESIZE_BAND_COLUMNS):
        j1 = min(n_out, j0 + RESIZE_BAND_COLUMNS)
        c0, c1 = int(lo[j0:j1].min()), int(hi[j0:j1].max())
        width += (c1 - c0) * (j1 - j0)
        bands.append((j0, j1, c0, c1, np.ascontiguousarray(m[c0:c1, j0:j1])))
    if width > min(RESIZE_BAND_MAX_K, n_in / 2) * n_out:  # (else the whole matrix, or the gathers)
        bands = None
    if len(_TAP_BANDS) >= 64:
        _TAP_BANDS.clear()
    _TAP_BANDS[key] = (taps[0][0], n_in, dtype, bands)
    return bands


def _resize_axis_matmul(cur: np.ndarray, out: np.ndarray, taps, axis: int) -> None:
    """One axis of :func:`resize_taps` (the last or the one before it) as a matrix product (the
    last, when it is long, as one product per band of output columns: _tap_bands)."""
    n_in, n_out = cur.shape[axis], out.shape[axis]
    bands = _tap_bands(taps, n_in, cur.dtype) if axis == cur.ndim - 1 else None
    if bands:
        src, dst = cur.reshape(-1, n_in), out.reshape(-1, n_out)
        step = max(64, RESIZE_BAND_ROWS_BYTES // ((n_in + n_out) * cur.dtype.itemsize))

        def rows(lo, hi):
            for r0 in range(lo, hi, step):  # (every band of a block of rows while it is in cache)
                r1 = min(hi, r0 + step)
                for j0, j1, c0, c1, block in bands:  # type: ignore[union-attr]
                    _mm(src[r0:r1, c0:c1], block, dst[r0:r1, j0:j1])
        _parallel(rows, src.shape[0], out.size * RESIZE_BAND_COLUMNS)
        return
    m = _tap_matrix(taps, n_in, cur.dtype)
    if axis == cur.ndim - 1:
        _gemm(cur.reshape(-1, n_in), m, out.reshape(-1, n_out))
        return
    mt = m.T  # (a transposed view: matmul reads it as it is)

    def part(lo, hi):
        np.matmul(mt, cur[lo:hi], out=out[lo:hi])
    _parallel(part, cur.shape[0], out.size * n_in)


# -- linear ----------------------------------------------------------------------------------------
def pixel_shuffle(x: np.ndarray, r: int, inverse: bool = False) -> np.ndarray | None:
    """``F.pixel_shuffle(x, r)`` (``inverse``: ``F.pixel_unshuffle``) of an array of 3 or more
    dims as one strided copy per thread into a pooled output, the inner loop running along the
    rows (the generic reshape-permute-reshape copied with inner loops of r elements: ESPCN's
    27x224x224 -> 3x672x672 took 2.2 ms, 1.5 here). None when ``x`` does not fit (the caller
    checks the shape first)."""
    if type(x) is not np.ndarray or x.ndim < 3:
        return None
    lead = x.shape[:-3]
    nn_ = math.prod(lead)
    if inverse:
        c, h, w = x.shape[-3], x.shape[-2] // r, x.shape[-1] // r
        out = _out(lead + (c * r * r, h, w), x.dtype)
        dst = out.reshape(nn_ * c, r, r, h, w)
        src = x.reshape(nn_ * c, h, r, w, r).transpose(0, 2, 4, 1, 3)
    else:
        c, h, w = x.shape[-3] // (r * r), x.shape[-2], x.shape[-1]
        out = _out(lead + (c, h * r, w * r), x.dtype)
        dst = out.reshape(nn_ * c, h, r, w, r).transpose(0, 2, 4, 1, 3)
        src = x.reshape(nn_ * c, r, r, h, w)
    # split over images x channels when there are enough of them, else over the r row phases
    _copy_channels(dst, src, axis=0 if nn_ * c >= 2 * _threads_now() else 1)
    return out


def rnn_sequence(kind: str, xw: np.ndarray, w_hh_t: np.ndarray, h0: np.ndarray, c0: np.ndarray | None,
                 out: np.ndarray, *, reverse: bool = False, b_hn: np.ndarray | None = None,
                 w_hr_t: np.ndarray | None = None, relu: bool = False):
    """One layer and direction of ``kuiper_xp.layers.recurrent`` over time, writing each step's h
    into ``out[t]`` (``(L, N, H_out)``, may be a strided view of a bidirectional layer's output)
    with in-place ufuncs on per-thread workspaces: nothing is allocated per step and the gate
    views are made once. ``kind`` is "lstm" (gates i, f, g, o; the sigmoid gates' rows of ``xw``
    and of the weight already halved, so sigmoid(a) = (1 + tanh(a)) / 2 after one tanh over all
    gates), "gru" (r, z halved; n = tanh(xw_n + r * (h W_hn^T + b_hn))) or "rnn" (tanh or
    ``relu``). ``xw`` is the input projection with its biases, ``(L, N, G*H)``; ``w_hh_t`` is
    ``W_hh^T``, ``(H_out, G*H)``; ``w_hr_t`` LSTM's projection ``W_hr^T``, ``(H, H_out)``. Returns
    the last (h, c) (c None but for LSTM).

    (The transposed loop, gates as ``W_hh @ h^T``, measured no better: OpenBLAS took 46 against
    16 us for a 768x256 weight and 4 sequences, 234-359 against 305-392 for 2048x512 and 8.)"""
    length, n, gh = xw.shape
    dt = xw.dtype
    steps = range(length - 1, -1, -1) if reverse else range(length)
    g = _workspace((n, gh), dt, slot=80)
    h = h0
    if kind == "lstm":
        hid = gh // 4
        alpha = np.full(gh, 0.5, dt)
        alpha[2 * hid:3 * hid] = 1.0
        beta = np.full(gh, 0.5, dt)
        beta[2 * hid:3 * hid] = 0.0
        c = np.array(c0, dtype=dt, copy=True)
        tmp = _workspace((n, hid), dt, slot=81)
        gi, gf, gg, go = g[:, :hid], g[:, hid:2 * hid], g[:, 2 * hid:3 * hid], g[:, 3 * hid:]
        for t in steps:
            _gemm(h, w_hh_t, g)
            g += xw[t]
            np.tanh(g, out=g)
            g *= alpha
            g += beta
            c *= gf
            np.multiply(gi, gg, out=tmp)
            c += tmp
            np.tanh(c, out=tmp)
            if w_hr_t is None:
                h = np.multiply(go, tmp, out=out[t])
            else:
                tmp *= go
                h = np.matmul(tmp, w_hr_t, out=out[t])
        return h, c
    if kind == "gru":
        hid = gh // 3
        rz = _workspace((n, 2 * hid), dt, slot=81)
        nb = _workspace((n, hid), dt, slot=82)
        tmp = _workspace((n, hid), dt, slot=83)
        r, z, hn = rz[:, :hid], rz[:, hid:], g[:, 2 * hid:]
        for t in steps:
            _gemm(h, w_hh_t, g)
            np.add(xw[t, :, :2 * hid], g[:, :2 * hid], out=rz)
            np.tanh(rz, out=rz)
            rz *= 0.5
            rz += 0.5
            if b_hn is not None:
                hn += b_hn
            np.multiply(r, hn, out=nb)
            nb += xw[t, :, 2 * hid:]
            np.tanh(nb, out=nb)
            np.subtract(h, nb, out=tmp)
            tmp *= z
            h = np.add(nb, tmp, out=out[t])
        return h, None
    if kind == "rnn":
        for t in steps:
            _gemm(h, w_hh_t, g)
            g += xw[t]
            h = np.maximum(g, 0, out=out[t]) if relu else np.tanh(g, out=out[t])
        return h, None
    raise ValueError(f"unknown recurrent kind {kind!r}")


def pack_linear(weight, keep_big: bool = True) -> np.ndarray:
    """``W^T`` of an (out, in) weight as a contiguous (in, out) array, made once at build: the
    products then read it untransposed, which OpenBLAS packs faster (2 threads of an AMD EPYC,
    x of 128 rows: 768x768 0.82 against 1.00 ms as a transposed view, 3072x768 3.39 against 3.74;
    in models, interleaved: timm's ViT-Tiny 33.8 against 37.4 ms at batch 1, ViT-B/32 91.3
    against 94.5, and 423 against 434 at batch 8). The layers drop the read weight from the
    build's cache, so loading holds one weight twice at a time, not all of them. With
    ``keep_big`` a weight of PACK_KEEP_MIN_ELEMENTS or more comes back as the transposed view
    instead; recurrent layers pass False: their step products of a few rows ran 1.2-1.45x
    slower on the view (a (4096, 1024) hidden weight, 4-16 rows, 1 or 2 threads)."""
    w = np.asarray(weight)
    if keep_big and w.ndim == 2 and w.size >= PACK_KEEP_MIN_ELEMENTS and w.flags.c_contiguous:
        return w.T  # (big weights stay (out, in): see PACK_KEEP_MIN_ELEMENTS)
    if w.ndim != 2 or w.shape[0] < 2 * PACK_ROWS:
        return np.ascontiguousarray(w.T)
    out = np.empty((w.shape[1], w.shape[0]), w.dtype)

    def part(lo, hi):  # blocks of rows: 2.3x faster than one strided copy
        for i in range(lo * PACK_ROWS, min(w.shape[0], hi * PACK_ROWS), PACK_ROWS):
            out[:, i:i + PACK_ROWS] = w[i:i + PACK_ROWS].T
    _parallel(part, -(-w.shape[0] // PACK_ROWS), w.size)  # (over set_num_threads' threads)
    return out


#: weights of at least this many elements are kept as read, (out, in), by :func:`pack_linear`
#: (the layers get the transposed view): for them OpenBLAS did as well or better with the view at
#: every row count (4096x4096 to 25088x4096, 1 to 400 rows: 0.73-1.09 of the packed copy's time,
#: 2 AVX-512 Xeon cores), and :func:`linear` then takes few rows as ``W @ x.T`` (0.5-0.85: VGG's
#: and AlexNet's classifiers at batch 2-32). Session 25 lowered it from 8 Mi elements: in whole
#: models, whose weights come from memory rather than cache, ViT-B/32 (768x3072 and 2304x768)
#: ran 0.90 of its time at batch 1 and 0.94 at batch 8 with its weights kept (old and new
#: alternated, three times), loading in 0.35 s instead of 0.48-1.1 (no transposed copy: the
#: first touch of fresh memory costs ~1.2 s a GiB on this VM); ViT-L/16's load 1.6-4.7 -> 0.7 s,
#: BERT-large's 2.8-5.3 -> 2.5-2.7, their times, GPT-2's, Whisper's, VGG-16's and Swin's within
#: noise; a 2048x2048 MLP at 64 rows 3.1-3.3 -> 2.9 ms. Isolated and cached, 2048x1000 at 50-400
#: rows stays 1.1-1.2x slower as a view, 768x768 to 3072x768 within 5% either way.
PACK_KEEP_MIN_ELEMENTS = 1 << 20
#: inputs of at most this many rows (and at least 2) meet a weight kept (out, in) as ``W @ x.T``
#: (each thread then reads whole rows of W: ViT-B/32's 50 tokens at 64, against 32, 0.93 of the
#: model's time; 8 rows of 3072x768 0.57 against 0.69 ms packed). Not with the MKL path on
#: (``use_mkl``), whose ``x @ W.T`` is faster: ViT-B/32 at batch 1 63.5 ms against 74-79
LINEAR_FEW_ROWS = 64
#: rows of the weight transposed at a time by :func:`pack_linear` (3072x768 float32 on 2 AMD EPYC
#: cores: 6.1 ms as one copy, 2.6 in blocks of 128 rows, 2.9 of 64, 3.5 of 32; on 2 AVX-512 Xeon
#: cores 1.80 ms at 64 rows, 2.86 at 128, 1.93 at 48, and 64 best for 2304x768 and 768x768 too:
#: ViT-B/32's 49 packs 211 -> ~130 ms of its load)
PACK_ROWS = 64


#: a Linear layer of at most this many multiply-adds (and at most TINY_ELEMENTS outputs) on a
#: 2-D input is one ``np.matmul``, the bias and the activation on the calling thread (a product
#: this small is never split over the threads, and its output is below the pool's sizes)
LINEAR_TINY_MACS = 1 << 16
#: a Linear layer with a fused activation and at least this many rows computes its result in
#: blocks of rows, each thread's GEMM, bias and activation on one block while it is in cache
#: (:func:`_linear_blocks`), instead of a GEMM split over the threads and then a bias pass and
#: an activation pass over the whole result
LINEAR_BLOCKS_MIN_ROWS = 128
#: ... blocks of about this many bytes of result, when the weight takes at most as many (a
#: bigger weight would be packed again by each block's GEMM: one block per thread then)
LINEAR_BLOCK_BYTES = 1 << 20


def linear(x: np.ndarray, weight_t: np.ndarray, bias=None, activation: Any = None) -> np.ndarray:
    """``x @ weight_t + bias`` over the last axis of ``x``, then ``activation`` (an elementwise
    spec of :func:`activation_inplace`, or None) in place on the result."""
    if type(x) is np.ndarray and x.ndim == 2 and x.dtype == weight_t.dtype:
        outs = x.shape[0] * weight_t.shape[-1]
        if (outs <= TINY_ELEMENTS and outs * x.itemsize < BufferPool.MIN_BYTES
                and x.shape[0] * weight_t.size <= LINEAR_TINY_MACS and getattr(_tls, "dest", None) is None):
            # a few rows through a small weight (an MLP on one sample): the product, the bias
            # and the activation as three numpy calls on this thread, without the split rules
            # and the chunked kernels (their bookkeeping was 6.6 of a fused 1x32 -> 64 ReLU
            # layer's 10.4 us); the output is under the pool's sizes: malloc's anyway
            y = np.matmul(x, weight_t)
            if bias is not None:
                y += bias
            if activation is not None:
                _activate_block(y, activation)
            return y
    x = np.asarray(x)
    lead = x.shape[:-1]
    x2 = x.reshape(math.prod(lead), x.shape[-1]) if x.ndim != 2 else x  # (not -1: ambiguous for 0 elements)
    rows, n = x2.shape[0], weight_t.shape[1]
    dt = x2.dtype if x2.dtype == weight_t.dtype else np.result_type(x2, weight_t)
    if 2 <= rows <= LINEAR_FEW_ROWS and _mkl is None and weight_t.flags.f_contiguous and not weight_t.flags.c_contiguous:
        # a big weight kept (out, in) (pack_linear): y^T = W @ x^T reads W's rows once per thread
        yt = _gemm(weight_t.T, x2.T, _workspace((n, rows), dt, slot=53))
        y = _out((rows, n), dt)
        y[...] = yt.T
    elif activation is not None and rows >= LINEAR_BLOCKS_MIN_ROWS and _scope_depth and n > 0:
        y = _linear_blocks(x2, weight_t, bias, activation, _out((rows, n), dt))
        return y if x.ndim == 2 else y.reshape(lead + (n,))
    else:
        y = _gemm(x2, weight_t, _out((rows, n), dt))
    if bias is not None:
        y += bias
    if activation is not None:
        _activate_block(y, activation)
    return y if x.ndim == 2 else y.reshape(lead + (n,))


def _linear_blocks(x: np.ndarray, wt: np.ndarray, bias, activation, y: np.ndarray) -> np.ndarray:
    """``y = activation(x @ wt + bias)`` for a 2-D ``x``, in blocks of rows of about
    LINEAR_BLOCK_BYTES of result (one block per thread when the weight is bigger than that),
    the threads taking whole blocks: each block's bias and activation run while it is in cache.
    2 AMD EPYC (Zen 3) threads, with GELU, against the GEMM split over the threads followed by
    the bias and GELU passes: ConvNeXt-T's (3136, 96) x (96, 384) 5.2 -> 4.5 ms, (784, 192) x
    (192, 768) 3.7 -> 3.4, (196, 384) x (384, 1536) 2.8 -> 2.5, batch 8's (25088, 96) x (96, 384)
    52 -> 46; ViT-B/32's (400, 768) x (768, 3072) even (without an activation the split GEMM
    stays: the weight's columns split, each thread reads half of it)."""
    rows, n = y.shape
    k = _threads_now()
    if k > 1 and not _gemm_worth_splitting(rows * n * x.shape[1]):
        k = 1
    per_thread = -(-rows // k)
    row_bytes = n * y.dtype.itemsize
    rb = per_thread if wt.size * wt.dtype.itemsize > LINEAR_BLOCK_BYTES else \
        max(1, min(per_thread, LINEAR_BLOCK_BYTES // row_bytes))
    nblk = -(-rows // rb)
    if k > 1 and nblk % k:  # the same number of blocks for each thread
        rb = -(-rows // (-(-nblk // k) * k))
        nblk = -(-rows // rb)

    def part(lo, hi):
        with _silent():
            for b in range(lo, hi):
                r0, r1 = b * rb, min(rows, b * rb + rb)
                _mm(x[r0:r1], wt, y[r0:r1])
                _bias_activate(y[r0:r1], bias, activation)
    _parallel(part, nblk, 1 << 62 if k > 1 else 0)
    return y


# --- expression ---------------------------------------------------------------------------------
# Fast paths of kuiper_xp.expression.functions (the generic Array-API code there is the reference
# and is tested against these).


#: erf(z) = tanh(z Q(z^2)) on [-4, 4] (erf(4) is 1 in float32), Q's coefficients from the constant
#: term (2/sqrt(pi), so that small z keep their relative accuracy) up: a weighted least-squares
#: fit of atanh(erf(z)) / z (float64, minimax by reweighting); evaluated in float32 within
#: 1.8e-7 of erf on [-8, 8] (2.7e-7 relative for |z| < 1)
_ERF_Q = (1.1283791670955126, 0.10276880688516304, -0.0001903005817130123, -0.0006214369831852051,
          8.83063519980248e-05, -5.779750095045538e-06, 1.4818129087644915e-07)


def _erf_f32(x: np.ndarray) -> np.ndarray:
    """erf of a float32 array in 15 passes (Cody's form took 24 ns an element: 9 of torch's 0.13
    ms for 393 Ki elements)."""
    z = _uclip(x, -4.0, 4.0)  # (NaN stays NaN; +-inf become +-4, so +-1)
    t = z * z
    p = t * np.float32(_ERF_Q[6])
    p += np.float32(_ERF_Q[5])
    for c in _ERF_Q[4::-1]:
        p *= t
        p += np.float32(c)
    p *= z
    np.tanh(p, out=p)
    # float32's tanh stops at 1 - 2**-24 here: from 3.8325069, where torch's float32 erf gives
    # +-1 on AVX-512 CPUs (on AVX2-only ones from ~3.9192, where the exact erf rounds to 1), it is
    # set (floor(erf(x)) is 1 there, 1 - erf(x) is 0)
    big = np.abs(z) >= _ERF_ONE_F32
    if big.any():
        np.copyto(p, np.sign(z), where=big)
    return p


#: the least float32 whose erf rounds to 1
_ERF_ONE_F32 = np.float32(3.8325069)


def expr_erf(x):
    """torch.erf for a float numpy array: float32 by :func:`_erf_f32`; float64 by Cody's rational
    approximation (the same coefficients as ``erf_generic``) with in-place Horner steps, the |x|
    <= 0.46875 and |x| > 4 ranges computed only where they apply."""
    from kuiper_xp.expression.functions import CODY_A, CODY_B, CODY_C, CODY_D, THRESH, _erfc_large

    x = np.asarray(x)
    if x.ndim == 0:
        return expr_erf(x.reshape(1)).reshape(())
    if x.dtype == np.float16:
        return expr_erf(x.astype(np.float32)).astype(np.float16)
    if x.dtype.kind != "f":
        x = x.astype(np.float32)
    if x.dtype == np.float32:
        return _erf_f32(x)
    dt = x.dtype.type
    with _silent():
        y = np.abs(x)
        ym = np.clip(y, THRESH, 4.0)
        num = ym * dt(CODY_C[8])
        den = ym.copy()
        for i in range(7):
            num += dt(CODY_C[i])
            num *= ym
            den += dt(CODY_D[i])
            den *= ym
        num += dt(CODY_C[7])
        den += dt(CODY_D[7])
        num /= den
        # exp(-y*y) as exp(-ysq*ysq) * exp(-(y-ysq)(y+ysq)), ysq = trunc(16 y)/16 (Cody)
        ysq = ym * dt(16)
        np.trunc(ysq, out=ysq)
        ysq *= dt(1 / 16)
        t = ym - ysq
        ym += ysq
        t *= ym
        ysq *= ysq
        ysq += t
        np.negative(ysq, out=ysq)
        np.exp(ysq, out=ysq)
        num *= ysq  # erfc(|x|) for 0.46875 < |x| <= 4
        big = y > 4.0
        if big.any():
            if x.dtype == np.float64:
                num[big] = _erfc_large(np.minimum(y[big], 30.0), np)
            else:
                num[big] = 0  # erfc(4) = 1.5e-8 is below float32's resolution at 1
        np.subtract(dt(0.5), num, out=num)
        num += dt(0.5)
        np.copysign(num, x, out=num)
        small = y <= THRESH
        if small.any():
            xs = x[small]
            z = xs * xs
            n2 = CODY_A[4] * z
            d2 = z
            for i in range(3):
                n2 = (n2 + dt(CODY_A[i])) * z
                d2 = (d2 + dt(CODY_B[i])) * z
            num[small] = xs * (n2 + dt(CODY_A[3])) / (d2 + dt(CODY_B[3]))
        nan = np.isnan(x)
        if nan.any():
            num[nan] = np.nan
    return num


def expr_fmod(a, b):
    """torch.fmod on numpy arrays (or an array and a Python scalar) of one dtype."""
    return np.fmod(a, b)


def expr_sign(x):
    """torch.sign of a float numpy array: like np.sign, but NaN gives 0."""
    r = np.asarray(np.sign(x))  # (a 0-d input gives a numpy scalar, which copyto refuses)
    np.copyto(r, 0, where=np.isnan(x))
    return r


_SEGMENT_REDUCE = {"sum": np.add, "mean": np.add, "prod": np.multiply, "amax": np.maximum, "amin": np.minimum}


def _segment_identity(dtype, reduce: str):
    if reduce in ("sum", "mean"):
        return 0
    if reduce == "prod":
        return 1
    if dtype.kind == "f":
        return -np.inf if reduce == "amax" else np.inf
    info = np.iinfo(dtype)
    return info.min if reduce == "amax" else info.max


#: above this many leading slices, :func:`segment_scatter` builds one index for all of them
#: instead of looping over them in Python
_SEGMENT_LOOP_MAX = 64


def segment_scatter(dest, pos, vals, reduce: str, include_self: bool, axis: int = 0):
    """``kuiper_xp.layers.scatter.segment_scatter`` on numpy arrays, along any ``axis``: a new
    ``dest`` whose slices along ``axis`` named by ``pos`` ((k,) int64 in [0, N)) are combined by
    ``reduce`` (sum, prod, mean, amax, amin) with the slices of ``vals`` (dest's shape with k at
    ``axis``), with the slice's own value where ``include_self``.

    One unbuffered ``ufunc.at`` over flattened element positions (numpy 2 runs it in a tight 1-D
    loop), per leading slice: a GCN-style index_add of 20000 rows of 64 into 2000 takes 2.6 ms
    here, against 8.4 ms for a sort and ``ufunc.reduceat`` along rows and 10 ms for ``np.add.at``
    on rows; working in place along ``axis`` spares the two moved copies of an index_add along
    dim 1 of a batch. Returns None for what it does not cover (bool or non-native dtypes,
    ``last``), which the caller then computes generically."""
    ufunc = _SEGMENT_REDUCE.get(reduce)
    if (ufunc is None or not isinstance(dest, np.ndarray) or not isinstance(vals, np.ndarray)
            or dest.dtype.kind not in "fiu" or vals.dtype != dest.dtype or pos.ndim != 1
            or not 0 <= axis < max(dest.ndim, 1)):
        return None
    shape = dest.shape if dest.ndim else (1,)
    k = pos.shape[0]
    if tuple(vals.shape if vals.ndim else (1,)) != shape[:axis] + (k,) + shape[axis + 1:]:
        return None
    out = np.array(dest, copy=True, order="C")
    if k == 0:
        return out
    n, pre, post = shape[axis], math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    view = out.reshape(pre, n, post)
    src = np.ascontiguousarray(vals).reshape(pre, k * post)
    pos = pos.astype(np.intp, copy=False)
    if not include_self:
        view[:, pos, :] = _segment_identity(dest.dtype, reduce)
    flat = pos if post == 1 else (pos[:, None] * post + np.arange(post, dtype=np.intp)).reshape(-1)
    if pre <= _SEGMENT_LOOP_MAX:
        for p in range(pre):
            ufunc.at(view[p].reshape(-1), flat, src[p])
    else:
        ufunc.at(out.reshape(-1), (np.arange(pre, dtype=np.intp)[:, None] * (n * post) + flat).reshape(-1),
                 src.reshape(-1))
    if reduce == "mean":
        counts = np.bincount(pos, minlength=n)
        hit = counts > 0
        div = (counts[hit] + (1 if include_self else 0))[None, :, None]
        if dest.dtype.kind == "f":
            view[:, hit, :] /= div.astype(dest.dtype)
        else:  # (torch divides integer sums with floor rounding)
            view[:, hit, :] = np.floor_divide(view[:, hit, :].astype(np.int64), div).astype(dest.dtype)
    return out


if _NUMBA_AT_IMPORT:
    try:
        use_numba(True)
    except ImportError as _e:
        warnings.warn(f"KUIPER_XP_NUMBA is set but {_e}; using the numpy paths", RuntimeWarning, stacklevel=2)
if _MKL_AT_IMPORT:
    try:
        use_mkl(True)
    except ImportError as _e:
        warnings.warn(f"KUIPER_XP_MKL is set but {_e}; using numpy's own paths", RuntimeWarning, stacklevel=2)


#: inner slice (elements after the scanned axis) from which :func:`cumulative` walks the axis
#: with one vectorised ufunc call per step instead of numpy's strided scan
CUMULATIVE_MIN_INNER = 16
#: ... and with at least this many elements per step (pre * inner): a guided filter's box sums,
#: cumsum over H of (1, 3, 64, 64), took 0.09-0.14 ms as 64 calls of 192 elements against 0.03 for
#: np.cumsum; at (1, 3, 256, 256) (768 per step) the steps won, 0.59 against 0.80
CUMULATIVE_MIN_STEP = 512


def cumulative(x, axis: int, kind: str, dtype):
    """``np.cumulative_sum`` / ``np.cumulative_prod`` of the numpy array ``x`` along ``axis`` in
    ``dtype``, for an axis with at least :data:`CUMULATIVE_MIN_INNER` elements after it: numpy
    scans such an axis element by element with strided loads (a causal linear attention's
    (1, 256, 4, 32, 32) cumsum along dim 1: 4.0 ms), while one ufunc call per step on whole
    (pre, inner) slices takes 0.6 ms. The same additions in the same order: results equal
    numpy's bit for bit. None for what it does not cover (the caller's generic path)."""
    if (type(x) is not np.ndarray or kind not in ("sum", "prod") or x.ndim == 0
            or not 0 <= axis < x.ndim or x.dtype.kind not in "fiub"):
        return None
    dt = np.dtype(dtype)
    if dt.kind not in "fiu":
        return None
    inner = math.prod(x.shape[axis + 1:])
    n = x.shape[axis]
    pre = math.prod(x.shape[:axis])
    if inner < CUMULATIVE_MIN_INNER or pre * inner < CUMULATIVE_MIN_STEP or n < 2 or x.size == 0:
        return None
    src = x.reshape(pre, n, inner)  # a view where x's layout allows, else one copy
    out = np.empty((pre, n, inner), dt)
    ufunc = np.add if kind == "sum" else np.multiply
    out[:, 0] = src[:, 0]
    for i in range(1, n):
        ufunc(out[:, i - 1], src[:, i], out=out[:, i], casting="unsafe")
    return out.reshape(x.shape)


# -- pnnx.Expression trees as one chunked pass ------------------------------------------------------
#: language function -> numpy ufunc, where the expression evaluator's own result on float arrays
#: of one dtype (and Python numbers) is that ufunc's: so the fused pass gives the same bits
_FUSE_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
                "max": np.maximum, "maximum": np.maximum, "min": np.minimum, "minimum": np.minimum}
_FUSE_UNARY = {"neg": np.negative, "abs": np.absolute, "square": np.square, "sqrt": np.sqrt,
               "exp": np.exp, "tanh": np.tanh, "sin": np.sin, "cos": np.cos}
# (no log: the evaluator's float32 log goes through float64, to give torch's bits)
#: outputs smaller than this stay on the evaluator (whole-array calls; the chunking costs more)
FUSE_MIN_ELEMENTS = 1 << 15
#: elements per chunk of a fused expression (each intermediate is one chunk-sized scratch)
FUSE_CHUNK = 1 << 16
#: trees with more calls than this stay on the evaluator
FUSE_MAX_CALLS = 64


class FusedExpression:
    """A ``pnnx.Expression`` tree of elementwise float functions run chunk by chunk: every
    intermediate lives in a chunk-sized per-thread scratch while in cache, the result goes
    straight into a pooled output, and the chunks are split over the threads; a sub-tree whose
    result is much smaller than the output (a per-channel factor from pooled statistics) is
    computed once, whole, before the chunks. The evaluator makes a fresh whole-size array per
    call: ConvNeXt-V2's GRN ``add(add(mul(@0,mul(@1,div(@2,add(@3,1e-6)))),@4),@1)`` on
    (8, 56, 56, 160) took 15 ms. The same ufuncs on the same values in the same order: the
    evaluator's bits. ``__call__(inputs)`` returns None where the inputs do not qualify (not all
    numpy arrays of one float dtype, shapes that do not broadcast, a small result): the
    evaluator then runs."""

    def __init__(self, steps: list, slots: list[int], n_tmp: int, used: list[int]):
        # steps[j] = (ufunc, args); an arg is (0, input index), (1, number) or (2, step index)
        self.steps, self.slots, self.n_tmp, self.used = steps, slots, n_tmp, used

    def __call__(self, inputs: Any) -> Any:
        dt = None
        arrs = {}
        big = False
        for i in self.used:
            a = inputs[i]
            if type(a) is not np.ndarray or (dt is not None and a.dtype != dt):
                return None
            dt = a.dtype
            arrs[i] = a
            big = big or a.size * 16 >= FUSE_MIN_ELEMENTS
        if not big or dt not in _FLOATS:
            return None  # (small inputs: declined before any shape work, ~1 us)
        steps = self.steps
        shapes: list = []
        try:
            for _, args in steps:
                shapes.append(np.broadcast_shapes(*(arrs[v].shape if kind == 0 else () if kind == 1
                                                    else shapes[v] for kind, v in args)))
        except ValueError:
            return None  # (the evaluator's error names the call)
        shape = shapes[-1]
        size = math.prod(shape)
        if size < FUSE_MIN_ELEMENTS:
            return None
        pre: dict[int, np.ndarray] = {}
        with _silent():
            for j, (ufunc, args) in enumerate(steps[:-1]):
                if 8 * math.prod(shapes[j]) <= size:
                    pre[j] = ufunc(*[arrs[v] if kind == 0 else v if kind == 1 else pre[v] for kind, v in args])
        full = {("in", i): a if a.shape == shape else np.broadcast_to(a, shape) for i, a in arrs.items()}
        full.update({("pre", j): np.broadcast_to(r, shape) for j, r in pre.items()})
        # per step: its args as (0, full-size view key), (1, number) or (2, scratch slot)
        prog = [(st[0], [(0, ("in", v)) if kind == 0 else (1, v) if kind == 1 else
                         (0, ("pre", v)) if v in pre else (2, self.slots[v]) for kind, v in st[1]],
                 self.slots[j] if j < len(steps) - 1 else -1)
                for j, st in enumerate(steps) if j not in pre]
        out = _out(shape, dt)
        # chunks: index tuples over shape[:ax] times blocks of `rows` along ax
        inner, ax = 1, len(shape) - 1
        while ax >= 0 and inner * shape[ax] <= FUSE_CHUNK:
            inner *= shape[ax]
            ax -= 1
        if ax < 0:
            outer, rows, nblk = (), 1, 1
        else:
            outer, rows = shape[:ax], max(1, FUSE_CHUNK // inner)
            nblk = -(-shape[ax] // rows)
        n_chunks = math.prod(outer) * nblk
        chunk = min(size, rows * inner)
        n_tmp = self.n_tmp

        def part(c0, c1):
            bufs = [_workspace((chunk,), dt, slot=100 + k) for k in range(n_tmp)]  # (slots of its own)
            with _silent():
                for c in range(c0, c1):
                    if ax < 0:
                        idx: tuple = ()
                    else:
                        o, b = divmod(c, nblk)
                        lo = b * rows
                        blk = (slice(lo, min(shape[ax], lo + rows)),)
                        idx = np.unravel_index(o, outer) + blk if outer else blk
                    dst = out[idx]
                    n, cs = dst.size, dst.shape
                    tmps = [_view(bf[:n], cs) for bf in bufs]
                    for ufunc, args, dest in prog:
                        ufunc(*[full[v][idx] if kind == 0 else v if kind == 1 else tmps[v] for kind, v in args],
                              out=dst if dest < 0 else tmps[dest])
        _parallel(part, n_chunks, size * (len(prog) + 1))
        return out


def fuse_expression_declines(shape: Any) -> bool:
    """Whether an expression whose output the file declares of ``shape`` (None for an unknown
    dim) is too small for :class:`FusedExpression` at any batch worth fusing: known dims (the
    batch taken as 8) under FUSE_MIN_ELEMENTS elements. The layer then keeps the evaluator
    without the fused path's per-call check (a chain of tiny expressions: 3.5 us a step)."""
    if shape is None or any(d is None for d in tuple(shape)[1:]):
        return False
    dims = tuple(shape)
    return 8 * math.prod(d for d in dims if d is not None) < FUSE_MIN_ELEMENTS if dims else True


def fuse_expression(tree: Any) -> FusedExpression | None:
    """A :class:`FusedExpression` for the parsed expression ``tree``, or None where any call is
    outside :data:`_FUSE_BINARY` / :data:`_FUSE_UNARY` (or ``add``/``sub`` with alpha,
    ``reciprocal``, ``rsqrt``, ``pow`` by 2, 3, 0.5, -0.5, -1 or -2), a literal is not an
    int/float, a call has only literals, the tree reads no input, or it is a single add/sub/mul
    of two inputs (that is :func:`binary`'s)."""
    from kuiper_xp.expression.functions import _POW_FORMS  # (the evaluator's powers: the same bits)

    steps: list = []
    slots: list[int] = []
    used: set[int] = set()
    free: list[int] = []
    n_tmp = [0]
    calls = [0]

    def emit(ufunc, args: list, keep: tuple = ()) -> tuple:
        """A step; the slots of the step results it reads are free again after it (but for
        those in ``keep``, read again later)."""
        for kind, v in dict.fromkeys(args):
            if kind == 2 and (kind, v) not in keep:
                free.append(slots[v])
        if free:
            slot = free.pop()
        else:
            slot, n_tmp[0] = n_tmp[0], n_tmp[0] + 1
        steps.append((ufunc, args))
        slots.append(slot)
        return (2, len(steps) - 1)

    def walk(node: Any) -> tuple | None:
        if node.kind == "input":
            used.add(int(node.value))
            return (0, int(node.value))
        if node.kind == "const":
            v = node.value
            return (1, v) if type(v) in (int, float) else None
        if node.kind != "call":
            return None
        calls[0] += 1
        if calls[0] > FUSE_MAX_CALLS or all(a.kind == "const" for a in node.args):
            return None
        name, args = node.value, node.args
        if name == "pow" and len(args) == 2 and args[1].kind == "const" and type(args[1].value) in (
                int, float) and args[1].value in _POW_FORMS:
            x = walk(args[0])  # the evaluator's (and torch's) forms of these powers
            if x is None:
                return None
            e = args[1].value
            if e in (2, 3, -2):
                sq = emit(np.multiply, [x, x], keep=(x,) if e == 3 else ())
                return (emit(np.multiply, [sq, x]) if e == 3 else sq if e == 2
                        else emit(np.divide, [(1, 1.0), sq]))
            if e == 0.5:
                return emit(np.sqrt, [x])
            if e == -0.5:
                return emit(np.divide, [(1, 1.0), emit(np.sqrt, [x])])
            return emit(np.divide, [(1, 1.0), x])
        if name in ("add", "sub") and len(args) == 3:  # add(a, b, alpha) = a + b * alpha
            a, b, alpha = (walk(n) for n in args)
            if a is None or b is None or alpha is None:
                return None
            return emit(_FUSE_BINARY[name], [a, emit(np.multiply, [b, alpha])])
        if name in _FUSE_BINARY and len(args) == 2:
            a = walk(args[0])
            b = walk(args[1]) if a is not None else None
            return None if b is None else emit(_FUSE_BINARY[name], [a, b])
        if len(args) != 1:
            return None
        x = walk(args[0])
        if x is None:
            return None
        if name in _FUSE_UNARY:
            return emit(_FUSE_UNARY[name], [x])
        if name == "reciprocal":  # the evaluator's 1.0 / x
            return emit(np.divide, [(1, 1.0), x])
        if name == "rsqrt":  # 1.0 / sqrt(x)
            return emit(np.divide, [(1, 1.0), emit(np.sqrt, [x])])
        return None

    if tree.kind != "call":
        return None
    if walk(tree) is None or not used:
        return None
    if (len(steps) == 1 and tree.value in ("add", "sub", "mul") and len(tree.args) == 2
            and all(a.kind == "input" for a in tree.args)):
        return None
    return FusedExpression(steps, slots, n_tmp[0], sorted(used))


def grid_sample_bilinear(x, grid, padding: str, align: bool) -> np.ndarray | None:
    """``F.grid_sample(x, grid, mode="bilinear")`` with ``zeros`` or ``border`` padding for
    float numpy arrays: the generic layer's arithmetic in the same order (the same values), in
    fewer, plain numpy calls: the in-bounds tests and clipped coordinates per axis, not per
    corner (the generic form's ~80 calls through the Array API wrapper were 40x torch's time on
    a (16, 32, 32) map sampled at 256 points). None where it does not apply."""
    if (type(x) is not np.ndarray or type(grid) is not np.ndarray or x.dtype not in _FLOATS
            or padding not in ("zeros", "border") or x.ndim != 4 or grid.ndim != 4 or grid.shape[-1] != 2
            or grid.shape[0] != x.shape[0]):
        return None
    n, c, h, w = x.shape
    ho, wo = grid.shape[1], grid.shape[2]
    g = grid if grid.dtype == x.dtype else grid.astype(x.dtype)

    def source(gc, size):
        u = (gc.reshape(n, ho * wo) + 1) / 2 * (size - 1) if align else ((gc.reshape(n, ho * wo) + 1) * size - 1) / 2
        if padding == "border":
            u = np.clip(u, 0, size - 1)
            u[np.isnan(u)] = 0  # (a NaN coordinate reads the first pixel, as torch's does)
        return u

    with _silent():
        ix, iy = source(g[..., 0], w), source(g[..., 1], h)
        x0, y0 = np.floor(ix), np.floor(iy)
        fx, fy = ix - x0, iy - y0
        ex, ey = 1 - fx, 1 - fy
        x1, y1 = x0 + 1, y0 + 1
        axes = []
        for v, size in ((x0, w), (x1, w), (y0, h), (y1, h)):
            ok = (v >= 0) & (v <= size - 1)  # (False for NaN)
            axes.append((ok, np.clip(v, 0, size - 1)))
        (okx0, cx0), (okx1, cx1), (oky0, cy0), (oky1, cy1) = axes
        flat = x.reshape(n, c, h * w)
        outside = 0  # reads outside the map: weight 0 on the first pixel, exact while that is finite
        if not np.isfinite(x[:, :, 0, 0]).all():  # (else on an appended zero, as the generic layer)
            flat = np.concatenate([flat, np.zeros((n, c, 1), x.dtype)], axis=2)
            outside = h * w
        taps = []
        for (oky, cy), (okx, cx), wt in (((oky0, cy0), (okx0, cx0), ey * ex), ((oky0, cy0), (okx1, cx1), ey * fx),
                                         ((oky1, cy1), (okx0, cx0), fy * ex), ((oky1, cy1), (okx1, cx1), fy * fx)):
            ok = oky & okx
            idx = np.where(ok, cy * w + cx, outside).astype(np.int64)
            taps.append((idx, ok.astype(x.dtype) * wt))  # (0 * NaN: NaN, as torch)
        y = gather_taps(flat, taps)
    return None if y is None else y.reshape(n, c, ho, wo)


def take_along(x, index, axis: int) -> np.ndarray | None:
    """``np.take_along_axis(x, index, axis)`` for an int64 ``index`` already checked to lie in
    range and no larger than ``x`` outside ``axis`` (torch.gather): one ``np.take`` of flat
    positions per block of the first axis, split over the threads (take_along_axis builds its
    broadcast index arrays on one thread: DeBERTa's (16, 128, 64) -> (16, 128, 128) relative
    gather took 0.81 ms, 0.40 this way on one thread; torch 0.09). None for other arguments."""
    if (type(x) is not np.ndarray or type(index) is not np.ndarray or index.dtype != np.int64
            or x.ndim != index.ndim or x.ndim == 0 or index.size == 0):
        return None  # (an empty index: the generic path's empty result)
    nd = index.ndim
    if (axis < nd - 1 and all(index.strides[a] == 0 for a in range(axis + 1, nd))
            and tuple(index.shape[:axis]) == tuple(x.shape[:axis])
            and tuple(index.shape[axis + 1:]) == tuple(x.shape[axis + 1:])):
        # the index repeats along every axis after ``axis`` (an expanded (B, k, 1) index: Reformer's
        # sort, a beam's reorder): whole rows of x taken at once (30 against 3 us on (2, 16, 8))
        pre, inner = math.prod(x.shape[:axis]), math.prod(x.shape[axis + 1:])
        rows = index[(slice(None),) * (axis + 1) + (0,) * (nd - axis - 1)].reshape(pre, -1)
        # (a view where the strides allow: PointNet++'s farthest-point loop gathers from one
        # permuted (B, N, 3) input 32 times, and a copy each time was 39 of its 57 us)
        x3 = x.reshape(pre, x.shape[axis], inner)
        return x3[np.arange(pre)[:, None], rows].reshape(index.shape)
    if index.size < TINY_ELEMENTS:
        return None  # (small: take_along_axis's one call costs less)
    out = _out(index.shape, x.dtype)
    x = np.ascontiguousarray(x)
    src = x.reshape(-1)
    strides = [st // x.itemsize for st in x.strides]

    def part(lo, hi):
        idx = index[lo:hi]
        lin = idx * strides[axis]
        for a in range(nd):
            if a != axis and (idx.shape[a] > 1 or (a == 0 and lo > 0)):
                # (a thread's single row along axis 0 still sits at row lo: batch 2 on 2 threads
                # read row 0 twice when size-1 axes were skipped)
                start = lo if a == 0 else 0
                ar = np.arange(start, start + idx.shape[a], dtype=np.int64) * strides[a]
                lin += ar.reshape((idx.shape[a],) + (1,) * (nd - a - 1))
        np.take(src, lin, out=out[lo:hi], mode="clip")  # (indices in range)
    _parallel(part, index.shape[0], index.size * 4)
    return out


#: gather_taps reads the whole batch at once (by flat positions) when an image has at most this
#: many channel-points: image by image it was 2-20x slower on (N, 1, L) lookups and 1.9x on
#: (64, 8, 100); at (4, 64, 4096) the per-image reads (one index for all channels) were 1.8x faster
GATHER_BATCHED_MAX = 8192
#: elements per block of images read at once by that path
GATHER_BATCHED_BLOCK = 1 << 16


def gather_taps(flat, taps) -> np.ndarray | None:
    """``sum_t flat[n, :, idx_t[n]] * w_t[n]`` for ``flat`` (N, C, P) and taps of (N, L) int64
    indices and (N, L) weights (grid_sample's 1, 4 or 16 reads): per image, one ``np.take``
    along the pixels and an in-place multiply-add per tap, the accumulator (C, L) reused
    (the generic take_along_axis builds a broadcast (N, C, L) index per tap: 9.7 against 1.3 ms
    for torch on a (64, 64, 64) bilinear sample). None for other array types."""
    if type(flat) is not np.ndarray or not all(type(i) is np.ndarray and type(w) is np.ndarray for i, w in taps):
        return None
    n, c, p = flat.shape
    length = taps[0][0].shape[1]
    y = _out((n, c, length), np.result_type(flat, taps[0][1]))
    if c * length <= GATHER_BATCHED_MAX and n > 1:
        # many small images (RAFT's correlation lookup: N*H*W "images" of one channel and 25-49
        # points): one read of a block of images per tap, by flat positions (2.55 ms for a
        # (256, 1, 8, 8) lookup of 5x5 points image by image, torch 0.015; 0.1 or so this way)
        src = np.ascontiguousarray(flat).reshape(-1)
        step = max(1, GATHER_BATCHED_BLOCK // (c * length))

        def block(k0, k1):
            for i0 in range(k0 * step, min(n, k1 * step), step):
                i1 = min(n, i0 + step)
                base = (np.arange(i0 * c, i1 * c, dtype=np.intp) * p).reshape(i1 - i0, c, 1)
                acc = y[i0:i1]
                for t, (idx, wt) in enumerate(taps):
                    v = np.take(src, base + idx[i0:i1, None, :], mode="clip")  # (indices in range)
                    v *= wt[i0:i1, None, :]
                    if t:
                        acc += v
                    else:
                        acc[...] = v
        _parallel(block, -(-n // step), n * c * length * len(taps))
        return y
    pieces = max(1, -(-_threads_now() // n))  # few images: their positions split over the threads
    span = -(-length // pieces)

    def part(u0, u1):
        tmp = _workspace((c, span), y.dtype, slot=31)
        for u in range(u0, u1):
            i, l0 = divmod(u, pieces)
            l0 *= span
            l1 = min(length, l0 + span)
            if l0 >= l1:
                continue
            acc = y[i, :, l0:l1]
            for t, (idx, wt) in enumerate(taps):
                dst = acc if t == 0 else tmp[:, : l1 - l0]
                np.take(flat[i], idx[i, l0:l1], axis=1, out=dst, mode="clip")  # (indices in range)
                dst *= wt[i, l0:l1]
                if t:
                    acc += dst
    _parallel(part, n * pieces, n * c * length * len(taps))
    return y


def index_put(x, items, values):
    """``x.index_put(items, values)`` without accumulation for numpy arrays: a copy of ``x``
    with numpy's advanced assignment (None items as whole axes, int indices wrapping when
    negative, bool masks; a repeated position takes the last value, as the generic path and
    torch's CPU kernel); ``values`` already of x's dtype. The generic path's flat positions,
    index and sort cost 0.15 ms on a (3, 4, 6) mask and 127 ms on (8, 256, 1024) (numpy 8.5).
    None where an item is not a 1-D-or-more int/bool array; IndexError for an index out of range
    (the caller words it)."""
    if type(x) is not np.ndarray or type(values) is not np.ndarray or x.ndim == 0:
        return None
    key, dims = [], 0
    for it in items:
        if it is None:
            key.append(slice(None))
            dims += 1
        elif type(it) is np.ndarray and it.ndim >= 1 and it.dtype.kind in "biu":
            key.append(it)
            dims += it.ndim if it.dtype.kind == "b" else 1
        else:
            return None
    if dims > x.ndim or not any(not isinstance(k, slice) for k in key):
        return None
    out = x.copy()
    out[tuple(key)] = values
    return out


def scatter(x, index, src, axis: int):
    """``torch.scatter`` (no reduce) of numpy arrays: a copy of ``x`` with ``src`` put along
    ``axis`` at ``index`` (int64, in range, not negative) over the region ``index`` spans in the
    other axes; ``src`` already cut to ``index``'s shape and of x's dtype. One
    ``np.put_along_axis`` (later writes along the axis win, as the generic path orders
    duplicates) instead of the generic (n, k) comparison: Informer's (4, 4, 96, 32) scatter of
    25 rows 4.5 -> 0.14 ms. None for other array types."""
    if not all(type(a) is np.ndarray for a in (x, index, src)):
        return None
    out = x.copy()
    region = tuple(slice(0, s) if a != axis else slice(None) for a, s in enumerate(index.shape))
    np.put_along_axis(out[region], index, src, axis=axis)
    return out


#: :func:`topk` leaves arrays of fewer elements to the caller's sort (one row of 1000, k=50:
#: 25 us sorted, 68 us through the partition; 4000: 205 against 91)
TOPK_MIN_ELEMENTS = 2048


def topk(x, k: int, axis: int, largest: bool):
    """``torch.topk`` of the numpy array ``x`` along ``axis`` as the layer's stable sort gives it
    (ties: lower index first), without sorting whole rows: a partition finds each row's k-th
    value, the rows keep what beats it plus the first equal ones to make k, and only those k
    are sorted (DGCNN's kNN, (4, 256, 256) k=8: 10 ms as a full stable argsort). Returns
    ``(values, int64 indices)``, or None where it does not pay or apply (short rows, k near the
    row length, NaN, other dtypes): the caller's sort then runs."""
    if type(x) is not np.ndarray or x.dtype.kind not in "fiu" or x.ndim == 0 or not 0 <= axis < x.ndim:
        return None
    n = x.shape[axis]
    if n < 32 or k <= 0 or 4 * k > n or x.size < TOPK_MIN_ELEMENTS:
        return None
    if x.dtype.kind == "f" and np.isnan(x).any():
        return None
    a = np.moveaxis(x, axis, -1)
    lead = a.shape[:-1]
    rows = a.reshape(-1, n)
    cut = n - k if largest else k - 1
    part = np.argpartition(rows, cut, axis=1)
    t = np.take_along_axis(rows, part[:, cut: cut + 1], 1)  # each row's k-th value
    better = rows > t if largest else rows < t
    n_better = np.count_nonzero(better, axis=1)[:, None]
    eq = rows == t
    if (n_better + np.count_nonzero(eq, axis=1)[:, None] == k).all():
        # no row has more values equal to its k-th than it takes: the partition's k are the set
        # (a kNN over distinct distances: (4, 512, 512) k=16 17.4 -> ~7 ms, torch 9.2)
        cols = np.sort(part[:, cut:] if largest else part[:, :k], axis=1)
    else:  # the first equal ones (lowest index) complete each row
        sel = better | (eq & (np.cumsum(eq, axis=1) <= k - n_better))
        cols = np.nonzero(sel)[1].reshape(-1, k)  # per row, increasing
    vals = np.take_along_axis(rows, cols, 1)
    key = (-vals if vals.dtype.kind == "f" else ~vals) if largest else vals  # (~: no overflow)
    order = np.argsort(key, axis=1, kind="stable")
    cols = np.take_along_axis(cols, order, 1).astype(np.int64, copy=False)
    vals = np.take_along_axis(vals, order, 1)
    return (np.moveaxis(vals.reshape(lead + (k,)), -1, axis),
            np.moveaxis(cols.reshape(lead + (k,)), -1, axis))


def kth_stable(x, k: int):
    """The element at position ``k`` of each last-axis row of the numpy array ``x`` after a
    stable sort, and its int64 index, without sorting: ``np.partition`` finds the value, the
    count of smaller elements says which of its equal copies the stable order puts at ``k``,
    and a running count of the copies finds that one (median over rows of 131k: 110 ms sorted,
    torch 12). ``(values, indices)`` with a last axis of 1; None for NaN (the caller's sort
    places them) or other arrays."""
    if type(x) is not np.ndarray or x.dtype.kind not in "fiu" or x.ndim == 0 or not 0 <= k < x.shape[-1]:
        return None
    if x.dtype.kind == "f" and np.isnan(x).any():
        return None
    v = np.partition(x, k, axis=-1)[..., k:k + 1]
    j = k - np.count_nonzero(x < v, axis=-1)[..., None]  # (its rank among the equal copies)
    idx = np.argmax(np.cumsum(x == v, axis=-1) > j, axis=-1)[..., None].astype(np.int64)
    return np.take_along_axis(x, idx, axis=-1), idx  # (the copy itself: -0.0 and 0.0 are equal)


#: :func:`sum_short_inner` takes a reduced axis followed by at most this many elements
SHORT_INNER_MAX = 16
#: ... or a reduced last axis of at most this many elements, in arrays of this many or more
SHORT_LAST_MAX = 8
SHORT_LAST_MIN_ELEMENTS = 4096


#: sums and means over the trailing axes of a C-contiguous float array run as one matrix-vector
#: product with a column of ones from this many summed elements per output (and
#: SUM_TRAILING_MIN_ELEMENTS in all)
SUM_TRAILING_MIN_SPAN = 9
SUM_TRAILING_MIN_ELEMENTS = 4096


def _sum_trailing(x: np.ndarray, axes, keepdims: bool, mean: bool):
    """The sum (mean) over trailing axes as ``x.reshape(M, K) @ ones(K)`` (divided by K), split
    over the threads as any GEMM: squeeze-and-excite's spatial means, RMSNorm's ``pow(2).mean(-1)``
    (2 threads of a Zen 3, against ``np.mean``: 8x144x56x56 over (2, 3) 1.18 -> 0.46 ms, torch
    0.25; 8x672x14x14 0.41 -> 0.13; 400x768 over the last 0.11 -> 0.06). Ones carry inf and NaN
    into the sum as torch's additions do. None where it does not apply."""
    nd = x.ndim
    a0 = nd - len(axes)
    if sorted(axes) != list(range(a0, nd)) or a0 < 1:
        return None
    k = math.prod(x.shape[a0:])
    if k < SUM_TRAILING_MIN_SPAN or x.size < SUM_TRAILING_MIN_ELEMENTS:
        return None
    y = _out(x.shape[:a0] + ((1,) * len(axes) if keepdims else ()), x.dtype)
    _row_sums(x.reshape(-1, k), y.reshape(-1, 1), mean)
    return y


def _row_sums(a: np.ndarray, out: np.ndarray, mean: bool) -> None:
    """``out`` (M, 1) = the sums (means) of the rows of the 2-D ``a``, as one product with a
    column of ones split over the threads (inf and NaN reach them as in torch's additions)."""
    _gemm(a, _ones_column(a.shape[1], a.dtype), out)
    if mean:
        out /= a.shape[1]


def sum_short_inner(x, axes, keepdims: bool, mean: bool = False):
    """``np.sum`` (or ``np.mean``) of a float numpy array over one axis followed by a few
    elements (a (4, 256, 16, 3) sum over the 16: numpy's reduction steps through 3-element
    inner loops, 214 us; einsum's product-free form 45, torch 22), over a short last axis, or
    over trailing axes of many elements (:func:`_sum_trailing`). None where it does not apply."""
    if (type(x) is not np.ndarray or x.dtype not in _FLOATS or axes is None
            or len(axes) == 0 or not x.flags.c_contiguous):
        return None
    y = _sum_trailing(x, axes, keepdims, mean)
    if y is not None or len(axes) != 1:
        return y
    a = axes[0]
    if a == x.ndim - 1 and 2 <= x.shape[a] <= SHORT_LAST_MAX and x.size >= SHORT_LAST_MIN_ELEMENTS:
        # a short last axis (xyz coordinates: (4, 512, 512, 3) 14.5 ms in numpy's reduction,
        # whose inner loop runs 3 elements at a time; 1.3 as strided slice additions)
        k = x.shape[a]
        y = np.add(x[..., 0], x[..., 1])
        for j in range(2, k):
            y += x[..., j]
        if mean:
            y /= k
        return y[..., None] if keepdims else y
    if not 0 <= a < x.ndim - 1:
        return None
    k = x.shape[a]
    inner = math.prod(x.shape[a + 1:])
    if k < 2 or inner > SHORT_INNER_MAX:
        return None
    y = np.einsum("pkt->pt", x.reshape(math.prod(x.shape[:a]), k, inner))
    if mean:
        y /= k
    shape = x.shape[:a] + ((1,) if keepdims else ()) + x.shape[a + 1:]
    return y.reshape(shape)


def cum_extreme(x, axis: int, is_max: bool):
    """``torch.cummax`` / ``cummin`` of a numeric numpy array along ``axis``: the running extreme
    by ``np.maximum/minimum.accumulate`` (NaN carries on, as torch's), and its index as the
    running maximum of the positions where the element equals the running value or is NaN (a tie
    takes the later index, a NaN the latest NaN: torch's rule). The generic scan took 5-9 ms
    over (4, 20000), torch 0.07. None for other arrays (bool: the generic path)."""
    if type(x) is not np.ndarray or x.dtype.kind not in "fiu" or x.ndim == 0 or not 0 <= axis < x.ndim:
        return None
    with _silent():
        v = (np.maximum if is_max else np.minimum).accumulate(x, axis=axis)
        shape = [1] * x.ndim
        shape[axis] = x.shape[axis]
        hit = x == v
        if x.dtype.kind == "f":
            hit |= np.isnan(x)
        at = np.where(hit, np.arange(x.shape[axis], dtype=np.int64).reshape(shape), 0)
        return v, np.maximum.accumulate(at, axis=axis)


def logcumsumexp(x, axis: int):
    """``torch.logcumsumexp`` of a float numpy array: ``np.logaddexp.accumulate`` in float64
    (within an ulp of the exact result; the generic log-depth scan took 13 ms over (4, 20000),
    torch 2.2). None for other arrays."""
    if type(x) is not np.ndarray or x.dtype not in _FLOATS or x.ndim == 0 or not 0 <= axis < x.ndim:
        return None
    with _silent():
        return np.logaddexp.accumulate(x.astype(np.float64), axis=axis).astype(x.dtype)


#: :func:`max_short_last` takes last axes of at most this many elements
SHORT_AXIS_MAX = 16


def max_short_last(x, is_max: bool, keepdims: bool = False):
    """``np.max`` / ``np.min`` of the numpy array ``x`` over its last axis when that axis is short
    and there are many rows: a chain of elementwise maximum/minimum over the axis's strided
    columns (numpy reduces a short inner axis row by row: DGCNN's max over 8 neighbours of
    (4, 32, 256, 8) took 1.7 ms, the chain 0.2). Maximum and minimum are exact and propagate NaN
    as the reduction does, so the result is the same. None where it does not apply."""
    if type(x) is not np.ndarray or x.ndim == 0 or x.dtype.kind not in "fiub":
        return None
    n = x.shape[-1]
    if not 2 <= n <= SHORT_AXIS_MAX or x.size < 1024 * n:
        return None
    f = np.maximum if is_max else np.minimum
    out = f(x[..., 0], x[..., 1])
    for j in range(2, n):
        f(out, x[..., j], out=out)
    return out[..., None] if keepdims else out


def embedding(weight, idx):
    """``weight[idx]`` (an embedding lookup) for a 2-D numpy table and integer numpy ids in
    range, as one ``np.take``; None otherwise (the layer's generic path then names a bad id).
    The Array-API path's dtype tests, wrappers and range check cost ~20 us a call against torch's
    6 (a recommender's eight lookups)."""
    if (type(weight) is not np.ndarray or type(idx) is not np.ndarray or idx.dtype.kind not in "iu"
            or weight.ndim != 2 or idx.size == 0):
        return None
    flat = idx.reshape(-1)
    if flat.min() < 0 or flat.max() >= weight.shape[0]:
        return None
    return np.take(weight, flat, axis=0).reshape(idx.shape + weight.shape[1:])
