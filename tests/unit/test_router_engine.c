/* Tests of router/engine.c against a fake cluster defined here (the rt_cluster_*
 * functions the engine calls): the fake returns logits that put one token far ahead,
 * chosen from a script by position, records every sequence of every step, checks the
 * positions the engine sends against what it holds per slot, and fails a step with
 * BL_ECLOSED on demand. With fk.mtp it proposes tokens as a NextN layer does: from the
 * row where greedy decoding stops, the script's token after the next (a wrong one at
 * every fk.mtp_wrong-th position). Events arrive through a real libuv loop. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "cluster.h"
#include "engine.h"
#include "log.h"
#include "tokenizer.h"

// --- the fake cluster -----------------------------------------------------------------------

#define N_VOCAB 258   /* bytes 0..255, <|im_end|>, <|endoftext|> */
#define TOK_EOG 256
#define FK_SLOTS 4
#define FK_CTX 4096
#define FK_LOG 8192
#define FK_ROWS 64    /* logit rows of a step at most */

typedef struct fk_seq {
    uint64_t step;
    int slot, n, n_out;
    int64_t pos;
    int32_t first;
} fk_seq_t;

static struct fk {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    rt_cluster_state_t state;
    uint64_t starts, steps;
    uint64_t fail_at_step;   /* this step fails with BL_ECLOSED; 0: none */
    int step_delay_us;
    int64_t n_batch;
    int64_t held[FK_SLOTS];  /* positions each slot's cache holds */
    int32_t cache[FK_SLOTS][FK_CTX];
    fk_seq_t log[FK_LOG];
    int n_log;
    const char *script;      /* the token at position base + i is script[i] */
    int64_t base;
    int sleeps, wakes;       /* rt_cluster_sleep / _wake calls that changed the state */
    int bad;                 /* a step broke the cluster's rules */
    char bad_msg[256];
    /* saved cache states (rt_cluster_kv): entry names, their tokens */
    int64_t kv_id[64], kv_n[64];
    int32_t kv_toks[64][256];
    int n_kv, kv_saves, kv_loads, kv_drops;
    int kv_fail_load;        /* the next load fails with BL_ENOENT */
    char slot_dir[256];      /* slot files (rt_cluster_kv WRITE, READ) */
    float logits[FK_ROWS * N_VOCAB];
    int mtp;                 /* rt_cluster_mtp answers */
    int mtp_wrong;           /* a wrong proposal at positions that are multiples of it; 0: none */
    rt_mtp_t mtp_rows[FK_ROWS];
} fk = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

/* Steps in flight (rt_cluster_step_send): the fake computes a step when it is sent
 * and keeps its logits until the answer is taken, as the stages' rings would. */
#define FK_FLIGHT 8
static struct {
    float logits[FK_FLIGHT][FK_ROWS * N_VOCAB];
    int head, n, max_n;
} fkf;

/* The token the script wants at position pos: past the script, the end token. */
static int32_t fk_next(int64_t pos)
{
    int64_t i = pos - fk.base;
    if (!fk.script || i < 0 || i >= (int64_t)strlen(fk.script))
        return TOK_EOG;
    return (unsigned char)fk.script[i];
}

/* A smooth background that depends on the last token, and the script's token 8 ahead. */
static void fk_row(float *row, int32_t last, int64_t pos)
{
    for (int i = 0; i < N_VOCAB; i++)
        row[i] = -0.25f * (float)((i * 7 + last) % 17) + 0.001f * (float)(i % 5);
    row[fk_next(pos + 1)] = 8.0f;
}

static void fk_reset(void)
{
    pthread_mutex_lock(&fk.mu);
    fk.state = RT_CLUSTER_READY;
    fk.starts = 1;
    fk.steps = 0;
    fk.fail_at_step = 0;
    fk.step_delay_us = 0;
    fk.n_batch = 64;
    memset(fk.held, 0, sizeof fk.held);
    fk.n_log = 0;
    fk.script = NULL;
    fk.base = 0;
    fk.bad = 0;
    fk.bad_msg[0] = '\0';
    fk.sleeps = fk.wakes = 0;
    fkf.n = fkf.head = fkf.max_n = 0;
    fk.n_kv = fk.kv_saves = fk.kv_loads = fk.kv_drops = fk.kv_fail_load = 0;
    fk.mtp = fk.mtp_wrong = 0;
    pthread_mutex_unlock(&fk.mu);
}

const rt_mtp_t *rt_cluster_mtp(const rt_cluster_t *c)
{
    (void)c;
    return fk.mtp ? fk.mtp_rows : NULL;
}

static void fk_set_state(rt_cluster_state_t st)
{
    pthread_mutex_lock(&fk.mu);
    fk.state = st;
    pthread_cond_broadcast(&fk.cv);
    pthread_mutex_unlock(&fk.mu);
}

rt_cluster_state_t rt_cluster_state(const rt_cluster_t *c)
{
    (void)c;
    pthread_mutex_lock(&fk.mu);
    rt_cluster_state_t st = fk.state;
    pthread_mutex_unlock(&fk.mu);
    return st;
}

/* A restart takes 20 ms; a first load waits for the test to say READY. */
rt_cluster_state_t rt_cluster_wait(rt_cluster_t *c, int timeout_ms)
{
    (void)c;
    pthread_mutex_lock(&fk.mu);
    if (fk.state == RT_CLUSTER_RESTARTING) {
        pthread_mutex_unlock(&fk.mu);
        usleep(20000);
        pthread_mutex_lock(&fk.mu);
        fk.state = RT_CLUSTER_READY;
        fk.starts++;
    } else if (fk.state == RT_CLUSTER_LOADING) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)timeout_ms * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        while (fk.state == RT_CLUSTER_LOADING)
            if (pthread_cond_timedwait(&fk.cv, &fk.mu, &ts))
                break;
    }
    rt_cluster_state_t st = fk.state;
    pthread_mutex_unlock(&fk.mu);
    return st;
}

/* Sleep stops the processes (their caches go); a wake restarts them (20 ms, in
 * rt_cluster_wait, as a restart). */
void rt_cluster_sleep(rt_cluster_t *c)
{
    (void)c;
    pthread_mutex_lock(&fk.mu);
    if (fk.state == RT_CLUSTER_READY) {
        fk.state = RT_CLUSTER_SLEEPING;
        memset(fk.held, 0, sizeof fk.held);
        fk.sleeps++;
    }
    pthread_mutex_unlock(&fk.mu);
}

void rt_cluster_wake(rt_cluster_t *c)
{
    (void)c;
    pthread_mutex_lock(&fk.mu);
    if (fk.state == RT_CLUSTER_SLEEPING) {
        fk.state = RT_CLUSTER_RESTARTING;
        fk.wakes++;
    }
    pthread_mutex_unlock(&fk.mu);
}

const char *rt_cluster_error(rt_cluster_t *c, char *buf, size_t cap)
{
    (void)c;
    pthread_mutex_lock(&fk.mu);
    snprintf(buf, cap, "%s", fk.state == RT_CLUSTER_READY ? "" : "worker 0 (pid 4242) died");
    pthread_mutex_unlock(&fk.mu);
    return buf;
}

/* The fake's restarts are passing ones (20 ms): never down. */
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

void rt_cluster_get_stats(const rt_cluster_t *c, rt_cluster_stats_t *out)
{
    (void)c;
    pthread_mutex_lock(&fk.mu);
    memset(out, 0, sizeof *out);
    out->starts = fk.starts;
    out->steps = fk.steps;
    pthread_mutex_unlock(&fk.mu);
}

