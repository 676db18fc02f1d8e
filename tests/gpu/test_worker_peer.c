/* Two pipeline stages in two processes passing a step's activations card to card
 * (CUDA IPC: worker/backend_cuda.c's card buffers, proto/cardlink.c's protocol on a
 * shared-memory ring), against the whole model on one card: a prompt step, then
 * decode steps, the sender running ahead of a receiver that sleeps now and then, so
 * that the buffers' back-pressure holds the sender. With two cards the stages run on
 * CUDA0 and CUDA1 (where the cards cannot reach each other's memory the refusal is
 * checked instead: the worker then keeps the host ring); with one card that case is
 * a TAP skip and the same pipeline runs with both processes on CUDA0, which is the
 * same IPC path without the peer mapping. Gate: the precise path's (max |dlogit| <=
 * 0.05, mean <= 0.005 against the one-card run); the bits are reported too, since a
 * split on one card gives the bits of one stage (test_worker_cuda).
 *
 * No CUDA call is made before the processes fork (a context does not survive a
 * fork): a first child counts the devices. The model: a small qwen3moe that
 * bloomery-mkmodel writes (BLOOMERY_MKMODEL names it; tests/gpu/run.sh sets it), else
 * ../shared's qwen3moe-tiny-q4k.gguf (BLOOMERY_SHARED), else the program skips.
 * TAP output; BLOOMERY_TEST_SEED replays the tokens. */
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#pragma GCC diagnostic ignored "-Wunused-function"
#include "arch.h"
#include "cardlink.h"
#include "gguf.h"
#include "gpu_test.h"
#include "wk.h"

#ifndef BL_SOURCE_ROOT
#define BL_SOURCE_ROOT "."
#endif

enum { PROMPT = 24, DECODE = 6, STEPS = 1 + DECODE, MAX_VOCAB = 1 << 18, N_BATCH = 64, N_CTX = 256 };
#define WAIT_US (120 * 1000000LL) /* what any one wait here may take before the case fails */

/* What the processes of one case share: the offer and the answer (as the router
 * would relay them), each stage's outcome, and the logits. */
typedef struct shared {
    _Atomic int offered;   /* 1 offered, -1 the export failed */
    _Atomic int answered;  /* 1 answered */
    _Atomic int ok;        /* the receiver opened the buffers */
    _Atomic int done_recv; /* the receiver has read every buffer: the sender may free them */
    _Atomic int n_devices, can_peer;
    wk_card_t card;
    char why[640];
    int64_t n_vocab;
    char err[3][512];      /* sender, receiver, reference */
    float split[STEPS][MAX_VOCAB], ref[STEPS][MAX_VOCAB];
} shared_t;

static shared_t *g_sh;
static char g_model[1024];
static int64_t g_n_layer; /* the model's, read before the forks */
static int32_t g_ids[PROMPT + DECODE];

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Waits until *flag is non-zero; 0, or -1 past WAIT_US. */
static int wait_flag(_Atomic int *flag)
{
    const int64_t until = now_us() + WAIT_US;
    while (!atomic_load(flag)) {
        if (now_us() > until)
            return -1;
        usleep(1000);
    }
    return 0;
}

/* A model loaded here whose logits fit the shared rows. */
static int check_vocab(const wk_model_t *m, bl_err_t *err)
{
    const int64_t v = wk_model_config(m)->n_vocab;
    return v <= MAX_VOCAB ? 0 : bl_err_set(err, BL_ERANGE, "a vocabulary of %lld tokens", (long long)v);
}

static wk_model_t *load_stage(int device, int64_t lb, int64_t le, bl_err_t *err)
{
    wk_model_opts_t o;
    wk_model_opts_default(&o);
    o.precise = 1;
    o.n_threads = 4;
    o.n_batch = N_BATCH;
    o.n_ctx_max = N_CTX;
    o.device = device;
    o.layer_begin = lb;
    o.layer_end = le;
    wk_model_t *m = NULL;
    return wk_model_load(&m, g_model, &o, err) == 0 ? m : NULL;
}

