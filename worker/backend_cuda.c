/* The CUDA backend: the backend ops over kernels/cuda on one card. Owns the stage's
 * weights in one device arena, its scratch, the KV caches' device memory, and the
 * CUDA graphs that replay decode steps.
 *
 * Three schedules of the same ops, picked per step by begin:
 * - decode (every sequence of the step one row, at most GRAPH_MAX_ROWS of them):
 *   each row's cache, position and token come from a small table on the card (step
 *   inputs), filled by one async copy from pinned memory, so the step is captured
 *   once per (rows, context bucket) and replayed; q/k norm, RoPE and the cache store
 *   fold into attention, routing into the experts' gate/up launch;
 * - prompts and mixed steps: tensor-core GEMMs with f16 inputs and f32 accumulation
 *   (weights dequantized to f16 scratch, activations rounded to f16 once per
 *   product), the routed experts grouped by expert on the card (one grouped launch
 *   per expert matrix and layer), flash attention per sequence on the f16 cache;
 * - rows: a prompt through the decode kernels in row chunks, where the shapes do not
 *   suit the GEMMs, cuBLAS is missing or BLOOMERY_CUDA_PROMPT=rows asks for it (the
 *   reference the GEMM path is checked against).
 * The residual stream stays f32; the KV cache is f16. */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bl_config.h"
#include "model.h"

#if BL_HAVE_CUDA

#include "kcuda.h"
#include "log.h"
#include "quant.h"
#include "resid.h"

/* Decode steps of up to this many sequences are captured as graphs. */
#define GRAPH_MAX_ROWS 64
/* Prompt attention runs in chunks of this many rows, which bounds its scratch. */
#define ATT_ROWS 64
/* Context buckets of captured graphs: the grid covers 256 << i positions. */
#define N_BUCKETS 24
/* Each half of the pinned staging buffer the weights are uploaded through. */
#define STAGE_BYTES ((size_t)64 << 20)
/* The largest piece of a WK_ADD_PIECES matrix dequantized at once for a GEMM. */
#define PIECE_BYTES ((size_t)256 << 20)
/* Most experts one batch of residency moves copies (a batch runs beside the steps
 * and the next is planned once it is done): at about 3 MiB an expert, some 5 ms of
 * the H200's link. */
#define RESID_MOVES 64
/* Launches one profiled step may time, and distinct op names. */
#define PROF_EVENTS 4096
#define PROF_OPS 48

enum { MODE_DECODE, MODE_PROMPT, MODE_ROWS };

/* A placed matrix: the view into the arena, and for the first of a q/k(/v) stack
 * the stacked view (data NULL when q and k could not stack). */
typedef struct cw {
    kcuda_mat_t m;
    kcuda_mat_t stack;
    int nstack; /* matrices in stack: 3, 2 (v apart) or 0 */
} cw_t;

/* One registered tensor's place in the arena. */
typedef struct upload {
    const void *src;
    size_t nbytes, off;
    wk_tensor_t *t; /* NULL for a vector */
    wk_vec_t *v;
    int flags;
    int stack;      /* the first of a stack: how many follow it in the run (0, 2, 3) */
} upload_t;

struct cuda;

/* One host round trip of a MoE layer: what the host node of a step reads. One per
 * (graph row count, layer) and one per layer for steps enqueued directly, so that a
 * captured node's context stays what it was captured with. */
typedef struct hcall {
    struct cuda *cu;
    const wk_remote_t *remote;
    int64_t layer, n;
} hcall_t;

typedef struct cuda {
    wk_backend_t b;
    const char *path;
    const wk_config_t *c;
    const wk_model_opts_t *o;
    int64_t lb, le;
    int device;
    kcuda_device_info_t info;
    char label[96]; /* the name kernels go by: "NVIDIA H200 (sm_90)" */
    void *stream;
    /* the weights: what was registered, then one arena for all */
    upload_t *u;
    size_t n_u, cap_u, total;
    cw_t *cws;
    uint8_t *arena;
    void **allocs; /* activations alloc gave out */
    int n_allocs, cap_allocs;
    /* scratch for n_batch rows, on the card */
    float *rl;     // (n_batch, n_expert) router logits
    int32_t *ids;  // (n_batch, n_expert_used)
    float *wts;    // (n_batch, n_expert_used)
    float *g, *u_; // (n_batch * n_expert_used, n_ff_exp) or (n_batch, n_ff)
    float *dscr;   // (KCUDA_MV_MAX_ROWS * n_expert_used, n_embd): grouped down products, unweighted
    float *xg;     // (n_batch, n_embd) normed rows for the head
    float *logits; // (n_batch, n_vocab), last stage
    /* latent attention (deepseek2): the absorbed queries and the heads' latent
     * outputs (n_batch, n_head, kv_lora), and one per-head weight in f16 */
    float *mla_q, *mla_o;
    void *mla_w16;
    /* the prompt path */
    int pp_ok;     /* the shapes suit it; else prompts take the rows path */
    int flash;     /* prompts attend through kcuda_attention_prefill */
    void *blas;    /* cuBLAS handle on stream */
    void *x16;     // (n_batch, max(n_embd, n_head * head_dim, n_ff)) f16 activations
    void *xs16;    // (n_batch * n_expert_used, max(n_embd, n_ff_exp)) f16, rows by expert
    float *dg;     // (n_batch * n_expert_used, n_embd) experts' down outputs, by expert
    int32_t *srt;  /* expert grouping: counts (ne), offsets (ne+1), tile0 (ne+1),
                    * perm and inv (n_batch * n_expert_used) */
    void *wscr;    /* f16 weights: a whole expert tensor, a dense matrix, the head in pieces */
    size_t wscr_bytes;
    void *att_scratch;
    size_t att_scratch_bytes;
    /* a decode step's RoPE table (kcuda_rope_table: n_batch rows of head_dim floats),
     * made by the step's first attention layer and again where a layer's RoPE
     * differs from the one it holds (rope_cs_of; rope_cs_ok is cleared as each
     * decode step begins) */
    float *d_rope_cs;
    kcuda_rope_t rope_cs_of;
    int rope_cs_ok;
    /* step inputs: one region, the same layout on the card and in pinned memory:
     * the rows table (GRAPH_MAX_ROWS), tokens (n_batch), positions (n_batch) */
    uint8_t *d_in, *h_in;
    size_t in_bytes;
    kcuda_kv_row_t *d_rows, *h_rows;
    int32_t *d_tokens, *h_tokens, *d_pos, *h_pos;
    size_t kv_row_bytes;     /* an f16 cache row: n_head_kv * head_dim halves */
    int64_t *kvl;            /* (le - lb) a stage layer's layer in the caches (-1: a DeltaNet layer's) */
    /* a hybrid's DeltaNet layers: the sequences' table (n_batch, uploaded at begin),
     * the gates (n_batch, Hv) */
    kcuda_dn_seg_t *d_dseg, *h_dseg;
    float *dn_beta, *dn_g;
    void *graphs[GRAPH_MAX_ROWS + 1][N_BUCKETS];
    /* routed experts in host RAM (cfg->remote): the rows, ids and weights go to pinned
     * memory, a host node hands them to the remote hook and waits for the sums, which
     * come back and are added onto the residual */
    int remote;
    void *sev;            /* a blocking event the step's end waits on (host layers only) */
    float *h_x, *h_wts, *h_sums, *d_sums;
    int32_t *h_ids;
    hcall_t *hc;          /* ((GRAPH_MAX_ROWS + 2) * (le - lb)): row 0 for direct steps */
    _Atomic int host_rc;  /* the first host call's failure in this step, or 0 */
    bl_err_t host_err;
    /* the prompt offload: a host layer's experts copied to the card for a step of at
     * least offload_rows rows (0: never), then computed there like a card layer's */
    struct hostx {
        kcpu_mat_t h[3];  /* gate, up, down in host memory; data NULL: not a host layer */
        int reg[3];       /* inside a registered span: read directly (else copied through staging) */
    } *hx;                /* (le - lb) */
    void **spans;         /* the registered spans' starts, for unregistering */
    int n_spans;
    int64_t offload_rows;
    uint8_t *d_off;       /* one layer's three expert tensors, 256-aligned */
    size_t off_bytes;
    size_t off_f16;       /* the largest host expert tensor in f16 that goes through the
                           * prompt's f16 copy (experts_want_f16) */
    void *ostage[2], *oev[2];
    void *pinned;         /* host memory pinned by cu_pin_host (the logits ring), or NULL */
    int oused[2];         /* a staging half's copy was enqueued (its event must be waited on) */
    /* residency (o->residency with host layers): card slots for the hottest experts
     * of the host layers, set up at the first step (when the caches are made, so
     * that an automatic budget sees what they left). The step's expert launches read
     * a (layer, expert) -> slot table on the card; the host node reads its copy in
     * pinned memory. Both change only in begin, when no step runs; the moves' copies
     * run on their own stream beside the step, and their experts are seated in the
     * tables only at a later begin, once the copies are done. */
    struct rslots {
        int32_t n;          /* the layer's slots */
        uint8_t *d;         /* gate, up and down pools of n experts each, 256-aligned */
        kcuda_mat_t m[3];   /* the pools as expert tensors of n experts */
        size_t eb[3];       /* one expert's bytes in each */
    } *rs;                  /* (le - lb) */
    int resid_wanted;       /* o->residency, a host path and a slot budget */
    _Atomic int resid;      /* 0 not set up yet, 1 planning moves, -1 no more moves (the
                             * slots, where rs is set, keep serving what they hold) */
    bl_resid_t *res;
    bl_heat_t *heat;        /* cfg->heat: the host layers' routing, counted by the host calls */
    int32_t *d_table, *h_table; /* ((le - lb) * n_expert) slot of each expert, or -1 */
    int32_t *d_sid;         /* (n_batch * n_expert_used) the step's choices as slots */
    void *mstream, *mev, *fev;  /* the moves' stream, its ordering and its finish events */
    bl_resid_move_t moves[RESID_MOVES];
    int64_t n_moves;        /* in flight */
    int64_t n_slots_total;
    size_t slot_bytes;
    _Atomic uint64_t *sel, *hits; /* (le - lb) counted selections and card hits */
    int32_t *h_pids;        /* (le - lb) * n_batch * n_expert_used pinned: a prompt step's ids */
    int64_t *pcount;        /* (le - lb) rows of them to count at end, or 0 */
    _Atomic uint64_t n_moved, n_evicted;
    /* the host call's packing: the rows with a host expert, their pairs and sums */
    float *cx, *cwts, *csums;
    int32_t *cids, *ccnt, *crow;
    /* the card links to the neighbouring stages' processes (wk_model_card_*): the
     * buffers and events this stage exported for the next one, and those of the
     * previous one it opened with, after the gets, an event settle waits on */
    struct card_end {
        int n;
        void *buf[WK_CARD_MAX_BUFS], *ev[WK_CARD_MAX_BUFS];
    } cout, cin;
    void *card_rev;
    /* the step running */
    const wk_step_t *st;
    int mode;
    int64_t max_len;  /* decode: the attention grid */
    void **capture;   /* decode: where the graph being captured goes (NULL: none) */
    void *prof_exec;  /* a profiled decode step's one-off graph */
    int profiled;     /* the step is captured only to be timed */
    /* profiling (opts.profile): an event after every launch of a step */
    void *ev[PROF_EVENTS + 1];
    int ev_op[PROF_EVENTS + 1];
    int n_ev, prof_on;
    wk_prof_op_t ops[PROF_OPS];
    int n_ops;
} cuda_t;

/* Waits for stream on a path that already fails or tears down: its own error, if
 * any, would only repeat the first. */
static void drain(void *stream)
{
    bl_err_t e;
    if (kcuda_sync(stream, &e) < 0)
        return;
}

static int dalloc(void *out, size_t nbytes, bl_err_t *err)
{
    return kcuda_alloc((void **)out, nbytes ? nbytes : 16, err);
}

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

// --- profiling -----------------------------------------------------------------------------

static int op_index(cuda_t *cu, const char *op)
{
    for (int i = 0; i < cu->n_ops; i++)
        if (cu->ops[i].op == op || strcmp(cu->ops[i].op, op) == 0)
            return i;
    if (cu->n_ops == PROF_OPS)
        return PROF_OPS - 1; /* the last name takes the overflow */
    cu->ops[cu->n_ops] = (wk_prof_op_t){.op = op};
    return cu->n_ops++;
}

/* After a launch: an event that closes op's interval. */
static int prof_mark(cuda_t *cu, const char *op, bl_err_t *err)
{
    if (cu->n_ev >= PROF_EVENTS)
        return 0;
    cu->ev_op[cu->n_ev + 1] = op_index(cu, op);
    return kcuda_event_record(cu->ev[++cu->n_ev], cu->stream, err);
}

/* After the step's synchronisation: each interval is added to its op. */
static int prof_collect(cuda_t *cu, bl_err_t *err)
{
    for (int i = 1; i <= cu->n_ev; i++) {
        float ms = 0;
        int rc = kcuda_event_elapsed_ms(&ms, cu->ev[i - 1], cu->ev[i], err);
        if (rc < 0)
            return rc;
        cu->ops[cu->ev_op[i]].us += 1e3 * (double)ms;
        cu->ops[cu->ev_op[i]].calls++;
    }
    cu->n_ev = 0;
    return 0;
}

int wk__cuda_profile(wk_backend_t *b, wk_prof_op_t *out, int cap, int reset)
{
    cuda_t *cu = (cuda_t *)b;
    for (int i = 0; i < cu->n_ops && i < cap; i++)
        out[i] = cu->ops[i];
    const int n = cu->n_ops;
    if (reset)
        cu->n_ops = 0;
    return n;
}

/* The best of a few device-to-device copies of nbytes on the current device and
 * stream, as bytes read plus written per second (the first copy warms up). */
static int copy_rate(void *stream, size_t nbytes, double *bytes_per_s, bl_err_t *err)
{
    *bytes_per_s = 0;
    void *a = NULL, *d = NULL, *e0 = NULL, *e1 = NULL;
    int rc = 0;
    if ((rc = kcuda_alloc(&a, nbytes, err)) < 0 || (rc = kcuda_alloc(&d, nbytes, err)) < 0 ||
        (rc = kcuda_event_create(&e0, err)) < 0 || (rc = kcuda_event_create(&e1, err)) < 0 ||
        (rc = kcuda_memset(a, 1, nbytes, stream, err)) < 0)
        goto out;
    for (int rep = 0; rep < 5; rep++) {
        float ms = 0;
        if ((rc = kcuda_event_record(e0, stream, err)) < 0 || (rc = kcuda_copy(d, a, nbytes, stream, err)) < 0 ||
            (rc = kcuda_event_record(e1, stream, err)) < 0 || (rc = kcuda_event_sync(e1, err)) < 0 ||
            (rc = kcuda_event_elapsed_ms(&ms, e0, e1, err)) < 0)
            goto out;
        const double bps = 2.0 * (double)nbytes / (1e-3 * (double)ms); /* read + written */
        if (rep > 0 && bps > *bytes_per_s)
            *bytes_per_s = bps;
    }
out:
    drain(stream);
    kcuda_event_destroy(e0);
    kcuda_event_destroy(e1);
    kcuda_free(a);
    kcuda_free(d);
    return rc;
}

int wk__cuda_bandwidth(wk_backend_t *b, size_t nbytes, double *bytes_per_s, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    *bytes_per_s = 0;
    const int rc = kcuda_set_device(cu->device, err);
    return rc < 0 ? rc : copy_rate(cu->stream, nbytes, bytes_per_s, err);
}

int wk_cuda_copy_rate(int device, size_t nbytes, double *bytes_per_s, bl_err_t *err)
{
    *bytes_per_s = 0;
    void *st = NULL;
    int rc = kcuda_set_device(device, err);
    if (rc < 0 || (rc = kcuda_stream_create(&st, err)) < 0)
        return rc;
    rc = copy_rate(st, nbytes, bytes_per_s, err);
    kcuda_stream_destroy(st);
    return rc;
}

/* How a prompt's grouped expert products read quantized weights: 0 by type
 * (bl_type_gemm_via_f16), 1 as stored for every type, 2 through an f16 copy for every
 * type (BLOOMERY_CUDA_EXPERT_GEMM=auto, stored, f16: the last two to measure). */
static int g_expert_gemm;

