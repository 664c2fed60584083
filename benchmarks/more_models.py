"""More architectures for ``benchmarks/run.py``, beyond the zoo (plain torch, random weights; the
runner seeds torch before building them): each factory returns an ``nn.Module``.

    python benchmarks/run.py --models benchmarks/more_models.py:convnext_t --input-shape 3,224,224
    python benchmarks/run.py --models benchmarks/more_models.py:bert_tokens \
        --input-shape "128:int64:30522;128:int64:2"

Image models (``--input-shape 3,224,224``): ``convnext_t`` (depthwise 7x7, channels-last
LayerNorm, GELU MLPs), ``densenet121`` (pre-activation BN-ReLU-conv, concatenations),
``resnext50`` (grouped 3x3), ``resnet50``, ``inception_c`` (1x7 / 7x1 convolutions at 112x112),
``vgg16``, ``deeplab_aspp`` (dilated convolutions, rates 6/12/18), ``deeplabv3_r50``
(torchvision's DeepLabV3-ResNet50 layout: a ResNet-50 at output stride 8, dilations 2 and 4,
ASPP 12/24/36), ``swin_lite`` (shifted window attention written as operators, patch merging), ``regnet_y`` (grouped 3x3 of group width 8,
squeeze-and-excite), ``mixer`` (MLP-Mixer: Linear over transposed tokens), ``detr_lite``
(nn.TransformerEncoderLayer and nn.TransformerDecoderLayer over learned queries, two outputs).
Sequence models: ``bert_base`` (12 layers on embeddings, ``--input-shape 128,768``; a padding mask
built in forward), ``bert_tokens`` (token ids and an attention mask, ``--input-shape
"128:int64:30522;128:int64:2"``) and ``gpt`` (a causal decoder on embeddings, ``--input-shape
128,384``: the mask from torch.tril and masked_fill). Recurrent: ``lstm_lm`` (an LSTM language
model on token ids, ``--input-shape "35:int64:10000"``) and ``crnn`` (a CRNN text recogniser:
conv stack, bidirectional LSTM, ``--input-shape 1,32,128``). Video: ``c3d_lite`` (Conv3d stages,
``--input-shape 3,8,112,112``). Also ``shufflenet_v2`` and ``poolformer_s12`` (``--input-shape
3,224,224``: channel shuffle by view/transpose; GroupNorm(1, C) with an average-pool token mixer),
``conformer`` (speech encoder blocks on frames, ``--input-shape 200,256``) and ``wavenet``
(dilated causal Conv1d with gated activations, ``--input-shape 1,4000``). Audio: ``logmel_cnn``
(a keyword spotter on raw 16 kHz samples: torch.stft, |.|^2, mel filterbank, log, CNN;
``--input-shape 16000``). Graph: ``gcn`` (graph convolutions over a fixed random graph stored as
buffers: a gather of edge messages and an index_add per layer, ``--input-shape 2000,64``). Probed on 2026-11-26: ``llama`` (RMSNorm, RoPE, grouped KV heads,
SwiGLU, causal SDPA; ``--input-shape 64:int64:1000``), ``whisper_enc`` (``--input-shape 80,1000``),
``clip_text`` (causal mask as a buffer; ``--input-shape 32:int64:5000``), ``seq2seq``
(nn.Transformer; ``--input-shape "40,128;20,128"``), ``mini_unet`` (diffusion U-Net with a timestep
input; ``--input-shape "3,32,32;:int64:1000"``), ``convnext_v2`` (GRN; ``--input-shape 3,224,224``),
``lin_attn`` (``--input-shape 256,128``), ``centernet`` (top-k decoding; ``--input-shape
3,128,128``) and ``stn`` (``--input-shape 1,28,28``). Added later that day: ``gpt2_hf`` (Hugging
Face's Conv1D/addmm GPT-2 with ``torch.pow(x, 3.0)`` in its GELU; ``--input-shape
128:int64:5000``), ``albert`` (one layer applied six times; ``--input-shape 64:int64:3000``) and
``convmixer`` (depthwise 9x9 over a 9x9 map; ``--input-shape 3,64,64``). Session 22:
``resnet20_cifar`` (``--input-shape 3,32,32``: 3x3 convolutions of 16-64 channels). Session 24
(a survey of models never benchmarked before; docs/benchmarks/cpu-2core-avx512.md):
``mobilenet_v3_small`` and ``efficientnet_b0`` (``--input-shape 3,224,224``), ``espcn``
(``--input-shape 1,128,128``), ``unet_small`` (``--input-shape 3,128,128``) and ``tcn``
(``--input-shape 16,1000``). Session 27 (another survey of architectures never run
before): ``mobilevit``, ``squeezenet``, ``ghostnet``, ``pspnet``, ``repvgg``, ``levit``, ``t5_enc``,
``hrnet_lite``, ``ssdlite``, ``res2net`` and ``gru_speech``; then ``perceiver``, ``detr_sine``, ``nerf``,
``bifpn``, ``outlooker``, ``flow_warp``, ``gated_conv_lm``, ``pointnet_topk``, ``cosine_vit`` and
``bicubic_sr`` (input shapes in their docstrings). Session 28: ``gmlp`` (spatial gating over tokens),
``fnet`` (Fourier mixing: the real part of torch.fft.fft2), ``rrdb`` (ESRGAN's residual dense
blocks), ``capsnet`` (dynamic routing, unrolled), ``convlstm`` (a ConvLSTM over 6 frames),
``fcos_head`` (GroupNorm towers, learned per-level scales, exp) and ``xception_lite``
(separable convolutions, odd input size). Session 29: ``replk`` (RepLKNet-style 31x31 and 29x29
depthwise kernels beside 5x5 ones), ``maxvit_lite`` (MBConv, block and grid attention by
reshapes and permutes), ``edgenext_lite`` (split depthwise convolutions, cross-covariance attention
over channels with a learned temperature), ``moe_top2`` (a mixture of experts: top-2 gates
scattered into a dense gate matrix, experts by einsum), ``dgcnn`` (k-nearest neighbours by
top-k of pairwise distances, a gather by flattened index, EdgeConv's max), ``pixelcnn`` (masked
convolutions: weight * mask in forward; gated tanh * sigmoid), ``sparsemax_attn`` (sparsemax:
sort, cumsum, a comparison with arange, gather), ``mamba_lite`` (Mamba-2's SSD in its masked
quadratic form: cumsum, segment sums, exp, a four-operand einsum), ``adain_net`` (AdaIN style
transfer: two inputs, instance mean and var) and ``cbam_net`` (CBAM: average and max pooled
channel attention, mean and max over channels for spatial attention); then ``vae_decoder`` (a
Stable-Diffusion-style VAE decoder: GroupNorm(32) + SiLU residual blocks, spatial attention by
baddbmm/bmm, nearest up-sampling; latents ``4,16,16``), ``swinv2_lite`` (Swin-V2 windows:
continuous position bias from a log-spaced table through an MLP, cosine attention with a
clamped logit scale), ``yolox_head`` (a decoupled head decoding boxes against an arange/meshgrid
grid in forward), ``odd_unet`` (a U-Net on a 97x131 input, each decoder stage interpolated to its
skip's size), ``seq_first`` (nn.TransformerEncoder with batch_first=False, norm_first, GELU) and
``misc_ops`` (flip, cumprod, clamp_min, remainder, floor_divide, round, logsumexp, amax, where;
onnxruntime's export stops at cumprod)."""
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

_TESTS = Path(__file__).resolve().parent.parent / "tests"
if str(_TESTS) not in sys.path:  # (the zoo's helpers, as benchmarks/models.py finds them)
    sys.path.insert(0, str(_TESTS))
from zoo import calibrate_norms, kaiming_convs  # noqa: E402

# calibrate_norms: BatchNorm statistics measured on a seeded batch; kaiming_convs: He-initialised
# convolutions. With torch's default initialisation and unit statistics a deep net shrinks its
# signal layer by layer until the output is its last bias (EfficientNet-B0's logits did not move
# when the input was shifted by a pixel) and the runner's comparison with torch proves nothing
# (run.py says so in its report when it sees it).


# ---- ConvNeXt-T-ish (depthwise 7x7, channels-last LayerNorm via permute, Linear MLP, layer scale)
class CNBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.pw1 = nn.Linear(c, 4 * c)
        self.pw2 = nn.Linear(4 * c, c)
        self.gamma = nn.Parameter(torch.full((c,), 0.5))

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.pw2(F.gelu(self.pw1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class LN2d(nn.LayerNorm):
    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def convnext_t():
    dims, depths = (96, 192, 384, 768), (3, 3, 9, 3)
    layers = [nn.Conv2d(3, dims[0], 4, 4), LN2d(dims[0], eps=1e-6)]
    for i, (d, n) in enumerate(zip(dims, depths)):
        if i:
            layers += [LN2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], d, 2, 2)]
        layers += [CNBlock(d) for _ in range(n)]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LayerNorm(768), nn.Linear(768, 1000))


# ---- DenseNet-121 (pre-activation BN-ReLU-conv, concat growth)
class DenseLayer(nn.Module):
    def __init__(self, c, growth=32):
        super().__init__()
        self.b1, self.c1 = nn.BatchNorm2d(c), nn.Conv2d(c, 4 * growth, 1, bias=False)
        self.b2, self.c2 = nn.BatchNorm2d(4 * growth), nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)

    def forward(self, x):
        return torch.cat([x, self.c2(F.relu(self.b2(self.c1(F.relu(self.b1(x))))))], 1)


def densenet121():
    c, layers = 64, [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    for i, n in enumerate((6, 12, 24, 16)):
        for _ in range(n):
            layers.append(DenseLayer(c))
            c += 32
        if i < 3:
            layers += [nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2, 2)]
            c //= 2
    m = nn.Sequential(*layers, nn.BatchNorm2d(c), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 1000))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.normal_(0, 0.1, generator=g)
                mod.running_var.uniform_(0.5, 1.5, generator=g)
    return m


# ---- ResNeXt-50 32x4d (grouped 3x3)
class XBlock(nn.Module):
    def __init__(self, cin, width, cout, stride):
        super().__init__()
        self.f = nn.Sequential(nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                               nn.Conv2d(width, width, 3, stride, 1, groups=32, bias=False), nn.BatchNorm2d(width),
                               nn.ReLU(), nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.s = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                  if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        return F.relu(self.f(x) + self.s(x))


def resnext50():
    layers, cin = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)], 64
    for i, (n, w) in enumerate(zip((3, 4, 6, 3), (128, 256, 512, 1024))):
        for j in range(n):
            layers.append(XBlock(cin, w, 2 * w, 2 if (j == 0 and i > 0) else 1))
            cin = 2 * w
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000))


# ---- Inception-style block with asymmetric 1x7 / 7x1 convolutions
class InceptionC(nn.Module):
    def __init__(self, c, c7):
        super().__init__()
        def cbr(i, o, k, p):
            return nn.Sequential(nn.Conv2d(i, o, k, padding=p, bias=False), nn.BatchNorm2d(o), nn.ReLU())
        self.b1 = cbr(c, 192, 1, 0)
        self.b7 = nn.Sequential(cbr(c, c7, 1, 0), cbr(c7, c7, (1, 7), (0, 3)), cbr(c7, 192, (7, 1), (3, 0)))
        self.bd = nn.Sequential(cbr(c, c7, 1, 0), cbr(c7, c7, (7, 1), (3, 0)), cbr(c7, c7, (1, 7), (0, 3)),
                                cbr(c7, c7, (7, 1), (3, 0)), cbr(c7, 192, (1, 7), (0, 3)))
        self.bp = cbr(c, 192, 1, 0)

    def forward(self, x):
        return torch.cat([self.b1(x), self.b7(x), self.bd(x), self.bp(F.avg_pool2d(x, 3, 1, 1))], 1)


def inception_c():
    return nn.Sequential(nn.Conv2d(3, 768, 3, 2, 1), nn.ReLU(), InceptionC(768, 128), InceptionC(768, 160),
                         InceptionC(768, 192), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(768, 10))


# ---- BERT-base-like encoder on embeddings (explicit attention with a padding mask)
class BertLayer(nn.Module):
    def __init__(self, d=768, h=12):
        super().__init__()
        self.h, self.dh = h, d // h
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def heads(self, t):
        n, length, _ = t.shape
        return t.view(n, length, self.h, self.dh).transpose(1, 2)

    def forward(self, x, mask):
        q, k, v = self.heads(self.q(x)), self.heads(self.k(x)), self.heads(self.v(x))
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.dh) + mask
        ctx = torch.matmul(s.softmax(-1), v).transpose(1, 2).reshape(x.shape)
        x = self.ln1(x + self.o(ctx))
        return self.ln2(x + self.fc2(F.gelu(self.fc1(x))))


class Bert(nn.Module):
    def __init__(self, layers=12):
        super().__init__()
        self.layers = nn.ModuleList(BertLayer() for _ in range(layers))

    def forward(self, x):
        # the mask from the input: the last 16 of 128 positions are padding
        keep = torch.ones(x.shape[0], 1, 1, x.shape[1])
        keep[..., -16:] = 0
        mask = (1.0 - keep) * -10000.0
        for layer in self.layers:
            x = layer(x, mask)
        return x


def bert_base():
    return Bert()


# ---- VGG-16 features + small head
def vgg16():
    cfg, layers, c = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"), [], 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(c, v, 3, padding=1), nn.ReLU()]
            c = v
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000))


# ---- DeepLab-style ASPP on a dilated trunk
class ASPP(nn.Module):
    def __init__(self, c, o=256):
        super().__init__()
        self.b = nn.ModuleList([nn.Conv2d(c, o, 1)] + [nn.Conv2d(c, o, 3, padding=r, dilation=r) for r in (6, 12, 18)])
        self.pool = nn.Conv2d(c, o, 1)
        self.proj = nn.Conv2d(5 * o, o, 1)

    def forward(self, x):
        p = F.interpolate(self.pool(F.adaptive_avg_pool2d(x, 1)), size=x.shape[-2:], mode="bilinear", align_corners=False)
        return self.proj(torch.cat([F.relu(b(x)) for b in self.b] + [p], 1))


def deeplab_aspp():
    trunk = nn.Sequential(nn.Conv2d(3, 64, 3, 2, 1), nn.ReLU(), nn.Conv2d(64, 128, 3, 2, 1), nn.ReLU(),
                          nn.Conv2d(128, 256, 3, 2, 1), nn.ReLU(), nn.Conv2d(256, 512, 3, 1, 2, dilation=2), nn.ReLU())
    return nn.Sequential(trunk, ASPP(512), nn.Conv2d(256, 21, 1), nn.Upsample(scale_factor=8, mode="bilinear"))


class BertTokens(nn.Module):
    """BERT-base-like on token ids and an attention mask (int64 inputs)."""

    def __init__(self, vocab=30522, layers=12):
        super().__init__()
        self.emb = nn.Embedding(vocab, 768)
        self.pos = nn.Parameter(torch.randn(1, 128, 768) * 0.02)
        self.ln = nn.LayerNorm(768)
        self.layers = nn.ModuleList(BertLayer() for _ in range(layers))

    def forward(self, ids, attn):
        x = self.ln(self.emb(ids) + self.pos)
        mask = (1.0 - attn[:, None, None, :].float()) * -10000.0
        for layer in self.layers:
            x = layer(x, mask)
        return x


def bert_tokens():
    return BertTokens()


class Bottleneck(nn.Module):
    def __init__(self, cin, width, stride, dilation=1):
        super().__init__()
        cout = 4 * width
        self.f = nn.Sequential(nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                               nn.Conv2d(width, width, 3, stride, dilation, dilation, bias=False),
                               nn.BatchNorm2d(width), nn.ReLU(),
                               nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.s = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                  if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
        return F.relu(self.f(x) + self.s(x))


def resnet50():
    layers, cin = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)], 64
    for i, (n, w) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
        for j in range(n):
            layers.append(Bottleneck(cin, w, 2 if (j == 0 and i > 0) else 1))
            cin = 4 * w
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000))


