/* The answer views of router/cluster.h (rt_cluster_step_view, _recv_view,
 * rt_cluster_view_end) over a fake cluster's own rt_cluster_step and
 * rt_cluster_step_recv: the fake's logits stay where its step left them until
 * view_end. Included once by each fake (tests/unit/test_router_engine.c,
 * tests/fuzz/fuzz_app.c), after its step functions. */
#ifndef BLOOMERY_TESTS_FAKE_VIEW_H
#define BLOOMERY_TESTS_FAKE_VIEW_H

#include "cluster.h"

static const float *fk_view;

int rt_cluster_step_view(rt_cluster_t *c, const rt_step_seq_t *seqs, int n_seqs, const float **view,
                         bl_err_t *err)
{
    int rc = rt_cluster_step(c, seqs, n_seqs, view, err);
    fk_view = rc ? NULL : *view;
    return rc;
}

int rt_cluster_step_recv_view(rt_cluster_t *c, const float **view, bl_err_t *err)
{
    int rc = rt_cluster_step_recv(c, view, err);
    fk_view = rc ? NULL : *view;
    return rc;
}

const float *rt_cluster_view_end(rt_cluster_t *c, int keep)
{
    (void)c;
    const float *v = fk_view;
    fk_view = NULL;
    return keep ? v : NULL;
}

#endif
