#!/usr/bin/python3
"""Writes seed GGUF files for fuzz_gguf and fuzz_arch into a folder: a few small valid
files (every value type, nested arrays, alignment 64, several tensor types), a few
slightly broken ones, the arch_* files (the metadata common/arch.c reads for
qwen3moe, qwen3, glm4moe and deepseek2 with YaRN, expert groups, both forms of its
latent attention, NextN and leading dense layers, and the largest values it accepts,
over a few tiny tensors) and the mk_* files: tiny whole models of each architecture,
gpt-oss's too, that bloomery-mkmodel writes (the same flags give the same bytes on any
machine). Nothing binary is kept in the tree; run this before fuzzing:

  /usr/bin/python3 tests/fuzz/make_corpus.py [--mkmodel PATH] CORPUS_DIR

bloomery-mkmodel is PATH, else $BLOOMERY_BIN/bloomery-mkmodel, else the one in build/;
without it the mk_* files are left out (a line on stderr says so).

The builder below is also used by tests/tools/test_bloomery_gguf.py.
"""
import os
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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


def arch_file(arch, keys, tensors):
    """A model file of arch: keys are (key under ARCH., type, value), tensors as gguf()'s."""
    kvs = [("general.architecture", STRING, arch)] + [(arch + "." + k, t, v) for k, t, v in keys]
    return gguf(kvs, tensors)