# ---- DeepLabV3-ResNet50 (torchvision's layout): output stride 8, layer3 dilated 2, layer4 4
def _cbr(cin, cout, k=1, dilation=1):
    return [nn.Conv2d(cin, cout, k, padding=dilation * (k // 2), dilation=dilation, bias=False),
            nn.BatchNorm2d(cout), nn.ReLU()]


class DeepLabV3(nn.Module):
    def __init__(self, classes=21, rates=(12, 24, 36)):
        super().__init__()
        layers, cin, dil = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                            nn.MaxPool2d(3, 2, 1)], 64, 1
        for i, (n, w) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512))):
            for j in range(n):
                # torchvision's replace_stride_with_dilation=[False, True, True]: a layer's first
                # block keeps the previous dilation, the rest double it
                stride = 2 if (j == 0 and i == 1) else 1
                d = dil if j == 0 else (1, 1, 2, 4)[i]
                layers.append(Bottleneck(cin, w, stride, d))
                cin = 4 * w
            dil = (1, 1, 2, 4)[i]
        self.backbone = nn.Sequential(*layers)
        self.branches = nn.ModuleList([nn.Sequential(*_cbr(2048, 256))] +
                                      [nn.Sequential(*_cbr(2048, 256, 3, r)) for r in rates])
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), *_cbr(2048, 256))
        self.project = nn.Sequential(*_cbr(5 * 256, 256), nn.Dropout(0.5))
        self.head = nn.Sequential(*_cbr(256, 256, 3), nn.Conv2d(256, classes, 1))

    def forward(self, x):
        f = self.backbone(x)
        p = F.interpolate(self.pool(f), size=f.shape[-2:], mode="bilinear", align_corners=False)
        y = self.head(self.project(torch.cat([b(f) for b in self.branches] + [p], 1)))
        return F.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False)


def deeplabv3_r50():
    return DeepLabV3()