/* The step s of every run: the prompt, then one token at a time. */
static wk_seq_t step_seq(wk_kv_t *kv, int s)
{
    const int64_t pos = s == 0 ? 0 : PROMPT + s - 1;
    return (wk_seq_t){.kv = kv, .tokens = g_ids + pos, .n = s == 0 ? PROMPT : 1, .pos = pos, .n_out = 1};
}

// --- the processes -------------------------------------------------------------------------

typedef struct card_ctx {
    wk_model_t *m;
    int64_t row_bytes;
} card_ctx_t;

static int put(void *ctx, int k, size_t nbytes, bl_err_t *err)
{
    card_ctx_t *c = ctx;
    return wk_model_card_put(c->m, k, (int64_t)nbytes / c->row_bytes, err);
}

static int get(void *ctx, int k, size_t nbytes, bl_err_t *err)
{
    card_ctx_t *c = ctx;
    return wk_model_card_get(c->m, k, (int64_t)nbytes / c->row_bytes, err);
}

static int settle(void *ctx, bl_err_t *err)
{
    card_ctx_t *c = ctx;
    return wk_model_card_settle(c->m, err);
}

/* Stage 0 on device: exports, waits for the answer, runs every step into the link. */
static int sender(bp_ring_t *out, int device, int64_t cut)
{
    bl_err_t err = {0};
    wk_model_t *m = load_stage(device, 0, cut, &err);
    wk_kv_t *kv = NULL;
    bp_cardlink_t *l = NULL;
    int rc = m ? wk_kv_create(&kv, m, N_CTX, WK_KV_F16, &err) : BL_EIO;
    if (rc == 0)
        rc = wk_model_card_export(m, BP_CARD_BUFS, &g_sh->card, &err);
    if (rc) { /* the receiver answers the refusal; the parent reports it */
        snprintf(g_sh->why, sizeof g_sh->why, "the sender: %s", err.msg);
        atomic_store(&g_sh->offered, -1);
        goto out;
    }
    atomic_store(&g_sh->offered, 1);
    if (wait_flag(&g_sh->answered) || !atomic_load(&g_sh->ok))
        goto out; /* a refused link: the parent checks why */
    card_ctx_t cc = {m, (int64_t)sizeof(float) * wk_model_config(m)->n_embd};
    const bp_cardlink_ops_t ops = {.put = put};
    rc = bp_cardlink_create(&l, out, g_sh->card.n_bufs, g_sh->card.buf_bytes, &ops, &cc, &err);
    for (int s = 0; rc == 0 && s < STEPS; s++) {
        wk_seq_t q = step_seq(kv, s);
        bp_step_hdr_t h = {.kind = BP_STEP_HIDDEN, .step = (uint64_t)s + 1, .n_seqs = 1, .n_rows = (int32_t)q.n,
                           .width = (int32_t)wk_model_config(m)->n_embd};
        bp_step_out_t o;
        const int64_t until = now_us() + WAIT_US;
        while ((rc = bp_cardlink_reserve(l, &h, &o, 100000, &err)) == BL_ETIMEDOUT && now_us() < until &&
               !atomic_load(&g_sh->done_recv)) { /* a receiver that gave up releases nothing more */
        }
        if (rc)
            break;
        o.seqs[0] = (bp_step_seq_t){.slot = 0, .n = (int32_t)q.n, .pos = q.pos, .n_out = 1};
        memcpy(o.tokens, q.tokens, sizeof *o.tokens * (size_t)q.n); /* the step's tokens go with it */
        if ((rc = wk_model_stage(m, &q, 1, NULL, NULL, NULL, &err)) == 0)
            rc = bp_cardlink_commit(l, &o, &err);
    }
    /* the buffers stay until the receiver is done with them */
    if (rc == 0 && wait_flag(&g_sh->done_recv))
        rc = bl_err_set(&err, BL_ETIMEDOUT, "the receiver did not finish");
out:
    if (rc)
        snprintf(g_sh->err[0], sizeof g_sh->err[0], "%s", err.msg);
    bp_cardlink_destroy(l);
    wk_kv_free(kv);
    wk_model_free(m);
    return rc ? 1 : 0;
}