void wk_cuda_knobs_from_env(void)
{
    static const struct {
        const char *var;
        int (*set)(int);
    } knobs[] = {{"BLOOMERY_CUDA_ATT_SHORT", kcuda_attention_set_short},
                 {"BLOOMERY_CUDA_ATT_CHUNK", kcuda_attention_set_chunk},
                 {"BLOOMERY_CUDA_ATT_SPLITS", kcuda_attention_set_splits},
                 {"BLOOMERY_CUDA_MMA", kcuda_matvec_set_mma},
                 {"BLOOMERY_CUDA_GROUP", kcuda_matvec_set_group},
                 {"BLOOMERY_CUDA_GG_ROWS", kcuda_gemm_set_grouped_rows},
                 {"BLOOMERY_CUDA_MLA_HEADS", kcuda_mla_set_heads},
                 {"BLOOMERY_CUDA_DN_COLS", kcuda_deltanet_set_cols}};
    for (size_t i = 0; i < sizeof knobs / sizeof knobs[0]; i++) {
        const char *v = getenv(knobs[i].var);
        if (v && *v)
            (void)knobs[i].set(atoi(v));
    }
    const char *pdl_env = getenv("BLOOMERY_CUDA_PDL");
    if (pdl_env && strcmp(pdl_env, "0") == 0)
        (void)kcuda_set_pdl(0);
    const char *eg = getenv("BLOOMERY_CUDA_EXPERT_GEMM");
    g_expert_gemm = eg && !strcmp(eg, "stored") ? 1 : eg && !strcmp(eg, "f16") ? 2 : 0;
}

/* Whether a prompt's grouped products of expert tensors of this type want an f16
 * copy first: by type, unless the knob says (what the scratch is sized for). */
static int experts_want_f16(uint32_t type)
{
    return type != BL_TYPE_F16 && (g_expert_gemm == 2 || (g_expert_gemm == 0 && bl_type_gemm_via_f16(type)));
}

/* Whether one of f16_bytes as f16 goes through the copy: wanted, and the scratch
 * holds it (else it is read as stored). */
static int experts_via_f16(const cuda_t *cu, uint32_t type, size_t f16_bytes)
{
    return experts_want_f16(type) && f16_bytes <= cu->wscr_bytes;
}

/* Every launch goes through OP: a failure returns, and a profiling step records an
 * event after it. */
#define OP(name, call)                                                 \
    do {                                                               \
        int rc_ = (call);                                              \
        if (rc_ < 0)                                                   \
            return rc_;                                                \
        if (cu->prof_on && (rc_ = prof_mark(cu, (name), err)) < 0)     \
            return rc_;                                                \
    } while (0)

// --- set-up --------------------------------------------------------------------------------

static const char *cu_name(const wk_backend_t *b) { return ((const cuda_t *)b)->label; }

static void cu_card_close(wk_backend_t *b, int which);

static void cu_destroy(wk_backend_t *b)
{
    cuda_t *cu = (cuda_t *)b;
    bl_err_t e;
    if (kcuda_set_device(cu->device, &e) == 0 && cu->stream)
        drain(cu->stream); /* nothing may still read what is freed below */
    cu_card_close(b, WK_CARD_OUT | WK_CARD_IN);
    for (int i = 0; i <= GRAPH_MAX_ROWS; i++)
        for (int j = 0; j < N_BUCKETS; j++)
            kcuda_graph_destroy(cu->graphs[i][j]);
    for (int i = 0; i <= PROF_EVENTS; i++)
        kcuda_event_destroy(cu->ev[i]);
    void *bufs[] = {cu->arena, cu->rl, cu->ids, cu->wts, cu->g, cu->u_, cu->dscr, cu->xg, cu->logits, cu->att_scratch,
                    cu->d_rope_cs, cu->d_in, cu->x16, cu->xs16, cu->dg, cu->srt, cu->wscr, cu->mla_q, cu->mla_o,
                    cu->mla_w16, cu->d_dseg, cu->dn_beta, cu->dn_g};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        kcuda_free(bufs[i]);
    for (int i = 0; i < cu->n_allocs; i++)
        kcuda_free(cu->allocs[i]);
    free(cu->allocs);
    kcuda_host_free(cu->h_in);
    kcuda_host_free(cu->h_dseg);
    free(cu->kvl);
    for (int i = 0; i < cu->n_spans; i++)
        kcuda_host_unregister(cu->spans[i]);
    kcuda_host_unregister(cu->pinned);
    free(cu->spans);
    free(cu->hx);
    kcuda_free(cu->d_off);
    kcuda_host_free(cu->ostage[0]);
    kcuda_host_free(cu->ostage[1]);
    kcuda_event_destroy(cu->oev[0]);
    kcuda_event_destroy(cu->oev[1]);
    if (cu->mstream)
        drain(cu->mstream);
    if (cu->rs)
        for (int64_t l = 0; l < cu->le - cu->lb; l++)
            kcuda_free(cu->rs[l].d);
    free(cu->rs);
    bl_resid_free(cu->res);
    kcuda_free(cu->d_table);
    kcuda_host_free(cu->h_table);
    kcuda_free(cu->d_sid);
    kcuda_event_destroy(cu->mev);
    kcuda_event_destroy(cu->sev);
    kcuda_event_destroy(cu->fev);
    kcuda_stream_destroy(cu->mstream);
    free((void *)cu->sel);
    free((void *)cu->hits);
    kcuda_host_free(cu->h_pids);
    free(cu->pcount);
    free(cu->cx);
    free(cu->cwts);
    free(cu->csums);
    free(cu->cids);
    free(cu->ccnt);
    free(cu->crow);
    kcuda_host_free(cu->h_x);
    kcuda_host_free(cu->h_ids);
    kcuda_host_free(cu->h_wts);
    kcuda_host_free(cu->h_sums);
    kcuda_free(cu->d_sums);
    free(cu->hc);
    kcuda_blas_destroy(cu->blas);
    kcuda_stream_destroy(cu->stream);
    free(cu->u);
    free(cu->cws);
    free(cu);
}

static void *cu_alloc(wk_backend_t *b, size_t nbytes)
{
    cuda_t *cu = (cuda_t *)b;
    if (cu->n_allocs == cu->cap_allocs) {
        const int cap = cu->cap_allocs ? 2 * cu->cap_allocs : 16;
        void **a = realloc(cu->allocs, sizeof *a * (size_t)cap);
        if (!a)
            return NULL;
        cu->allocs = a;
        cu->cap_allocs = cap;
    }
    void *p = NULL;
    bl_err_t e;
    if (kcuda_set_device(cu->device, &e) < 0 || dalloc(&p, nbytes, &e) < 0)
        return NULL;
    cu->allocs[cu->n_allocs++] = p;
    return p;
}

static int plan_add(cuda_t *cu, const upload_t *u, bl_err_t *err)
{
    if (cu->n_u == cu->cap_u) {
        size_t cap = cu->cap_u ? 2 * cu->cap_u : 256;
        upload_t *nu = realloc(cu->u, cap * sizeof *nu);
        if (!nu)
            return bl_err_set(err, BL_ENOMEM, "out of memory for the upload plan");
        cu->u = nu;
        cu->cap_u = cap;
    }
    upload_t *p = &cu->u[cu->n_u++];
    *p = *u;
    p->off = (cu->total + 255) & ~(size_t)255;
    cu->total = p->off + p->nbytes;
    return 0;
}

static int cu_add(wk_backend_t *b, wk_tensor_t *t, int flags, bl_err_t *err)
{
    const upload_t u = {.src = t->h.data, .nbytes = t->h.row_bytes * (size_t)t->h.nrows, .t = t, .flags = flags};
    return plan_add((cuda_t *)b, &u, err);
}

static int cu_add_vec(wk_backend_t *b, wk_vec_t *v, int64_t n, bl_err_t *err)
{
    const upload_t u = {.src = v->h, .nbytes = sizeof(float) * (size_t)n, .v = v};
    return plan_add((cuda_t *)b, &u, err);
}

/* q, k and v: the longest run from q of matrices sharing type and width whose sizes
 * keep 16-byte alignment (q and k; q, k and v) goes back to back in the arena (no
 * padding), so that the run is also one matrix (cw_t.stack); the others are plain
 * tensors. Qwen3-30B-A3B's files store v as q6_K beside q4_K q and k: two launches
 * instead of three. */
static int cu_add_stack(wk_backend_t *b, wk_tensor_t *const t[3], bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    const kcpu_mat_t *m[3] = {&t[0]->h, &t[1]->h, &t[2]->h};
    int ns = 1;
    while (ns < 3 && m[ns]->type == m[0]->type && m[ns]->ncols == m[0]->ncols &&
           m[ns]->row_bytes == m[0]->row_bytes && (m[ns - 1]->row_bytes * (size_t)m[ns - 1]->nrows) % 16 == 0)
        ns++;
    if (ns < 2)
        ns = 0;
    for (int i = 0; i < 3; i++) {
        const upload_t u = {.src = m[i]->data, .nbytes = m[i]->row_bytes * (size_t)m[i]->nrows, .t = t[i],
                            .stack = i == 0 ? ns : 0};
        int rc = plan_add(cu, &u, err);
        if (rc < 0)
            return rc;
        if (i > 0 && i < ns) { /* right after the one before: its end is 16-aligned */
            upload_t *p = &cu->u[cu->n_u - 1];
            p->off = cu->u[cu->n_u - 2].off + cu->u[cu->n_u - 2].nbytes;
            cu->total = p->off + p->nbytes;
        }
    }
    return 0;
}

/* Copies every planned tensor to the arena through two pinned halves: the host
 * fills one while the other's copy runs. */
static int upload_all(cuda_t *cu, bl_err_t *err)
{
    void *stage[2] = {NULL, NULL}, *done[2] = {NULL, NULL};
    int used[2] = {0, 0}, rc = 0, k = 0;
    uint64_t total = 0, sent = 0;
    for (size_t i = 0; i < cu->n_u; i++)
        total += cu->u[i].nbytes;
    if (cu->o->progress)
        cu->o->progress(cu->o->progress_ud, 0, total);
    if ((rc = kcuda_host_alloc(&stage[0], STAGE_BYTES, err)) < 0 ||
        (rc = kcuda_host_alloc(&stage[1], STAGE_BYTES, err)) < 0 ||
        (rc = kcuda_event_create(&done[0], err)) < 0 || (rc = kcuda_event_create(&done[1], err)) < 0)
        goto out;
    for (size_t i = 0; i < cu->n_u; i++) {
        const upload_t *u = &cu->u[i];
        for (size_t at = 0; at < u->nbytes;) {
            const size_t c = u->nbytes - at < STAGE_BYTES ? u->nbytes - at : STAGE_BYTES;
            if (used[k] && (rc = kcuda_event_sync(done[k], err)) < 0)
                goto out;
            memcpy(stage[k], (const uint8_t *)u->src + at, c);
            if ((rc = kcuda_upload(cu->arena + u->off + at, stage[k], c, cu->stream, err)) < 0 ||
                (rc = kcuda_event_record(done[k], cu->stream, err)) < 0)
                goto out;
            used[k] = 1;
            k ^= 1;
            at += c;
            sent += c;
            if (cu->o->progress)
                cu->o->progress(cu->o->progress_ud, sent, total);
        }
    }
    rc = kcuda_sync(cu->stream, err);
    if (rc == 0 && cu->o->progress)
        cu->o->progress(cu->o->progress_ud, total, total);
out:
    drain(cu->stream); /* the staging buffers must be idle before freeing */
    kcuda_event_destroy(done[0]);
    kcuda_event_destroy(done[1]);
    kcuda_host_free(stage[0]);
    kcuda_host_free(stage[1]);
    return rc;
}

/* Makes the views of every placed tensor into the arena. */
static int bind(cuda_t *cu, bl_err_t *err)
{
    size_t nm = 0;
    for (size_t i = 0; i < cu->n_u; i++)
        nm += cu->u[i].t != NULL;
    cu->cws = calloc(nm ? nm : 1, sizeof *cu->cws);
    if (!cu->cws)
        return bl_err_set(err, BL_ENOMEM, "out of memory for %zu matrices", nm);
    size_t j = 0;
    for (size_t i = 0; i < cu->n_u; i++) {
        const upload_t *u = &cu->u[i];
        if (u->v) {
            u->v->p = (const float *)(cu->arena + u->off);
            continue;
        }
        const kcpu_mat_t *h = &u->t->h;
        cw_t *w = &cu->cws[j++];
        int rc = kcuda_mat_init(&w->m, cu->arena + u->off, h->type, h->ncols, h->nrows, err);
        if (rc < 0)
            return rc;
        if (u->stack) {
            int64_t rows = 0;
            for (int s = 0; s < u->stack; s++)
                rows += cu->u[i + (size_t)s].t->h.nrows;
            w->nstack = u->stack;
            if ((rc = kcuda_mat_init(&w->stack, cu->arena + u->off, h->type, h->ncols, rows, err)) < 0)
                return rc;
        }
        u->t->d = w;
    }
    return 0;
}

/* The layer forms the CUDA kernels do not compute (latent attention of unusual
 * shapes, consecutive-pair RoPE outside it, DeltaNet heads of other sizes) are
 * refused by name rather than run wrong; the CPU backend runs them. */
static int check_form(const cuda_t *cu, bl_err_t *err)
{
    const wk_config_t *c = cu->c;
    const char *what = NULL;
    if (c->kv_lora > 0 && (c->kv_lora % 8 || (c->head_k - c->n_rot) % 8 || c->kv_lora + c->n_rot > 1024))
        what = "latent attention of this shape (kv_lora and qk_nope multiples of 8, kv_lora + n_rot <= 1024)";
    else if (!c->rope_neox && c->kv_lora == 0)
        what = "consecutive-pair RoPE outside latent attention";
    else if (c->ssm_heads > 0 && !kcuda_dnet_supported((int)c->ssm_state, (int)c->ssm_conv))
        what = "gated DeltaNet layers of this shape (heads of 16, 32, 64 or 128 dims, at most 16 taps)";
    if (what)
        return bl_err_set(err, BL_ENOTSUP, "%s: %s: the CUDA backend does not compute %s yet (run it with -ngl 0)",
                          cu->path, c->arch, what);
    if (c->moe && c->n_group > 1 && c->topk_group > 0 && c->topk_group < c->n_group &&
        (c->n_group > 32 || c->n_expert % c->n_group != 0))
        return bl_err_set(err, BL_ENOTSUP, "%s: %lld expert groups over %lld experts on CUDA (at most 32, dividing "
                          "the experts)", cu->path, (long long)c->n_group, (long long)c->n_expert);
    return 0;
}

/* The widest dense FFN a layer runs through cu_ffn: a dense model's, the leading
 * dense layers', the shared experts'. */
static size_t dense_ff(const wk_config_t *c)
{
    const int64_t d = !c->moe || c->n_dense_lead > 0 ? c->n_ff : 0;
    return (size_t)(d > c->n_ff_shexp ? d : c->n_ff_shexp);
}

/* Whether two RoPEs give the same angles (their tables are alike). */
static int rope_same(const kcuda_rope_t *x, const kcuda_rope_t *y)
{
    return x->n_rot == y->n_rot && x->base == y->base && x->freq_scale == y->freq_scale &&
           x->ext_factor == y->ext_factor && x->corr_lo == y->corr_lo && x->corr_hi == y->corr_hi &&
           x->mscale == y->mscale;
}

/* A RoPE over n_rot dims with the model's scaling, and a layer's attention extras, as
 * the card's kernels take them. */
static kcuda_rope_t rope_of(const wk_config_t *c, int64_t n_rot, float base)
{
    return (kcuda_rope_t){.n_rot = (int)n_rot, .base = base, .freq_scale = c->rope_freq_scale,
                          .ext_factor = c->rope_ext_factor, .corr_lo = c->rope_corr_lo, .corr_hi = c->rope_corr_hi,
                          .mscale = c->rope_mscale};
}

static kcuda_att_ext_t att_ext_of(const wk_attn_t *a)
{
    return (kcuda_att_ext_t){.window = (int)a->window, .d_sinks = a->sinks};
}

/* The routing of a MoE layer as the card's kernels take it. */
static kcuda_route_t route_of(const wk_moe_t *e)
{
    return (kcuda_route_t){.gating = e->gating, .norm = e->norm, .scale = e->scale, .n_group = (int)e->n_group,
                           .topk_group = (int)e->topk_group, .d_bias = e->probs_b.p, .d_logit_bias = e->router_b.p};
}

/* Shapes and types the CUDA kernels take, checked before anything is allocated. */
static int check_shapes(const cuda_t *cu, bl_err_t *err)
{
    const wk_config_t *c = cu->c;
    const int64_t nkv = c->n_head_kv * c->head_dim;
    int rc = check_form(cu, err);
    if (rc < 0)
        return rc;
    /* latent attention takes its own kernels (mla.cu, check_form's bounds) */
    if (c->kv_lora == 0 && c->head_dim != 32 && c->head_dim != 64 && c->head_dim != 128 && c->head_dim != 256)
        return bl_err_set(err, BL_ENOTSUP, "%s: head_dim %lld on CUDA (32, 64, 128 or 256)", cu->path,
                          (long long)c->head_dim);
    if (c->kv_lora == 0 && c->n_head / c->n_head_kv > KCUDA_ATT_MAX_GROUP)
        return bl_err_set(err, BL_ENOTSUP, "%s: %lld query heads per KV head on CUDA (at most %d)", cu->path,
                          (long long)(c->n_head / c->n_head_kv), KCUDA_ATT_MAX_GROUP);
    if (c->n_embd % 4 || (c->kv_lora == 0 && nkv % 8) || (c->moe && c->n_ff_exp % 4) || dense_ff(c) % 4)
        return bl_err_set(err, BL_ENOTSUP, "%s: n_embd %lld and the FFN width must be multiples of 4, "
                          "n_head_kv * head_dim %lld of 8, on CUDA", cu->path, (long long)c->n_embd,
                          (long long)nkv);
    if (c->moe && (c->n_expert > KCUDA_MOE_MAX_EXPERT || c->n_expert_used > KCUDA_MOE_MAX_K))
        return bl_err_set(err, BL_ENOTSUP, "%s: %lld experts, %lld used, on CUDA (at most %d and %d)", cu->path,
                          (long long)c->n_expert, (long long)c->n_expert_used, KCUDA_MOE_MAX_EXPERT,
                          KCUDA_MOE_MAX_K);
    return 0;
}