int rt_cluster_step(rt_cluster_t *c, const rt_step_seq_t *seqs, int n_seqs, const float **logits,
                    bl_err_t *err)
{
    (void)c;
    if (fk.step_delay_us)
        usleep((useconds_t)fk.step_delay_us);
    pthread_mutex_lock(&fk.mu);
    if (fk.state != RT_CLUSTER_READY) {
        pthread_mutex_unlock(&fk.mu);
        return bl_err_set(err, BL_EAGAIN, "not ready");
    }
    fk.steps++;
    if (fk.fail_at_step && fk.steps == fk.fail_at_step) {
        fk.state = RT_CLUSTER_RESTARTING;
        memset(fk.held, 0, sizeof fk.held);
        pthread_mutex_unlock(&fk.mu);
        return bl_err_set(err, BL_ECLOSED, "worker 0 (pid 4242) died: killed by signal 9");
    }
    int64_t rows = 0;
    int out = 0;
    for (int i = 0; i < n_seqs; i++) {
        const rt_step_seq_t *q = &seqs[i];
        rows += q->n;
        if (q->slot < 0 || q->slot >= FK_SLOTS || q->n < 1 || q->pos < 0 ||
            q->pos > fk.held[q->slot] || q->pos + q->n > FK_CTX) {
            fk.bad = 1;
            snprintf(fk.bad_msg, sizeof fk.bad_msg, "seq %d: slot %d pos %lld n %d held %lld", i,
                     q->slot, (long long)q->pos, q->n,
                     (long long)(q->slot >= 0 && q->slot < FK_SLOTS ? fk.held[q->slot] : -1));
            pthread_mutex_unlock(&fk.mu);
            return bl_err_set(err, BL_EINVAL, "bad step");
        }
        memcpy(&fk.cache[q->slot][q->pos], q->tokens, (size_t)q->n * sizeof *q->tokens);
        fk.held[q->slot] = q->pos + q->n;
        if (fk.n_log < FK_LOG)
            fk.log[fk.n_log++] = (fk_seq_t){ fk.steps, q->slot, q->n, q->n_out, q->pos,
                                             q->tokens[0] };
        /* each logit row, and where greedy decoding stops in them, a proposal */
        int stopped = 0;
        for (int k = q->n - q->n_out; k < q->n && out < FK_ROWS; k++, out++) {
            const int64_t at = q->pos + k;
            fk_row(&fk.logits[out * N_VOCAB], q->tokens[k], at);
            fk.mtp_rows[out] = (rt_mtp_t){.in = -1, .tok = -1};
            if (stopped || (k + 1 < q->n && q->tokens[k + 1] == fk_next(at + 1)))
                continue;
            stopped = 1;
            const int wrong = fk.mtp_wrong && (at + 2) % fk.mtp_wrong == 0;
            fk.mtp_rows[out] = (rt_mtp_t){.in = fk_next(at + 1), .tok = wrong ? 'X' : fk_next(at + 2), .p = 0.9f};
        }
    }
    if (rows > fk.n_batch) {
        fk.bad = 1;
        snprintf(fk.bad_msg, sizeof fk.bad_msg, "%lld rows in a step of %lld", (long long)rows,
                 (long long)fk.n_batch);
    }
    pthread_mutex_unlock(&fk.mu);
    *logits = fk.logits;
    return 0;
}

/* Steps in flight (rt_cluster_step_send): the fake computes a step when it is sent
 * and keeps its logits until the answer is taken, as the stages' rings would. */

int rt_cluster_step_send(rt_cluster_t *c, const rt_step_seq_t *seqs, int n_seqs, bl_err_t *err)
{
    if (fkf.n == FK_FLIGHT)
        return bl_err_set(err, BL_EINVAL, "too many steps in flight");
    const float *lg = NULL;
    int rc = rt_cluster_step(c, seqs, n_seqs, &lg, err);
    if (rc) {
        fkf.n = fkf.head = 0;
        return rc;
    }
    memcpy(fkf.logits[(fkf.head + fkf.n) % FK_FLIGHT], lg, sizeof fkf.logits[0]);
    fkf.n++;
    if (fkf.n > fkf.max_n)
        fkf.max_n = fkf.n;
    return 0;
}

int rt_cluster_step_recv(rt_cluster_t *c, const float **logits, bl_err_t *err)
{
    (void)c;
    if (fkf.n == 0)
        return bl_err_set(err, BL_EINVAL, "no step in flight");
    *logits = fkf.logits[fkf.head];
    fkf.head = (fkf.head + 1) % FK_FLIGHT;
    fkf.n--;
    return 0;
}

#include "../fake_view.h"

int rt_cluster_in_flight(rt_cluster_t *c)
{
    (void)c;
    return fkf.n;
}

void rt_cluster_forget_in_flight(rt_cluster_t *c)
{
    (void)c;
    fkf.n = fkf.head = 0;
}

static int fk_kv_find(int64_t id)
{
    for (int i = 0; i < fk.n_kv; i++)
        if (fk.kv_id[i] == id)
            return i;
    return -1;
}

/* Saves and loads what a slot's cache holds, as the stages do; each entry says it
 * takes 100 bytes a position. */
int rt_cluster_kv(rt_cluster_t *c, rt_kv_op_t *ops, int n_ops, bl_err_t *err)
{
    (void)c;
    pthread_mutex_lock(&fk.mu);
    int rc = 0;
    for (int i = 0; rc == 0 && i < n_ops; i++) {
        rt_kv_op_t *o = &ops[i];
        int k = fk_kv_find(o->entry);
        if (o->op == RT_KV_CLEAR) {
            fk.held[o->slot] = 0;
            continue;
        }
        if (o->op == RT_KV_WRITE || o->op == RT_KV_READ) {
            /* each stage's part: the tokens the slot's cache holds, 4 bytes each */
            char path[512];
            snprintf(path, sizeof path, "%s/.bloomery-io-%lld", fk.slot_dir, (long long)o->entry);
            FILE *f = fopen(path, o->op == RT_KV_WRITE ? "r+b" : "rb");
            size_t nb = (size_t)o->n * sizeof(int32_t);
            int ok = f && fseek(f, (long)o->bytes, SEEK_SET) == 0;
            if (ok && o->op == RT_KV_WRITE)
                ok = o->n <= fk.held[o->slot] && fwrite(fk.cache[o->slot], 1, nb, f) == nb;
            else if (ok)
                ok = fread(fk.cache[o->slot], 1, nb, f) == nb;
            if (f)
                fclose(f);
            if (!ok) {
                rc = bl_err_set(err, BL_EIO, "worker 0: slot file %s", path);
                break;
            }
            if (o->op == RT_KV_READ)
                fk.held[o->slot] = o->n;
            o->bytes += (int64_t)nb;
            continue;
        }
        if (o->op == RT_KV_DROP) {
            fk.kv_drops++;
            if (k >= 0) {
                fk.n_kv--;
                fk.kv_id[k] = fk.kv_id[fk.n_kv];
                fk.kv_n[k] = fk.kv_n[fk.n_kv];
                memcpy(fk.kv_toks[k], fk.kv_toks[fk.n_kv], sizeof fk.kv_toks[k]);
            }
        } else if (o->op == RT_KV_SAVE) {
            if (o->n > fk.held[o->slot] || o->n > 256 || fk.n_kv == 64 || k >= 0) {
                fk.bad = 1;
                snprintf(fk.bad_msg, sizeof fk.bad_msg, "save of %lld positions, slot %d holds %lld",
                         (long long)o->n, o->slot, (long long)fk.held[o->slot]);
                rc = bl_err_set(err, BL_EINVAL, "bad save");
                break;
            }
            fk.kv_id[fk.n_kv] = o->entry;
            fk.kv_n[fk.n_kv] = o->n;
            memcpy(fk.kv_toks[fk.n_kv++], fk.cache[o->slot], (size_t)o->n * sizeof(int32_t));
            o->bytes = 100 * o->n;
            fk.kv_saves++;
        } else {
            if (fk.kv_fail_load) {
                fk.kv_fail_load = 0;
                fk.held[o->slot] = 0;
                rc = bl_err_set(err, BL_ENOENT, "worker 0: no saved cache state %lld", (long long)o->entry);
                break;
            }
            if (k < 0 || o->n > fk.kv_n[k]) {
                fk.bad = 1;
                snprintf(fk.bad_msg, sizeof fk.bad_msg, "load of entry %lld (%d)", (long long)o->entry, k);
                rc = bl_err_set(err, BL_EINVAL, "bad load");
                break;
            }
            memcpy(fk.cache[o->slot], fk.kv_toks[k], (size_t)o->n * sizeof(int32_t));
            fk.held[o->slot] = o->n;
            o->bytes = 100 * fk.kv_n[k];
            fk.kv_loads++;
        }
    }
    pthread_mutex_unlock(&fk.mu);
    return rc;
}

int rt_cluster_kv_io_path(const rt_cluster_t *c, int64_t entry, char *out, size_t cap,
                          bl_err_t *err)
{
    (void)c;
    if (!fk.slot_dir[0])
        return bl_err_set(err, BL_EINVAL, "no folder for slot files");
    snprintf(out, cap, "%s/.bloomery-io-%lld", fk.slot_dir, (long long)entry);
    return 0;
}

// --- the tokenizer: one token per byte, then two end tokens ---------------------------------

static rt_tokenizer_t *g_tok;

static void make_tokenizer(void)
{
    static char bytes[256][3];
    static rt_str_t toks[N_VOCAB];
    static int32_t types[N_VOCAB];
    int next = 256;
    for (int b = 0; b < 256; b++) { /* the GPT-2 byte-level characters */
        int keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        int cp = keep ? b : next++;
        char *o = bytes[b];
        if (cp < 0x80) {
            o[0] = (char)cp;
        } else {
            o[0] = (char)(0xC0 | (cp >> 6));
            o[1] = (char)(0x80 | (cp & 0x3F));
        }
        toks[b] = (rt_str_t){ o, strlen(o) };
        types[b] = RT_TOKEN_NORMAL;
    }
    toks[256] = (rt_str_t){ "<|im_end|>", 10 };
    toks[257] = (rt_str_t){ "<|endoftext|>", 13 };
    types[256] = types[257] = RT_TOKEN_CONTROL;
    rt_tokenizer_desc_t d;
    rt_tokenizer_desc_init(&d);
    d.model = "gpt2";
    d.pre = "qwen2";
    d.n_vocab = N_VOCAB;
    d.tokens = toks;
    d.types = types;
    d.add_bos = 0;
    bl_err_t err = { 0 };
    if (rt_tokenizer_create(&g_tok, &d, &err))
        fail_msg("tokenizer: %s", err.msg);
    assert_true(rt_tokenizer_is_eog(g_tok, TOK_EOG));
}

