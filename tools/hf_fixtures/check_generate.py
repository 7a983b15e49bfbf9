#!/usr/bin/env python3
"""Checks that a Hugging Face directory shardkit exports generates as the
model it came from and stops at its end-of-sequence token (issue 43 item 4).

Run by hand (never by a build or a test), with /work/venv:

  ./bazelw build //tools:convert
  /work/venv/bin/python tools/hf_fixtures/check_generate.py bazel-bin/tools/convert /tmp/sk-generate

It makes a tiny Llama with transformers (fixed seed) and a word-level tokenizer
whose end-of-sequence token is the token greedy decoding produces third from a
fixed prompt, saves both with save_pretrained (config.json with bos/eos/pad,
generation_config.json, tokenizer files), then for two sources -- that
directory, and a copy without generation_config.json -- runs shardkit's
export (convert --from=hf-llama DIR file; convert --to=hf-llama --model=DIR
file OUT/), loads OUT with AutoModelForCausalLM and AutoTokenizer and
generates greedily from the prompt. It prints what it found and exits 1 if
the export lacks the tokenizer or the ids, generates other tokens than the
source, or does not stop at EOS.
"""
import json
import os
import shutil
import subprocess
import sys

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB = 64
MAX_NEW = 12


def make_source(root):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(cfg).eval()
    prompt = torch.tensor([[1, 5, 9, 17]])
    with torch.no_grad():
        free = model.generate(prompt, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, prompt.shape[1]:].tolist()
    # EOS: the first generated token from the third on that was not generated before.
    k = next(i for i in range(2, len(free)) if free[i] not in free[:i] and free[i] > 3)
    eos = free[k]
    model.config.eos_token_id = eos
    model.generation_config.eos_token_id = eos
    model.generation_config.bos_token_id = 1
    model.generation_config.pad_token_id = 0
    vocab = {f"w{i}": i for i in range(VOCAB)}
    vocab["<pad>"], vocab["<s>"], vocab[f"</s>"] = 0, 1, eos
    del vocab["w0"], vocab["w1"], vocab[f"w{eos}"]
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    src = os.path.join(root, "source")
    shutil.rmtree(src, ignore_errors=True)
    model.save_pretrained(src, safe_serialization=True)
    fast.save_pretrained(src)
    return src, prompt, free, k, eos


def main():
    convert, root = sys.argv[1], sys.argv[2]
    os.makedirs(root, exist_ok=True)
    src, prompt, free, k, eos = make_source(root)
    src_model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    with torch.no_grad():
        want = src_model.generate(prompt, max_new_tokens=MAX_NEW, do_sample=False)[0].tolist()
    print(f"source: eos_token_id {eos}; without EOS greedy decoding gives {free}")
    print(f"source generate(): {want} ({len(want) - prompt.shape[1]} new tokens, stops at EOS: {want[-1] == eos})")
    no_gen = os.path.join(root, "source-no-generation-config")
    shutil.rmtree(no_gen, ignore_errors=True)
    shutil.copytree(src, no_gen)
    os.remove(os.path.join(no_gen, "generation_config.json"))
    failed = False
    for name, d in [("with generation_config.json", src), ("without generation_config.json", no_gen)]:
        out = os.path.join(root, "export-" + os.path.basename(d)) + "/"
        shutil.rmtree(out, ignore_errors=True)
        flat = os.path.join(root, os.path.basename(d) + ".safetensors")
        subprocess.run([convert, "--from=hf-llama", d, flat], check=True, stdout=subprocess.DEVNULL)
        subprocess.run([convert, "--to=hf-llama", "--model=" + d, flat, out], check=True, stdout=subprocess.DEVNULL)
        files = sorted(os.listdir(out))
        cfg = json.load(open(os.path.join(out, "config.json")))
        gen = json.load(open(os.path.join(out, "generation_config.json")))
        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        tok = AutoTokenizer.from_pretrained(out)
        text = "<s> w5 w9 w17"
        ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids
        with torch.no_grad():
            got = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)[0].tolist()
        decoded = tok.decode(got)
        ok = (got == want and got[-1] == eos and len(got) - ids.shape[1] == k + 1 and tok.eos_token_id == eos and
              cfg.get("eos_token_id") == eos and gen.get("eos_token_id") == eos and ids.tolist()[0] == prompt.tolist()[0])
        failed |= not ok
        print(f"export from the source {name}: files {files}")
        print(f"  config.json bos/eos/pad {cfg.get('bos_token_id')}/{cfg.get('eos_token_id')}/{cfg.get('pad_token_id')}; "
              f"generation_config.json {json.dumps(gen, sort_keys=True)}")
        print(f"  tokenizer eos '{tok.eos_token}' = {tok.eos_token_id}; '{text}' -> {ids.tolist()[0]}")
        print(f"  generate(): {got} = '{decoded}' ({len(got) - ids.shape[1]} new tokens of at most {MAX_NEW}; "
              f"same as the source: {got == want}; stops at EOS: {got[-1] == eos}) -> {'OK' if ok else 'FAILED'}")
        if d == src:
            # Control: the same export without the ids and generation_config.json (what
            # shardkit wrote before) generates until max_new_tokens.
            bare = out.rstrip("/") + "-without-eos/"
            shutil.rmtree(bare, ignore_errors=True)
            shutil.copytree(out, bare)
            os.remove(os.path.join(bare, "generation_config.json"))
            c = json.load(open(os.path.join(bare, "config.json")))
            for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
                c.pop(key, None)
            json.dump(c, open(os.path.join(bare, "config.json"), "w"))
            m = AutoModelForCausalLM.from_pretrained(bare, dtype=torch.float32).eval()
            with torch.no_grad():
                g = m.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0)[0].tolist()
            print(f"  control, the same directory without the ids and generation_config.json: generate() gives "
                  f"{len(g) - ids.shape[1]} new tokens {g[ids.shape[1]:]}")
    print(f"transformers {__import__('transformers').__version__}, torch {torch.__version__}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
