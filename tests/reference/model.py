"""Float64 reference forward pass for the qwen3moe, qwen3, glm4moe, deepseek2, gpt-oss,
qwen3next and qwen35moe architectures.

Owns: hyperparameters from GGUF metadata, weight loading (every weight
dequantized exactly to float64), the transformer forward pass as llama.cpp
defines it for these architectures (glm4moe: attention biases, optional q/k
norms, partial RoPE, leading dense layers, biased sigmoid routing with a
shared expert; its trailing NextN layers are not run; deepseek2: multi-head
latent attention in both file forms (attn_k_b/attn_v_b and the legacy
attn_kv_b), optional q compression, NORM-form RoPE of the n_rot rotated dims
with YaRN, routing over the best expert groups, shared experts, leading dense
layers, NextN layers not run; gpt-oss: biases on q/k/v/output, attention
sinks, sliding-window layers every other layer (or by the file's period),
NEOX RoPE with YaRN, SOFTMAX_WEIGHT routing over biased router logits, and
experts with biases and the clamped swiglu_oai activation; qwen3next and
qwen35moe: gated DeltaNet layers (a causal convolution, then the delta rule's
per-head S x S state run position by position) between gated full-attention
layers with partial NEOX RoPE, softmax routing with a sigmoid-gated shared
expert, qwen35moe's NextN layers not run), and the output
head (log-sum-exp over the whole vocabulary row and the top-k ids per
position), which is computed in vocabulary chunks so memory stays bounded.
"""

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import dequant
import gguf

SUPPORTED_ARCHS = ("qwen3moe", "qwen3", "glm4moe", "deepseek2", "gpt-oss", "qwen3next", "qwen35moe")

# the gated DeltaNet hybrids (docs/models.md, "qwen3next and qwen35moe")
HYBRID_ARCHS = ("qwen3next", "qwen35moe")

# llama.cpp clamps the routed weights' sum to this before dividing by it
EXPERT_WEIGHTS_SUM_MIN = 6.103515625e-5

# gpt-oss's expert activation (llama.cpp's swiglu_oai): its alpha and clamp
SWIGLU_OAI_ALPHA = 1.702
SWIGLU_OAI_LIMIT = 7.0