/* Whether the prompt path takes this model: f16 activation rows 16-byte aligned,
 * the grouped expert GEMM's reduction lengths in steps of 32. */
static int prompt_shapes_ok(const wk_config_t *c)
{
    const int64_t nq = c->n_head * c->head_dim;
    return c->n_embd % 32 == 0 && nq % 8 == 0 && (!c->moe || c->n_ff_exp % 32 == 0) && dense_ff(c) % 8 == 0;
}

/* The f16 copy of the largest expert tensor registered here whose prompt products
 * want one (experts_want_f16), 0 for none. */
static size_t experts_copy_bytes(const cuda_t *cu)
{
    size_t w = 0;
    for (size_t i = 0; i < cu->n_u; i++) {
        const upload_t *u = &cu->u[i];
        if (u->t && (u->flags & WK_ADD_EXPERTS) && experts_want_f16(((const cw_t *)u->t->d)->m.type))
            w = max_sz(w, kcuda_gemm_scratch_bytes(&((const cw_t *)u->t->d)->m));
    }
    return w;
}

/* The prompt path's scratch: f16 activations, the expert grouping, and one f16
 * weight buffer as large as the largest dense matrix a product reads, or expert
 * tensor that goes through an f16 copy (experts_want_f16: the K-quants'; the others'
 * are read as stored), this stage's or a host layer's it copies in; a WK_ADD_PIECES
 * matrix goes through it in pieces. */
static int alloc_prompt(cuda_t *cu, bl_err_t *err)
{
    const wk_config_t *c = cu->c;
    const size_t B = (size_t)cu->o->n_batch, E = (size_t)c->n_embd;
    const size_t nq = (size_t)(c->n_head * c->head_dim);
    const size_t K = (size_t)(c->moe ? c->n_expert_used : 1), ne = (size_t)(c->moe ? c->n_expert : 1);
    const size_t ff = (size_t)(c->moe ? c->n_ff_exp : c->n_ff);
    size_t w = max_sz(experts_copy_bytes(cu), cu->off_f16);
    for (size_t i = 0; i < cu->n_u; i++) {
        const upload_t *u = &cu->u[i];
        if (!u->t || (u->flags & (WK_ADD_TABLE | WK_ADD_EXPERTS)))
            continue;
        const size_t s = kcuda_gemm_scratch_bytes(&((const cw_t *)u->t->d)->m);
        w = max_sz(w, (u->flags & WK_ADD_PIECES) && s > PIECE_BYTES ? PIECE_BYTES : s);
    }
    cu->wscr_bytes = w;
    int rc = kcuda_blas_create(&cu->blas, cu->stream, err);
    if (rc == BL_ENOTSUP) { /* no cuBLAS on this machine: prompts take the rows path */
        BL_LOG(BL_LOG_WARN, "event=prompt_path_rows reason=\"%s\"", err->msg);
        cu->pp_ok = 0;
        return 0;
    }
    if (rc < 0 || (rc = dalloc(&cu->x16, 2 * B * max_sz(max_sz(E, nq), max_sz(ff, dense_ff(c))), err)) < 0 ||
        (rc = dalloc(&cu->wscr, w, err)) < 0)
        return rc;
    if (c->moe && ((rc = dalloc(&cu->xs16, 2 * B * K * max_sz(E, ff), err)) < 0 ||
                   (rc = dalloc(&cu->dg, sizeof(float) * B * K * E, err)) < 0 ||
                   (rc = dalloc(&cu->srt, 4 * (3 * ne + 2 + 2 * B * K), err)) < 0))
        return rc;
    return 0;
}

/* The longest grid a context of n_ctx positions needs: n_ctx rounded up to the
 * attention's chunk. */
static int64_t att_cap(int64_t n_ctx)
{
    return (n_ctx + KCUDA_ATT_CHUNK - 1) / KCUDA_ATT_CHUNK * KCUDA_ATT_CHUNK;
}

static int alloc_scratch(cuda_t *cu, bl_err_t *err)
{
    const wk_config_t *c = cu->c;
    const size_t B = (size_t)cu->o->n_batch, E = (size_t)c->n_embd;
    const size_t nkv = (size_t)(c->n_head_kv * c->head_dim);
    const size_t K = (size_t)(c->moe ? c->n_expert_used : 1), ne = (size_t)(c->moe ? c->n_expert : 1);
    const size_t ff = (size_t)(c->moe ? c->n_ff_exp : c->n_ff);
    const size_t f = sizeof(float), gw = max_sz(K * ff, dense_ff(c)); /* g and u_ per row */
    int rc;
    cu->att_scratch_bytes = kcuda_attention_scratch_bytes(ATT_ROWS > GRAPH_MAX_ROWS ? ATT_ROWS : GRAPH_MAX_ROWS,
                                                          c->n_head, c->head_dim, att_cap(cu->o->n_ctx_max));
    if (c->kv_lora > 0) /* latent attention: every split of two rows (more rows split less) */
        cu->att_scratch_bytes = max_sz(cu->att_scratch_bytes, kcuda_mla_scratch_bytes(2, c->n_head, c->kv_lora));
    if ((rc = dalloc(&cu->rl, f * B * ne, err)) < 0 || (rc = dalloc(&cu->ids, 4 * B * K, err)) < 0 ||
        (rc = dalloc(&cu->wts, f * B * K, err)) < 0 || (rc = dalloc(&cu->g, f * B * gw, err)) < 0 ||
        (rc = dalloc(&cu->u_, f * B * gw, err)) < 0 || (rc = dalloc(&cu->xg, f * B * E, err)) < 0 ||
        (rc = dalloc(&cu->att_scratch, cu->att_scratch_bytes, err)) < 0 ||
        (rc = dalloc(&cu->d_rope_cs, f * B * (size_t)c->head_dim, err)) < 0)
        return rc;
    if (c->moe && (rc = dalloc(&cu->dscr, f * (B < KCUDA_MV_MAX_ROWS ? B : KCUDA_MV_MAX_ROWS) * K * E, err)) < 0)
        return rc;
    if (cu->le == c->n_layer && (rc = dalloc(&cu->logits, f * B * (size_t)c->n_vocab, err)) < 0)
        return rc;
    if (c->kv_lora > 0) {
        const size_t H = (size_t)c->n_head, r = (size_t)c->kv_lora, nope = (size_t)(c->head_k - c->n_rot);
        const size_t w16 = 2 * H * max_sz(r * nope, (size_t)c->head_v * r);
        if ((rc = dalloc(&cu->mla_q, f * B * H * r, err)) < 0 || (rc = dalloc(&cu->mla_o, f * B * H * r, err)) < 0 ||
            (rc = dalloc(&cu->mla_w16, w16, err)) < 0)
            return rc;
    }
    if (cu->pp_ok && (rc = alloc_prompt(cu, err)) < 0)
        return rc;
    if (c->ssm_heads > 0 &&
        ((rc = dalloc(&cu->d_dseg, sizeof(kcuda_dn_seg_t) * B, err)) < 0 ||
         (rc = kcuda_host_alloc((void **)&cu->h_dseg, sizeof(kcuda_dn_seg_t) * B, err)) < 0 ||
         (rc = dalloc(&cu->dn_beta, f * B * (size_t)c->ssm_heads, err)) < 0 ||
         (rc = dalloc(&cu->dn_g, f * B * (size_t)c->ssm_heads, err)) < 0))
        return rc;
    /* The step inputs: the rows table first (32-byte entries), then the ids. */
    const size_t rows_bytes = sizeof(kcuda_kv_row_t) * GRAPH_MAX_ROWS;
    cu->in_bytes = rows_bytes + 2 * 4 * B;
    if ((rc = dalloc(&cu->d_in, cu->in_bytes, err)) < 0 ||
        (rc = kcuda_host_alloc((void **)&cu->h_in, cu->in_bytes, err)) < 0)
        return rc;
    memset(cu->h_in, 0, cu->in_bytes);
    cu->d_rows = (kcuda_kv_row_t *)cu->d_in;
    cu->h_rows = (kcuda_kv_row_t *)cu->h_in;
    cu->d_tokens = (int32_t *)(cu->d_in + rows_bytes);
    cu->h_tokens = (int32_t *)(cu->h_in + rows_bytes);
    cu->d_pos = cu->d_tokens + B;
    cu->h_pos = cu->h_tokens + B;
    cu->kv_row_bytes = nkv * 2;
    if (cu->remote) {
        const size_t nl = (size_t)(cu->le - cu->lb);
        cu->hc = calloc((GRAPH_MAX_ROWS + 2) * nl, sizeof *cu->hc);
        if (!cu->hc)
            return bl_err_set(err, BL_ENOMEM, "out of memory for the host calls");
        if ((rc = kcuda_event_create_blocking(&cu->sev, err)) < 0 ||
            (rc = kcuda_host_alloc((void **)&cu->h_x, f * B * E, err)) < 0 ||
            (rc = kcuda_host_alloc((void **)&cu->h_ids, 4 * B * K, err)) < 0 ||
            (rc = kcuda_host_alloc((void **)&cu->h_wts, f * B * K, err)) < 0 ||
            (rc = kcuda_host_alloc((void **)&cu->h_sums, f * B * E, err)) < 0 ||
            (rc = dalloc(&cu->d_sums, f * B * E, err)) < 0)
            return rc;
    }
    return 0;
}

/* The fewest rows of an expert tier's call that take a prompt's grouped GEMMs. */
#define TIER_PROMPT_ROWS 32

/* An experts-only model's scratch (an expert tier): a call's rows, choices and sums
 * for n_batch rows, on the card and pinned, and where the prompt shapes allow, the
 * grouped GEMMs' (the slots by expert, their f16 rows and down products, the f16
 * copy of the largest expert tensor of a type that takes one). */
static int alloc_only(cuda_t *cu, bl_err_t *err)
{
    const wk_config_t *c = cu->c;
    const size_t B = (size_t)cu->o->n_batch, E = (size_t)c->n_embd, f = sizeof(float);
    const size_t K = (size_t)c->n_expert_used, F = (size_t)c->n_ff_exp, NE = (size_t)c->n_expert;
    if (!c->moe)
        return bl_err_set(err, BL_EINVAL, "%s: %s has no routed experts to hold", cu->path, c->arch);
    int rc;
    if (cu->pp_ok && B >= TIER_PROMPT_ROWS) {
        const size_t w = cu->wscr_bytes = experts_copy_bytes(cu);
        if ((rc = dalloc(&cu->xs16, 2 * B * K * max_sz(E, F), err)) < 0 || (rc = dalloc(&cu->dg, f * B * K * E, err)) < 0 ||
            (rc = dalloc(&cu->srt, 4 * (3 * NE + 2 + 2 * B * K), err)) < 0 || (w && (rc = dalloc(&cu->wscr, w, err)) < 0))
            return rc;
    }
    if ((rc = dalloc(&cu->ids, 4 * B * K, err)) < 0 || (rc = dalloc(&cu->wts, f * B * K, err)) < 0 ||
        (rc = dalloc(&cu->g, f * B * K * F, err)) < 0 || (rc = dalloc(&cu->u_, f * B * K * F, err)) < 0 ||
        (rc = dalloc(&cu->xg, f * B * E, err)) < 0 || (rc = dalloc(&cu->d_sums, f * B * E, err)) < 0 ||
        (rc = dalloc(&cu->dscr, f * (B < KCUDA_MV_MAX_ROWS ? B : KCUDA_MV_MAX_ROWS) * K * E, err)) < 0 ||
        (rc = kcuda_host_alloc((void **)&cu->h_x, f * B * E, err)) < 0 ||
        (rc = kcuda_host_alloc((void **)&cu->h_ids, 4 * B * K, err)) < 0 ||
        (rc = kcuda_host_alloc((void **)&cu->h_wts, f * B * K, err)) < 0 ||
        (rc = kcuda_host_alloc((void **)&cu->h_sums, f * B * E, err)) < 0)
        return rc;
    return 0;
}

/* A host layer's experts, kept for the prompt offload (unless -no-op-offload) and
 * for residency's copies. */
static int cu_add_host(wk_backend_t *b, int64_t l, const wk_moe_t *e, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    if (cu->offload_rows == 0 && !cu->resid_wanted)
        return 0;
    if (!cu->hx && !(cu->hx = calloc((size_t)(cu->le - cu->lb), sizeof *cu->hx)))
        return bl_err_set(err, BL_ENOMEM, "out of memory for the host layers");
    struct hostx *x = &cu->hx[l - cu->lb];
    const kcpu_mat_t *h[3] = {&e->gate_exps.h, &e->up_exps.h, &e->down_exps.h};
    size_t bytes = 0;
    for (int i = 0; i < 3; i++) {
        if (!kcuda_type_supported(h[i]->type))
            return bl_err_set(err, BL_ENOTSUP, "%s: layer %lld's experts have a type the CUDA kernels do not read",
                              cu->path, (long long)l);
        x->h[i] = *h[i];
        bytes = ((bytes + 255) & ~(size_t)255) + h[i]->row_bytes * (size_t)h[i]->nrows;
        if (experts_want_f16(h[i]->type))
            cu->off_f16 = max_sz(cu->off_f16, (size_t)h[i]->nrows * (size_t)h[i]->ncols * 2);
    }
    cu->off_bytes = max_sz(cu->off_bytes, bytes);
    return 0;
}

struct span {
    uintptr_t a, b; /* [a, b), page-rounded */
};

static int span_cmp(const void *x, const void *y)
{
    const struct span *p = x, *q = y;
    return p->a < q->a ? -1 : p->a > q->a;
}

/* The host layers' expert tensors registered with the driver, so that their copies
 * to the card are DMA reads at the link's speed instead of a memcpy into staging
 * first (measured on the H200: the staged path held a --cpu-moe pp512 at about 140
 * tok/s). A page is registered once, and tensors pack several to a page, so the
 * tensors' page-rounded spans are merged where they touch and each merged span is
 * registered; a span the system refuses (a mapping it cannot pin) stays staged.
 * Returns whether any tensor is staged, or an error. */
static int register_spans(cuda_t *cu, bl_err_t *err)
{
    const uintptr_t page = 4096;
    const int64_t nl = cu->le - cu->lb;
    struct span *sp = malloc((size_t)nl * 3 * sizeof *sp);
    if (!sp)
        return bl_err_set(err, BL_ENOMEM, "out of memory for the host layers' spans");
    int n = 0;
    for (int64_t l = 0; l < nl; l++)
        for (int i = 0; i < 3 && cu->hx[l].h[i].data; i++) {
            const kcpu_mat_t *h = &cu->hx[l].h[i];
            const uintptr_t a = (uintptr_t)h->data;
            sp[n].a = a & ~(page - 1);
            sp[n].b = (a + h->row_bytes * (size_t)h->nrows + page - 1) & ~(page - 1);
            n++;
        }
    qsort(sp, (size_t)n, sizeof *sp, span_cmp);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m > 0 && sp[i].a <= sp[m - 1].b)
            sp[m - 1].b = sp[i].b > sp[m - 1].b ? sp[i].b : sp[m - 1].b;
        else
            sp[m++] = sp[i];
    }
    if (!(cu->spans = calloc((size_t)(m ? m : 1), sizeof *cu->spans))) {
        free(sp);
        return bl_err_set(err, BL_ENOMEM, "out of memory for the host layers' spans");
    }
    size_t reg_bytes = 0;
    for (int i = 0; i < m; i++) {
        bl_err_t e2 = {0};
        if (kcuda_host_register((const void *)sp[i].a, sp[i].b - sp[i].a, &e2) < 0) {
            BL_LOG(BL_LOG_WARN, "event=op_offload_register_refused bytes=%zu why=\"%s\"", (size_t)(sp[i].b - sp[i].a),
                   e2.msg);
            sp[i].b = sp[i].a; /* empty: nothing inside it counts as registered */
            continue;
        }
        cu->spans[cu->n_spans++] = (void *)sp[i].a;
        reg_bytes += sp[i].b - sp[i].a;
    }
    int staged = 0;
    for (int64_t l = 0; l < nl; l++)
        for (int i = 0; i < 3 && cu->hx[l].h[i].data; i++) {
            const uintptr_t a = (uintptr_t)cu->hx[l].h[i].data;
            int lo = 0, hi = m; /* the last span starting at or before a */
            while (hi - lo > 1) {
                const int mid = (lo + hi) / 2;
                if (sp[mid].a <= a)
                    lo = mid;
                else
                    hi = mid;
            }
            cu->hx[l].reg[i] = m > 0 && sp[lo].a <= a && a < sp[lo].b;
            staged |= !cu->hx[l].reg[i];
        }
    free(sp);
    BL_LOG(BL_LOG_DEBUG, "event=op_offload_registered spans=%d bytes=%zu", cu->n_spans, reg_bytes);
    return staged;
}