# ---- Swin-T-lite: window attention with shifted windows (roll), patch merging
class WindowAttention(nn.Module):
    def __init__(self, dim, heads, ws, shift):
        super().__init__()
        self.h, self.ws, self.shift = heads, ws, shift
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):  # x: (N, H, W, C)
        n, hh, ww, c = x.shape
        y = self.norm1(x)
        if self.shift:
            y = torch.roll(y, (-self.shift, -self.shift), (1, 2))
        ws = self.ws
        y = y.view(n, hh // ws, ws, ww // ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, c)
        qkv = self.qkv(y).reshape(y.shape[0], ws * ws, 3, self.h, c // self.h).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        a = (q * (c // self.h) ** -0.5) @ k.transpose(-2, -1)
        y = (a.softmax(-1) @ v).transpose(1, 2).reshape(-1, ws * ws, c)
        y = self.proj(y).view(n, hh // ws, ww // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(n, hh, ww, c)
        if self.shift:
            y = torch.roll(y, (self.shift, self.shift), (1, 2))
        x = x + y
        return x + self.mlp(self.norm2(x))


class Merge(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm, self.red = nn.LayerNorm(4 * c), nn.Linear(4 * c, 2 * c, bias=False)

    def forward(self, x):
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        return self.red(self.norm(x))


class SwinLite(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Conv2d(3, 96, 4, 4)
        blocks, c = [], 96
        for i, (d, h) in enumerate(zip((2, 2, 6, 2), (3, 6, 12, 24))):
            if i:
                blocks.append(Merge(c))
                c *= 2
            blocks += [WindowAttention(c, h, 7, 0 if j % 2 == 0 else 3) for j in range(d)]
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(c, 1000)

    def forward(self, x):
        x = self.embed(x).permute(0, 2, 3, 1)
        return self.head(self.blocks(x).mean((1, 2)))


def swin_lite():
    return SwinLite()


# ---- RegNetY-style (grouped 3x3 of group width 8, squeeze-and-excite) ---------------------------
class SE(nn.Module):
    def __init__(self, c, r=4):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, c // r, 1), nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        return x * torch.sigmoid(self.fc2(F.relu(self.fc1(F.adaptive_avg_pool2d(x, 1)))))


class YBlock(nn.Module):
    def __init__(self, cin, cout, stride, group_width=8):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(cout, cout, 3, stride, 1, groups=cout // group_width, bias=False),
                               nn.BatchNorm2d(cout), nn.ReLU())
        self.se = SE(cout)
        self.c = nn.Sequential(nn.Conv2d(cout, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.proj = None if (cin == cout and stride == 1) else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.c(self.se(self.b(self.a(x))))
        return F.relu(y + (x if self.proj is None else self.proj(x)))


def regnet_y():
    layers, cin = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU()], 32
    for cout, depth in ((48, 1), (104, 3), (208, 6), (440, 2)):
        for i in range(depth):
            layers.append(YBlock(cin, cout, 2 if i == 0 else 1))
            cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000))


# ---- MLP-Mixer-style (token mixing: a Linear over the transposed tokens) ------------------------
class MixerBlock(nn.Module):
    def __init__(self, tokens, dim):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.tok = nn.Sequential(nn.Linear(tokens, tokens * 2), nn.GELU(), nn.Linear(tokens * 2, tokens))
        self.ch = nn.Sequential(nn.Linear(dim, dim * 4), nn.GELU(), nn.Linear(dim * 4, dim))

    def forward(self, x):
        x = x + self.tok(self.n1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.ch(self.n2(x))


class Mixer(nn.Module):
    def __init__(self, dim=256, depth=8):
        super().__init__()
        self.stem = nn.Conv2d(3, dim, 16, 16)
        self.blocks = nn.Sequential(*[MixerBlock(196, dim) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, 1000)

    def forward(self, x):
        x = self.norm(self.blocks(self.stem(x).flatten(2).transpose(1, 2)))
        return self.head(x.mean(1))


def mixer():
    return Mixer()


# ---- GPT-style decoder (causal mask from torch.tril + masked_fill(-inf), tanh GELU) -------------
class GPTBlock(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.h = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (a.view(b, t, self.h, d // self.h).transpose(1, 2) for a in self.qkv(self.ln1(x)).split(d, 2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.h))
        att = att.masked_fill(torch.tril(torch.ones(t, t)).view(1, 1, t, t) == 0, float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, d=384, heads=6, depth=6):
        super().__init__()
        self.blocks = nn.Sequential(*[GPTBlock(d, heads) for _ in range(depth)])
        self.ln = nn.LayerNorm(d)

    def forward(self, x):
        return self.ln(self.blocks(x))


def gpt():
    """On embeddings: ``--input-shape 128,384``."""
    return GPT()


# ---- DETR-style head (nn.TransformerEncoderLayer + nn.TransformerDecoderLayer, learned queries) --
class DetrLite(nn.Module):
    def __init__(self, d=256, queries=100):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, d, 16, 16), nn.ReLU())
        self.enc = nn.TransformerEncoderLayer(d, 8, 1024, dropout=0.0, batch_first=True)
        self.dec = nn.TransformerDecoderLayer(d, 8, 1024, dropout=0.0, batch_first=True)
        self.query = nn.Parameter(torch.randn(1, queries, d))
        self.cls, self.box = nn.Linear(d, 92), nn.Linear(d, 4)

    def forward(self, x):
        memory = self.enc(self.backbone(x).flatten(2).transpose(1, 2))
        q = self.dec(self.query.expand(x.shape[0], -1, -1), memory)
        return self.cls(q), self.box(q).sigmoid()


def detr_lite():
    return DetrLite()


# ---- recurrent: an LSTM language model and a CRNN-style text recogniser -------------------------
class LSTMLM(nn.Module):
    def __init__(self, vocab=10000, d=256, h=512):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.lstm = nn.LSTM(d, h, 2, batch_first=True)
        self.out = nn.Linear(h, vocab)

    def forward(self, ids):
        y, _ = self.lstm(self.emb(ids))
        return self.out(y)


def lstm_lm():
    """Token ids: ``--input-shape "35:int64:10000"`` (a 2-layer LSTM of 512 over 35 steps)."""
    return LSTMLM()


class CRNN(nn.Module):
    def __init__(self, classes=37):
        super().__init__()
        def cbr(i, o):
            return [nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU()]
        self.cnn = nn.Sequential(*cbr(1, 64), nn.MaxPool2d(2), *cbr(64, 128), nn.MaxPool2d(2),
                                 *cbr(128, 256), *cbr(256, 256), nn.MaxPool2d((2, 1)),
                                 *cbr(256, 256), nn.MaxPool2d((4, 1)))
        self.rnn = nn.LSTM(256, 128, 2, bidirectional=True)
        self.fc = nn.Linear(256, classes)

    def forward(self, x):  # (N, 1, 32, W)
        f = self.cnn(x).squeeze(2).permute(2, 0, 1)  # (W/4, N, 256)
        y, _ = self.rnn(f)
        return self.fc(y).log_softmax(-1)


def crnn():
    """Text-line images: ``--input-shape 1,32,128`` (conv stack, 2-layer bidirectional LSTM over
    32 columns, log-softmax per column as for CTC)."""
    return CRNN()


# ---- C3D-style video classifier (Conv3d-BN-ReLU-MaxPool3d stages) ---------------------------------
def c3d_lite():
    """Clips: ``--input-shape 3,8,112,112`` (8 frames of 112x112)."""
    def block(i, o, pool):
        return [nn.Conv3d(i, o, 3, padding=1), nn.BatchNorm3d(o), nn.ReLU(), nn.MaxPool3d(pool)]
    return nn.Sequential(*block(3, 32, (1, 2, 2)), *block(32, 64, 2), *block(64, 128, 2),
                         nn.Conv3d(128, 128, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten(),
                         nn.Linear(128, 10))


# ---- ShuffleNetV2 1.0x (chunk, concat, channel shuffle by view/transpose/view) --------------------
def _shuffle(x, groups):
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


class ShuffleUnit(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        half = cout // 2
        self.stride = stride
        if stride > 1:
            self.left = nn.Sequential(nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin),
                                      *_cbr(cin, half))
        src = cin if stride > 1 else half
        self.right = nn.Sequential(*_cbr(src, half),
                                   nn.Conv2d(half, half, 3, stride, 1, groups=half, bias=False), nn.BatchNorm2d(half),
                                   *_cbr(half, half))

    def forward(self, x):
        if self.stride == 1:
            a, b = x.chunk(2, dim=1)
            y = torch.cat((a, self.right(b)), 1)
        else:
            y = torch.cat((self.left(x), self.right(x)), 1)
        return _shuffle(y, 2)


def shufflenet_v2():
    """``--input-shape 3,224,224`` (stages of 116/232/464 channels, 4/8/4 units)."""
    layers, cin = [nn.Conv2d(3, 24, 3, 2, 1, bias=False), nn.BatchNorm2d(24), nn.ReLU(), nn.MaxPool2d(3, 2, 1)], 24
    for cout, n in ((116, 4), (232, 8), (464, 4)):
        layers += [ShuffleUnit(cin, cout, 2)] + [ShuffleUnit(cout, cout, 1) for _ in range(n - 1)]
        cin = cout
    layers += [*_cbr(464, 1024), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1024, 1000)]
    return nn.Sequential(*layers)


# ---- PoolFormer-S12 (GroupNorm(1, C), average-pool token mixer, conv MLP with GELU) -----------
class PoolFormerBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm1, self.norm2 = nn.GroupNorm(1, c), nn.GroupNorm(1, c)
        self.pool = nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.mlp = nn.Sequential(nn.Conv2d(c, 4 * c, 1), nn.GELU(), nn.Conv2d(4 * c, c, 1))
        self.scale1 = nn.Parameter(torch.full((c, 1, 1), 0.1))
        self.scale2 = nn.Parameter(torch.full((c, 1, 1), 0.1))

    def forward(self, x):
        y = self.norm1(x)
        x = x + self.scale1 * (self.pool(y) - y)
        return x + self.scale2 * self.mlp(self.norm2(x))


def poolformer_s12():
    """``--input-shape 3,224,224`` (depths 2/2/6/2, widths 64/128/320/512)."""
    dims = (64, 128, 320, 512)
    layers = [nn.Conv2d(3, 64, 7, 4, 2)]
    for i, n in enumerate((2, 2, 6, 2)):
        if i:
            layers.append(nn.Conv2d(dims[i - 1], dims[i], 3, 2, 1))
        layers += [PoolFormerBlock(dims[i]) for _ in range(n)]
    return nn.Sequential(*layers, nn.GroupNorm(1, 512), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000))


# ---- Conformer encoder (half-step FFNs, self-attention, GLU + depthwise Conv1d module) ---------
class ConformerBlock(nn.Module):
    def __init__(self, d, heads=4, kernel=31):
        super().__init__()
        def ffn():
            return nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))
        self.ff1, self.ff2 = ffn(), ffn()
        self.norm_att, self.norm_conv, self.norm_out = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.att = nn.MultiheadAttention(d, heads, batch_first=True)
        self.pw1 = nn.Conv1d(d, 2 * d, 1)
        self.dw = nn.Conv1d(d, d, kernel, padding=kernel // 2, groups=d)
        self.bn = nn.BatchNorm1d(d)
        self.pw2 = nn.Conv1d(d, d, 1)

    def forward(self, x):  # (N, T, d)
        x = x + 0.5 * self.ff1(x)
        y = self.norm_att(x)
        x = x + self.att(y, y, y, need_weights=False)[0]
        y = F.glu(self.pw1(self.norm_conv(x).transpose(1, 2)), dim=1)
        x = x + self.pw2(F.silu(self.bn(self.dw(y)))).transpose(1, 2)
        return self.norm_out(x + 0.5 * self.ff2(x))


def conformer():
    """Feature frames: ``--input-shape 200,256`` (4 blocks of width 256, 4 heads, kernel 31)."""
    return nn.Sequential(*[ConformerBlock(256) for _ in range(4)])


# ---- WaveNet-style stack (dilated causal Conv1d, gated tanh * sigmoid, skip sums) --------------
class WaveBlock(nn.Module):
    def __init__(self, c, dilation):
        super().__init__()
        self.pad = dilation
        self.conv = nn.Conv1d(c, 2 * c, 2, dilation=dilation)
        self.res, self.skip = nn.Conv1d(c, c, 1), nn.Conv1d(c, c, 1)

    def forward(self, x):
        a, b = self.conv(F.pad(x, (self.pad, 0))).chunk(2, 1)
        z = torch.tanh(a) * torch.sigmoid(b)
        return x + self.res(z), self.skip(z)


class WaveNet(nn.Module):
    def __init__(self, c=64, blocks=20):
        super().__init__()
        self.inp = nn.Conv1d(1, c, 1)
        self.blocks = nn.ModuleList([WaveBlock(c, 2 ** (i % 10)) for i in range(blocks)])
        self.out = nn.Sequential(nn.ReLU(), nn.Conv1d(c, c, 1), nn.ReLU(), nn.Conv1d(c, 256, 1))

    def forward(self, x):  # (N, 1, T)
        x = self.inp(x)
        skips = 0
        for block in self.blocks:
            x, s = block(x)
            skips = skips + s
        return self.out(skips)


def wavenet():
    """Audio samples: ``--input-shape 1,4000`` (20 gated blocks, dilations 1..512 twice)."""
    return WaveNet()


# ---- Audio classifier: log-mel spectrogram (torch.stft) front end + CNN ----------------------------
def _mel_filterbank(n_freq, n_mels, sample_rate):
    """Triangular filters on the mel scale (HTK formula), (n_freq, n_mels)."""
    def mel(f):
        return 2595.0 * math.log10(1.0 + f / 700.0)
    pts = torch.linspace(mel(0.0), mel(sample_rate / 2), n_mels + 2)
    hz = 700.0 * (10 ** (pts / 2595.0) - 1.0)
    freqs = torch.linspace(0, sample_rate / 2, n_freq)
    lo, mid, hi = hz[:-2, None], hz[1:-1, None], hz[2:, None]
    up = (freqs[None] - lo) / (mid - lo)
    down = (hi - freqs[None]) / (hi - mid)
    return torch.clamp(torch.minimum(up, down), min=0.0).T.contiguous()


class LogMelCNN(nn.Module):
    def __init__(self, n_fft=512, hop=160, n_mels=64, classes=35, sample_rate=16000):
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.register_buffer("window", torch.hann_window(n_fft))
        self.register_buffer("fb", _mel_filterbank(n_fft // 2 + 1, n_mels, sample_rate))
        layers, cin = [], 1
        for cout in (32, 64, 128, 128):
            layers += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2)]
            cin = cout
        self.cnn = nn.Sequential(*layers)
        self.fc = nn.Linear(128, classes)

    def forward(self, wave):  # (N, samples)
        spec = torch.stft(wave, self.n_fft, hop_length=self.hop, window=self.window, return_complex=True)
        power = spec.abs() ** 2                                  # (N, freq, frames)
        mel = torch.matmul(power.transpose(1, 2), self.fb)       # (N, frames, mels)
        x = torch.log(torch.clamp(mel, min=1e-10)).unsqueeze(1)
        return self.fc(self.cnn(x).mean((2, 3)))


def logmel_cnn():
    """One second of 16 kHz audio: ``--input-shape 16000`` (STFT 512/160, 64 mel bands, 4 conv
    stages, 35 keyword classes)."""
    return LogMelCNN()


# ---- Graph network: GCN layers over a fixed random graph (gather, index_add, degree norm) ---------
class GCNLayer(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.lin = nn.Linear(cin, cout)

    def forward(self, x, src, dst, norm):  # x (N, nodes, C); edges src -> dst
        h = self.lin(x)
        msg = h[:, src] * norm                                    # (N, edges, C)
        return torch.relu(torch.zeros_like(h).index_add(1, dst, msg))


class GCN(nn.Module):
    def __init__(self, nodes=2000, edges=20000, width=64, depth=3, classes=16):
        super().__init__()
        g = torch.Generator().manual_seed(7)
        src = torch.randint(0, nodes, (edges,), generator=g)
        dst = torch.randint(0, nodes, (edges,), generator=g)
        self_loops = torch.arange(nodes)
        src, dst = torch.cat([src, self_loops]), torch.cat([dst, self_loops])
        deg = torch.zeros(nodes).index_add(0, dst, torch.ones(dst.shape[0]))
        self.register_buffer("src", src)
        self.register_buffer("dst", dst)
        # symmetric normalisation 1 / sqrt(deg(src) deg(dst)), one weight per edge
        self.register_buffer("norm", (deg[src] * deg[dst]).rsqrt().unsqueeze(1))
        self.layers = nn.ModuleList(GCNLayer(width, width) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x, self.src, self.dst, self.norm)
        return self.head(x)


def gcn():
    """Node features: ``--input-shape 2000,64`` (3 GCN layers of 64 over a fixed random graph of
    2000 nodes and 20000 edges plus self loops; per-node class scores)."""
    return GCN()


# ---- models probed on 2026-11-26 (third day): each found a gap or exercises a new fast path -----
# ---- LLaMA-style decoder: RMSNorm written out, RoPE by rotate_half, grouped KV heads, SwiGLU -----
class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(d) + 0.1 * torch.randn(d))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, d=256, heads=8, kv_heads=2, ffn=688, max_len=512):
        super().__init__()
        self.h, self.kvh, self.hd = heads, kv_heads, d // heads
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.v = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.gate, self.up = nn.Linear(d, ffn, bias=False), nn.Linear(d, ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        freqs = torch.outer(torch.arange(max_len).float(), inv)
        emb = torch.cat((freqs, freqs), -1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())

    def forward(self, x):
        b, t, d = x.shape
        y = self.n1(x)
        q = self.q(y).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.k(y).view(b, t, self.kvh, self.hd).transpose(1, 2)
        v = self.v(y).view(b, t, self.kvh, self.hd).transpose(1, 2)
        cos, sin = self.cos[:t][None, None], self.sin[:t][None, None]
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        k = k.repeat_interleave(self.h // self.kvh, dim=1)
        v = v.repeat_interleave(self.h // self.kvh, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        y = self.n2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class Llama(nn.Module):
    def __init__(self, vocab=1000, d=256, depth=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([LlamaBlock(d) for _ in range(depth)])
        self.norm, self.head = RMSNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.emb(ids)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))


def llama():
    """Token ids: ``--input-shape 64:int64:1000``."""
    return Llama()


# ---- Whisper-style audio encoder: Conv1d + GELU stem, sinusoidal positions, pre-LN encoder layers --
class WhisperEncoder(nn.Module):
    def __init__(self, n_mels=80, d=256, heads=4, depth=3, ctx=500):
        super().__init__()
        self.c1 = nn.Conv1d(n_mels, d, 3, padding=1)
        self.c2 = nn.Conv1d(d, d, 3, stride=2, padding=1)
        half = d // 2
        inv = torch.exp(-math.log(10000) / (half - 1) * torch.arange(half))
        st = torch.arange(ctx)[:, None] * inv[None, :]
        self.register_buffer("pos", torch.cat([torch.sin(st), torch.cos(st)], 1))
        self.layers = nn.ModuleList([nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu",
                                                                batch_first=True, norm_first=True)
                                     for _ in range(depth)])
        self.ln = nn.LayerNorm(d)

    def forward(self, mel):
        x = F.gelu(self.c2(F.gelu(self.c1(mel)))).permute(0, 2, 1)
        x = x + self.pos[: x.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.ln(x)


def whisper_enc():
    """Log-mel frames: ``--input-shape 80,1000``."""
    return WhisperEncoder()


# ---- CLIP-style text encoder: the causal mask is a registered buffer, EOT token picked by argmax ----
class ClipText(nn.Module):
    def __init__(self, vocab=5000, ctx=32, d=256, heads=4, depth=3):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(ctx, d) * 0.01)
        self.register_buffer("mask", torch.full((ctx, ctx), float("-inf")).triu(1))
        self.att = nn.ModuleList([nn.MultiheadAttention(d, heads, batch_first=True) for _ in range(depth)])
        self.lns = nn.ModuleList([nn.LayerNorm(d) for _ in range(2 * depth)])
        self.mlps = nn.ModuleList([nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
                                   for _ in range(depth)])
        self.ln = nn.LayerNorm(d)
        self.proj = nn.Parameter(torch.randn(d, 128) * d ** -0.5)

    def forward(self, ids):
        x = self.tok(ids) + self.pos
        for i, att in enumerate(self.att):
            y = self.lns[2 * i](x)
            x = x + att(y, y, y, need_weights=False, attn_mask=self.mask)[0]
            x = x + self.mlps[i](self.lns[2 * i + 1](x))
        x = self.ln(x)
        x = x[torch.arange(x.shape[0]), ids.argmax(dim=-1)] @ self.proj
        return x / x.norm(dim=-1, keepdim=True)


def clip_text():
    """Token ids: ``--input-shape 32:int64:5000``."""
    return ClipText()


# ---- nn.Transformer sequence to sequence (tgt_is_causal=False keeps the mask in the export) -------
class Seq2Seq(nn.Module):
    def __init__(self, d=128, vocab=500):
        super().__init__()
        self.t = nn.Transformer(d, 4, 2, 2, 256, dropout=0.0, batch_first=True)
        self.out = nn.Linear(d, vocab)

    def forward(self, src, tgt):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        # without tgt_is_causal=False torch detects the mask as causal and pnnx drops it (README)
        return self.out(self.t(src, tgt, tgt_mask=mask, tgt_is_causal=False))


def seq2seq():
    """Source and target embeddings: ``--input-shape "40,128;20,128"``."""
    return Seq2Seq()


# ---- diffusion U-Net: GroupNorm/SiLU blocks, a timestep embedding computed in forward, attention --
def _timestep_embedding(t, dim):
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class TimeResBlock(nn.Module):
    def __init__(self, cin, cout, tdim):
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(32, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.t = nn.Linear(tdim, cout)
        self.n2, self.c2 = nn.GroupNorm(32, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x, temb):
        h = self.c1(F.silu(self.n1(x))) + self.t(F.silu(temb))[:, :, None, None]
        return self.skip(x) + self.c2(F.silu(self.n2(h)))


class SpatialAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm, self.qkv, self.proj = nn.GroupNorm(32, c), nn.Conv2d(c, 3 * c, 1), nn.Conv2d(c, c, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, c, h * w).unbind(1)
        a = torch.softmax(torch.einsum("bci,bcj->bij", q, k) / math.sqrt(c), -1)
        return x + self.proj(torch.einsum("bij,bcj->bci", a, v).reshape(b, c, h, w))


class MiniUNet(nn.Module):
    def __init__(self, ch=64):
        super().__init__()
        td = ch * 4
        self.ch = ch
        self.temb = nn.Sequential(nn.Linear(ch, td), nn.SiLU(), nn.Linear(td, td))
        self.inp = nn.Conv2d(3, ch, 3, padding=1)
        self.d1, self.down = TimeResBlock(ch, ch, td), nn.Conv2d(ch, ch, 3, stride=2, padding=1)
        self.d2, self.mid, self.m2 = TimeResBlock(ch, 2 * ch, td), SpatialAttention(2 * ch), TimeResBlock(2 * ch, 2 * ch, td)
        self.u1, self.upc = TimeResBlock(4 * ch, ch, td), nn.Conv2d(ch, ch, 3, padding=1)
        self.u2 = TimeResBlock(2 * ch, ch, td)
        self.out = nn.Sequential(nn.GroupNorm(32, ch), nn.SiLU(), nn.Conv2d(ch, 3, 3, padding=1))

    def forward(self, x, t):
        e = self.temb(_timestep_embedding(t, self.ch))
        h1 = self.d1(self.inp(x), e)
        h2 = self.d2(self.down(h1), e)
        h = self.u1(torch.cat([self.m2(self.mid(h2), e), h2], 1), e)
        h = self.u2(torch.cat([self.upc(F.interpolate(h, scale_factor=2.0, mode="nearest")), h1], 1), e)
        return self.out(h)


def mini_unet():
    """An image and one integer timestep per sample: ``--input-shape "3,32,32;:int64:1000"``."""
    return MiniUNet()


# ---- ConvNeXt-V2 blocks: Global Response Normalisation (torch.norm over H, W; mean over C) --------
class GRN(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.gamma = nn.Parameter(torch.randn(1, 1, 1, d) * 0.1)
        self.beta = nn.Parameter(torch.randn(1, 1, 1, d) * 0.1)

    def forward(self, x):
        gx = torch.norm(x, p=2, dim=(1, 2), keepdim=True)
        return self.gamma * (x * (gx / (gx.mean(dim=-1, keepdim=True) + 1e-6))) + self.beta + x


class CNV2Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.dw, self.n = nn.Conv2d(d, d, 7, padding=3, groups=d), nn.LayerNorm(d, eps=1e-6)
        self.p1, self.grn, self.p2 = nn.Linear(d, 4 * d), GRN(4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        y = self.n(self.dw(x).permute(0, 2, 3, 1))
        return x + self.p2(self.grn(F.gelu(self.p1(y)))).permute(0, 3, 1, 2)


def convnext_v2():
    """A ConvNeXt-V2-Nano-like stack (widths 40..320, depths 2, 2, 6, 2): ``--input-shape 3,224,224``."""
    layers: list[nn.Module] = [nn.Conv2d(3, 40, 4, 4)]
    widths, depths = (40, 80, 160, 320), (2, 2, 6, 2)
    for i, (d, n) in enumerate(zip(widths, depths)):
        if i:
            layers += [nn.GroupNorm(1, widths[i - 1]), nn.Conv2d(widths[i - 1], d, 2, 2)]
        layers += [CNV2Block(d) for _ in range(n)]
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.LayerNorm(320), nn.Linear(320, 1000)]
    return nn.Sequential(*layers)


# ---- linear attention (elu + 1 feature maps): einsum outer products, a causal variant by cumsum ---
class LinearAttention(nn.Module):
    def __init__(self, d=128, heads=4):
        super().__init__()
        self.h = heads
        self.qkv, self.o, self.n = nn.Linear(d, 3 * d), nn.Linear(d, d), nn.LayerNorm(d)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(self.n(x)).view(b, n, 3, self.h, c // self.h).unbind(2)
        q, k = F.elu(q) + 1, F.elu(k) + 1
        kv = torch.einsum("bnhd,bnhe->bhde", k, v)
        z = 1 / (torch.einsum("bnhd,bhd->bnh", q, k.sum(1)) + 1e-6)
        out = torch.einsum("bnhd,bhde,bnh->bnhe", q, kv, z)
        kvc = torch.cumsum(torch.einsum("bnhd,bnhe->bnhde", k, v), 1)
        zc = 1 / (torch.einsum("bnhd,bnhd->bnh", q, torch.cumsum(k, 1)) + 1e-6)
        outc = torch.einsum("bnhd,bnhde,bnh->bnhe", q, kvc, zc)
        return x + self.o((out + outc).reshape(b, n, c))


def lin_attn():
    """Two linear-attention blocks on embeddings: ``--input-shape 256,128``."""
    return nn.Sequential(LinearAttention(), LinearAttention())


# ---- CenterNet-style decoding: max-pool NMS, top-k over flattened maps, floor division of indices --
class CenterNet(nn.Module):
    def __init__(self, classes=10, k=50):
        super().__init__()
        self.k = k
        self.body = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), nn.ReLU(), nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU(),
                                  nn.Conv2d(64, 64, 3, 1, 1), nn.ReLU())
        self.hm, self.wh, self.off = nn.Conv2d(64, classes, 1), nn.Conv2d(64, 2, 1), nn.Conv2d(64, 2, 1)

    def forward(self, x):
        f = self.body(x)
        heat = torch.sigmoid(self.hm(f))
        heat = heat * (F.max_pool2d(heat, 3, 1, 1) == heat).float()
        b, _, h, w = heat.shape
        scores, inds = torch.topk(heat.view(b, -1), self.k)
        cls = torch.div(inds, h * w, rounding_mode="floor")
        pix = inds % (h * w)
        ys, xs = torch.div(pix, w, rounding_mode="floor").float(), (pix % w).float()
        idx = pix.unsqueeze(1).expand(b, 2, self.k)
        wh, off = self.wh(f).view(b, 2, -1).gather(2, idx), self.off(f).view(b, 2, -1).gather(2, idx)
        cx, cy = xs + off[:, 0], ys + off[:, 1]
        boxes = torch.stack([cx - wh[:, 0] / 2, cy - wh[:, 1] / 2, cx + wh[:, 0] / 2, cy + wh[:, 1] / 2], -1)
        return boxes, scores, cls


def centernet():
    """Boxes, scores and integer classes of the top 50 peaks: ``--input-shape 3,128,128``."""
    return CenterNet()


# ---- spatial transformer: affine_grid of the input's own size (an input in a dynamic export) ------
class STN(nn.Module):
    def __init__(self):
        super().__init__()
        self.loc = nn.Sequential(nn.Conv2d(1, 8, 7), nn.MaxPool2d(2), nn.ReLU(), nn.Conv2d(8, 10, 5), nn.MaxPool2d(2),
                                 nn.ReLU())
        self.fc = nn.Sequential(nn.Linear(90, 32), nn.ReLU(), nn.Linear(32, 6))
        self.cls = nn.Sequential(nn.Conv2d(1, 10, 5), nn.MaxPool2d(2), nn.ReLU(), nn.Conv2d(10, 20, 5), nn.MaxPool2d(2),
                                 nn.ReLU(), nn.Flatten(), nn.Linear(320, 10))

    def forward(self, x):
        theta = self.fc(self.loc(x).view(-1, 90)).view(-1, 2, 3) * 0.1 + torch.tensor([[1.0, 0, 0], [0, 1.0, 0]])
        grid = F.affine_grid(theta, x.size(), align_corners=False)
        return F.log_softmax(self.cls(F.grid_sample(x, grid, align_corners=False)), 1)


def stn():
    """MNIST-sized digits: ``--input-shape 1,28,28``."""
    return STN()


# ---- GPT-2 as Hugging Face writes it: Conv1D layers (torch.addmm), a causal-mask buffer sliced to
# the sequence, torch.where with a -1e4 fill, the tanh GELU spelled out with torch.pow(x, 3.0) -----
class HFConv1D(nn.Module):
    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.randn(nf) * 0.02)

    def forward(self, x):
        out = x.size()[:-1] + (self.nf,)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(out)


class GPT2Block(nn.Module):
    def __init__(self, d, h, max_pos):
        super().__init__()
        self.d, self.h = d, h
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.attn_proj = HFConv1D(3 * d, d), HFConv1D(d, d)
        self.c_fc, self.c_proj = HFConv1D(4 * d, d), HFConv1D(d, 4 * d)
        self.register_buffer("bias", torch.tril(torch.ones(max_pos, max_pos, dtype=torch.bool)).view(
            1, 1, max_pos, max_pos))

    def heads(self, t):
        return t.view(t.size()[:-1] + (self.h, self.d // self.h)).permute(0, 2, 1, 3)

    def forward(self, x):
        q, k, v = self.c_attn(self.ln_1(x)).split(self.d, dim=2)
        q, k, v = self.heads(q), self.heads(k), self.heads(v)
        w = torch.matmul(q, k.transpose(-1, -2)) / (float(v.size(-1)) ** 0.5)
        t = q.size(-2)
        w = torch.where(self.bias[:, :, :t, :t], w, torch.full([], -1e4, dtype=w.dtype))
        a = torch.matmul(w.softmax(-1), v).permute(0, 2, 1, 3).contiguous()
        x = x + self.attn_proj(a.view(a.size()[:-2] + (self.d,)))
        f = self.c_fc(self.ln_2(x))
        f = 0.5 * f * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (f + 0.044715 * torch.pow(f, 3.0))))
        return x + self.c_proj(f)


class GPT2(nn.Module):
    def __init__(self, vocab=5000, d=768, h=12, layers=6, max_pos=256):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(max_pos, d)
        self.blocks = nn.ModuleList(GPT2Block(d, h, max_pos) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, ids):
        pos = torch.arange(0, ids.size(-1), dtype=torch.long).unsqueeze(0)
        x = self.wte(ids) + self.wpe(pos)
        for b in self.blocks:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.t()


def gpt2_hf():
    """GPT-2-small-wide, 6 layers, Hugging Face's spelling: ``--input-shape 128:int64:5000``."""
    return GPT2()


# ---- ALBERT: one encoder layer applied six times (pnnx writes six copies of its weights) ---------
class AlbertLayer(nn.Module):
    def __init__(self, d=256, h=4, ff=1024):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, h, batch_first=True)
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-12), nn.LayerNorm(d, eps=1e-12)
        self.ff = nn.Sequential(nn.Linear(d, ff), nn.GELU(), nn.Linear(ff, d))

    def forward(self, x):
        x = self.ln1(x + self.attn(x, x, x, need_weights=False)[0])
        return self.ln2(x + self.ff(x))


class Albert(nn.Module):
    def __init__(self, vocab=3000, e=128, d=256, repeat=6):
        super().__init__()
        self.word, self.pos = nn.Embedding(vocab, e), nn.Embedding(512, e)
        self.proj, self.layer, self.repeat = nn.Linear(e, d), AlbertLayer(d), repeat

    def forward(self, ids):
        x = self.proj(self.word(ids) + self.pos(torch.arange(ids.size(1)).unsqueeze(0)))
        for _ in range(self.repeat):
            x = self.layer(x)
        return x


def albert():
    """A shared encoder layer applied six times: ``--input-shape 64:int64:3000``."""
    return Albert()


# ---- ConvMixer: depthwise 9x9 convolutions covering the whole 9x9 token map -----------------------
class ConvMixerResidual(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x) + x


def convmixer():
    """ConvMixer-256/8 with 7x7 patches: ``--input-shape 3,64,64`` (a 9x9 token map)."""
    dim, depth, k, p = 256, 8, 9, 7
    return nn.Sequential(
        nn.Conv2d(3, dim, p, p), nn.GELU(), nn.BatchNorm2d(dim),
        *[nn.Sequential(ConvMixerResidual(nn.Sequential(nn.Conv2d(dim, dim, k, groups=dim, padding="same"),
                                                        nn.GELU(), nn.BatchNorm2d(dim))),
                        nn.Conv2d(dim, dim, 1), nn.GELU(), nn.BatchNorm2d(dim)) for _ in range(depth)],
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(dim, 10))


# ---- CIFAR ResNet-20: 3x3 convolutions of 16-64 channels on 32x32 maps ------------------------------
class CifarBasic(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.sc = None if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
        return F.relu(y + (x if self.sc is None else self.sc(x)))


def resnet20_cifar():
    """He et al.'s CIFAR ResNet-20 (16/32/64 channels): ``--input-shape 3,32,32``."""
    blocks, c = [], 16
    for cout, stride in ((16, 1), (32, 2), (64, 2)):
        for i in range(3):
            blocks.append(CifarBasic(c, cout, stride if i == 0 else 1))
            c = cout
    return nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), *blocks,
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


# ---- Session 24's survey of models never benchmarked before (kuiper-xp against torch) ----------------
def _cbn(cin, cout, k=3, stride=1, groups=1, act=nn.ReLU):
    """Conv (no bias) + BatchNorm (+ activation), 'same'-style padding for odd kernels."""
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, act()) if act is not None else nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    def __init__(self, c, hidden, gate=nn.Hardsigmoid, act=nn.ReLU):
        super().__init__()
        self.fc1, self.fc2, self.act, self.gate = nn.Conv2d(c, hidden, 1), nn.Conv2d(hidden, c, 1), act(), gate()

    def forward(self, x):
        return x * self.gate(self.fc2(self.act(self.fc1(F.adaptive_avg_pool2d(x, 1)))))


class InvertedResidual(nn.Module):
    """MobileNetV3's and EfficientNet's block: expand 1x1, depthwise kxk, squeeze-and-excite,
    project 1x1, a residual where the shapes allow."""

    def __init__(self, cin, k, mid, cout, se_hidden, act, stride, gate=nn.Hardsigmoid):
        super().__init__()
        self.res = stride == 1 and cin == cout
        layers = [] if mid == cin else [_cbn(cin, mid, 1, act=act)]
        layers.append(_cbn(mid, mid, k, stride, groups=mid, act=act))
        if se_hidden:
            layers.append(SqueezeExcite(mid, se_hidden, gate=gate, act=nn.ReLU if gate is nn.Hardsigmoid else act))
        layers.append(_cbn(mid, cout, 1, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        y = self.block(x)
        return x + y if self.res else y


def mobilenet_v3_small():
    """MobileNetV3-small (hardswish, squeeze-and-excite, 5x5 depthwise): ``--input-shape 3,224,224``."""
    RE, HS = nn.ReLU, nn.Hardswish
    cfg = [(16, 3, 16, 16, True, RE, 2), (16, 3, 72, 24, False, RE, 2), (24, 3, 88, 24, False, RE, 1),
           (24, 5, 96, 40, True, HS, 2), (40, 5, 240, 40, True, HS, 1), (40, 5, 240, 40, True, HS, 1),
           (40, 5, 120, 48, True, HS, 1), (48, 5, 144, 48, True, HS, 1), (48, 5, 288, 96, True, HS, 2),
           (96, 5, 576, 96, True, HS, 1), (96, 5, 576, 96, True, HS, 1)]
    blocks = [InvertedResidual(i, k, m, o, max(8, m // 4) if se else 0, act, s) for i, k, m, o, se, act, s in cfg]
    return calibrate_norms(nn.Sequential(_cbn(3, 16, 3, 2, act=HS), *blocks, _cbn(96, 576, 1, act=HS),
                                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(576, 1024), HS(),
                                         nn.Linear(1024, 1000)), (3, 224, 224))


def efficientnet_b0():
    """EfficientNet-B0 (SiLU, sigmoid squeeze-and-excite, 3x3 and 5x5 depthwise):
    ``--input-shape 3,224,224``."""
    blocks, c = [], 32
    for e, k, s, o, n in ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
                          (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)):
        for j in range(n):
            blocks.append(InvertedResidual(c, k, c * e, o, max(1, c // 4), nn.SiLU, s if j == 0 else 1,
                                           gate=nn.Sigmoid))
            c = o
    return calibrate_norms(nn.Sequential(_cbn(3, 32, 3, 2, act=nn.SiLU), *blocks, _cbn(c, 1280, 1, act=nn.SiLU),
                                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1280, 1000)), (3, 224, 224))


def espcn():
    """ESPCN x3 super-resolution (3x3 convolutions of 32-64 channels on the full map, pixel
    shuffle): ``--input-shape 1,128,128``."""
    return nn.Sequential(nn.Conv2d(1, 64, 5, padding=2), nn.Tanh(), nn.Conv2d(64, 32, 3, padding=1), nn.Tanh(),
                         nn.Conv2d(32, 9, 3, padding=1), nn.PixelShuffle(3))


class _DoubleConv(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__(_cbn(cin, cout), _cbn(cout, cout))


class UNetSmall(nn.Module):
    def __init__(self, c=16, classes=2):
        super().__init__()
        self.enc = nn.ModuleList([_DoubleConv(3, c), _DoubleConv(c, 2 * c), _DoubleConv(2 * c, 4 * c),
                                  _DoubleConv(4 * c, 8 * c)])
        self.up = nn.ModuleList([nn.ConvTranspose2d(8 * c, 4 * c, 2, 2), nn.ConvTranspose2d(4 * c, 2 * c, 2, 2),
                                 nn.ConvTranspose2d(2 * c, c, 2, 2)])
        self.dec = nn.ModuleList([_DoubleConv(8 * c, 4 * c), _DoubleConv(4 * c, 2 * c), _DoubleConv(2 * c, c)])
        self.out = nn.Conv2d(c, classes, 1)

    def forward(self, x):
        skips = []
        for i, enc in enumerate(self.enc):
            x = enc(x if i == 0 else F.max_pool2d(x, 2))
            skips.append(x)
        for up, dec, skip in zip(self.up, self.dec, reversed(skips[:-1])):
            x = dec(torch.cat([up(x), skip], 1))
        return self.out(x)


def unet_small():
    """A small U-Net (16-128 channels, ConvTranspose2d up-sampling, skip concatenations):
    ``--input-shape 3,128,128``."""
    return UNetSmall()


class TemporalBlock(nn.Module):
    def __init__(self, cin, cout, k, d):
        super().__init__()
        self.crop = (k - 1) * d
        self.c1 = nn.Conv1d(cin, cout, k, dilation=d, padding=self.crop)
        self.c2 = nn.Conv1d(cout, cout, k, dilation=d, padding=self.crop)
        self.down = nn.Conv1d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x):
        y = F.relu(self.c1(x)[:, :, :-self.crop])  # (causal: the look-ahead cropped)
        y = F.relu(self.c2(y)[:, :, :-self.crop])
        return F.relu(y + self.down(x))


class TCN(nn.Module):
    def __init__(self, cin=16, c=64, levels=6, k=3):
        super().__init__()
        self.net = nn.Sequential(*[TemporalBlock(cin if i == 0 else c, c, k, 2 ** i) for i in range(levels)])
        self.fc = nn.Linear(c, 10)

    def forward(self, x):
        return self.fc(self.net(x)[:, :, -1])


def tcn():
    """A temporal convolutional network (dilated causal Conv1d, 64 channels, dilations 1-32):
    ``--input-shape 16,1000``."""
    return TCN()


# ---- Session 27: a survey of architectures never run before (docs/benchmarks/cpu-2core-epyc-avx2.md)
def _cbs(cin, cout, k=3, s=1, g=1, act=nn.SiLU):
    """:func:`_cbn` with SiLU by default (the survey's blocks)."""
    return _cbn(cin, cout, k, s, g, act)


# ---- MobileViT-XS-ish: MV2 blocks + MobileViT blocks (unfold to patches by reshape/transpose)
class MV2(nn.Module):
    def __init__(self, cin, cout, s, e=4):
        super().__init__()
        h = cin * e
        self.use_res = s == 1 and cin == cout
        self.conv = nn.Sequential(_cbs(cin, h, 1), _cbs(h, h, 3, s, g=h),
                                  nn.Conv2d(h, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.conv(x)
        return x + y if self.use_res else y


class MViTBlock(nn.Module):
    def __init__(self, c, d, depth, ph=2, pw=2):
        super().__init__()
        self.ph, self.pw = ph, pw
        self.local = nn.Sequential(_cbs(c, c, 3), nn.Conv2d(c, d, 1, bias=False))
        layer = nn.TransformerEncoderLayer(d, 4, d * 2, dropout=0.0, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.tf = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.proj = _cbs(d, c, 1)
        self.fuse = _cbs(2 * c, c, 3)

    def forward(self, x):
        y = self.local(x)
        n, d, h, w = y.shape
        ph, pw = self.ph, self.pw
        nh, nw = h // ph, w // pw
        # (n, d, nh, ph, nw, pw) -> (n * ph * pw, nh * nw, d)
        t = y.reshape(n, d, nh, ph, nw, pw).permute(0, 3, 5, 2, 4, 1).reshape(n * ph * pw, nh * nw, d)
        t = self.norm(self.tf(t))
        y = t.reshape(n, ph, pw, nh, nw, d).permute(0, 5, 3, 1, 4, 2).reshape(n, d, h, w)
        y = self.proj(y)
        return self.fuse(torch.cat([x, y], 1))


class MobileViT(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = _cbs(3, 16, 3, 2)
        self.l1 = nn.Sequential(MV2(16, 32, 1), MV2(32, 48, 2), MV2(48, 48, 1))
        self.l2 = nn.Sequential(MV2(48, 64, 2), MViTBlock(64, 96, 2))
        self.l3 = nn.Sequential(MV2(64, 80, 2), MViTBlock(80, 120, 4))
        self.l4 = nn.Sequential(MV2(80, 96, 2), MViTBlock(96, 144, 3))
        self.head = nn.Sequential(_cbs(96, 384, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(384, 1000))

    def forward(self, x):
        return self.head(self.l4(self.l3(self.l2(self.l1(self.stem(x))))))


def mobilevit():
    """MobileViT-XS-like: MobileNetV2 blocks and MobileViT blocks (patches unfolded by reshape/permute,
    pre-norm nn.TransformerEncoder with GELU): ``--input-shape 3,256,256``."""
    return MobileViT()


# ---- SqueezeNet 1.1: fire modules, ceil-mode max pools, dropout, conv classifier
class Fire(nn.Module):
    def __init__(self, cin, s, e):
        super().__init__()
        self.sq = nn.Conv2d(cin, s, 1)
        self.e1 = nn.Conv2d(s, e, 1)
        self.e3 = nn.Conv2d(s, e, 3, padding=1)

    def forward(self, x):
        x = F.relu(self.sq(x))
        return torch.cat([F.relu(self.e1(x)), F.relu(self.e3(x))], 1)


def squeezenet():
    """SqueezeNet 1.1 (fire modules, ceil-mode max pools, a convolutional classifier):
    ``--input-shape 3,224,224``."""
    net = nn.Sequential(
        nn.Conv2d(3, 64, 3, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(64, 16, 64), Fire(128, 16, 64), nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(128, 32, 128), Fire(256, 32, 128), nn.MaxPool2d(3, 2, ceil_mode=True),
        Fire(256, 48, 192), Fire(384, 48, 192), Fire(384, 64, 256), Fire(512, 64, 256),
        nn.Dropout(0.5), nn.Conv2d(512, 1000, 1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1),
        nn.Flatten())
    return kaiming_convs(net)  # (with torch's default init the logits barely moved with the input)


# ---- GhostNet-ish: ghost modules (cheap depthwise ops, slice of a concat), SE with hardsigmoid
class Ghost(nn.Module):
    def __init__(self, cin, cout, relu=True):
        super().__init__()
        self.cout = cout
        init = math.ceil(cout / 2)
        act = nn.ReLU() if relu else nn.Identity()
        self.primary = nn.Sequential(nn.Conv2d(cin, init, 1, bias=False), nn.BatchNorm2d(init), act)
        self.cheap = nn.Sequential(nn.Conv2d(init, init, 3, 1, 1, groups=init, bias=False), nn.BatchNorm2d(init), act)

    def forward(self, x):
        a = self.primary(x)
        return torch.cat([a, self.cheap(a)], 1)[:, :self.cout]


class SEh(nn.Module):
    def __init__(self, c):
        super().__init__()
        r = max(8, c // 4)
        self.f = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, r, 1), nn.ReLU(), nn.Conv2d(r, c, 1))

    def forward(self, x):
        return x * F.hardsigmoid(self.f(x))


class GhostBottleneck(nn.Module):
    def __init__(self, cin, mid, cout, k, s, se):
        super().__init__()
        self.g1 = Ghost(cin, mid)
        self.dw = nn.Sequential(nn.Conv2d(mid, mid, k, s, k // 2, groups=mid, bias=False), nn.BatchNorm2d(mid)) \
            if s > 1 else nn.Identity()
        self.se = SEh(mid) if se else nn.Identity()
        self.g2 = Ghost(mid, cout, relu=False)
        if cin == cout and s == 1:
            self.short = nn.Identity()
        else:
            self.short = nn.Sequential(nn.Conv2d(cin, cin, k, s, k // 2, groups=cin, bias=False), nn.BatchNorm2d(cin),
                                       nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return self.g2(self.se(self.dw(self.g1(x)))) + self.short(x)


def ghostnet():
    """GhostNet-like (ghost modules: a depthwise cheap operation, concatenation sliced back; SE with
    hardsigmoid): ``--input-shape 3,224,224``."""
    cfg = [(3, 16, 16, 0, 1), (3, 48, 24, 0, 2), (3, 72, 24, 0, 1), (5, 72, 40, 1, 2), (5, 120, 40, 1, 1),
           (3, 240, 80, 0, 2), (3, 200, 80, 0, 1), (3, 480, 112, 1, 1), (5, 672, 160, 1, 2), (5, 960, 160, 1, 1)]
    layers = [_cbs(3, 16, 3, 2, act=nn.ReLU)]
    cin = 16
    for k, mid, cout, se, s in cfg:
        layers.append(GhostBottleneck(cin, mid, cout, k, s, se))
        cin = cout
    layers += [_cbs(cin, 960, 1, act=nn.ReLU), nn.AdaptiveAvgPool2d(1), nn.Conv2d(960, 1280, 1), nn.ReLU(),
               nn.Flatten(), nn.Linear(1280, 1000)]
    return nn.Sequential(*layers)


# ---- PSPNet-ish head on a small backbone: adaptive pools 1/2/3/6, bilinear align_corners=True
class PSP(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(_cbs(3, 32, 3, 2, act=nn.ReLU), _cbs(32, 64, 3, 2, act=nn.ReLU),
                                      _cbs(64, 128, 3, 2, act=nn.ReLU), _cbs(128, 256, 3, 1, act=nn.ReLU))
        self.stages = nn.ModuleList([nn.Sequential(nn.AdaptiveAvgPool2d(b), _cbs(256, 64, 1, act=nn.ReLU))
                                     for b in (1, 2, 3, 6)])
        self.fuse = _cbs(256 + 4 * 64, 128, 3, act=nn.ReLU)
        self.cls = nn.Conv2d(128, 21, 1)

    def forward(self, x):
        f = self.backbone(x)
        h, w = f.shape[2:]
        feats = [f] + [F.interpolate(s(f), size=(h, w), mode="bilinear", align_corners=True) for s in self.stages]
        y = self.cls(self.fuse(torch.cat(feats, 1)))
        return F.interpolate(y, scale_factor=8, mode="bilinear", align_corners=False)


def pspnet():
    """A PSPNet-style pyramid pooling head (adaptive average pools 1/2/3/6, bilinear with
    align_corners) on a small backbone: ``--input-shape 3,256,256``."""
    return PSP()


# ---- RepVGG-A0-ish in its training form: 3x3 + 1x1 + identity-BN branches summed
class RepBlock(nn.Module):
    def __init__(self, cin, cout, s):
        super().__init__()
        self.b3 = nn.Sequential(nn.Conv2d(cin, cout, 3, s, 1, bias=False), nn.BatchNorm2d(cout))
        self.b1 = nn.Sequential(nn.Conv2d(cin, cout, 1, s, 0, bias=False), nn.BatchNorm2d(cout))
        self.id = nn.BatchNorm2d(cin) if cin == cout and s == 1 else None

    def forward(self, x):
        y = self.b3(x) + self.b1(x)
        if self.id is not None:
            y = y + self.id(x)
        return F.relu(y)


def repvgg():
    """RepVGG-A0-like in its training form (3x3, 1x1 and identity-BN branches summed):
    ``--input-shape 3,224,224``."""
    layers, cin = [], 3
    for cout, n, s in [(48, 1, 2), (48, 2, 2), (96, 4, 2), (192, 14, 2), (1280, 1, 2)]:
        for i in range(n):
            layers.append(RepBlock(cin, cout, s if i == 0 else 1))
            cin = cout
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1280, 1000))


# ---- LeViT-ish attention with a learned relative-position bias gathered by a buffer of indices
class BiasAttention(nn.Module):
    def __init__(self, d, heads, res):
        super().__init__()
        self.h, self.dk = heads, d // heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Sequential(nn.Hardswish(), nn.Linear(d, d))
        pts = [(i, j) for i in range(res) for j in range(res)]
        offs, idx = {}, []
        for p in pts:
            for q in pts:
                o = (abs(p[0] - q[0]), abs(p[1] - q[1]))
                offs.setdefault(o, len(offs))
                idx.append(offs[o])
        self.bias = nn.Parameter(torch.randn(heads, len(offs)) * 0.1)
        self.register_buffer("idx", torch.tensor(idx).view(len(pts), len(pts)))

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.h, self.dk).permute(2, 0, 3, 1, 4)
        a = (q @ k.transpose(-2, -1)) * self.dk ** -0.5 + self.bias[:, self.idx]
        y = (a.softmax(-1) @ v).transpose(1, 2).reshape(b, n, d)
        return self.proj(y)


class LeViTBlock(nn.Module):
    def __init__(self, d, heads, res):
        super().__init__()
        self.attn = BiasAttention(d, heads, res)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.Hardswish(), nn.Linear(2 * d, d))
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        return x + self.mlp(self.n2(x))


class LeViT(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(_cbs(3, 32, 3, 2, act=nn.Hardswish), _cbs(32, 64, 3, 2, act=nn.Hardswish),
                                  _cbs(64, 128, 3, 2, act=nn.Hardswish), _cbs(128, 192, 3, 2, act=nn.Hardswish))
        self.blocks = nn.Sequential(*[LeViTBlock(192, 3, 14) for _ in range(4)])
        self.head = nn.Linear(192, 1000)

    def forward(self, x):
        x = self.stem(x).flatten(2).transpose(1, 2)
        x = self.blocks(x)
        return self.head(x.mean(1))


def levit():
    """LeViT-like attention on 14x14 tokens with a learned relative-position bias gathered by a
    buffer of indices, hardswish MLPs: ``--input-shape 3,224,224``."""
    return LeViT()


# ---- T5-ish encoder: relative position buckets computed in forward (log, clamp, where), RMS norm
class T5Layer(nn.Module):
    def __init__(self, d, heads, ff):
        super().__init__()
        self.h, self.dk = heads, d // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.wi, self.wo = nn.Linear(d, ff, bias=False), nn.Linear(ff, d, bias=False)
        self.g1, self.g2 = nn.Parameter(torch.ones(d)), nn.Parameter(torch.ones(d))

    @staticmethod
    def _rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g

    def forward(self, x, bias):
        b, n, d = x.shape
        y = self._rms(x, self.g1)
        q = self.q(y).view(b, n, self.h, self.dk).transpose(1, 2)
        k = self.k(y).view(b, n, self.h, self.dk).transpose(1, 2)
        v = self.v(y).view(b, n, self.h, self.dk).transpose(1, 2)
        a = torch.matmul(q, k.transpose(2, 3)) + bias
        y = torch.matmul(F.softmax(a.float(), dim=-1).type_as(a), v).transpose(1, 2).reshape(b, n, d)
        x = x + self.o(y)
        return x + self.wo(F.relu(self.wi(self._rms(x, self.g2))))


class T5Enc(nn.Module):
    def __init__(self, vocab=4000, d=256, heads=4, layers=4, buckets=32, max_dist=128):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rel = nn.Embedding(buckets, heads)
        self.buckets, self.max_dist = buckets, max_dist
        self.layers = nn.ModuleList([T5Layer(d, heads, 4 * d) for _ in range(layers)])

    def _bucket(self, rel):
        nb = self.buckets // 2
        ret = (rel > 0).to(torch.long) * nb
        n = torch.abs(rel)
        exact = nb // 2
        small = n < exact
        large = exact + (torch.log(n.float() / exact) / math.log(self.max_dist / exact) * (nb - exact)).to(torch.long)
        large = torch.min(large, torch.full_like(large, nb - 1))
        return ret + torch.where(small, n, large)

    def forward(self, ids):
        x = self.emb(ids)
        n = ids.shape[1]
        pos = torch.arange(n, dtype=torch.long)
        rel = pos[None, :] - pos[:, None]
        bias = self.rel(self._bucket(rel)).permute(2, 0, 1).unsqueeze(0)
        for layer in self.layers:
            x = layer(x, bias)
        return x


def t5_enc():
    """A T5-style encoder: relative position buckets computed in forward (log, min, where), RMS
    norm, an embedding of the buckets as the attention bias: ``--input-shape 128:int64:4000``."""
    return T5Enc()


# ---- HRNet-ish: parallel branches at 3 resolutions, fused with nearest upsampling and strided convs
class HRFuse(nn.Module):
    def __init__(self, cs):
        super().__init__()
        self.cs = cs
        self.branches = nn.ModuleList([nn.Sequential(_cbs(c, c, 3, act=nn.ReLU), _cbs(c, c, 3, act=nn.ReLU)) for c in cs])
        self.up = nn.ModuleDict()
        self.down = nn.ModuleDict()
        for i, ci in enumerate(cs):
            for j, cj in enumerate(cs):
                if j > i:
                    self.up[f"{j}{i}"] = nn.Sequential(nn.Conv2d(cj, ci, 1, bias=False), nn.BatchNorm2d(ci))
                elif j < i:
                    steps = [_cbs(cj, cj, 3, 2, act=nn.ReLU) for _ in range(i - j - 1)]
                    steps.append(nn.Sequential(nn.Conv2d(cj, ci, 3, 2, 1, bias=False), nn.BatchNorm2d(ci)))
                    self.down[f"{j}{i}"] = nn.Sequential(*steps)

    def forward(self, xs):
        xs = [b(x) for b, x in zip(self.branches, xs)]
        out = []
        for i in range(len(xs)):
            y = xs[i]
            for j in range(len(xs)):
                if j > i:
                    y = y + F.interpolate(self.up[f"{j}{i}"](xs[j]), scale_factor=2 ** (j - i), mode="nearest")
                elif j < i:
                    y = y + self.down[f"{j}{i}"](xs[j])
            out.append(F.relu(y))
        return out


class HRNetLite(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(_cbs(3, 64, 3, 2, act=nn.ReLU), _cbs(64, 64, 3, 2, act=nn.ReLU))
        self.t1 = _cbs(64, 32, 3, act=nn.ReLU)
        self.t2 = _cbs(64, 64, 3, 2, act=nn.ReLU)
        self.t3 = _cbs(64, 128, 3, 2, act=nn.ReLU)
        self.stages = nn.ModuleList([HRFuse((32, 64, 128)) for _ in range(3)])
        self.head = nn.Conv2d(32 + 64 + 128, 17, 1)

    def forward(self, x):
        x = self.stem(x)
        t2 = self.t2(x)
        xs = [self.t1(x), t2, self.t3(t2)]
        for s in self.stages:
            xs = s(xs)
        h, w = xs[0].shape[2:]
        y = torch.cat([xs[0]] + [F.interpolate(t, size=(h, w), mode="bilinear", align_corners=False) for t in xs[1:]], 1)
        return self.head(y)


def hrnet_lite():
    """HRNet-like: three parallel resolutions fused by nearest up-sampling and strided
    convolutions, a bilinear head: ``--input-shape 3,256,256``."""
    return HRNetLite()


# ---- SSD-lite-ish detector head: per-level permute/reshape/cat into (N, anchors, 4) and (N, anchors, C)
class SSDLite(nn.Module):
    def __init__(self, classes=21):
        super().__init__()
        self.classes = classes
        self.b1 = nn.Sequential(_cbs(3, 32, 3, 2, act=nn.ReLU6), MV2(32, 32, 1), MV2(32, 64, 2), MV2(64, 64, 2))
        self.b2 = nn.Sequential(MV2(64, 128, 2), MV2(128, 128, 1))
        self.b3 = nn.Sequential(MV2(128, 256, 2))
        self.b4 = nn.Sequential(_cbs(256, 128, 1, act=nn.ReLU6), _cbs(128, 256, 3, 2, act=nn.ReLU6))
        cs, self.na = (64, 128, 256, 256), 6
        self.loc = nn.ModuleList([nn.Conv2d(c, self.na * 4, 3, padding=1) for c in cs])
        self.conf = nn.ModuleList([nn.Conv2d(c, self.na * classes, 3, padding=1) for c in cs])

    def forward(self, x):
        f1 = self.b1(x)
        f2 = self.b2(f1)
        f3 = self.b3(f2)
        f4 = self.b4(f3)
        locs, confs = [], []
        for f, l, c in zip((f1, f2, f3, f4), self.loc, self.conf):
            n = f.shape[0]
            locs.append(l(f).permute(0, 2, 3, 1).reshape(n, -1, 4))
            confs.append(c(f).permute(0, 2, 3, 1).reshape(n, -1, self.classes))
        return torch.cat(locs, 1), torch.cat(confs, 1).softmax(-1)


def ssdlite():
    """An SSD-lite-style detector: MobileNetV2 blocks, per-level permute/reshape/cat heads, two
    outputs (boxes, softmax scores): ``--input-shape 3,300,300``."""
    return SSDLite()


# ---- Res2Net-ish bottleneck: split into 4 scales, hierarchical 3x3 convs, concat
class Res2Block(nn.Module):
    def __init__(self, c, width=26, scales=4):
        super().__init__()
        self.w, self.s = width, scales
        self.c1 = _cbs(c, width * scales, 1, act=nn.ReLU)
        self.convs = nn.ModuleList([_cbs(width, width, 3, act=nn.ReLU) for _ in range(scales - 1)])
        self.c3 = nn.Sequential(nn.Conv2d(width * scales, c, 1, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        parts = torch.split(self.c1(x), self.w, 1)
        out, y = [], None
        for i, conv in enumerate(self.convs):
            y = parts[i] if i == 0 else y + parts[i]
            y = conv(y)
            out.append(y)
        out.append(parts[-1])
        return F.relu(self.c3(torch.cat(out, 1)) + x)


def res2net():
    """Res2Net-like bottlenecks (split into four scales, hierarchical 3x3 convolutions,
    concatenation): ``--input-shape 3,224,224``."""
    return nn.Sequential(_cbs(3, 64, 7, 2, act=nn.ReLU), nn.MaxPool2d(3, 2, 1), nn.Conv2d(64, 256, 1),
                         *[Res2Block(256) for _ in range(3)], nn.Conv2d(256, 512, 3, 2, 1),
                         *[Res2Block(512, 52) for _ in range(3)],
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000))


# ---- a GRU speech model: conv front end, 2-layer bidirectional GRU, per-frame classifier
class GRUSpeech(nn.Module):
    def __init__(self):
        super().__init__()
        self.front = nn.Sequential(nn.Conv1d(80, 256, 5, 2, 2), nn.GELU(), nn.Conv1d(256, 256, 3, 1, 1), nn.GELU())
        self.gru = nn.GRU(256, 192, num_layers=2, batch_first=True, bidirectional=True)
        self.out = nn.Linear(384, 32)

    def forward(self, x):
        y = self.front(x).transpose(1, 2)
        y, _ = self.gru(y)
        return self.out(y).log_softmax(-1)


def gru_speech():
    """A speech model: Conv1d front end with GELU, two-layer bidirectional GRU, log_softmax:
    ``--input-shape 80,300``."""
    return GRUSpeech()


# ---- Session 27, second survey: operator-heavy forms (sine embeddings in forward, unfold/fold,
# grid_sample, topk + gather, einsum, bicubic, roll, glu)
class Perceiver(nn.Module):
    """latents cross-attend to the input tokens (kdim/vdim differ), then self-attend"""
    def __init__(self, cin=64, d=128, n_lat=32):
        super().__init__()
        self.lat = nn.Parameter(torch.randn(n_lat, d) * 0.2)
        self.cross = nn.MultiheadAttention(d, 4, kdim=cin, vdim=cin, batch_first=True)
        self.self_attn = nn.TransformerEncoderLayer(d, 4, 256, dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        b = x.shape[0]
        q = self.lat.unsqueeze(0).expand(b, -1, -1)
        z, _ = self.cross(q, x, x, need_weights=False)
        z = self.self_attn(z + q)
        return self.head(self.norm(z).mean(1))


def perceiver():
    """``--input-shape 100,64`` (see the class's docstring)."""
    return Perceiver()


class DetrSine(nn.Module):
    """DETR's sine position embedding from a cumsum over a mask, then a transformer encoder"""
    def __init__(self, d=128):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 64, 3, 2, 1), nn.ReLU(), nn.Conv2d(64, d, 3, 2, 1), nn.ReLU())
        self.d = d
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 8, 256, dropout=0.0), 2,
                                         enable_nested_tensor=False)
        self.out = nn.Linear(d, 5)

    def forward(self, x):
        f = self.backbone(x)
        b, c, h, w = f.shape
        mask = torch.ones_like(f[:, 0])
        y = mask.cumsum(1)
        xx = mask.cumsum(2)
        eps, scale = 1e-6, 2 * math.pi
        y = y / (y[:, -1:, :] + eps) * scale
        xx = xx / (xx[:, :, -1:] + eps) * scale
        npf = self.d // 2
        dim_t = torch.arange(npf, dtype=torch.float32)
        dim_t = 10000 ** (2 * torch.div(dim_t, 2, rounding_mode="floor") / npf)
        px = xx[:, :, :, None] / dim_t
        py = y[:, :, :, None] / dim_t
        px = torch.stack((px[:, :, :, 0::2].sin(), px[:, :, :, 1::2].cos()), dim=4).flatten(3)
        py = torch.stack((py[:, :, :, 0::2].sin(), py[:, :, :, 1::2].cos()), dim=4).flatten(3)
        pos = torch.cat((py, px), dim=3).permute(0, 3, 1, 2)
        src = (f + pos).flatten(2).permute(2, 0, 1)
        return self.out(self.enc(src))


def detr_sine():
    """``--input-shape 3,128,128`` (see the class's docstring)."""
    return DetrSine()


class NeRF(nn.Module):
    """positional encoding sin/cos of 2^k x, an MLP with a skip concatenation, sigmoid / relu heads"""
    def __init__(self, L=8, w=128):
        super().__init__()
        self.L = L
        cin = 3 + 3 * 2 * L
        self.l1 = nn.Sequential(nn.Linear(cin, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU())
        self.l2 = nn.Sequential(nn.Linear(w + cin, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU())
        self.sigma = nn.Linear(w, 1)
        self.rgb = nn.Linear(w, 3)

    def forward(self, p):
        enc = [p] + [f(2.0 ** k * math.pi * p) for k in range(self.L) for f in (torch.sin, torch.cos)]
        e = torch.cat(enc, -1)
        h = self.l2(torch.cat([self.l1(e), e], -1))
        return torch.cat([F.relu(self.sigma(h)), torch.sigmoid(self.rgb(h))], -1)


def nerf():
    """``--input-shape 1024,3`` (see the class's docstring)."""
    return NeRF()


class BiFPNNode(nn.Module):
    def __init__(self, c, n):
        super().__init__()
        self.w = nn.Parameter(torch.ones(n) + torch.rand(n))
        self.conv = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1, groups=c, bias=False), nn.Conv2d(c, c, 1), nn.BatchNorm2d(c))

    def forward(self, *xs):
        w = F.relu(self.w)
        w = w / (w.sum() + 1e-4)
        y = sum(w[i] * x for i, x in enumerate(xs))
        return self.conv(F.silu(y))


class BiFPN(nn.Module):
    def __init__(self, c=64):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1), nn.SiLU())
        self.d1 = nn.Sequential(nn.Conv2d(c, c, 3, 2, 1), nn.SiLU())
        self.d2 = nn.Sequential(nn.Conv2d(c, c, 3, 2, 1), nn.SiLU())
        self.td1 = BiFPNNode(c, 2)
        self.td0 = BiFPNNode(c, 2)
        self.bu1 = BiFPNNode(c, 3)
        self.bu2 = BiFPNNode(c, 2)

    def forward(self, x):
        p0 = self.stem(x)
        p1 = self.d1(p0)
        p2 = self.d2(p1)
        t1 = self.td1(p1, F.interpolate(p2, scale_factor=2.0, mode="nearest"))
        o0 = self.td0(p0, F.interpolate(t1, scale_factor=2.0, mode="nearest"))
        o1 = self.bu1(p1, t1, F.max_pool2d(o0, 3, 2, 1))
        o2 = self.bu2(p2, F.max_pool2d(o1, 3, 2, 1))
        return o0, o1, o2


def bifpn():
    """``--input-shape 3,128,128`` (see the class's docstring)."""
    return BiFPN()


class Outlooker(nn.Module):
    """VOLO's outlook attention: F.unfold into 3x3 windows, per-pixel softmax weights, F.fold back"""
    def __init__(self, c=64, heads=4, k=3):
        super().__init__()
        self.h, self.k = heads, k
        self.v = nn.Linear(c, c, bias=False)
        self.attn = nn.Linear(c, k ** 4 * heads)
        self.proj = nn.Linear(c, c)
        self.stem = nn.Conv2d(3, c, 4, 4)
        self.head = nn.Linear(c, 10)

    def forward(self, x):
        x = self.stem(x).permute(0, 2, 3, 1)  # (B, H, W, C)
        b, hh, ww, c = x.shape
        k, h = self.k, self.h
        v = self.v(x).permute(0, 3, 1, 2)
        v = F.unfold(v, k, padding=1).reshape(b, h, c // h, k * k, hh * ww).permute(0, 1, 4, 3, 2)
        a = self.attn(x).reshape(b, hh * ww, h, k * k, k * k).permute(0, 2, 1, 3, 4)
        a = (a * (c // h) ** -0.5).softmax(-1)
        y = (a @ v).permute(0, 1, 4, 3, 2).reshape(b, c * k * k, hh * ww)
        y = F.fold(y, (hh, ww), k, padding=1).permute(0, 2, 3, 1)
        y = self.proj(y) + x
        return self.head(y.mean((1, 2)))


def outlooker():
    """``--input-shape 3,64,64`` (see the class's docstring)."""
    return Outlooker()


class FlowWarp(nn.Module):
    """predict a flow, warp the image with grid_sample (base grid from linspace + meshgrid)"""
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1), nn.ReLU(), nn.Conv2d(32, 32, 3, 1, 1), nn.ReLU(),
                                 nn.Conv2d(32, 2, 3, 1, 1), nn.Tanh())

    def forward(self, x):
        b, _, h, w = x.shape
        flow = self.net(x) * 0.1
        ys = torch.linspace(-1.0, 1.0, h)
        xs = torch.linspace(-1.0, 1.0, w)
        gy, gx = torch.meshgrid(ys, xs, indexing="ij")
        grid = torch.stack((gx, gy), -1).unsqueeze(0) + flow.permute(0, 2, 3, 1)
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def flow_warp():
    """``--input-shape 3,64,64`` (see the class's docstring)."""
    return FlowWarp()


class GatedConvLM(nn.Module):
    """token embedding, causal Conv1d with F.pad + F.glu, residual, pixel-(un)shuffle-free 1-d"""
    def __init__(self, vocab=3000, d=128, layers=4, k=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.k = k
        self.convs = nn.ModuleList([nn.Conv1d(d, 2 * d, k) for _ in range(layers)])
        self.out = nn.Linear(d, vocab)

    def forward(self, ids):
        x = self.emb(ids).transpose(1, 2)
        for conv in self.convs:
            x = x + F.glu(conv(F.pad(x, (self.k - 1, 0))), dim=1)
        return self.out(x.transpose(1, 2)).log_softmax(-1)


def gated_conv_lm():
    """``--input-shape "50:int64:3000"`` (see the class's docstring)."""
    return GatedConvLM()


class PointNetTopK(nn.Module):
    """shared MLP over points, scores -> topk, gather of the selected features, max pool"""
    def __init__(self, k=64):
        super().__init__()
        self.k = k
        self.mlp = nn.Sequential(nn.Conv1d(3, 64, 1), nn.BatchNorm1d(64), nn.ReLU(), nn.Conv1d(64, 128, 1), nn.ReLU())
        self.score = nn.Conv1d(128, 1, 1)
        self.head = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, pts):  # (B, N, 3)
        f = self.mlp(pts.transpose(1, 2))  # (B, 128, N)
        s = self.score(f).squeeze(1)  # (B, N)
        _, idx = torch.topk(s, self.k, dim=1)
        sel = torch.gather(f, 2, idx.unsqueeze(1).expand(-1, f.shape[1], -1))
        g = sel.max(2)[0]
        return self.head(g)


def pointnet_topk():
    """``--input-shape 1024,3`` (see the class's docstring)."""
    return PointNetTopK()


class CosineAttnBlock(nn.Module):
    """Swin-V2-style cosine attention: F.normalize q, k; einsum scores; a clamped, exp'd logit scale"""
    def __init__(self, d=96, h=3):
        super().__init__()
        self.h = h
        self.qkv = nn.Linear(d, 3 * d)
        self.logit_scale = nn.Parameter(torch.log(10 * torch.ones(h, 1, 1)))
        self.proj = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.norm2 = nn.LayerNorm(d)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        a = torch.einsum("bhid,bhjd->bhij", F.normalize(q, dim=-1), F.normalize(k, dim=-1))
        a = a * torch.clamp(self.logit_scale, max=math.log(100.0)).exp()
        y = torch.einsum("bhij,bhjd->bhid", a.softmax(-1), v).transpose(1, 2).reshape(b, n, d)
        x = x + self.norm(self.proj(y))  # (post-norm, as Swin-V2)
        return x + self.norm2(self.mlp(x))


class CosineViT(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch = nn.Conv2d(3, 96, 8, 8)
        self.blocks = nn.Sequential(*[CosineAttnBlock() for _ in range(3)])
        self.head = nn.Linear(96, 10)

    def forward(self, x):
        return self.head(self.blocks(self.patch(x).flatten(2).transpose(1, 2)).mean(1))


def cosine_vit():
    """``--input-shape 3,64,64`` (see the class's docstring)."""
    return CosineViT()


class BicubicSR(nn.Module):
    """bicubic x2 up-sampling plus a learned residual, pixel_unshuffle / pixel_shuffle, torch.roll"""
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(12, 64, 3, 1, 1), nn.PReLU(64), nn.Conv2d(64, 64, 3, 1, 1), nn.PReLU(64),
                                  nn.Conv2d(64, 48, 3, 1, 1))

    def forward(self, x):
        up = F.interpolate(x, scale_factor=2.0, mode="bicubic", align_corners=False)
        r = self.body(F.pixel_unshuffle(x, 2))
        r = F.pixel_shuffle(F.pixel_shuffle(r, 2), 2)
        return up + torch.roll(r, shifts=(1, -1), dims=(2, 3))


def bicubic_sr():
    """``--input-shape 3,32,32`` (see the class's docstring)."""
    return BicubicSR()


# -- session 28: a third survey of architectures never run before ---------------------------------
class SpatialGatingUnit(nn.Module):
    def __init__(self, dim, seq):
        super().__init__()
        self.norm = nn.LayerNorm(dim // 2)
        self.proj = nn.Linear(seq, seq)

    def forward(self, x):
        u, v = x.chunk(2, dim=-1)
        v = self.norm(v)
        v = self.proj(v.transpose(1, 2)).transpose(1, 2)
        return u * v


class GMLP(nn.Module):
    """gMLP: spatial gating over tokens; input (N, 64, 128)."""
    def __init__(self, dim=128, seq=64, depth=4):
        super().__init__()
        self.blocks = nn.ModuleList()
        for _ in range(depth):
            self.blocks.append(nn.ModuleDict({"norm": nn.LayerNorm(dim), "fc1": nn.Linear(dim, dim * 4),
                                              "sgu": SpatialGatingUnit(dim * 4, seq), "fc2": nn.Linear(dim * 2, dim)}))
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        for b in self.blocks:
            y = F.gelu(b["fc1"](b["norm"](x)))
            x = x + b["fc2"](b["sgu"](y))
        return self.head(x.mean(1))


def gmlp():
    """``--input-shape 64,128`` (see the class's docstring)."""
    return GMLP()


class FNetBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, dim * 2), nn.GELU(), nn.Linear(dim * 2, dim))

    def forward(self, x):
        x = self.n1(x + torch.fft.fft2(x).real)
        return self.n2(x + self.ff(x))


class FNet(nn.Module):
    """FNet: Fourier mixing (fft2 real part) instead of attention; input (N, 128, 96)."""
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(*[FNetBlock(96) for _ in range(3)])
        self.head = nn.Linear(96, 4)

    def forward(self, x):
        return self.head(self.blocks(x)[:, 0])


def fnet():
    """``--input-shape 128,96`` (see the class's docstring)."""
    return FNet()


class RDB(nn.Module):
    def __init__(self, nf=32, gc=16):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv2d(nf + i * gc, gc if i < 4 else nf, 3, 1, 1) for i in range(5)])

    def forward(self, x):
        feats = [x]
        for i, c in enumerate(self.convs):
            y = c(torch.cat(feats, 1))
            if i < 4:
                feats.append(F.leaky_relu(y, 0.2))
        return x + 0.2 * y


class RRDBNet(nn.Module):
    """ESRGAN-lite: residual-in-residual dense blocks, nearest x2 up-sampling; input (N, 3, 32, 32)."""
    def __init__(self, nf=32):
        super().__init__()
        self.first = nn.Conv2d(3, nf, 3, 1, 1)
        self.body = nn.Sequential(*[nn.Sequential(RDB(nf), RDB(nf)) for _ in range(2)])
        self.trunk = nn.Conv2d(nf, nf, 3, 1, 1)
        self.up = nn.Conv2d(nf, nf, 3, 1, 1)
        self.last = nn.Conv2d(nf, 3, 3, 1, 1)

    def forward(self, x):
        f = self.first(x)
        f = f + self.trunk(self.body(f))
        f = F.leaky_relu(self.up(F.interpolate(f, scale_factor=2, mode="nearest")), 0.2)
        return self.last(f)


def rrdb():
    """``--input-shape 3,32,32`` (see the class's docstring)."""
    return RRDBNet()


def squash(s, dim=-1):
    n2 = (s * s).sum(dim, keepdim=True)
    return n2 / (1 + n2) * s / torch.sqrt(n2 + 1e-8)


class CapsNet(nn.Module):
    """CapsNet with 3 iterations of dynamic routing (unrolled); input (N, 1, 28, 28)."""
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 64, 9)
        self.prim = nn.Conv2d(64, 8 * 16, 9, stride=2)
        self.W = nn.Parameter(torch.randn(1, 16 * 6 * 6, 10, 12, 8) * 0.05)

    def forward(self, x):
        n = x.shape[0]
        h = F.relu(self.conv(x))
        u = self.prim(h).view(n, 16, 8, 6, 6).permute(0, 1, 3, 4, 2).reshape(n, -1, 8)
        u = squash(u)
        uhat = (self.W @ u[:, :, None, :, None]).squeeze(-1)  # (n, 576, 10, 12)
        b = torch.zeros(n, uhat.shape[1], 10, device=x.device)
        for _ in range(3):
            c = F.softmax(b, dim=2)
            v = squash((c[..., None] * uhat).sum(1))  # (n, 10, 12)
            b = b + (uhat * v[:, None]).sum(-1)
        return v.norm(dim=-1)


def capsnet():
    """``--input-shape 1,28,28`` (see the class's docstring)."""
    return CapsNet()


class ConvLSTM(nn.Module):
    """A ConvLSTM over 6 frames (time loop unrolled by the trace); input (N, 6, 8, 24, 24)."""
    def __init__(self, cin=8, hid=16):
        super().__init__()
        self.hid = hid
        self.gates = nn.Conv2d(cin + hid, 4 * hid, 3, 1, 1)
        self.out = nn.Conv2d(hid, 1, 1)

    def forward(self, x):
        n, t, _, hh, ww = x.shape
        h = x.new_zeros(n, self.hid, hh, ww)
        c = x.new_zeros(n, self.hid, hh, ww)
        for k in range(6):
            i, f, g, o = self.gates(torch.cat([x[:, k], h], 1)).chunk(4, 1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        return self.out(h)


def convlstm():
    """``--input-shape 6,8,24,24`` (see the class's docstring)."""
    return ConvLSTM()


class Scale(nn.Module):
    def __init__(self):
        super().__init__()
        self.s = nn.Parameter(torch.tensor(1.3))

    def forward(self, x):
        return x * self.s


class FCOSHead(nn.Module):
    """FCOS-style head over 3 levels: GroupNorm towers, learned per-level Scale, exp of the
    box regression, centerness; outputs flattened and concatenated; input (N, 3, 128, 128)."""
    def __init__(self, ch=64, ncls=8):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, ch, 3, 2, 1), nn.ReLU(), nn.Conv2d(ch, ch, 3, 2, 1), nn.ReLU())
        self.downs = nn.ModuleList([nn.Conv2d(ch, ch, 3, 2, 1) for _ in range(3)])
        def tower():
            return nn.Sequential(*[m for _ in range(2) for m in (nn.Conv2d(ch, ch, 3, 1, 1), nn.GroupNorm(8, ch),
                                                                 nn.ReLU())])
        self.cls_tower, self.box_tower = tower(), tower()
        self.cls, self.box, self.ctr = nn.Conv2d(ch, ncls, 3, 1, 1), nn.Conv2d(ch, 4, 3, 1, 1), nn.Conv2d(ch, 1, 3, 1, 1)
        self.scales = nn.ModuleList([Scale() for _ in range(3)])

    def forward(self, x):
        f = self.stem(x)
        outs = []
        for d, s in zip(self.downs, self.scales):
            f = F.relu(d(f))
            ct, bt = self.cls_tower(f), self.box_tower(f)
            cls = self.cls(ct).flatten(2)
            box = torch.exp(s(self.box(bt))).flatten(2)
            ctr = self.ctr(bt).flatten(2)
            outs.append(torch.cat([cls.sigmoid(), box, ctr.sigmoid()], 1))
        return torch.cat(outs, 2).permute(0, 2, 1)


def fcos_head():
    """``--input-shape 3,128,128`` (see the class's docstring)."""
    return FCOSHead()


class SepConv(nn.Sequential):
    def __init__(self, cin, cout):
        super().__init__(nn.Conv2d(cin, cin, 3, 1, 1, groups=cin, bias=False), nn.Conv2d(cin, cout, 1, bias=False),
                         nn.BatchNorm2d(cout))


class XceptionBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, 2, bias=False), nn.BatchNorm2d(cout))
        self.body = nn.Sequential(nn.ReLU(), SepConv(cin, cout), nn.ReLU(), SepConv(cout, cout), nn.MaxPool2d(3, 2, 1))

    def forward(self, x):
        return self.body(x) + self.skip(x)


class XceptionLite(nn.Module):
    """Xception's entry flow and a few middle blocks; input (N, 3, 149, 149) (odd size)."""
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 2, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                                  nn.Conv2d(32, 64, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        self.entry = nn.Sequential(XceptionBlock(64, 128), XceptionBlock(128, 256), XceptionBlock(256, 364))
        self.middle = nn.Sequential(*[nn.Sequential(nn.ReLU(), SepConv(364, 364)) for _ in range(3)])
        self.fc = nn.Linear(364, 10)

    def forward(self, x):
        f = self.entry(self.stem(x))
        f = f + self.middle(f)
        return self.fc(F.adaptive_avg_pool2d(F.relu(f), 1).flatten(1))


def xception_lite():
    """``--input-shape 3,149,149`` (see the class's docstring; BatchNorm statistics calibrated)."""
    m = XceptionLite()
    calibrate_norms(m, (3, 149, 149))
    return m


# -- session 29: sixteen more architectures never run before ---------------------------------------
# 1. RepLKNet-like: very large depthwise kernels with a small parallel kernel
class LKBlock(nn.Module):
    def __init__(self, c, k):
        super().__init__()
        self.pre = nn.Sequential(nn.BatchNorm2d(c), nn.Conv2d(c, c, 1), nn.ReLU())
        self.large = nn.Sequential(nn.Conv2d(c, c, k, padding=k // 2, groups=c, bias=False), nn.BatchNorm2d(c))
        self.small = nn.Sequential(nn.Conv2d(c, c, 5, padding=2, groups=c, bias=False), nn.BatchNorm2d(c))
        self.post = nn.Conv2d(c, c, 1)
        self.ffn = nn.Sequential(nn.BatchNorm2d(c), nn.Conv2d(c, 4 * c, 1), nn.GELU(), nn.Conv2d(4 * c, c, 1))

    def forward(self, x):
        y = self.pre(x)
        y = F.relu(self.large(y) + self.small(y))
        x = x + self.post(y)
        return x + self.ffn(x)


class RepLK(nn.Module):
    """input (N, 3, 224, 224)"""
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 2, 1), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.Conv2d(64, 64, 3, 2, 1, groups=64), nn.ReLU())
        self.s1 = LKBlock(64, 31)
        self.down = nn.Sequential(nn.Conv2d(64, 128, 1), nn.Conv2d(128, 128, 3, 2, 1, groups=128))
        self.s2 = LKBlock(128, 29)
        self.head = nn.Linear(128, 100)

    def forward(self, x):
        x = self.s2(self.down(self.s1(self.stem(x))))
        return self.head(x.mean((2, 3)))


def replk():
    """``--input-shape 3,224,224``."""
    m = RepLK()
    calibrate_norms(m, (3, 224, 224))
    return m


# 2. MaxViT-like: MBConv, then block attention and grid attention by reshapes
class RelAttn(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.h = heads
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)

    def forward(self, x):  # (B, T, C)
        b, t, c = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.h, c // self.h).permute(2, 0, 3, 1, 4)
        a = (q @ k.transpose(-2, -1)) * (c // self.h) ** -0.5
        return self.proj((a.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c))


class MaxViTBlock(nn.Module):
    def __init__(self, c, p=7):
        super().__init__()
        self.p = p
        self.mb = nn.Sequential(nn.BatchNorm2d(c), nn.Conv2d(c, 4 * c, 1), nn.GELU(),
                                nn.Conv2d(4 * c, 4 * c, 3, 1, 1, groups=4 * c), nn.GELU(), nn.Conv2d(4 * c, c, 1))
        self.n1, self.a1 = nn.LayerNorm(c), RelAttn(c, c // 32)
        self.n2, self.a2 = nn.LayerNorm(c), RelAttn(c, c // 32)

    def forward(self, x):
        x = x + self.mb(x)
        b, c, h, w = x.shape
        p = self.p
        # block attention: windows of p x p
        y = x.permute(0, 2, 3, 1).reshape(b, h // p, p, w // p, p, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, p * p, c)
        y = y + self.a1(self.n1(y))
        # grid attention: a p x p grid of strided pixels
        y = y.reshape(b, h // p, w // p, p, p, c).permute(0, 3, 1, 4, 2, 5)  # b, p, gh, p, gw, c
        y = y.reshape(b, p, h // p, p, w // p, c).permute(0, 2, 4, 1, 3, 5).reshape(-1, p * p, c)
        y = y + self.a2(self.n2(y))
        y = y.reshape(b, h // p, w // p, p, p, c).permute(0, 3, 1, 4, 2, 5).reshape(b, h, w, c)
        return y.permute(0, 3, 1, 2)


class MaxViTLite(nn.Module):
    """input (N, 3, 224, 224)"""
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 2, 1), nn.BatchNorm2d(64), nn.GELU(), nn.Conv2d(64, 64, 3, 2, 1))
        self.b1 = MaxViTBlock(64)
        self.down = nn.Conv2d(64, 128, 2, 2)
        self.b2 = MaxViTBlock(128)
        self.head = nn.Sequential(nn.LayerNorm(128), nn.Linear(128, 100))

    def forward(self, x):
        x = self.b2(self.down(self.b1(self.stem(x))))
        return self.head(x.mean((2, 3)))


def maxvit_lite():
    """``--input-shape 3,224,224``."""
    m = MaxViTLite()
    calibrate_norms(m, (3, 224, 224))
    return m


# 3. EdgeNeXt-style cross-covariance attention (attention over channels)
class XCA(nn.Module):
    def __init__(self, c, heads=4):
        super().__init__()
        self.h = heads
        self.temperature = nn.Parameter(torch.rand(heads, 1, 1) + 0.5)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.h, c // self.h).permute(2, 0, 3, 4, 1)  # b h d n
        q = F.normalize(q, dim=-1)
        k = F.normalize(k, dim=-1)
        a = (q @ k.transpose(-2, -1)) * self.temperature
        y = (a.softmax(-1) @ v).permute(0, 3, 1, 2).reshape(b, n, c)
        return self.proj(y)


class SDTA(nn.Module):
    def __init__(self, c, scales=4):
        super().__init__()
        w = c // scales
        self.w = w
        self.convs = nn.ModuleList([nn.Conv2d(w, w, 3, 1, 1, groups=w) for _ in range(scales - 1)])
        self.norm = nn.LayerNorm(c)
        self.xca = XCA(c)
        self.gamma = nn.Parameter(torch.rand(c) * 0.5)
        self.mlp = nn.Sequential(nn.LayerNorm(c), nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c))

    def forward(self, x):
        b, c, h, w = x.shape
        parts = torch.split(x, self.w, dim=1)
        outs, sp = [], None
        for i, conv in enumerate(self.convs):
            sp = parts[i] if i == 0 else sp + parts[i]
            sp = conv(sp)
            outs.append(sp)
        outs.append(parts[-1])
        y = torch.cat(outs, 1).flatten(2).transpose(1, 2)  # b n c
        y = y + self.gamma * self.xca(self.norm(y))
        y = y + self.mlp(y)
        return y.transpose(1, 2).reshape(b, c, h, w)


class EdgeNeXtLite(nn.Module):
    """input (N, 3, 224, 224)"""
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 48, 4, 4), nn.GroupNorm(1, 48))
        self.conv = nn.Sequential(nn.Conv2d(48, 48, 7, 1, 3, groups=48), nn.Conv2d(48, 96, 1), nn.GELU(),
                                  nn.Conv2d(96, 96, 2, 2))
        self.sdta = SDTA(96)
        self.head = nn.Linear(96, 100)

    def forward(self, x):
        return self.head(self.sdta(self.conv(self.stem(x))).mean((2, 3)))


def edgenext_lite():
    """``--input-shape 3,224,224``."""
    return EdgeNeXtLite()


# 4. Mixture of experts with top-2 gating (computed densely, combined by scattered gates)
class MoE(nn.Module):
    def __init__(self, c, experts=8, hidden=256):
        super().__init__()
        self.gate = nn.Linear(c, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, c, hidden) / math.sqrt(c))
        self.w2 = nn.Parameter(torch.randn(experts, hidden, c) / math.sqrt(hidden))

    def forward(self, x):  # (B, T, C)
        logits = self.gate(x)
        val, idx = torch.topk(logits, 2, dim=-1)
        gates = torch.zeros_like(logits).scatter(-1, idx, F.softmax(val, dim=-1))
        h = F.silu(torch.einsum("btc,ech->bteh", x, self.w1))
        y = torch.einsum("bteh,ehc->btec", h, self.w2)
        return (y * gates.unsqueeze(-1)).sum(2)


class MoETransformer(nn.Module):
    """input (N, 64, 128)"""
    def __init__(self, c=128):
        super().__init__()
        self.n1 = nn.LayerNorm(c)
        self.attn = nn.MultiheadAttention(c, 4, batch_first=True)
        self.n2 = nn.LayerNorm(c)
        self.moe = MoE(c)
        self.out = nn.Linear(c, 10)

    def forward(self, x):
        y = self.n1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        x = x + self.moe(self.n2(x))
        return self.out(x.mean(1))


def moe_top2():
    """``--input-shape 64,128``."""
    return MoETransformer()


# 5. DGCNN: k-nearest-neighbour graph from pairwise distances, EdgeConv with a max over neighbours
def knn(x, k):  # x (B, C, N)
    inner = -2 * torch.matmul(x.transpose(2, 1), x)
    xx = torch.sum(x ** 2, dim=1, keepdim=True)
    pd = -xx - inner - xx.transpose(2, 1)
    return pd.topk(k=k, dim=-1)[1]  # (B, N, k)


def edge_features(x, k):
    b, c, n = x.shape
    idx = knn(x, k)
    base = torch.arange(0, b).view(-1, 1, 1) * n
    idx = (idx + base).view(-1)
    xt = x.transpose(2, 1).contiguous()  # b n c
    feat = xt.view(b * n, -1)[idx, :].view(b, n, k, c)
    xt = xt.view(b, n, 1, c).repeat(1, 1, k, 1)
    return torch.cat((feat - xt, xt), dim=3).permute(0, 3, 1, 2).contiguous()


class DGCNN(nn.Module):
    """input (N, 3, 512)"""
    def __init__(self, k=16):
        super().__init__()
        self.k = k
        self.c1 = nn.Sequential(nn.Conv2d(6, 64, 1, bias=False), nn.BatchNorm2d(64), nn.LeakyReLU(0.2))
        self.c2 = nn.Sequential(nn.Conv2d(128, 64, 1, bias=False), nn.BatchNorm2d(64), nn.LeakyReLU(0.2))
        self.c3 = nn.Sequential(nn.Conv1d(128, 256, 1, bias=False), nn.BatchNorm1d(256), nn.LeakyReLU(0.2))
        self.fc = nn.Linear(512, 40)

    def forward(self, x):
        x1 = self.c1(edge_features(x, self.k)).max(dim=-1, keepdim=False)[0]
        x2 = self.c2(edge_features(x1, self.k)).max(dim=-1, keepdim=False)[0]
        x = self.c3(torch.cat((x1, x2), dim=1))
        x = torch.cat((F.adaptive_max_pool1d(x, 1).view(x.size(0), -1), F.adaptive_avg_pool1d(x, 1).view(x.size(0), -1)), 1)
        return self.fc(x)


def dgcnn():
    """``--input-shape 3,512``."""
    m = DGCNN()
    calibrate_norms(m, (3, 512))
    return m


# 6. PixelCNN: masked convolutions (the mask applied to the weight in forward), gated
class MaskedConv(nn.Conv2d):
    def __init__(self, mask_type, *args, **kw):
        super().__init__(*args, **kw)
        kh, kw_ = self.weight.shape[2:]
        mask = torch.ones_like(self.weight)
        mask[:, :, kh // 2, kw_ // 2 + (mask_type == "B"):] = 0
        mask[:, :, kh // 2 + 1:] = 0
        self.register_buffer("mask", mask)

    def forward(self, x):
        return F.conv2d(x, self.weight * self.mask, self.bias, self.stride, self.padding)


class PixelCNN(nn.Module):
    """input (N, 1, 28, 28)"""
    def __init__(self, c=64, layers=6):
        super().__init__()
        self.inp = MaskedConv("A", 1, 2 * c, 7, padding=3)
        self.layers = nn.ModuleList([MaskedConv("B", c, 2 * c, 3, padding=1) for _ in range(layers)])
        self.out = nn.Conv2d(c, 256, 1)

    def forward(self, x):
        a, g = self.inp(x).chunk(2, 1)
        h = torch.tanh(a) * torch.sigmoid(g)
        for layer in self.layers:
            a, g = layer(h).chunk(2, 1)
            h = h + torch.tanh(a) * torch.sigmoid(g)
        return F.log_softmax(self.out(h), dim=1)


def pixelcnn():
    """``--input-shape 1,28,28``."""
    return PixelCNN()


# 7. sparsemax attention (sort, cumsum, arange, comparisons, gather)
def sparsemax(z, dim=-1):
    zs, _ = torch.sort(z, dim=dim, descending=True)
    n = z.shape[dim]
    rng = torch.arange(1, n + 1, dtype=z.dtype).view(1, 1, 1, -1)
    cs = zs.cumsum(dim)
    support = (1 + rng * zs) > cs
    k = support.sum(dim=dim, keepdim=True)
    tau = (cs.gather(dim, k - 1) - 1) / k.to(z.dtype)
    return torch.clamp(z - tau, min=0)


class SparsemaxAttn(nn.Module):
    """input (N, 48, 64)"""
    def __init__(self, c=64, heads=4):
        super().__init__()
        self.h = heads
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.out = nn.Linear(c, 5)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.h, c // self.h).permute(2, 0, 3, 1, 4)
        a = sparsemax((q @ k.transpose(-2, -1)) / math.sqrt(c // self.h))
        y = self.proj((a @ v).transpose(1, 2).reshape(b, t, c))
        return self.out((x + y).mean(1))


def sparsemax_attn():
    """``--input-shape 48,64``."""
    return SparsemaxAttn()


# 8. Mamba-2 style SSD: selective state space in its quadratic (masked) form
def segsum(x):  # x (..., T) -> (..., T, T): sum of x over (j, i], -inf above the diagonal
    t = x.shape[-1]
    cs = torch.cumsum(x, dim=-1)
    d = cs[..., :, None] - cs[..., None, :]
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
    return d.masked_fill(~mask, -torch.inf)


class SSD(nn.Module):
    def __init__(self, c=128, heads=4, state=16):
        super().__init__()
        self.h, self.n = heads, state
        self.inp = nn.Linear(c, 2 * c + 2 * state + heads)
        self.conv = nn.Conv1d(c, c, 4, padding=3, groups=c)
        self.A_log = nn.Parameter(torch.log(torch.rand(heads) * 4 + 1))
        self.D = nn.Parameter(torch.ones(heads))
        self.norm = nn.LayerNorm(c)
        self.out = nn.Linear(c, c)

    def forward(self, u):  # (B, T, C)
        b, t, c = u.shape
        z, x, B, C, dt = torch.split(self.inp(u), [c, c, self.n, self.n, self.h], dim=-1)
        x = F.silu(self.conv(x.transpose(1, 2))[..., :t].transpose(1, 2))
        dt = F.softplus(dt)  # (B, T, H)
        A = -torch.exp(self.A_log)  # (H)
        xh = x.reshape(b, t, self.h, c // self.h)
        L = torch.exp(segsum((dt * A).transpose(1, 2)))  # (B, H, T, T)
        scores = torch.einsum("bln,bsn->bls", C, B)  # (B, T, T)
        y = torch.einsum("bls,bhls,bsh,bshp->blhp", scores, L, dt, xh)
        y = y + xh * self.D[:, None]
        y = y.reshape(b, t, c) * F.silu(z)
        return self.out(self.norm(y))


class MambaLite(nn.Module):
    """input (N, 64, 128)"""
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([SSD() for _ in range(2)])
        self.head = nn.Linear(128, 10)

    def forward(self, x):
        for blk in self.blocks:
            x = x + blk(x)
        return self.head(x[:, -1])


def mamba_lite():
    """``--input-shape 64,128``."""
    return MambaLite()


# 9. AdaIN style transfer: two inputs, instance statistics by mean / var
def adain(c, s, eps=1e-5):
    cm, cv = c.mean((2, 3), keepdim=True), c.var((2, 3), keepdim=True)
    sm, sv = s.mean((2, 3), keepdim=True), s.var((2, 3), keepdim=True)
    return (c - cm) / torch.sqrt(cv + eps) * torch.sqrt(sv + eps) + sm


class AdaINNet(nn.Module):
    """inputs (N, 3, 128, 128) twice: content and style"""
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1), nn.ReLU(), nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU(),
                                 nn.Conv2d(64, 128, 3, 2, 1), nn.ReLU())
        self.dec = nn.Sequential(nn.Conv2d(128, 64, 3, 1, 1), nn.ReLU(), nn.Upsample(scale_factor=2),
                                 nn.ReflectionPad2d(1), nn.Conv2d(64, 32, 3), nn.ReLU(), nn.Upsample(scale_factor=2),
                                 nn.Conv2d(32, 3, 3, 1, 1))

    def forward(self, content, style):
        return self.dec(adain(self.enc(content), self.enc(style)))


def adain_net():
    """``--input-shape "3,128,128;3,128,128"``."""
    return AdaINNet()


# 10. CBAM on a ResNet-ish stem: channel attention (avg and max), spatial attention (mean and max)
class CBAM(nn.Module):
    def __init__(self, c, r=8):
        super().__init__()
        self.mlp = nn.Sequential(nn.Conv2d(c, c // r, 1), nn.ReLU(), nn.Conv2d(c // r, c, 1))
        self.spatial = nn.Conv2d(2, 1, 7, padding=3)

    def forward(self, x):
        ca = torch.sigmoid(self.mlp(F.adaptive_avg_pool2d(x, 1)) + self.mlp(F.adaptive_max_pool2d(x, 1)))
        x = x * ca
        s = torch.cat([x.mean(1, keepdim=True), x.max(1, keepdim=True)[0]], 1)
        return x * torch.sigmoid(self.spatial(s))


class CBAMNet(nn.Module):
    """input (N, 3, 224, 224)"""
    def __init__(self):
        super().__init__()
        layers = [nn.Conv2d(3, 64, 7, 2, 3), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
        c = 64
        for co in (64, 128, 256):
            layers += [nn.Conv2d(c, co, 3, 1 if co == 64 else 2, 1), nn.BatchNorm2d(co), nn.ReLU(),
                       nn.Conv2d(co, co, 3, 1, 1), nn.BatchNorm2d(co), nn.ReLU(), CBAM(co)]
            c = co
        self.body = nn.Sequential(*layers)
        self.fc = nn.Linear(c, 100)

    def forward(self, x):
        return self.fc(self.body(x).mean((2, 3)))


def cbam_net():
    """``--input-shape 3,224,224``."""
    m = CBAMNet()
    calibrate_norms(m, (3, 224, 224))
    return m


# 11. Stable-Diffusion-style VAE decoder piece: GroupNorm(32) + SiLU res blocks, a spatial
# self-attention mid block with baddbmm, nearest up-sampling
class ResnetBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(32, cin, eps=1e-6), nn.Conv2d(cin, cout, 3, 1, 1)
        self.n2, self.c2 = nn.GroupNorm(32, cout, eps=1e-6), nn.Conv2d(cout, cout, 3, 1, 1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x):
        h = self.c1(F.silu(self.n1(x)))
        h = self.c2(F.silu(self.n2(h)))
        return self.skip(x) + h


class AttnBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm = nn.GroupNorm(32, c, eps=1e-6)
        self.q, self.k, self.v, self.o = (nn.Conv2d(c, c, 1) for _ in range(4))

    def forward(self, x):
        b, c, h, w = x.shape
        y = self.norm(x)
        q = self.q(y).reshape(b, c, h * w).permute(0, 2, 1)
        k = self.k(y).reshape(b, c, h * w)
        v = self.v(y).reshape(b, c, h * w)
        empty = torch.empty(b, h * w, h * w, dtype=q.dtype)
        a = torch.baddbmm(empty, q, k, beta=0, alpha=1 / math.sqrt(c)).softmax(-1)
        y = torch.bmm(v, a.permute(0, 2, 1)).reshape(b, c, h, w)
        return x + self.o(y)


class VAEDecoder(nn.Module):
    """input (N, 4, 16, 16) latents"""
    def __init__(self):
        super().__init__()
        self.conv_in = nn.Conv2d(4, 128, 3, 1, 1)
        self.mid = nn.Sequential(ResnetBlock(128, 128), AttnBlock(128), ResnetBlock(128, 128))
        self.up1 = nn.Sequential(ResnetBlock(128, 128), nn.Upsample(scale_factor=2.0, mode="nearest"),
                                 nn.Conv2d(128, 128, 3, 1, 1))
        self.up2 = nn.Sequential(ResnetBlock(128, 64), nn.Upsample(scale_factor=2.0, mode="nearest"),
                                 nn.Conv2d(64, 64, 3, 1, 1))
        self.out = nn.Sequential(nn.GroupNorm(32, 64, eps=1e-6), nn.SiLU(), nn.Conv2d(64, 3, 3, 1, 1))

    def forward(self, z):
        return self.out(self.up2(self.up1(self.mid(self.conv_in(z / 0.18215)))))


def vae_decoder():
    """``--input-shape 4,16,16``."""
    return VAEDecoder()


# 12. Swin-V2 style attention: continuous position bias from a log-spaced coordinate table through
# an MLP (16 * sigmoid), cosine attention with a clamped, exponentiated logit scale
class CPBAttention(nn.Module):
    def __init__(self, c=96, heads=3, win=8):
        super().__init__()
        self.h, self.win = heads, win
        self.logit_scale = nn.Parameter(torch.log(10 * torch.ones(heads, 1, 1)))
        self.cpb = nn.Sequential(nn.Linear(2, 128), nn.ReLU(), nn.Linear(128, heads, bias=False))
        r = torch.arange(-(win - 1), win, dtype=torch.float32)
        table = torch.stack(torch.meshgrid(r, r, indexing="ij")).permute(1, 2, 0).unsqueeze(0) / (win - 1) * 8
        table = torch.sign(table) * torch.log2(table.abs() + 1.0) / math.log2(8)
        self.register_buffer("table", table)
        coords = torch.stack(torch.meshgrid(torch.arange(win), torch.arange(win), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (win - 1)
        self.register_buffer("index", (rel[..., 0] * (2 * win - 1) + rel[..., 1]).flatten())
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)

    def forward(self, x):  # (B*, T, C) windows
        b, t, c = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.h, c // self.h).permute(2, 0, 3, 1, 4)
        a = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        a = a * torch.clamp(self.logit_scale, max=math.log(100.0)).exp()
        bias = self.cpb(self.table).view(-1, self.h)[self.index].view(t, t, -1).permute(2, 0, 1)
        a = a + 16 * torch.sigmoid(bias).unsqueeze(0)
        return self.proj((a.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c))


class SwinV2Lite(nn.Module):
    """input (N, 3, 128, 128)"""
    def __init__(self):
        super().__init__()
        self.embed = nn.Conv2d(3, 96, 4, 4)
        self.blocks = nn.ModuleList([CPBAttention() for _ in range(2)])
        self.norms = nn.ModuleList([nn.LayerNorm(96) for _ in range(2)])
        self.head = nn.Linear(96, 10)

    def forward(self, x):
        x = self.embed(x)  # b, 96, 32, 32
        b, c, h, w = x.shape
        win = 8
        t = x.view(b, c, h // win, win, w // win, win).permute(0, 2, 4, 3, 5, 1).reshape(-1, win * win, c)
        for blk, norm in zip(self.blocks, self.norms):
            t = t + norm(blk(t))  # post-norm, as Swin-V2
        return self.head(t.reshape(b, -1, c).mean(1))


def swinv2_lite():
    """``--input-shape 3,128,128``."""
    return SwinV2Lite()


# 13. YOLOX-style decoupled head with the decoding in forward (a grid from arange/meshgrid)
class YOLOXHead(nn.Module):
    """input (N, 3, 160, 160)"""
    def __init__(self, nc=20):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), nn.SiLU(), nn.Conv2d(32, 64, 3, 2, 1), nn.SiLU(),
                                      nn.Conv2d(64, 64, 3, 2, 1), nn.SiLU())
        self.stem = nn.Conv2d(64, 64, 1)
        self.cls = nn.Sequential(nn.Conv2d(64, 64, 3, 1, 1), nn.SiLU(), nn.Conv2d(64, nc, 1))
        self.reg = nn.Sequential(nn.Conv2d(64, 64, 3, 1, 1), nn.SiLU())
        self.box, self.obj = nn.Conv2d(64, 4, 1), nn.Conv2d(64, 1, 1)
        self.stride = 8

    def forward(self, x):
        f = self.stem(self.backbone(x))
        r = self.reg(f)
        out = torch.cat([self.box(r), self.obj(r).sigmoid(), self.cls(f).sigmoid()], 1)
        b, c, h, w = out.shape
        out = out.flatten(2).permute(0, 2, 1)  # b, hw, c
        yv, xv = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        grid = torch.stack((xv, yv), 2).view(1, -1, 2).to(out.dtype)
        xy = (out[..., :2] + grid) * self.stride
        wh = torch.exp(out[..., 2:4]) * self.stride
        return torch.cat([xy, wh, out[..., 4:]], -1)


def yolox_head():
    """``--input-shape 3,160,160``."""
    return YOLOXHead()


# 14. U-Net on an odd input size: each decoder stage up-samples to its skip's size (F.interpolate
# with size= taken from a tensor's shape)
class OddUNet(nn.Module):
    """input (N, 3, 97, 131)"""
    def __init__(self):
        super().__init__()
        self.e1 = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1), nn.ReLU())
        self.e2 = nn.Sequential(nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU())
        self.e3 = nn.Sequential(nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU())
        self.d2 = nn.Sequential(nn.Conv2d(96, 32, 3, 1, 1), nn.ReLU())
        self.d1 = nn.Sequential(nn.Conv2d(48, 16, 3, 1, 1), nn.ReLU())
        self.out = nn.Conv2d(16, 2, 1)

    def forward(self, x):
        a = self.e1(x)
        b = self.e2(a)
        c = self.e3(b)
        u = F.interpolate(c, size=b.shape[-2:], mode="bilinear", align_corners=False)
        u = self.d2(torch.cat([u, b], 1))
        u = F.interpolate(u, size=a.shape[-2:], mode="bilinear", align_corners=True)
        return self.out(self.d1(torch.cat([u, a], 1)))


def odd_unet():
    """``--input-shape 3,97,131``."""
    return OddUNet()


# 15. sequence-first nn.TransformerEncoder (batch_first=False), norm_first, GELU
class SeqFirst(nn.Module):
    """input (N, 40, 64): transposed to (40, N, 64) inside"""
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, activation="gelu", norm_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.out = nn.Linear(64, 5)

    def forward(self, x):
        y = self.enc(x.transpose(0, 1))  # (T, N, C)
        return self.out(y[-1])


def seq_first():
    """``--input-shape 40,64``."""
    return SeqFirst()


# 16. miscellaneous elementwise and scan ops: flip, cumprod, clamp_min, floor_divide, remainder,
# round, chunk/stack, logsumexp, amax, where
class MiscOps(nn.Module):
    """input (N, 16, 32)"""
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 32)

    def forward(self, x):
        y = self.lin(x)
        a, b = torch.chunk(y, 2, dim=-1)
        s = torch.stack([a, torch.flip(b, dims=[1])], 0).sum(0)
        p = torch.cumprod(torch.sigmoid(s) + 0.5, dim=1)
        q = torch.clamp_min(p, 0.75) + torch.remainder(s * 3, 2.0) - torch.floor_divide(s * 4, 3)
        r = torch.round(q * 10) / 10
        lse = torch.logsumexp(y, dim=-1, keepdim=True)
        m = torch.amax(y, dim=1, keepdim=True)
        return torch.where(r > 1, r, lse) + m[..., :16]


def misc_ops():
    """``--input-shape 16,32``."""
    return MiscOps()
