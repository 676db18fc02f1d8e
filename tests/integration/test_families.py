"""Model families beside the session's qwen3moe, each on a tiny file bloomery-mkmodel
writes (FAMILIES: one line a family; two lines may share an architecture, as
deepseek2's two file forms do): the CPU pass against the float64 reference
(tests/reference) in default and --precise mode, and for the families marked long a
prompt of some 300 tokens; the server's n_probs against bloomery-cli's; --workers 2
and routed experts in the hosttier (-ot ...=HOSTTIER) giving exactly the one-worker
answers; chat end to end with the file's own template (the rendered prompt, one BOS
at the start of what is evaluated, reasoning split out, a forced tool call in the
family's form); the family's end-of-generation tokens ending a reply (and harmony's
<|end|>, which ends a message, not ending it); and files with a key or a tensor
missing or wrong refused by its name, by bloomery-cli and bloomery-serve."""
import collections
import functools
import json
import operator
import os
import re
import subprocess
import sys

import pytest

import serverctl
from sse import post
from test_oracle import TOL, greedy

sys.path.insert(0, os.path.join(serverctl.ROOT, "tests", "reference"))
import compare  # noqa: E402
import gguf  # noqa: E402
import gguf_write  # noqa: E402
import model as refmodel  # noqa: E402

REFERENCE = os.path.join(serverctl.ROOT, "tests", "reference", "reference.py")

# family -> its architecture, the other bloomery-mkmodel flags of its tiny file, and
# "long": also the ~300-token prompt against the reference (test_long_prompt_...)
FAMILIES = {
    "glm4moe": {"arch": "glm4moe", "flags": ["--layers", "3", "--seed", "7"]},
    # DeepSeek-V3's shape cut down: latent attention with q compressed (the MLA file
    # form, attn_k_b/attn_v_b), a leading dense layer, 8 routed experts chosen 2 from
    # the 2 best of 4 groups with sigmoid scores and a selection bias, a shared
    # expert, YaRN by 40.
    # The seeds: weights where no prompt below puts two groups or experts, or the top
    # two logits, within the default mode's rounding of each other (seed 1 of the
    # MLA file has two groups 0.0003 apart at one position of the chat prompt: the
    # quantized pass picks the other one, 0.7 off in the logits there, while
    # --precise agrees to 1e-6)
    "deepseek2": {"arch": "deepseek2", "long": True,
                  "flags": ["--layers", "3", "--experts", "8", "--experts-used", "2",
                            "--groups", "4", "--groups-used", "2", "--yarn", "40",
                            "--seed", "4"]},
    # DeepSeek-V2-Lite's kind: the legacy file form (one attn_kv_b), q uncompressed
    # (attn_q), softmax scores and no selection bias
    "deepseek2-legacy": {"arch": "deepseek2", "long": True,
                         "flags": ["--layers", "3", "--experts", "8", "--experts-used", "2",
                                   "--groups", "4", "--groups-used", "2", "--yarn", "40",
                                   "--legacy-kv-b", "--q-lora", "0", "--gating", "softmax",
                                   "--seed", "8"]},
    # gpt-oss cut down: attention biases and sinks, even layers sliding over a window
    # of 4 (every prompt here is longer, the long one by far: a sliding layer sees its
    # last 4 positions, layer 1 all of them), 8 routed experts with biases chosen 2
    # (softmax over the chosen logits), MXFP4 experts (the default), YaRN by 32
    "gpt-oss": {"arch": "gpt-oss", "long": True,
                "flags": ["--layers", "3", "--experts", "8", "--experts-used", "2",
                          "--swa", "4", "--yarn", "32"]},
    # the Qwen3-Next / Qwen3.5 hybrids cut down: DeltaNet layers 0-2 and 4, gated
    # attention in layer 3 (every fourth), 8 routed experts chosen 2 plus the gated
    # shared expert, q/k heads read by twice as many v heads (in place in qwen3next,
    # tiled in qwen35moe); qwen35moe's files end with a NextN layer. Long: the
    # recurrence runs over some 300 positions.
    "qwen3next": {"arch": "qwen3next", "long": True,
                  "flags": ["--layers", "5", "--experts", "8", "--experts-used", "2", "--seed", "7"]},
    "qwen35moe": {"arch": "qwen35moe", "long": True,
                  "flags": ["--layers", "5", "--experts", "8", "--experts-used", "2", "--seed", "7"]},
}

# architectures whose cache holds a recurrent state (no cut to an arbitrary prefix)
HYBRID = ("qwen3next", "qwen35moe")


def ds(name):
    """A DeepSeek special token's text: its bars are U+FF5C, its spaces U+2581."""
    return "<\uff5c%s\uff5c>" % name.replace(" ", "\u2581")


DS_CALLS = (ds("tool calls begin"), ds("tool call begin"), ds("tool sep"), ds("tool call end"),
            ds("tool calls end"))

# What an architecture's own vocabulary and template (bloomery-mkmodel writes the
# same ones for every file of an architecture) make of a conversation; the tests
# that need it skip a family whose architecture has no entry. The prompts are as
# /apply-template gives them: without the BOS text, which the tokenizer adds.
OSS_SYSTEM = ("<|start|>system<|message|>You are a small synthetic model; your weights are random, "
              "so what you write means nothing.\n\n# Valid channels: analysis, commentary, final. "
              "Channel must be included for every message.<|end|>")
QWEN_FORM = {
    "chat_prompt": "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "system_user": ("Be brief.", "Hi there",
                    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                    "<|im_start|>assistant\n"),
    "thinking": ({"enable_thinking": False},
                 "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    "chat_format": "hermes",
    "reasoning": ({}, "<think>The iron is hot.</think>Strike now."),
    # hermes: one JSON object of name and arguments between the markers
    "call": r"<tool_call>\s*(?P<args_obj>\{.*\})\s*</tool_call>",
    "ends": {"<|im_end|>": "tokenizer.ggml.eos_token_id"},
}

# Qwen3.5: Qwen's turns, calls as <function=NAME> with <parameter=KEY> lines (the
# server's qwen3-coder form)
QWEN35_FORM = dict(QWEN_FORM, chat_format="qwen3-coder",
                   call=r"<tool_call>\s*<function=paint>\s*(?:<parameter=(?:color|coats)>[^<]*</parameter>\s*){2}"
                        r"</function>\s*</tool_call>")