/* Stage 1 on device: opens the offer, answers, reads every step from the link and
 * keeps its logits; sleeps after some gets, as a stage that falls behind. */
static int receiver(bp_ring_t *in, int device, int64_t cut)
{
    bl_err_t err = {0};
    wk_model_t *m = NULL;
    wk_kv_t *kv = NULL;
    bp_cardlink_t *l = NULL;
    int rc = wait_flag(&g_sh->offered) ? bl_err_set(&err, BL_ETIMEDOUT, "no offer") : 0;
    if (rc == 0 && atomic_load(&g_sh->offered) < 0) {
        atomic_store(&g_sh->answered, 1);
        goto out;
    }
    if (rc == 0 && !(m = load_stage(device, cut, g_n_layer, &err)))
        rc = BL_EIO;
    if (rc == 0)
        rc = check_vocab(m, &err);
    if (rc == 0)
        rc = wk_kv_create(&kv, m, N_CTX, WK_KV_F16, &err);
    if (rc == 0 && wk_model_card_import(m, &g_sh->card, &err) != 0) {
        snprintf(g_sh->why, sizeof g_sh->why, "%s", err.msg);
        atomic_store(&g_sh->answered, 1);
        goto out;
    }
    const wk_config_t *c = m ? wk_model_config(m) : NULL;
    card_ctx_t cc = {m, c ? (int64_t)sizeof(float) * c->n_embd : 1};
    const bp_cardlink_ops_t ops = {.get = get, .settle = settle};
    if (rc == 0)
        rc = bp_cardlink_create(&l, in, g_sh->card.n_bufs, g_sh->card.buf_bytes, &ops, &cc, &err);
    atomic_store(&g_sh->ok, rc == 0);
    atomic_store(&g_sh->answered, 1);
    if (rc == 0)
        g_sh->n_vocab = c->n_vocab;
    const bp_step_limits_t lim = {.n_slots = 1, .n_batch = N_BATCH, .n_ctx = N_CTX, .n_out_max = N_BATCH,
                                  .n_embd = c ? (int32_t)c->n_embd : 0, .n_vocab = c ? (int32_t)c->n_vocab : 0,
                                  .n_layer = c ? (int32_t)c->n_layer : 0, .card_bufs = g_sh->card.n_bufs};
    for (int s = 0; rc == 0 && s < STEPS; s++) {
        const void *msg;
        size_t n;
        static bp_step_seq_t seqs[1];
        static int32_t toks[N_BATCH];
        bp_step_in_t got = {.seqs = seqs, .ids = toks};
        if ((rc = bp_ring_peek(in, &msg, &n, WAIT_US, &err)) != 0 ||
            (rc = bp_step_parse(msg, n, &lim, BP_STEP_HIDDEN, (uint64_t)s + 1, &got, &err)) != 0)
            break;
        if (got.hdr.kind != BP_STEP_HIDDEN || !got.hdr.card) {
            rc = bl_err_set(&err, BL_EPROTO, "step %d: not a card message", s);
            break;
        }
        if ((rc = bp_cardlink_get(l, &got, &err)) != 0)
            break;
        if (s % 2 == 1)
            usleep(30000); /* behind: the sender must wait for this buffer */
        wk_seq_t q = step_seq(kv, s);
        q.tokens = NULL;
        rc = wk_model_stage(m, &q, 1, NULL, NULL, g_sh->split[s], &err);
        if (rc == 0)
            rc = bp_cardlink_release(l, &err);
    }
    atomic_store(&g_sh->done_recv, 1);
out:
    if (rc)
        snprintf(g_sh->err[1], sizeof g_sh->err[1], "%s", err.msg);
    bp_cardlink_destroy(l);
    wk_kv_free(kv);
    wk_model_free(m); /* the opened buffers closed with it */
    return rc ? 1 : 0;
}