// --- the harness ----------------------------------------------------------------------------

typedef struct rec {
    rt_engine_t *e;
    rt_task_t *task;
    char text[4096];
    size_t len;
    int32_t toks[1024];
    int n_tok;
    char pieces[64][16]; /* each TOKEN's text, for the first 64 */
    int final, error, status, after_final;
    rt_stop_type_t stop;
    char stop_word[64];
    char tail[256];
    char msg[512];
    rt_timings_t tm;
    int slot;
    int n_probs_seen;
    rt_token_prob_t probs[64][RT_MAX_N_PROBS];
    int n_probs[64];
    rt_token_prob_t sampled[64];
    int cancel_after;        /* cancel from the callback after this many tokens */
    int cancelled;
    uint64_t steps_at_cancel;
    struct rec *then;        /* submitted from the callback right after the cancel */
    int shutdown_after;      /* call rt_engine_shutdown after this many tokens */
    int64_t io_tokens, io_bytes; /* a slot file task's DONE */
} rec_t;

static uv_loop_t g_loop;
static rt_engine_t *g_e;
static int g_timed_out;

static rt_task_params_t greedy(void)
{
    rt_task_params_t p;
    rt_task_params_default(&p);
    p.sampling.temp = 0.0f;
    p.sampling.seed = 1;
    return p;
}

static void submit(rt_engine_t *e, rec_t *r, const char *prompt, const rt_task_params_t *p);

static void on_event(void *ud, const rt_event_t *ev)
{
    rec_t *r = ud;
    if (r->final || r->cancelled) {
        r->after_final++;
        return;
    }
    r->slot = ev->slot;
    if (ev->kind == RT_EV_TOKEN) {
        assert_true(r->len + ev->len < sizeof r->text);
        memcpy(r->text + r->len, ev->text, ev->len);
        r->len += ev->len;
        r->text[r->len] = '\0';
        if (r->n_tok < 64) {
            snprintf(r->pieces[r->n_tok], sizeof r->pieces[0], "%.*s", (int)ev->len, ev->text);
            r->n_probs[r->n_tok] = ev->n_probs_out;
            memcpy(r->probs[r->n_tok], ev->probs, (size_t)ev->n_probs_out * sizeof *ev->probs);
            r->sampled[r->n_tok] = ev->sampled;
        }
        if (r->n_tok < 1024)
            r->toks[r->n_tok] = ev->token;
        r->n_tok++;
        r->tm = ev->timings;
        if (r->cancel_after && r->n_tok == r->cancel_after) {
            pthread_mutex_lock(&fk.mu);
            r->steps_at_cancel = fk.steps;
            pthread_mutex_unlock(&fk.mu);
            rt_engine_cancel(r->e, r->task);
            r->cancelled = 1;
            if (r->then)
                submit(r->e, r->then, "ab", NULL);
        }
        if (r->shutdown_after && r->n_tok == r->shutdown_after)
            rt_engine_shutdown(r->e);
    } else if (ev->kind == RT_EV_DONE) {
        r->final = 1;
        r->stop = ev->stop_type;
        if (ev->stopping_word)
            snprintf(r->stop_word, sizeof r->stop_word, "%s", ev->stopping_word);
        assert_true(ev->tail_len < sizeof r->tail);
        memcpy(r->tail, ev->tail, ev->tail_len);
        r->tail[ev->tail_len] = '\0';
        r->tm = ev->timings;
        r->io_tokens = ev->io_tokens;
        r->io_bytes = ev->io_bytes;
    } else {
        r->final = 1;
        r->error = 1;
        r->status = ev->status;
        snprintf(r->msg, sizeof r->msg, "%s", ev->message);
    }
}

static void submit(rt_engine_t *e, rec_t *r, const char *prompt, const rt_task_params_t *p)
{
    rt_task_params_t def = greedy();
    if (!p)
        p = &def;
    int32_t ids[256];
    size_t n = strlen(prompt);
    assert_true(n < 256);
    for (size_t i = 0; i < n; i++)
        ids[i] = (unsigned char)prompt[i];
    r->e = e;
    bl_err_t err = { 0 };
    int rc = rt_engine_submit(e, ids, n, p, on_event, r, &r->task, &err);
    if (rc)
        fail_msg("submit: %s", err.msg);
}

static void on_watchdog(uv_timer_t *t)
{
    (void)t;
    g_timed_out = 1;
}

/* Runs the loop until every record in r[0..n) got its final event (or was cancelled). */
static void pump(rec_t *r, int n)
{
    uv_timer_t w;
    uv_timer_init(&g_loop, &w);
    uv_timer_start(&w, on_watchdog, 10000, 0);
    g_timed_out = 0;
    for (;;) {
        int left = 0;
        for (int i = 0; i < n; i++)
            left += !r[i].final && !r[i].cancelled;
        if (!left || g_timed_out)
            break;
        uv_run(&g_loop, UV_RUN_ONCE);
    }
    uv_timer_stop(&w);
    uv_close((uv_handle_t *)&w, NULL);
    uv_run(&g_loop, UV_RUN_NOWAIT);
    if (g_timed_out)
        fail_msg("timed out waiting for the engine's events");
    pthread_mutex_lock(&fk.mu);
    int bad = fk.bad;
    pthread_mutex_unlock(&fk.mu);
    if (bad)
        fail_msg("the engine sent a bad step: %s", fk.bad_msg);
}

static rt_engine_t *start_opts(const rt_engine_opts_t *o)
{
    rt_engine_t *e = NULL;
    bl_err_t err = { 0 };
    pthread_mutex_lock(&fk.mu);
    fk.n_batch = o->n_batch;
    pthread_mutex_unlock(&fk.mu);
    if (rt_engine_create(&e, o, (rt_cluster_t *)&fk, g_tok, &g_loop, &err))
        fail_msg("engine: %s", err.msg);
    g_e = e;
    return e;
}

static rt_engine_t *start(int n_slots, int64_t n_ctx, int64_t n_batch)
{
    rt_engine_opts_t o = { .n_slots = n_slots, .n_ctx_slot = n_ctx, .n_batch = n_batch,
                           .n_predict_max = -1, .timeout_ms = 0 };
    return start_opts(&o);
}

static int setup(void **state)
{
    (void)state;
    fk_reset();
    g_e = NULL;
    return uv_loop_init(&g_loop);
}

/* Shuts the engine down, lets the loop drain it, and proves the loop is left empty. */
static int teardown(void **state)
{
    (void)state;
    if (g_e) {
        rt_engine_shutdown(g_e);
        g_timed_out = 0;
        uv_timer_t w;
        uv_timer_init(&g_loop, &w);
        uv_timer_start(&w, on_watchdog, 10000, 0);
        while (!rt_engine_drained(g_e) && !g_timed_out)
            uv_run(&g_loop, UV_RUN_ONCE);
        uv_close((uv_handle_t *)&w, NULL);
        rt_engine_destroy(g_e);
        g_e = NULL;
    }
    uv_run(&g_loop, UV_RUN_DEFAULT); /* the closes */
    return uv_loop_close(&g_loop) == 0 ? 0 : -1;
}

static int count_seqs_of_step(uint64_t step)
{
    int n = 0;
    pthread_mutex_lock(&fk.mu);
    for (int i = 0; i < fk.n_log; i++)
        n += fk.log[i].step == step;
    pthread_mutex_unlock(&fk.mu);
    return n;
}

/* The first logged sequence of slot at or after step from. */
static fk_seq_t first_seq_of_slot(int slot, uint64_t from)
{
    fk_seq_t s = { 0 };
    s.slot = -1;
    pthread_mutex_lock(&fk.mu);
    for (int i = 0; i < fk.n_log; i++)
        if (fk.log[i].slot == slot && fk.log[i].step >= from) {
            s = fk.log[i];
            break;
        }
    pthread_mutex_unlock(&fk.mu);
    return s;
}

static uint64_t fk_steps(void)
{
    pthread_mutex_lock(&fk.mu);
    uint64_t s = fk.steps;
    pthread_mutex_unlock(&fk.mu);
    return s;
}

// --- tests ----------------------------------------------------------------------------------

