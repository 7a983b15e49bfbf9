"""shardkit's safetensors files as Python sees them, with the standard library
and numpy only (no safetensors, no torch):

1. every file follows the safetensors format's rules as the `safetensors`
   library enforces them (checked here from the spec with json + struct, not
   with shardkit's reader): 8-byte little-endian header length, a JSON object
   without duplicate keys, data 8-byte aligned, __metadata__ a string-to-string
   map, known dtypes, shapes matching byte counts, offsets starting at 0 and
   contiguous up to the end of the file;
2. shardkit's metadata: "format" ("shardkit", or "pt" for the hf-gpt2 export)
   and a CRC-32 per tensor that zlib agrees with;
3. the numpy recipe printed in docs/checkpoints.md (extracted from the doc and
   run as is) reads the values shardkit's own reader saw (expected.txt);
4. the hf-gpt2 export holds the same weights under GPT-2's names, and
   //tools:convert's hf-gpt2 -> shardkit -> hf-gpt2 round trip gives
   byte-identical tensors.

usage: numpy_recipe_test.py DOCS_CHECKPOINTS_MD DIR
"""
import json
import re
import struct
import sys
import zlib

import numpy as np

DTYPE_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2,
              "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), "duplicate keys in a JSON object"
    return dict(pairs)


def check_spec(path, want_format):
    with open(path, "rb") as f:
        raw = f.read()
    assert len(raw) >= 8, path
    (n,) = struct.unpack("<Q", raw[:8])
    assert 8 + n <= len(raw), "header runs past the file"
    assert (8 + n) % 8 == 0, "data section not 8-byte aligned: header length %d" % n
    text = raw[8:8 + n].decode("utf-8")
    assert text.startswith("{"), "header does not start with '{'"
    assert text.rstrip(" ") == text.rstrip(), "header padding is not spaces"
    header = json.loads(text, object_pairs_hook=no_duplicates)
    assert isinstance(header, dict)
    meta = header.pop("__metadata__", None)
    assert meta is not None, "no __metadata__"
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()), \
        "__metadata__ must map strings to strings"
    assert meta.get("format") == want_format, meta.get("format")
    data = raw[8 + n:]
    spans = []
    for name, t in header.items():
        assert set(t) == {"dtype", "shape", "data_offsets"}, (name, t)
        assert t["dtype"] in DTYPE_SIZE, (name, t["dtype"])
        assert all(isinstance(d, int) and d >= 0 for d in t["shape"]), (name, t["shape"])
        b, e = t["data_offsets"]
        assert isinstance(b, int) and isinstance(e, int) and 0 <= b <= e, (name, b, e)
        assert e - b == int(np.prod(t["shape"], dtype=np.int64)) * DTYPE_SIZE[t["dtype"]], name
        spans.append((b, e, name))
        crc = meta.get("crc32." + name)
        assert crc is not None, "no crc32 for " + name
        assert zlib.crc32(data[b:e]) == int(crc), "crc32 of " + name
    spans.sort()
    at = 0
    for b, e, name in spans:
        assert b == at, "hole or overlap before %s (%d, expected %d)" % (name, b, at)
        at = e
    assert at == len(data), "data section has %d bytes, tensors cover %d" % (len(data), at)
    return header, meta


def recipe(doc_path):
    doc = open(doc_path, encoding="utf-8").read()
    m = re.search(r"<!-- numpy-recipe: begin.*?-->\s*```python\n(.*?)```\s*<!-- numpy-recipe: end -->", doc, re.S)
    assert m, "the recipe is not in " + doc_path
    code = m.group(1)
    assert len(code.strip().splitlines()) <= 25, "the recipe grew past a screen"
    scope = {}
    exec(compile(code, "docs/checkpoints.md recipe", "exec"), scope)
    return scope["read_safetensors"]


def main():
    doc, d = sys.argv[1], sys.argv[2]
    read_safetensors = recipe(doc)

    header, meta = check_spec(d + "/shardkit.safetensors", "shardkit")
    assert meta["shardkit.step"] == "1", meta
    assert any(k.startswith("optimizer.") for k in header), "AdamW state missing"
    check_spec(d + "/hf-gpt2.safetensors", "pt")
    check_spec(d + "/back-to-shardkit.safetensors", "shardkit")
    check_spec(d + "/round-trip.safetensors", "pt")

    w, meta = read_safetensors(d + "/shardkit.safetensors")
    expected = [line.split() for line in open(d + "/expected.txt")]
    assert len(expected) == len(w), (len(expected), len(w))
    for name, count, first, total in expected:
        a = w[name]
        assert a.dtype == np.float32 and a.size == int(count), name
        if a.size:
            assert a.reshape(-1)[0] == np.float32(first), (name, a.reshape(-1)[0], first)
        got = float(a.astype(np.float64).sum())
        assert abs(got - float(total)) <= 1e-9 * max(1.0, abs(float(total))), (name, got, total)

    hf, hf_meta = read_safetensors(d + "/hf-gpt2.safetensors")
    assert "shardkit.step" not in hf_meta and not any(k.startswith("optimizer.") for k in hf)
    assert np.array_equal(hf["transformer.h.0.attn.c_attn.weight"], w["h.0.attn.qkv.w"])
    assert np.array_equal(hf["transformer.h.1.ln_2.bias"], w["h.1.mlp.ln.b"])
    assert np.array_equal(hf["transformer.ln_f.weight"], w["head.ln.g"])
    assert np.array_equal(hf["lm_head.weight"], w["head.lm_head.w"].T)  # untied here
    assert hf["transformer.wte.weight"].shape == (64, 32)

    back, _ = read_safetensors(d + "/back-to-shardkit.safetensors")
    assert set(back) == {k for k in w if not k.startswith("optimizer.")}
    for k in back:
        assert np.array_equal(back[k], w[k]), k
    rt, _ = read_safetensors(d + "/round-trip.safetensors")
    assert set(rt) == set(hf), (sorted(set(rt) ^ set(hf)))
    for k in hf:
        assert rt[k].dtype == hf[k].dtype and rt[k].tobytes() == hf[k].tobytes(), k

    # The recipe's checksum check catches a flipped byte.
    raw = bytearray(open(d + "/shardkit.safetensors", "rb").read())
    raw[-1] ^= 0x40
    open(d + "/flipped.safetensors", "wb").write(bytes(raw))
    try:
        read_safetensors(d + "/flipped.safetensors")
        raise SystemExit("FAIL: a flipped byte was not caught")
    except AssertionError as e:
        assert "corrupt" in str(e), e
    print("PASS: %d tensors; spec, metadata, recipe values, hf-gpt2 names and round trip" % len(w))


if __name__ == "__main__":
    main()
