/* Tests of router/cluster.c with real child processes on a small model made by
 * bloomery-mkmodel at test time: logits through 1, 2 and 3 workers (and the
 * hosttier) equal in-process wk_model_eval bit for bit; kill -9 of a worker or of
 * the hosttier ends the step with BL_ECLOSED naming it within a second, and the
 * restarted set works; a child that cannot load fails the cluster with its reason;
 * destroy leaves no child behind; two clusters whose plans are built at once (a
 * draft's beside the model's) each run their own model. cluster.c is included, its
 * plans sent through plan_sent here, which can hold the first ones until both are
 * built. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chan.h"
#include "cluster.h"
#include "wk.h"

static int plan_sent(bp_chan_t *c, const bp_peer_t *to, const bp_plan_t *p, int timeout_ms, bl_err_t *err);
#define bp_chan_send_plan plan_sent
#include "cluster.c"
#undef bp_chan_send_plan

/* Plans still to be built before any of them is sent (0: each goes at once): the
 * first g_plans_meet plans wait in plan_sent for one another, 10 s at most. */
static pthread_mutex_t g_plan_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_plan_cv = PTHREAD_COND_INITIALIZER;
static int g_plans_meet;

static int plan_sent(bp_chan_t *c, const bp_peer_t *to, const bp_plan_t *p, int timeout_ms, bl_err_t *err)
{
    pthread_mutex_lock(&g_plan_mu);
    if (g_plans_meet > 0) {
        g_plans_meet--;
        pthread_cond_broadcast(&g_plan_cv);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 10;
        while (g_plans_meet > 0 && pthread_cond_timedwait(&g_plan_cv, &g_plan_mu, &until) == 0)
            ;
    }
    pthread_mutex_unlock(&g_plan_mu);
    return bp_chan_send_plan(c, to, p, timeout_ms, err);
}

#define N_SLOTS 2
#define N_CTX 128
#define N_BATCH 64

static char g_dir[64];
static char g_moe[128], g_dense[128], g_badkv[128];
static char g_bin[128]; /* holds links to both programs, which build in two folders */
static int g_have_models;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int mkmodel(const char *out, const char *extra)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "%s/tools/bloomery-mkmodel -o %s --layers 4 --n-embd 256 --heads 4 --kv-heads 2 "
             "--head-dim 64 --vocab 512 --ctx 256 %s >/dev/null",
             BL_BUILD_ROOT, out, extra);
    return system(cmd);
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/bl_test_cluster_XXXXXX");
    if (!mkdtemp(g_dir))
        return -1;
    snprintf(g_moe, sizeof g_moe, "%s/moe.gguf", g_dir);
    snprintf(g_dense, sizeof g_dense, "%s/dense.gguf", g_dir);
    snprintf(g_badkv, sizeof g_badkv, "%s/hd16.gguf", g_dir);
    snprintf(g_bin, sizeof g_bin, "%s/bin", g_dir);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "mkdir -p %s && ln -sf %s/worker/bloomery-worker %s/ && "
             "ln -sf %s/hosttier/bloomery-hosttier %s/", g_bin, BL_BUILD_ROOT, g_bin,
             BL_BUILD_ROOT, g_bin);
    if (system(cmd) != 0)
        return -1;
    g_have_models = mkmodel(g_moe, "--expert-ff 256") == 0 && mkmodel(g_dense, "--arch qwen3") == 0 &&
                    mkmodel(g_badkv, "--head-dim 16 --type q8_0") == 0;
    if (!g_have_models)
        printf("# bloomery-mkmodel (in %s/tools) did not make the test models: the cluster "
               "tests skip\n", BL_BUILD_ROOT);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* ------------------------------------------------------------ children */

/* Pids of this process's children whose name starts with prefix (comm is cut at 15). */
static int children(const char *prefix, pid_t *out, int cap)
{
    DIR *d = opendir("/proc");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        int pid = atoi(e->d_name);
        if (pid <= 0)
            continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = '\0';
        char *open = strchr(buf, '('), *close = strrchr(buf, ')');
        if (!open || !close)
            continue;
        int ppid = 0;
        char st;
        if (sscanf(close + 2, "%c %d", &st, &ppid) != 2 || ppid != getpid())
            continue;
        *close = '\0';
        if (strncmp(open + 1, prefix, strlen(prefix)) == 0 && n < cap)
            out[n++] = pid;
    }
    if (d)
        closedir(d);
    return n;
}