/* The prompt offload's buffers: one layer's experts on the card, the host layers'
 * memory registered for direct reads where the system lets it (else two pinned
 * staging halves, as the weights' upload). */
static int offload_alloc(cuda_t *cu, bl_err_t *err)
{
    if (!cu->hx || cu->off_bytes == 0)
        return 0;
    int rc = cu->offload_rows > 0 ? dalloc(&cu->d_off, cu->off_bytes + 256, err) : 0;
    if (rc < 0)
        return rc;
    const int staged = register_spans(cu, err);
    if (staged < 0 || cu->offload_rows == 0)
        return staged < 0 ? staged : 0;
    const int64_t nl = cu->le - cu->lb;
    if (cu->heat && ((rc = kcuda_host_alloc((void **)&cu->h_pids, sizeof(int32_t) * (size_t)(nl * cu->o->n_batch *
                                                                                          cu->c->n_expert_used),
                                            err)) < 0 ||
                     !(cu->pcount = calloc((size_t)nl, sizeof *cu->pcount))))
        return rc < 0 ? rc : bl_err_set(err, BL_ENOMEM, "out of memory for the prompt's routing counts");
    if (staged && ((rc = kcuda_host_alloc(&cu->ostage[0], STAGE_BYTES, err)) < 0 ||
                   (rc = kcuda_host_alloc(&cu->ostage[1], STAGE_BYTES, err)) < 0 ||
                   (rc = kcuda_event_create(&cu->oev[0], err)) < 0 || (rc = kcuda_event_create(&cu->oev[1], err)) < 0))
        return rc;
    BL_LOG(BL_LOG_INFO, "event=op_offload rows=%lld buffer_bytes=%zu staged=%d", (long long)cu->offload_rows,
           cu->off_bytes, staged);
    return 0;
}

/* One allocation for every weight: 256-aligned tensors, and kcuda_alloc pads the
 * end, so each matrix's last 16-byte load stays inside. */
static int cu_commit(wk_backend_t *b, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    int rc = kcuda_set_device(cu->device, err);
    if (rc < 0)
        return rc;
    if ((rc = kcuda_alloc((void **)&cu->arena, cu->total + 256, err)) < 0) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return bl_err_set(err, rc, "the weights of layers %lld..%lld (%.2f GiB) on CUDA device %d: "
                          "%s; the whole stage must fit the card (-ngl 0 runs on the CPU)",
                          (long long)cu->lb, (long long)cu->le - 1, (double)cu->total / (1 << 30),
                          cu->device, why);
    }
    if ((rc = bind(cu, err)) < 0) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return bl_err_set(err, rc, "%s: a weight the CUDA kernels cannot read: %s", cu->path, why);
    }
    if ((rc = upload_all(cu, err)) < 0)
        return rc;
    if (cu->o->experts == WK_EXPERTS_ONLY ? (rc = alloc_only(cu, err)) < 0
                                          : (rc = alloc_scratch(cu, err)) < 0 || (rc = offload_alloc(cu, err)) < 0)
        return rc;
    for (int i = 0; i <= PROF_EVENTS; i++) /* cheap; profiling can be switched on later */
        if ((rc = kcuda_event_create(&cu->ev[i], err)) < 0)
            return rc;
    return kcuda_sync(cu->stream, err);
}

static int cu_kv_alloc(wk_backend_t *b, wk_kv_t *kv, bl_err_t *err)
{
    const cuda_t *cu = (const cuda_t *)b;
    if (kv->type != WK_KV_F16)
        return bl_err_set(err, BL_ENOTSUP, "a KV cache of type %s on the card: only f16 is supported there",
                          kv->type == WK_KV_F32 ? "f32" : "q8_0");
    int rc = kcuda_set_device(cu->device, err);
    if (rc < 0)
        return rc;
    const size_t nbytes = (size_t)kv->n_layer * (size_t)kv->n_planes * (size_t)kv->stride * kv->row_bytes;
    kv->buf = NULL;
    if (nbytes == 0) /* a stage of DeltaNet layers only */
        return 0;
    if ((rc = kcuda_alloc((void **)&kv->buf, nbytes, err)) < 0) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return bl_err_set(err, rc, "KV cache of %lld positions (%zu bytes) on CUDA device %d: %s",
                          (long long)kv->stride, nbytes, cu->device, why);
    }
    return 0;
}

static void cu_kv_free(wk_backend_t *b, wk_kv_t *kv)
{
    (void)b;
    kcuda_free(kv->buf);
}

/* On the step stream, so that it follows the steps that wrote the cache and
 * precedes those that read it. */
static int cu_kv_copy(wk_backend_t *b, wk_kv_t *kv, void *host, int64_t n, int64_t host_n, int to_host,
                      bl_err_t *err)
{
    const cuda_t *cu = (const cuda_t *)b;
    int rc = kcuda_set_device(cu->device, err);
    const size_t seg = (size_t)n * kv->row_bytes, pitch = (size_t)kv->stride * kv->row_bytes,
                 hpitch = (size_t)host_n * kv->row_bytes;
    for (int64_t i = 0; rc == 0 && i < kv->n_layer * kv->n_planes; i++) {
        uint8_t *d = kv->buf + (size_t)i * pitch, *h = (uint8_t *)host + (size_t)i * hpitch;
        rc = to_host ? kcuda_download(h, d, seg, cu->stream, err) : kcuda_upload(d, h, seg, cu->stream, err);
    }
    return rc < 0 ? rc : kcuda_sync(cu->stream, err);
}

/* On the step stream too: the next step reads the moved positions. */
static int cu_kv_move(wk_backend_t *b, wk_kv_t *kv, int64_t dst, int64_t src, int64_t n,
                      bl_err_t *err)
{
    const cuda_t *cu = (const cuda_t *)b;
    int rc = kcuda_set_device(cu->device, err);
    const size_t rb = kv->row_bytes, pitch = (size_t)kv->stride * rb;
    for (int64_t i = 0; rc == 0 && i < kv->n_layer * kv->n_planes; i++) {
        uint8_t *plane = kv->buf + (size_t)i * pitch;
        rc = kcuda_copy(plane + (size_t)dst * rb, plane + (size_t)src * rb, (size_t)n * rb, cu->stream,
                        err);
    }
    return rc;
}

static int cu_state_alloc(wk_backend_t *b, size_t nbytes, void **out, bl_err_t *err)
{
    const cuda_t *cu = (const cuda_t *)b;
    int rc = kcuda_set_device(cu->device, err);
    return rc < 0 ? rc : kcuda_host_alloc(out, nbytes ? nbytes : 1, err);
}

static void cu_state_free(wk_backend_t *b, void *p)
{
    (void)b;
    kcuda_host_free(p);
}

static int cu_rec_alloc(wk_backend_t *b, size_t nbytes, float **out, bl_err_t *err)
{
    const cuda_t *cu = (const cuda_t *)b;
    *out = NULL;
    int rc = kcuda_set_device(cu->device, err);
    if (rc == 0 && (rc = kcuda_alloc((void **)out, nbytes, err)) < 0) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return bl_err_set(err, rc, "a recurrent state of %zu bytes on CUDA device %d: %s", nbytes, cu->device, why);
    }
    if (rc == 0 && (rc = kcuda_memset(*out, 0, nbytes, cu->stream, err)) == 0)
        rc = kcuda_sync(cu->stream, err);
    if (rc < 0) {
        kcuda_free(*out);
        *out = NULL;
    }
    return rc;
}

static void cu_rec_free(wk_backend_t *b, float *rec)
{
    (void)b;
    kcuda_free(rec);
}

/* On the step stream, as cu_kv_copy. */
static int cu_rec_copy(wk_backend_t *b, float *rec, void *host, size_t nbytes, int to_host, bl_err_t *err)
{
    const cuda_t *cu = (const cuda_t *)b;
    int rc = kcuda_set_device(cu->device, err);
    if (rc == 0)
        rc = to_host ? kcuda_download(host, rec, nbytes, cu->stream, err) : kcuda_upload(rec, host, nbytes, cu->stream, err);
    return rc < 0 ? rc : kcuda_sync(cu->stream, err);
}

// --- residency -----------------------------------------------------------------------------

/* One expert's bytes in each of a host layer's three tensors. */
static void expert_bytes(const cuda_t *cu, const struct hostx *x, size_t eb[3])
{
    for (int i = 0; i < 3; i++)
        eb[i] = x->h[i].row_bytes * (size_t)(x->h[i].nrows / cu->c->n_expert);
}

/* A host layer whose three tensors the card reads straight from host memory, the
 * only kind residency copies from. */
static int slot_layer(const struct hostx *x)
{
    return x->h[0].data && x->reg[0] && x->reg[1] && x->reg[2];
}

static size_t pool_bytes(const size_t eb[3], int64_t n)
{
    size_t off = 0;
    for (int i = 0; i < 3; i++)
        off = ((off + 255) & ~(size_t)255) + eb[i] * (size_t)n;
    return off;
}

static void resid_off(cuda_t *cu, const char *why)
{
    cu->resid = -1;
    BL_LOG(BL_LOG_INFO, "event=residency_off reason=\"%s\"", why);
}

/* A set-up that failed part way: nothing of it stays, the steps run as without. */
static void resid_undo(cuda_t *cu)
{
    if (cu->rs)
        for (int64_t l = 0; l < cu->le - cu->lb; l++)
            kcuda_free(cu->rs[l].d);
    free(cu->rs);
    cu->rs = NULL;
    bl_resid_free(cu->res);
    cu->res = NULL;
    cu->n_slots_total = 0;
    cu->slot_bytes = 0;
}

/* The slots: the budget (o->experts_vram, or what the card has free now less
 * WK_RESID_MARGIN) split evenly over the host layers whose three tensors the card
 * can read straight from host memory (registered), as many slots a layer as the
 * budget gives, at most its experts. Even, because a layer's experts may be of other
 * types than another's, and every layer is on the path of every token. */
static int resid_setup(cuda_t *cu, bl_err_t *err)
{
    const int64_t nl = cu->le - cu->lb, NE = cu->c->n_expert, K = cu->c->n_expert_used, B = cu->o->n_batch;
    size_t per = 0; /* one expert of every eligible layer */
    int64_t layers = 0;
    for (int64_t l = 0; cu->hx && l < nl; l++) {
        const struct hostx *x = &cu->hx[l];
        if (!slot_layer(x))
            continue;
        size_t eb[3];
        expert_bytes(cu, x, eb);
        per += pool_bytes(eb, 1) + 256;
        layers++;
    }
    if (layers == 0) {
        resid_off(cu, "no host layer's experts are in registered host memory");
        return 0;
    }
    size_t budget;
    if (cu->o->experts_vram >= 0) {
        budget = (size_t)cu->o->experts_vram;
    } else {
        size_t fr = 0;
        int rc = kcuda_mem_free(&fr, err);
        if (rc < 0)
            return rc;
        budget = fr > (size_t)WK_RESID_MARGIN ? fr - (size_t)WK_RESID_MARGIN : 0;
    }
    int64_t n = (int64_t)(budget / per);
    n = n > NE ? NE : n;
    if (n < 1) {
        resid_off(cu, "the budget holds no slot in every host layer");
        return 0;
    }
    int32_t *slots = calloc((size_t)cu->c->n_layer, sizeof *slots); /* the heat's layers: the model's */
    cu->rs = calloc((size_t)nl, sizeof *cu->rs);
    cu->sel = calloc((size_t)nl, sizeof *cu->sel);
    cu->hits = calloc((size_t)nl, sizeof *cu->hits);
    const size_t rows = (size_t)B, pairs = (size_t)(B * K), E = (size_t)cu->c->n_embd;
    cu->cx = malloc(sizeof(float) * rows * E);
    cu->csums = malloc(sizeof(float) * rows * E);
    cu->cwts = malloc(sizeof(float) * pairs);
    cu->cids = malloc(sizeof(int32_t) * pairs);
    cu->ccnt = malloc(sizeof(int32_t) * rows);
    cu->crow = malloc(sizeof(int32_t) * rows);
    int rc = 0;
    if (!slots || !cu->rs || !cu->sel || !cu->hits || !cu->cx || !cu->csums || !cu->cwts || !cu->cids ||
        !cu->ccnt || !cu->crow) {
        free(slots);
        return bl_err_set(err, BL_ENOMEM, "out of memory for residency");
    }
    for (int64_t l = 0; l < nl; l++) {
        const struct hostx *x = &cu->hx[l];
        struct rslots *r = &cu->rs[l];
        if (!slot_layer(x))
            continue;
        expert_bytes(cu, x, r->eb);
        if ((rc = dalloc(&r->d, pool_bytes(r->eb, n) + 256, err)) < 0)
            break;
        size_t off = 0;
        for (int i = 0; i < 3 && rc == 0; i++) {
            off = (off + 255) & ~(size_t)255;
            rc = kcuda_mat_init(&r->m[i], r->d + off, x->h[i].type, x->h[i].ncols, x->h[i].nrows / NE * n, err);
            off += r->eb[i] * (size_t)n;
        }
        r->n = (int32_t)n;
        slots[cu->lb + l] = (int32_t)n;
        cu->n_slots_total += n;
        cu->slot_bytes += pool_bytes(r->eb, n);
    }
    const size_t tb = sizeof(int32_t) * (size_t)(nl * NE);
    if (rc == 0)
        rc = bl_resid_create(&cu->res, cu->c->n_layer, NE, slots, err);
    free(slots);
    if (rc < 0 || (rc = dalloc(&cu->d_table, tb, err)) < 0 ||
        (rc = kcuda_host_alloc((void **)&cu->h_table, tb, err)) < 0 ||
        (rc = dalloc(&cu->d_sid, sizeof(int32_t) * pairs, err)) < 0 ||
        (rc = kcuda_stream_create(&cu->mstream, err)) < 0 || (rc = kcuda_event_create(&cu->mev, err)) < 0 ||
        (rc = kcuda_event_create(&cu->fev, err)) < 0)
        return rc;
    for (int64_t i = 0; i < nl * NE; i++)
        cu->h_table[i] = -1;
    if ((rc = kcuda_upload(cu->d_table, cu->h_table, tb, cu->stream, err)) < 0)
        return rc;
    cu->resid = 1;
    BL_LOG(BL_LOG_INFO, "event=residency policy=heat half_life_steps=%d ratio=%.2f layers=%lld "
           "slots_per_layer=%lld of=%lld slot_bytes=%zu budget_bytes=%zu moves_per_batch=%d",
           WK_HEAT_HALF_LIFE, BL_RESID_RATIO, (long long)layers, (long long)n, (long long)NE, cu->slot_bytes,
           budget, RESID_MOVES);
    return 0;
}

/* Before a step, when nothing runs on the step's stream: the last step's batch of
 * moves is seated, and the next one planned from the heat; its leaving experts go off the
 * tables at once (the card's copy, on the step's stream, lands before this step's
 * launches), its copies start on the moves' stream after whatever the card has
 * queued so far. A failed copy stops residency: the tables then keep only what
 * was seated, which stays right. */
static int resid_tick(cuda_t *cu, bl_err_t *err)
{
    if (cu->resid == 0) {
        int rc = resid_setup(cu, err);
        if (rc < 0) {
            resid_undo(cu);
            resid_off(cu, err->msg);
            return 0;
        }
    }
    if (cu->resid < 0)
        return 0;
    const int64_t NE = cu->c->n_expert;
    int changed = 0, rc;
    if (cu->n_moves > 0) {
        /* waited for, not polled: the moves of a step are seated at the next step
         * whatever the timing, so the same requests give the same numbers run after
         * run (a batch's copies take a few ms, a step with host experts longer) */
        bl_err_t e2 = {0};
        if (kcuda_event_sync(cu->fev, &e2) < 0) {
            bl_resid_abort(cu->res);
            cu->n_moves = 0;
            resid_off(cu, e2.msg);
            return 0;
        }
        bl_resid_commit(cu->res);
        for (int64_t i = 0; i < cu->n_moves; i++) {
            const bl_resid_move_t *m = &cu->moves[i];
            cu->h_table[(m->layer - cu->lb) * NE + m->in] = m->slot;
            cu->n_evicted += m->out >= 0;
        }
        cu->n_moved += (uint64_t)cu->n_moves;
        cu->n_moves = 0;
        changed = 1;
    }
    const int64_t n = bl_resid_plan(cu->res, cu->heat, RESID_MOVES, cu->moves);
    for (int64_t i = 0; i < n; i++)
        if (cu->moves[i].out >= 0)
            cu->h_table[(cu->moves[i].layer - cu->lb) * NE + cu->moves[i].out] = -1;
    changed |= n > 0;
    if (changed && (rc = kcuda_upload(cu->d_table, cu->h_table, sizeof(int32_t) * (size_t)((cu->le - cu->lb) * NE),
                                      cu->stream, err)) < 0)
        return rc;
    if (n == 0)
        return 0;
    if ((rc = kcuda_stream_after(cu->mstream, cu->stream, cu->mev, err)) < 0)
        return rc;
    for (int64_t i = 0; i < n; i++) {
        const bl_resid_move_t *m = &cu->moves[i];
        const struct hostx *x = &cu->hx[m->layer - cu->lb];
        const struct rslots *r = &cu->rs[m->layer - cu->lb];
        for (int j = 0; j < 3; j++)
            if ((rc = kcuda_upload((uint8_t *)r->m[j].data + r->eb[j] * (size_t)m->slot,
                                   (const uint8_t *)x->h[j].data + r->eb[j] * (size_t)m->in, r->eb[j], cu->mstream,
                                   err)) < 0)
                return rc;
    }
    cu->n_moves = n;
    return kcuda_event_record(cu->fev, cu->mstream, err);
}

