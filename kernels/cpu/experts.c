/* The routed experts of a MoE layer over the kernels' products (kcpu.h). */
#include <stdlib.h>
#include <string.h>

#include "kcpu.h"

/* Most experts one call's rows may use for the grouped pass: a job list of gate and
 * up per expert must fit kcpu_matmul_many. */
#define GROUP_MAX (KCPU_MM_MAX_JOBS / 2)

struct kcpu_experts_scratch {
    int64_t max_rows, max_k;
    int64_t *at;   // (max_rows) where each row's pairs start
    int32_t *rows; // (max_rows * max_k) rows routed to each expert, expert by expert
    float *rw;     // (max_rows * max_k) and their weights
    float *xg;     // (max_rows, n_embd) rows gathered (the expert-by-expert pass)
    float *g, *u;  // (max_rows * max_k, n_ff) gate (then the SwiGLU output) and up
    float *dg;     // (max_rows * max_k, n_embd) down
    kcpu_mat_t gate[GROUP_MAX], up[GROUP_MAX], down[GROUP_MAX];
    kcpu_mm_job_t job[2 * GROUP_MAX];
    int64_t job_at[GROUP_MAX], job_n[GROUP_MAX], job_x[GROUP_MAX];
};

void kcpu_experts_scratch_destroy(kcpu_experts_scratch_t *s)
{
    if (!s)
        return;
    free(s->at);
    free(s->rows);
    free(s->rw);
    free(s->xg);
    free(s->g);
    free(s->u);
    free(s->dg);
    free(s);
}

int kcpu_experts_scratch_create(kcpu_experts_scratch_t **out, int64_t max_rows, int64_t max_k, int64_t n_embd,
                                int64_t n_ff, bl_err_t *err)
{
    *out = NULL;
    if (max_rows < 1 || max_k < 1 || n_embd < 1 || n_ff < 1 || max_rows > (1 << 20) || max_k > 4096)
        return bl_err_set(err, BL_EINVAL, "expert scratch for %lld rows of %lld experts", (long long)max_rows,
                          (long long)max_k);
    kcpu_experts_scratch_t *s = calloc(1, sizeof *s);
    if (!s)
        return bl_err_set(err, BL_ENOMEM, "out of memory for the expert scratch");
    const size_t R = (size_t)max_rows, P = R * (size_t)max_k;
    s->max_rows = max_rows;
    s->max_k = max_k;
    s->at = malloc(sizeof *s->at * R);
    s->rows = malloc(sizeof *s->rows * P);
    s->rw = malloc(sizeof *s->rw * P);
    s->xg = malloc(sizeof(float) * R * (size_t)n_embd);
    s->g = malloc(sizeof(float) * P * (size_t)n_ff);
    s->u = malloc(sizeof(float) * P * (size_t)n_ff);
    s->dg = malloc(sizeof(float) * P * (size_t)n_embd);
    if (!s->at || !s->rows || !s->rw || !s->xg || !s->g || !s->u || !s->dg) {
        kcpu_experts_scratch_destroy(s);
        return bl_err_set(err, BL_ENOMEM, "out of memory for the expert scratch (%lld rows)", (long long)max_rows);
    }
    *out = s;
    return 0;
}

typedef struct scatter_args {
    const kcpu_experts_scratch_t *s;
    int64_t total, E;
    float *out;
} scatter_args_t;

/* Columns [lo, hi) of every pair's weighted down row added onto its output row, in
 * pair order: each element sums in the same order whatever the columns' split. */
static void scatter_cols(void *p, int64_t lo, int64_t hi)
{
    const scatter_args_t *a = p;
    for (int64_t i = 0; i < a->total; i++) {
        float *o = a->out + (int64_t)a->s->rows[i] * a->E;
        const float *d = a->s->dg + i * a->E;
        const float w = a->s->rw[i];
        for (int64_t j = lo; j < hi; j++)
            o[j] += w * d[j];
    }
}

/* Products (pairs times columns) the scatter runs on this thread below. */
#define SCATTER_PAR_ELEMS 65536

/* out[rows[i]] += rw[i] * dg row i for the total pairs of s, split over columns. */
static void scatter(kcpu_ctx_t *c, const kcpu_experts_scratch_t *s, int64_t total, int64_t E, float *out)
{
    scatter_args_t a = {s, total, E, out};
    kcpu_parallel_for(c, E, total * E >= SCATTER_PAR_ELEMS ? 0 : E + 1, scatter_cols, &a);
}

/* Expert x's three matrices: slices of the stacks, or its own slices. */
static void expert_mats(const kcpu_experts_t *e, int64_t x, kcpu_mat_t *gate, kcpu_mat_t *up, kcpu_mat_t *down)
{
    const int64_t E = e->n_embd, F = e->n_ff;
    *gate = kcpu_mat_rows(&e->gate, x * F, F);
    *up = kcpu_mat_rows(&e->up, x * F, F);
    *down = kcpu_mat_rows(&e->down, x * E, E);
    if (e->slices) {
        gate->data = e->slices[3 * x];
        up->data = e->slices[3 * x + 1];
        down->data = e->slices[3 * x + 2];
    }
}

/* Adds expert x's bias rows b (width w) to m rows of y (w apart); b NULL: none. */
static void add_bias(float *y, int64_t m, const float *b, int64_t x, int64_t w)
{
    if (!b)
        return;
    for (int64_t r = 0; r < m; r++)
        for (int64_t j = 0; j < w; j++)
            y[r * w + j] += b[x * w + j];
}

