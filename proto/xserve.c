/* The experts rings' serving loop (xserve.h). */
#include "xserve.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "child.h"
#include "log.h"

#define POLL_US 100000

int bp_xserve_init(bp_xserve_t *x, bl_err_t *err)
{
    const size_t nb = (size_t)(x->lim.n_batch > 0 ? x->lim.n_batch : 1);
    const size_t k = (size_t)(x->lim.n_expert_used > 0 ? x->lim.n_expert_used : 1);
    x->ids = calloc(nb * k, sizeof *x->ids);
    x->counts = calloc(nb, sizeof *x->counts);
    if (!x->ids || !x->counts)
        return bl_err_set(err, BL_ENOMEM, "%s: out of memory for %zu rows' expert ids", x->who, nb);
    return 0;
}

int bp_xserve_attach(bp_xserve_t *x, int n_pairs, bl_err_t *err)
{
    x->n_pairs = n_pairs;
    x->req = calloc((size_t)(n_pairs > 0 ? n_pairs : 1), sizeof *x->req);
    x->rep = calloc((size_t)(n_pairs > 0 ? n_pairs : 1), sizeof *x->rep);
    if (!x->req || !x->rep)
        return bl_err_set(err, BL_ENOMEM, "%s: out of memory for %d ring pairs", x->who, n_pairs);
    for (int i = 0; i < n_pairs; i++) {
        const int fd_req = BP_STEP_FD_HOSTTIER_BASE + 2 * i, fd_rep = fd_req + 1;
        int rc = bp_ring_attach_fd(&x->req[i], fd_req, "experts-req", BP_RING_CONSUMER, err);
        close(fd_req); /* the handle holds its own dup */
        if (rc == 0)
            rc = bp_ring_attach_fd(&x->rep[i], fd_rep, "experts-rep", BP_RING_PRODUCER, err);
        close(fd_rep);
        if (rc)
            return rc;
    }
    return 0;
}

int bp_xserve_stats(bp_xserve_t *x, bp_counter_t *out, int cap)
{
    if (cap < 3)
        return 0;
    out[0] = (bp_counter_t){"expert_calls", atomic_load(&x->n_calls)};
    out[1] = (bp_counter_t){"expert_rows", atomic_load(&x->n_rows)};
    out[2] = (bp_counter_t){"errors", atomic_load(&x->n_errors)};
    return 3;
}

void bp_xserve_free(bp_xserve_t *x)
{
    for (int i = 0; i < x->n_pairs; i++) {
        bp_ring_destroy(x->req ? x->req[i] : NULL);
        bp_ring_destroy(x->rep ? x->rep[i] : NULL);
    }
    free(x->req);
    free(x->rep);
    free(x->ids);
    free(x->counts);
    x->req = x->rep = NULL;
    x->ids = x->counts = NULL;
    x->n_pairs = 0;
}

static void reply_error(bp_xserve_t *x, int i, uint64_t call, int code, const char *why)
{
    char text[BP_STEP_MAX_TEXT];
    bl_err_t e2;
    snprintf(text, sizeof text, "%s: %s", x->who, why);
    atomic_fetch_add_explicit(&x->n_errors, 1, memory_order_relaxed);
    if (bp_step_push_error(x->rep[i], call, code, text, POLL_US * 10, &e2) != 0)
        BL_LOG(BL_LOG_WARN, "event=reply_lost worker=%d reason=\"%s\"", i, e2.msg);
}

/* One request of stage i: its experts computed straight into the reply. */
static void serve(bp_xserve_t *x, int i, const void *msg, size_t nbytes)
{
    bl_err_t err = {0};
    bp_step_in_t in = {.ids = x->ids, .counts = x->counts};
    int rc = bp_step_parse(msg, nbytes, &x->lim, BP_STEP_EXPERTS, BP_STEP_ANY, &in, &err);
    if (rc || in.hdr.kind == BP_STEP_ERROR) {
        reply_error(x, i, in.hdr.step, rc ? rc : BL_EPROTO, rc ? err.msg : "an error message is not a request");
        return;
    }
    bp_step_hdr_t rh = {.kind = BP_STEP_SUMS, .step = in.hdr.step, .n_rows = in.hdr.n_rows,
                        .width = x->lim.n_embd, .layer = in.hdr.layer};
    bp_step_out_t o;
    for (;;) {
        rc = bp_step_reserve(x->rep[i], &rh, &o, POLL_US, &err);
        if (rc != BL_ETIMEDOUT || atomic_load_explicit(x->stop, memory_order_relaxed))
            break;
    }
    if (rc == 0)
        rc = x->fn(x->ctx, in.hdr.layer, in.rows, in.hdr.n_rows, x->counts, x->ids, in.wts, o.rows, &err);
    if (rc == 0 && (rc = bp_ring_commit(x->rep[i], o.nbytes, &err)) == 0) {
        atomic_fetch_add_explicit(&x->n_calls, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&x->n_rows, (uint64_t)in.hdr.n_rows, memory_order_relaxed);
        return;
    }
    reply_error(x, i, in.hdr.step, rc, err.msg);
}

/* Serves ring i if it holds a request; 1 if it did, 0 if empty, -1 if the ring ended. */
static int try_ring(bp_xserve_t *x, int i, int64_t wait_us)
{
    const void *msg;
    size_t nbytes;
    bl_err_t err = {0};
    int rc = bp_ring_peek(x->req[i], &msg, &nbytes, wait_us, &err);
    if (rc == BL_EAGAIN || rc == BL_ETIMEDOUT)
        return 0;
    if (rc) {
        if (rc != BL_ECLOSED)
            BL_LOG(BL_LOG_ERROR, "event=ring_broken worker=%d reason=\"%s\"", i, err.msg);
        return -1;
    }
    serve(x, i, msg, nbytes);
    bp_ring_release(x->req[i]);
    return 1;
}

void *bp_xserve_main(void *arg)
{
    bp_xserve_t *x = arg;
    uint64_t last_us = bp_now_us();
    while (!atomic_load_explicit(x->stop, memory_order_relaxed)) {
        if (x->n_pairs == 1) { /* one ring: its doorbell does the waiting */
            if (try_ring(x, 0, POLL_US) < 0)
                break;
            continue;
        }
        int busy = bp_now_us() - last_us < BP_XSERVE_BUSY_US, served = 0;
        for (int i = 0; i < x->n_pairs; i++) {
            int r = try_ring(x, i, busy ? 0 : BP_XSERVE_PARK_US);
            if (r < 0)
                goto out;
            served |= r;
        }
        if (served)
            last_us = bp_now_us();
    }
out:
    atomic_store_explicit(x->stop, 1, memory_order_relaxed);
    return NULL;
}