/* The whole model on device, the same steps. */
static int reference(int device)
{
    bl_err_t err = {0};
    wk_model_t *m = load_stage(device, 0, 0, &err);
    wk_kv_t *kv = NULL;
    int rc = m ? check_vocab(m, &err) : BL_EIO;
    if (rc == 0)
        rc = wk_kv_create(&kv, m, N_CTX, WK_KV_F16, &err);
    for (int s = 0; rc == 0 && s < STEPS; s++) {
        wk_seq_t q = step_seq(kv, s);
        rc = wk_model_eval(m, kv, q.tokens, q.n, q.pos, 1, g_sh->ref[s], &err);
    }
    if (rc)
        snprintf(g_sh->err[2], sizeof g_sh->err[2], "%s", err.msg);
    wk_kv_free(kv);
    wk_model_free(m);
    return rc ? 1 : 0;
}

static void probe(void)
{
    bl_err_t err = {0};
    int n = 0, can = 0;
    if (kcuda_device_count(&n, &err) == 0 && n >= 2 && kcuda_can_access_peer(1, 0, &can, &err) != 0)
        can = 0;
    atomic_store(&g_sh->n_devices, n);
    atomic_store(&g_sh->can_peer, can);
}

// --- the parent ----------------------------------------------------------------------------

/* Runs fn in a child; its pid. */
static pid_t start(int (*fn)(void *), void *arg)
{
    fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0)
        bail("fork", NULL);
    if (pid == 0)
        _exit(fn(arg));
    return pid;
}

/* Waits for the children (killing them past the time limit); 0 when all exited 0. */
static int join(const pid_t *pids, int n)
{
    const int64_t until = now_us() + 3 * WAIT_US;
    int bad = 0, left = n;
    int done[4] = {0};
    while (left > 0) {
        for (int i = 0; i < n; i++) {
            int st;
            if (done[i] || waitpid(pids[i], &st, WNOHANG) != pids[i])
                continue;
            done[i] = 1;
            left--;
            bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
        }
        if (left > 0 && now_us() > until) {
            for (int i = 0; i < n; i++)
                if (!done[i])
                    kill(pids[i], SIGKILL);
            bad = 1;
        }
        usleep(2000);
    }
    return bad ? -1 : 0;
}

typedef struct stage_arg {
    bp_ring_t *ring;
    int device;
    int64_t cut;
} stage_arg_t;

static int run_sender(void *a) { const stage_arg_t *s = a; return sender(s->ring, s->device, s->cut); }
static int run_receiver(void *a) { const stage_arg_t *s = a; return receiver(s->ring, s->device, s->cut); }
static int run_reference(void *a) { return reference(*(const int *)a); }
static int run_probe(void *a) { (void)a; probe(); return 0; }

static void reset_shared(void)
{
    const int n = atomic_load(&g_sh->n_devices), can = atomic_load(&g_sh->can_peer);
    memset(g_sh, 0, offsetof(shared_t, split));
    atomic_store(&g_sh->n_devices, n);
    atomic_store(&g_sh->can_peer, can);
}

/* One case: stage 0 on dev_a, stage 1 on dev_b, against the whole model on dev_a;
 * expect_refusal: the link must be refused naming the missing peer access. */