/* y = the experts' activation of g and u over n elements. */
static void activate(kcpu_ctx_t *c, const kcpu_experts_t *e, float *y, const float *g, const float *u, int64_t n)
{
    if (e->act == KCPU_ACT_SWIGLU_OAI)
        kcpu_swiglu_oai(c, y, g, u, n);
    else
        kcpu_swiglu(c, y, g, u, n);
}

void kcpu_experts(kcpu_ctx_t *c, kcpu_experts_scratch_t *s, const kcpu_experts_t *e, const float *xn, int64_t n,
                  const int32_t *counts, int64_t k, const int32_t *ids, const float *wts, float *out)
{
    kcpu_experts_range(c, s, e, xn, n, counts, k, ids, wts, out, 0, e->n_expert, 0);
}

void kcpu_experts_range(kcpu_ctx_t *c, kcpu_experts_scratch_t *s, const kcpu_experts_t *e, const float *xn,
                        int64_t n, const int32_t *counts, int64_t k, const int32_t *ids, const float *wts,
                        float *out, int64_t x_lo, int64_t x_hi, int accumulate)
{
    const int64_t E = e->n_embd, F = e->n_ff;
    if (x_lo < 0)
        x_lo = 0;
    if (x_hi > e->n_expert)
        x_hi = e->n_expert;
    if (!accumulate)
        memset(out, 0, sizeof(float) * (size_t)(n * E));
    for (int64_t r = 0, a = 0; r < n; r++) {
        s->at[r] = a;
        a += counts ? counts[r] : k;
    }
#define CNT(r) (counts ? (int64_t)counts[r] : k)
    if (e->n_expert <= GROUP_MAX) {
        int64_t total = 0;
        int ne = 0;
        for (int64_t x = x_lo; x < x_hi; x++) {
            int64_t m = 0;
            for (int64_t r = 0; r < n; r++)
                for (int64_t j = s->at[r]; j < s->at[r] + CNT(r); j++)
                    if (ids[j] == x) {
                        s->rows[total + m] = (int32_t)r;
                        s->rw[total + m] = wts[j];
                        m++;
                    }
            if (m == 0)
                continue;
            expert_mats(e, x, &s->gate[ne], &s->up[ne], &s->down[ne]);
            s->job[2 * ne] = (kcpu_mm_job_t){.w = &s->gate[ne], .x = xn, .nx = n, .rows = s->rows + total, .n = m,
                                             .y = s->g + total * F};
            s->job[2 * ne + 1] = (kcpu_mm_job_t){.w = &s->up[ne], .x = xn, .nx = n, .rows = s->rows + total,
                                                 .n = m, .y = s->u + total * F};
            s->job_at[ne] = total;
            s->job_n[ne] = m;
            s->job_x[ne] = x;
            total += m;
            ne++;
        }
        kcpu_matmul_many(c, s->job, 2 * ne);
        for (int i = 0; i < ne; i++) {
            add_bias(s->g + s->job_at[i] * F, s->job_n[i], e->gate_b, s->job_x[i], F);
            add_bias(s->u + s->job_at[i] * F, s->job_n[i], e->up_b, s->job_x[i], F);
        }
        activate(c, e, s->g, s->g, s->u, total * F);
        for (int i = 0; i < ne; i++)
            s->job[i] = (kcpu_mm_job_t){.w = &s->down[i], .x = s->g + s->job_at[i] * F, .n = s->job_n[i],
                                        .y = s->dg + s->job_at[i] * E};
        kcpu_matmul_many(c, s->job, ne);
        for (int i = 0; i < ne; i++)
            add_bias(s->dg + s->job_at[i] * E, s->job_n[i], e->down_b, s->job_x[i], E);
        scatter(c, s, total, E, out);
        return;
    }
    for (int64_t x = x_lo; x < x_hi; x++) {
        int64_t m = 0;
        for (int64_t r = 0; r < n; r++)
            for (int64_t j = s->at[r]; j < s->at[r] + CNT(r); j++)
                if (ids[j] == x) {
                    s->rows[m] = (int32_t)r;
                    s->rw[m] = wts[j];
                    memcpy(s->xg + m * E, xn + r * E, sizeof(float) * (size_t)E);
                    m++;
                }
        if (m == 0)
            continue;
        kcpu_mat_t gate, up, down;
        expert_mats(e, x, &gate, &up, &down);
        kcpu_matmul(c, &gate, s->xg, m, s->g);
        kcpu_matmul(c, &up, s->xg, m, s->u);
        add_bias(s->g, m, e->gate_b, x, F);
        add_bias(s->u, m, e->up_b, x, F);
        activate(c, e, s->g, s->g, s->u, m * F);
        kcpu_matmul(c, &down, s->g, m, s->dg);
        add_bias(s->dg, m, e->down_b, x, E);
        scatter(c, s, m, E, out);
    }
#undef CNT
}

int kcpu_experts_check(int64_t n_expert, int64_t k, int64_t n, const int32_t *counts, const int32_t *ids,
                       bl_err_t *err)
{
    for (int64_t r = 0, at = 0; r < n; r++) {
        const int64_t m = counts ? counts[r] : k;
        if (m < 1 || m > k)
            return bl_err_set(err, BL_EINVAL, "row %lld: %lld experts, outside 1..%lld", (long long)r, (long long)m,
                              (long long)k);
        for (int64_t i = at; i < at + m; i++)
            if (ids[i] < 0 || ids[i] >= n_expert)
                return bl_err_set(err, BL_EINVAL, "row %lld: expert id %d, outside 0..%lld", (long long)r, ids[i],
                                  (long long)(n_expert - 1));
        at += m;
    }
    return 0;
}