FORMS = {
    # Qwen3-Next speaks Qwen3's chat form (bloomery-mkmodel writes its built-in Qwen
    # template into its files), Qwen3.5 its own tool form
    "qwen3next": QWEN_FORM,
    "qwen35moe": QWEN35_FORM,
    "glm4moe": {
        "chat_prompt": "[gMASK]<sop><|user|>\nWhat is the capital of France?<|assistant|>\n",
        "system_user": ("Be brief.", "Hi there",
                        "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHi there<|assistant|>\n"),
        "chat_format": "glm-4.5",
        # (the request's extra fields, the reply a grammar forces: a thought, then text)
        "reasoning": ({}, "<think>The iron is hot.</think>Strike now."),
        # the text the model writes for a forced call of paint with its two arguments
        # (whitespace around it stripped); a group "args", where the form has one, is
        # the arguments' JSON
        "call": r"<tool_call>paint\s*(?:<arg_key>(?:color|coats)</arg_key>\s*"
                r"<arg_value>[^<]*</arg_value>\s*){2}</tool_call>",
        # special text -> the metadata key that names it an end of generation
        "ends": {"<|user|>": "tokenizer.ggml.eot_token_id",
                 "<|observation|>": "tokenizer.ggml.eom_token_id",
                 "<|endoftext|>": "tokenizer.ggml.eos_token_id"},
    },
    # the DeepSeek-V3.1 form: BOS and the system text, <｜User｜>..., and the generation
    # prompt <｜Assistant｜></think> (thinking off) or <｜Assistant｜><think>
    "deepseek2": {
        "chat_prompt": ds("User") + "What is the capital of France?" + ds("Assistant") + "</think>",
        "system_user": ("Be brief.", "Hi there",
                        "Be brief." + ds("User") + "Hi there" + ds("Assistant") + "</think>"),
        # the user turn alone, rendered with these chat_template_kwargs
        "thinking": ({"enable_thinking": True},
                     ds("User") + "Hi there" + ds("Assistant") + "<think>"),
        "chat_format": "deepseek-v3.1",
        # with thinking on the generation prompt opens <think>: the reply starts in it
        "reasoning": ({"chat_template_kwargs": {"enable_thinking": True}},
                      "The iron is hot.</think>Strike now."),
        "call": (re.escape(DS_CALLS[0]) + r"\s*" + re.escape(DS_CALLS[1]) + "paint" +
                 re.escape(DS_CALLS[2]) + r"(?P<args>.*)" + re.escape(DS_CALLS[3]) + r"\s*" +
                 re.escape(DS_CALLS[4])),
        "ends": {ds("end of sentence"): "tokenizer.ggml.eos_token_id"},
    },
    # harmony: the system message (the template's own text), the developer message
    # holding the system prompt, the user's, and the generation prompt <|start|>assistant;
    # the reply is channels: analysis (the thought), final (the answer), commentary
    # to=functions.NAME (a call)
    "gpt-oss": {
        "chat_prompt": (OSS_SYSTEM + "<|start|>user<|message|>What is the capital of France?<|end|>"
                        "<|start|>assistant"),
        "system_user": ("Be brief.", "Hi there",
                        OSS_SYSTEM + "<|start|>developer<|message|># Instructions\n\nBe brief.<|end|>"
                        "<|start|>user<|message|>Hi there<|end|><|start|>assistant"),
        "chat_format": "gpt-oss",
        "reasoning": ({}, "<|channel|>analysis<|message|>The iron is hot.<|end|>"
                          "<|start|>assistant<|channel|>final<|message|>Strike now."),
        # one message in the commentary channel, its arguments JSON (the forcing
        # grammar lets the model think first, in an analysis message, as llama.cpp's
        # does; and like every form's here, it lets whitespace in where the form has a
        # space); a group "thought", where it matched, is the reasoning_content
        "call": (r"(?:<\|channel\|>analysis<\|message\|>(?P<thought>(?:(?!<\|end\|>).)*)<\|end\|>"
                 r"<\|start\|>assistant)?"
                 r"<\|channel\|>commentary\s+to=functions\.paint\s*<\|constrain\|>json<\|message\|>"
                 r"(?P<args>\{.*\})(?:<\|call\|>)?"),
        "ends": {"<|return|>": "tokenizer.ggml.eos_token_id",
                 "<|call|>": "tokenizer.ggml.eom_token_id"},
        # ends a message, and the reply goes on (llama.cpp takes it out of the
        # end-of-generation tokens when <|return|> and <|call|> are there)
        "not_ends": ["<|end|>"],
    },
}

# A family's broken files: (what is wrong, the change, the name the refusal must give).
# The change is rewrite()'s keywords. The first case is also tried on bloomery-serve.
DS2 = "deepseek2."
OSS = "gpt-oss."
BAD_FILES = {
    "glm4moe": [
        ("the NextN layer's eh_proj is missing", {"drop_tensors": ["blk.3.nextn.eh_proj.weight"]},
         "blk.3.nextn.eh_proj.weight"),
        ("expert_shared_count is missing", {"drop_keys": ["glm4moe.expert_shared_count"]},
         "glm4moe.expert_shared_count"),
        ("gating function 7", {"set_keys": {"glm4moe.expert_gating_func": 7}},
         "glm4moe.expert_gating_func"),
        ("a selection bias of 7 values for 8 experts", {"lengths": {"blk.1.exp_probs_b.bias": 7}},
         "blk.1.exp_probs_b.bias"),
    ],
    "deepseek2": [
        ("a MoE layer's attn_k_b is missing", {"drop_tensors": ["blk.1.attn_k_b.weight"]},
         "blk.1.attn_k_b.weight"),
        ("kv_lora_rank is missing", {"drop_keys": [DS2 + "attention.kv_lora_rank"]},
         DS2 + "attention.kv_lora_rank"),
        ("3 expert groups for 8 experts", {"set_keys": {DS2 + "expert_group_count": 3}},
         DS2 + "expert_group_count"),
        ("linear RoPE scaling", {"set_keys": {DS2 + "rope.scaling.type": "linear"}},
         DS2 + "rope.scaling.type"),
        ("key_length_mla without value_length_mla",
         {"drop_keys": [DS2 + "attention.value_length_mla"]}, DS2 + "attention.value_length_mla"),
    ],
    "deepseek2-legacy": [
        ("a MoE layer's attn_kv_b is missing", {"drop_tensors": ["blk.1.attn_kv_b.weight"]},
         "blk.1.attn_kv_b.weight"),
        ("no q_lora_rank and attn_q missing", {"drop_tensors": ["blk.2.attn_q.weight"]},
         "blk.2.attn_q.weight"),
        ("gating function 3", {"set_keys": {DS2 + "expert_gating_func": 3}},
         DS2 + "expert_gating_func"),
    ],
    # the file has no sliding_window_pattern (the default period 2) and no
    # freq_base_swa: those two cases add the key
    "qwen3next": [
        ("a DeltaNet layer's ssm_a is missing", {"drop_tensors": ["blk.1.ssm_a"]}, "blk.1.ssm_a"),
        ("ssm.state_size is missing", {"drop_keys": ["qwen3next.ssm.state_size"]}, "qwen3next.ssm.state_size"),
        ("inner_size is not state_size x time_step_rank",
         {"set_keys": {"qwen3next.ssm.inner_size": 12345}}, "qwen3next.ssm"),
        ("a DeltaNet layer's attn_qkv is missing", {"drop_tensors": ["blk.0.attn_qkv.weight"]},
         "blk.0.attn_qkv.weight"),
        ("the shared expert's gate is missing", {"drop_tensors": ["blk.2.ffn_gate_inp_shexp.weight"]},
         "blk.2.ffn_gate_inp_shexp.weight"),
        ("recurrent_layers of 2 values for 5 layers",
         {"set_keys": {"qwen3next.attention.recurrent_layers": [True, False]}},
         "qwen3next.attention.recurrent_layers"),
    ],
    "qwen35moe": [
        ("rope.dimension_sections is missing", {"drop_keys": ["qwen35moe.rope.dimension_sections"]},
         "qwen35moe.rope.dimension_sections"),
        ("a DeltaNet layer's ssm_alpha is missing", {"drop_tensors": ["blk.4.ssm_alpha.weight"]},
         "blk.4.ssm_alpha.weight"),
        ("the NextN layer's eh_proj is missing", {"drop_tensors": ["blk.5.nextn.eh_proj.weight"]},
         "blk.5.nextn.eh_proj.weight"),
        ("sections leaving rotated pairs to the image section",
         {"set_keys": {"qwen35moe.rope.dimension_sections": [1, 1, 1, 1]}}, "qwen35moe.rope.dimension_sections"),
    ],
    "gpt-oss": [
        ("a layer's attention sinks are missing", {"drop_tensors": ["blk.1.attn_sinks.weight"]},
         "blk.1.attn_sinks.weight"),
        ("sliding_window is missing", {"drop_keys": [OSS + "attention.sliding_window"]},
         OSS + "attention.sliding_window"),
        ("a sliding-window period of 0",
         {"set_keys": {OSS + "attention.sliding_window_pattern": (gguf.T_UINT32, 0)}},
         OSS + "attention.sliding_window_pattern"),
        # the same bytes, the dimensions swapped: [n_expert, E] for [E, n_expert]
        ("ffn_down_exps.bias shaped [8, 256]", {"shapes": {"blk.0.ffn_down_exps.bias": (8, 256)}},
         "blk.0.ffn_down_exps.bias"),
        ("the sliding layers' own RoPE base",
         {"set_keys": {OSS + "rope.freq_base_swa": (gguf.T_FLOAT32, 10000.0)}},
         OSS + "rope.freq_base_swa"),
    ],
}