def arch_seeds():
    """Metadata of every architecture and every key arch.c reads, over a few tiny
    tensors (the reader and the plan look only at the tensors' names and sizes; the
    tensor checks find the shapes right for the small ones)."""
    E, V = 8, 16  # embedding width and vocabulary of the small files
    io = [("token_embd.weight", T_F16, [E, V]), ("output_norm.weight", T_F32, [E])]
    moe = [("expert_count", U32, 4), ("expert_used_count", U32, 2), ("expert_feed_forward_length", U32, 8)]
    qwen3moe = [("block_count", U32, 2), ("embedding_length", U32, E), ("attention.head_count", U32, 2),
                ("attention.head_count_kv", U32, 1), ("attention.key_length", U32, 4),
                ("context_length", U32, 64)] + moe
    qwen3 = [("block_count", U32, 2), ("embedding_length", U32, E), ("attention.head_count", U32, 2),
             ("context_length", U32, 64), ("feed_forward_length", U32, 8), ("attention.value_length", U32, 4),
             ("rope.dimension_count", U32, 2), ("rope.freq_base", F32, 1e6),
             ("attention.layer_norm_rms_epsilon", F32, 1e-5)]
    glm4moe = [("block_count", U32, 3), ("embedding_length", U32, E), ("attention.head_count", U32, 2),
               ("attention.head_count_kv", U32, 1), ("attention.key_length", U32, 4),
               ("rope.dimension_count", U32, 2), ("context_length", U32, 64), ("feed_forward_length", U32, 8),
               ("nextn_predict_layers", U32, 1), ("leading_dense_block_count", U32, 1),
               ("expert_shared_count", U32, 1), ("expert_gating_func", U32, 0),
               ("expert_weights_norm", BOOL, True), ("expert_weights_scale", F32, 2.5)] + moe
    # deepseek2: 2 heads of q/k 4 + 2 rotated dims and v 4, a latent of 8
    ds2 = [("block_count", U32, 3), ("embedding_length", U32, E), ("attention.head_count", U32, 2),
           ("attention.head_count_kv", U32, 1), ("context_length", U32, 64), ("feed_forward_length", U32, 8),
           ("attention.q_lora_rank", U32, 8), ("attention.kv_lora_rank", U32, 8),
           ("attention.key_length", U32, 10), ("attention.value_length", U32, 8),
           ("attention.key_length_mla", U32, 6), ("attention.value_length_mla", U32, 4),
           ("rope.dimension_count", U32, 2), ("nextn_predict_layers", U32, 1),
           ("leading_dense_block_count", U32, 1), ("expert_shared_count", U32, 2),
           ("expert_gating_func", U32, 2), ("expert_weights_norm", BOOL, True),
           ("expert_weights_scale", F32, 2.5), ("expert_group_count", U32, 2),
           ("expert_group_used_count", U32, 1), ("rope.scaling.type", STRING, "yarn"),
           ("rope.scaling.factor", F32, 40.0), ("rope.scaling.original_context_length", U32, 16),
           ("rope.scaling.yarn_log_multiplier", F32, 0.1), ("rope.scaling.attn_factor", F32, 1.0),
           ("rope.scaling.yarn_beta_fast", F32, 32.0), ("rope.scaling.yarn_beta_slow", F32, 1.0)] + moe
    ds2_legacy = [(k, t, v) for k, t, v in ds2 if not k.endswith("_mla") and not k.startswith("rope.scaling.")
                  and not k.startswith("expert_group") and k not in ("attention.key_length",
                                                                     "attention.value_length",
                                                                     "attention.q_lora_rank",
                                                                     "expert_gating_func")]
    ds2_legacy += [("attention.key_length", U32, 6), ("attention.value_length", U32, 4),
                   ("attention.q_lora_rank", U32, 0), ("rope.scaling.type", STRING, "none")]
    # the largest values arch.c accepts, over a few layers
    big_moe = [("expert_count", U32, 4096), ("expert_used_count", U32, 4096),
               ("expert_feed_forward_length", U32, 1 << 20)]
    qwen3moe_max = [("block_count", U32, 8), ("embedding_length", U32, 1 << 20), ("attention.head_count", U32, 1),
                    ("attention.key_length", U32, 1 << 20), ("context_length", U32, 1 << 24),
                    ("rope.freq_base", F32, 1e12), ("attention.layer_norm_rms_epsilon", F32, 1.0)] + big_moe
    ds2_max = [("block_count", U32, 8), ("embedding_length", U32, 1 << 20), ("attention.head_count", U32, 1),
               ("context_length", U32, 1 << 24), ("feed_forward_length", U32, 1 << 20),
               ("attention.q_lora_rank", U32, 1 << 20), ("attention.kv_lora_rank", U32, (1 << 20) - 2),
               ("attention.key_length", U32, 1 << 20), ("attention.value_length", U32, (1 << 20) - 2),
               ("attention.key_length_mla", U32, 1 << 20), ("attention.value_length_mla", U32, 1 << 20),
               ("rope.dimension_count", U32, 2), ("nextn_predict_layers", U32, 7),
               ("leading_dense_block_count", U32, 1), ("expert_shared_count", U32, 64),
               ("expert_gating_func", U32, 1), ("expert_weights_scale", F32, 1e6),
               ("expert_group_count", U32, 4096), ("expert_group_used_count", U32, 4096),
               ("rope.scaling.type", STRING, "yarn"), ("rope.scaling.factor", F32, 1e6),
               ("rope.scaling.original_context_length", U32, 1 << 24),
               ("rope.scaling.yarn_log_multiplier", F32, 100.0), ("rope.scaling.attn_factor", F32, 100.0),
               ("rope.scaling.yarn_beta_fast", F32, 0.0), ("rope.scaling.yarn_beta_slow", F32, 1e6)] + big_moe

    def blk(l, name, typ, ne):
        return ("blk.%d.%s" % (l, name), typ, ne)

    return {
        "arch_qwen3moe": arch_file("qwen3moe", qwen3moe, io + [
            blk(0, "attn_norm.weight", T_F32, [E]), blk(0, "attn_q.weight", T_F16, [E, 8]),
            blk(0, "attn_q_norm.weight", T_F32, [4]), blk(0, "ffn_norm.weight", T_F32, [E]),
            blk(0, "ffn_gate_inp.weight", T_F32, [E, 4]), blk(0, "ffn_gate_exps.weight", T_F16, [E, 8, 4]),
            blk(1, "ffn_up_exps.weight", T_F16, [E, 8, 4]), blk(1, "ffn_down_exps.weight", T_F16, [8, E, 4])]),
        "arch_qwen3": arch_file("qwen3", qwen3, io + [
            ("output.weight", T_F16, [E, V]), blk(0, "attn_k.weight", T_F16, [E, 4]),
            blk(0, "ffn_up.weight", T_F16, [E, 8]), blk(1, "ffn_down.weight", T_F16, [8, E])]),
        "arch_glm4moe": arch_file("glm4moe", glm4moe, io + [
            blk(0, "attn_q_norm.weight", T_F32, [4]), blk(0, "attn_q.bias", T_F32, [8]),
            blk(0, "post_attention_norm.weight", T_F32, [E]), blk(0, "ffn_gate.weight", T_F16, [E, 8]),
            blk(1, "exp_probs_b.bias", T_F32, [4]), blk(1, "ffn_gate_exps.weight", T_F16, [E, 8, 4]),
            blk(1, "ffn_up_shexp.weight", T_F16, [E, 8]), blk(2, "nextn.eh_proj.weight", T_F16, [2 * E, E])]),
        "arch_deepseek2_yarn": arch_file("deepseek2", ds2, io + [
            blk(0, "attn_q_a.weight", T_F16, [E, 8]), blk(0, "attn_kv_a_mqa.weight", T_F16, [E, 10]),
            blk(0, "attn_k_b.weight", T_F16, [4, 8, 2]), blk(0, "attn_v_b.weight", T_F16, [8, 4, 2]),
            blk(0, "ffn_up.weight", T_F16, [E, 8]), blk(1, "exp_probs_b.bias", T_F32, [4]),
            blk(1, "ffn_down_exps.weight", T_F16, [8, E, 4]), blk(1, "ffn_gate_shexp.weight", T_F16, [E, 16]),
            blk(2, "nextn.enorm.weight", T_F32, [E])]),
        "arch_deepseek2_legacy": arch_file("deepseek2", ds2_legacy, io + [
            blk(0, "attn_q.weight", T_F16, [E, 12]), blk(0, "attn_kv_b.weight", T_F16, [8, 16]),
            blk(1, "ffn_gate_inp.weight", T_F32, [E, 4]), blk(1, "ffn_gate_exps.weight", T_F16, [E, 8, 4])]),
        "arch_qwen3moe_max": arch_file("qwen3moe", qwen3moe_max, io + [
            blk(7, "ffn_up_exps.weight", T_F16, [E, 8, 4])]),
        "arch_deepseek2_max": arch_file("deepseek2", ds2_max, io + [
            blk(0, "ffn_up.weight", T_F16, [E, 8]), blk(7, "ffn_up_exps.weight", T_F16, [E, 8, 4])]),
    }


