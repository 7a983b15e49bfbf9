#!/usr/bin/env python3
"""Loads a directory shardkit exported after fine-tuning and runs it in transformers.

By hand (not in CI), with each transformers you want to check:

  bazel-bin/tools/launch --nproc_per_node=2 --master_port=0 bazel-bin/examples/c/finetune \
      examples/data/finetune/llama examples/data/finetune/train.jsonl examples/data/finetune/eval.jsonl /tmp/ft
  /work/venv/bin/python tools/hf_fixtures/check_finetuned.py /tmp/ft examples/data/finetune
  /work/venv4/bin/python tools/hf_fixtures/check_finetuned.py /tmp/ft examples/data/finetune

Prints: the versions, the files in the directory, what generation_config says,
the eval loss transformers computes on eval.jsonl with the exported weights
(the mean over the trained targets, as shardkit's evaluate), the largest
difference from the fixture's PyTorch-trained weights, and greedy generate()
from each eval prompt (where it stopped and why).
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main():
    exported, data = sys.argv[1], sys.argv[2]
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    print("files:", sorted(os.listdir(exported)))
    model = AutoModelForCausalLM.from_pretrained(exported, attn_implementation="eager")
    model.eval()
    print("class:", type(model).__name__, "config eos/bos/pad:", model.config.eos_token_id,
          model.config.bos_token_id, model.config.pad_token_id)
    gc = model.generation_config
    print("generation_config eos/bos/pad:", gc.eos_token_id, gc.bos_token_id, gc.pad_token_id)

    ref = load_file(os.path.join(data, "reference_final.safetensors"))
    sd = model.state_dict()
    worst = max((sd[n] - t).abs().max().item() for n, t in ref.items())
    print(f"largest |exported - PyTorch-trained| weight difference: {worst:.3g}")

    records = [json.loads(line) for line in open(os.path.join(data, "eval.jsonl"))]
    total, count = 0.0, 0
    with torch.no_grad():
        for r in records:
            ids = torch.tensor([r["input_ids"]])
            labels = torch.tensor(r["labels"])
            logits = model(input_ids=ids).logits[0, :-1]
            total += torch.nn.functional.cross_entropy(logits, labels[1:], ignore_index=-100, reduction="sum").item()
            count += int((labels[1:] != -100).sum())
    print(f"eval loss in transformers: {total / count:.9g} over {count} targets")

    for r in records:
        n_prompt = sum(1 for l in r["labels"] if l == -100)
        prompt = torch.tensor([r["input_ids"][:n_prompt]])
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False)
        new = out[0, n_prompt:].tolist()
        eos = gc.eos_token_id
        eos_ids = eos if isinstance(eos, list) else [eos]
        why = "stopped at EOS" if new and new[-1] in eos_ids else f"ran to max_new_tokens ({len(new)})"
        print(f"prompt {r['input_ids'][1:n_prompt]} -> {new} ({why}); wanted {r['input_ids'][n_prompt:]}")


if __name__ == "__main__":
    main()