static void test_engine_greedy_generates_in_order(void **state)
{
    (void)state;
    rt_engine_t *e = start(1, 256, 64);
    fk.script = "hello";
    fk.base = 2; /* the first generated token sits at position 2 */
    rec_t r = { 0 };
    rt_task_params_t p = greedy();
    p.n_predict = 5;
    submit(e, &r, "ab", &p);
    pump(&r, 1);
    assert_false(r.error);
    assert_string_equal(r.text, "hello");
    assert_int_equal(r.n_tok, 5);
    assert_int_equal(r.toks[0], 'h');
    assert_int_equal(r.toks[4], 'o');
    assert_int_equal(r.stop, RT_STOP_LIMIT);
    assert_int_equal(r.tm.n_prompt, 2);
    assert_int_equal(r.tm.n_predicted, 5);
    assert_int_equal(r.tm.n_cached, 0);
    assert_true(r.tm.prompt_ms >= 0 && r.tm.predicted_ms >= 0);
    /* the prompt in one chunk with one output, then one row per token fed back */
    fk_seq_t s0 = fk.log[0], s1 = fk.log[1];
    assert_int_equal(s0.pos, 0);
    assert_int_equal(s0.n, 2);
    assert_int_equal(s0.n_out, 1);
    assert_int_equal(s1.pos, 2);
    assert_int_equal(s1.n, 1);
    assert_int_equal(s1.first, 'h');
    assert_int_equal(fk.n_log, 5); /* the last token is never evaluated */
    rt_engine_stats_t st;
    rt_engine_get_stats(e, &st);
    assert_int_equal(st.prompt_tokens_total, 2);
    assert_int_equal(st.tokens_predicted_total, 5);
    assert_int_equal(st.n_decode_total, 5);
}

/* A fresh fake proposing as a NextN layer (a wrong proposal at every wrong-th
 * position; 0: none) and an engine of n_slots drafting with it: draft_max 16,
 * draft_p_min 0.5. */
static rt_engine_t *start_mtp(int n_slots, int wrong)
{
    fk_reset();
    fk.mtp = 1;
    fk.mtp_wrong = wrong;
    rt_engine_opts_t o = {.n_slots = n_slots, .n_ctx_slot = 256, .n_batch = 64, .n_predict_max = -1, .mtp = 1,
                          .draft_max = 16, .draft_p_min = 0.5f};
    return start_opts(&o);
}

/* Shuts e down and waits until it is drained, for a test that starts several. */
static void stop_engine(rt_engine_t *e)
{
    rt_engine_shutdown(e);
    while (!rt_engine_drained(e))
        uv_run(&g_loop, UV_RUN_ONCE);
    rt_engine_destroy(e);
    g_e = NULL;
}

/* --spec-type draft-mtp: each step's proposal is verified in the next (the pending
 * token and the proposal, two logit rows); the text is the script's, with right and
 * wrong proposals alike; the right ones save steps, and the timings count them. */
static void test_engine_nextn_proposals_verified(void **state)
{
    (void)state;
    for (int wrong = 0; wrong <= 3; wrong += 3) {
        rt_engine_t *e = start_mtp(2, wrong);
        fk.script = "the smith strikes the iron";
        fk.base = 3;
        rec_t r = {0};
        rt_task_params_t p = greedy();
        p.n_predict = 20;
        submit(e, &r, "abc", &p);
        pump(&r, 1);
        assert_false(r.error);
        assert_string_equal(r.text, "the smith strikes th");
        int verified = 0;
        for (int i = 0; i < fk.n_log; i++) {
            assert_true(fk.log[i].n_out <= 2); /* one proposal at most */
            verified += fk.log[i].n_out == 2;
        }
        assert_true(verified > 0);
        assert_int_equal(r.tm.n_drafted, verified);
        if (!wrong) /* every proposal right: two tokens a step after the first */
            assert_int_equal(r.tm.n_accepted, verified);
        else
            assert_true(r.tm.n_accepted > 0 && r.tm.n_accepted < verified);
        assert_true(fk_steps() < 20);
        stop_engine(e);
    }
}

/* A request's own draft limits ("speculative.n_max" 0, or a "speculative.p_min" above
 * the proposals' 0.9) leave its steps unverified; its text is the same. */
static void test_engine_request_draft_limits(void **state)
{
    (void)state;
    for (int k = 0; k < 3; k++) {
        rt_engine_t *e = start_mtp(1, 0);
        fk.script = "hammer";
        fk.base = 3;
        rec_t r = {0};
        rt_task_params_t p = greedy();
        p.n_predict = 6;
        if (k == 1)
            p.spec_n_max = 0;
        if (k == 2)
            p.spec_p_min = 0.95f;
        const rt_spec_limits_t l = rt_engine_spec_limits(e, &p);
        assert_int_equal(l.n_max, k == 1 ? 0 : 16);
        assert_true(l.p_min == (k == 2 ? 0.95f : 0.5f));
        submit(e, &r, "abc", &p);
        pump(&r, 1);
        assert_string_equal(r.text, "hammer");
        assert_true(k == 0 ? r.tm.n_drafted > 0 : r.tm.n_drafted == 0);
        stop_engine(e);
    }
}

static void test_engine_server_cap_limits_n_predict(void **state)
{
    (void)state;
    rt_engine_opts_t o = { .n_slots = 1, .n_ctx_slot = 256, .n_batch = 64, .n_predict_max = 3 };
    rt_engine_t *e = start_opts(&o);
    fk.script = "hello";
    fk.base = 2;
    rec_t r = { 0 };
    submit(e, &r, "ab", NULL); /* n_predict -1: the server's cap applies */
    pump(&r, 1);
    assert_string_equal(r.text, "hel");
    assert_int_equal(r.stop, RT_STOP_LIMIT);
    assert_int_equal(r.tm.n_predicted, 3);
}

static void test_engine_n_predict_zero_only_reads_the_prompt(void **state)
{
    (void)state;
    rt_engine_t *e = start(1, 256, 64);
    fk.script = "hello";
    fk.base = 3;
    rec_t r = { 0 };
    rt_task_params_t p = greedy();
    p.n_predict = 0;
    submit(e, &r, "abc", &p);
    pump(&r, 1);
    assert_false(r.error);
    assert_int_equal(r.n_tok, 0);
    assert_int_equal(r.stop, RT_STOP_LIMIT);
    assert_int_equal(fk.held[0], 3);
}

static void test_engine_eos_stops_without_its_text(void **state)
{
    (void)state;
    rt_engine_t *e = start(1, 256, 64);
    fk.script = "hi"; /* then the end token */
    fk.base = 2;
    rec_t r = { 0 };
    rt_task_params_t p = greedy();
    p.special = 1; /* even with control tokens rendered, the end token's text is not sent */
    submit(e, &r, "ab", &p);
    pump(&r, 1);
    assert_string_equal(r.text, "hi");
    assert_string_equal(r.tail, "");
    assert_int_equal(r.n_tok, 2);
    assert_int_equal(r.stop, RT_STOP_EOS);
    assert_int_equal(r.tm.n_predicted, 3);
}

static void test_engine_ignore_eos_bans_end_tokens(void **state)
{
    (void)state;
    rt_engine_t *e = start(1, 256, 64);
    fk.script = "hi";
    fk.base = 2;
    rec_t r = { 0 };
    rt_task_params_t p = greedy();
    p.ignore_eos = 1;
    p.n_predict = 6;
    submit(e, &r, "ab", &p);
    pump(&r, 1);
    assert_int_equal(r.stop, RT_STOP_LIMIT);
    assert_int_equal(r.n_tok, 6);
    for (int i = 0; i < r.n_tok; i++)
        assert_false(rt_tokenizer_is_eog(g_tok, r.toks[i]));
}

static void test_engine_stop_string_split_across_tokens(void **state)
{
    (void)state;
    rt_engine_t *e = start(1, 256, 64);
    fk.script = "xySTxSTOPz";
    fk.base = 2;
    rec_t r = { 0 };
    rt_task_params_t p = greedy();
    p.stop[0] = "STOP";
    p.stop[1] = "never";
    p.n_stop = 2;
    submit(e, &r, "ab", &p);
    pump(&r, 1);
    assert_false(r.error);
    assert_int_equal(r.stop, RT_STOP_WORD);
    assert_string_equal(r.stop_word, "STOP");
    assert_string_equal(r.text, "xySTx");
    assert_string_equal(r.tail, "");
    /* "ST" is held back until the 'x' shows it is no stop string */
    assert_string_equal(r.pieces[0], "x");
    assert_string_equal(r.pieces[2], "");
    assert_string_equal(r.pieces[3], "");
    assert_string_equal(r.pieces[4], "STx");
    assert_string_equal(r.pieces[8], "");
    assert_int_equal(r.n_tok, 9);
}

static void test_engine_unfinished_stop_string_is_released_at_the_end(void **state)
{
    (void)state;
    rt_engine_t *e = start(1, 256, 64);
    fk.script = "abST";
    fk.base = 2;
    rec_t r = { 0 };
    rt_task_params_t p = greedy();
    p.stop[0] = "STOP";
    p.n_stop = 1;
    p.n_predict = 4;
    submit(e, &r, "ab", &p);
    pump(&r, 1);
    assert_int_equal(r.stop, RT_STOP_LIMIT);
    assert_string_equal(r.text, "ab");
    assert_string_equal(r.tail, "ST");
}

static void test_engine_stop_string_inside_one_token_cuts_it(void **state)
{
    (void)state;
    rt_engine_t *e = start(1, 256, 64);
    fk.script = "abcdef";
    fk.base = 2;
    rec_t r = { 0 };
    rt_task_params_t p = greedy();
    p.stop[0] = "cd";
    p.stop[1] = "bcx";
    p.n_stop = 2;
    submit(e, &r, "ab", &p);
    pump(&r, 1);
    assert_int_equal(r.stop, RT_STOP_WORD);
    assert_string_equal(r.stop_word, "cd");
    assert_string_equal(r.text, "ab");
}