static void assert_no_children(void)
{
    pid_t p[8];
    assert_int_equal(children("", p, 8), 0);
    /* nothing left to reap either */
    assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
    assert_int_equal(errno, ECHILD);
}

/* ------------------------------------------------------------ the script */

/* A prompt step over both slots, then decode steps; tokens fixed by the step index. */
#define N_DECODE 3
static const int32_t g_p0[7] = {1, 17, 250, 3, 99, 511, 42};
static const int32_t g_p1[5] = {5, 6, 300, 7, 8};
#define N_LOGITS (2 + 2 * N_DECODE)

static int32_t decode_token(int slot, int step)
{
    return (int32_t)((37 * step + 101 * slot + 11) % 512);
}

/* The script in process, one sequence at a time through wk_model_eval. */
static void reference(const char *model, float *out, int64_t n_vocab_expect)
{
    wk_model_opts_t o;
    wk_model_opts_default(&o);
    o.n_batch = N_BATCH;
    o.n_ctx_max = N_CTX;
    wk_model_t *m;
    bl_err_t err = {0};
    if (wk_model_load(&m, model, &o, &err) != 0)
        fail_msg("load %s: %s", model, err.msg);
    int64_t nv = wk_model_config(m)->n_vocab;
    assert_int_equal(nv, n_vocab_expect);
    wk_kv_t *kv[2];
    for (int s = 0; s < 2; s++)
        assert_int_equal(wk_kv_create(&kv[s], m, N_CTX, WK_KV_F16, &err), 0);
    assert_int_equal(wk_model_eval(m, kv[0], g_p0, 7, 0, 1, out, &err), 0);
    assert_int_equal(wk_model_eval(m, kv[1], g_p1, 5, 0, 1, out + nv, &err), 0);
    for (int d = 0; d < N_DECODE; d++)
        for (int s = 0; s < 2; s++) {
            int32_t t = decode_token(s, d);
            int64_t pos = (s ? 5 : 7) + d;
            float *row = out + (2 + 2 * d + s) * nv;
            if (wk_model_eval(m, kv[s], &t, 1, pos, 1, row, &err) != 0)
                fail_msg("eval: %s", err.msg);
        }
    for (int s = 0; s < 2; s++)
        wk_kv_free(kv[s]);
    wk_model_free(m);
}

/* The same script through the cluster; 0 or the first step's error. */
static int through(rt_cluster_t *c, float *out, bl_err_t *err)
{
    int64_t nv = rt_cluster_n_vocab(c);
    const float *lg;
    rt_step_seq_t seqs[2] = {
        {.slot = 0, .n = 7, .pos = 0, .n_out = 1, .tokens = g_p0},
        {.slot = 1, .n = 5, .pos = 0, .n_out = 1, .tokens = g_p1},
    };
    int rc = rt_cluster_step(c, seqs, 2, &lg, err);
    if (rc)
        return rc;
    memcpy(out, lg, 2 * (size_t)nv * sizeof(float));
    for (int d = 0; d < N_DECODE; d++) {
        int32_t t[2] = {decode_token(0, d), decode_token(1, d)};
        rt_step_seq_t ds[2] = {
            {.slot = 0, .n = 1, .pos = 7 + d, .n_out = 1, .tokens = &t[0]},
            {.slot = 1, .n = 1, .pos = 5 + d, .n_out = 1, .tokens = &t[1]},
        };
        if ((rc = rt_cluster_step(c, ds, 2, &lg, err)) != 0)
            return rc;
        memcpy(out + (2 + 2 * d) * nv, lg, 2 * (size_t)nv * sizeof(float));
    }
    return 0;
}