static void run_case(int dev_a, int dev_b, int expect_refusal)
{
    reset_shared();
    bp_ring_t *prod = NULL, *cons = NULL;
    bl_err_t err = {0};
    if (bp_ring_create(&prod, "peer-test", 1 << 20, BP_RING_PRODUCER, &err) != 0 ||
        bp_ring_attach_fd(&cons, bp_ring_fd(prod), "peer-test", BP_RING_CONSUMER, &err) != 0)
        bail("ring", &err);
    /* the cut: half the layers */
    stage_arg_t a = {prod, dev_a, g_n_layer / 2}, b = {cons, dev_b, g_n_layer / 2};
    int ref_dev = dev_a;
    pid_t pids[3] = {start(run_sender, &a), start(run_receiver, &b), start(run_reference, &ref_dev)};
    const int rc = join(pids, 3);
    bp_ring_destroy(cons);
    bp_ring_destroy(prod);
    char what[64];
    snprintf(what, sizeof what, "CUDA%d -> CUDA%d", dev_a, dev_b);
    if (expect_refusal) {
        tap_ok(rc == 0 && !atomic_load(&g_sh->ok) && strstr(g_sh->why, "peer access"),
               "%s: cards without peer access refuse the link, naming why (%s)", what, g_sh->why);
        return;
    }
    if (rc != 0 || !atomic_load(&g_sh->ok)) {
        tap_ok(0, "%s: the pipeline ran (sender: %s; receiver: %s; reference: %s; link: %s)", what, g_sh->err[0],
               g_sh->err[1], g_sh->err[2], g_sh->why);
        return;
    }
    const int64_t V = g_sh->n_vocab;
    double worst = 0, sum = 0;
    int same = 1;
    for (int s = 0; s < STEPS; s++)
        for (int64_t i = 0; i < V; i++) {
            const double d = fabs((double)g_sh->split[s][i] - (double)g_sh->ref[s][i]);
            worst = d > worst || isnan(d) ? (isnan(d) ? INFINITY : d) : worst;
            sum += d;
            same &= g_sh->split[s][i] == g_sh->ref[s][i];
        }
    const double mean = sum / (double)(STEPS * V);
    printf("# %s: %d steps (a %d-row prompt, %d decodes), max |dlogit| %.3g, mean %.3g%s\n", what, STEPS, PROMPT,
           DECODE, worst, mean, same ? ", the same bits" : "");
    tap_ok(worst <= 0.05 && mean <= 0.005, "%s: two stages card to card give the one-card logits", what);
}

static int find_model(void)
{
    const char *mk = getenv("BLOOMERY_MKMODEL");
    if (mk && *mk) {
        char dir[] = "/tmp/bloomery-gpu-peer.XXXXXX";
        if (!mkdtemp(dir))
            bail("mkdtemp", NULL);
        snprintf(g_model, sizeof g_model, "%s/qwen3moe.gguf", dir);
        char cmd[2400];
        snprintf(cmd, sizeof cmd, "'%s' -o '%s' --layers 4 --seed 9 > /dev/null", mk, g_model);
        if (system(cmd) == 0)
            return 0;
    }
    const char *sh = getenv("BLOOMERY_SHARED");
    snprintf(g_model, sizeof g_model, "%s/models/qwen3moe-tiny-q4k.gguf", sh && *sh ? sh : BL_SOURCE_ROOT "/../shared");
    struct stat st;
    return stat(g_model, &st) == 0 ? 0 : -1;
}

/* The model's layer count from its metadata (no CUDA in this process). */
static void read_layers(void)
{
    bl_gguf_t *g = NULL;
    bl_arch_t a;
    bl_err_t err = {0};
    if (bl_gguf_open(&g, g_model, &err) != 0 || bl_arch_read(&a, g, g_model, &err) != 0)
        bail(g_model, &err);
    g_n_layer = a.n_layer;
    bl_gguf_close(g);
    if (g_n_layer < 2)
        bail("a model of fewer than 2 layers", NULL);
}

int main(void)
{
    test_seed_init("test_worker_peer");
    g_sh = mmap(NULL, sizeof *g_sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (g_sh == MAP_FAILED)
        bail("mmap", NULL);
    memset(g_sh, 0, sizeof *g_sh);
    pid_t p = start(run_probe, NULL);
    if (join(&p, 1) != 0)
        bail("counting the devices", NULL);
    const int n = atomic_load(&g_sh->n_devices);
    if (n == 0) {
        fprintf(stderr, "skip: no CUDA device\n");
        printf("1..0 # SKIP no CUDA device\n");
        return 0;
    }
    if (find_model() != 0) {
        printf("1..0 # SKIP no model: neither BLOOMERY_MKMODEL nor %s\n", g_model);
        return 0;
    }
    read_layers();
    rng_t r = rng_for(1);
    for (int i = 0; i < PROMPT + DECODE; i++)
        g_ids[i] = (int32_t)(rng_next(&r) % 200);
    printf("# %d CUDA device(s); model %s\n", n, g_model);
    if (n >= 2)
        run_case(0, 1, !atomic_load(&g_sh->can_peer));
    else
        printf("ok %d - # SKIP CUDA0 -> CUDA1: one CUDA device\n", ++g_tap_n);
    run_case(0, 0, 0);
    return tap_done();
}
