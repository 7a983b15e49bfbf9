#!/usr/bin/env python3
"""Loads Hugging Face directories that shardkit wrote into transformers and
compares their logits and loss with the fixtures'.

Run by hand (never by a build or a test), with the venv make_fixtures.py
uses, after writing the directories with //tools:convert: each fixture
directory is read into shardkit's layout and written back as a directory
(config.json from shardkit's configuration, the weights from shardkit's
file), so what transformers loads here is what shardkit exports:

  for m in gpt2-tiny:hf-gpt2 llama-tiny:hf-llama llama3-tiny:hf-llama; do
    name=${m%%:*} layout=${m##*:}
    bazel-bin/tools/convert --from=$layout tests/fsdp/testdata/hf/$name /tmp/sk-export/$name.safetensors
    bazel-bin/tools/convert --to=$layout --model=tests/fsdp/testdata/hf/$name \\
        /tmp/sk-export/$name.safetensors /tmp/sk-export/$name/
  done
  /work/venv-hf/bin/python tools/hf_fixtures/compare_exported.py /tmp/sk-export

For each model it prints the largest |logit difference| between
transformers on shardkit's directory and the fixture's logits (transformers
on its own directory), the two losses (the fixture's loss is shardkit's
to within 1e-6: //tests/fsdp:hf_checkpoint_test), whether the head is tied
as the fixture's, and, for Llama, the largest |inv_freq difference| of the
rotary embedding (so a lost rope_scaling shows).
"""
import json
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fsdp", "testdata", "hf")
MODELS = ["gpt2-tiny", "llama-tiny", "llama3-tiny"]


def load(path):
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    return model


def tied(model):
    return model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def main():
    exported = sys.argv[1] if len(sys.argv) > 1 else "/tmp/sk-export"
    torch.use_deterministic_algorithms(True)
    worst = 0.0
    for name in MODELS:
        ours = load(os.path.join(exported, name))
        theirs = load(os.path.join(FIXTURES, name))
        with open(os.path.join(FIXTURES, name + ".batch.json")) as f:
            batch = json.load(f)
        inputs = torch.tensor(batch["inputs"])
        targets = torch.tensor(batch["targets"])
        expected = load_file(os.path.join(FIXTURES, name + ".expected.safetensors"))
        with torch.no_grad():
            logits = ours(input_ids=inputs).logits
        vocab = logits.shape[-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        diff = (logits.reshape(-1, vocab) - expected["logits"]).abs().max().item()
        worst = max(worst, diff)
        line = (f"{name}: max |logits - fixture| {diff:.3g}, loss {loss.item():.6f} "
                f"(fixture {expected['loss'].item():.6f}), tied {tied(ours)} (fixture {tied(theirs)})")
        rotary = getattr(getattr(ours, "model", None), "rotary_emb", None)
        if rotary is not None:
            inv = (rotary.inv_freq - theirs.model.rotary_emb.inv_freq).abs().max().item()
            line += f", rope_type {ours.config.rope_parameters['rope_type']}, max |inv_freq diff| {inv:.3g}"
        print(line)
    print(f"largest logit difference over all models: {worst:.3g}")


if __name__ == "__main__":
    main()