/* host: which layers' routed experts the hosttier computes: every layer (1), none
 * (0), or the odd ones (2); 3: the odd ones, and the even ones an expert tier's (a
 * worker in the tier role, on the CPU here). */
static rt_cluster_t *start_host(const char *model, int n_workers, int host)
{
    static rt_cluster_opts_t o;
    o = (rt_cluster_opts_t){
        .model_path = model, .bin_dir = g_bin, .runtime_dir = g_dir,
        .n_workers = n_workers, .n_threads = 1, .n_threads_batch = 1, .n_threads_hosttier = 1,
        .n_slots = N_SLOTS, .n_ctx_slot = N_CTX, .n_batch = N_BATCH, .kv_type = WK_KV_F16};
    for (int l = 0; l < RT_CLUSTER_MAX_LAYERS; l++) {
        o.host_layers[l] = host == 1 || (host >= 2 && l % 2 == 1);
        o.tier_layers[l] = host == 3 && l % 2 == 0;
    }
    o.n_tiers = host == 3;
    o.tier_device[0] = -1;
    rt_cluster_t *c;
    bl_err_t err = {0};
    if (rt_cluster_create(&c, &o, &err) != 0)
        fail_msg("create: %s", err.msg);
    rt_cluster_state_t st = rt_cluster_wait(c, 60000);
    char why[1024];
    if (st != RT_CLUSTER_READY)
        fail_msg("cluster state %d: %s", st, rt_cluster_error(c, why, sizeof why));
    return c;
}

static rt_cluster_t *start(const char *model, int n_workers) { return start_host(model, n_workers, 1); }

static void compare_host(const char *model, int n_workers, int host)
{
    static float ref[N_LOGITS * 1024], got[N_LOGITS * 1024];
    rt_cluster_t *c = start_host(model, n_workers, host);
    int64_t nv = rt_cluster_n_vocab(c);
    assert_true(nv <= 1024);
    reference(model, ref, nv);
    bl_err_t err = {0};
    if (through(c, got, &err) != 0)
        fail_msg("step: %s", err.msg);
    for (int64_t i = 0; i < N_LOGITS * nv; i++)
        if (memcmp(&ref[i], &got[i], sizeof(float)) != 0)
            fail_msg("%d workers: logit %lld (row %lld) differs: %.9g in process, %.9g through "
                     "the cluster", n_workers, (long long)i, (long long)(i / nv), ref[i], got[i]);
    rt_cluster_stats_t s;
    rt_cluster_get_stats(c, &s);
    assert_int_equal(s.steps, 1 + N_DECODE);
    assert_int_equal(s.starts, 1);
    rt_cluster_destroy(c);
    assert_no_children();
}

static void compare(const char *model, int n_workers) { compare_host(model, n_workers, 1); }

#define SKIP_WITHOUT_MODELS()                                                                      \
    do {                                                                                           \
        if (!g_have_models) {                                                                      \
            skip();                                                                                \
        }                                                                                          \
    } while (0)

static void test_cluster_one_worker_matches_in_process(void **state)
{
    (void)state;
    SKIP_WITHOUT_MODELS();
    compare(g_moe, 1);
}

static void test_cluster_two_workers_match_in_process(void **state)
{
    (void)state;
    SKIP_WITHOUT_MODELS();
    compare(g_moe, 2);
}

static void test_cluster_three_workers_match_in_process(void **state)
{
    (void)state;
    SKIP_WITHOUT_MODELS();
    compare(g_moe, 3);
}

/* The plan decides per layer where the routed experts run: with none in host RAM no
 * hosttier starts; with the odd layers' there, both kinds of layer run in one step.
 * Either way the bits are the in-process pass's. */
static void test_cluster_experts_placed_by_layer(void **state)
{
    (void)state;
    SKIP_WITHOUT_MODELS();
    pid_t p[4];
    rt_cluster_t *c = start_host(g_moe, 2, 0);
    assert_int_equal(children("bloomery-hostti", p, 4), 0);
    assert_int_equal(children("bloomery-worker", p, 4), 2);
    rt_cluster_destroy(c);
    assert_no_children();
    compare_host(g_moe, 2, 0);
    c = start_host(g_moe, 2, 2);
    assert_int_equal(children("bloomery-hostti", p, 4), 1);
    rt_cluster_destroy(c);
    assert_no_children();
    compare_host(g_moe, 2, 2);
}

