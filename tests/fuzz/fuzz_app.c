/* The in-memory model of the router-level fuzz targets (see fuzz_app.h): the
 * tokenizer, Qwen3's template, and the fake cluster with its scripted replies. */
#include "fuzz_app.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file.h"

#ifndef BL_SOURCE_ROOT
#error "BL_SOURCE_ROOT must name the source tree (tests/fuzz/meson.build sets it)"
#endif

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "fuzz_app: %s: %s\n", what, msg);
    abort();
}

// --- the vocabulary -------------------------------------------------------------------------

/* Ids past the 256 bytes. The reply tokens are whole words the fake model writes
 * (a tokenizer without merges never makes them from text). */
enum {
    T_ENDOFTEXT = 256, T_IM_START, T_IM_END, T_THINK, T_THINK_END, T_CALL, T_CALL_END,
    T_FIM_PRE, T_FIM_MID, T_FIM_SUF, T_FIM_PAD, T_REPO, T_FILE_SEP,
    T_HM, T_HI, T_SURE, T_CALL_JSON, T_OBJ_JSON, N_VOCAB
};

static const struct {
    int id;
    const char *text; /* as the bytes it stands for */
    int type;
} specials[] = {
    {T_ENDOFTEXT, "<|endoftext|>", RT_TOKEN_CONTROL},
    {T_IM_START, "<|im_start|>", RT_TOKEN_CONTROL},
    {T_IM_END, "<|im_end|>", RT_TOKEN_CONTROL},
    {T_THINK, "<think>", RT_TOKEN_USER_DEFINED},
    {T_THINK_END, "</think>", RT_TOKEN_USER_DEFINED},
    {T_CALL, "<tool_call>", RT_TOKEN_USER_DEFINED},
    {T_CALL_END, "</tool_call>", RT_TOKEN_USER_DEFINED},
    {T_FIM_PRE, "<|fim_prefix|>", RT_TOKEN_CONTROL},
    {T_FIM_MID, "<|fim_middle|>", RT_TOKEN_CONTROL},
    {T_FIM_SUF, "<|fim_suffix|>", RT_TOKEN_CONTROL},
    {T_FIM_PAD, "<|fim_pad|>", RT_TOKEN_CONTROL},
    {T_REPO, "<|repo_name|>", RT_TOKEN_CONTROL},
    {T_FILE_SEP, "<|file_sep|>", RT_TOKEN_CONTROL},
    {T_HM, "hm", RT_TOKEN_NORMAL},
    {T_HI, " Hi", RT_TOKEN_NORMAL},
    {T_SURE, "Sure.\n", RT_TOKEN_NORMAL},
    {T_CALL_JSON, "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n",
     RT_TOKEN_NORMAL},
    {T_OBJ_JSON, "{\"a\": 1}", RT_TOKEN_NORMAL},
};

