/* The hosttier's expert store (store.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "gguf.h"
#include "kcpu.h"
#include "store.h"
#include "wmem.h"

struct ht_store {
    bl_gguf_t *g;
    bl_arch_t a;
    char path[256];
    int64_t n_batch;
    uint8_t *held;          /* (n_layer) */
    kcpu_experts_t *layers; /* (n_layer): views into the copy (or the mapping) */
    uint8_t *copy;          /* anonymous memory holding the experts, or NULL */
    size_t copy_len;
    uint64_t bytes;
    kcpu_ctx_t *kc;
    kcpu_experts_scratch_t *xs;
};

void ht_store_close(ht_store_t *s)
{
    if (!s)
        return;
    kcpu_experts_scratch_destroy(s->xs);
    kcpu_ctx_destroy(s->kc);
    if (s->copy)
        munmap(s->copy, s->copy_len);
    free(s->layers);
    free(s->held);
    bl_gguf_close(s->g);
    free(s);
}

const bl_arch_t *ht_store_arch(const ht_store_t *s) { return &s->a; }
const char *ht_store_kernels(const ht_store_t *s)
{
    (void)s;
    return kcpu_variant_name();
}
uint64_t ht_store_bytes(const ht_store_t *s) { return s->bytes; }

/* The three expert tensors of layer l, checked. */
static int find_layer(ht_store_t *s, int64_t l, const bl_gguf_tensor_t *t[3], bl_err_t *err)
{
    const bl_arch_t *a = &s->a;
    static const char *const names[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    for (int i = 0; i < 3; i++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%lld.%s.weight", (long long)l, names[i]);
        const int64_t ne0 = i < 2 ? a->n_embd : a->n_ff_exp, ne1 = i < 2 ? a->n_ff_exp : a->n_embd;
        int rc = bl_arch_tensor(s->g, s->path, name, ne0, ne1, a->n_expert, 0, &t[i], err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int ht_store_open(ht_store_t **out, const ht_store_opts_t *o, bl_err_t *err)
{
    *out = NULL;
    if (!o->path || o->n_threads < 1 || o->n_threads > 256 || o->n_batch < 1 || o->n_batch > 65536)
        return bl_err_set(err, BL_EINVAL, "expert store: %d threads, %lld rows per call", o->n_threads,
                          (long long)o->n_batch);
    ht_store_t *s = calloc(1, sizeof *s);
    if (!s)
        return bl_err_set(err, BL_ENOMEM, "out of memory for the expert store");
    snprintf(s->path, sizeof s->path, "%s", o->path);
    s->n_batch = o->n_batch;
    int rc = bl_gguf_open(&s->g, o->path, err);
    if (rc == 0)
        rc = bl_arch_read(&s->a, s->g, s->path, err);
    const bl_arch_t *a = &s->a;
    if (rc == 0 && !a->moe)
        rc = bl_err_set(err, BL_EINVAL, "%s: a dense model has no routed experts", s->path);
    if (rc < 0)
        goto fail;
    s->held = calloc((size_t)a->n_layer, 1);
    s->layers = calloc((size_t)a->n_layer, sizeof *s->layers);
    if (!s->held || !s->layers) {
        rc = bl_err_set(err, BL_ENOMEM, "out of memory for %lld layers", (long long)a->n_layer);
        goto fail;
    }
    /* the held layers' tensors, checked, viewed where the file maps them */
    uint64_t total = 0;
    for (int64_t l = 0; l < a->n_layer; l++) {
        s->held[l] = o->layers ? o->layers[l] != 0 : 1;
        const bl_gguf_tensor_t *t[3];
        if (!s->held[l])
            continue;
        if ((rc = find_layer(s, l, t, err)) < 0)
            goto fail;
        kcpu_mat_t *m[3] = {&s->layers[l].gate, &s->layers[l].up, &s->layers[l].down};
        for (int i = 0; i < 3; i++) {
            const int64_t ncols = i < 2 ? a->n_embd : a->n_ff_exp, nrows = (i < 2 ? a->n_ff_exp : a->n_embd) * a->n_expert;
            if ((rc = kcpu_mat_init(m[i], t[i]->data, t[i]->type, ncols, nrows, err)) < 0)
                goto fail;
            total += (t[i]->nbytes + 63) & ~(uint64_t)63;
            s->bytes += t[i]->nbytes;
        }
        s->layers[l].n_expert = a->n_expert;
        s->layers[l].n_ff = a->n_ff_exp;
        s->layers[l].n_embd = a->n_embd;
    }
    /* then into huge pages where they fit (common/wmem.h) */
    s->copy = bl_wmem_alloc(total, o->no_mmap, &s->copy_len);
    size_t used = 0;
    bl_wmem_job_t *jobs = s->copy ? calloc((size_t)a->n_layer * 3, sizeof *jobs) : NULL;
    size_t n_jobs = 0;
    for (int64_t l = 0; jobs && l < a->n_layer; l++) {
        kcpu_mat_t *m[3] = {&s->layers[l].gate, &s->layers[l].up, &s->layers[l].down};
        for (int i = 0; s->held[l] && i < 3; i++) {
            const size_t nbytes = m[i]->row_bytes * (size_t)m[i]->nrows;
            jobs[n_jobs++] = (bl_wmem_job_t){s->copy + used, m[i]->data, nbytes};
            m[i]->data = s->copy + used;
            used += (nbytes + 63) & ~(size_t)63;
        }
    }
    if (s->copy && !jobs) { /* no memory for the list: the file mapping it is */
        munmap(s->copy, s->copy_len);
        s->copy = NULL;
        s->copy_len = 0;
    }
    bl_wmem_copy_many(jobs, n_jobs, o->n_threads); /* several threads: the first touches dominate */
    free(jobs);
    if (o->mlock)
        bl_wmem_lock(s->copy, used, s->g);
    const int64_t cols = a->n_embd > a->n_ff_exp ? a->n_embd : a->n_ff_exp;
    const kcpu_limits_t lim = {.max_cols = cols, .max_batch = o->n_batch, .max_ctx = 1, .head_dim = a->head_dim};
    if ((rc = kcpu_ctx_create(&s->kc, o->n_threads, KCPU_FAST16, &lim, err)) == 0)
        kcpu_ctx_set_poll(s->kc, o->poll);
    if (rc == 0 && o->cpu_strict)
        rc = kcpu_ctx_pin_strict(s->kc, err);
    if (rc < 0 ||
        (rc = kcpu_experts_scratch_create(&s->xs, o->n_batch, a->n_expert_used, a->n_embd, a->n_ff_exp, err)) < 0)
        goto fail;
    *out = s;
    return 0;
fail:
    ht_store_close(s);
    return rc;
}

int ht_store_experts(ht_store_t *s, int64_t layer, const float *xn, int64_t n, const int32_t *counts,
                     const int32_t *ids, const float *wts, float *out, bl_err_t *err)
{
    const bl_arch_t *a = &s->a;
    if (layer < 0 || layer >= a->n_layer || !s->held[layer])
        return bl_err_set(err, BL_EINVAL, "experts of layer %lld: this store does not hold them", (long long)layer);
    if (n < 1 || n > s->n_batch)
        return bl_err_set(err, BL_ERANGE, "%lld expert rows, outside 1..%lld", (long long)n, (long long)s->n_batch);
    if (!xn || !ids || !wts || !out)
        return bl_err_set(err, BL_EINVAL, "experts: a NULL buffer");
    const int rc = kcpu_experts_check(a->n_expert, a->n_expert_used, n, counts, ids, err);
    if (rc < 0)
        return rc;
    kcpu_experts(s->kc, s->xs, &s->layers[layer], xn, n, counts, a->n_expert_used, ids, wts, out);
    return 0;
}