static void test_engine_utf8_split_across_tokens(void **state)
{
    (void)state;
    rt_engine_t *e = start(1, 256, 64);
    fk.script = "\xC3\xA9!\xE2\x82"; /* é, !, then two bytes of € before the end */
    fk.base = 2;
    rec_t r = { 0 };
    submit(e, &r, "ab", NULL);
    pump(&r, 1);
    assert_int_equal(r.stop, RT_STOP_EOS);
    assert_string_equal(r.pieces[0], "");
    assert_string_equal(r.pieces[1], "\xC3\xA9");
    assert_string_equal(r.pieces[2], "!");
    assert_string_equal(r.pieces[3], "");
    assert_string_equal(r.pieces[4], "");
    assert_string_equal(r.tail, "\xEF\xBF\xBD"); /* the unfinished character: U+FFFD */
}

static void test_engine_prompt_cache_keeps_the_common_prefix(void **state)
{
    (void)state;
    rt_engine_t *e = start(1, 256, 64);
    fk.script = "zzzzzzzzzzzz";
    fk.base = 0;
    rt_task_params_t p = greedy();
    p.n_predict = 2;

    rec_t r1 = { 0 };
    submit(e, &r1, "abcdefgh", &p);
    pump(&r1, 1);
    assert_int_equal(r1.tm.n_cached, 0);

    /* the cache holds the prompt and the first token; 8 shared tokens are kept */
    uint64_t from = fk_steps() + 1;
    rec_t r2 = { 0 };
    submit(e, &r2, "abcdefghxy", &p);
    pump(&r2, 1);
    assert_int_equal(r2.tm.n_cached, 8);
    assert_int_equal(r2.tm.n_prompt, 10);
    fk_seq_t s = first_seq_of_slot(0, from);
    assert_int_equal(s.pos, 8);
    assert_int_equal(s.n, 2);
    for (int i = 0; i < 10; i++)
        assert_int_equal(fk.cache[0][i], (unsigned char)"abcdefghxy"[i]);

    /* the whole prompt cached: its last token is evaluated again for the logits */
    from = fk_steps() + 1;
    rec_t r3 = { 0 };
    submit(e, &r3, "abcdefgh", &p);
    pump(&r3, 1);
    assert_int_equal(r3.tm.n_cached, 7);
    s = first_seq_of_slot(0, from);
    assert_int_equal(s.pos, 7);
    assert_int_equal(s.n, 1);
    assert_int_equal(s.n_out, 1);

    /* cache_prompt off: from the start */
    from = fk_steps() + 1;
    rec_t r4 = { 0 };
    p.cache_prompt = 0;
    submit(e, &r4, "abcdefgh", &p);
    pump(&r4, 1);
    assert_int_equal(r4.tm.n_cached, 0);
    s = first_seq_of_slot(0, from);
    assert_int_equal(s.pos, 0);
    assert_int_equal(s.n, 8);
}

/* -cram: what a new prompt overwrites in a slot is saved first, and a later prompt
 * that shares more with a saved state than with its slot starts from that state
 * (the fake checks every step against what the slot's cache holds); the budget
 * evicts the least recently used; a failed load falls back to the whole prompt. */
/* A slot file task, run to its end. */
static void slot_io(rt_engine_t *e, rec_t *r, int slot, int action, const char *name)
{
    memset(r, 0, sizeof *r);
    r->e = e;
    bl_err_t err = {0};
    if (rt_engine_slot_io(e, slot, action, name, on_event, r, &r->task, &err))
        fail_msg("slot io: %s", err.msg);
    pump(r, 1);
}

/* Slot files: a slot saved, restored into another (whose next prompt then starts from
 * it), erased; a damaged file, one of another model and a bad name refused. */
static void test_engine_slot_files(void **state)
{
    (void)state;
    char dir[] = "/tmp/bl-slot-test-XXXXXX";
    assert_non_null(mkdtemp(dir));
    snprintf(fk.slot_dir, sizeof fk.slot_dir, "%s", dir);
    rt_engine_opts_t o = {.n_slots = 2, .n_ctx_slot = 256, .n_batch = 64, .n_predict_max = -1,
                          .slot_dir = dir, .model_id = 42, .kv_type = 1, .n_layer = 4};
    rt_engine_t *e = start_opts(&o);
    fk.script = "zzzzzzzzzzzz";
    rt_task_params_t p = greedy();
    p.n_predict = 3;
    p.slot_id = 0;
    const char *prompt = "a prompt that slot 0 keeps";
    fk.base = (int64_t)strlen(prompt); /* "zzz" after the prompt */
    rec_t r = {0};
    submit(e, &r, prompt, &p);
    pump(&r, 1);
    const int64_t held = (int64_t)strlen(prompt) + 2; /* the last sampled token never ran */
    rec_t io;
    slot_io(e, &io, 0, RT_SLOT_SAVE, "s0.bin");
    assert_false(io.error);
    assert_int_equal(io.io_tokens, held);
    assert_int_equal(io.io_bytes, 64 + 8 * held); /* header, tokens, the fake's 4 bytes each */
    slot_io(e, &io, 1, RT_SLOT_RESTORE, "s0.bin");
    assert_false(io.error);
    assert_int_equal(io.io_tokens, held);
    /* slot 1's next prompt starts from what was restored */
    uint64_t from = fk_steps() + 1;
    p.slot_id = 1;
    rec_t r2 = {0};
    submit(e, &r2, prompt, &p);
    pump(&r2, 1);
    assert_int_equal(r2.tm.n_cached, (int64_t)strlen(prompt) - 1);
    assert_int_equal(first_seq_of_slot(1, from).pos, (int64_t)strlen(prompt) - 1);
    assert_string_equal(r2.text, r.text);
    /* erase */
    slot_io(e, &io, 1, RT_SLOT_ERASE, NULL);
    assert_false(io.error);
    assert_true(io.io_tokens >= held);
    assert_int_equal(fk.held[1], 0);
    /* damaged: one byte of the cache flipped */
    char path[512];
    snprintf(path, sizeof path, "%s/s0.bin", dir);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, -3, SEEK_END), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, -3, SEEK_END), 0);
    fputc(c ^ 1, f);
    fclose(f);
    slot_io(e, &io, 1, RT_SLOT_RESTORE, "s0.bin");
    assert_true(io.error);
    assert_int_equal(io.status, 400);
    assert_non_null(strstr(io.msg, "damaged"));
    slot_io(e, &io, 1, RT_SLOT_RESTORE, "missing.bin");
    assert_true(io.error && io.status == 400);
    /* a bad name never queues */
    rec_t bad = {0};
    bl_err_t err = {0};
    assert_int_equal(rt_engine_slot_io(e, 0, RT_SLOT_SAVE, "../x", on_event, &bad, &bad.task, &err),
                     BL_EINVAL);
    assert_int_equal(rt_engine_slot_io(e, 5, RT_SLOT_ERASE, NULL, on_event, &bad, &bad.task, &err),
                     BL_EINVAL);
    assert_false(fk.bad);
    unlink(path);
    rmdir(dir);
    fk.slot_dir[0] = '\0';
}

static void test_engine_host_prompt_cache(void **state)
{
    (void)state;
    rt_engine_opts_t o = {.n_slots = 1, .n_ctx_slot = 256, .n_batch = 64, .n_predict_max = -1,
                          .cache_ram = 100 * 60}; /* room for about two 25-position states */
    rt_engine_t *e = start_opts(&o);
    fk.script = "zzzzzzzzzzzz";
    rt_task_params_t p = greedy();
    p.n_predict = 2;
    const char *a = "the first long prompt, A.", *b = "another prompt entirely B", *c = "a third prompt, this is C";

    rec_t r = {0};
    submit(e, &r, a, &p);
    pump(&r, 1);
    assert_int_equal(fk.kv_saves, 0); /* nothing was overwritten */
    rec_t r2 = {0};
    submit(e, &r2, b, &p);
    pump(&r2, 1);
    assert_int_equal(fk.kv_saves, 1); /* A's state, before B took the slot */
    assert_int_equal(r2.tm.n_cached, 0);

    /* A again: from the saved state, all but its last token */
    uint64_t from = fk_steps() + 1;
    rec_t r3 = {0};
    submit(e, &r3, a, &p);
    pump(&r3, 1);
    assert_int_equal(fk.kv_loads, 1);
    assert_int_equal(fk.kv_saves, 2); /* B's */
    assert_int_equal(r3.tm.n_cached, (int64_t)strlen(a) - 1);
    fk_seq_t q = first_seq_of_slot(0, from);
    assert_int_equal(q.pos, (int64_t)strlen(a) - 1);
    assert_false(fk.bad);
    rt_engine_stats_t st;
    rt_engine_get_stats(e, &st);
    assert_int_equal(st.prompt_cache_hits_total, 1);
    assert_int_equal(st.prompt_cache_tokens_total, strlen(a) - 1);
    assert_int_equal(st.prompt_cache_saves_total, 2);

    /* C: the slot's A is kept already, nothing is saved; then B: C is saved, B
     * loaded, and the least recently used (A) evicted to stay in the budget */
    rec_t r4 = {0};
    submit(e, &r4, c, &p);
    pump(&r4, 1);
    assert_int_equal(fk.kv_saves, 2);
    rec_t r5 = {0};
    submit(e, &r5, b, &p);
    pump(&r5, 1);
    assert_int_equal(fk.kv_saves, 3);
    assert_int_equal(fk.kv_loads, 2);
    assert_int_equal(r5.tm.n_cached, (int64_t)strlen(b) - 1);
    assert_string_equal(r5.text, r2.text);
    rt_engine_get_stats(e, &st);
    assert_true(st.prompt_cache_bytes <= 100 * 60);
    assert_int_equal(st.prompt_cache_evictions_total, 1);
    assert_int_equal(st.prompt_cache_entries, fk.n_kv);

    /* a load that fails: the prompt runs whole, and the answer is the same */
    fk.kv_fail_load = 1;
    from = fk_steps() + 1;
    rec_t r6 = {0};
    submit(e, &r6, c, &p);
    pump(&r6, 1);
    q = first_seq_of_slot(0, from);
    assert_int_equal(q.pos, 0);
    assert_int_equal(r6.tm.n_cached, 0);
    assert_string_equal(r6.text, r4.text);
    assert_false(fk.bad);
}