# The tiny whole models bloomery-mkmodel writes: f16 matrices of 8 columns over 300
# tokens (its built-in vocabulary's least), a few tens of KB each.
_MK_COMMON = ["--layers", "2", "--vocab", "300", "--n-embd", "8", "--heads", "2", "--type", "f16", "--ctx", "256"]
_MK_MOE = ["--experts", "4", "--experts-used", "2", "--expert-ff", "8"]
_MK_DS2 = ["--arch", "deepseek2", "--ff", "8", "--kv-lora", "8", "--qk-nope", "4", "--v-head", "4", "--rope-dim", "4"]
MKMODEL_SEEDS = {
    "mk_qwen3moe": ["--arch", "qwen3moe", "--kv-heads", "1", "--head-dim", "4"] + _MK_MOE,
    "mk_qwen3_tied": ["--arch", "qwen3", "--kv-heads", "1", "--head-dim", "4", "--ff", "8", "--tied"],
    "mk_glm4moe": ["--arch", "glm4moe", "--kv-heads", "1", "--head-dim", "4", "--ff", "8", "--qk-norm"] + _MK_MOE,
    "mk_deepseek2_yarn_groups": _MK_DS2 + ["--experts", "8", "--experts-used", "2", "--expert-ff", "8",
                                           "--q-lora", "8", "--yarn", "40", "--groups", "4",
                                           "--groups-used", "2", "--nextn", "1"],
    "mk_deepseek2_legacy_kv_b": _MK_DS2 + _MK_MOE + ["--q-lora", "0", "--legacy-kv-b", "--gating", "softmax",
                                                     "--no-expert-norm", "--shared-experts", "2"],
    "mk_gptoss": ["--arch", "gpt-oss", "--kv-heads", "1", "--head-dim", "4", "--type-experts", "f16", "--swa", "2",
                  "--yarn", "32"] + _MK_MOE,
    # a DeltaNet layer then a gated attention layer
    "mk_qwen3next": ["--arch", "qwen3next", "--kv-heads", "1", "--head-dim", "4", "--rope-dim", "2",
                     "--ssm-state", "4", "--ssm-groups", "1", "--ssm-heads", "2", "--full-attention-interval", "2"]
                    + _MK_MOE,
    "mk_qwen35moe_layers": ["--arch", "qwen35moe", "--kv-heads", "1", "--head-dim", "4", "--rope-dim", "2",
                            "--ssm-state", "4", "--ssm-groups", "1", "--ssm-heads", "2", "--recurrent-layers", "10"]
                           + _MK_MOE,
}


