"""Transformers: ViT-B/32 (torchvision layout, nn.MultiheadAttention), ViT-Tiny/16 (timm layout,
attention written out with matmul/softmax) and a tiny decoder-only language model (nn.Embedding,
nn.RMSNorm, causal F.scaled_dot_product_attention, SiLU-gated MLP).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import INPUT_SEED, ModelSpec, builder, image_inputs

# ---------------------------------------------------------------------------------------------
# ViT-B/32, torchvision.models.vision_transformer layout


class MLPBlock(nn.Sequential):
    def __init__(self, dim, mlp_dim, dropout=0.0):
        super().__init__(
            nn.Linear(dim, mlp_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(mlp_dim, dim),
            nn.Dropout(dropout),
        )


class EncoderBlock(nn.Module):
    def __init__(self, num_heads, hidden_dim, mlp_dim):
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden_dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(hidden_dim, num_heads, batch_first=True)
        self.dropout = nn.Dropout(0.0)
        self.ln_2 = nn.LayerNorm(hidden_dim, eps=1e-6)
        self.mlp = MLPBlock(hidden_dim, mlp_dim)

    def forward(self, input):
        x = self.ln_1(input)
        x, _ = self.self_attention(x, x, x, need_weights=False)
        x = self.dropout(x)
        x = x + input
        y = self.ln_2(x)
        y = self.mlp(y)
        return x + y


class Encoder(nn.Module):
    def __init__(self, seq_length, num_layers, num_heads, hidden_dim, mlp_dim):
        super().__init__()
        self.pos_embedding = nn.Parameter(torch.empty(1, seq_length, hidden_dim).normal_(std=0.02))
        self.dropout = nn.Dropout(0.0)
        self.layers = nn.Sequential(
            *[EncoderBlock(num_heads, hidden_dim, mlp_dim) for _ in range(num_layers)]
        )
        self.ln = nn.LayerNorm(hidden_dim, eps=1e-6)

    def forward(self, input):
        input = input + self.pos_embedding
        return self.ln(self.layers(self.dropout(input)))


class VisionTransformer(nn.Module):
    """torchvision's VisionTransformer (conv_proj patchify, class token, encoder, heads.head)."""

    def __init__(
        self,
        image_size=224,
        patch_size=32,
        num_layers=12,
        num_heads=12,
        hidden_dim=768,
        mlp_dim=3072,
        num_classes=1000,
    ):
        super().__init__()
        self.image_size = image_size
        self.patch_size = patch_size
        self.hidden_dim = hidden_dim
        self.conv_proj = nn.Conv2d(3, hidden_dim, kernel_size=patch_size, stride=patch_size)
        seq_length = (image_size // patch_size) ** 2 + 1
        # torchvision initialises the class token with zeros; random makes a better test
        self.class_token = nn.Parameter(torch.randn(1, 1, hidden_dim) * 0.02)
        self.encoder = Encoder(seq_length, num_layers, num_heads, hidden_dim, mlp_dim)
        self.heads = nn.Sequential()
        self.heads.add_module("head", nn.Linear(hidden_dim, num_classes))

    def _process_input(self, x):
        n, c, h, w = x.shape
        p = self.patch_size
        n_h, n_w = h // p, w // p
        x = self.conv_proj(x)
        x = x.reshape(n, self.hidden_dim, n_h * n_w)
        return x.permute(0, 2, 1)

    def forward(self, x):
        x = self._process_input(x)
        n = x.shape[0]
        batch_class_token = self.class_token.expand(n, -1, -1)
        x = torch.cat([batch_class_token, x], dim=1)
        x = self.encoder(x)
        x = x[:, 0]
        return self.heads(x)


# ---------------------------------------------------------------------------------------------
# ViT-Tiny/16, timm layout (qkv Linear, explicit attention)


class Attention(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q = q * self.scale
        attn = q @ k.transpose(-2, -1)
        attn = attn.softmax(dim=-1)
        x = attn @ v
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=4.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, patch_size=16, in_chans=3, embed_dim=192):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x):
        x = self.proj(x)  # B C H W
        return x.flatten(2).transpose(1, 2)  # B N C


class ViTTiny(nn.Module):
    """timm vit_tiny_patch16_224: width 192, depth 12, 3 heads; cls_token and pos_embed are
    nn.Parameter (exported by pnnx as pnnx.Attribute)."""

    def __init__(
        self, img_size=224, patch_size=16, embed_dim=192, depth=12, num_heads=3, num_classes=1000
    ):
        super().__init__()
        self.patch_embed = PatchEmbed(patch_size, 3, embed_dim)
        num_patches = (img_size // patch_size) ** 2
        self.cls_token = nn.Parameter(torch.randn(1, 1, embed_dim) * 0.02)
        self.pos_embed = nn.Parameter(torch.randn(1, num_patches + 1, embed_dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(embed_dim, num_heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward(self, x):
        x = self.patch_embed(x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = x + self.pos_embed
        x = self.blocks(x)
        x = self.norm(x)
        return self.head(x[:, 0])


# ---------------------------------------------------------------------------------------------
# tiny decoder-only LM (Llama-style block)


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.wo(y)


class GatedMLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class DecoderBlock(nn.Module):
    def __init__(self, dim, n_heads, hidden):
        super().__init__()
        self.attention_norm = nn.RMSNorm(dim, eps=1e-5)
        self.attention = CausalSelfAttention(dim, n_heads)
        self.ffn_norm = nn.RMSNorm(dim, eps=1e-5)
        self.feed_forward = GatedMLP(dim, hidden)

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class TinyDecoder(nn.Module):
    """Token embedding + learned position embedding, RMSNorm pre-norm blocks, causal SDPA,
    SiLU-gated MLP, final RMSNorm and an untied LM head; input (B, T) int64 token ids."""

    def __init__(self, vocab=512, dim=64, n_layers=3, n_heads=4, hidden=176, max_seq=32):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.pos_embeddings = nn.Parameter(torch.randn(1, max_seq, dim) * 0.02)
        self.layers = nn.Sequential(*[DecoderBlock(dim, n_heads, hidden) for _ in range(n_layers)])
        self.norm = nn.RMSNorm(dim, eps=1e-5)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens) + self.pos_embeddings[:, : tokens.shape[1]]
        h = self.layers(h)
        return self.output(self.norm(h))


LM_VOCAB = 512
LM_SEQ = 16


def _tokens(batch: int):
    g = torch.Generator().manual_seed(INPUT_SEED + 11 + batch)
    return (torch.randint(0, LM_VOCAB, (batch, LM_SEQ), generator=g, dtype=torch.int64),)


_img224 = image_inputs(3, 224, 224)

MODELS = {
    s.name: s
    for s in [
        ModelSpec(
            "vit_tiny",
            builder(ViTTiny),
            _img224,
            description="ViT-Tiny/16 (timm layout): cls_token/pos_embed parameters, explicit attention",
        ),
        ModelSpec(
            "tiny_decoder",
            builder(TinyDecoder, vocab=LM_VOCAB),
            _tokens,
            description=f"3-block decoder-only LM: Embedding, RMSNorm, causal SDPA, SiLU-gated MLP; (B,{LM_SEQ}) int64",
        ),
        ModelSpec(
            "vit_b_32",
            builder(VisionTransformer),
            _img224,
            dynamic_batch=2,
            description="ViT-B/32 (torchvision layout, nn.MultiheadAttention), 88M parameters; for benchmarks",
            slow=True,
            tags=("benchmark",),
        ),
    ]
}