/* An expert tier beside the hosttier: the even layers' experts go to a worker in the
 * tier role, the odd ones' to the hosttier, from both stages; the bits are still the
 * in-process pass's. */
static void test_cluster_experts_on_a_tier(void **state)
{
    (void)state;
    SKIP_WITHOUT_MODELS();
    pid_t p[4];
    rt_cluster_t *c = start_host(g_moe, 2, 3);
    assert_int_equal(children("bloomery-hostti", p, 4), 1);
    assert_int_equal(children("bloomery-worker", p, 4), 3); /* two stages and the tier */
    rt_cluster_destroy(c);
    assert_no_children();
    compare_host(g_moe, 2, 3);
}

static void test_cluster_dense_model_runs_without_hosttier(void **state)
{
    (void)state;
    SKIP_WITHOUT_MODELS();
    rt_cluster_t *c = start(g_dense, 2);
    pid_t p[4];
    assert_int_equal(children("bloomery-hostti", p, 4), 0);
    assert_int_equal(children("bloomery-worker", p, 4), 2);
    rt_cluster_destroy(c);
    assert_no_children();
    compare(g_dense, 2);
}

/* Kills the first child named prefix, runs a step, and expects BL_ECLOSED naming
 * who within a second; then the restarted set gives the in-process logits again. */
static void kill_and_recover(const char *prefix, const char *who)
{
    static float ref[N_LOGITS * 1024], got[N_LOGITS * 1024];
    rt_cluster_t *c = start(g_moe, 2);
    int64_t nv = rt_cluster_n_vocab(c);
    reference(g_moe, ref, nv);
    bl_err_t err = {0};
    assert_int_equal(through(c, got, &err), 0);

    pid_t p[4];
    assert_true(children(prefix, p, 4) >= 1);
    assert_int_equal(kill(p[0], SIGKILL), 0);
    double t0 = now_s();
    int32_t t = 3;
    rt_step_seq_t s = {.slot = 0, .n = 1, .pos = 7 + N_DECODE, .n_out = 1, .tokens = &t};
    const float *lg;
    int rc = rt_cluster_step(c, &s, 1, &lg, &err);
    double dt = now_s() - t0;
    assert_int_equal(rc, BL_ECLOSED);
    if (!strstr(err.msg, who))
        fail_msg("error '%s' does not name %s", err.msg, who);
    assert_non_null(strstr(err.msg, "signal 9"));
    if (dt > 1.0)
        fail_msg("the death took %.3f s to end the step", dt);
    /* A step while restarting is refused, not run. */
    rc = rt_cluster_step(c, &s, 1, &lg, &err);
    assert_true(rc == BL_EAGAIN || rc == 0 || rc == BL_EINVAL);

    assert_int_equal(rt_cluster_wait(c, 60000), RT_CLUSTER_READY);
    char why[1024];
    assert_non_null(strstr(rt_cluster_error(c, why, sizeof why), who));
    if (through(c, got, &err) != 0)
        fail_msg("after the restart: %s", err.msg);
    assert_memory_equal(ref, got, N_LOGITS * (size_t)nv * sizeof(float));
    rt_cluster_stats_t st;
    rt_cluster_get_stats(c, &st);
    assert_int_equal(st.starts, 2);
    assert_int_equal(st.child_deaths, 1);
    rt_cluster_destroy(c);
    assert_no_children();
}

static void test_cluster_kill_worker_between_steps(void **state)
{
    (void)state;
    SKIP_WITHOUT_MODELS();
    kill_and_recover("bloomery-worker", "worker ");
}

static void test_cluster_kill_hosttier_between_steps(void **state)
{
    (void)state;
    SKIP_WITHOUT_MODELS();
    kill_and_recover("bloomery-hostti", "hosttier");
}

/* A child dies while nothing runs and the set restarts before the next step: a
 * step of new sequences (pos 0) runs on the new set at once, and the whole script
 * gives the in-process logits; the death is not reported to it. */