/* The GPT-2 byte-level character of byte b, as UTF-8 (2 bytes at most). */
static size_t byte_char(int b, char out[2])
{
    static int cps[256];
    if (!cps[0x21]) {
        int next = 256;
        for (int i = 0; i < 256; i++) {
            int keep = (i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE;
            cps[i] = keep ? i : next++;
        }
    }
    int cp = cps[b];
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

static rt_tokenizer_t *g_tok;

static void make_tokenizer(void)
{
    static char text[N_VOCAB][160];
    static rt_str_t toks[N_VOCAB];
    static int32_t types[N_VOCAB];
    for (int b = 0; b < 256; b++) {
        toks[b] = (rt_str_t){text[b], byte_char(b, text[b])};
        types[b] = RT_TOKEN_NORMAL;
    }
    for (size_t i = 0; i < sizeof specials / sizeof *specials; i++) {
        int id = specials[i].id;
        const char *s = specials[i].text;
        size_t n = 0;
        if (specials[i].type == RT_TOKEN_NORMAL) {
            /* normal tokens are stored in byte-level form, as in a real vocabulary */
            for (; *s; s++)
                n += byte_char((unsigned char)*s, text[id] + n);
        } else {
            n = strlen(s);
            memcpy(text[id], s, n);
        }
        toks[id] = (rt_str_t){text[id], n};
        types[id] = specials[i].type;
    }
    rt_tokenizer_desc_t d;
    rt_tokenizer_desc_init(&d);
    d.model = "gpt2";
    d.pre = "qwen2";
    d.n_vocab = N_VOCAB;
    d.tokens = toks;
    d.types = types;
    d.eos_id = T_IM_END;
    d.pad_id = T_ENDOFTEXT;
    d.add_bos = 0;
    bl_err_t err = {0};
    if (rt_tokenizer_create(&g_tok, &d, &err))
        die("tokenizer", err.msg);
}

static rt_template_t *g_tpl;
static char *g_tpl_text;

static void make_template(void)
{
    const char *path = BL_SOURCE_ROOT "/tests/fuzz/qwen3.jinja";
    size_t len;
    bl_err_t err = {0};
    if (bl_read_file(path, 1u << 20, &g_tpl_text, &len, &err) ||
        rt_template_compile(g_tpl_text, len, &g_tpl, &err))
        die(path, err.msg);
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void make_all(void)
{
    make_tokenizer();
    make_template();
}

rt_tokenizer_t *fz_tokenizer(void)
{
    pthread_once(&g_once, make_all);
    return g_tok;
}

rt_template_t *fz_template(void)
{
    pthread_once(&g_once, make_all);
    return g_tpl;
}

const char *fz_template_source(void)
{
    pthread_once(&g_once, make_all);
    return g_tpl_text;
}

// --- the fake cluster -----------------------------------------------------------------------

/* The scripted replies, each a chain of tokens no other reply uses, so that the
 * last token says where a reply stands: after a token outside every chain (the
 * prompt's last), the reply is chosen by that token's value. Past a chain's end, the
 * end-of-turn token. */
static const int32_t replies[][8] = {
    {T_THINK, T_HM, T_THINK_END, T_HI, T_IM_END, -1},
    {T_SURE, T_CALL, T_CALL_JSON, T_CALL_END, T_IM_END, -1},
    {T_OBJ_JSON, T_IM_END, -1},
};
#define N_REPLIES (sizeof replies / sizeof *replies)

static int32_t next_token(int32_t last)
{
    for (size_t r = 0; r < N_REPLIES; r++)
        for (int i = 0; replies[r][i] >= 0; i++)
            if (replies[r][i] == last)
                return replies[r][i + 1] >= 0 ? replies[r][i + 1] : T_IM_END;
    return replies[(uint32_t)last % N_REPLIES][0];
}

struct rt_cluster {
    int unused;
};

static struct {
    pthread_mutex_t mu;
    int64_t held[FZ_N_SLOTS]; /* positions each slot's cache holds */
    int32_t last[FZ_N_SLOTS]; /* the token at held - 1 */
    uint64_t steps, rows;
    float logits[FZ_N_BATCH * N_VOCAB];
    int64_t kv_id[256], kv_n[256]; /* saved states: entry names and positions */
    int n_kv;
} fk = {.mu = PTHREAD_MUTEX_INITIALIZER};

static struct rt_cluster g_cluster;

rt_cluster_t *fz_cluster(void)
{
    return &g_cluster;
}

static void bad_step(const char *what, const rt_step_seq_t *q)
{
    fprintf(stderr, "fuzz_app: the engine sent a step the cluster forbids: %s", what);
    if (q)
        fprintf(stderr, " (slot %d, pos %lld, n %d, n_out %d)", q->slot, (long long)q->pos, q->n,
                q->n_out);
    fprintf(stderr, "\n");
    abort();
}

rt_cluster_state_t rt_cluster_state(const rt_cluster_t *c)
{
    (void)c;
    return RT_CLUSTER_READY;
}

rt_cluster_state_t rt_cluster_wait(rt_cluster_t *c, int timeout_ms)
{
    (void)c;
    (void)timeout_ms;
    return RT_CLUSTER_READY;
}

/* The engine sleeps only with --sleep-idle-seconds, which the targets leave off. */
void rt_cluster_sleep(rt_cluster_t *c) { (void)c; }
void rt_cluster_wake(rt_cluster_t *c) { (void)c; }

const char *rt_cluster_error(rt_cluster_t *c, char *buf, size_t cap)
{
    (void)c;
    if (cap)
        buf[0] = '\0';
    return buf;
}

/* The fake never restarts: never down. */
int rt_cluster_down(rt_cluster_t *c, char *why, size_t cap)
{
    (void)c, (void)why, (void)cap;
    return 0;
}

int64_t rt_cluster_n_vocab(const rt_cluster_t *c)
{
    (void)c;
    return N_VOCAB;
}

int64_t rt_cluster_n_embd(const rt_cluster_t *c)
{
    (void)c;
    return 64;
}

void rt_cluster_get_stats(const rt_cluster_t *c, rt_cluster_stats_t *out)
{
    (void)c;
    pthread_mutex_lock(&fk.mu);
    memset(out, 0, sizeof *out);
    out->starts = 1;
    out->steps = fk.steps;
    out->rows = fk.rows;
    pthread_mutex_unlock(&fk.mu);
}

int rt_cluster_child_stats(rt_cluster_t *c, rt_child_stats_t *out, int cap)
{
    (void)c;
    (void)out;
    (void)cap;
    return 0;
}

/* A smooth background under the next token's logit, so that sampling at a
 * temperature sometimes leaves the script. */
static void fill_row(float *row, int32_t last)
{
    for (int i = 0; i < N_VOCAB; i++)
        row[i] = -0.25f * (float)((i * 7 + last) % 17);
    row[next_token(last)] = 9.0f;
}

/* The stages' saved states, as far as the engine can tell: a save takes no more
 * than the slot holds, a load names a state that exists and no more of it; each
 * position "takes" 64 bytes. A wrong op aborts (the engine broke the rules). */
int rt_cluster_kv(rt_cluster_t *c, rt_kv_op_t *ops, int n_ops, bl_err_t *err)
{
    (void)c;
    (void)err;
    pthread_mutex_lock(&fk.mu);
    for (int i = 0; i < n_ops; i++) {
        rt_kv_op_t *o = &ops[i];
        int k = -1;
        for (int j = 0; j < fk.n_kv; j++)
            if (fk.kv_id[j] == o->entry)
                k = j;
        if (o->op == RT_KV_DROP) {
            if (k >= 0) {
                fk.n_kv--;
                fk.kv_id[k] = fk.kv_id[fk.n_kv];
                fk.kv_n[k] = fk.kv_n[fk.n_kv];
            }
            continue;
        }
        if (o->slot < 0 || o->slot >= FZ_N_SLOTS)
            bad_step("a KV op on an unknown slot", NULL);
        if (o->op == RT_KV_CLEAR) {
            fk.held[o->slot] = 0;
            continue;
        }
        if (o->op == RT_KV_WRITE || o->op == RT_KV_READ)
            bad_step("a slot file op without a folder for slot files", NULL);
        if (o->op == RT_KV_SAVE) {
            if (k >= 0 || o->n < 1 || o->n > fk.held[o->slot] || fk.n_kv == 256)
                bad_step("a save of what the slot does not hold", NULL);
            fk.kv_id[fk.n_kv] = o->entry;
            fk.kv_n[fk.n_kv++] = o->n;
            o->bytes = 64 * o->n;
        } else {
            if (k < 0 || o->n < 1 || o->n > fk.kv_n[k])
                bad_step("a load of a state that does not exist", NULL);
            fk.held[o->slot] = o->n;
            o->bytes = 64 * fk.kv_n[k];
        }
    }
    pthread_mutex_unlock(&fk.mu);
    return 0;
}

int rt_cluster_kv_io_path(const rt_cluster_t *c, int64_t entry, char *out, size_t cap,
                          bl_err_t *err)
{
    (void)c, (void)entry, (void)out, (void)cap;
    return bl_err_set(err, BL_EINVAL, "no folder for slot files");
}

int rt_cluster_step(rt_cluster_t *c, const rt_step_seq_t *seqs, int n_seqs, const float **logits,
                    bl_err_t *err)
{
    (void)c;
    (void)err;
    pthread_mutex_lock(&fk.mu);
    int64_t rows = 0;
    int out = 0;
    for (int i = 0; i < n_seqs; i++) {
        const rt_step_seq_t *q = &seqs[i];
        if (q->slot < 0 || q->slot >= FZ_N_SLOTS)
            bad_step("unknown slot", q);
        if (q->n < 1 || q->pos < 0 || q->pos > fk.held[q->slot] || q->pos + q->n > FZ_N_CTX)
            bad_step("positions outside the slot's cache", q);
        if (q->n_out < 0 || q->n_out > 1 || !q->tokens)
            bad_step("bad n_out or no tokens", q);
        for (int k = 0; k < q->n; k++)
            if (q->tokens[k] < 0 || q->tokens[k] >= N_VOCAB)
                bad_step("a token outside the vocabulary", q);
        rows += q->n;
        fk.held[q->slot] = q->pos + q->n;
        fk.last[q->slot] = q->tokens[q->n - 1];
        if (q->n_out)
            fill_row(&fk.logits[(size_t)out++ * N_VOCAB], fk.last[q->slot]);
    }
    if (rows > FZ_N_BATCH)
        bad_step("more rows than n_batch", NULL);
    fk.steps++;
    fk.rows += (uint64_t)rows;
    pthread_mutex_unlock(&fk.mu);
    *logits = fk.logits;
    return 0;
}

/* The engine runs one step at a time here (opts.pipeline 1): steps in flight are a
 * step computed when sent, its answer taken at once. */
static const float *fz_flight;

int rt_cluster_step_send(rt_cluster_t *c, const rt_step_seq_t *seqs, int n_seqs, bl_err_t *err)
{
    if (fz_flight)
        return bl_err_set(err, BL_EINVAL, "a step is in flight already");
    return rt_cluster_step(c, seqs, n_seqs, &fz_flight, err);
}

int rt_cluster_step_recv(rt_cluster_t *c, const float **logits, bl_err_t *err)
{
    (void)c;
    if (!fz_flight)
        return bl_err_set(err, BL_EINVAL, "no step in flight");
    *logits = fz_flight;
    fz_flight = NULL;
    return 0;
}

#include "../fake_view.h"

void rt_cluster_forget_in_flight(rt_cluster_t *c)
{
    (void)c;
    fz_flight = NULL;
}

/* No NextN layer: the fuzzed server runs without draft-mtp. */
const rt_mtp_t *rt_cluster_mtp(const rt_cluster_t *c)
{
    (void)c;
    return NULL;
}

int rt_cluster_in_flight(rt_cluster_t *c)
{
    (void)c;
    return fz_flight != NULL;
}
