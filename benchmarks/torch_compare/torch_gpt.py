"""shardkit's GPT (runtime/nn/gpt.cc) in PyTorch, for the comparisons beside it.

Importing this file does not import torch: the table and the FLOP count are
plain Python (the drivers run without torch); build_gpt() imports it.

The architecture, as runtime/nn/gpt.cc and transformer.cc build it:
  - token embedding wte [V, C] and learned positions wpe [max_seq, C], added;
  - n_layer pre-LN blocks: x + proj(attn(ln(x))), x + proj(gelu(fc(ln(x)))),
    one fused qkv Linear (C -> 3C), causal multi-head attention scaled by
    1/sqrt(head_dim), GELU in GPT-2's tanh approximation, d_ff = 4C, biases
    on every Linear and LayerNorm (eps 1e-5);
  - a final LayerNorm and an untied LM head [C, V] without bias;
  - initialisation: Linear weights and embeddings N(0, 0.02), the two
    output projections N(0, 0.02 / sqrt(2 n_layer)), biases 0, LN gains 1.
The parameter counts must agree with sk_model_num_parameters: the tools
check that at run time, so a drift between this file and configs.cc fails
loudly.
"""

# The named configs of runtime/nn/configs.cc these tools know:
# (vocab, max sequence, layers, heads, d_model); d_ff = 4 d_model.
MODELS = {
    "gpt-tiny": (64, 16, 2, 2, 32),
    "gpt-1m": (256, 128, 4, 4, 128),
    "gpt-10m": (1024, 256, 6, 6, 384),
    "gpt-deep-20m": (1024, 128, 24, 8, 256),
    "gpt-150m": (32768, 512, 14, 12, 768),
    "gpt-1.3b": (50257, 1024, 24, 16, 2048),
}


def num_parameters(model):
    """The parameter count of the table's shapes (what build_gpt builds)."""
    v, t, layers, _, c = MODELS[model]
    block = 2 * (2 * c) + (3 * c * c + 3 * c) + (c * c + c) + (4 * c * c + 4 * c) + (4 * c * c + c)
    return v * c + t * c + layers * block + 2 * c + c * v


def model_flops(model, batch, seq):
    """Model FLOPs of one training step, GptModel::Flops's formula: 3x the
    forward's matmuls (forward 2 flops per multiply-add, backward twice
    that), i.e. 6 per matmul parameter per token (qkv, attention output, fc,
    MLP output, LM head; embeddings and norms are not matmuls) plus the
    attention products QK^T and PV, 12 L T C per token over forward and
    backward, causal masking not discounted. No recomputation."""
    v, _, layers, _, c = MODELS[model]
    n = batch * seq
    block_fwd = 2.0 * n * c * 4.0 * c + 2.0 * 2.0 * n * seq * c + 2.0 * n * c * 4.0 * c * 2.0
    head_fwd = 2.0 * n * c * v
    return 3.0 * (layers * block_fwd + head_fwd)


def build_gpt(model, device="cpu"):
    """An nn.Module GPT of the named config on `device` (use "meta" to shard
    it before allocating): module(idx [B, T] int64, targets [B, T]) -> mean
    cross-entropy. Its `blocks` (an nn.ModuleList) are the FSDP units; the
    root keeps the embeddings, the final LayerNorm and the head. init_weights()
    (re)initialises every parameter in place with shardkit's initialisers."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    vocab, max_seq, layers, heads, d = MODELS[model]

    class Block(nn.Module):
        """Pre-LN block: x + proj(attn(ln(x))), x + proj(gelu(fc(ln(x))))."""

        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(d, eps=1e-5)
            self.qkv = nn.Linear(d, 3 * d)
            self.attn_proj = nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d, eps=1e-5)
            self.fc = nn.Linear(d, 4 * d)
            self.mlp_proj = nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.attn_proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, d)
            self.wpe = nn.Embedding(max_seq, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(d, eps=1e-5)
            self.lm_head = nn.Linear(d, vocab, bias=False)

        @torch.no_grad()
        def init_weights(self):  # shardkit's initialisers
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif p.dim() == 1:
                    nn.init.ones_(p)
                else:
                    std = 0.02 / (2 * layers) ** 0.5 if "proj.weight" in name else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx, targets):
            t = idx.shape[1]
            x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
            for blk in self.blocks:
                x = blk(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))

    with torch.device(device):
        m = Gpt()
    if device != "meta":
        m.init_weights()
    return m