PLAIN = ["The old lighthouse keeper walked down to the",
         "In 1984, 12345 apples cost $6.78 at the market."]
# gates of the CPU pass against the float64 reference: default mode quantizes the
# activations and keeps an f16 cache; --precise is f32 throughout, so only the sums'
# order separates it from float64
GATES = {"default": {"mean": 0.02, "max": None, "lse": 0.05},
         "precise": {"mean": 0.005, "max": 0.05, "lse": 0.05}}
FAST = ["-np", "1", "-c", "1024", "-t", "1", "-tb", "1"]


def run(args, timeout=120):
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", timeout=timeout)


def rewrite(src, dst, drop_tensors=(), drop_keys=(), set_keys=None, lengths=None, shapes=None):
    """Copies a GGUF file with tensors or keys left out, keys given other values (a key
    the file lacks is added after the others, its value a (gguf type, value) pair), 1-D
    tensors cut or stretched to another length, or tensors given other dimensions over
    the same bytes (shapes: name -> ne, of as many values); every other byte is the
    source's."""
    g = gguf.load(src)
    w = gguf_write.Writer(alignment=g.alignment)
    set_keys = set_keys or {}
    for key, value in g.metadata.items():
        if key in drop_keys:
            continue
        w.add(key, set_keys.get(key, value), typ=g.metadata_types[key])
    for key, value in set_keys.items():
        if key not in g.metadata:
            w.add(key, value)
    for name, t in g.tensors.items():
        if name in drop_tensors:
            continue
        ne, raw = t.ne, bytes(t.raw)
        if lengths and name in lengths:
            n = lengths[name]
            ne, raw = (n,), (raw * (n // t.ne[0] + 1))[:n * len(raw) // t.ne[0]]
        if shapes and name in shapes:
            ne = tuple(shapes[name])
            count = lambda dims: functools.reduce(operator.mul, dims, 1)  # noqa: E731
            assert count(ne) == count(t.ne), (name, t.ne, ne)
        w.tensors.append((name, ne, t.type, raw))  # the bytes as they are: any ggml type
    w.write(dst)


Family = collections.namedtuple("Family", "name path arch")


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    """(name, path of its tiny file, architecture)."""
    name, spec = request.param, FAMILIES[request.param]
    path = str(tmp_path_factory.mktemp(name) / ("%s.gguf" % name))
    p = run([serverctl.program("bloomery-mkmodel"), "-o", path, "--threads", "2",
             "--arch", spec["arch"]] + spec["flags"], timeout=300)
    assert p.returncode == 0, p.stdout
    assert gguf.load(path).metadata["general.architecture"] == spec["arch"]
    return Family(name, path, spec["arch"])


def forms(family):
    if family.arch not in FORMS:
        pytest.skip("FORMS has no entry for %s" % family.arch)
    return FORMS[family.arch]


@pytest.fixture(scope="module")
def one(family, module_servers):
    """A one-worker server of the family's file."""
    return module_servers.start(FAST, model=family.path)


# ids a position of bloomery-cli's dump holds: more than the reference's 32, so that
# every one of those is found, even the 32nd when it and the 33rd are all but tied
CLI_TOP = 40


def cli_dump(model, prompt, out, *extra):
    p = run([serverctl.program("bloomery-cli"), "-m", model, "-p", prompt, "-n", "0", "-t", "1",
             "--dump-logits", str(out), "--dump-top", str(CLI_TOP)] + list(extra))
    assert p.returncode == 0, p.stdout
    with open(out) as f:
        return json.load(f)


def prompts(family):
    return PLAIN + ([FORMS[family.arch]["chat_prompt"]] if family.arch in FORMS else [])


# ------------------------------------------------------------------ the CPU pass

@pytest.mark.parametrize("k", range(len(PLAIN) + 1))
def test_cpu_pass_against_the_reference(family, tmp_path, k):
    """bloomery-cli's logits at every prompt position, default and --precise, against
    the float64 reference's on the same ids."""
    name, model = family.name, family.path
    ps = prompts(family)
    if k >= len(ps):
        pytest.skip("no chat-form prompt for %s" % name)
    dumps = {mode: cli_dump(model, ps[k], tmp_path / ("%s.json" % mode),
                            *(["--precise"] if mode == "precise" else [])) for mode in GATES}
    assert dumps["default"]["prompt_ids"] == dumps["precise"]["prompt_ids"]
    ref_path = tmp_path / "ref.json"
    p = run([sys.executable, REFERENCE, model, "--oracle", str(tmp_path / "default.json"),
             "--dump-logits", str(ref_path), "-q"])
    assert p.returncode == 0, p.stdout
    ref = compare.load(str(ref_path))
    for mode, gate in GATES.items():
        m = compare.compare(ref, dumps[mode])
        summary = "%s %s on %r: %s" % (name, mode, ps[k], {x: m[x] for x in (
            "positions", "top1_same", "mean_abs_dlogit", "max_abs_dlogit", "max_abs_dlse")})
        assert m["positions"] == len(ref["prompt_ids"]) >= 5, summary
        assert m["n_missing"] == 0, summary
        assert m["top1_same"] == m["positions"], summary
        assert m["mean_abs_dlogit"] <= gate["mean"], summary
        assert gate["max"] is None or m["max_abs_dlogit"] <= gate["max"], summary
        assert m["max_abs_dlse"] <= gate["lse"], summary


# the families whose NextN layer runs (--mtp, --spec-type draft-mtp)
MTP_FAMILIES = ("glm4moe", "qwen35moe")


def mtp_dump(model, prompt, out, *extra):
    """bloomery-cli --mtp's greedy run of MTP_STEPS tokens with its dump, and what it
    printed."""
    p = run([serverctl.program("bloomery-cli"), "-m", model, "-p", prompt, "-n", str(MTP_STEPS), "-t", "1",
             "--temp", "0", "--mtp", "--dump-logits", str(out), "--dump-top", str(CLI_TOP)] + list(extra))
    assert p.returncode == 0, p.stdout
    with open(out) as f:
        return json.load(f), p.stdout


MTP_STEPS = 8


@pytest.mark.parametrize("k", range(len(PLAIN)))
def test_nextn_layer_against_the_reference(family, tmp_path, k):
    """The NextN layer's logits after each greedy token (bloomery-cli --mtp: the
    layer over the prompt's rows, then one row a step) against the float64
    reference's over the same ids, default and --precise; its proposals' count is
    printed; the model's own tokens are those without --mtp."""
    if family.arch not in MTP_FAMILIES:
        pytest.skip("%s's NextN layer does not run" % family.arch)
    plain = cli_dump(family.path, PLAIN[k], tmp_path / "plain.json", "-n", str(MTP_STEPS), "--temp", "0")
    for mode, gate in GATES.items():
        extra = ["--precise"] if mode == "precise" else []
        d, out = mtp_dump(family.path, PLAIN[k], tmp_path / ("%s.json" % mode), *extra)
        assert re.search(r"NextN proposals: \d+ of %d were the token generated after the next" % (MTP_STEPS - 1),
                         out), out
        ids = [g["id"] for g in d["greedy"]]
        assert len(ids) == len(d["mtp"]) == MTP_STEPS
        assert d["mtp_in"] == ids  # each proposal read the token generated after its row
        if mode == "default":
            assert ids == [g["id"] for g in plain["greedy"]]
            assert d["positions"] == plain["positions"]  # the layer leaves the model's logits alone
        p = run([sys.executable, REFERENCE, family.path, "--oracle", str(tmp_path / ("%s.json" % mode)), "--mtp",
                 "--dump-logits", str(tmp_path / "ref.json"), "-q"])
        assert p.returncode == 0, p.stdout
        ref = compare.load(str(tmp_path / "ref.json"))
        m = compare.compare(ref, dict(d, positions=d["mtp"], prompt_ids=ref["prompt_ids"]))
        summary = "%s %s NextN on %r: %s" % (family.name, mode, PLAIN[k], {x: m[x] for x in (
            "positions", "top1_same", "mean_abs_dlogit", "max_abs_dlogit", "max_abs_dlse")})
        assert m["positions"] == MTP_STEPS and m["n_missing"] == 0, summary
        assert m["top1_same"] == m["positions"], summary
        assert m["mean_abs_dlogit"] <= gate["mean"], summary
        assert gate["max"] is None or m["max_abs_dlogit"] <= gate["max"], summary
        assert m["max_abs_dlse"] <= gate["lse"], summary


def test_nextn_layer_refused_where_it_does_not_run(family, tmp_path):
    """--mtp on a file without a NextN layer, or one whose NextN layer does not run
    yet, fails the load by name."""
    if family.arch in MTP_FAMILIES:
        pytest.skip("%s's NextN layer runs" % family.arch)
    p = run([serverctl.program("bloomery-cli"), "-m", family.path, "-p", "Hi", "-n", "1", "-t", "1", "--mtp"])
    assert p.returncode == 1, p.stdout
    assert re.search(r"the file has no NextN|the NextN layer of this architecture does not run yet", p.stdout), p.stdout


def test_nextn_drafts_in_the_server(family, one, servers):
    """--spec-type draft-mtp: the NextN layer proposes a token each step and the
    model verifies it; greedy replies and their log-probabilities are those without
    it bit for bit, over two slots at once and two stages, and a seeded sampled reply
    is the same text; the timings and /metrics count the proposals."""
    if family.arch not in MTP_FAMILIES:
        pytest.skip("%s's NextN layer does not run" % family.arch)
    import concurrent.futures
    from test_dropin import metric

    def ask(url, prompt, **kw):
        body = {"prompt": prompt, "n_predict": 16, "n_probs": 3, "temperature": 0, "ignore_eos": True,
                "cache_prompt": False, "return_tokens": True}
        body.update(kw)
        r = post(url, "/completion", body)
        assert r.status_code == 200, r.text
        return r.json()

    def probs(r):
        return [[(t["id"], t["logprob"]) for t in x["top_logprobs"]] for x in r["completion_probabilities"]]

    dry = run([serverctl.program("bloomery-serve"), "-m", family.path, "--spec-type", "draft-mtp", "--dry-run"])
    assert dry.returncode == 0 and "draft: the model's NextN layer (blk.%d)" % (
        gguf.load(family.path).metadata[family.arch + ".block_count"] - 1) in dry.stdout, dry.stdout
    # its tensors and K/V rows count in the last stage: more weights and cache than without it
    plain = run([serverctl.program("bloomery-serve"), "-m", family.path, "--dry-run"])
    stage = lambda text: re.search(r"event=plan stage 0: .*", text).group(0)  # noqa: E731
    assert stage(dry.stdout) != stage(plain.stdout), (stage(dry.stdout), stage(plain.stdout))
    spec = servers.start(["-np", "2", "-c", "2048", "-t", "1", "-tb", "1", "--spec-type", "draft-mtp",
                          "--draft-p-min", "0"], model=family.path)
    assert "event=draft kind=mtp" in spec.log(100000)
    drafted = 0
    for prompt in PLAIN:
        a, b = ask(one.url, prompt), ask(spec.url, prompt)
        assert b["tokens"] == a["tokens"] and probs(b) == probs(a), prompt
        assert b["timings"]["draft_n"] > 0 and 0 <= b["timings"]["draft_n_accepted"] <= b["timings"]["draft_n"]
        drafted += b["timings"]["draft_n"]
        sa, sb = (ask(u, prompt, temperature=0.8, seed=42) for u in (one.url, spec.url))
        assert sb["tokens"] == sa["tokens"], prompt
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        got = list(ex.map(lambda p: ask(spec.url, p), PLAIN[:2]))
    for prompt, r in zip(PLAIN[:2], got):
        assert r["tokens"] == ask(one.url, prompt)["tokens"], prompt
    assert metric(spec.url, "draft_tokens_total") >= drafted
    # two stages, with two steps in flight where the model has no recurrent state (a
    # hybrid's verify steps keep checkpoints: one step at a time)
    two = servers.start(["-np", "4", "-c", "2048", "-t", "1", "-tb", "1", "--workers", "2", "--spec-type",
                         "draft-mtp", "--draft-p-min", "0"], model=family.path)
    log = two.log(100000)
    if family.arch in HYBRID:
        assert "event=pipeline_off" not in log and "event=pipeline steps_in_flight" not in log, log
    else:
        assert "event=pipeline steps_in_flight=2 stages=2" in log, log
    with concurrent.futures.ThreadPoolExecutor(len(PLAIN)) as ex:
        got = list(ex.map(lambda p: ask(two.url, p), PLAIN))
    for prompt, r in zip(PLAIN, got):
        a = ask(one.url, prompt)
        assert r["tokens"] == a["tokens"] and probs(r) == probs(a), prompt
        assert r["timings"]["draft_n"] > 0, r["timings"]


def test_nextn_layer_in_the_saved_caches(family, servers, tmp_path):
    """The NextN layer's rows go with the slot's cache: the prompt cache on disk keeps
    them (a server after a restart answers from it, the same tokens; a hybrid's entry
    is the whole state after the reply, no prefix of the prompt, so it answers cold),
    and a slot file of a server with the layer is refused by one without it, by name."""
    if family.arch not in MTP_FAMILIES:
        pytest.skip("%s's NextN layer does not run" % family.arch)
    prompt = "The smith hammers the bloom, and the sparks fly far into the dark night. " * 3

    def ask(url):
        r = post(url, "/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0, "ignore_eos": True,
                                      "return_tokens": True})
        assert r.status_code == 200, r.text
        return r.json()

    mtp = FAST + ["--spec-type", "draft-mtp", "--draft-p-min", "0", "--slot-save-path", str(tmp_path / "slots"),
                  "--cache-disk", str(tmp_path / "pc")]
    srv = servers.start(mtp, model=family.path)
    cold = ask(srv.url)
    r = post(srv.url, "/slots/0?action=save", {"filename": "s.bin"})
    assert r.status_code == 200, r.text
    srv.stop()
    again = servers.start(mtp, model=family.path)
    warm = ask(again.url)
    assert warm["tokens"] == cold["tokens"]
    if family.arch not in HYBRID:
        assert warm["timings"]["prompt_n"] < cold["timings"]["prompt_n"], warm["timings"]
    plain = servers.start(FAST + ["--slot-save-path", str(tmp_path / "slots")], model=family.path)
    r = post(plain.url, "/slots/0?action=restore", {"filename": "s.bin"})
    assert r.status_code == 400 and "laid out for other layers" in r.text, r.text


def test_nextn_drafts_refused_by_name(family, servers, tmp_path):
    """--spec-type draft-mtp on a file whose NextN layer does not run, or with a
    draft model beside it, fails the start by name."""
    cases = [(["--spec-type", "draft-mtp", "-md", family.path], "a NextN head in a file of its own")]
    if family.arch not in MTP_FAMILIES:
        cases.append((["--spec-type", "draft-mtp"], r"has no NextN|has a NextN layer that does not run yet"))
    for extra, want in cases:
        srv = servers.launch(FAST + extra, model=family.path)
        assert srv.proc.wait(60) == 1, srv.log()
        assert re.search(want, srv.log(100000)), srv.log()


# keys llama.cpp does not read for an architecture, with values that would move the
# logits were they read: a drop-in server must compute what llama-server does
UNREAD_KEYS = {
    "gpt-oss": {OSS + "expert_weights_scale": 2.5},
    "qwen3next": {"qwen3next.expert_weights_scale": 2.5},
    "qwen35moe": {"qwen35moe.expert_weights_scale": 2.5},
}


def test_keys_llama_cpp_does_not_read_change_nothing(family, tmp_path):
    """The family's file with UNREAD_KEYS set gives bloomery-cli the logits of the file
    without them, bit for bit, and the reference reads the same hyperparameters."""
    if family.name not in UNREAD_KEYS:
        pytest.skip("UNREAD_KEYS has no entry for %s" % family.name)
    md = gguf.load(family.path).metadata
    keys = {k: v if k in md else (gguf.T_FLOAT32, v) for k, v in UNREAD_KEYS[family.name].items()}
    other = str(tmp_path / "keys.gguf")
    rewrite(family.path, other, set_keys=keys)
    changed = gguf.load(other).metadata
    assert all(changed[k] == v for k, v in UNREAD_KEYS[family.name].items())
    want = cli_dump(family.path, PLAIN[1], tmp_path / "want.json")
    got = cli_dump(other, PLAIN[1], tmp_path / "got.json")
    assert got["prompt_ids"] == want["prompt_ids"]
    assert got["positions"] == want["positions"], "%s: a key llama.cpp ignores moved the logits" % family.name
    assert vars(refmodel.Hparams(changed)) == vars(refmodel.Hparams(md))


# some 300 tokens: positions well past the short prompts', where YaRN's stretched
# low frequencies and the long causal sums show
LONG = " ".join(["The smith heats the iron until it glows, then strikes it on the anvil."] * 12)
LONG_TAIL = 20


def test_long_prompt_against_the_reference(family, tmp_path):
    """A family marked long: bloomery-cli's logits (default mode) over a ~300-token
    prompt against the float64 reference's, at the last LONG_TAIL positions."""
    name, model = family.name, family.path
    if not FAMILIES[name].get("long"):
        pytest.skip("%s is not marked long" % name)
    dump = cli_dump(model, LONG, tmp_path / "cli.json")
    n = len(dump["prompt_ids"])
    assert 250 <= n <= 400, n
    ref_path = tmp_path / "ref.json"
    p = run([sys.executable, REFERENCE, model, "--oracle", str(tmp_path / "cli.json"),
             "--dump-logits", str(ref_path), "-q"], timeout=300)
    assert p.returncode == 0, p.stdout
    ref = compare.load(str(ref_path))
    assert len(ref["positions"]) == len(dump["positions"]) == n
    tail = lambda d: dict(d, positions=d["positions"][-LONG_TAIL:])  # noqa: E731
    m = compare.compare(tail(ref), tail(dump))
    summary = "%s, %d tokens, last %d positions: %s" % (name, n, LONG_TAIL, {x: m[x] for x in (
        "positions", "top1_same", "mean_abs_dlogit", "max_abs_dlogit", "max_abs_dlse")})
    assert m["positions"] == LONG_TAIL and m["n_missing"] == 0, summary
    assert m["top1_same"] == m["positions"], summary
    assert m["mean_abs_dlogit"] <= GATES["default"]["mean"], summary
    assert m["max_abs_dlse"] <= GATES["default"]["lse"], summary


# ------------------------------------------------------------------ the server

def test_n_probs_agree_with_cli(family, one, tmp_path):
    dump = cli_dump(family.path, prompts(family)[-1], tmp_path / "dump.json")
    last = dump["positions"][-1]
    cli_lp = {i: lg - last["lse"] for i, lg in zip(last["ids"], last["logits"])}
    b = greedy(one.url, dump["prompt_ids"], 1)
    assert b["tokens_evaluated"] == len(dump["prompt_ids"])
    top = b["completion_probabilities"][0]["top_logprobs"]
    assert len(top) == 5
    for t in top:
        assert t["id"] in cli_lp, "server candidate %r is not in the cli's top %d" % (t, CLI_TOP)
        assert abs(t["logprob"] - cli_lp[t["id"]]) <= TOL, (t, cli_lp[t["id"]])
    if last["logits"][0] - last["logits"][1] > TOL:
        assert top[0]["id"] == last["ids"][0]


def same_answers(family, url, other):
    for p in prompts(family):
        a, b = greedy(url, p), greedy(other, p)
        assert b["tokens"] == a["tokens"], p
        assert b["content"] == a["content"], p
        # bit-identical logits give identical log-probabilities
        for x, y in zip(a["completion_probabilities"], b["completion_probabilities"]):
            assert [(t["id"], t["logprob"]) for t in x["top_logprobs"]] == \
                   [(t["id"], t["logprob"]) for t in y["top_logprobs"]], p


def test_two_workers_same_as_one(family, one, servers):
    srv = servers.start(FAST + ["--workers", "2"], model=family.path)
    names = [n for _, n, _ in srv.children()]
    assert names.count("bloomery-worker") == 2, names
    assert names.count("bloomery-hosttier") == 0, names
    same_answers(family, one.url, srv.url)


def moe_layers(model):
    """(the layers the forward pass runs that have routed experts: not the leading dense
    ones, not the NextN ones past the end; how many layers it runs)."""
    g = gguf.load(model)
    arch = g.metadata["general.architecture"]
    n = g.metadata[arch + ".block_count"] - g.metadata.get(arch + ".nextn_predict_layers", 0)
    return [l for l in range(n) if "blk.%d.ffn_up_exps.weight" % l in g.tensors], n


@pytest.mark.parametrize("which", ["all", "some"])
def test_experts_in_the_hosttier_same_as_in_the_worker(family, one, servers, which):
    """The hybrid plan on the CPU: routed experts of every layer, or of the MoE layers
    past the first (a dense layer has none to move), in the hosttier process; the
    answers are the in-worker pass's, bit for bit."""
    layers, n_layer = moe_layers(family.path)
    assert len(layers) >= 2, layers
    moved = layers if which == "all" else layers[1:]
    pattern = ("ffn_.*_exps=HOSTTIER" if which == "all" else
               r"blk\.(%s)\.ffn_(up|down|gate)_exps=HOSTTIER" % "|".join(map(str, moved)))
    srv = servers.start(FAST + ["--workers", "2", "-ot", pattern], model=family.path)
    names = [n for _, n, _ in srv.children()]
    assert names.count("bloomery-worker") == 2, names
    assert names.count("bloomery-hosttier") == 1, names
    # the plan moved exactly the matched layers' experts
    assert "(%d of %d layers, the hosttier)" % (len(moved), n_layer) in srv.log(200000), srv.log()
    same_answers(family, one.url, srv.url)


# ------------------------------------------------------------------ chat

def apply_template(url, messages, **extra):
    r = post(url, "/apply-template", dict({"messages": messages}, **extra))
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def test_the_template_renders_the_family_form(family, one):
    f = forms(family)
    system, user, want = f["system_user"]
    assert apply_template(one.url, [{"role": "system", "content": system},
                                    {"role": "user", "content": user}]) == want
    # the chat prompt the CPU pass and n_probs tests take is the template's
    q = "What is the capital of France?"
    assert apply_template(one.url, [{"role": "user", "content": q}]) == f["chat_prompt"]
    if "thinking" in f:
        kwargs, want = f["thinking"]
        assert apply_template(one.url, [{"role": "user", "content": user}],
                              chat_template_kwargs=kwargs) == want
    assert "chat_format=%s" % f["chat_format"] in one.log(200000), one.log()


def test_qwen35_tool_turns_render_in_its_form(family, one):
    """Qwen3.5's form of a conversation with tools: the tools inside <tools> in the
    system turn, a past call as <function=NAME> with one <parameter=KEY> block an
    argument (a string raw, a number as JSON), its thought dropped, and two results in
    one user turn."""
    if family.arch != "qwen35moe":
        pytest.skip("Qwen3.5's form")
    tools = [{"type": "function", "function": {"name": "paint", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "Paint it."},
                {"role": "assistant", "content": "<think>Blue.</think>",
                 "tool_calls": [{"type": "function", "id": "c1",
                                 "function": {"name": "paint", "arguments": '{"color": "deep blue", "coats": 2}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "done"},
                {"role": "tool", "tool_call_id": "c2", "content": "dry"}]
    got = apply_template(one.url, messages, tools=tools)
    want = ('<|im_start|>system\nThese functions are available:\n<tools>\n'
            '{"name": "paint", "parameters": {"type": "object"}}\n</tools>\n')
    assert got.startswith(want), got
    assert ('<|im_start|>user\nPaint it.<|im_end|>\n<|im_start|>assistant\n<tool_call>\n<function=paint>\n'
            '<parameter=color>\ndeep blue\n</parameter>\n<parameter=coats>\n2\n</parameter>\n'
            '</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\ndone\n</tool_response>\n'
            '<tool_response>\ndry\n</tool_response><|im_end|>\n<|im_start|>assistant\n') in got, got
    assert "Blue." not in got


def test_one_bos_at_the_start_of_a_chat_prompt(family, one):
    """A template that writes bos_token itself (DeepSeek's) under a tokenizer that adds
    one: as llama.cpp, the server drops the text's, so the rendered prompt has none and
    the ids a chat evaluates are the tokenizer's of that text, one BOS at their start.
    What a chat evaluated is read back through the prompt cache: the same ids sent
    next find all but the last cached."""
    forms(family)
    md = gguf.load(family.path).metadata
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    text = apply_template(one.url, messages)
    r = post(one.url, "/tokenize", {"content": text, "add_special": True})
    assert r.status_code == 200, r.text
    ids = r.json()["tokens"]
    bos = md.get("tokenizer.ggml.bos_token_id")
    if md.get("tokenizer.ggml.add_bos_token"):
        r = post(one.url, "/detokenize", {"tokens": [bos]})
        assert r.status_code == 200, r.text
        bos_text = r.json()["content"]
        assert bos_text and not text.startswith(bos_text), (bos_text, text)
        assert ids[0] == bos and bos not in ids[1:], ids
    r = post(one.url, "/v1/chat/completions", {"messages": messages, "max_tokens": 1,
                                               "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(ids), (r.json(), ids)
    r = post(one.url, "/completion", {"prompt": ids, "n_predict": 1, "temperature": 0,
                                      "cache_prompt": True})
    assert r.status_code == 200, r.text
    b = r.json()
    assert b["tokens_evaluated"] == len(ids), b
    assert (b["timings"]["cache_n"], b["timings"]["prompt_n"]) == (len(ids) - 1, 1), (b, ids)


def test_reasoning_split_out(family, one):
    """The default reasoning format (llama-server's auto) takes the <think> span out of
    a reply that a grammar makes the model write word for word (from the <think> on,
    or after it where the generation prompt opened it)."""
    extra, reply = forms(family)["reasoning"]
    r = post(one.url, "/v1/chat/completions", dict({
        "messages": [{"role": "user", "content": "Should I wait?"}], "max_tokens": 120,
        "grammar": "root ::= %s" % json.dumps(reply)}, **extra))
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "stop", ch
    assert ch["message"].get("reasoning_content") == "The iron is hot.", ch
    assert ch["message"]["content"] == "Strike now.", ch


# every call this tool allows is short, so the forced grammar ends whatever the model picks
# (but a thought before it, which gpt-oss's forced grammar allows, ends only where the
# model writes <|end|>: some 300 tokens of random text for the seeds below, so the
# test's max_tokens leaves room, within FAST's 1024 positions)
TOOLS = [{"type": "function", "function": {
    "name": "paint", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["color", "coats"],
        "properties": {"color": {"type": "string", "enum": ["red", "deep blue"]},
                       "coats": {"type": "integer", "minimum": 1, "maximum": 3}}}}}]


@pytest.mark.parametrize("seed", [1, 2])
def test_forced_tool_call_in_the_family_form(family, one, seed):
    """tool_choice "required": the server forces a call in the format its template
    teaches; the text the model wrote is that form, and the reply is its parsed call."""
    form = re.compile(forms(family)["call"], re.S)
    r = post(one.url, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Paint the wall."}], "tools": TOOLS,
        "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 700,
        "temperature": 1.0, "seed": seed, "logprobs": True})
    assert r.status_code == 200, r.text
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "tool_calls", ch
    calls = ch["message"]["tool_calls"]
    assert len(calls) == 1 and calls[0]["type"] == "function" and calls[0]["id"], ch
    assert calls[0]["function"]["name"] == "paint", ch
    args = json.loads(calls[0]["function"]["arguments"])
    assert args["color"] in ("red", "deep blue") and args["coats"] in (1, 2, 3), args
    assert not (ch["message"].get("content") or "").strip(), ch
    # the tokens' bytes: a marker the model spelled out of byte tokens is whole here
    written = b"".join(bytes(t["bytes"]) for t in ch["logprobs"]["content"])
    written = written.decode("utf-8").strip()
    m = form.fullmatch(written)
    assert m, "the model wrote more or other than the call form %r:\n%s" % (form.pattern, written)
    if "args" in form.groupindex:
        assert json.loads(m.group("args")) == args, written
    if "thought" in form.groupindex:
        assert (ch["message"].get("reasoning_content") or "") == (m.group("thought") or ""), \
            (ch["message"], written)


# ------------------------------------------------------------------ end of generation

def test_end_of_generation_tokens_end_the_reply(family, one):
    """Each token the file names an end of generation (eos, eot, eom), made all but
    certain by logit_bias, ends a completion before any text: stop_type eos."""
    f = forms(family)
    md = gguf.load(family.path).metadata
    for text, key in f["ends"].items():
        r = post(one.url, "/tokenize", {"content": text, "with_pieces": True})
        assert r.status_code == 200, r.text
        pieces = r.json()["tokens"]
        assert len(pieces) == 1 and pieces[0]["piece"] == text, (text, pieces)
        tid = pieces[0]["id"]
        assert tid == md[key], (text, tid, key, md.get(key))
        r = post(one.url, "/completion", {"prompt": "The old lighthouse", "n_predict": 8,
                                          "temperature": 0, "return_tokens": True,
                                          "logit_bias": [[tid, 100]], "cache_prompt": False})
        assert r.status_code == 200, r.text
        b = r.json()
        assert (b["stop_type"], b["content"], b["tokens"]) == ("eos", "", []), (text, b)
        assert b["tokens_predicted"] == 1, (text, b)  # as llama-server: the end token counts
        # a chat reply ended by it stops as well
        r = post(one.url, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0,
            "logit_bias": {str(tid): 100}})
        assert r.status_code == 200, r.text
        ch = r.json()["choices"][0]
        assert ch["finish_reason"] == "stop" and not ch["message"].get("content"), (text, ch)


def test_message_ends_do_not_end_the_reply(family, one):
    """A token that ends a message but not the reply (harmony's <|end|>: the analysis
    message is followed by the final one), made all but certain by logit_bias, does
    not stop a completion or a chat: as llama-server, which takes <|end|> out of the
    end-of-generation tokens of a vocabulary with <|return|> and <|call|>, generation
    runs on to the token limit."""
    f = forms(family)
    if not f.get("not_ends"):
        pytest.skip("%s has no token that ends a message but not the reply" % family.arch)
    md = gguf.load(family.path).metadata
    ends = {md[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                            "tokenizer.ggml.eom_token_id") if k in md}
    n = 6
    for text in f["not_ends"]:
        r = post(one.url, "/tokenize", {"content": text, "with_pieces": True})
        assert r.status_code == 200, r.text
        pieces = r.json()["tokens"]
        assert len(pieces) == 1 and pieces[0]["piece"] == text, (text, pieces)
        tid = pieces[0]["id"]
        assert tid not in ends, (text, tid, ends)
        r = post(one.url, "/completion", {"prompt": "The old lighthouse", "n_predict": n,
                                          "temperature": 0, "return_tokens": True,
                                          "logit_bias": [[tid, 100]], "cache_prompt": False})
        assert r.status_code == 200, r.text
        b = r.json()
        assert b["stop_type"] != "eos", (text, b)
        assert (b["stop_type"], b["tokens_predicted"], b["tokens"]) == ("limit", n, [tid] * n), \
            (text, b)
        r = post(one.url, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": n, "temperature": 0,
            "logit_bias": {str(tid): 100}})
        assert r.status_code == 200, r.text
        body = r.json()
        ch = body["choices"][0]
        assert ch["finish_reason"] == "length", (text, body)
        assert body["usage"]["completion_tokens"] == n, (text, body)


def test_cache_states_saved_and_restored(family, servers, tmp_path):
    """The family's cache as the stages hold it (deepseek2's one latent plane, the
    others' K and V): a slot file saved and restored into another slot, and a prompt
    cache on disk read after a restart, each giving the cold reply from one evaluated
    token."""
    import time
    from test_dropin import metric
    slots, disk = tmp_path / "slots", tmp_path / "pcd"
    prompt = "The smith hammers the bloom, and the sparks fly far into the dark night. " * 3
    body = {"prompt": prompt, "n_predict": 6, "id_slot": 1, "cache_prompt": True, "temperature": 0}
    srv = servers.start(["-np", "2", "-c", "1024", "-t", "1", "-tb", "1", "-cram", "0", "--slot-save-path",
                         str(slots)], model=family.path)
    cold = post(srv.url, "/completion", body).json()
    r = post(srv.url, "/slots/1?action=save", {"filename": "s.bin"})
    assert r.status_code == 200, r.text
    r = post(srv.url, "/slots/0?action=restore", {"filename": "s.bin"})
    assert r.status_code == 200, r.text
    warm = post(srv.url, "/completion", dict(body, id_slot=0)).json()
    assert warm["content"] == cold["content"], (warm, cold)
    if family.arch in HYBRID:
        # the restored state is after the reply's tokens: it cannot go back to the
        # prompt's last one, and a restored slot has no checkpoints, so the prompt
        # runs whole; what continues the saved sequence starts from it
        assert warm["timings"]["prompt_n"] == cold["timings"]["prompt_n"], warm["timings"]
        return hybrid_disk_cache(family, servers, srv, body, disk)
    assert warm["timings"]["prompt_n"] == 1, warm["timings"]
    srv.stop()
    flags = ["-np", "1", "-c", "1024", "-t", "1", "-tb", "1", "-cram", "0", "--cache-disk", str(disk)]
    body = dict(body, id_slot=0)
    srv = servers.start(flags, model=family.path)
    post(srv.url, "/completion", body)
    for _ in range(200):  # the entry is written off the request's path
        if metric(srv.url, "prompt_cache_disk_saves_total") >= 1:
            break
        time.sleep(0.05)
    assert metric(srv.url, "prompt_cache_disk_saves_total") == 1
    srv.stop()
    srv = servers.start(flags, model=family.path)
    again = post(srv.url, "/completion", body).json()
    assert again["content"] == cold["content"], (again, cold)
    assert again["timings"]["prompt_n"] == 1, again["timings"]
    assert metric(srv.url, "prompt_cache_disk_hits_total") == 1


def hybrid_disk_cache(family, servers, srv, body, disk):
    """A recurrent state on disk (--cache-disk): the saved sequence is the prompt and
    the reply but its last token (sampled, never evaluated); after a restart, a prompt
    of exactly those tokens and that last one starts from the entry and evaluates one
    token, with the cold reply; the prompt alone (shorter than the entry) runs whole."""
    import time
    from test_dropin import metric
    ids = post(srv.url, "/tokenize", {"content": body["prompt"]}).json()["tokens"]
    srv.stop()
    flags = ["-np", "1", "-c", "1024", "-t", "1", "-tb", "1", "-cram", "0", "--cache-disk", str(disk)]
    body = dict(body, id_slot=0, return_tokens=True)
    srv = servers.start(flags, model=family.path)
    first = post(srv.url, "/completion", body).json()
    for _ in range(200):  # the entry is written off the request's path
        if metric(srv.url, "prompt_cache_disk_saves_total") >= 1:
            break
        time.sleep(0.05)
    assert metric(srv.url, "prompt_cache_disk_saves_total") == 1
    longer = dict(body, prompt=ids + first["tokens"])
    cold = post(srv.url, "/completion", dict(longer, cache_prompt=False)).json()
    srv.stop()
    srv = servers.start(flags, model=family.path)
    again = post(srv.url, "/completion", longer).json()
    assert again["timings"]["prompt_n"] == 1, again["timings"]
    assert again["content"] == cold["content"], (again, cold)
    assert metric(srv.url, "prompt_cache_disk_hits_total") == 1
    whole = post(srv.url, "/completion", dict(body, id_slot=0)).json()
    assert whole["timings"]["prompt_n"] == len(ids), whole["timings"]
    assert whole["content"] == first["content"]


def test_checkpoints_of_a_recurrent_state(family, servers):
    """A hybrid's slot goes back to its checkpoints (-ctxcp): the same prompt again
    evaluates one token, a longer one only what follows the checkpoint, each reply and
    its log-probabilities the cold ones bit for bit; -ctxcp 0 runs every prompt whole."""
    if family.arch not in HYBRID:
        pytest.skip("%s's cache is cut back to any prefix" % family.arch)
    from test_dropin import metric

    def greedy(url, prompt, n, cache_prompt=True):
        r = post(url, "/completion", {"prompt": prompt, "n_predict": n, "n_probs": 5, "temperature": 0,
                                      "ignore_eos": True, "cache_prompt": cache_prompt, "return_tokens": True})
        assert r.status_code == 200, r.text
        return r.json()

    prompt = "The smith hammers the bloom, and the sparks fly far into the dark night. " * 3
    longer = prompt + "The anvil rings."
    srv = servers.start(FAST + ["-cram", "0"], model=family.path)
    cold = {p: greedy(srv.url, p, 6, cache_prompt=False) for p in (prompt, longer)}
    first = greedy(srv.url, prompt, 6)
    again = greedy(srv.url, prompt, 6)
    more = greedy(srv.url, longer, 6)
    n = first["tokens_evaluated"]
    assert again["timings"]["prompt_n"] == 1, again["timings"]
    assert 1 < more["timings"]["prompt_n"] < more["tokens_evaluated"] - n + 2, more["timings"]
    for got, want in ((first, cold[prompt]), (again, cold[prompt]), (more, cold[longer])):
        assert got["tokens"] == want["tokens"]
        assert [[(t["id"], t["logprob"]) for t in x["top_logprobs"]] for x in got["completion_probabilities"]] == \
               [[(t["id"], t["logprob"]) for t in x["top_logprobs"]] for x in want["completion_probabilities"]]
    assert metric(srv.url, "checkpoints_total") >= 2
    assert metric(srv.url, "checkpoint_restores_total") == 2
    srv = servers.start(FAST + ["-cram", "0", "-ctxcp", "0"], model=family.path)
    greedy(srv.url, prompt, 6)
    again = greedy(srv.url, prompt, 6)
    assert again["timings"]["prompt_n"] == again["tokens_evaluated"], again["timings"]
    assert again["tokens"] == cold[prompt]["tokens"]
    assert metric(srv.url, "checkpoints_total") == 0


def test_a_recurrent_state_over_pipelined_stages(family, servers):
    """A hybrid over two workers with two steps in flight: four concurrent prompts
    long enough for a checkpoint every 16 tokens (-cpent 16), some due while the
    other slots' steps are in flight, then each prompt again from its checkpoint;
    every reply and its log-probabilities are the one-process cold ones bit for bit."""
    if family.arch not in HYBRID:
        pytest.skip("%s's cache is cut back to any prefix" % family.arch)
    import concurrent.futures
    from test_dropin import metric

    def greedy(url, prompt, cache_prompt=True):
        r = post(url, "/completion", {"prompt": prompt, "n_predict": 6, "n_probs": 5, "temperature": 0,
                                      "ignore_eos": True, "cache_prompt": cache_prompt, "return_tokens": True})
        assert r.status_code == 200, r.text
        return r.json()

    def probs(r):
        return [[(t["id"], t["logprob"]) for t in x["top_logprobs"]] for x in r["completion_probabilities"]]

    prompts = ["The smith hammers the bloom %d times, and the sparks fly into the dark. " % i * 2
               for i in range(4)]
    one = servers.start(["-np", "1", "-c", "1024", "-t", "1", "-tb", "1", "-cram", "0"], model=family.path)
    cold = {p: greedy(one.url, p, cache_prompt=False) for p in prompts}
    srv = servers.start(["-np", "4", "-c", "2048", "-t", "1", "-tb", "1", "-cram", "0", "-cpent", "16",
                         "--workers", "2"], model=family.path)
    assert "event=pipeline steps_in_flight=2 stages=2" in srv.log(100000)
    for _ in range(2):  # cold, then each prompt from its slot's checkpoint
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as ex:
            got = list(ex.map(lambda p: greedy(srv.url, p), prompts))
        for p, r in zip(prompts, got):
            assert r["tokens"] and r["tokens"] == cold[p]["tokens"], p
            assert probs(r) == probs(cold[p]), p
    assert metric(srv.url, "checkpoints_total") >= 8
    assert metric(srv.url, "checkpoint_restores_total") >= 1


def test_a_draft_for_a_recurrent_state(family, servers, tmp_path):
    """Speculative decoding of a hybrid: each verify step keeps the state before it,
    and the rows the model rejects are undone by going back to it and running the
    taken ones again; greedy replies and log-probabilities equal those without the
    draft bit for bit, and the disk cache keeps the finished tasks' states. A draft
    that is itself recurrent is refused."""
    if family.arch not in HYBRID:
        pytest.skip("%s's cache is cut back to any prefix" % family.arch)
    from test_dropin import metric
    draft = str(tmp_path / "draft.gguf")  # the same built-in vocabulary, one dense layer
    p = run([serverctl.program("bloomery-mkmodel"), "-o", draft, "--arch", "qwen3", "--layers", "1",
             "--seed", "3"])
    assert p.returncode == 0, p.stdout
    plain = servers.start(FAST + ["-np", "2", "-c", "2048"], model=family.path)
    spec = servers.start(FAST + ["-np", "2", "-c", "2048", "-md", draft, "--draft-max", "4", "--draft-min", "1",
                                 "--draft-p-min", "0", "--cache-disk", str(tmp_path / "pc")], model=family.path)
    for prompt in PLAIN:
        a, b = greedy(plain.url, prompt, 24), greedy(spec.url, prompt, 24)
        assert b["tokens"] == a["tokens"], prompt
        for x, y in zip(a["completion_probabilities"], b["completion_probabilities"]):
            assert [(t["id"], t["logprob"]) for t in x["top_logprobs"]] == \
                   [(t["id"], t["logprob"]) for t in y["top_logprobs"]], prompt
    assert metric(spec.url, "draft_tokens_total") > 0
    # a stop string ends the reply inside a verify step, with rows after it that the
    # redo undoes: the same text, and the disk cache keeps the task's state (saved
    # once the redo has run, not before)
    body = {"prompt": PLAIN[0], "n_predict": 24, "temperature": 0, "ignore_eos": True}
    text = post(plain.url, "/completion", body).json()["content"]
    body["stop"] = [text[len(text) // 2:len(text) // 2 + 2]]
    a, b = post(plain.url, "/completion", body).json(), post(spec.url, "/completion", body).json()
    assert (b["content"], b["stop_type"]) == (a["content"], "word"), (a, b)
    assert "prompt_cache_save_failed" not in spec.log(200000)
    srv = serverctl.Server(family.path, FAST + ["-md", family.path], log_dir=str(tmp_path))
    srv.launch()
    assert srv.proc.wait(30) > 0
    log = srv.log(20000)
    assert "-md" in log and "recurrent state" in log, log


# ------------------------------------------------------------------ bad files

def bad_files(family):
    if family.name not in BAD_FILES:
        pytest.skip("BAD_FILES has no entry for %s" % family.name)
    return BAD_FILES[family.name]


def test_rewrite_keeps_every_byte(family, tmp_path):
    """The helper that writes the broken files, with nothing to change, copies the file
    byte for byte: a refusal below is the change's, not the copy's."""
    out = str(tmp_path / "copy.gguf")
    rewrite(family.path, out)
    with open(family.path, "rb") as a, open(out, "rb") as b:
        assert a.read() == b.read()


def test_bad_files_refused_by_name(family, tmp_path):
    cases = bad_files(family)
    for i, (what, change, name) in enumerate(cases):
        bad = str(tmp_path / ("bad%d.gguf" % i))
        rewrite(family.path, bad, **change)
        p = run([serverctl.program("bloomery-cli"), "-m", bad, "-p", "x", "-n", "1", "-t", "1"])
        assert p.returncode != 0, "%s: bloomery-cli ran:\n%s" % (what, p.stdout)
        assert p.returncode > 0, "%s: bloomery-cli died of signal %d:\n%s" % (what, -p.returncode, p.stdout)
        assert name in p.stdout, "%s: the refusal does not name %s:\n%s" % (what, name, p.stdout)


def test_server_refuses_a_bad_file_by_name(family, tmp_path):
    what, change, name = bad_files(family)[0]
    bad = str(tmp_path / "bad.gguf")
    rewrite(family.path, bad, **change)
    srv = serverctl.Server(bad, FAST, log_dir=str(tmp_path))
    srv.launch()
    try:
        rc = srv.proc.wait(20)
    except subprocess.TimeoutExpired:
        srv.kill()
        pytest.fail("%s: bloomery-serve did not exit within 20 s:\n%s" % (what, srv.log()))
    log = srv.log(20000)
    assert rc > 0, "%s: bloomery-serve exited with %d:\n%s" % (what, rc, log)
    assert name in log, "%s: the log does not name %s:\n%s" % (what, name, log)
    # nothing left behind by the failed start
    shm = sorted(serverctl.shm_objects() - srv.shm_before)
    assert not shm, "left in /dev/shm: %r" % shm
    assert not serverctl.runtime_dirs(srv.pid, srv.dirs_before), "runtime folder left behind"