static void test_cluster_death_while_idle_spares_new_steps(void **state)
{
    (void)state;
    SKIP_WITHOUT_MODELS();
    static float ref[N_LOGITS * 1024], got[N_LOGITS * 1024];
    rt_cluster_t *c = start(g_moe, 1);
    int64_t nv = rt_cluster_n_vocab(c);
    reference(g_moe, ref, nv);
    bl_err_t err = {0};
    assert_int_equal(through(c, got, &err), 0);

    pid_t p[4];
    assert_true(children("bloomery-worker", p, 4) >= 1);
    assert_int_equal(kill(p[0], SIGKILL), 0);
    rt_cluster_stats_t st = {0};
    for (double t_end = now_s() + 60; now_s() < t_end; usleep(10000)) {
        rt_cluster_get_stats(c, &st);
        if (st.starts == 2 && rt_cluster_state(c) == RT_CLUSTER_READY)
            break;
    }
    assert_int_equal(st.starts, 2);
    if (through(c, got, &err) != 0)
        fail_msg("the first step after an idle restart failed: %s", err.msg);
    assert_memory_equal(ref, got, N_LOGITS * (size_t)nv * sizeof(float));
    rt_cluster_destroy(c);
    assert_no_children();
}

typedef struct killer {
    pid_t pid;
    int delay_us;
    double t_kill;
} killer_t;

static void *kill_later(void *arg)
{
    killer_t *k = arg;
    usleep((useconds_t)k->delay_us);
    k->t_kill = now_s();
    kill(k->pid, SIGKILL);
    return NULL;
}

/* Steps run in a loop while another thread kills the child: the step in flight (or
 * the next) ends with BL_ECLOSED within a second of the kill. */
static void kill_during(const char *prefix, const char *who)
{
    rt_cluster_t *c = start(g_moe, 2);
    pid_t p[4];
    assert_true(children(prefix, p, 4) >= 1);
    killer_t k = {.pid = p[0], .delay_us = 20000};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, kill_later, &k), 0);
    static int32_t toks[N_BATCH];
    for (int i = 0; i < N_BATCH; i++)
        toks[i] = (int32_t)(i * 7 % 512);
    bl_err_t err = {0};
    const float *lg;
    int rc = 0;
    double t_end = now_s() + 5;
    while (rc == 0 && now_s() < t_end) {
        rt_step_seq_t s = {.slot = 0, .n = N_BATCH, .pos = 0, .n_out = 1, .tokens = toks};
        rc = rt_cluster_step(c, &s, 1, &lg, &err);
    }
    double t_fail = now_s();
    pthread_join(th, NULL);
    assert_int_equal(rc, BL_ECLOSED);
    if (!strstr(err.msg, who))
        fail_msg("error '%s' does not name %s", err.msg, who);
    if (t_fail - k.t_kill > 1.0)
        fail_msg("the death took %.3f s to end the steps", t_fail - k.t_kill);
    assert_int_equal(rt_cluster_wait(c, 60000), RT_CLUSTER_READY);
    rt_step_seq_t s = {.slot = 1, .n = 5, .pos = 0, .n_out = 1, .tokens = g_p1};
    if (rt_cluster_step(c, &s, 1, &lg, &err) != 0)
        fail_msg("after the restart: %s", err.msg);
    rt_cluster_destroy(c);
    assert_no_children();
}

static void test_cluster_kill_worker_during_steps(void **state)
{
    (void)state;
    SKIP_WITHOUT_MODELS();
    kill_during("bloomery-worker", "worker ");
}

static void test_cluster_kill_hosttier_during_steps(void **state)
{
    (void)state;
    SKIP_WITHOUT_MODELS();
    kill_during("bloomery-hostti", "hosttier");
}