/* A prompt step's choices of a host layer it computed on the card, counted at end
 * from the copy its ids left in pinned memory (no host node: the stream need not
 * stop for it). */
static void count_prompt(cuda_t *cu, int64_t li, int64_t n)
{
    const int64_t K = cu->c->n_expert_used, NE = cu->c->n_expert;
    const int32_t *ids = cu->h_pids + li * cu->o->n_batch * K;
    bl_heat_add(cu->heat, cu->lb + li, ids, n * K);
    if (!cu->rs || cu->rs[li].n == 0)
        return;
    const int32_t *tab = cu->h_table + li * NE;
    uint64_t hit = 0;
    for (int64_t s = 0; s < n * K; s++)
        hit += ids[s] >= 0 && ids[s] < NE && tab[ids[s]] >= 0;
    atomic_fetch_add_explicit(&cu->sel[li], (uint64_t)(n * K), memory_order_relaxed);
    atomic_fetch_add_explicit(&cu->hits[li], hit, memory_order_relaxed);
}

static void cu_resid(const wk_backend_t *b, wk_resid_stats_t *out)
{
    const cuda_t *cu = (const cuda_t *)b;
    if (cu->resid <= 0)
        return;
    out->slots = cu->n_slots_total;
    out->slot_bytes = (int64_t)cu->slot_bytes;
    out->moves = atomic_load_explicit(&cu->n_moved, memory_order_relaxed);
    out->evictions = atomic_load_explicit(&cu->n_evicted, memory_order_relaxed);
}

static void cu_resid_layer(const wk_backend_t *b, int64_t l, uint64_t *selections, uint64_t *hits)
{
    const cuda_t *cu = (const cuda_t *)b;
    if (cu->resid <= 0 || cu->rs[l - cu->lb].n == 0)
        return;
    *selections = atomic_load_explicit(&cu->sel[l - cu->lb], memory_order_relaxed);
    *hits = atomic_load_explicit(&cu->hits[l - cu->lb], memory_order_relaxed);
}

// --- activations card to card ---------------------------------------------------------------

/* The buffers and events of the links, exported (WK_CARD_OUT) or opened
 * (WK_CARD_IN), let go of (the step stream drained first: a copy may still use a
 * buffer). */
static void cu_card_close(wk_backend_t *b, int which)
{
    cuda_t *cu = (cuda_t *)b;
    bl_err_t e;
    if (!((which & WK_CARD_OUT) && cu->cout.n) && !((which & WK_CARD_IN) && cu->cin.n))
        return;
    if (kcuda_set_device(cu->device, &e) == 0 && cu->stream)
        drain(cu->stream);
    for (int k = 0; (which & WK_CARD_OUT) && k < cu->cout.n; k++) {
        kcuda_free(cu->cout.buf[k]);
        kcuda_event_destroy(cu->cout.ev[k]);
    }
    for (int k = 0; (which & WK_CARD_IN) && k < cu->cin.n; k++) {
        kcuda_ipc_mem_close(cu->cin.buf[k]);
        kcuda_event_destroy(cu->cin.ev[k]);
    }
    if (which & WK_CARD_OUT)
        memset(&cu->cout, 0, sizeof cu->cout);
    if (which & WK_CARD_IN) {
        memset(&cu->cin, 0, sizeof cu->cin);
        kcuda_event_destroy(cu->card_rev);
        cu->card_rev = NULL;
    }
}

/* A buffer of n_batch rows and its event per k, each exported: one allocation per
 * buffer, since an opened handle maps its whole allocation. */
static int cu_card_export(wk_backend_t *b, int n_bufs, wk_card_t *out, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    const size_t bytes = sizeof(float) * (size_t)cu->o->n_batch * (size_t)cu->c->n_embd;
    int rc = kcuda_set_device(cu->device, err);
    for (int k = 0; rc == 0 && k < n_bufs; k++) {
        cu->cout.n = k + 1;
        if ((rc = kcuda_alloc(&cu->cout.buf[k], bytes, err)) == 0 &&
            (rc = kcuda_ipc_mem_export(cu->cout.buf[k], out->mem[k], err)) == 0 &&
            (rc = kcuda_ipc_event_create(&cu->cout.ev[k], err)) == 0)
            rc = kcuda_ipc_event_export(cu->cout.ev[k], out->ev[k], err);
    }
    if (rc < 0) {
        cu_card_close(b, WK_CARD_OUT);
        return rc;
    }
    out->device = cu->device;
    out->n_bufs = n_bufs;
    out->buf_bytes = bytes;
    return 0;
}

static int cu_card_import(wk_backend_t *b, const wk_card_t *in, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    int can = 0;
    int rc = kcuda_set_device(cu->device, err);
    if (rc == 0)
        rc = kcuda_can_access_peer(cu->device, in->device, &can, err);
    if (rc < 0)
        return rc;
    /* Without peer access the runtime would stage each copy through host memory:
     * no better than the host ring, which stays then. */
    if (!can)
        return bl_err_set(err, BL_ENOTSUP, "CUDA%d cannot reach CUDA%d's memory (no peer access between them)",
                          cu->device, in->device);
    for (int k = 0; rc == 0 && k < in->n_bufs; k++) {
        cu->cin.n = k + 1;
        if ((rc = kcuda_ipc_mem_open(&cu->cin.buf[k], in->mem[k], err)) == 0)
            rc = kcuda_ipc_event_open(&cu->cin.ev[k], in->ev[k], err);
    }
    if (rc == 0)
        rc = kcuda_event_create_blocking(&cu->card_rev, err);
    if (rc < 0) {
        cu_card_close(b, WK_CARD_IN);
        return rc;
    }
    return 0;
}

static int cu_card_put(wk_backend_t *b, int k, const float *x, size_t nbytes, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    int rc = kcuda_set_device(cu->device, err);
    if (rc == 0)
        rc = kcuda_copy(cu->cout.buf[k], x, nbytes, cu->stream, err);
    return rc < 0 ? rc : kcuda_event_record(cu->cout.ev[k], cu->stream, err);
}

static int cu_card_get(wk_backend_t *b, int k, float *x, size_t nbytes, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    int rc = kcuda_set_device(cu->device, err);
    if (rc == 0)
        rc = kcuda_stream_wait(cu->stream, cu->cin.ev[k], err);
    /* a plain device copy: the opened buffer is mapped into this card's context */
    if (rc == 0)
        rc = kcuda_copy(x, cu->cin.buf[k], nbytes, cu->stream, err);
    return rc < 0 ? rc : kcuda_event_record(cu->card_rev, cu->stream, err);
}

static int cu_card_settle(wk_backend_t *b, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    int rc = kcuda_set_device(cu->device, err);
    return rc < 0 ? rc : kcuda_event_sync(cu->card_rev, err);
}

static int cu_pin_host(wk_backend_t *b, void *p, size_t nbytes, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    if (cu->pinned)
        return bl_err_set(err, BL_EINVAL, "the backend pins one host region");
    int rc = kcuda_set_device(cu->device, err);
    if (rc < 0 || (rc = kcuda_host_pin(p, nbytes, err)) < 0)
        return rc;
    cu->pinned = p;
    return 0;
}

// --- a step ------------------------------------------------------------------------------

/* The graph bucket of a decode step whose longest row attends to len positions. */
static int bucket_of(int64_t len)
{
    int i = 0;
    while (i < N_BUCKETS - 1 && ((int64_t)256 << i) < len)
        i++;
    return i;
}

int64_t wk_cuda_att_grid(int64_t positions, int64_t n_ctx)
{
    const int64_t cap = att_cap(n_ctx);
    const int64_t grid = (int64_t)256 << bucket_of(positions);
    return grid < cap ? grid : cap;
}

/* The step's inputs into pinned memory, then one copy to the card; picks the
 * schedule. A decode step replays its graph (WK_STEP_REPLAYED) or starts capturing
 * it; a profiled one is captured with an event node after every launch (so the
 * timestamps come from the card, without the host's launch gaps) and dropped after
 * one replay. */
static int cu_begin(wk_backend_t *b, const wk_step_t *st, float *x, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    const int64_t E = cu->c->n_embd;
    int rc = kcuda_set_device(cu->device, err);
    if (rc < 0)
        return rc;
    if ((rc = resid_tick(cu, err)) < 0)
        return rc;
    cu->st = st;
    cu->capture = NULL;
    cu->profiled = 0;
    atomic_store(&cu->host_rc, 0);
    int decode = st->nseg <= GRAPH_MAX_ROWS;
    int64_t max_pos = 0;
    for (int64_t j = 0; j < st->nseg; j++) {
        const wk_seg_t *s = &st->seg[j];
        decode &= s->n == 1;
        for (int64_t i = 0; i < s->n; i++) {
            const int64_t r = s->row0 + i;
            cu->h_tokens[r] = cu->lb == 0 ? s->tokens[i] : 0;
            cu->h_pos[r] = (int32_t)(s->pos + i);
        }
        max_pos = s->pos + s->n > max_pos ? s->pos + s->n : max_pos;
    }
    if (decode)
        for (int64_t j = 0; j < st->nseg; j++) {
            const wk_kv_t *kv = st->seg[j].kv;
            const uint64_t plane = (uint64_t)kv->stride * kv->row_bytes;
            cu->h_rows[j] = (kcuda_kv_row_t){.k = (uint64_t)(uintptr_t)kv->buf,
                                             .layer_bytes = (uint64_t)kv->n_planes * plane,
                                             .v_bytes = (uint64_t)(kv->n_planes - 1) * plane,
                                             .pos = (int32_t)st->seg[j].pos};
        }
    if ((rc = kcuda_upload(cu->d_in, cu->h_in, cu->in_bytes, cu->stream, err)) < 0)
        return rc;
    if (cu->d_dseg) { /* a hybrid: each sequence's rows and recurrent state */
        for (int64_t j = 0; j < st->nseg; j++) {
            const wk_seg_t *s = &st->seg[j];
            cu->h_dseg[j] = (kcuda_dn_seg_t){.state = (uint64_t)(uintptr_t)s->kv->rec, .row0 = (int32_t)s->row0,
                                             .n = (int32_t)s->n, .pos = (int32_t)s->pos};
        }
        if ((rc = kcuda_upload(cu->d_dseg, cu->h_dseg, sizeof(kcuda_dn_seg_t) * (size_t)st->nseg, cu->stream,
                               err)) < 0)
            return rc;
    }
    if (cu->lb > 0 && st->x_in &&
        (rc = kcuda_upload(x, st->x_in, sizeof(float) * (size_t)(st->n * E), cu->stream, err)) < 0)
        return rc;

    cu->prof_on = cu->o->profile;
    cu->n_ev = 0;
    const int graph = decode && cu->o->cuda_graph;
    if (cu->prof_on && !graph && (rc = kcuda_event_record(cu->ev[0], cu->stream, err)) < 0)
        return rc;
    if (!decode) {
        cu->mode = cu->pp_ok ? MODE_PROMPT : MODE_ROWS;
        return 0;
    }
    cu->mode = MODE_DECODE;
    cu->rope_cs_ok = 0;
    const int bk = bucket_of(max_pos);
    cu->max_len = wk_cuda_att_grid(max_pos, cu->o->n_ctx_max);
    if (!graph)
        return 0;
    if (!cu->prof_on && cu->graphs[st->n][bk]) {
        rc = kcuda_graph_launch(cu->graphs[st->n][bk], cu->stream, err);
        return rc < 0 ? rc : WK_STEP_REPLAYED;
    }
    if ((rc = kcuda_graph_begin(cu->stream, err)) < 0)
        return rc;
    if (cu->prof_on) {
        cu->profiled = 1;
        cu->prof_exec = NULL;
        cu->capture = &cu->prof_exec;
        return kcuda_event_record(cu->ev[0], cu->stream, err);
    }
    cu->capture = &cu->graphs[st->n][bk];
    return 0;
}

/* Closes a capture and replays it, then the outputs: the hidden rows for the next
 * stage, or the logits asked for. */
static int cu_end(wk_backend_t *b, const wk_step_t *st, int status, const float *x, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    const wk_config_t *c = cu->c;
    const int64_t E = c->n_embd, V = c->n_vocab;
    int rc = status;
    if (cu->capture) {
        bl_err_t e2 = {0};
        const int rc2 = kcuda_graph_end(cu->stream, cu->capture, rc < 0 ? &e2 : err);
        void *exec = *cu->capture;
        cu->capture = NULL;
        if (rc == 0)
            rc = rc2;
        if (rc == 0)
            rc = kcuda_graph_launch(exec, cu->stream, err);
        if (cu->profiled) {
            if (rc == 0)
                rc = kcuda_sync(cu->stream, err);
            kcuda_graph_destroy(cu->prof_exec);
            cu->prof_exec = NULL;
        }
    }
    cu->st = NULL;
    if (rc < 0) {
        drain(cu->stream);
        if (cu->pcount) /* a failed step's choices are not counted */
            memset(cu->pcount, 0, sizeof *cu->pcount * (size_t)(cu->le - cu->lb));
        return rc;
    }

    if (cu->le < c->n_layer) {
        if (st->x_out && (rc = kcuda_download(st->x_out, x, sizeof(float) * (size_t)(st->n * E), cu->stream, err)) < 0)
            return rc;
    } else if (cu->mode == MODE_DECODE) {
        /* row j of the card's logits is sequence j's; each run of sequences with an
         * output row is one copy */
        int64_t o = 0;
        for (int64_t j = 0; j < st->nseg;) {
            if (st->seg[j].n_out <= 0) {
                j++;
                continue;
            }
            int64_t j1 = j + 1;
            while (j1 < st->nseg && st->seg[j1].n_out > 0)
                j1++;
            if ((rc = kcuda_download(st->logits + (size_t)o * (size_t)V, cu->logits + (size_t)j * (size_t)V,
                                     sizeof(float) * (size_t)((j1 - j) * V), cu->stream, err)) < 0)
                return rc;
            o += j1 - j;
            j = j1;
        }
    } else {
        int64_t n_out = 0;
        for (int64_t j = 0; j < st->nseg; j++)
            n_out += st->seg[j].n_out;
        if (n_out > 0 && (rc = kcuda_download(st->logits, cu->logits, sizeof(float) * (size_t)(n_out * V),
                                              cu->stream, err)) < 0)
            return rc;
    }
    /* With host layers the step's thread sleeps until the card is done: spinning, it
     * would take a core from the threads computing the host experts (the runtime
     * spins by default while a process has fewer contexts than cores) */
    if (cu->sev && (rc = kcuda_event_record(cu->sev, cu->stream, err)) == 0)
        rc = kcuda_event_sync(cu->sev, err);
    if (rc < 0 || (rc = kcuda_sync(cu->stream, err)) < 0)
        return rc;
    if (cu->pcount)
        for (int64_t li = 0; li < cu->le - cu->lb; li++)
            if (cu->pcount[li] > 0) {
                count_prompt(cu, li, cu->pcount[li]);
                cu->pcount[li] = 0;
            }
    if (cu->heat)
        bl_heat_step(cu->heat);
    /* a host call's failure shows once the stream has run it (what it left in the
     * outputs is not used) */
    if ((rc = atomic_load(&cu->host_rc)) < 0)
        return bl_err_set(err, rc, "%s", cu->host_err.msg);
    return cu->prof_on ? prof_collect(cu, err) : 0;
}

static const kcuda_mat_t *M(const wk_tensor_t *t) { return &((const cw_t *)t->d)->m; }

