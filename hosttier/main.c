/* bloomery-hosttier: the routed experts in host RAM. Started by the router with one
 * ring pair per worker at known fds (proto/step.h); it says Hello, takes the Plan,
 * loads only the experts' weights, reports Ready, then its ring thread serves every
 * worker (proto/xserve.h): pop rows, compute their experts (store.c), push the sums.
 * With --stage I (a node's hosttier, beside a stage of another host than the
 * router's: docs/deploy.md) it serves that one stage: a single ring pair, the host-RAM
 * experts of that stage's layers only, all of them in RAM (--experts-ram is the
 * router's host's budget).
 * The main thread is the control thread and owns the ZeroMQ socket. A bad request is
 * answered with an error message on that worker's ring, never an exit. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "bl_config.h"
#include "chan.h"
#include "child.h"
#include "log.h"
#include "step.h"
#include "store.h"
#include "xserve.h"

/* The hosttier. The ring thread owns the rings (xs); the control thread owns ctl. */
typedef struct hosttier {
    bp_child_t ctl;   /* control plane */
    ht_store_t *store;
    int n_threads;    /* the expert pool's: -t, else the plan's */
    bp_xserve_t xs;
    _Atomic int stop; /* set by either thread, polled by both */
} hosttier_t;

static int store_experts(void *ctx, int32_t layer, const float *rows, int32_t n, const int32_t *counts,
                         const int32_t *ids, const float *wts, float *out, bl_err_t *err)
{
    return ht_store_experts(ctx, layer, rows, n, counts, ids, wts, out, err);
}

/* ------------------------------------------------------------ control plane */

/* The disk tier's slots read for the first time ("fill"; the experts copied into RAM
 * are bp_child_copy_progress's "experts"); ud: the control channel's bp_child_t. */
static void on_fill_progress(void *ud, uint64_t done, uint64_t total)
{
    if (total)
        bp_child_progress(ud, done, total, "fill");
}

/* stage: -1 (every stage's pair, the layers the Plan puts in host RAM), or the one
 * stage this hosttier serves (its pair first, its layers only). */
