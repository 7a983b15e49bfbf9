#!/usr/bin/env python3
"""Writes examples/data/finetune/: a tiny Llama, a JSONL fine-tuning set and
what transformers + torch.optim.AdamW make of it, step by step.

Run by hand (never by a build or test: they read the committed files):

  /work/venv/bin/python tools/hf_fixtures/make_finetune_fixture.py [OUT_DIR]

Written:
  llama/                      save_pretrained of a tiny LlamaForCausalLM (2 layers,
                              hidden 32, 4 heads over 2 kv heads, untied head, vocab 64,
                              bos 1, eos 2), f32, library init + N(0, 0.02) noise
  train.jsonl, eval.jsonl     {"input_ids": [bos, prompt..., response..., eos],
                              "labels": [-100 for bos and prompt, then the ids]}: 16
                              and 4 records; the response is the prompt's first five
                              tokens reversed, so the model can learn it
  reference.json              the run's settings, the loss of every step and the
                              eval loss before and after
  reference.txt               the same losses as the examples print them ("eval before
                              loss X", "step N loss X", "eval after loss X")
  reference_final.safetensors the weights after the last step (transformers' names)

The run is what examples/*/finetune do on 2 ranks (docs/finetune.md):
sequence length 16, 2 rows per rank per step (global batch G = 4), the dataset
read in file order (sequential, no shuffle), so step t takes records
[4t, 4t + 4) mod 16; AdamW (lr 5e-3, betas 0.9/0.999, eps 1e-8, weight decay
0.01 on every parameter), warmup 2 steps then cosine over 6 to 5e-4, the
gradient clipped to norm 1, 8 steps (2 epochs).

The loss of a step is the mean cross-entropy over every trained target token
of the global batch (labels shifted by one inside the model, -100 ignored:
transformers' own loss with the sum taken over the whole batch), which is
what shardkit's step computes (docs/batches.md). Every record here has
exactly six trained targets (five response tokens and the EOS), so every
rank holds the same count and the per-rank mean shardkit took before that
normalisation landed gives the same number.
The eval loss is the mean over every trained target of eval.jsonl.
"""
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, BOS, EOS = 64, 1, 2
SEQ = 16
RANKS, ROWS = 2, 2
G = RANKS * ROWS
STEPS = 8
LR, MIN_LR, WARMUP, DECAY = 5e-3, 5e-4, 2, 6
BETAS, EPS, WD, CLIP = (0.9, 0.999), 1e-8, 0.01, 1.0
RESPONSE = 5


def records(n, gen):
    out = []
    for _ in range(n):
        plen = int(torch.randint(RESPONSE, 11, (1,), generator=gen))  # 5..10 prompt tokens
        prompt = torch.randint(3, VOCAB, (plen,), generator=gen).tolist()
        response = list(reversed(prompt[:RESPONSE]))
        ids = [BOS] + prompt + response + [EOS]
        labels = [-100] * (1 + plen) + response + [EOS]
        assert len(ids) <= SEQ + 1
        out.append({"input_ids": ids, "labels": labels})
    return out


def lr_at(s):
    if s < WARMUP:
        return LR * (s + 1) / WARMUP
    p = min(1.0, (s - WARMUP) / DECAY)
    return MIN_LR + (LR - MIN_LR) * (1 + math.cos(math.pi * p)) / 2


def loss_sum(model, recs):
    """(sum of the trained targets' cross-entropy, their count)."""
    total, count = None, 0
    for r in recs:
        ids = torch.tensor([r["input_ids"]])  # at most SEQ + 1: a row holds them all
        labels = torch.tensor(r["labels"])
        shift_logits = model(input_ids=ids).logits[0, :-1]  # causal: the last token's logits are unused
        shift_labels = labels[1:]
        s = torch.nn.functional.cross_entropy(shift_logits, shift_labels, ignore_index=-100, reduction="sum")
        total = s if total is None else total + s
        count += int((shift_labels != -100).sum())
    return total, count


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "examples", "data", "finetune")
    os.makedirs(out, exist_ok=True)
    torch.use_deterministic_algorithms(True)

    torch.manual_seed(43)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                                         tie_word_embeddings=False, attention_bias=False,
                                         bos_token_id=BOS, eos_token_id=EOS, pad_token_id=0,
                                         attn_implementation="eager"))
    g = torch.Generator().manual_seed(44)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    model.eval()  # no dropout; gradients still flow
    model.save_pretrained(os.path.join(out, "llama"), safe_serialization=True)

    gen = torch.Generator().manual_seed(45)
    train, held_out = records(16, gen), records(4, gen)
    for name, recs in (("train.jsonl", train), ("eval.jsonl", held_out)):
        with open(os.path.join(out, name), "w") as f:
            for r in recs:
                f.write(json.dumps(r, separators=(", ", ": ")) + "\n")

    def evaluate():
        with torch.no_grad():
            s, n = loss_sum(model, held_out)
        return float(s) / n

    eval_before = evaluate()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    losses, lrs, norms = [], [], []
    for t in range(STEPS):
        batch = [train[(t * G + i) % len(train)] for i in range(G)]
        for group in opt.param_groups:
            group["lr"] = lr_at(t)
        opt.zero_grad()
        s, n = loss_sum(model, batch)
        loss = s / n
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        losses.append(loss.item())
        lrs.append(lr_at(t))
        norms.append(norm.item())
        print(f"step {t + 1} loss {loss.item():.6f} grad_norm {norm.item():.6f} lr {lr_at(t):.6g}")
    eval_after = evaluate()
    print(f"eval before {eval_before:.6f} after {eval_after:.6f}")

    save_file({n: p.detach().contiguous() for n, p in model.named_parameters()},
              os.path.join(out, "reference_final.safetensors"),
              metadata={"transformers": transformers.__version__, "torch": torch.__version__})
    ref = {
        "transformers": transformers.__version__, "torch": torch.__version__,
        "seq_len": SEQ, "ranks": RANKS, "rows_per_rank": ROWS, "steps": STEPS, "sequential": True,
        "lr": LR, "min_lr": MIN_LR, "warmup_steps": WARMUP, "decay_steps": DECAY,
        "betas": list(BETAS), "eps": EPS, "weight_decay": WD, "clip_grad_norm": CLIP,
        "losses": losses, "lrs": lrs, "grad_norms": norms,
        "eval_before": eval_before, "eval_after": eval_after,
    }
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    with open(os.path.join(out, "reference.txt"), "w") as f:
        f.write(f"eval before loss {eval_before:.9g}\n")
        for t, loss in enumerate(losses):
            f.write(f"step {t + 1} loss {loss:.9g}\n")
        f.write(f"eval after loss {eval_after:.9g}\n")


if __name__ == "__main__":
    main()