static void test_cluster_refuses_bad_steps(void **state)
{
    (void)state;
    SKIP_WITHOUT_MODELS();
    rt_cluster_t *c = start(g_moe, 1);
    const float *lg;
    bl_err_t err = {0};
    int32_t t[2] = {1, 2}, bad = 512;
    rt_step_seq_t s = {.slot = 2, .n = 1, .pos = 0, .n_out = 1, .tokens = t};
    assert_int_equal(rt_cluster_step(c, &s, 1, &lg, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "slot 2"));
    s = (rt_step_seq_t){.slot = 0, .n = 1, .pos = N_CTX, .n_out = 1, .tokens = t};
    assert_int_equal(rt_cluster_step(c, &s, 1, &lg, &err), BL_ERANGE);
    s = (rt_step_seq_t){.slot = 0, .n = 1, .pos = 0, .n_out = 1, .tokens = &bad};
    assert_int_equal(rt_cluster_step(c, &s, 1, &lg, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "token 512"));
    rt_step_seq_t two[2] = {{.slot = 1, .n = 1, .tokens = t}, {.slot = 1, .n = 1, .tokens = t}};
    assert_int_equal(rt_cluster_step(c, two, 2, &lg, &err), BL_EINVAL);
    /* A position past what the cache holds: the worker refuses, the set lives on. */
    s = (rt_step_seq_t){.slot = 0, .n = 1, .pos = 5, .n_out = 1, .tokens = t};
    int rc = rt_cluster_step(c, &s, 1, &lg, &err);
    assert_int_equal(rc, BL_EINVAL);
    assert_non_null(strstr(err.msg, "worker 0"));
    s.pos = 0;
    assert_int_equal(rt_cluster_step(c, &s, 1, &lg, &err), 0);
    assert_int_equal(rt_cluster_state(c), RT_CLUSTER_READY);
    rt_cluster_destroy(c);
    assert_no_children();
}

/* A draft's cluster starts beside the model's, each supervisor building the plan of
 * its worker when the worker says Hello. Here both plans are built before either is
 * sent: each worker still loads its own cluster's model (the two files have the same
 * vocabulary and width, so a worker with the other's would pass the Ready check),
 * and each cluster's logits are its model's in process, bit for bit. */
static void test_cluster_plans_of_two_at_once(void **state)
{
    (void)state;
    SKIP_WITHOUT_MODELS();
    static float ref[N_LOGITS * 1024], got[N_LOGITS * 1024];
    const char *models[2] = {g_moe, g_dense};
    rt_cluster_opts_t o[2];
    rt_cluster_t *c[2];
    bl_err_t err = {0};
    pthread_mutex_lock(&g_plan_mu);
    g_plans_meet = 2;
    pthread_mutex_unlock(&g_plan_mu);
    for (int i = 0; i < 2; i++) {
        o[i] = (rt_cluster_opts_t){
            .model_path = models[i], .bin_dir = g_bin, .runtime_dir = g_dir, .n_workers = 1,
            .n_threads = 1, .n_threads_batch = 1, .n_slots = N_SLOTS, .n_ctx_slot = N_CTX,
            .n_batch = N_BATCH, .kv_type = WK_KV_F16};
        if (rt_cluster_create(&c[i], &o[i], &err) != 0)
            fail_msg("create %s: %s", models[i], err.msg);
    }
    for (int i = 0; i < 2; i++) {
        char why[1024];
        if (rt_cluster_wait(c[i], 60000) != RT_CLUSTER_READY)
            fail_msg("%s: %s", models[i], rt_cluster_error(c[i], why, sizeof why));
    }
    pthread_mutex_lock(&g_plan_mu);
    const int unmet = g_plans_meet;
    g_plans_meet = 0;
    pthread_mutex_unlock(&g_plan_mu);
    assert_int_equal(unmet, 0);
    for (int i = 0; i < 2; i++) {
        const int64_t nv = rt_cluster_n_vocab(c[i]);
        assert_true(nv <= 1024);
        reference(models[i], ref, nv);
        if (through(c[i], got, &err) != 0)
            fail_msg("step of %s: %s", models[i], err.msg);
        for (int64_t j = 0; j < N_LOGITS * nv; j++)
            if (memcmp(&ref[j], &got[j], sizeof(float)) != 0)
                fail_msg("%s: logit %lld (row %lld) differs: %.9g in process, %.9g through its cluster",
                         models[i], (long long)j, (long long)(j / nv), ref[j], got[j]);
    }
    for (int i = 0; i < 2; i++)
        rt_cluster_destroy(c[i]);
    assert_no_children();
}