def find_mkmodel(explicit=None):
    """bloomery-mkmodel: explicit, else in $BLOOMERY_BIN, else in build/; None if absent."""
    cands = [explicit] if explicit else []
    if os.environ.get("BLOOMERY_BIN"):
        cands.append(os.path.join(os.environ["BLOOMERY_BIN"], "bloomery-mkmodel"))
    cands += [os.path.join(ROOT, "build", "tools", "bloomery-mkmodel"),
              os.path.join(ROOT, "build", "bin", "bloomery-mkmodel")]
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def write_mkmodel_seeds(mkmodel, out_dir):
    """The mk_* seeds; one the tool refuses (an older build) is left out with a line on
    stderr, so that the other seeds are still written."""
    for name, args in MKMODEL_SEEDS.items():
        path = os.path.join(out_dir, name + ".gguf")
        p = subprocess.run([mkmodel, "-o", path + ".tmp", "--seed", "1", "--threads", "1"] + _MK_COMMON + args,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
        if p.returncode != 0:
            sys.stderr.write("make_corpus.py: %s left out: %s exited with %d: %s\n"
                             % (name, mkmodel, p.returncode, p.stderr.strip()))
            if os.path.exists(path + ".tmp"):
                os.remove(path + ".tmp")
            continue
        os.replace(path + ".tmp", path)


def main(argv):
    args = argv[1:]
    mkmodel = None
    if len(args) == 3 and args[0] == "--mkmodel":
        mkmodel, args = args[1], args[2:]
        if not (os.path.isfile(mkmodel) and os.access(mkmodel, os.X_OK)):
            sys.stderr.write("make_corpus.py: %s is not an executable\n" % mkmodel)
            return 2
    if len(args) != 1 or args[0].startswith("-"):
        sys.stderr.write("usage: make_corpus.py [--mkmodel PATH] CORPUS_DIR\n")
        return 2
    out_dir = args[0]
    os.makedirs(out_dir, exist_ok=True)
    every = dict(seeds())
    every.update(arch_seeds())
    for name, data in every.items():
        with open(os.path.join(out_dir, name + ".gguf"), "wb") as f:
            f.write(data)
    mkmodel = find_mkmodel(mkmodel)
    if mkmodel:
        write_mkmodel_seeds(mkmodel, out_dir)
    else:
        sys.stderr.write("make_corpus.py: bloomery-mkmodel not found (build/ first, set BLOOMERY_BIN or give "
                         "--mkmodel): the mk_* seeds are left out\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