/* --sleep-idle-seconds: idle past the limit, the processes are put to sleep; the next
 * task wakes them and runs from an empty cache (the fake flags a step that reuses a
 * position the restarted processes do not hold); busy time does not count. */
static void test_engine_sleeps_when_idle_and_wakes_for_a_task(void **state)
{
    (void)state;
    rt_engine_opts_t o = {.n_slots = 1, .n_ctx_slot = 256, .n_batch = 64, .n_predict_max = -1,
                          .sleep_idle_ms = 150};
    rt_engine_t *e = start_opts(&o);
    fk.script = "zzzzzzzzzzzz";
    rt_task_params_t p = greedy();
    p.n_predict = 2;
    rec_t r1 = { 0 };
    submit(e, &r1, "abcdefgh", &p);
    pump(&r1, 1);
    assert_int_equal(r1.error, 0);
    assert_true(r1.final);

    for (int i = 0; i < 200 && rt_cluster_state(NULL) != RT_CLUSTER_SLEEPING; i++)
        usleep(10000);
    assert_int_equal(rt_cluster_state(NULL), RT_CLUSTER_SLEEPING);
    assert_int_equal(fk.sleeps, 1);

    uint64_t from = fk_steps() + 1;
    rec_t r2 = { 0 };
    submit(e, &r2, "abcdefghxy", &p);
    pump(&r2, 1);
    assert_int_equal(r2.error, 0);
    assert_true(r2.final);
    assert_int_equal(fk.wakes, 1);
    assert_int_equal(r2.tm.n_cached, 0);
    assert_int_equal(first_seq_of_slot(0, from).pos, 0);
    assert_int_equal(fk.bad, 0);
    assert_int_equal(rt_cluster_state(NULL), RT_CLUSTER_READY);
}

static void test_engine_picks_the_slot_with_the_longest_prefix(void **state)
{
    (void)state;
    rt_engine_t *e = start(2, 256, 64);
    fk.script = "zzzzzzzzzzzzzzzzzzzz";
    rt_task_params_t p = greedy();
    p.n_predict = 1;
    p.slot_id = 1;
    rec_t r1 = { 0 };
    submit(e, &r1, "hello world", &p);
    pump(&r1, 1);
    assert_int_equal(r1.slot, 1);
    p.slot_id = 0;
    rec_t r2 = { 0 };
    submit(e, &r2, "other text", &p);
    pump(&r2, 1);
    assert_int_equal(r2.slot, 0);
    p.slot_id = -1;
    rec_t r3 = { 0 };
    submit(e, &r3, "hello there", &p);
    pump(&r3, 1);
    assert_int_equal(r3.slot, 1);
    assert_int_equal(r3.tm.n_cached, 6);
}

static void test_engine_runs_tasks_in_parallel_in_one_step(void **state)
{
    (void)state;
    fk.state = RT_CLUSTER_LOADING; /* every task is queued before the first step */
    rt_engine_t *e = start(3, 256, 64);
    fk.script = "abcdef";
    fk.base = 3;
    rt_task_params_t p = greedy();
    p.n_predict = 4;
    rec_t r[3] = { { 0 } };
    submit(e, &r[0], "xyz", &p);
    submit(e, &r[1], "pqr", &p);
    submit(e, &r[2], "uvw", &p);
    fk_set_state(RT_CLUSTER_READY);
    pump(r, 3);
    for (int i = 0; i < 3; i++) {
        assert_false(r[i].error);
        assert_string_equal(r[i].text, "abcd");
    }
    assert_true(r[0].slot != r[1].slot && r[1].slot != r[2].slot && r[0].slot != r[2].slot);
    assert_int_equal(fk_steps(), 4);
    for (uint64_t s = 1; s <= 4; s++)
        assert_int_equal(count_seqs_of_step(s), 3);
}

/* Two steps in flight (two stages busy): the three decoding slots are split over
 * them, each slot in one step at a time, its rows in order, and every reply as one
 * step at a time gives; a new task arriving meanwhile waits for the answers in flight
 * before its cache is touched. */
static void test_engine_pipelines_steps_over_the_slots(void **state)
{
    (void)state;
    fk.state = RT_CLUSTER_LOADING;
    rt_engine_opts_t o = {.n_slots = 3, .n_ctx_slot = 256, .n_batch = 64, .n_predict_max = -1, .pipeline = 2};
    rt_engine_t *e = start_opts(&o);
    fk.script = "abcdefgh";
    fk.base = 3;
    rt_task_params_t p = greedy();
    p.n_predict = 6;
    rec_t r[3] = { { 0 } };
    submit(e, &r[0], "xyz", &p);
    submit(e, &r[1], "pqr", &p);
    fk_set_state(RT_CLUSTER_READY);
    pump(r, 2);
    submit(e, &r[2], "uvw", &p);
    pump(r + 2, 1);
    for (int i = 0; i < 3; i++) {
        assert_false(r[i].error);
        assert_string_equal(r[i].text, "abcdef");
    }
    assert_false(fk.bad);
    assert_int_equal(fkf.max_n, 2);
    /* no step held a slot twice, and each slot's positions follow each other */
    int64_t next[FK_SLOTS] = {0};
    for (int i = 0; i < fk.n_log; i++) {
        for (int j = i + 1; j < fk.n_log && fk.log[j].step == fk.log[i].step; j++)
            assert_int_not_equal(fk.log[j].slot, fk.log[i].slot);
        if (fk.log[i].pos != 0)
            assert_int_equal(fk.log[i].pos, next[fk.log[i].slot]);
        next[fk.log[i].slot] = fk.log[i].pos + fk.log[i].n;
    }
}

static void test_engine_decode_rows_go_first_and_prompts_share_the_batch(void **state)
{
    (void)state;
    rt_engine_t *e = start(3, 256, 8);
    fk.script = "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz";
    fk.base = 0;
    fk.step_delay_us = 300; /* the first task decodes for a while (overlap, not timing) */
    rt_task_params_t p = greedy();
    p.n_predict = 200;
    p.ignore_eos = 1;
    rec_t r[3] = { { 0 } };
    submit(e, &r[0], "ab", &p);
    /* let the first task decode, then send two long prompts */
    while (fk_steps() < 2)
        usleep(1000);
    p.n_predict = 2;
    p.ignore_eos = 0;
    submit(e, &r[1], "abcdefghijklmnopqrst", &p);
    submit(e, &r[2], "abcdefghijklmnopqrst", &p);
    pump(r, 3);
    /* every step kept within n_batch (the fake checks), and a step with both prompts
     * starts with the decode row */
    int seen = 0;
    pthread_mutex_lock(&fk.mu);
    for (int i = 0; i + 2 < fk.n_log; i++) {
        if (fk.log[i].step == fk.log[i + 2].step && fk.log[i].n == 1 && fk.log[i + 1].n > 1 &&
            fk.log[i + 2].n > 1) {
            assert_int_equal(fk.log[i].slot, r[0].slot);
            assert_true(fk.log[i + 1].n + fk.log[i + 2].n <= 7);
            seen = 1;
            break;
        }
    }
    pthread_mutex_unlock(&fk.mu);
    assert_true(seen);
    assert_string_equal(r[1].text, "uv");
}

