#!/usr/bin/env python3
"""Writes transformers' loss and gradients on masked and packed batches
(issue 43 item 6) under tests/fsdp/testdata/hf/, for the committed tiny
models gpt2-tiny and llama-tiny (made by make_fixtures.py).

Run by hand, with PyTorch, transformers and safetensors installed (never by a
build or a test: the tests read the committed files):

  /work/venv/bin/python tools/hf_fixtures/make_batch_fixtures.py [DIR]

For each model <m> and batch kind <k> (masked, packed):

  <m>.<k>.batch.json        {"inputs", "labels", "targets", ["position_ids",
                             "segment_ids"]}: `labels` are what transformers
                             was given (-100 = not trained; the model shifts
                             them), `targets` the same labels shifted left by
                             one (shardkit's sk_batch.targets: the token each
                             position predicts, -100 where none)
  <m>.<k>.expected.safetensors
                            "loss" [1] and "grad.<hf name>" for every
                            parameter after one backward of that loss

masked: 2 rows of 12 tokens; row 0's first 5 labels (a prompt) and row 1's
first 3 and last 2 (a prompt and padding) are -100; the loss is
transformers' own (model(input_ids, labels=labels).loss: the mean
cross-entropy over the labels that are not -100).

packed: 2 rows of 12 tokens; row 0 holds two documents (5 + 7 tokens), row 1
three (4 + 4 + 4). position_ids restart at 0 in each document, and the
attention mask is given explicitly as a 4D additive mask [batch, 1, 12, 12]
that is block-diagonal and causal (0 where a token may attend, the dtype's
minimum elsewhere); each document's first label is -100 (nothing predicts
across a boundary, as DataCollatorWithFlattening does). The script checks
that the packed loss equals the token-weighted loss of the documents run one
by one (so the mask and positions took effect) before writing anything.

Fixed seeds, f32, eager attention, deterministic algorithms.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
import transformers
from transformers import AutoModelForCausalLM

ROWS, SEQ = 2, 12
PACKED_DOCS = [[5, 7], [4, 4, 4]]


def tokens(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (ROWS, SEQ), generator=g)


def shifted(labels):
    """transformers' labels -> the targets each position predicts."""
    t = torch.full_like(labels, -100)
    t[:, :-1] = labels[:, 1:]
    return t


def loss_and_grads(model, **kwargs):
    model.zero_grad()
    loss = model(**kwargs).loss
    loss.backward()
    grads = {"grad." + n: p.grad.detach().clone().contiguous() for n, p in model.named_parameters()}
    return loss.detach(), grads


def masked_batch(vocab, seed):
    ids = tokens(vocab, seed)
    labels = ids.clone()
    labels[0, :5] = -100
    labels[1, :3] = -100
    labels[1, -2:] = -100
    return ids, labels, {}


def packed_batch(vocab, seed, dtype):
    ids = tokens(vocab, seed)
    labels = ids.clone()
    positions = torch.zeros(ROWS, SEQ, dtype=torch.long)
    segments = torch.zeros(ROWS, SEQ, dtype=torch.long)
    allowed = torch.zeros(ROWS, SEQ, SEQ, dtype=torch.bool)
    for r, docs in enumerate(PACKED_DOCS):
        assert sum(docs) == SEQ
        start = 0
        for d, n in enumerate(docs):
            positions[r, start:start + n] = torch.arange(n)
            segments[r, start:start + n] = d
            labels[r, start] = -100
            allowed[r, start:start + n, start:start + n] = torch.tril(torch.ones(n, n, dtype=torch.bool))
            start += n
    mask = torch.zeros(ROWS, 1, SEQ, SEQ, dtype=dtype)
    mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
    return ids, labels, {"position_ids": positions, "segment_ids": segments, "attention_mask": mask}


def unpacked_loss(model, ids, labels):
    """The packed batch's loss from its documents run one by one: the sum of
    each document's token losses over the count of its trained labels."""
    total, count = 0.0, 0
    for r, docs in enumerate(PACKED_DOCS):
        start = 0
        for n in docs:
            doc_ids = ids[r:r + 1, start:start + n]
            doc_labels = labels[r:r + 1, start:start + n]
            trained = int((doc_labels[:, 1:] != -100).sum())
            if trained:
                with torch.no_grad():
                    total += model(input_ids=doc_ids, labels=doc_labels).loss.item() * trained
                count += trained
            start += n
    return total / count


def write(model, name, kind, out, ids, labels, extra):
    kwargs = {"input_ids": ids, "labels": labels}
    if "attention_mask" in extra:
        kwargs["attention_mask"] = extra["attention_mask"]
        kwargs["position_ids"] = extra["position_ids"]
    loss, grads = loss_and_grads(model, **kwargs)
    if kind == "packed":
        want = unpacked_loss(model, ids, labels)
        assert abs(loss.item() - want) <= 1e-5 * abs(want), (name, loss.item(), want)
        # Without the mask and positions the loss differs: they took effect.
        with torch.no_grad():
            plain = model(input_ids=ids, labels=labels).loss.item()
        assert abs(plain - loss.item()) > 1e-3, (name, plain, loss.item())
    tensors = {"loss": loss.reshape(1)}
    tensors.update(grads)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__}
    save_file(tensors, os.path.join(out, f"{name}.{kind}.expected.safetensors"), metadata=meta)
    batch = {"inputs": ids.tolist(), "labels": labels.tolist(), "targets": shifted(labels).tolist()}
    if "position_ids" in extra:
        batch["position_ids"] = extra["position_ids"].tolist()
        batch["segment_ids"] = extra["segment_ids"].tolist()
    with open(os.path.join(out, f"{name}.{kind}.batch.json"), "w") as f:
        json.dump(batch, f)
        f.write("\n")
    print(f"{name}.{kind}: loss {loss.item():.7f}, {int((labels[:, 1:] != -100).sum())} trained labels")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "..", "tests", "fsdp", "testdata", "hf")
    torch.use_deterministic_algorithms(True)
    for name, seed in (("gpt2-tiny", 51), ("llama-tiny", 52)):
        model = AutoModelForCausalLM.from_pretrained(os.path.join(out, name), dtype=torch.float32,
                                                     attn_implementation="eager")
        model.eval()  # no dropout; gradients still flow
        vocab = model.config.vocab_size
        ids, labels, extra = masked_batch(vocab, seed)
        write(model, name, "masked", out, ids, labels, extra)
        ids, labels, extra = packed_batch(vocab, seed + 100, torch.float32)
        write(model, name, "packed", out, ids, labels, extra)


if __name__ == "__main__":
    main()