class Hparams:
    def __init__(self, md):
        arch = md.get("general.architecture")
        if arch not in SUPPORTED_ARCHS:
            raise ValueError("unsupported architecture %r" % arch)
        self.arch = arch

        def get(key, default=None):
            v = md.get(arch + "." + key, default)
            if v is None:
                raise ValueError("missing metadata %s.%s" % (arch, key))
            return v

        self.block_count = int(get("block_count"))
        # glm4moe's, deepseek2's and qwen35moe's trailing NextN (multi-token prediction)
        # layers are not run
        nextn = ("glm4moe", "deepseek2", "qwen35moe")
        self.n_nextn = int(get("nextn_predict_layers", 0)) if arch in nextn else 0
        if not 0 <= self.n_nextn < self.block_count:
            raise ValueError("nextn_predict_layers %d with block_count %d"
                             % (self.n_nextn, self.block_count))
        self.n_layer = self.block_count - self.n_nextn
        self.n_embd = int(get("embedding_length"))
        self.n_head = int(get("attention.head_count"))
        self.n_head_kv = int(get("attention.head_count_kv", self.n_head))
        self.head_dim = int(get("attention.key_length", self.n_embd // self.n_head))
        self.head_dim_v = int(get("attention.value_length", self.head_dim))
        self.eps = float(get("attention.layer_norm_rms_epsilon"))
        self.rope_base = float(get("rope.freq_base", 10000.0))
        self.rope_dim = int(get("rope.dimension_count", self.head_dim))  # n_rot
        if self.rope_dim % 2 or not 0 < self.rope_dim <= self.head_dim:
            raise ValueError("rope.dimension_count %d with head_dim %d" % (self.rope_dim, self.head_dim))
        self.n_expert = 0
        self.n_expert_used = 0
        self.n_expert_shared = 0
        self.n_layer_dense_lead = 0
        # experts are chosen among the topk_group best of n_group groups (deepseek2)
        self.n_group = 1
        self.topk_group = 1
        # RoPE scaling (deepseek2, gpt-oss): None or yarn_params' tuple
        self.rope_yarn = None
        # the experts' activation: silu(gate) * up, or gpt-oss's "swiglu_oai"
        self.expert_act = "silu"
        # sliding-window attention (gpt-oss): the window, and the layers' period
        self.n_swa = 0
        self.swa_period = 0
        # the hybrids' layer kinds: recurrent[i] says layer i is a DeltaNet layer
        self.recurrent = [False] * self.n_layer
        if arch in ("qwen3moe", "glm4moe", "deepseek2", "gpt-oss") + HYBRID_ARCHS:
            self.n_expert = int(get("expert_count"))
            self.n_expert_used = int(get("expert_used_count"))
            if not 0 < self.n_expert_used <= self.n_expert:
                raise ValueError("expert_used_count %d with expert_count %d"
                                 % (self.n_expert_used, self.n_expert))
        if arch == "glm4moe":
            if self.head_dim_v != self.head_dim:
                raise ValueError("glm4moe needs value_length == key_length")
            self.n_ff_exp = int(get("expert_feed_forward_length"))
            self.n_expert_shared = int(get("expert_shared_count"))
            self.n_layer_dense_lead = int(get("leading_dense_block_count", 0))
            self.expert_weights_scale = float(get("expert_weights_scale", 1.0))
            self.expert_weights_norm = bool(get("expert_weights_norm", False))
            gating = int(get("expert_gating_func", 2))
            # 0 ("none") is what llama.cpp reads as glm4moe's default, sigmoid
            if gating not in (0, 1, 2):
                raise ValueError("glm4moe.expert_gating_func %d: only 1 (softmax) "
                                 "and 2 (sigmoid) are known" % gating)
            self.expert_gating = "softmax" if gating == 1 else "sigmoid"
        if arch == "deepseek2":
            self._deepseek2(md, get)
        if arch == "gpt-oss":
            self._gptoss(md, get)
        if arch in HYBRID_ARCHS:
            self._hybrid(md, get)
        if self.n_head % self.n_head_kv:
            raise ValueError("n_head %d not a multiple of n_head_kv %d" % (self.n_head, self.n_head_kv))


    def _deepseek2(self, md, get):
        """deepseek2's latent attention, experts and RoPE scaling (deepseek2-spec.md)."""
        a = self.arch + "."

        def opt(key, default):
            v = md.get(a + key)
            return default if v is None else v

        # q straight from the input when q_lora_rank is absent or 0
        self.q_lora = int(opt("attention.q_lora_rank", 0))
        self.kv_lora = int(get("attention.kv_lora_rank"))
        self.rope_dim = int(get("rope.dimension_count"))
        kmla = md.get(a + "attention.key_length_mla")
        vmla = md.get(a + "attention.value_length_mla")
        if (kmla is None) != (vmla is None):
            raise ValueError("deepseek2.attention.key_length_mla and value_length_mla come together")
        # MLA form (attn_k_b / attn_v_b): key_length and value_length are the
        # latent cache's widths; legacy form (attn_kv_b): the heads' own
        self.mla = kmla is not None
        if self.mla:
            if (self.head_dim, self.head_dim_v) != (self.kv_lora + self.rope_dim, self.kv_lora):
                raise ValueError("deepseek2 MLA form: key_length %d, value_length %d are not "
                                 "kv_lora_rank + rope.dimension_count, kv_lora_rank (%d, %d)"
                                 % (self.head_dim, self.head_dim_v, self.kv_lora + self.rope_dim,
                                    self.kv_lora))
            self.head_dim, self.head_dim_v = int(kmla), int(vmla)  # hk, hv
        if self.rope_dim % 2 or not 0 < self.rope_dim < self.head_dim or self.head_dim_v < 1:
            raise ValueError("deepseek2: heads of %d q/k dims must hold the %d rotated ones (even) "
                             "and more" % (self.head_dim, self.rope_dim))
        self.qk_nope = self.head_dim - self.rope_dim
        self.n_ff_exp = int(get("expert_feed_forward_length"))
        self.n_expert_shared = int(get("expert_shared_count"))
        self.n_layer_dense_lead = int(opt("leading_dense_block_count", 0))
        if not 0 <= self.n_layer_dense_lead <= self.n_layer:
            raise ValueError("leading_dense_block_count %d with %d layers"
                             % (self.n_layer_dense_lead, self.n_layer))
        scale = float(opt("expert_weights_scale", 1.0))
        self.expert_weights_scale = 1.0 if scale == 0.0 else scale  # 0 means 1
        self.expert_weights_norm = bool(opt("expert_weights_norm", False))
        gating = int(opt("expert_gating_func", 0))
        # 0 or absent: softmax, as DeepSeek-V2's files mean it
        if gating not in (0, 1, 2):
            raise ValueError("deepseek2.expert_gating_func %d: only 1 (softmax) and 2 (sigmoid) "
                             "are known" % gating)
        self.expert_gating = "sigmoid" if gating == 2 else "softmax"
        self.n_group = int(opt("expert_group_count", 1))
        self.topk_group = int(opt("expert_group_used_count", 1))
        if self.n_group < 1 or self.n_expert % self.n_group:
            raise ValueError("deepseek2.expert_group_count %d does not divide expert_count %d"
                             % (self.n_group, self.n_expert))
        if not 1 <= self.topk_group <= self.n_group:
            raise ValueError("deepseek2.expert_group_used_count %d with %d groups"
                             % (self.topk_group, self.n_group))
        per_group = self.n_expert // self.n_group
        if self.n_group > 1 and per_group < 2:
            raise ValueError("deepseek2: a group's score sums its two best experts; groups of %d"
                             % per_group)
        if self.n_expert_used > self.topk_group * per_group:
            raise ValueError("deepseek2: %d used experts do not fit in %d groups of %d"
                             % (self.n_expert_used, self.topk_group, per_group))
        stored = float(opt("rope.scaling.yarn_log_multiplier", 0.0))
        # the converter stores 0.1 * mscale_all_dim; the division is llama.cpp's,
        # in float32, which gives the config's value back (0.1f / 0.1f == 1)
        self.yarn_log_mul = float(np.float32(stored) / np.float32(0.1))
        self.rope_yarn, mscale = self._rope_scaling(md, get, self.yarn_log_mul)
        self.kq_scale = mscale * mscale / math.sqrt(self.head_dim)

    def _rope_scaling(self, md, get, log_mul=0.0):
        """(rope_yarn, mscale) of the rope.scaling keys: none (None, 1.0), or YaRN."""
        a = self.arch + "."

        def opt(key, default):
            v = md.get(a + key)
            return default if v is None else v

        stype = opt("rope.scaling.type", "none")
        if stype not in ("none", "yarn"):
            raise ValueError("%s.rope.scaling.type %r: only none and yarn are known" % (self.arch, stype))
        factor = float(opt("rope.scaling.factor", 1.0))
        if not (stype == "yarn" and factor > 1.0):
            return None, 1.0
        n_ctx_orig = md.get(a + "rope.scaling.original_context_length")
        if n_ctx_orig is None:
            n_ctx_orig = get("context_length")
        return yarn_params(
            self.rope_dim, self.rope_base, factor, int(n_ctx_orig),
            beta_fast=float(opt("rope.scaling.yarn_beta_fast", 32.0)),
            beta_slow=float(opt("rope.scaling.yarn_beta_slow", 1.0)),
            log_mul=log_mul, attn_factor=float(opt("rope.scaling.attn_factor", 1.0)))

    def _gptoss(self, md, get):
        """gpt-oss's windows, experts and RoPE scaling (gptoss-spec.md)."""
        a = self.arch + "."

        def opt(key, default):
            v = md.get(a + key)
            return default if v is None else v

        # llama.cpp shapes q/k/v by n_rot and scales the scores by 1/sqrt(n_rot):
        # the spec's whole-head rotation, one width for all three
        if not self.rope_dim == self.head_dim == self.head_dim_v:
            raise ValueError("gpt-oss rotates whole heads: rope.dimension_count %d, key_length %d "
                             "and value_length %d must agree"
                             % (self.rope_dim, self.head_dim, self.head_dim_v))
        self.n_ff_exp = int(get("expert_feed_forward_length"))
        self.n_swa = int(get("attention.sliding_window"))
        if self.n_swa < 1:
            raise ValueError("gpt-oss.attention.sliding_window %d: a window holds at least its own key"
                             % self.n_swa)
        period = opt("attention.sliding_window_pattern", 2)
        if isinstance(period, (bool, list)) or int(period) < 1:
            raise ValueError("gpt-oss.attention.sliding_window_pattern %r: a period of 1 or more "
                             "layers is known" % (period,))
        self.swa_period = int(period)  # layer i slides when i % period < period - 1
        # llama.cpp's gpt-oss graph does not scale the chosen weights, whatever
        # expert_weights_scale says: never scaled
        self.expert_weights_scale = 1.0
        self.expert_weights_norm = False
        # SOFTMAX_WEIGHT: implied by the architecture, whatever a gating key says
        self.expert_gating = "softmax_weight"
        self.expert_act = "swiglu_oai"
        # keys the spec leaves out and llama.cpp would honour: refused, not ignored
        if float(opt("rope.scaling.yarn_log_multiplier", 0.0)) != 0.0:
            raise ValueError("gpt-oss.rope.scaling.yarn_log_multiplier: not part of gpt-oss")
        base_swa = md.get(a + "rope.freq_base_swa")
        if base_swa is not None and float(base_swa) != self.rope_base:
            raise ValueError("gpt-oss.rope.freq_base_swa %g differs from rope.freq_base %g"
                             % (float(base_swa), self.rope_base))
        # the non-deepseek2 attention factor: get_mscale(F, 1) / (1 + 0.1 ln F) * attn_factor
        self.rope_yarn, _ = self._rope_scaling(md, get)

    def _hybrid(self, md, get):
        """qwen3next's / qwen35moe's layer kinds, DeltaNet shapes, experts and RoPE
        sections (docs/models.md, "qwen3next and qwen35moe: what is computed")."""
        a = self.arch + "."

        def opt(key, default):
            v = md.get(a + key)
            return default if v is None else v

        if self.head_dim_v != self.head_dim:
            raise ValueError("%s needs value_length %d == key_length %d"
                             % (self.arch, self.head_dim_v, self.head_dim))
        self.n_ff_exp = int(get("expert_feed_forward_length"))
        self.n_ff_shexp = int(get("expert_shared_feed_forward_length"))
        if self.n_ff_shexp < 1:
            raise ValueError("%sexpert_shared_feed_forward_length %d: the shared expert is always there"
                             % (a, self.n_ff_shexp))
        # llama.cpp does not read expert_weights_scale for the hybrids: never scaled
        self.expert_weights_scale = 1.0
        # the chosen softmax probabilities are always divided by their sum
        self.expert_weights_norm = True
        self.expert_gating = "softmax"
        self.ssm_conv = int(get("ssm.conv_kernel"))  # K
        self.ssm_state = int(get("ssm.state_size"))  # S
        self.ssm_groups = int(get("ssm.group_count"))  # Hk
        self.ssm_heads = int(get("ssm.time_step_rank"))  # Hv
        inner = int(get("ssm.inner_size"))
        if min(self.ssm_conv, self.ssm_state, self.ssm_groups, self.ssm_heads) < 1:
            raise ValueError("%sssm: conv_kernel %d, state_size %d, group_count %d and time_step_rank %d "
                             "must be 1 or more" % (a, self.ssm_conv, self.ssm_state, self.ssm_groups,
                                                   self.ssm_heads))
        if self.ssm_heads % self.ssm_groups:
            raise ValueError("%sssm.time_step_rank %d is not a multiple of ssm.group_count %d"
                             % (a, self.ssm_heads, self.ssm_groups))
        if inner != self.ssm_state * self.ssm_heads:
            raise ValueError("%sssm.inner_size %d is not state_size %d x time_step_rank %d"
                             % (a, inner, self.ssm_state, self.ssm_heads))
        # qwen35moe tiles the q/k heads over the v heads (j % Hk); qwen3next repeats
        # each in place (j / r)
        self.ssm_tiled = self.arch == "qwen35moe"
        flags = md.get(a + "attention.recurrent_layers")
        if flags is not None:
            if not isinstance(flags, list) or len(flags) != self.block_count:
                raise ValueError("%sattention.recurrent_layers has %s values, not block_count %d"
                                 % (a, len(flags) if isinstance(flags, list) else "no list of",
                                    self.block_count))
            if any(bool(v) for v in flags[self.n_layer:]):
                raise ValueError("%sattention.recurrent_layers marks a NextN layer recurrent" % a)
            self.recurrent = [bool(v) for v in flags[:self.n_layer]]
        else:
            every = int(opt("full_attention_interval", 4))
            if every < 1:
                raise ValueError("%sfull_attention_interval %d: 1 or more" % (a, every))
            self.recurrent = [(i + 1) % every != 0 for i in range(self.n_layer)]
        self.rope_sections = None
        if self.arch == "qwen35moe":
            sec = md.get(a + "rope.dimension_sections")
            if sec is None:
                raise ValueError("missing metadata %srope.dimension_sections" % a)
            if not isinstance(sec, list) or len(sec) != 4:
                raise ValueError("%srope.dimension_sections %r: four section widths wanted" % (a, sec))
            self.rope_sections = [int(v) for v in sec]
            # IMRoPE (ggml's interleaving): rotated pair p is in sector p % (the
            # widths' sum); the sector goes to section sector % 3 while it is under 3
            # x that section's width, else to the fourth; a text token's position is
            # the first three sections' (NEOX exactly), the fourth's would be 0
            dims = sum(self.rope_sections)
            for p in range(self.rope_dim // 2):
                sector = p % dims if dims > 0 else 0
                if dims <= 0 or min(self.rope_sections) < 0 or not sector < 3 * self.rope_sections[sector % 3]:
                    raise ValueError("%srope.dimension_sections %r leave rotated pair %d to the fourth "
                                     "(image) section" % (a, self.rope_sections, p))

    def swa_layer(self, i):
        """Whether layer i attends through the sliding window."""
        return self.n_swa > 0 and i % self.swa_period < self.swa_period - 1


def get_mscale(s, m):
    """llama.cpp's attention temperature of a YaRN extension by s."""
    return 1.0 if s <= 1.0 else 1.0 + 0.1 * m * math.log(s)


def yarn_params(n_rot, base, factor, n_ctx_orig, beta_fast=32.0, beta_slow=1.0, log_mul=0.0,
                attn_factor=1.0):
    """YaRN's rotation and deepseek2's score factor as llama.cpp derives them, in float64.

    Returns (yarn, mscale): yarn = (freq_scale, ext_factor, lo, hi, m_rope) for
    rope_norm and rope_neox, m_rope the factor cos and sin are multiplied by;
    deepseek2's scores' scale is mscale^2 / sqrt(hk). log_mul is yarn_log_mul
    after the division by 0.1. factor <= 1 is no scaling: (None, 1.0).
    """
    if factor <= 1.0:
        return None, 1.0
    lnf = math.log(factor)

    def corr_dim(b):
        return n_rot * math.log(n_ctx_orig / (b * 2.0 * math.pi)) / (2.0 * math.log(base))

    lo = max(0.0, float(math.floor(corr_dim(beta_fast))))
    hi = min(n_rot - 1.0, float(math.ceil(corr_dim(beta_slow))))
    # with a log multiplier llama.cpp divides get_mscale(F, m) by itself for
    # deepseek2 (m = mscale_all_dim): 1
    af = 1.0 if log_mul != 0.0 else get_mscale(factor, 1.0)
    af = af / (1.0 + 0.1 * lnf) * attn_factor
    m_rope = af * (1.0 + 0.1 * lnf)  # = attn_factor_org
    mscale = m_rope * (1.0 + 0.1 * log_mul * lnf)
    return (1.0 / factor, 1.0, lo, hi, m_rope), mscale


def rms_norm(x, w, eps):
    """RMSNorm over the last axis, then multiply by w."""
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(ms + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def softplus(x):
    """log(1 + e^x), x itself above 20 (llama.cpp's cut-off)."""
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def l2_norm(x, eps):
    """x over its L2 norm along the last axis, the norm at least eps."""
    n = np.sqrt(np.sum(x * x, axis=-1, keepdims=True))
    return x / np.maximum(n, eps)


def sigmoid(x):
    e = np.exp(-np.abs(x))  # no overflow for large |x|
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _rope_cos_sin(pos, base, n_rot, yarn):
    """cos and sin (T, 1, n_rot/2) of pair i's angle at each position.

    Pair i turns by pos * base^(-2i/n_rot); with yarn = (freq_scale,
    ext_factor, lo, hi, m_rope) from yarn_params by freq_scale * theta_e
    (1 - r) + theta_e r with r = ramp(i) * ext_factor, and cos and sin are
    multiplied by m_rope.
    """
    half = n_rot // 2
    i = np.arange(half, dtype=np.float64)
    theta = pos.astype(np.float64)[:, None] * (base ** (-2.0 * i / n_rot))[None, :]  # (T, half)
    m = 1.0
    if yarn is not None:
        freq_scale, ext_factor, lo, hi, m = yarn
        ramp = (1.0 - np.clip((i - lo) / max(0.001, hi - lo), 0.0, 1.0)) * ext_factor
        theta = freq_scale * theta * (1.0 - ramp) + theta * ramp
    return (np.cos(theta) * m)[:, None, :], (np.sin(theta) * m)[:, None, :]


def rope_neox(x, pos, base, n_rot, yarn=None):
    """x (T, H, D); rotate pairs (i, i + n_rot/2) for i < n_rot/2 (llama.cpp's NEOX form),
    with YaRN as in rope_norm when yarn is given."""
    half = n_rot // 2
    cos, sin = _rope_cos_sin(pos, base, n_rot, yarn)
    x0 = x[..., :half]
    x1 = x[..., half:n_rot]
    out = x.copy()
    out[..., :half] = x0 * cos - x1 * sin
    out[..., half:n_rot] = x0 * sin + x1 * cos
    return out


def rope_norm(x, pos, base, n_rot, yarn=None):
    """x (T, H, D); rotate consecutive pairs (2i, 2i+1) for i < n_rot/2 (llama.cpp's NORM form).

    yarn = (freq_scale, ext_factor, lo, hi, m_rope) from yarn_params: pair i
    turns by freq_scale * theta_e (1 - r) + theta_e r with r = ramp(i) *
    ext_factor, and cos and sin are multiplied by m_rope.
    """
    cos, sin = _rope_cos_sin(pos, base, n_rot, yarn)
    x0 = x[..., 0:n_rot:2]
    x1 = x[..., 1:n_rot:2]
    out = x.copy()
    out[..., 0:n_rot:2] = x0 * cos - x1 * sin
    out[..., 1:n_rot:2] = x0 * sin + x1 * cos
    return out


def _mm_einsum(x, w):
    return np.einsum("tk,nk->tn", x, w)


def _mm_blas(x, w):
    return x @ w.T


def _pick_mm():
    """Use BLAS when it is an optimized one, numpy's own loops otherwise.

    numpy linked to the reference BLAS runs x @ w.T several times slower than
    einsum; an optimized BLAS is much faster than einsum. A short timing
    decides; BLOOMERY_REF_MATMUL=einsum|blas overrides it.
    """
    env = os.environ.get("BLOOMERY_REF_MATMUL")
    if env in ("einsum", "blas"):
        return _mm_einsum if env == "einsum" else _mm_blas
    import time
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 256))
    w = rng.standard_normal((1024, 256))
    fs = (_mm_einsum, _mm_blas)
    best = [float("inf"), float("inf")]
    for _ in range(3):
        for i, f in enumerate(fs):
            t = time.perf_counter()
            f(x, w)
            best[i] = min(best[i], time.perf_counter() - t)
    return fs[0] if best[0] <= best[1] else fs[1]


_MM = None
_MM_LOCK = threading.Lock()


def mm(x, w):
    """x (T, K) times w (N, K) transposed -> (T, N), float64."""
    global _MM
    if _MM is None:
        with _MM_LOCK:
            if _MM is None:
                _MM = _pick_mm()
    return _MM(x, w)


def swiglu_oai(g, u, alpha=SWIGLU_OAI_ALPHA, limit=SWIGLU_OAI_LIMIT):
    """gpt-oss's activation: gc sigmoid(alpha gc) (uc + 1), gc = min(g, limit),
    uc = u clamped to [-limit, limit]."""
    gc = np.minimum(g, limit)
    uc = np.clip(u, -limit, limit)
    return gc * sigmoid(alpha * gc) * (uc + 1.0)


def glu_ffn(x, gate, up, down, bias=None, act="silu"):
    """down(act(gate x + bg, up x + bu)) + bd; gate, up (n_ff, n_embd), down
    (n_embd, n_ff), bias None or (bg, bu, bd); act "silu" (silu(g) * u) or
    "swiglu_oai"."""
    g, u = mm(x, gate), mm(x, up)
    if bias is not None:
        g, u = g + bias[0], u + bias[1]
    if act == "silu":
        a = silu(g) * u
    elif act == "swiglu_oai":
        a = swiglu_oai(g, u)
    else:
        raise ValueError("unknown activation %r" % (act,))
    y = mm(a, down)
    return y if bias is None else y + bias[2]


def swiglu_ffn(x, gate, up, down):
    """down(silu(gate x) * up x); gate, up (n_ff, n_embd), down (n_embd, n_ff)."""
    return glu_ffn(x, gate, up, down)


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def softmax_sink(s, sink):
    """Softmax of each row of s (.., n) with one more logit `sink` that has no
    value: exp(s_t - M) / (sum_t' exp(s_t' - M) + exp(sink - M)), M the
    larger of the row's max and sink."""
    m = np.maximum(np.max(s, axis=-1, keepdims=True), sink)
    e = np.exp(s - m)
    return e / (np.sum(e, axis=-1, keepdims=True) + np.exp(sink - m))


def _n_threads():
    env = os.environ.get("BLOOMERY_REF_THREADS")
    if env:
        return max(1, int(env))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


_POOL = None


def pmap(f, items):
    """map f over items on a shared thread pool (numpy releases the GIL)."""
    global _POOL
    items = list(items)
    n = _n_threads()
    if n <= 1 or len(items) <= 1:
        return [f(x) for x in items]
    if _POOL is None or _POOL._max_workers != n:
        _POOL = ThreadPoolExecutor(n)
    return list(_POOL.map(f, items))


class Layer:
    pass


class Model:
    """A GGUF qwen3moe / qwen3 / glm4moe / deepseek2 / gpt-oss / qwen3next / qwen35moe
    model computed in float64.

    Small models are decoded once (every weight kept in float64). With
    lazy=True (the default when the decoded weights would pass
    LAZY_BYTES) a layer's weights are decoded when the layer runs, experts and
    deepseek2's per-head attn_k_b / attn_v_b (or attn_kv_b) slices one at a
    time, and the output matrix chunk by chunk, so memory stays bounded for
    large files at the cost of decoding again on every pass.

    norm_topk applies to qwen3moe only; glm4moe and deepseek2 files say whether
    the routed weights are normalised (expert_weights_norm); gpt-oss's are not,
    qwen3next's and qwen35moe's always are.
    """

    LAZY_BYTES = 2 << 30

    def __init__(self, path, norm_topk=True, lazy=None):
        self.path = path
        self.gf = gguf.load(path)
        self.hp = Hparams(self.gf.metadata)
        self.norm_topk = norm_topk
        t = self.gf.tensors
        hp = self.hp
        self.tok_embd_t = t["token_embd.weight"]
        self.n_vocab = self.tok_embd_t.shape[0]
        self.tied = "output.weight" not in t
        if self.tied and hp.arch == "gpt-oss":
            raise KeyError("tensor output.weight missing from %s (gpt-oss has no tied output)" % path)
        if hp.arch in HYBRID_ARCHS:
            old = sorted(n for n in t if n.endswith(".ssm_in.weight"))
            if old:
                # q, k, v and z in one matrix grouped by k head: an earlier converter's form
                raise ValueError("%s: %s is the older qwen3next form (ssm_in instead of attn_qkv "
                                 "and attn_gate); convert the model again" % (path, old[0]))
        self.output_t = self.tok_embd_t if self.tied else t["output.weight"]
        if lazy is None:
            total = sum(x.n_elements for x in t.values()) * 8
            lazy = total > self.LAZY_BYTES
        self.lazy = lazy
        self.output_norm = self._w("output_norm.weight")
        self._output = None
        self.layers = [None if lazy else self._layer(i) for i in range(hp.n_layer)]

    def _w(self, name):
        t = self.gf.tensors
        if name not in t:
            raise KeyError("tensor %s missing from %s" % (name, self.path))
        return dequant.dequantize(t[name])

    def _opt(self, name):
        """The tensor decoded, or None when the file lacks it."""
        return self._w(name) if name in self.gf.tensors else None

    def _layer(self, i):
        hp = self.hp
        w = self._w
        p = "blk.%d." % i
        glm = hp.arch == "glm4moe"
        ds2 = hp.arch == "deepseek2"
        oai = hp.arch == "gpt-oss"
        L = Layer()
        if hp.arch in HYBRID_ARCHS:
            return self._hybrid_layer(L, i, p)
        L.recurrent = False
        L.q_gate = False
        L.shexp_gate = None
        L.attn_norm = w(p + "attn_norm.weight")
        # gpt-oss only: attention output bias, sinks, the sliding window
        L.bo = L.sinks = None
        L.swa = hp.swa_layer(i)
        if ds2:
            self._mla_weights(L, p)
            L.ffn_norm = w(p + "ffn_norm.weight")
        elif oai:
            self._oai_attn_weights(L, p)
        else:
            self._gqa_weights(L, p)
        L.is_moe = hp.n_expert > 0 and i >= hp.n_layer_dense_lead
        L.probs_bias = None
        L.shexp = None
        # gpt-oss only: the router's bias (n_expert), the experts' (bg, bu, bd)
        L.router_bias = None
        L.exp_bias = None
        if L.is_moe:
            L.router = w(p + "ffn_gate_inp.weight")  # (n_expert, n_embd)
            L.expert = self._expert_loader(p)
            if oai:
                self._oai_expert_weights(L, p)
            if glm or ds2:
                # glm4moe always has the selection bias; DeepSeek-V3 has it, V2 not
                L.probs_bias = w(p + "exp_probs_b.bias") if glm else self._opt(p + "exp_probs_b.bias")
                if hp.n_expert_shared > 0:
                    L.shexp = tuple(w(p + n) for n in ("ffn_gate_shexp.weight", "ffn_up_shexp.weight",
                                                       "ffn_down_shexp.weight"))
                    n_ff_sh = hp.n_ff_exp * hp.n_expert_shared
                    if L.shexp[0].shape[0] != n_ff_sh:
                        raise ValueError("%sffn_gate_shexp.weight has %d rows, want %d"
                                         % (p, L.shexp[0].shape[0], n_ff_sh))
        else:
            L.gate = w(p + "ffn_gate.weight")  # (n_ff, n_embd)
            L.up = w(p + "ffn_up.weight")
            L.down = w(p + "ffn_down.weight")  # (n_embd, n_ff)
        return L

    def _hybrid_layer(self, L, i, p):
        """A qwen3next / qwen35moe layer: DeltaNet or gated attention, then the
        softmax-routed experts and the gated shared expert; shapes checked."""
        hp = self.hp
        E, H, Hkv, D = hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim
        n, F, Fs = hp.n_expert, hp.n_ff_exp, hp.n_ff_shexp

        def d(name, shape):
            return dequant.dequantize(self._tensor(p + name, shape))

        L.attn_norm = d("attn_norm.weight", (E,))
        L.ffn_norm = d("post_attention_norm.weight", (E,))
        L.recurrent = i < hp.n_layer and hp.recurrent[i]  # a NextN layer is gated attention
        L.swa = False
        L.bq = L.bk = L.bv = L.bo = L.sinks = None
        if L.recurrent:
            self._deltanet_weights(L, p)
        else:
            # per head its q then its gate: 2 hd rows a head
            L.q_gate = True
            L.wq = d("attn_q.weight", (H * 2 * D, E))
            L.wk = d("attn_k.weight", (Hkv * D, E))
            L.wv = d("attn_v.weight", (Hkv * D, E))
            L.wo = d("attn_output.weight", (E, H * D))
            L.q_norm = d("attn_q_norm.weight", (D,))
            L.k_norm = d("attn_k_norm.weight", (D,))
        L.is_moe = True
        L.probs_bias = L.router_bias = L.exp_bias = None
        L.router = d("ffn_gate_inp.weight", (n, E))
        self._tensor(p + "ffn_gate_exps.weight", (n, F, E))
        self._tensor(p + "ffn_up_exps.weight", (n, F, E))
        self._tensor(p + "ffn_down_exps.weight", (n, E, F))
        L.expert = self._expert_loader(p)
        L.shexp = (d("ffn_gate_shexp.weight", (Fs, E)), d("ffn_up_shexp.weight", (Fs, E)),
                   d("ffn_down_shexp.weight", (E, Fs)))
        L.shexp_gate = d("ffn_gate_inp_shexp.weight", (E,))
        return L

    def _deltanet_weights(self, L, p):
        """A DeltaNet layer's weights (numpy shapes, rows first); beta's and alpha's
        rows in v head order whichever form the file has."""
        hp = self.hp
        E, K, S, Hk, Hv = hp.n_embd, hp.ssm_conv, hp.ssm_state, hp.ssm_groups, hp.ssm_heads
        C = 2 * S * Hk + S * Hv

        def d(name, shape):
            return dequant.dequantize(self._tensor(p + name, shape))

        L.q_gate = False
        L.wqkv = d("attn_qkv.weight", (C, E))
        L.wz = d("attn_gate.weight", (S * Hv, E))
        L.conv = d("ssm_conv1d.weight", (C, K))
        L.dt_bias = d("ssm_dt.bias", (Hv,))
        L.ssm_a = d("ssm_a", (Hv,))
        L.ssm_norm = d("ssm_norm.weight", (S,))
        L.ssm_out = d("ssm_out.weight", (E, S * Hv))
        if hp.arch == "qwen3next":
            # rows grouped by k head kh: r of b, then r of a (v heads kh r .. kh r + r - 1)
            r = Hv // Hk
            ba = d("ssm_ba.weight", (2 * Hv, E)).reshape(Hk, 2, r, E)
            L.wbeta = np.ascontiguousarray(ba[:, 0].reshape(Hv, E))
            L.walpha = np.ascontiguousarray(ba[:, 1].reshape(Hv, E))
        else:
            L.wbeta = d("ssm_beta.weight", (Hv, E))
            L.walpha = d("ssm_alpha.weight", (Hv, E))

    def _gqa_weights(self, L, p):
        """qwen3 / qwen3moe / glm4moe attention weights and the FFN norm."""
        w = self._w
        glm = self.hp.arch == "glm4moe"
        L.wq = w(p + "attn_q.weight")  # (n_head*hd, n_embd)
        L.wk = w(p + "attn_k.weight")
        L.wv = w(p + "attn_v.weight")
        L.wo = w(p + "attn_output.weight")  # (n_embd, n_head*hd_v)
        if glm:
            L.bq = w(p + "attn_q.bias")
            L.bk = w(p + "attn_k.bias")
            L.bv = w(p + "attn_v.bias")
            # GLM-4.5 has q/k norms, GLM-4.5-Air not
            L.q_norm = self._opt(p + "attn_q_norm.weight")
            L.k_norm = self._opt(p + "attn_k_norm.weight")
            L.ffn_norm = w(p + "post_attention_norm.weight")
        else:
            L.bq = L.bk = L.bv = None
            L.q_norm = w(p + "attn_q_norm.weight")
            L.k_norm = w(p + "attn_k_norm.weight")
            L.ffn_norm = w(p + "ffn_norm.weight")

    def _oai_attn_weights(self, L, p):
        """gpt-oss's attention weights, biases and sinks, and the FFN norm, shapes checked."""
        hp = self.hp
        E, H, Hkv, D = hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim

        def d(name, shape):
            return dequant.dequantize(self._tensor(p + name, shape))

        L.wq, L.bq = d("attn_q.weight", (H * D, E)), d("attn_q.bias", (H * D,))
        L.wk, L.bk = d("attn_k.weight", (Hkv * D, E)), d("attn_k.bias", (Hkv * D,))
        L.wv, L.bv = d("attn_v.weight", (Hkv * D, E)), d("attn_v.bias", (Hkv * D,))
        L.wo, L.bo = d("attn_output.weight", (E, H * D)), d("attn_output.bias", (E,))
        L.sinks = d("attn_sinks.weight", (H,))
        L.q_norm = L.k_norm = None
        L.ffn_norm = d("post_attention_norm.weight", (E,))

    def _oai_expert_weights(self, L, p):
        """gpt-oss's router bias and per-expert biases; the experts' shapes checked."""
        hp = self.hp
        E, F, n = hp.n_embd, hp.n_ff_exp, hp.n_expert

        def d(name, shape):
            return dequant.dequantize(self._tensor(p + name, shape))

        self._tensor(p + "ffn_gate_inp.weight", (n, E))
        self._tensor(p + "ffn_gate_exps.weight", (n, F, E))
        self._tensor(p + "ffn_up_exps.weight", (n, F, E))
        self._tensor(p + "ffn_down_exps.weight", (n, E, F))
        L.router_bias = d("ffn_gate_inp.bias", (n,))
        L.exp_bias = (d("ffn_gate_exps.bias", (n, F)), d("ffn_up_exps.bias", (n, F)),
                      d("ffn_down_exps.bias", (n, E)))

    def _tensor(self, name, shape):
        """The gguf.Tensor `name`, checked to have numpy shape `shape`."""
        t = self.gf.tensors.get(name)
        if t is None:
            raise KeyError("tensor %s missing from %s" % (name, self.path))
        if tuple(t.shape) != tuple(shape):
            raise ValueError("%s has shape %s, want %s" % (name, tuple(t.shape), tuple(shape)))
        return t

    def _mla_weights(self, L, p):
        """deepseek2's latent attention weights (numpy shapes, rows first)."""
        hp = self.hp
        E, H, hk, hv = hp.n_embd, hp.n_head, hp.head_dim, hp.head_dim_v
        d = dequant.dequantize
        if hp.q_lora > 0:
            L.wq = None
            L.wq_a = d(self._tensor(p + "attn_q_a.weight", (hp.q_lora, E)))
            L.q_a_norm = d(self._tensor(p + "attn_q_a_norm.weight", (hp.q_lora,)))
            L.wq_b = d(self._tensor(p + "attn_q_b.weight", (H * hk, hp.q_lora)))
        else:
            L.wq = d(self._tensor(p + "attn_q.weight", (H * hk, E)))
        L.wkv_a = d(self._tensor(p + "attn_kv_a_mqa.weight", (hp.kv_lora + hp.rope_dim, E)))
        L.kv_a_norm = d(self._tensor(p + "attn_kv_a_norm.weight", (hp.kv_lora,)))
        L.wo = d(self._tensor(p + "attn_output.weight", (E, H * hv)))
        L.kv_b = self._kv_b_loader(p)

    def _kv_b_loader(self, p):
        """kv_b(h) -> (Wk_b (qk_nope, kv_lora), Wv_b (hv, kv_lora)) of head h:
        k_nope = Wk_b kv, v = Wv_b kv for a normed latent row kv."""
        hp = self.hp
        H, nope, hv, r = hp.n_head, hp.qk_nope, hp.head_dim_v, hp.kv_lora
        d = dequant.dequantize
        c = np.ascontiguousarray
        if hp.mla:
            # attn_k_b ne [qk_nope, kv_lora, H]: per head kv_lora rows of qk_nope, the transpose of Wk_b
            kb = self._tensor(p + "attn_k_b.weight", (H, r, nope))
            vb = self._tensor(p + "attn_v_b.weight", (H, hv, r))
            if self.lazy:
                return lambda h: (c(d(kb, rows=[h])[0].T), c(d(vb, rows=[h])[0]))
            K = c(d(kb).transpose(0, 2, 1))
            V = d(vb)
            return lambda h: (K[h], V[h])
        # attn_kv_b: per head qk_nope rows of k_nope, then hv rows of v
        n = nope + hv
        kvb = self._tensor(p + "attn_kv_b.weight", (H * n, r))
        if self.lazy:
            def one(h):
                rows = d(kvb, rows=np.arange(h * n, (h + 1) * n))
                return c(rows[:nope]), c(rows[nope:])
            return one
        W = d(kvb).reshape(H, n, r)
        K, V = c(W[:, :nope]), c(W[:, nope:])
        return lambda h: (K[h], V[h])

    def _expert_loader(self, p):
        """expert(e) -> (gate (n_ff, n_embd), up, down (n_embd, n_ff)) of layer prefix p."""
        names = [p + n for n in ("ffn_gate_exps.weight", "ffn_up_exps.weight",
                                 "ffn_down_exps.weight")]
        for n in names:
            if n not in self.gf.tensors:
                raise KeyError("tensor %s missing from %s" % (n, self.path))
        if self.lazy:
            ts = [self.gf.tensors[n] for n in names]
            return lambda e, ts=ts: tuple(dequant.dequantize(x, rows=[e])[0] for x in ts)
        g, u, d = (self._w(n) for n in names)  # (n_expert, ...)
        return lambda e, g=g, u=u, d=d: (g[e], u[e], d[e])

    def layer(self, i):
        return self.layers[i] if self.layers[i] is not None else self._layer(i)

    # ---- weights -------------------------------------------------------
    @property
    def output(self):
        """Output matrix (n_vocab, n_embd) float64, decoded on first use."""
        if self._output is None:
            self._output = dequant.dequantize(self.output_t)
        return self._output

    def output_rows(self, s, e):
        """Rows s..e-1 of the output matrix."""
        if self.lazy and self._output is None:
            return dequant.dequantize(self.output_t, rows=np.arange(s, e))
        return self.output[s:e]

    def embed(self, ids):
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_vocab):
            raise ValueError("token id out of range [0, %d)" % self.n_vocab)
        if self.tied and self._output is not None:
            return self._output[ids]
        uniq, inv = np.unique(ids, return_inverse=True)
        rows = dequant.dequantize(self.tok_embd_t, rows=uniq)
        return rows[inv]

    # ---- blocks --------------------------------------------------------
    def attention(self, L, x, pos):
        hp = self.hp
        if hp.arch == "deepseek2":
            return self.attention_mla(L, x, pos)
        T = x.shape[0]
        q, k, v = mm(x, L.wq), mm(x, L.wk), mm(x, L.wv)
        if L.bq is not None:
            q, k, v = q + L.bq, k + L.bk, v + L.bv
        gate = None
        if L.q_gate:
            qg = q.reshape(T, hp.n_head, 2, hp.head_dim)
            q, gate = qg[:, :, 0], qg[:, :, 1]
        q = q.reshape(T, hp.n_head, hp.head_dim)
        k = k.reshape(T, hp.n_head_kv, hp.head_dim)
        v = v.reshape(T, hp.n_head_kv, hp.head_dim_v)
        if L.q_norm is not None:
            q = rms_norm(q, L.q_norm, hp.eps)
        if L.k_norm is not None:
            k = rms_norm(k, L.k_norm, hp.eps)
        q = rope_neox(q, pos, hp.rope_base, hp.rope_dim, hp.rope_yarn)
        k = rope_neox(k, pos, hp.rope_base, hp.rope_dim, hp.rope_yarn)
        scale = 1.0 / math.sqrt(hp.head_dim)
        group = hp.n_head // hp.n_head_kv
        out = np.empty((T, hp.n_head, hp.head_dim_v))
        blk = 256
        # a sliding layer's row p sees the rows p - n_swa < t <= p
        window = hp.n_swa if L.swa else 0

        def one(job):
            a, h = job
            b = min(T, a + blk)
            kv = h // group
            lo = max(0, a - window + 1) if window else 0
            # query rows a..b-1 see keys lo..row (and within the window)
            keys = np.arange(lo, b)[None, :]
            rows = np.arange(a, b)[:, None]
            mask = keys > rows
            if window:
                mask |= keys <= rows - window
            s = mm(q[a:b, h, :], k[lo:b, kv, :]) * scale
            s[mask] = -np.inf
            p = softmax(s, axis=-1) if L.sinks is None else softmax_sink(s, L.sinks[h])
            out[a:b, h, :] = p @ v[lo:b, kv, :]

        pmap(one, [(a, h) for a in range(0, T, blk) for h in range(hp.n_head)])
        if gate is not None:
            out *= sigmoid(gate)
        o = mm(out.reshape(T, hp.n_head * hp.head_dim_v), L.wo)
        return o if L.bo is None else o + L.bo

    def deltanet(self, L, x):
        """A gated DeltaNet layer over rows x (T, n_embd) of one sequence from its
        start: the causal convolution of qkv, then per v head the delta rule's
        state M (key dim x value dim) updated position by position."""
        hp = self.hp
        T = x.shape[0]
        K, S, Hk, Hv = hp.ssm_conv, hp.ssm_state, hp.ssm_groups, hp.ssm_heads
        qkv = mm(x, L.wqkv)  # (T, 2 S Hk + S Hv)
        z = mm(x, L.wz).reshape(T, Hv, S)
        beta = sigmoid(mm(x, L.wbeta))  # (T, Hv)
        g = softplus(mm(x, L.walpha) + L.dt_bias) * L.ssm_a  # (T, Hv); ssm_a < 0: e^g decays
        # tap K-1 is the current position; positions before the first are 0
        padded = np.concatenate([np.zeros((K - 1, qkv.shape[1])), qkv])
        u = np.zeros_like(qkv)
        for j in range(K):
            u += padded[j:j + T] * L.conv[:, j]
        u = silu(u)
        q = l2_norm(u[:, :S * Hk].reshape(T, Hk, S), hp.eps) / math.sqrt(S)
        k = l2_norm(u[:, S * Hk:2 * S * Hk].reshape(T, Hk, S), hp.eps)
        v = u[:, 2 * S * Hk:].reshape(T, Hv, S)
        kh = np.arange(Hv) % Hk if hp.ssm_tiled else np.arange(Hv) // (Hv // Hk)
        q, k = q[:, kh], k[:, kh]  # (T, Hv, S): each v head's q and k
        decay = np.exp(g)
        M = np.zeros((Hv, S, S))
        o = np.empty((T, Hv, S))
        for t in range(T):
            M *= decay[t][:, None, None]
            kt = k[t]
            d = beta[t][:, None] * (v[t] - np.einsum("hij,hi->hj", M, kt))
            M += kt[:, :, None] * d[:, None, :]
            o[t] = np.einsum("hij,hi->hj", M, q[t])
        y = rms_norm(o, L.ssm_norm, hp.eps) * silu(z)
        return mm(y.reshape(T, Hv * S), L.ssm_out)

    def mixer(self, L, x, pos):
        """The layer's token mixer: DeltaNet or attention."""
        return self.deltanet(L, x) if L.recurrent else self.attention(L, x, pos)

    def attention_mla(self, L, x, pos):
        """deepseek2's multi-head latent attention, in the plain (decompressed) form:
        per head k_nope = Wk_b kv and v = Wv_b kv of the normed latent rows, one
        rotated k_pe shared by all heads, scores scaled by hp.kq_scale."""
        hp = self.hp
        T, H, nope, r = x.shape[0], hp.n_head, hp.qk_nope, hp.rope_dim
        if L.wq is None:
            q = mm(rms_norm(mm(x, L.wq_a), L.q_a_norm, hp.eps), L.wq_b)
        else:
            q = mm(x, L.wq)
        q = q.reshape(T, H, hp.head_dim)
        q_nope = q[..., :nope]
        q_pe = rope_norm(q[..., nope:], pos, hp.rope_base, r, hp.rope_yarn)
        c = mm(x, L.wkv_a)  # (T, kv_lora + n_rot)
        kv = rms_norm(c[:, :hp.kv_lora], L.kv_a_norm, hp.eps)
        k_pe = rope_norm(c[:, None, hp.kv_lora:], pos, hp.rope_base, r, hp.rope_yarn)[:, 0, :]
        out = np.empty((T, H, hp.head_dim_v))
        blk = 256

        def one(h):
            wk, wv = L.kv_b(h)
            k_nope = mm(kv, wk)  # (T, qk_nope)
            v = mm(kv, wv)  # (T, hv)
            qn = np.ascontiguousarray(q_nope[:, h])
            qp = np.ascontiguousarray(q_pe[:, h])
            for a in range(0, T, blk):
                b = min(T, a + blk)
                # query rows a..b-1 see keys 0..row
                mask = np.arange(b)[None, :] > np.arange(a, b)[:, None]
                s = (mm(qn[a:b], k_nope[:b]) + mm(qp[a:b], k_pe[:b])) * hp.kq_scale
                s[mask] = -np.inf
                out[a:b, h, :] = softmax(s, axis=-1) @ v[:b]

        pmap(one, range(H))
        return mm(out.reshape(T, H * hp.head_dim_v), L.wo)

    def mask_groups(self, score):
        """score (T, n_expert) with the experts outside each row's topk_group best
        groups set to -inf; a group's score is the sum of its two best scores
        (ties: the lower group id)."""
        hp = self.hp
        T = score.shape[0]
        g = score.reshape(T, hp.n_group, hp.n_expert // hp.n_group)
        two = np.sort(g, axis=-1)[..., -2:]
        gscore = two[..., 1] + two[..., 0]  # the best plus the second
        keep = np.argsort(-gscore, axis=-1, kind="stable")[:, :hp.topk_group]
        drop = np.ones((T, hp.n_group), dtype=bool)
        np.put_along_axis(drop, keep, False, axis=-1)
        return np.where(drop[:, :, None], -np.inf, g).reshape(T, hp.n_expert)

    def route(self, L, x):
        """Chosen experts (T, k), best first, and their weights (T, k).

        softmax / sigmoid gating: the top k of the probabilities (plus the
        selection bias, which steers the choice only), weighted by the
        probabilities; softmax_weight (gpt-oss): the top k of the logits (the
        router's bias included), weighted by the softmax over those k.
        """
        hp = self.hp
        k = hp.n_expert_used
        logits = mm(x, L.router)  # (T, n_expert)
        if L.router_bias is not None:
            logits = logits + L.router_bias
        if hp.arch == "qwen3moe":
            probs = softmax(logits, axis=-1)
            # top-k by probability; stable order by descending probability
            sel = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
            wsel = np.take_along_axis(probs, sel, axis=-1)
            if self.norm_topk:
                wsel = wsel / np.sum(wsel, axis=-1, keepdims=True)
            return sel, wsel
        if hp.expert_gating == "softmax":
            probs = softmax(logits, axis=-1)
        elif hp.expert_gating == "sigmoid":
            probs = sigmoid(logits)
        else:
            probs = logits  # softmax_weight: the softmax comes after the choice
        # the bias only steers the choice (ties: lower id); weights are the unbiased probs
        score = probs if L.probs_bias is None else probs + L.probs_bias
        if hp.n_group > 1:
            score = self.mask_groups(score)
        sel = np.argsort(-score, axis=-1, kind="stable")[:, :k]
        wsel = np.take_along_axis(probs, sel, axis=-1)
        if hp.expert_gating == "softmax_weight":
            wsel = softmax(wsel, axis=-1)
        if hp.expert_weights_norm:
            wsel = wsel / np.maximum(np.sum(wsel, axis=-1, keepdims=True), EXPERT_WEIGHTS_SUM_MIN)
        return sel, wsel * hp.expert_weights_scale

    def experts(self, L, x, sel, wsel):
        """sum over j of wsel[:, j] * expert sel[:, j] applied to x."""
        act = self.hp.expert_act

        def one(e):
            rows, slot = np.nonzero(sel == e)
            if rows.size == 0:
                return None
            bias = None if L.exp_bias is None else tuple(b[e] for b in L.exp_bias)
            y = glu_ffn(x[rows], *L.expert(e), bias=bias, act=act)
            return rows, wsel[rows, slot][:, None] * y

        out = np.zeros_like(x)
        for r in pmap(one, range(self.hp.n_expert)):  # summed in expert order
            if r is not None:
                out[r[0]] += r[1]
        return out

    def moe(self, L, x):
        sel, wsel = self.route(L, x)
        out = self.experts(L, x, sel, wsel)
        if L.shexp is not None:
            sh = swiglu_ffn(x, *L.shexp)
            if L.shexp_gate is not None:
                sh = sh * sigmoid(x @ L.shexp_gate)[:, None]
            out = out + sh
        self.last_routing = sel
        return out

    def dense_ffn(self, L, x):
        return swiglu_ffn(x, L.gate, L.up, L.down)

    def hidden(self, ids):
        """Final-normed hidden states (T, n_embd) for token ids at positions 0..T-1."""
        hp = self.hp
        ids = np.asarray(ids, dtype=np.int64)
        pos = np.arange(len(ids))
        x = self.embed(ids)
        for i in range(hp.n_layer):
            L = self.layer(i)
            h = rms_norm(x, L.attn_norm, hp.eps)
            x = x + self.mixer(L, h, pos)
            h = rms_norm(x, L.ffn_norm, hp.eps)
            x = x + (self.moe(L, h) if L.is_moe else self.dense_ffn(L, h))
        return rms_norm(x, self.output_norm, hp.eps)

    # ---- the NextN (multi-token prediction) layer --------------------------
    def mtp_hidden(self, ids):
        """The first NextN layer's rows (T - 1, n_embd), normed for its head: row i
        reads the model's final-normed hidden state at position i and the embedding
        of ids[i + 1] (the token after it), and predicts the token after that. The
        layer attends causally over its own rows, at the positions of the hidden
        states. glm4moe (a GQA block with its routed and shared experts) and
        qwen35moe (a gated attention block with its experts and gated shared one)."""
        hp = self.hp
        if hp.arch not in ("glm4moe", "qwen35moe"):
            raise NotImplementedError("the NextN layer of %s is not computed" % hp.arch)
        if hp.n_nextn < 1:
            raise ValueError("%s has no NextN layer" % self.path)
        ids = np.asarray(ids, dtype=np.int64)
        if len(ids) < 2:
            raise ValueError("the NextN layer needs at least two ids")
        i = hp.n_layer
        p = "blk.%d.nextn." % i
        L = self._layer(i)
        h = self.hidden(ids)[:-1]
        nxt = ids[1:]
        t = self.gf.tensors
        if p + "embed_tokens.weight" in t:
            e = dequant.dequantize(t[p + "embed_tokens.weight"], rows=np.unique(nxt))
            e = e[np.searchsorted(np.unique(nxt), nxt)]
        else:
            e = self.embed(nxt)
        eh = self._tensor(p + "eh_proj.weight", (hp.n_embd, 2 * hp.n_embd))
        x = mm(np.concatenate([rms_norm(e, self._w(p + "enorm.weight"), hp.eps),
                               rms_norm(h, self._w(p + "hnorm.weight"), hp.eps)], axis=1),
               dequant.dequantize(eh))
        pos = np.arange(len(nxt))
        x = x + self.mixer(L, rms_norm(x, L.attn_norm, hp.eps), pos)
        hn = rms_norm(x, L.ffn_norm, hp.eps)
        x = x + (self.moe(L, hn) if L.is_moe else self.dense_ffn(L, hn))
        return rms_norm(x, self._w(p + "shared_head_norm.weight"), hp.eps)

    def mtp_head(self, rows, top=32):
        """head() through the NextN layer's own head (shared_head_head), or the
        model's when the file has none."""
        name = "blk.%d.nextn.shared_head_head.weight" % self.hp.n_layer
        if name not in self.gf.tensors:
            return self.head(rows, top=top)
        saved = (self.output_t, self._output)
        self.output_t, self._output = self.gf.tensors[name], None
        try:
            return self.head(rows, top=top)
        finally:
            self.output_t, self._output = saved

    # ---- output head ---------------------------------------------------
    def logits(self, ids):
        """Full logits (T, n_vocab); only for small inputs."""
        return self.hidden(ids) @ self.output.T

    def head(self, hidden, top=32, vchunk=8192, tchunk=512):
        """For each row of hidden: (lse, top ids best first, their logits)."""
        V = self.n_vocab
        if self.lazy and self._output is None:
            tchunk = max(tchunk, hidden.shape[0])  # decode each chunk of rows once
        T = hidden.shape[0]
        top = min(top, V)
        lse = np.empty(T)
        top_ids = np.empty((T, top), dtype=np.int64)
        top_val = np.empty((T, top))
        chunks = [(s, min(V, s + vchunk)) for s in range(0, V, vchunk)]

        def run_chunk(h, c):
            s, e = c
            lg = np.empty((h.shape[0], e - s))
            W = self.output_rows(s, e)
            step = 1024
            for b in range(0, e - s, step):
                be = min(e - s, b + step)
                lg[:, b:be] = mm(h, W[b:be])
            m = np.max(lg, axis=1)
            ssum = np.sum(np.exp(lg - m[:, None]), axis=1)
            kk = min(top, e - s)
            if kk < e - s:
                idx = np.argpartition(-lg, kk - 1, axis=1)[:, :kk]
            else:
                idx = np.broadcast_to(np.arange(e - s), (h.shape[0], e - s))
            vals = np.take_along_axis(lg, idx, axis=1)
            return m, ssum, idx + s, vals

        for t0 in range(0, T, tchunk):
            h = np.ascontiguousarray(hidden[t0:t0 + tchunk])
            res = pmap(lambda c: run_chunk(h, c), chunks)
            ms = np.stack([r[0] for r in res], axis=1)
            ss = np.stack([r[1] for r in res], axis=1)
            mx = np.max(ms, axis=1)
            lse[t0:t0 + h.shape[0]] = mx + np.log(np.sum(ss * np.exp(ms - mx[:, None]), axis=1))
            ids = np.concatenate([r[2] for r in res], axis=1)
            vals = np.concatenate([r[3] for r in res], axis=1)
            # best first; ties broken by lower id
            for i in range(h.shape[0]):
                o = np.lexsort((ids[i], -vals[i]))[:top]
                top_ids[t0 + i] = ids[i, o]
                top_val[t0 + i] = vals[i, o]
        return lse, top_ids, top_val


def greedy(model, prompt_ids, n, top=4):
    """Greedy continuation of n tokens: list of (id, lse, top ids, top logits)."""
    ids = list(int(i) for i in prompt_ids)
    out = []
    for _ in range(n):
        h = model.hidden(ids)[-1:]
        lse, tid, tval = model.head(h, top=top)
        nxt = int(tid[0, 0])
        out.append((nxt, float(lse[0]), tid[0].tolist(), tval[0].tolist()))
        ids.append(nxt)
    return out