static void test_engine_queues_tasks_beyond_the_slots(void **state)
{
    (void)state;
    fk.state = RT_CLUSTER_LOADING;
    rt_engine_t *e = start(2, 256, 64);
    fk.script = "abcdef";
    fk.base = 3;
    rt_task_params_t p = greedy();
    p.n_predict = 4;
    rec_t r[3] = { { 0 } };
    submit(e, &r[0], "xyz", &p);
    submit(e, &r[1], "pqr", &p);
    submit(e, &r[2], "uvw", &p);
    rt_engine_stats_t st;
    rt_engine_get_stats(e, &st);
    assert_int_equal(st.requests_deferred, 3);
    fk_set_state(RT_CLUSTER_READY);
    pump(r, 2);
    assert_int_equal(count_seqs_of_step(1), 2);
    pump(r, 3);
    assert_false(r[2].error);
    assert_string_equal(r[2].text, "abcd");
    rt_slot_info_t info[4];
    assert_int_equal(rt_engine_slots(e, info, 4), 2);
    assert_int_equal(info[0].n_ctx, 256);
    rt_engine_get_stats(e, &st);
    assert_int_equal(st.requests_deferred, 0);
    assert_int_equal(st.tokens_predicted_total, 12);
}

static void test_engine_cancel_frees_the_slot_within_a_step(void **state)
{
    (void)state;
    rt_engine_t *e = start(1, 4096, 64);
    fk.step_delay_us = 500;
    fk.script = NULL; /* the end token never comes: ban it */
    rt_task_params_t p = greedy();
    p.ignore_eos = 1;
    rec_t r[2] = { { 0 } };
    r[0].cancel_after = 3;
    r[0].then = &r[1];
    submit(e, &r[0], "xy", &p);
    pump(r, 2);
    assert_true(r[0].cancelled);
    assert_int_equal(r[0].after_final, 0);
    assert_false(r[1].error);
    /* the next task's prompt went out at most one step after the one in flight */
    uint64_t from = r[0].steps_at_cancel + 1;
    pthread_mutex_lock(&fk.mu);
    uint64_t first = 0;
    for (int i = 0; i < fk.n_log; i++)
        if (fk.log[i].step >= from && fk.log[i].n_out && fk.log[i].first == 'a' &&
            fk.log[i].pos <= 1) {
            first = fk.log[i].step;
            break;
        }
    pthread_mutex_unlock(&fk.mu);
    assert_true(first > 0);
    assert_true(first <= r[0].steps_at_cancel + 2);
    /* let the loop deliver anything left: still nothing for the cancelled task */
    for (int i = 0; i < 20; i++)
        uv_run(&g_loop, UV_RUN_NOWAIT);
    assert_int_equal(r[0].after_final, 0);
}

static void test_engine_cancel_of_a_waiting_task(void **state)
{
    (void)state;
    fk.state = RT_CLUSTER_LOADING;
    rt_engine_t *e = start(1, 256, 64);
    fk.script = "abcd";
    fk.base = 2;
    rec_t r[2] = { { 0 } };
    submit(e, &r[0], "xy", NULL);
    submit(e, &r[1], "xy", NULL);
    rt_engine_cancel(e, r[1].task);
    r[1].cancelled = 1;
    rt_engine_stats_t st;
    rt_engine_get_stats(e, &st);
    assert_int_equal(st.requests_deferred, 1);
    fk_set_state(RT_CLUSTER_READY);
    pump(r, 2);
    assert_string_equal(r[0].text, "abcd");
    assert_int_equal(r[1].after_final, 0);
}

static void test_engine_dead_process_fails_running_tasks_with_500(void **state)
{
    (void)state;
    fk.state = RT_CLUSTER_LOADING;
    rt_engine_t *e = start(1, 256, 64);
    fk.script = "abcdefgh";
    fk.base = 3;
    fk.fail_at_step = 3;
    rt_task_params_t p = greedy();
    p.n_predict = 6;
    rec_t r[2] = { { 0 } };
    submit(e, &r[0], "xyz", &p);
    submit(e, &r[1], "xyz", &p); /* waits for the slot, then for the restart */
    fk_set_state(RT_CLUSTER_READY);
    pump(r, 2);
    assert_true(r[0].error);
    assert_int_equal(r[0].status, 500);
    assert_non_null(strstr(r[0].msg, "worker 0 (pid 4242)"));
    assert_false(r[1].error);
    assert_string_equal(r[1].text, "abcdef");
    assert_int_equal(r[1].tm.n_cached, 0); /* the restarted process starts empty */
    fk_seq_t s = first_seq_of_slot(0, 4);
    assert_int_equal(s.pos, 0);
    assert_int_equal(s.n, 3);
}

static void test_engine_shutdown_ends_every_task_with_503(void **state)
{
    (void)state;
    rt_engine_t *e = start(1, 4096, 64);
    fk.step_delay_us = 500;
    rt_task_params_t p = greedy();
    p.ignore_eos = 1;
    rec_t r[2] = { { 0 } };
    r[0].shutdown_after = 2;
    submit(e, &r[0], "xy", &p);
    submit(e, &r[1], "xy", &p);
    pump(r, 2);
    for (int i = 0; i < 2; i++) {
        assert_true(r[i].error);
        assert_int_equal(r[i].status, 503);
        assert_string_equal(r[i].msg, "server is shutting down");
    }
    rt_task_t *t = NULL;
    bl_err_t err = { 0 };
    int32_t ids[2] = { 'a', 'b' };
    assert_int_equal(rt_engine_submit(e, ids, 2, &p, on_event, &r[0], &t, &err), BL_ECLOSED);
    while (!rt_engine_drained(e))
        uv_run(&g_loop, UV_RUN_ONCE);
    assert_true(rt_engine_drained(e));
}

static void test_engine_waiting_past_the_timeout_fails_with_503(void **state)
{
    (void)state;
    rt_engine_opts_t o = { .n_slots = 1, .n_ctx_slot = 4096, .n_batch = 64,
                           .n_predict_max = -1, .timeout_ms = 30 };
    rt_engine_t *e = start_opts(&o);
    fk.step_delay_us = 2000;
    rt_task_params_t p = greedy();
    p.ignore_eos = 1;
    p.n_predict = 100;
    rec_t r[2] = { { 0 } };
    submit(e, &r[0], "xy", &p);
    submit(e, &r[1], "xy", &p);
    pump(&r[1], 1);
    assert_true(r[1].error);
    assert_int_equal(r[1].status, 503);
    rt_engine_cancel(e, r[0].task);
    r[0].cancelled = 1;
}

static void test_engine_context_full_stops_with_limit(void **state)
{
    (void)state;
    rt_engine_t *e = start(1, 16, 64);
    rt_task_params_t p = greedy();
    p.ignore_eos = 1;
    rec_t r = { 0 };
    submit(e, &r, "0123456789", &p);
    pump(&r, 1);
    assert_int_equal(r.stop, RT_STOP_LIMIT);
    assert_int_equal(r.tm.n_predicted, 7); /* positions 10..15 fed back, one more sampled */
}

/* t_max_predict_ms, llama-server's rule: past the time, the first token after a
 * generated line break ends it; without a line break the time does not. */
static void test_engine_time_limit_stops_with_limit(void **state)
{
    (void)state;
    static char script[1001];
    memset(script, 'b', 1000);
    script[1] = '\n';
    rt_engine_t *e = start(1, 4096, 64);
    fk.script = script;
    fk.base = 2;
    fk.step_delay_us = 2000;
    rt_task_params_t p = greedy();
    p.n_predict = 1000;
    p.t_max_predict_ms = 20;
    rec_t r = { 0 };
    submit(e, &r, "xy", &p);
    pump(&r, 1);
    assert_false(r.error);
    assert_int_equal(r.stop, RT_STOP_LIMIT);
    assert_true(r.tm.n_predicted >= 3 && r.tm.n_predicted < 1000);
}

static void test_engine_time_limit_waits_for_a_line_break(void **state)
{
    (void)state;
    static char script[101];
    memset(script, 'b', 100);
    rt_engine_t *e = start(1, 4096, 64);
    fk.script = script;
    fk.base = 2;
    fk.step_delay_us = 1000;
    rt_task_params_t p = greedy();
    p.n_predict = 40;
    p.t_max_predict_ms = 2;
    rec_t r = { 0 };
    submit(e, &r, "xy", &p);
    pump(&r, 1);
    assert_int_equal(r.stop, RT_STOP_LIMIT);
    assert_int_equal(r.tm.n_predicted, 40);
}

/* n_indent: a generated line indented less ends generation before its first other
 * character; the line break and its blanks are kept; the first line is not judged. */
static void test_engine_n_indent_stops_at_a_shallower_line(void **state)
{
    (void)state;
    rt_engine_t *e = start(1, 4096, 64);
    fk.script = "x = 1\n    y\n\t \t z\n  w\nmore";
    fk.base = 2;
    rt_task_params_t p = greedy();
    p.n_indent = 3;
    rec_t r = { 0 };
    submit(e, &r, "ab", &p);
    pump(&r, 1);
    assert_false(r.error);
    assert_int_equal(r.stop, RT_STOP_LIMIT);
    assert_string_equal(r.text, "x = 1\n    y\n\t \t z\n  ");
    assert_string_equal(r.tail, "");

    /* off (0): the whole script */
    rt_task_params_t q = greedy();
    rec_t r2 = { 0 };
    submit(e, &r2, "ab", &q);
    pump(&r2, 1);
    assert_int_equal(r2.stop, RT_STOP_EOS);
    assert_string_equal(r2.text, "x = 1\n    y\n\t \t z\n  w\nmore");
}