static int load(hosttier_t *h, const bp_plan_t *p, int n_threads, int stage, bl_err_t *err)
{
    if (p->n_batch > 65536 || p->threads > 256 || p->n_stages > 64 || p->poll > 100)
        return bl_err_set(err, BL_EINVAL, "plan: n_batch %u, threads %u, %zu stages or poll %u out of "
                          "range", p->n_batch, p->threads, (size_t)p->n_stages, p->poll);
    if (stage >= (int)p->n_stages)
        return bl_err_set(err, BL_EINVAL, "--stage %d: the plan has %zu stages", stage, (size_t)p->n_stages);
    h->ctl.process = p->you;
    bp_xserve_t *x = &h->xs;
    x->who = "hosttier";
    x->stop = &h->stop;
    x->fn = store_experts;
    int rc = bp_xserve_attach(x, stage >= 0 ? 1 : (int)p->n_stages, err);
    if (rc)
        return rc;
    /* a stage's own: the host-RAM layers of its range */
    static uint8_t mine[BP_PLAN_MAX_LAYERS];
    const uint8_t *layers = p->host;
    if (stage >= 0) {
        memset(mine, 0, sizeof mine);
        const bp_plan_stage_t *st = &p->stages[stage];
        for (uint32_t l = st->layer_begin; l < st->layer_end && l < p->n_layers; l++)
            mine[l] = p->host[l];
        layers = mine;
    }
    struct stat sb;
    uint64_t total = stat(p->model_path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    /* only the layers the placements put in host RAM */
    const int64_t n_batch = p->n_batch ? p->n_batch : 512;
    h->ctl.copy_stage = "experts"; /* the experts copied into RAM */
    h->n_threads = n_threads > 0 ? n_threads : (p->threads ? (int)p->threads : 1);
    const ht_store_opts_t so = {.path = p->model_path, .layers = layers, .n_threads = h->n_threads,
                                .n_batch = n_batch, .no_mmap = p->no_mmap, .mlock = p->mlock,
                                .poll = (int)p->poll, .cpu_strict = p->cpu_strict,
                                .ram_bytes = stage >= 0 ? 0 : (uint64_t)p->experts_ram, .read_ahead = -1,
                                .progress = bp_child_copy_progress, .fill_progress = on_fill_progress,
                                .progress_ud = &h->ctl};
    if ((rc = ht_store_open(&h->store, &so, err)) != 0)
        return rc;
    const bl_arch_t *c = ht_store_arch(h->store);
    if ((uint64_t)c->n_layer != p->n_layers)
        return bl_err_set(err, BL_EINVAL, "plan: %u layers, the model has %lld", p->n_layers, (long long)c->n_layer);
    x->ctx = h->store;
    x->lim = (bp_step_limits_t){.n_slots = (int32_t)p->n_slots, .n_batch = (int32_t)n_batch,
                                .n_ctx = p->n_ctx, .n_embd = (int32_t)c->n_embd,
                                .n_vocab = (int32_t)c->n_vocab, .n_layer = (int32_t)c->n_layer,
                                .n_expert = (int32_t)c->n_expert,
                                .n_expert_used = (int32_t)c->n_expert_used};
    if ((rc = bp_xserve_init(x, err)) != 0)
        return rc;
    bp_child_copy_done(&h->ctl, total);
    return 0;
}

static int hosttier_stats(void *ud, bp_counter_t *out, int cap)
{
    hosttier_t *h = ud;
    if (cap < 10)
        return 0;
    bp_xserve_stats(&h->xs, out, cap);
    ht_store_pager_stats_t ps;
    if (!h->store) /* the control loop starts after the load */
        return 3;
    ht_store_pager_stats(h->store, &ps);
    if (!ps.paged)
        return 3;
    out[3] = (bp_counter_t){"disk_expert_slots", (uint64_t)ps.slots};
    out[4] = (bp_counter_t){"disk_expert_hits", ps.hits};
    out[5] = (bp_counter_t){"disk_expert_reads", ps.misses};
    out[6] = (bp_counter_t){"disk_read_bytes", ps.bytes_read};
    out[7] = (bp_counter_t){"disk_read_us", ps.read_ns / 1000};
    out[8] = (bp_counter_t){"disk_ahead_reads", ps.ahead_reads};
    out[9] = (bp_counter_t){"disk_ahead_used", ps.ahead_used};
    return 10;
}

static void hosttier_free(hosttier_t *h)
{
    bp_xserve_free(&h->xs);
    ht_store_close(h->store);
    bp_child_stop(&h->ctl);
}

int main(int argc, char **argv)
{
    const char *endpoint = NULL, *identity = "hosttier", *name = "hosttier";
    int64_t parent = 0, n_threads = 0, stage = -1;
    int verbose = 0, quiet = 0, help = 0, colors = 0;
    int64_t verbosity = -1;
    bl_arg_t args[] = {
        {"--control", NULL, BL_ARG_STR, &endpoint, .metavar = "ENDPOINT", .help = "the router's control socket"},
        {"--identity", NULL, BL_ARG_STR, &identity, .metavar = "ID", .help = "routing id on the control socket"},
        {"--parent", NULL, BL_ARG_I64, &parent, 1, INT32_MAX, .metavar = "PID", .help = "the router's pid"},
        {"-t,--threads", NULL, BL_ARG_I64, &n_threads, 1, 256, .metavar = "N", .help = "expert pool threads (default: the plan's)"},
        {"--name", NULL, BL_ARG_STR, &name, .metavar = "NAME", .help = "this process in logs and errors (hosttier)"},
        {"--stage", NULL, BL_ARG_I64, &stage, 0, 63, .metavar = "I",
         .help = "serve stage I of the plan only, its ring pair the first (a node's hosttier)"},
        {"-v,--verbose", NULL, BL_ARG_FLAG, &verbose, .help = "log at DEBUG"},
        {"--log-disable", NULL, BL_ARG_FLAG, &quiet, .help = "write no log lines"},
        {"-lv,--verbosity", NULL, BL_ARG_I64, &verbosity, 0, 100, .metavar = "N", .help = "llama.cpp's log threshold: 1 error, 2 warning, 3 info, 4 debug"},
        {"--log-colors", NULL, BL_ARG_FLAG, &colors, .help = "colour the level names"},
    };
    int n_args = (int)(sizeof args / sizeof args[0]);
    bl_err_t err = {0};
    if (bl_args_parse(args, n_args, argc, argv, NULL, &help, &err)) {
        fprintf(stderr, "bloomery-hosttier: %s\n", err.msg);
        return 2;
    }
    if (help || !endpoint || !parent) {
        bl_args_usage(help ? stdout : stderr, "bloomery-hosttier",
                      "--control ENDPOINT --parent PID [options] (started by bloomery-serve)",
                      args, n_args);
        return help ? 0 : 2;
    }
    bl_log_init(name, quiet           ? BL_LOG_OFF
                    : verbosity >= 0 ? bl_log_level_of_verbosity(verbosity)
                    : verbose        ? BL_LOG_DEBUG
                                     : BL_LOG_INFO);
    bl_log_set_colors(colors);
    static hosttier_t h;
    int rc = bp_child_start(&h.ctl, endpoint, identity, (pid_t)parent, name, &err);
    if (rc) {
        BL_LOG(BL_LOG_ERROR, "event=start_failed reason=\"%s\"", err.msg);
        bp_child_stop(&h.ctl);
        return 1;
    }
    bp_child_hello(&h.ctl, BP_CHILD_HOSTTIER, "host RAM");
    bp_msg_t plan = {0};
    if ((rc = bp_child_recv_plan(&h.ctl, &plan, &err)) != 0) {
        bp_msg_free(&plan);
        hosttier_free(&h);
        return rc == BL_ECLOSED ? 0 : 1;
    }
    static bp_plan_t pl;
    rc = bp_plan_read(&plan, &pl, &err);
    if (rc == 0)
        rc = load(&h, &pl, (int)n_threads, (int)stage, &err);
    bp_msg_free(&plan);
    if (rc) {
        bp_child_fatal(&h.ctl, &err);
        hosttier_free(&h);
        return 1;
    }
    char kernels[BP_MSG_MAX_KERNELS + 1];
    snprintf(kernels, sizeof kernels, "CPU %s", ht_store_kernels(h.store));
    bp_child_ready(&h.ctl, 0, 0, 0, kernels);
    BL_LOG(BL_LOG_INFO, "event=ready workers=%d threads=%d kernels=%s", h.xs.n_pairs, h.n_threads,
           ht_store_kernels(h.store));

    pthread_t th;
    if (pthread_create(&th, NULL, bp_xserve_main, &h.xs) != 0) {
        bl_err_set(&err, BL_ENOMEM, "cannot start the ring thread");
        bp_child_fatal(&h.ctl, &err);
        hosttier_free(&h);
        return 1;
    }
    bp_child_control_loop(&h.ctl, &h.stop, hosttier_stats, &h);
    pthread_join(th, NULL);
    hosttier_free(&h);
    return 0;
}