/* y (n, w->nrows) = x (n, w->ncols) w^T in chunks of KCUDA_MV_MAX_ROWS rows. */
static int mv(cuda_t *cu, const kcuda_mat_t *w, const float *bias, const float *x, int64_t ldx, int64_t n, float *y,
              int64_t ldy, int acc, bl_err_t *err)
{
    for (int64_t r = 0; r < n; r += KCUDA_MV_MAX_ROWS) {
        const int cn = (int)(n - r < KCUDA_MV_MAX_ROWS ? n - r : KCUDA_MV_MAX_ROWS);
        int rc = kcuda_matvec_bias(w, x + r * ldx, ldx, cn, bias, y + r * ldy, ldy, acc, cu->stream, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* y (n, w->nrows) [+]= x w^T with x16 holding x (n, w->ncols) in f16, ldx16 apart:
 * a tensor-core GEMM. */
static int pp_mm(cuda_t *cu, const kcuda_mat_t *w, const float *x, int64_t ldx, int64_t ldx16, int64_t n, float *y,
                 int64_t ldy, int acc, bl_err_t *err)
{
    return kcuda_gemm(cu->blas, w, cu->x16, ldx16, x, ldx, n, y, ldy, acc, cu->wscr, cu->wscr_bytes, cu->stream,
                      err);
}

static int same_shape(const kcuda_mat_t *a, const kcuda_mat_t *b)
{
    return a->type == b->type && a->ncols == b->ncols && a->nrows == b->nrows;
}

/* Whether e's experts take the plain SwiGLU without biases (the fused kernels' form). */
static int plain_swiglu(const wk_moe_t *e)
{
    return e->act == KCUDA_ACT_SWIGLU && !e->gate_b.p && !e->up_b.p;
}

static int cu_embed(wk_backend_t *b, const wk_tensor_t *table, float *x, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    OP("embed", kcuda_get_rows(M(table), cu->d_tokens, cu->st->n, x, cu->c->n_embd, cu->stream, err));
    return 0;
}

static int cu_rms_norm(wk_backend_t *b, const char *op, float *y, const float *x, const float *g, int64_t n,
                       int64_t d, float eps, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    OP(op, kcuda_rms_norm(y, x, g, n, d, d, eps, cu->stream, err));
    return 0;
}

/* q, k, v of n rows of x with their biases (b: NULL or three, each may be NULL), one
 * launch per KCUDA_MV_MAX_ROWS rows (the bits of separate products and bias adds):
 * the stacked run, and v beside it when it is not in the run. */
static int mv_qkv(cuda_t *cu, const cw_t *q, const kcuda_mat_t *wk, const kcuda_mat_t *wv, const float *const *b,
                  const float *x, int64_t ldx, int64_t n, float *dq, float *dk, float *dv, bl_err_t *err)
{
    const int64_t nq = q->m.nrows, nkv = wk->nrows;
    for (int64_t r = 0; r < n; r += KCUDA_MV_MAX_ROWS) {
        const int cn = (int)(n - r < KCUDA_MV_MAX_ROWS ? n - r : KCUDA_MV_MAX_ROWS);
        const kcuda_out_t outs[3] = {{dq + r * nq, nq, q->m.nrows, b ? b[0] : NULL},
                                     {dk + r * nkv, nkv, wk->nrows, b ? b[1] : NULL},
                                     {dv + r * nkv, nkv, wv->nrows, b ? b[2] : NULL}};
        int rc = q->nstack == 2 ? kcuda_matvec_split2(&q->stack, outs, 2, wv, &outs[2], x + r * ldx, ldx, cn,
                                                      cu->stream, err)
                                : kcuda_matvec_split(&q->stack, x + r * ldx, ldx, cn, outs, 3, cu->stream, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int cu_qkv(wk_backend_t *b, const wk_tensor_t *wq, const wk_tensor_t *wk, const wk_tensor_t *wv,
                  const float *const *bias, const float *x, int64_t n, float *q, float *k, float *v, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    const int64_t E = cu->c->n_embd, nq = M(wq)->nrows, nkv = M(wk)->nrows;
    const float *bq = bias ? bias[0] : NULL, *bk = bias ? bias[1] : NULL, *bv = bias ? bias[2] : NULL;
    if (cu->mode == MODE_PROMPT) {
        OP("attn_to_f16", kcuda_to_f16(x, E, n, E, cu->x16, E, cu->stream, err));
        OP("attn_q", pp_mm(cu, M(wq), x, E, E, n, q, nq, 0, err));
        OP("attn_k", pp_mm(cu, M(wk), x, E, E, n, k, nkv, 0, err));
        OP("attn_v", pp_mm(cu, M(wv), x, E, E, n, v, nkv, 0, err));
        if (bq)
            OP("attn_q_bias", kcuda_add_bias(q, bq, n, nq, cu->stream, err));
        if (bk)
            OP("attn_k_bias", kcuda_add_bias(k, bk, n, nkv, cu->stream, err));
        if (bv)
            OP("attn_v_bias", kcuda_add_bias(v, bv, n, nkv, cu->stream, err));
        return 0;
    }
    const cw_t *cq = wq->d;
    if (cq->stack.data) {
        OP("attn_qkv", mv_qkv(cu, cq, M(wk), M(wv), bias, x, E, n, q, k, v, err));
    } else {
        OP("attn_q", mv(cu, M(wq), bq, x, E, n, q, nq, 0, err));
        OP("attn_k", mv(cu, M(wk), bk, x, E, n, k, nkv, 0, err));
        OP("attn_v", mv(cu, M(wv), bv, x, E, n, v, nkv, 0, err));
    }
    return 0;
}

static int cu_matmul(wk_backend_t *b, const char *op, const wk_tensor_t *w, const float *bias, const float *x,
                     int64_t n, float *y, int acc, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    const kcuda_mat_t *m = M(w);
    if (cu->mode == MODE_PROMPT) {
        OP(op, kcuda_to_f16(x, m->ncols, n, m->ncols, cu->x16, m->ncols, cu->stream, err));
        OP(op, pp_mm(cu, m, x, m->ncols, m->ncols, n, y, m->nrows, acc, err));
        if (bias)
            OP(op, kcuda_add_bias(y, bias, n, m->nrows, cu->stream, err));
        return 0;
    }
    OP(op, mv(cu, m, bias, x, m->ncols, n, y, m->nrows, acc, err));
    return 0;
}

/* One layer's cache of a sequence (the classic kernels' view). */
static kcuda_kv_view_t kv_view(const wk_kv_t *kv, int64_t l)
{
    const size_t plane = (size_t)kv->stride * kv->row_bytes;
    l = kv->model->kv_index[l];
    return (kcuda_kv_view_t){.k = kv->buf + (size_t)(kv->n_planes * l) * plane,
                             .v = kv->buf + (size_t)(kv->n_planes * l + kv->n_planes - 1) * plane,
                             .row_bytes = kv->row_bytes};
}

/* decode: q/k norm, RoPE and the cache store fold into the one-pass attention of
 * short contexts (longer ones launch them first), every row through the rows table
 * over a grid of max_len positions; otherwise sequence by sequence. */
static int cu_attention(wk_backend_t *b, int64_t l, const wk_attn_t *a, float *q, float *k, const float *v,
                        float *att, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    const wk_step_t *st = cu->st;
    const int64_t n = st->n, hd = a->head_dim;
    const int64_t nq = a->n_head * hd, nkv = a->n_head_kv * hd;
    void *s = cu->stream;
    kcuda_rope_t rope = rope_of(cu->c, a->n_rot, a->rope_base);
    const kcuda_att_ext_t ext = att_ext_of(a);
    if (cu->mode == MODE_DECODE) {
        /* the step's cosines and sines, once for the layers that share this RoPE */
        if (a->n_rot <= cu->c->head_dim) {
            if (!cu->rope_cs_ok || !rope_same(&cu->rope_cs_of, &rope)) {
                OP("attn_rope_table", kcuda_rope_table(cu->d_pos, n, &rope, cu->d_rope_cs, s, err));
                cu->rope_cs_of = rope;
                cu->rope_cs_ok = 1;
            }
            rope.d_cs = cu->d_rope_cs;
        }
        OP("attention", kcuda_attention_rows_qkv(cu->d_rows, cu->kvl[l - cu->lb], cu->kv_row_bytes, q, k, v, a->q_norm,
                                                 a->k_norm, cu->d_pos, att, n, cu->max_len, a->n_head, a->n_head_kv,
                                                 hd, &rope, a->eps, a->scale, &ext, cu->att_scratch,
                                                 cu->att_scratch_bytes, s, err));
        return 0;
    }
    OP("attn_qk_norm_rope",
       kcuda_rms_norm_rope(q, a->q_norm, cu->d_pos, n, a->n_head, hd, &rope, a->eps, s, err));
    OP("attn_qk_norm_rope",
       kcuda_rms_norm_rope(k, a->k_norm, cu->d_pos, n, a->n_head_kv, hd, &rope, a->eps, s, err));
    for (int64_t j = 0; j < st->nseg; j++) {
        const wk_seg_t *sg = &st->seg[j];
        const kcuda_kv_view_t kv = kv_view(sg->kv, l);
        const int64_t r0 = sg->row0;
        OP("kv_store", kcuda_kv_store(&kv, k + r0 * nkv, v + r0 * nkv, nkv, sg->pos, sg->n, nkv, s, err));
        if (cu->mode == MODE_PROMPT && cu->flash) {
            OP("attention", kcuda_attention_prefill_ext(&kv, q + r0 * nq, att + r0 * nq, sg->n, sg->pos, a->n_head,
                                                        a->n_head_kv, hd, a->scale, &ext, s, err));
            continue;
        }
        for (int64_t i = 0; i < sg->n; i += ATT_ROWS) {
            const int64_t an = sg->n - i < ATT_ROWS ? sg->n - i : ATT_ROWS;
            OP("attention", kcuda_attention(&kv, q + (r0 + i) * nq, att + (r0 + i) * nq, an, sg->pos + i, a->n_head,
                                            a->n_head_kv, hd, a->scale, &ext, cu->att_scratch,
                                            cu->att_scratch_bytes, s, err));
        }
    }
    return 0;
}

/* deepseek2's latent attention (cpu_mla's steps): the latent part of c normed, the
 * rotated parts of q and c rotated, each head's q_nope through its attn_k_b rows
 * (the weight dequantized to f16 per call), c stored as the position's cache row,
 * the heads' attention over the latent rows, each head's output through its
 * attn_v_b rows. The per-head products: in prompts one strided-batched GEMM each on
 * tensor cores (the activations rounded to f16, as every prompt product: q's f16
 * copy in mla_o before the attention writes it, the heads' outputs' in mla_q after
 * the attention read it); in decode (and without cuBLAS) kcuda_matvec_heads. */
static int cu_mla(wk_backend_t *b, int64_t l, const wk_mla_t *a, float *q, float *c, float *att, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    const wk_step_t *st = cu->st;
    const int64_t n = st->n, H = a->n_head, r = a->kv_lora, D = r + a->n_rot, hk = a->head_k, hv = a->head_v;
    const int64_t nope = hk - a->n_rot, li = cu->kvl[l - cu->lb];
    void *s = cu->stream;
    const kcuda_rope_t rope = rope_of(cu->c, a->n_rot, cu->c->rope_base);
    OP("attn_kv_a_norm", kcuda_rms_norm(c, c, a->kv_norm, n, r, D, a->eps, s, err));
    OP("attn_rope", kcuda_rope_norm(q + nope, cu->d_pos, n, H, H * hk, hk, &rope, s, err));
    OP("attn_rope", kcuda_rope_norm(c + r, cu->d_pos, n, 1, D, 0, &rope, s, err));
    const int gemm = cu->mode == MODE_PROMPT && cu->blas && hk <= 2 * r && (H * hk) % 4 == 0 && (H * r) % 4 == 0;
    OP("attn_k_b", kcuda_dequant_f16(M(a->wk_b), 0, H * r, cu->mla_w16, s, err));
    if (gemm) {
        OP("attn_k_b", kcuda_to_f16(q, H * hk, n, H * hk, cu->mla_o, H * hk, s, err));
        OP("attn_k_b", kcuda_gemm_heads(cu->blas, cu->mla_w16, H, r, nope, cu->mla_o, H * hk, hk, n, cu->mla_q, H * r,
                                        r, s, err));
    } else {
        OP("attn_k_b", kcuda_matvec_heads(cu->mla_w16, H, r, nope, q, H * hk, hk, n, cu->mla_q, H * r, r, s, err));
    }
    if (cu->mode == MODE_DECODE) {
        const size_t rb = st->seg[0].kv->row_bytes; /* every cache of a model has the same rows */
        OP("kv_store", kcuda_kv_store_rows(cu->d_rows, li, rb, c, c, D, n, D, s, err));
        OP("attention", kcuda_mla_attention(NULL, cu->d_rows, li, rb, 0, cu->mla_q, H * r, r, q + nope, H * hk, hk, n,
                                            H, r, a->n_rot, a->scale, cu->mla_o, H * r, r, cu->att_scratch,
                                            cu->att_scratch_bytes, s, err));
    } else {
        for (int64_t j = 0; j < st->nseg; j++) {
            const wk_seg_t *sg = &st->seg[j];
            const kcuda_kv_view_t kv = kv_view(sg->kv, l);
            const int64_t r0 = sg->row0;
            OP("kv_store", kcuda_kv_store(&kv, c + r0 * D, c + r0 * D, D, sg->pos, sg->n, D, s, err));
            OP("attention", kcuda_mla_attention(kv.k, NULL, 0, kv.row_bytes, sg->pos, cu->mla_q + r0 * H * r, H * r, r,
                                                q + r0 * H * hk + nope, H * hk, hk, sg->n, H, r, a->n_rot, a->scale,
                                                cu->mla_o + r0 * H * r, H * r, r, cu->att_scratch,
                                                cu->att_scratch_bytes, s, err));
        }
    }
    OP("attn_v_b", kcuda_dequant_f16(M(a->wv_b), 0, H * hv, cu->mla_w16, s, err));
    if (gemm) {
        OP("attn_v_b", kcuda_to_f16(cu->mla_o, H * r, n, H * r, cu->mla_q, H * r, s, err));
        OP("attn_v_b", kcuda_gemm_heads(cu->blas, cu->mla_w16, H, hv, r, cu->mla_q, H * r, r, n, att, H * hv, hv, s,
                                        err));
    } else {
        OP("attn_v_b", kcuda_matvec_heads(cu->mla_w16, H, hv, r, cu->mla_o, H * r, r, n, att, H * hv, hv, s, err));
    }
    return 0;
}

/* Each of n rows' k experts of xn (gate/up with SwiGLU, then down with the weighted
 * sum) into x (added where acc, else written), row r's choices in cu->ids and cu->wts
 * r * k.. (an id outside the experts adds nothing); with rl set (the router's logits,
 * route its choice), gate and up of the plain SwiGLU route each row themselves and
 * write those choices. */
static int experts_rows(cuda_t *cu, const wk_moe_t *e, const float *rl, const kcuda_route_t *route, const float *xn,
                        int64_t n, float *x, int acc, bl_err_t *err)
{
    const int64_t E = cu->c->n_embd, F = e->n_ff, K = e->n_used, NE = e->n_expert;
    const kcuda_mat_t *gate = M(&e->gate_exps), *up = M(&e->up_exps), *down = M(&e->down_exps);
    void *st = cu->stream;
    const int plain = plain_swiglu(e);
    /* The expert kernels index one block row per (row, choice): 65535 at most. */
    const int64_t step = 65535 / K;
    for (int64_t r = 0; r < n; r += step) {
        const int cn = (int)(n - r < step ? n - r : step);
        int32_t *ids = cu->ids + r * K;
        float *g = cu->g + r * K * F, *u = cu->u_ + r * K * F;
        if (rl) {
            OP("ffn_moe_gate_up", kcuda_matvec_experts_swiglu_route(gate, up, NE, rl + r * NE, route, ids,
                                                                    cu->wts + r * K, cn, (int)K, xn + r * E, E, g, F,
                                                                    st, err));
        } else if (same_shape(gate, up)) { /* biases and the activation inside the launch */
            const kcuda_experts_ext_t ext = {.gate_b = e->gate_b.p, .up_b = e->up_b.p, .act = e->act};
            OP("ffn_moe_gate_up", kcuda_matvec_experts_swiglu_ext(gate, up, NE, ids, cn, (int)K, xn + r * E, E, g, F,
                                                                  &ext, st, err));
        } else {
            OP("ffn_moe_gate", kcuda_matvec_experts(gate, NE, ids, cn, (int)K, xn + r * E, E, g, F, st, err));
            OP("ffn_moe_up", kcuda_matvec_experts(up, NE, ids, cn, (int)K, xn + r * E, E, u, F, st, err));
            if (plain)
                OP("ffn_moe_swiglu", kcuda_swiglu(g, g, u, cn * K * F, st, err));
            else
                OP("ffn_moe_act", kcuda_experts_act(g, u, F, ids, NULL, e->gate_b.p, e->up_b.p, cn * K, F, NE, e->act,
                                                    NULL, st, err));
        }
        OP("ffn_moe_down", kcuda_matvec_experts_down_grouped(down, NE, ids, cu->wts + r * K, cn, (int)K, g, F,
                                                             e->down_b.p, cu->dscr, E, x + r * E, E, acc, st, err));
    }
    return 0;
}

/* The routed experts of n rows of xn, added onto x: the gate and top-k, then each
 * row's k experts. */
static int moe_rows(cuda_t *cu, const wk_moe_t *e, const float *xn, int64_t n, float *x, bl_err_t *err)
{
    const int64_t E = cu->c->n_embd, K = e->n_used, NE = e->n_expert;
    const kcuda_route_t route = route_of(e);
    OP("ffn_gate_inp", mv(cu, M(&e->gate_inp), NULL, xn, E, n, cu->rl, NE, 0, err));
    /* Gate and up of one shape with the plain SwiGLU route in their own launch (each
     * block routes its row); otherwise the routing kernel first. */
    const int fused = plain_swiglu(e) && same_shape(M(&e->gate_exps), M(&e->up_exps));
    if (!fused)
        OP("ffn_route", kcuda_moe_route(cu->rl, n, NE, (int)K, &route, cu->ids, cu->wts, cu->stream, err));
    return experts_rows(cu, e, fused ? cu->rl : NULL, &route, xn, n, x, 1, err);
}

static int experts_prompt(cuda_t *cu, const wk_moe_t *e, const float *xn, int64_t n, float *x, bl_err_t *err);

/* An expert tier's call (an experts-only model on this card): a stage's rows with
 * their choices, in host memory, through layer l's experts here, the sums into out.
 * A row with fewer than n_used choices is padded with id -1 (which adds nothing) and
 * the launches are a decode step's; TIER_PROMPT_ROWS rows or more, each with all its
 * choices, take a prompt's grouped GEMMs. Done on return. */
static int cu_experts(wk_backend_t *b, int64_t l, const wk_moe_t *e, const float *xn, int64_t n,
                      const int32_t *counts, const int32_t *ids, const float *wts, float *out, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    const int64_t E = cu->c->n_embd, K = e->n_used;
    const size_t f = sizeof(float);
    (void)l;
    if (cu->o->experts != WK_EXPERTS_ONLY || !cu->h_x)
        return bl_err_set(err, BL_EINVAL, "%s: only a model loaded for its experts computes them apart from a step",
                          cu->path);
    if (n < 1 || n > cu->o->n_batch)
        return bl_err_set(err, BL_ERANGE, "%lld expert rows, outside 1..%lld", (long long)n,
                          (long long)cu->o->n_batch);
    int whole = 1; /* every row with all its choices */
    for (int64_t r = 0, at = 0; r < n; r++) {
        const int64_t c = counts ? counts[r] : K;
        whole &= c == K;
        for (int64_t j = 0; j < K; j++) {
            cu->h_ids[r * K + j] = j < c ? ids[at + j] : -1;
            cu->h_wts[r * K + j] = j < c ? wts[at + j] : 0.0f;
        }
        at += c;
    }
    memcpy(cu->h_x, xn, f * (size_t)(n * E));
    void *st = cu->stream;
    /* a prompt's rows through the grouped GEMMs, as a stage's own prompt experts */
    const int prompt = whole && cu->xs16 && n >= TIER_PROMPT_ROWS;
    int rc;
    if ((rc = kcuda_set_device(cu->device, err)) < 0 ||
        (rc = kcuda_upload(cu->xg, cu->h_x, f * (size_t)(n * E), st, err)) < 0 ||
        (rc = kcuda_upload(cu->ids, cu->h_ids, sizeof(int32_t) * (size_t)(n * K), st, err)) < 0 ||
        (rc = kcuda_upload(cu->wts, cu->h_wts, f * (size_t)(n * K), st, err)) < 0 ||
        (prompt && (rc = kcuda_memset(cu->d_sums, 0, f * (size_t)(n * E), st, err)) < 0) ||
        (rc = prompt ? experts_prompt(cu, e, cu->xg, n, cu->d_sums, err)
                     : experts_rows(cu, e, NULL, NULL, cu->xg, n, cu->d_sums, 0, err)) < 0 ||
        (rc = kcuda_download(cu->h_sums, cu->d_sums, f * (size_t)(n * E), st, err)) < 0 ||
        (rc = kcuda_sync(st, err)) < 0)
        return rc;
    memcpy(out, cu->h_sums, f * (size_t)(n * E));
    return 0;
}

/* Expert tensor w (NE experts of `rows` rows) over a prompt's S gathered rows (the
 * sort's counts, offsets and tiles in cu->srt) into y (S, rows): one grouped launch
 * that dequantizes the weights' tiles inside it, or for the types experts_via_f16
 * names, the chosen experts first into the f16 weight scratch and the launch over
 * those halves. */
static int experts_gemm(cuda_t *cu, const char *op, const kcuda_mat_t *w, int64_t NE, int64_t rows, int64_t S,
                        float *y, bl_err_t *err)
{
    const int32_t *counts = cu->srt, *offsets = counts + NE, *tile0 = offsets + NE + 1;
    kcuda_mat_t h;
    if (experts_via_f16(cu, w->type, (size_t)w->nrows * (size_t)w->ncols * 2)) {
        OP("ffn_moe_dequant", kcuda_dequant_f16_groups(w, rows, counts, cu->wscr, cu->stream, err));
        const int rc = kcuda_mat_init(&h, cu->wscr, BL_TYPE_F16, w->ncols, w->nrows, err);
        if (rc < 0)
            return rc;
        w = &h;
    }
    OP(op, kcuda_gemm_grouped(w, NE, rows, cu->xs16, offsets, tile0, S, y, rows, cu->stream, err));
    return 0;
}

/* The same for a prompt (x16 holds xn in f16): router and top-k on the card, the
 * (row, choice) slots sorted by expert on the card, the gathered rows through each
 * expert matrix in one grouped launch (experts_gemm), then the weighted sum back in
 * row order. */
/* The experts of n prompt rows of xn whose choices are in cu->ids and cu->wts (k a
 * row, every id an expert's), added onto x: the slots sorted by expert, gathered,
 * through the grouped products, back in row order. */
static int experts_prompt(cuda_t *cu, const wk_moe_t *e, const float *xn, int64_t n, float *x, bl_err_t *err)
{
    const int64_t E = cu->c->n_embd, F = e->n_ff, K = e->n_used, NE = e->n_expert, S = n * K;
    void *st = cu->stream;
    int32_t *counts = cu->srt, *offsets = counts + NE, *tile0 = offsets + NE + 1, *perm = tile0 + NE + 1;
    int32_t *inv = perm + cu->o->n_batch * K;
    OP("ffn_moe_sort", kcuda_moe_sort(cu->ids, S, NE, counts, offsets, tile0, perm, inv, st, err));
    OP("ffn_moe_gather", kcuda_moe_gather_f16(xn, E, perm, S, (int)K, E, cu->xs16, E, st, err));
    int rc;
    if ((rc = experts_gemm(cu, "ffn_moe_gate", M(&e->gate_exps), NE, F, S, cu->g, err)) < 0 ||
        (rc = experts_gemm(cu, "ffn_moe_up", M(&e->up_exps), NE, F, S, cu->u_, err)) < 0)
        return rc;
    /* The SwiGLU output, in f16, takes the gathered rows' place. */
    if (plain_swiglu(e))
        OP("ffn_moe_swiglu", kcuda_swiglu_f16(cu->g, cu->u_, S * F, cu->xs16, st, err));
    else
        OP("ffn_moe_act", kcuda_experts_act(cu->g, cu->u_, F, cu->ids, perm, e->gate_b.p, e->up_b.p, S, F, NE, e->act,
                                            cu->xs16, st, err));
    if ((rc = experts_gemm(cu, "ffn_moe_down", M(&e->down_exps), NE, E, S, cu->dg, err)) < 0)
        return rc;
    OP("ffn_moe_combine", kcuda_moe_combine(cu->dg, E, inv, cu->wts, n, (int)K, E, x, E, 1, st, err));
    if (e->down_b.p)
        OP("ffn_moe_down_bias", kcuda_experts_bias_down(x, E, cu->ids, NULL, cu->wts, e->down_b.p, n, (int)K, E, NE, st,
                                                        err));
    return 0;
}

static int moe_prompt(cuda_t *cu, const wk_moe_t *e, const float *xn, int64_t n, float *x, bl_err_t *err)
{
    const int64_t E = cu->c->n_embd, K = e->n_used, NE = e->n_expert;
    const kcuda_route_t route = route_of(e);
    OP("ffn_gate_inp", pp_mm(cu, M(&e->gate_inp), xn, E, E, n, cu->rl, NE, 0, err));
    OP("ffn_route", kcuda_moe_route(cu->rl, n, NE, (int)K, &route, cu->ids, cu->wts, cu->stream, err));
    return experts_prompt(cu, e, xn, n, x, err);
}

/* A host call of a layer with card slots: its choices are counted, those a slot
 * serves are left to the card's launches, and only the rows with a choice left go
 * to the remote hook, with those choices; their sums are put back in row order, the
 * other rows' are zero. */
static int host_split(cuda_t *cu, const hcall_t *h, bl_err_t *err)
{
    const int64_t K = cu->c->n_expert_used, NE = cu->c->n_expert, E = cu->c->n_embd, li = h->layer - cu->lb;
    const int32_t *tab = cu->h_table + li * NE;
    bl_heat_add(cu->heat, h->layer, cu->h_ids, h->n * K);
    int64_t nr = 0, np = 0, hit = 0;
    for (int64_t r = 0; r < h->n; r++) {
        int32_t c = 0;
        for (int64_t j = 0; j < K; j++) {
            const int32_t id = cu->h_ids[r * K + j];
            if (id >= 0 && id < NE && tab[id] >= 0) {
                hit++;
                continue;
            }
            cu->cids[np + c] = id;
            cu->cwts[np + c] = cu->h_wts[r * K + j];
            c++;
        }
        if (c == 0)
            continue;
        memcpy(cu->cx + nr * E, cu->h_x + r * E, sizeof(float) * (size_t)E);
        cu->ccnt[nr] = c;
        cu->crow[nr++] = (int32_t)r;
        np += c;
    }
    atomic_fetch_add_explicit(&cu->sel[li], (uint64_t)(h->n * K), memory_order_relaxed);
    atomic_fetch_add_explicit(&cu->hits[li], (uint64_t)hit, memory_order_relaxed);
    memset(cu->h_sums, 0, sizeof(float) * (size_t)(h->n * E));
    if (nr == 0)
        return 0;
    const int rc = h->remote->fn(h->remote->ctx, h->layer, cu->cx, nr, cu->ccnt, cu->cids, cu->cwts, cu->csums, err);
    if (rc < 0)
        return rc;
    for (int64_t i = 0; i < nr; i++)
        memcpy(cu->h_sums + (int64_t)cu->crow[i] * E, cu->csums + i * E, sizeof(float) * (size_t)E);
    return 0;
}

/* The host node: the remote hook computes the layer's experts of the rows the step
 * copied to pinned memory. A failure is kept for end (a host node cannot fail its
 * stream), and the later host calls of the step are skipped. */
static void host_experts(void *ctx)
{
    const hcall_t *h = ctx;
    cuda_t *cu = h->cu;
    if (atomic_load(&cu->host_rc) < 0)
        return;
    bl_err_t e = {0};
    const int64_t li = h->layer - cu->lb;
    int rc;
    if (cu->rs && cu->rs[li].n > 0) {
        rc = host_split(cu, h, &e);
    } else {
        if (cu->heat)
            bl_heat_add(cu->heat, h->layer, cu->h_ids, h->n * cu->c->n_expert_used);
        rc = h->remote->fn(h->remote->ctx, h->layer, cu->h_x, h->n, NULL, cu->h_ids, cu->h_wts, cu->h_sums, &e);
    }
    if (rc < 0) {
        cu->host_err = e;
        atomic_store(&cu->host_rc, rc);
    }
}

/* A host layer's experts for a prompt step of many rows: its three tensors copied to
 * the card (straight from registered memory, else through the pinned halves, the
 * host filling one while the other's copy runs), then the prompt's grouped GEMMs as
 * for a card layer. Cheaper than sending the rows to the host above a few dozen
 * rows: the host would read every expert the rows use once per step anyway, and the
 * card reads the copy at its own speed. */
static int moe_offload(cuda_t *cu, int64_t l, const wk_moe_t *e, const float *xn, int64_t n, float *x,
                       bl_err_t *err)
{
    const struct hostx *hx = &cu->hx[l - cu->lb];
    cw_t w[3];
    size_t off = 0;
    int k = 0, rc;
    for (int i = 0; i < 3; i++) {
        const kcpu_mat_t *h = &hx->h[i];
        const size_t nbytes = h->row_bytes * (size_t)h->nrows;
        off = (off + 255) & ~(size_t)255;
        uint8_t *dst = cu->d_off + off;
        if (hx->reg[i]) {
            OP("ffn_offload_copy", kcuda_upload(dst, h->data, nbytes, cu->stream, err));
        } else {
            for (size_t at = 0; at < nbytes;) {
                const size_t c = nbytes - at < STAGE_BYTES ? nbytes - at : STAGE_BYTES;
                if (cu->oused[k] && (rc = kcuda_event_sync(cu->oev[k], err)) < 0)
                    return rc;
                memcpy(cu->ostage[k], (const uint8_t *)h->data + at, c);
                OP("ffn_offload_copy", kcuda_upload(dst + at, cu->ostage[k], c, cu->stream, err));
                if ((rc = kcuda_event_record(cu->oev[k], cu->stream, err)) < 0)
                    return rc;
                cu->oused[k] = 1;
                k ^= 1;
                at += c;
            }
        }
        memset(&w[i], 0, sizeof w[i]);
        if ((rc = kcuda_mat_init(&w[i].m, dst, h->type, h->ncols, h->nrows, err)) < 0)
            return rc;
        off += nbytes;
    }
    wk_moe_t de = *e;
    de.gate_exps.d = &w[0];
    de.up_exps.d = &w[1];
    de.down_exps.d = &w[2];
    const int64_t E = cu->c->n_embd;
    OP("ffn_to_f16", kcuda_to_f16(xn, E, n, E, cu->x16, E, cu->stream, err));
    /* a staging half is refilled only after its copy ran (its event, waited on by
     * whichever layer or step uses it next) */
    if ((rc = moe_prompt(cu, &de, xn, n, x, err)) < 0 || !cu->heat)
        return rc;
    /* the prompt's choices count towards the heat, so the experts it uses most are
     * seated first and stay for the answer */
    const int64_t K = e->n_used, li = l - cu->lb;
    if (!cu->h_pids)
        return 0;
    OP("ffn_host_out", kcuda_download(cu->h_pids + li * cu->o->n_batch * K, cu->ids,
                                      sizeof(int32_t) * (size_t)(n * K), cu->stream, err));
    cu->pcount[li] = n;
    return 0;
}

/* A layer whose routed experts are in host RAM: the router and top-k on the card,
 * the rows with their ids and weights to pinned memory, the host node, the sums back
 * onto the residual; the same launches in a decode graph, where the host node waits
 * for the hosttier inside the replay. */
static int moe_remote(cuda_t *cu, int64_t l, const wk_moe_t *e, const wk_remote_t *remote, const float *xn,
                      int64_t n, float *x, bl_err_t *err)
{
    const int64_t E = cu->c->n_embd, K = e->n_used, NE = e->n_expert;
    void *st = cu->stream;
    if (!cu->remote)
        return bl_err_set(err, BL_EINVAL, "%s: layer %lld sends its experts away, but the backend was made "
                          "without a host path", cu->path, (long long)l);
    if (cu->mode == MODE_PROMPT && cu->hx && cu->hx[l - cu->lb].h[0].data && n >= cu->offload_rows && cu->d_off)
        return moe_offload(cu, l, e, xn, n, x, err);
    if (cu->mode == MODE_PROMPT) {
        OP("ffn_to_f16", kcuda_to_f16(xn, E, n, E, cu->x16, E, st, err));
        OP("ffn_gate_inp", pp_mm(cu, M(&e->gate_inp), xn, E, E, n, cu->rl, NE, 0, err));
    } else {
        OP("ffn_gate_inp", mv(cu, M(&e->gate_inp), NULL, xn, E, n, cu->rl, NE, 0, err));
    }
    const kcuda_route_t route = route_of(e);
    OP("ffn_route", kcuda_moe_route(cu->rl, n, NE, (int)K, &route, cu->ids, cu->wts, st, err));
    const struct rslots *rs = cu->rs ? &cu->rs[l - cu->lb] : NULL;
    if (rs && rs->n > 0) {
        /* the choices a card slot holds, through the slots' pools (the others are
         * -1 here and add nothing); the host call leaves them out */
        const int64_t F = e->n_ff, step = 65535 / K;
        OP("ffn_moe_slots", kcuda_moe_remap(cu->ids, n * K, cu->d_table + (l - cu->lb) * NE, NE, cu->d_sid, st, err));
        for (int64_t r = 0; r < n; r += step) {
            const int cn = (int)(n - r < step ? n - r : step);
            const int32_t *sid = cu->d_sid + r * K;
            float *g = cu->g + r * K * F, *u = cu->u_ + r * K * F;
            const int plain = plain_swiglu(e);
            if (plain && same_shape(&rs->m[0], &rs->m[1])) {
                OP("ffn_moe_gate_up", kcuda_matvec_experts_swiglu(&rs->m[0], &rs->m[1], rs->n, sid, cn, (int)K,
                                                                  xn + r * E, E, g, F, st, err));
            } else {
                OP("ffn_moe_gate", kcuda_matvec_experts(&rs->m[0], rs->n, sid, cn, (int)K, xn + r * E, E, g, F, st,
                                                        err));
                OP("ffn_moe_up", kcuda_matvec_experts(&rs->m[1], rs->n, sid, cn, (int)K, xn + r * E, E, u, F, st,
                                                      err));
                if (plain)
                    OP("ffn_moe_swiglu", kcuda_swiglu(g, g, u, cn * K * F, st, err));
                else /* the biases by expert id; a choice no slot holds is the host's */
                    OP("ffn_moe_act", kcuda_experts_act(g, u, F, cu->ids + r * K, NULL, e->gate_b.p, e->up_b.p,
                                                        cn * K, F, NE, e->act, NULL, st, err));
            }
            OP("ffn_moe_down", kcuda_matvec_experts_down_grouped(&rs->m[2], rs->n, sid, cu->wts + r * K, cn, (int)K,
                                                                 g, F, NULL, cu->dscr, E, x + r * E, E, 1, st, err));
            if (e->down_b.p) /* only the choices a slot served: the host adds its own */
                OP("ffn_moe_down_bias", kcuda_experts_bias_down(x + r * E, E, cu->ids + r * K, sid, cu->wts + r * K,
                                                                e->down_b.p, cn, (int)K, E, NE, st, err));
        }
    }
    OP("ffn_host_out", kcuda_download(cu->h_x, xn, sizeof(float) * (size_t)(n * E), st, err));
    OP("ffn_host_out", kcuda_download(cu->h_ids, cu->ids, sizeof(int32_t) * (size_t)(n * K), st, err));
    OP("ffn_host_out", kcuda_download(cu->h_wts, cu->wts, sizeof(float) * (size_t)(n * K), st, err));
    const int64_t row = cu->capture && !cu->profiled ? n + 1 : 0; /* a graph's own, or the direct steps' */
    hcall_t *h = &cu->hc[row * (cu->le - cu->lb) + (l - cu->lb)];
    *h = (hcall_t){.cu = cu, .remote = remote, .layer = l, .n = n};
    OP("ffn_host", kcuda_host_call(st, host_experts, h, err));
    OP("ffn_host_in", kcuda_upload(cu->d_sums, cu->h_sums, sizeof(float) * (size_t)(n * E), st, err));
    OP("ffn_host_add", kcuda_add(x, cu->d_sums, n * E, st, err));
    return 0;
}

static int cu_moe(wk_backend_t *b, int64_t l, const wk_moe_t *e, const wk_remote_t *remote, const float *xn,
                  int64_t n, float *x, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    if (remote)
        return moe_remote(cu, l, e, remote, xn, n, x, err);
    if (cu->mode != MODE_PROMPT)
        return moe_rows(cu, e, xn, n, x, err);
    const int64_t E = cu->c->n_embd;
    OP("ffn_to_f16", kcuda_to_f16(xn, E, n, E, cu->x16, E, cu->stream, err));
    return moe_prompt(cu, e, xn, n, x, err);
}

/* The dense SwiGLU FFN of n rows of xn, added onto x. */
static int cu_ffn(wk_backend_t *b, const wk_tensor_t *gate, const wk_tensor_t *up, const wk_tensor_t *down,
                  const float *gate_inp, const float *xn, int64_t n, float *x, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    const int64_t E = cu->c->n_embd, F = M(gate)->nrows;
    /* behind a gate, the output goes to xg (the head's rows, free until the head)
     * and onto x times the row's sigmoid(gate_inp . xn) */
    float *y = gate_inp ? cu->xg : x;
    const int acc = !gate_inp;
    if (cu->mode == MODE_PROMPT) {
        OP("ffn_to_f16", kcuda_to_f16(xn, E, n, E, cu->x16, E, cu->stream, err));
        OP("ffn_gate", pp_mm(cu, M(gate), xn, E, E, n, cu->g, F, 0, err));
        OP("ffn_up", pp_mm(cu, M(up), xn, E, E, n, cu->u_, F, 0, err));
        OP("ffn_swiglu", kcuda_swiglu_f16(cu->g, cu->u_, n * F, cu->x16, cu->stream, err));
        /* f32 down weights read the f32 SwiGLU output: make it in place in g. */
        if (M(down)->type == BL_TYPE_F32)
            OP("ffn_swiglu", kcuda_swiglu(cu->g, cu->g, cu->u_, n * F, cu->stream, err));
        OP("ffn_down", pp_mm(cu, M(down), cu->g, F, F, n, y, E, acc, err));
    } else if (same_shape(M(gate), M(up))) {
        for (int64_t r = 0; r < n; r += KCUDA_MV_MAX_ROWS) {
            const int cn = (int)(n - r < KCUDA_MV_MAX_ROWS ? n - r : KCUDA_MV_MAX_ROWS);
            OP("ffn_gate_up", kcuda_matvec_swiglu(M(gate), M(up), xn + r * E, E, cn, cu->g + r * F, F, cu->stream,
                                                  err));
        }
        OP("ffn_down", mv(cu, M(down), NULL, cu->g, F, n, y, E, acc, err));
    } else {
        OP("ffn_gate", mv(cu, M(gate), NULL, xn, E, n, cu->g, F, 0, err));
        OP("ffn_up", mv(cu, M(up), NULL, xn, E, n, cu->u_, F, 0, err));
        OP("ffn_swiglu", kcuda_swiglu(cu->g, cu->g, cu->u_, n * F, cu->stream, err));
        OP("ffn_down", mv(cu, M(down), NULL, cu->g, F, n, y, E, acc, err));
    }
    if (gate_inp)
        OP("ffn_gate_shexp", kcuda_add_gated(x, cu->xg, gate_inp, xn, n, E, cu->stream, err));
    return 0;
}

static int cu_split_heads(wk_backend_t *b, const float *x, int64_t n, int64_t n_head, int64_t hd, float *a, float *g,
                          bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    OP("attn_gate_split", kcuda_split_heads(x, n, n_head, hd, a, g, cu->stream, err));
    return 0;
}

static int cu_mul_sigmoid(wk_backend_t *b, float *y, const float *g, int64_t n, int64_t d, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    OP("attn_gate", kcuda_mul_sigmoid(y, g, n * d, cu->stream, err));
    return 0;
}

/* The gates, then the layer over every sequence of the step at once through the
 * table begin uploaded (its states where rec_alloc put them). */
static int cu_deltanet(wk_backend_t *b, int64_t l, const kcpu_dnet_t *d, float *qkv, const float *z, const float *bb,
                       const float *al, float *out, bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    const wk_step_t *st = cu->st;
    const wk_model_t *m = st->seg[0].kv->model;
    const kcuda_dnet_t kd = {.d_conv_w = d->conv_w, .d_dt_bias = d->dt_bias, .d_a = d->a, .d_norm = d->norm,
                             .K = (int)d->K, .S = (int)d->S, .Hk = (int)d->Hk, .Hv = (int)d->Hv, .tiled = d->tiled,
                             .ba = d->ba, .eps = d->eps};
    OP("ssm_gates", kcuda_dnet_gates(&kd, bb, d->ba ? 2 * d->Hv : d->Hv, al, d->Hv, st->n, cu->dn_beta, cu->dn_g,
                                     cu->stream, err));
    OP("deltanet", kcuda_deltanet(&kd, cu->d_dseg, st->nseg, m->rec_index[l] * (int64_t)m->rec_floats, qkv, z,
                                  cu->dn_beta, cu->dn_g, out, st->n, cu->stream, err));
    return 0;
}

/* The rows whose logits are wanted, normed into xg in order (every row of a decode
 * step), then the head: the matvec for few rows (a prompt's last), else a GEMM. */
static int cu_head(wk_backend_t *b, const float *norm, float eps, const wk_tensor_t *out, const float *x,
                   bl_err_t *err)
{
    cuda_t *cu = (cuda_t *)b;
    const wk_step_t *st = cu->st;
    const int64_t E = cu->c->n_embd, V = cu->c->n_vocab;
    int64_t n_out = 0;
    if (cu->mode == MODE_DECODE) {
        OP("output_norm", kcuda_rms_norm(cu->xg, x, norm, st->n, E, E, eps, cu->stream, err));
        n_out = st->n;
    } else {
        for (int64_t j = 0; j < st->nseg; j++) {
            const wk_seg_t *s = &st->seg[j];
            if (s->n_out == 0)
                continue;
            const int64_t r0 = s->row0 + s->n - s->n_out;
            OP("output_norm", kcuda_rms_norm(cu->xg + n_out * E, x + r0 * E, norm, s->n_out, E, E, eps, cu->stream,
                                             err));
            n_out += s->n_out;
        }
    }
    if (cu->mode == MODE_PROMPT && n_out > KCUDA_MV_MAX_ROWS) {
        OP("output", kcuda_to_f16(cu->xg, E, n_out, E, cu->x16, E, cu->stream, err));
        OP("output", pp_mm(cu, M(out), cu->xg, E, E, n_out, cu->logits, V, 0, err));
    } else if (n_out > 0) {
        OP("output", mv(cu, M(out), NULL, cu->xg, E, n_out, cu->logits, V, 0, err));
    }
    return 0;
}

static const wk_backend_ops_t cuda_ops = {
    .name = cu_name, .destroy = cu_destroy, .alloc = cu_alloc, .add = cu_add, .add_vec = cu_add_vec,
    .add_stack = cu_add_stack, .add_host = cu_add_host, .commit = cu_commit, .kv_alloc = cu_kv_alloc,
    .kv_free = cu_kv_free, .kv_copy = cu_kv_copy, .kv_move = cu_kv_move, .state_alloc = cu_state_alloc, .state_free = cu_state_free,
    .rec_alloc = cu_rec_alloc, .rec_free = cu_rec_free, .rec_copy = cu_rec_copy,
    .begin = cu_begin, .end = cu_end, .embed = cu_embed, .rms_norm = cu_rms_norm, .qkv = cu_qkv,
    .matmul = cu_matmul, .attention = cu_attention, .mla = cu_mla, .moe = cu_moe, .experts = cu_experts, .ffn = cu_ffn,
    .head = cu_head,
    .split_heads = cu_split_heads, .mul_sigmoid = cu_mul_sigmoid, .deltanet = cu_deltanet,
    .resid = cu_resid, .resid_layer = cu_resid_layer,
    .card_export = cu_card_export, .card_import = cu_card_import, .card_close = cu_card_close,
    .card_put = cu_card_put, .card_get = cu_card_get, .card_settle = cu_card_settle, .pin_host = cu_pin_host,
};

int wk__cuda_backend(wk_backend_t **out, const wk_backend_cfg_t *cfg, bl_err_t *err)
{
    *out = NULL;
    cuda_t *cu = calloc(1, sizeof *cu);
    if (!cu)
        return bl_err_set(err, BL_ENOMEM, "out of memory for the CUDA backend");
    cu->b.op = &cuda_ops;
    cu->path = cfg->path;
    cu->c = cfg->c;
    cu->o = cfg->o;
    cu->lb = cfg->lb;
    cu->le = cfg->le;
    cu->device = cfg->o->device;
    snprintf(cu->label, sizeof cu->label, "CUDA%d", cu->device); /* until the card is asked */
    cu->remote = cfg->remote;
    /* the host layers' routing is counted for residency only, so that without it
     * the steps are what they were */
    cu->resid_wanted = cfg->remote && cfg->heat && cfg->o->residency && cfg->o->experts_vram != 0;
    cu->heat = cu->resid_wanted ? cfg->heat : NULL;
    cu->resid = cu->resid_wanted ? 0 : -1;
    const char *or_env = getenv("BLOOMERY_OP_OFFLOAD_ROWS");
    cu->offload_rows = cfg->o->no_op_offload ? 0 : or_env && *or_env ? atoll(or_env) : WK_OP_OFFLOAD_ROWS;
    if (cu->offload_rows < 0)
        cu->offload_rows = 0;
    int rc = check_shapes(cu, err);
    if (rc == 0 && !(cu->kvl = malloc(sizeof(int64_t) * (size_t)(cu->le - cu->lb + 1))))
        rc = bl_err_set(err, BL_ENOMEM, "out of memory for %lld layers", (long long)(cu->le - cu->lb));
    for (int64_t l = cu->lb, n = 0; rc == 0 && l < cu->le; l++)
        cu->kvl[l - cu->lb] = wk__layer_recurrent(cfg->c, l) ? -1 : n++;
    if (rc < 0 || (rc = kcuda_init(cu->device, &cu->info, err)) < 0 ||
        (rc = kcuda_stream_create(&cu->stream, err)) < 0) {
        cu_destroy(&cu->b);
        return rc;
    }
    snprintf(cu->label, sizeof cu->label, "%.63s (sm_%d%d)", cu->info.name, cu->info.cc_major, cu->info.cc_minor);
    const wk_config_t *c = cu->c;
    /* BLOOMERY_CUDA_PROMPT=rows keeps prompts on the rows path (the reference the
     * GEMM path is checked against; docs/cuda.md). The attention and launch knobs:
     * wk_cuda_knobs_from_env (wk.h). */
    wk_cuda_knobs_from_env();
    /* Flash prefill for head_dim 64 and 128 unless -fa off (WK_FLASH_OFF) asks for
     * the split attention in 64-row pieces (the reference it is compared with); so
     * does BLOOMERY_CUDA_FLASH=0 under -fa auto. -fa on with another head size runs
     * the split kernel and says so. */
    const char *fl_env = getenv("BLOOMERY_CUDA_FLASH");
    const int flash_shape = c->head_dim == 64 || c->head_dim == 128;
    cu->flash = flash_shape && cu->o->flash_attn != WK_FLASH_OFF &&
                !(cu->o->flash_attn == WK_FLASH_AUTO && fl_env && strcmp(fl_env, "0") == 0);
    if (cu->o->flash_attn == WK_FLASH_ON && !flash_shape)
        BL_LOG(BL_LOG_WARN, "event=flash_attn_unavailable head_dim=%lld reason=\"the flash "
               "kernel takes head sizes 64 and 128; prompts use the split attention\"",
               (long long)c->head_dim);
    const char *pp_env = getenv("BLOOMERY_CUDA_PROMPT");
    cu->pp_ok = prompt_shapes_ok(c) && !(pp_env && strcmp(pp_env, "rows") == 0);
    *out = &cu->b;
    return 0;
}

int wk_devices(bl_device_t *out, int cap, int *n, bl_err_t *err)
{
    *n = 0;
    int count = 0;
    bl_err_t e = {0};
    if (kcuda_device_count(&count, &e) != 0)
        return 0; /* no driver, no GPU: the CPU */
    for (int i = 0; i < count && *n < cap; i++) {
        kcuda_device_info_t info;
        const int rc = kcuda_init(i, &info, err);
        if (rc != 0)
            return rc;
        bl_device_t *d = &out[(*n)++];
        memset(d, 0, sizeof *d);
        d->index = i;
        snprintf(d->name, sizeof d->name, "%.63s", info.name);
        d->total_bytes = info.total_bytes;
        d->free_bytes = info.free_bytes;
    }
    return 0;
}

#else /* no CUDA in this build */

int wk_devices(bl_device_t *out, int cap, int *n, bl_err_t *err)
{
    (void)out, (void)cap, (void)err;
    *n = 0;
    return 0;
}

int wk__cuda_backend(wk_backend_t **out, const wk_backend_cfg_t *cfg, bl_err_t *err)
{
    (void)cfg;
    *out = NULL;
    return bl_err_set(err, BL_ENOTSUP, "device: this build has no CUDA");
}

int wk__cuda_profile(wk_backend_t *b, wk_prof_op_t *out, int cap, int reset)
{
    (void)b, (void)out, (void)cap, (void)reset;
    return 0;
}

int wk__cuda_bandwidth(wk_backend_t *b, size_t nbytes, double *bytes_per_s, bl_err_t *err)
{
    (void)b, (void)nbytes;
    *bytes_per_s = 0;
    return bl_err_set(err, BL_ENOTSUP, "device: this build has no CUDA");
}

int wk_cuda_copy_rate(int device, size_t nbytes, double *bytes_per_s, bl_err_t *err)
{
    (void)device, (void)nbytes;
    *bytes_per_s = 0;
    return bl_err_set(err, BL_ENOTSUP, "device: this build has no CUDA");
}

void wk_cuda_knobs_from_env(void) {}

#endif