static void test_engine_refuses_bad_requests(void **state)
{
    (void)state;
    rt_engine_t *e = start(1, 16, 64);
    rt_task_params_t p = greedy();
    rt_task_t *t = NULL;
    bl_err_t err = { 0 };
    int32_t ids[32];
    for (int i = 0; i < 32; i++)
        ids[i] = 'a';
    rec_t r = { 0 };

    assert_int_equal(rt_engine_submit(e, ids, 16, &p, on_event, &r, &t, &err), BL_ERANGE);
    assert_non_null(strstr(err.msg, "exceeds the available context size"));
    assert_non_null(strstr(err.msg, "16"));
    assert_int_equal(rt_engine_submit(e, ids, 20, &p, on_event, &r, &t, &err), BL_ERANGE);
    assert_non_null(strstr(err.msg, "20"));
    assert_null(t);

    assert_int_equal(rt_engine_submit(e, ids, 0, &p, on_event, &r, &t, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "empty"));

    ids[1] = N_VOCAB;
    assert_int_equal(rt_engine_submit(e, ids, 3, &p, on_event, &r, &t, &err), BL_EINVAL);
    ids[1] = -1;
    assert_int_equal(rt_engine_submit(e, ids, 3, &p, on_event, &r, &t, &err), BL_EINVAL);
    ids[1] = 'a';

    p.n_probs = RT_MAX_N_PROBS + 1;
    assert_int_equal(rt_engine_submit(e, ids, 3, &p, on_event, &r, &t, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "n_probs"));
    p = greedy();
    p.n_stop = RT_MAX_STOP + 1;
    assert_int_equal(rt_engine_submit(e, ids, 3, &p, on_event, &r, &t, &err), BL_EINVAL);
    p = greedy();
    static char long_stop[2000];
    memset(long_stop, 'x', sizeof long_stop - 1);
    p.stop[0] = long_stop;
    p.n_stop = 1;
    assert_int_equal(rt_engine_submit(e, ids, 3, &p, on_event, &r, &t, &err), BL_EINVAL);
    p.stop[0] = "\xC3";
    assert_int_equal(rt_engine_submit(e, ids, 3, &p, on_event, &r, &t, &err), BL_EINVAL);
    p = greedy();
    p.sampling.top_p = 2.0f;
    assert_int_equal(rt_engine_submit(e, ids, 3, &p, on_event, &r, &t, &err), BL_EINVAL);
    p = greedy();
    p.slot_id = 1;
    assert_int_equal(rt_engine_submit(e, ids, 3, &p, on_event, &r, &t, &err), BL_EINVAL);
    rt_logit_bias_t b = { N_VOCAB + 5, 1.0f };
    p = greedy();
    p.sampling.logit_bias = &b;
    p.sampling.n_logit_bias = 1;
    assert_int_equal(rt_engine_submit(e, ids, 3, &p, on_event, &r, &t, &err), BL_EINVAL);
    assert_null(t);
}

static void test_engine_n_probs_are_log_softmax_of_the_logits(void **state)
{
    (void)state;
    rt_engine_t *e = start(1, 256, 64);
    fk.script = "hello";
    fk.base = 2;
    rt_task_params_t p;
    rt_task_params_default(&p);
    p.sampling.temp = 1.0f;
    p.sampling.top_k = 0;
    p.sampling.top_p = 1.0f;
    p.sampling.min_p = 0.0f;
    p.sampling.seed = 7;
    p.n_probs = 5;
    p.n_predict = 4;
    rec_t r = { 0 };
    submit(e, &r, "ab", &p);
    pump(&r, 1);
    assert_true(r.n_tok >= 1);
    /* the first token's row: what the fake gave for 'b' at position 1 */
    float row[N_VOCAB];
    fk_row(row, 'b', 1);
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < N_VOCAB; i++)
        mx = row[i] > mx ? row[i] : mx;
    for (int i = 0; i < N_VOCAB; i++)
        sum += exp(row[i] - mx);
    double lse = mx + log(sum);
    assert_int_equal(r.n_probs[0], 5);
    double total = 0;
    for (int j = 0; j < 5; j++) {
        const rt_token_prob_t *q = &r.probs[0][j];
        assert_in_range(q->id, 0, N_VOCAB - 1);
        assert_float_equal(q->logprob, row[q->id] - lse, 1e-4);
        /* every filter off at temperature 1: the sampler's probability is the softmax */
        assert_float_equal(q->prob, exp(q->logprob), 1e-4);
        if (j > 0)
            assert_true(q->logprob <= r.probs[0][j - 1].logprob);
        total += q->prob;
    }
    assert_true(total <= 1.0 + 1e-4);
    assert_int_equal(r.probs[0][0].id, 'h');
    assert_true(r.probs[0][0].prob > 0.9f);
    assert_int_equal(r.sampled[0].id, r.toks[0]);
    assert_float_equal(r.sampled[0].logprob, row[r.toks[0]] - lse, 1e-4);
    assert_true(r.sampled[0].prob > 0.0f && r.sampled[0].prob <= 1.0f);
}

static void test_engine_slots_snapshot(void **state)
{
    (void)state;
    rt_engine_t *e = start(2, 128, 64);
    assert_int_equal(rt_engine_n_slots(e), 2);
    assert_int_equal(rt_engine_n_ctx_slot(e), 128);
    fk.script = "abc";
    fk.base = 2;
    rec_t r = { 0 };
    rt_task_params_t p = greedy();
    p.slot_id = 1;
    submit(e, &r, "xy", &p);
    pump(&r, 1);
    rt_slot_info_t info[2];
    assert_int_equal(rt_engine_slots(e, info, 2), 2);
    assert_int_equal(info[1].id, 1);
    assert_false(info[1].busy);
    assert_int_equal(info[1].n_past, 5); /* xy abc; the end token is never evaluated */
    rt_engine_stats_t st;
    rt_engine_get_stats(e, &st);
    assert_int_equal(st.kv_cache_tokens, 5);
    assert_int_equal(st.n_tokens_max, 5);
    assert_int_equal(st.requests_processing, 0);
}

/* The sampling threads' policy (rt_engine_sample_helpers). */
static void test_engine_sample_helpers(void **state)
{
    (void)state;
    assert_int_equal(rt_engine_sample_helpers(1, 64), 0);  /* one slot */
    assert_int_equal(rt_engine_sample_helpers(8, 2), 0);   /* the CI machine */
    assert_int_equal(rt_engine_sample_helpers(8, 4), 1);
    assert_int_equal(rt_engine_sample_helpers(8, 16), 7);
    assert_int_equal(rt_engine_sample_helpers(4, 16), 3);
    assert_int_equal(rt_engine_sample_helpers(32, 128), 7);
}

int main(void)
{
    bl_log_init("test", BL_LOG_WARN + 1); /* the engine's expected warnings stay quiet */
    make_tokenizer();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_engine_greedy_generates_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_nextn_proposals_verified, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_request_draft_limits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_server_cap_limits_n_predict, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_n_predict_zero_only_reads_the_prompt, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_engine_eos_stops_without_its_text, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_ignore_eos_bans_end_tokens, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_stop_string_split_across_tokens, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_engine_unfinished_stop_string_is_released_at_the_end,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_stop_string_inside_one_token_cuts_it, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_engine_utf8_split_across_tokens, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_prompt_cache_keeps_the_common_prefix, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_engine_host_prompt_cache, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_slot_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_sleeps_when_idle_and_wakes_for_a_task, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_picks_the_slot_with_the_longest_prefix, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_engine_runs_tasks_in_parallel_in_one_step, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(
            test_engine_decode_rows_go_first_and_prompts_share_the_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_pipelines_steps_over_the_slots, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_queues_tasks_beyond_the_slots, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_engine_cancel_frees_the_slot_within_a_step, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_engine_cancel_of_a_waiting_task, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_dead_process_fails_running_tasks_with_500,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_shutdown_ends_every_task_with_503, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_engine_waiting_past_the_timeout_fails_with_503,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_context_full_stops_with_limit, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_engine_time_limit_stops_with_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_time_limit_waits_for_a_line_break, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_n_indent_stops_at_a_shallower_line, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_refuses_bad_requests, setup, teardown),
        cmocka_unit_test_setup_teardown(test_engine_n_probs_are_log_softmax_of_the_logits, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_engine_slots_snapshot, setup, teardown),
        cmocka_unit_test(test_engine_sample_helpers),
    };
    /* once as the host's CPUs have it (none on a 2-CPU host), once with a step's rows
     * drawn on three threads: the same assertions either way */
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    setenv("BLOOMERY_SAMPLE_THREADS", "3", 1);
    rc |= cmocka_run_group_tests(tests, NULL, NULL);
    rt_tokenizer_destroy(g_tok);
    return rc;
}
