#!/usr/bin/env python3
"""Writes the Hugging Face fixtures under tests/fsdp/testdata/hf/.

Run by hand, with PyTorch, transformers and safetensors installed (never by a
build or a test: the tests read the committed files):

  python3 -m venv /tmp/venv-hf && /tmp/venv-hf/bin/pip install torch transformers safetensors
  /tmp/venv-hf/bin/python tools/hf_fixtures/make_fixtures.py [OUT_DIR]

Everything is made with fixed seeds in f32 with eager attention, so a rerun
with the same library versions writes the same files. For each model:

  <name>/                 save_pretrained: config.json + model.safetensors
  <name>-sharded/         (gpt2-tiny) the same weights, save_pretrained(max_shard_size=...):
                          model-0000k-of-0000n.safetensors + model.safetensors.index.json
  <name>.expected.safetensors
                          "logits" [batch * seq, vocab], "loss" [1], and
                          "grad.<hf name>" for every parameter (named_parameters():
                          a tied head appears once, as the embedding, its gradient
                          the sum of both uses)
  <name>.batch.json       {"inputs": [[...]], "targets": [[...]]}: next-token
                          targets; the loss is the mean cross-entropy over all
                          positions (no shift inside the model)

Models: gpt2-tiny (GPT2LMHeadModel, tied head as GPT-2), llama-tiny
(LlamaForCausalLM, 2 layers, hidden 64, 4 heads, 2 kv heads, untied head) and
llama3-tiny (LlamaForCausalLM with Llama 3.1's rope_scaling llama3 over a
context scaled down to 32 positions, tied head as Llama 3.2; 2 layers,
hidden 32, 2 heads, 1 kv head, batch 2 x 32).
Parameters are the library's initialisation plus N(0, 0.02) noise on every
tensor (LayerNorm gains and biases included), so no gradient is trivially
zero or one.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

BATCH, SEQ = 2, 12


def perturb(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)


def batch(vocab, seed, seq=SEQ):
    g = torch.Generator().manual_seed(seed)
    seqs = torch.randint(0, vocab, (BATCH, seq + 1), generator=g)
    return seqs[:, :-1].contiguous(), seqs[:, 1:].contiguous()


def write(model, name, out, vocab, seed, shard_size, seq=SEQ):
    model.eval()  # no dropout; gradients still flow
    model.save_pretrained(os.path.join(out, name), safe_serialization=True)
    if shard_size is not None:
        model.save_pretrained(os.path.join(out, name + "-sharded"), safe_serialization=True,
                              max_shard_size=shard_size)
    inputs, targets = batch(vocab, seed, seq)
    model.zero_grad()
    logits = model(input_ids=inputs).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    loss.backward()
    tensors = {"logits": logits.detach().reshape(-1, vocab).contiguous(),
               "loss": loss.detach().reshape(1)}
    for n, p in model.named_parameters():
        tensors["grad." + n] = p.grad.detach().contiguous()
    save_file(tensors, os.path.join(out, name + ".expected.safetensors"),
              metadata={"transformers": transformers.__version__, "torch": torch.__version__})
    with open(os.path.join(out, name + ".batch.json"), "w") as f:
        json.dump({"inputs": inputs.tolist(), "targets": targets.tolist()}, f)
        f.write("\n")
    print(f"{name}: loss {loss.item():.6f}, {sum(p.numel() for p in model.parameters())} parameters")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "tests", "fsdp", "testdata", "hf")
    os.makedirs(out, exist_ok=True)
    torch.use_deterministic_algorithms(True)

    torch.manual_seed(33)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                      tie_word_embeddings=True, attn_implementation="eager"))
    perturb(gpt2, 34)
    write(gpt2, "gpt2-tiny", out, 128, 35, "40KB")

    torch.manual_seed(36)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                                         tie_word_embeddings=False, attention_bias=False,
                                         attn_implementation="eager"))
    perturb(llama, 37)
    write(llama, "llama-tiny", out, 128, 38, None)  # one sharded directory (GPT-2's) is enough

    torch.manual_seed(39)
    llama3 = LlamaForCausalLM(llama3_tiny_config())
    perturb(llama3, 40)
    write(llama3, "llama3-tiny", out, 64, 41, None, seq=LLAMA3_SEQ)


# Llama 3.1/3.2's rotary embeddings (rope_scaling llama3 with their factors
# low 1 and high 4) on a tiny, tied model, with the pre-training context
# scaled down from 8192 to 32 positions and factor 8 (Llama 3.1's) so that a
# batch of 32 positions feels the rescaling (with Llama 3.2's own settings
# the logits of so short a batch move by 2e-5 only): head_dim 16 and theta
# 10000 put its eight frequencies in all three of llama3's bands
# (wavelength 6.3 kept, 19.9 smoothed, 62.8 and above divided by 8).
LLAMA3_SEQ = 32


def llama3_tiny_config():
    return LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                       rms_norm_eps=1e-5, rope_theta=10000.0,
                       rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
                       tie_word_embeddings=True, attention_bias=False, attn_implementation="eager")


if __name__ == "__main__":
    main()
