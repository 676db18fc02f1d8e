#!/usr/bin/python3
"""Writes seed GGUF files for fuzz_gguf into a folder: a few small valid files (every
value type, nested arrays, alignment 64, several tensor types) and a few slightly broken
ones. Nothing binary is kept in the tree; run this before fuzzing:

  /usr/bin/python3 tests/fuzz/make_corpus.py CORPUS_DIR

The builder below is also used by tests/tools/test_bloomery_gguf.py.
"""
import os
import struct
import sys

# Metadata value types.
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
# Tensor types and their (elements, bytes) per block.
T_F32, T_F16, T_Q8_0, T_Q4_K, T_Q6_K = 0, 1, 8, 12, 14
BLOCKS = {T_F32: (1, 4), T_F16: (1, 2), T_Q8_0: (32, 34), T_Q4_K: (256, 144), T_Q6_K: (256, 210)}

_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
        BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def value(typ, v):
    """Encodes v of type typ; an array is (element type, [elements])."""
    if typ == STRING:
        return gstr(v)
    if typ == ARRAY:
        et, elems = v
        return struct.pack("<IQ", et, len(elems)) + b"".join(value(et, e) for e in elems)
    return struct.pack(_FMT[typ], v)


def tensor_bytes(typ, ne):
    be, bb = BLOCKS[typ]
    n = 1
    for d in ne:
        n *= d
    return n // be * bb


def gguf(kvs, tensors=(), version=3, alignment=32, data_fill=b"\x5a"):
    """kvs: [(key, type, value)]; tensors: [(name, type, [ne...])], laid out in order,
    each at the next aligned offset. Returns the file's bytes."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for key, typ, v in kvs:
        out += gstr(key) + struct.pack("<I", typ) + value(typ, v)
    offset, layout = 0, []
    for name, typ, ne in tensors:
        out += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", typ, offset)
        size = tensor_bytes(typ, ne)
        layout.append((offset, size))
        offset += (size + alignment - 1) // alignment * alignment
    if tensors:
        out += b"\0" * (-len(out) % alignment)
        out += (data_fill * (offset // len(data_fill) + 1))[:offset]
    return out


def small_model(alignment=32):
    kvs = [("general.architecture", STRING, "test"),
           ("test.block_count", U32, 1),
           ("tokenizer.ggml.tokens", ARRAY, (STRING, ["a", "b", "<|im_end|>"]))]
    if alignment != 32:
        kvs.append(("general.alignment", U32, alignment))
    tensors = [("token_embd.weight", T_Q8_0, [64, 3]),
               ("output_norm.weight", T_F32, [64]),
               ("blk.0.ffn_up_exps.weight", T_Q4_K, [256, 2, 2])]
    return gguf(kvs, tensors, alignment=alignment)


def seeds():
    every = [("t.u8", U8, 7), ("t.i8", I8, -7), ("t.u16", U16, 700), ("t.i16", I16, -700),
             ("t.u32", U32, 70000), ("t.i32", I32, -70000), ("t.f32", F32, 0.5),
             ("t.bool", BOOL, True), ("t.str", STRING, "hello\n\"world\""),
             ("t.u64", U64, 1 << 40), ("t.i64", I64, -(1 << 40)), ("t.f64", F64, 0.25)]
    nested = [("t.nested", ARRAY, (ARRAY, [(STRING, ["x", "yz"]), (I32, [1, 2, 3]), (BOOL, [])])),
              ("t.deep", ARRAY, (ARRAY, [(ARRAY, [(U8, [1])])]))]
    good = small_model()
    out = {
        "good_small": good,
        "good_align64": small_model(64),
        "good_every_type": gguf(every, [("w", T_F16, [4, 4])]),
        "good_nested": gguf(nested),
        "good_v2_no_tensors": gguf([("general.name", STRING, "v2")], version=2),
        "good_q6k": gguf([("general.architecture", STRING, "x")], [("a", T_Q6_K, [256]), ("b", T_F32, [3, 5])]),
        "bad_truncated": good[:len(good) // 2],
        "bad_magic": b"GGUG" + good[4:],
        "bad_tensor_past_eof": good[:-8],
        "bad_huge_kv_count": good[:16] + struct.pack("<Q", 1 << 63) + good[24:],
        "bad_duplicate_key": gguf([("k", U8, 1), ("k", U8, 2)]),
    }
    return out


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: make_corpus.py CORPUS_DIR\n")
        return 2
    os.makedirs(argv[1], exist_ok=True)
    for name, data in seeds().items():
        with open(os.path.join(argv[1], name + ".gguf"), "wb") as f:
            f.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