static void test_cluster_load_failure_names_the_child(void **state)
{
    (void)state;
    SKIP_WITHOUT_MODELS();
    /* q8_0 caches need head_dim a multiple of 32: the workers refuse at load. */
    rt_cluster_opts_t o = {
        .model_path = g_badkv, .bin_dir = g_bin, .runtime_dir = g_dir, .n_workers = 1,
        .n_threads = 1, .n_slots = 1, .n_ctx_slot = 64, .n_batch = 8, .kv_type = WK_KV_Q8_0};
    rt_cluster_t *c;
    bl_err_t err = {0};
    assert_int_equal(rt_cluster_create(&c, &o, &err), 0);
    assert_int_equal(rt_cluster_wait(c, 60000), RT_CLUSTER_FAILED);
    char why[1024];
    rt_cluster_error(c, why, sizeof why);
    if (!strstr(why, "worker 0"))
        fail_msg("error '%s' does not name worker 0", why);
    const float *lg;
    int32_t t = 1;
    rt_step_seq_t s = {.slot = 0, .n = 1, .pos = 0, .n_out = 1, .tokens = &t};
    assert_int_equal(rt_cluster_step(c, &s, 1, &lg, &err), BL_EAGAIN);
    rt_cluster_destroy(c);
    assert_no_children();

    /* A program missing from bin_dir is refused at create. */
    o.model_path = g_moe;
    o.bin_dir = g_dir;
    assert_int_equal(rt_cluster_create(&c, &o, &err), BL_ENOENT);
    assert_non_null(strstr(err.msg, "bloomery-worker"));

    /* A negative step timeout is refused by name. */
    o.bin_dir = g_bin;
    o.kv_type = WK_KV_F16;
    o.step_timeout_ms = -1;
    assert_int_equal(rt_cluster_create(&c, &o, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "step timeout"));

    /* So is a stage's own thread count past a worker's pool. */
    o.step_timeout_ms = 0;
    o.stage_threads[0] = 257;
    assert_int_equal(rt_cluster_create(&c, &o, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "stage 0's threads 257"));

    /* A layer both the hosttier's and a tier's, a tier past the count, too many tiers. */
    o.stage_threads[0] = 0;
    o.n_tiers = 1;
    o.tier_device[0] = 1;
    o.host_layers[3] = o.tier_layers[3] = 1;
    assert_int_equal(rt_cluster_create(&c, &o, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "layer 3's tier 1 of 1, and the hosttier's too"));
    o.host_layers[3] = 0;
    o.tier_layers[3] = 2;
    assert_int_equal(rt_cluster_create(&c, &o, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "layer 3's tier 2 of 1"));
    o.n_tiers = RT_CLUSTER_MAX_TIERS + 1;
    assert_int_equal(rt_cluster_create(&c, &o, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "expert tiers"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cluster_one_worker_matches_in_process),
        cmocka_unit_test(test_cluster_two_workers_match_in_process),
        cmocka_unit_test(test_cluster_three_workers_match_in_process),
        cmocka_unit_test(test_cluster_experts_placed_by_layer),
        cmocka_unit_test(test_cluster_experts_on_a_tier),
        cmocka_unit_test(test_cluster_dense_model_runs_without_hosttier),
        cmocka_unit_test(test_cluster_refuses_bad_steps),
        cmocka_unit_test(test_cluster_kill_worker_between_steps),
        cmocka_unit_test(test_cluster_kill_hosttier_between_steps),
        cmocka_unit_test(test_cluster_kill_worker_during_steps),
        cmocka_unit_test(test_cluster_death_while_idle_spares_new_steps),
        cmocka_unit_test(test_cluster_kill_hosttier_during_steps),
        cmocka_unit_test(test_cluster_load_failure_names_the_child),
        cmocka_unit_test(test_cluster_plans_of_two_at_once),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
