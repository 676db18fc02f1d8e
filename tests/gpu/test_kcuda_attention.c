/* GPU tests for kernels/cuda/attention.cu: the f16 cache store (bit for bit as
 * kcpu_kv_store) and flash-decoding attention against kcpu_attention on the scalar
 * reference kernels, for contexts shorter than one chunk, exactly a chunk, not a
 * multiple of it, several rows at once (each with its own causal end), GQA groups
 * from 1 to KCUDA_ATT_MAX_GROUP and every head size. TAP output; the seed is printed. */
#include "gpu_test.h"

#include "kcpu.h"
#include "quant.h"

/* window > 0 and sinks: gpt-oss's sliding layers and sinks (kcpu_attention_ext's
 * reference); then the prompt path's flash kernel too (kcuda_attention_prefill_ext,
 * head sizes 64 and 128, within its f16 rounding). */
static void case_attention_ext(rng_t *r, int64_t n, int64_t pos0, int64_t n_head, int64_t n_kv, int64_t hd,
                               int64_t window, int with_sinks)
{
    bl_err_t err = {0};
    const int64_t len = pos0 + n, kvw = n_kv * hd;
    const size_t rb = (size_t)kvw * 2;
    const float scale = (float)(1.0 / sqrt((double)hd));
    /* f32 rows of every position, stored as f16 by both sides */
    float *kf = xmalloc(sizeof(float) * (size_t)(len * kvw)), *vf = xmalloc(sizeof(float) * (size_t)(len * kvw));
    rand_fill(r, kf, len * kvw, 1.0f);
    rand_fill(r, vf, len * kvw, 1.0f);
    uint8_t *kc = xmalloc(rb * (size_t)len), *vc = xmalloc(rb * (size_t)len);
    uint8_t *kg = xmalloc(rb * (size_t)len), *vg = xmalloc(rb * (size_t)len);
    const kcpu_kv_view_t hv = {.k = kc, .v = vc, .type = BL_TYPE_F16, .row_bytes = rb};
    kcpu_kv_store(&hv, 0, kf, 0, len, kvw);
    kcpu_kv_store(&hv, 1, vf, 0, len, kvw);
    float *q = xmalloc(sizeof(float) * (size_t)(n * n_head * hd));
    rand_fill(r, q, n * n_head * hd, 1.0f);

    kcpu_ctx_t *c = NULL;
    const kcpu_limits_t lim = {.max_cols = hd, .max_batch = n, .max_ctx = len, .head_dim = hd};
    if (kcpu_ctx_create(&c, 1, KCPU_PRECISE, &lim, &err) < 0)
        bail("kcpu_ctx_create", &err);
    float *want = xmalloc(sizeof(float) * (size_t)(n * n_head * hd));
    float *sinks = xmalloc(sizeof(float) * (size_t)n_head);
    rand_fill(r, sinks, n_head, 3.0f);
    kcpu_attention_ext(c, &hv, q, want, n, pos0, n_head, n_kv, hd, scale, window, with_sinks ? sinks : NULL);
    kcpu_ctx_destroy(c);
    float *dsinks = d_upload(sinks, sizeof(float) * (size_t)n_head);
    const kcuda_att_ext_t ext = {.window = (int)window, .d_sinks = with_sinks ? dsinks : NULL};

    /* the card: store every position in two calls (a prefix, then the rest) */
    float *dkf = d_upload(kf, sizeof(float) * (size_t)(len * kvw));
    float *dvf = d_upload(vf, sizeof(float) * (size_t)(len * kvw));
    const kcuda_kv_view_t dv = {.k = d_poison(rb * (size_t)len), .v = d_poison(rb * (size_t)len), .row_bytes = rb};
    const int64_t cut = len / 2;
    int ok = (cut == 0 || kcuda_kv_store(&dv, dkf, dvf, kvw, 0, cut, kvw, NULL, &err) == 0) &&
             kcuda_kv_store(&dv, dkf + cut * kvw, dvf + cut * kvw, kvw, cut, len - cut, kvw, NULL, &err) == 0 &&
             d_fetch(kg, dv.k, rb * (size_t)len, &err) == 0 && d_fetch(vg, dv.v, rb * (size_t)len, &err) == 0;
    if (!ok)
        printf("#   %s\n", err.msg);
    else if (memcmp(kg, kc, rb * (size_t)len) != 0 || memcmp(vg, vc, rb * (size_t)len) != 0) {
        for (size_t i = 0; i < rb * (size_t)len / 2; i++)
            if (((uint16_t *)kg)[i] != ((uint16_t *)kc)[i] || ((uint16_t *)vg)[i] != ((uint16_t *)vc)[i]) {
                printf("#   first differing half at %zu: K %04x vs %04x, V %04x vs %04x\n", i,
                       ((uint16_t *)kg)[i], ((uint16_t *)kc)[i], ((uint16_t *)vg)[i], ((uint16_t *)vc)[i]);
                break;
            }
        ok = 0;
    }
    tap_ok(ok, "kv_store f16: %lld positions of %lld KV heads x %lld", (long long)len, (long long)n_kv,
           (long long)hd);

    const size_t sb = kcuda_attention_scratch_bytes(n, n_head, hd, len);
    void *ds = d_poison(sb);
    float *dq = d_upload(q, sizeof(float) * (size_t)(n * n_head * hd));
    float *dout = d_poison(sizeof(float) * (size_t)(n * n_head * hd));
    float *got = xmalloc(sizeof(float) * (size_t)(n * n_head * hd));
    ok = kcuda_attention(&dv, dq, dout, n, pos0, n_head, n_kv, hd, scale, &ext, ds, sb, NULL, &err) == 0 &&
         d_fetch(got, dout, sizeof(float) * (size_t)(n * n_head * hd), &err) == 0;
    if (!ok)
        printf("#   %s\n", err.msg);
    else {
        double *ref = xmalloc(sizeof(double) * (size_t)(n * n_head * hd));
        for (int64_t i = 0; i < n * n_head * hd; i++)
            ref[i] = want[i];
        ok = check_close(got, n_head * hd, ref, n, n_head * hd, 2e-5, 1e-4);
        free(ref);
    }
    tap_ok(ok, "attention: %lld row%s at %lld (context %lld), %lld heads over %lld KV heads, head_dim %lld%s%s",
           (long long)n, n == 1 ? "" : "s", (long long)pos0, (long long)len, (long long)n_head, (long long)n_kv,
           (long long)hd, window ? ", a window" : "", with_sinks ? ", sinks" : "");
    if ((window || with_sinks) && (hd == 64 || hd == 128)) {
        ok = kcuda_attention_prefill_ext(&dv, dq, dout, n, pos0, n_head, n_kv, hd, scale, &ext, NULL, &err) == 0 &&
             d_fetch(got, dout, sizeof(float) * (size_t)(n * n_head * hd), &err) == 0;
        if (!ok)
            printf("#   %s\n", err.msg);
        else {
            double *ref = xmalloc(sizeof(double) * (size_t)(n * n_head * hd));
            for (int64_t i = 0; i < n * n_head * hd; i++)
                ref[i] = want[i];
            ok = check_close(got, n_head * hd, ref, n, n_head * hd, 4e-3, 4e-3); /* f16 q and probabilities */
            free(ref);
        }
        tap_ok(ok, "prefill attention: %lld rows at %lld, window %lld%s", (long long)n, (long long)pos0,
               (long long)window, with_sinks ? ", sinks" : "");
    }
    kcuda_free(dsinks);
    free(sinks);

    kcuda_free(dkf); kcuda_free(dvf); kcuda_free(dv.k); kcuda_free(dv.v);
    kcuda_free(ds); kcuda_free(dq); kcuda_free(dout);
    free(kf); free(vf); free(kc); free(vc); free(kg); free(vg); free(q); free(want); free(got);
}

static void case_attention(rng_t *r, int64_t n, int64_t pos0, int64_t n_head, int64_t n_kv, int64_t hd)
{
    case_attention_ext(r, n, pos0, n_head, n_kv, hd, 0, 0);
}

/* The graph-friendly variants: n rows, each over its own cache (its own length, in
 * layer 1 of a 2-layer buffer so that the layer offset counts), positions and cache
 * addresses read from a rows table on the card; against kcpu_kv_store (bit for bit)
 * and kcpu_attention row by row. max_len bounds the grid, as a captured step does. */
static void case_rows_ext(rng_t *r, int64_t n, const int64_t *pos, int64_t n_head, int64_t n_kv, int64_t hd,
                          int64_t max_len, int64_t window, int with_sinks)
{
    bl_err_t err = {0};
    const int64_t kvw = n_kv * hd;
    const size_t rb = (size_t)kvw * 2;
    const float scale = (float)(1.0 / sqrt((double)hd));
    kcuda_kv_row_t rows[16];
    uint8_t *dcache[16];
    float *knew = xmalloc(sizeof(float) * (size_t)(n * kvw)), *vnew = xmalloc(sizeof(float) * (size_t)(n * kvw));
    float *q = xmalloc(sizeof(float) * (size_t)(n * n_head * hd));
    float *want = xmalloc(sizeof(float) * (size_t)(n * n_head * hd));
    rand_fill(r, knew, n * kvw, 1.0f);
    rand_fill(r, vnew, n * kvw, 1.0f);
    rand_fill(r, q, n * n_head * hd, 1.0f);
    float *sinks = xmalloc(sizeof(float) * (size_t)n_head);
    rand_fill(r, sinks, n_head, 3.0f);
    float *dsinks = d_upload(sinks, sizeof(float) * (size_t)n_head);
    const kcuda_att_ext_t ext = {.window = (int)window, .d_sinks = with_sinks ? dsinks : NULL};
    uint8_t *hk[16], *hv[16];
    int ok = 1;
    for (int64_t b = 0; b < n; b++) {
        const int64_t len = pos[b] + 1, cap = len + 3;
        const size_t plane = rb * (size_t)cap;
        float *kf = xmalloc(sizeof(float) * (size_t)(len * kvw)), *vf = xmalloc(sizeof(float) * (size_t)(len * kvw));
        rand_fill(r, kf, len * kvw, 1.0f);
        rand_fill(r, vf, len * kvw, 1.0f);
        memcpy(kf + pos[b] * kvw, knew + b * kvw, sizeof(float) * (size_t)kvw); /* the row's own K and V */
        memcpy(vf + pos[b] * kvw, vnew + b * kvw, sizeof(float) * (size_t)kvw);
        hk[b] = xmalloc(plane);
        hv[b] = xmalloc(plane);
        const kcpu_kv_view_t view = {.k = hk[b], .v = hv[b], .type = BL_TYPE_F16, .row_bytes = rb};
        kcpu_kv_store(&view, 0, kf, 0, len, kvw);
        kcpu_kv_store(&view, 1, vf, 0, len, kvw);
        kcpu_ctx_t *c = NULL;
        const kcpu_limits_t lim = {.max_cols = hd, .max_batch = 1, .max_ctx = len, .head_dim = hd};
        if (kcpu_ctx_create(&c, 1, KCPU_PRECISE, &lim, &err) < 0)
            bail("kcpu_ctx_create", &err);
        kcpu_attention_ext(c, &view, q + b * n_head * hd, want + b * n_head * hd, 1, pos[b], n_head, n_kv, hd, scale,
                           window, with_sinks ? sinks : NULL);
        kcpu_ctx_destroy(c);
        /* the card: 2 layers of (K, V) planes; layer 1 holds the positions before pos */
        dcache[b] = d_poison(4 * plane);
        ok &= kcuda_upload(dcache[b] + 2 * plane, hk[b], rb * (size_t)pos[b], NULL, &err) == 0 &&
              kcuda_upload(dcache[b] + 3 * plane, hv[b], rb * (size_t)pos[b], NULL, &err) == 0;
        rows[b] = (kcuda_kv_row_t){.k = (uint64_t)(uintptr_t)dcache[b], .layer_bytes = 2 * plane,
                                   .v_bytes = plane, .pos = (int32_t)pos[b]};
        free(kf);
        free(vf);
    }
    kcuda_kv_row_t *drows = d_upload(rows, sizeof(kcuda_kv_row_t) * (size_t)n);
    float *dk = d_upload(knew, sizeof(float) * (size_t)(n * kvw)), *dvv = d_upload(vnew, sizeof(float) * (size_t)(n * kvw));
    float *dq = d_upload(q, sizeof(float) * (size_t)(n * n_head * hd));
    float *dout = d_poison(sizeof(float) * (size_t)(n * n_head * hd));
    const size_t sb = kcuda_attention_scratch_bytes(n, n_head, hd, max_len);
    void *ds = d_poison(sb);
    float *got = xmalloc(sizeof(float) * (size_t)(n * n_head * hd));
    ok = ok && kcuda_kv_store_rows(drows, 1, rb, dk, dvv, kvw, n, kvw, NULL, &err) == 0 &&
         kcuda_attention_rows(drows, 1, rb, dq, dout, n, max_len, n_head, n_kv, hd, scale, &ext, ds, sb, NULL, &err) == 0 &&
         d_fetch(got, dout, sizeof(float) * (size_t)(n * n_head * hd), &err) == 0;
    if (!ok)
        printf("#   %s\n", err.msg);
    int same = ok;
    for (int64_t b = 0; ok && b < n; b++) {
        const size_t plane = rb * (size_t)(pos[b] + 4), used = rb * (size_t)(pos[b] + 1);
        uint8_t *kg = xmalloc(used), *vg = xmalloc(used);
        if (d_fetch(kg, dcache[b] + 2 * plane, used, &err) != 0 || d_fetch(vg, dcache[b] + 3 * plane, used, &err) != 0 ||
            memcmp(kg, hk[b], used) != 0 || memcmp(vg, hv[b], used) != 0) {
            printf("#   row %lld: the cache differs from kcpu_kv_store's\n", (long long)b);
            same = 0;
        }
        free(kg);
        free(vg);
    }
    tap_ok(same, "kv_store_rows f16: %lld rows, each in its own cache", (long long)n);
    if (ok) {
        double *ref = xmalloc(sizeof(double) * (size_t)(n * n_head * hd));
        for (int64_t i = 0; i < n * n_head * hd; i++)
            ref[i] = want[i];
        ok = check_close(got, n_head * hd, ref, n, n_head * hd, 2e-5, 1e-4);
        free(ref);
    }
    tap_ok(ok, "attention_rows: %lld rows over their own caches (last position %lld), max_len %lld, %lld heads over %lld, "
           "head_dim %lld%s%s", (long long)n, (long long)pos[n - 1], (long long)max_len, (long long)n_head, (long long)n_kv,
           (long long)hd, window ? ", a window" : "", with_sinks ? ", sinks" : "");
    kcuda_free(dsinks);
    free(sinks);
    for (int64_t b = 0; b < n; b++) {
        kcuda_free(dcache[b]);
        free(hk[b]);
        free(hv[b]);
    }
    kcuda_free(drows); kcuda_free(dk); kcuda_free(dvv); kcuda_free(dq); kcuda_free(dout); kcuda_free(ds);
    free(knew); free(vnew); free(q); free(want); free(got);
}

static void case_rows(rng_t *r, int64_t n, const int64_t *pos, int64_t n_head, int64_t n_kv, int64_t hd,
                      int64_t max_len)
{
    case_rows_ext(r, n, pos, n_head, n_kv, hd, max_len, 0, 0);
}

/* kcuda_qkv_rows (the decode step's q/k norm, RoPE and cache store in one launch,
 * on a stream of its own, so with programmatic dependent launch where the device
 * has it) against kcuda_rms_norm_rope twice and kcuda_kv_store_rows: the same bits
 * in q, k and every byte of the caches (layer 1 of two, poisoned elsewhere). */
/* nr: the dims rotated (0: all); gains 0: no q/k norms (GLM-4.5's attention). */
/* Whether the fused paths below (kcuda_qkv_rows, kcuda_attention_rows_qkv) take the
 * step's RoPE table (kcuda_rope_table) while the paths they are compared with take
 * each head's sines and cosines: the bits must not change. */
static int g_table;

/* rope with the table of its cosines and sines at dpos (n rows) when g_table; *cs is
 * the table to free (NULL without). */
static kcuda_rope_t rope_maybe_table(kcuda_rope_t rope, const int32_t *dpos, int64_t n, float **cs)
{
    *cs = NULL;
    if (!g_table)
        return rope;
    bl_err_t err = {0};
    *cs = d_poison(sizeof(float) * (size_t)(n * rope.n_rot));
    if (kcuda_rope_table(dpos, n, &rope, *cs, NULL, &err) != 0)
        bail("kcuda_rope_table", &err);
    rope.d_cs = *cs;
    return rope;
}

static void case_qkv_rows_part(rng_t *r, int64_t n, const int32_t *pos, int64_t n_head, int64_t n_kv, int64_t hd,
                               int64_t nr, int gains)
{
    bl_err_t err = {0};
    const int64_t nq = n * n_head * hd, nk = n * n_kv * hd, kvw = n_kv * hd;
    const size_t rb = (size_t)kvw * 2 + 16; /* rows wider than the heads: the stride counts */
    float *q = xmalloc(sizeof(float) * (size_t)nq), *k = xmalloc(sizeof(float) * (size_t)nk);
    float *v = xmalloc(sizeof(float) * (size_t)nk), *g = xmalloc(sizeof(float) * (size_t)(2 * hd));
    rand_fill(r, q, nq, 3.0f);
    rand_fill(r, k, nk, 3.0f);
    rand_fill(r, v, nk, 3.0f);
    rand_fill(r, g, 2 * hd, 1.5f);
    kcuda_kv_row_t rows[2][8];
    uint8_t *dc[2][8];
    size_t plane[8];
    for (int64_t b = 0; b < n; b++) {
        plane[b] = rb * (size_t)(pos[b] + 5);
        for (int w = 0; w < 2; w++) {
            dc[w][b] = d_poison(4 * plane[b]);
            rows[w][b] = (kcuda_kv_row_t){.k = (uint64_t)(uintptr_t)dc[w][b], .layer_bytes = 2 * plane[b],
                                          .v_bytes = plane[b], .pos = pos[b]};
        }
    }
    void *st = NULL;
    if (kcuda_stream_create(&st, &err) < 0)
        bail("kcuda_stream_create", &err);
    float *dq[2], *dk[2];
    kcuda_kv_row_t *drows[2];
    for (int w = 0; w < 2; w++) {
        dq[w] = d_upload(q, sizeof(float) * (size_t)nq);
        dk[w] = d_upload(k, sizeof(float) * (size_t)nk);
        drows[w] = d_upload(rows[w], sizeof(kcuda_kv_row_t) * (size_t)n);
    }
    float *dv = d_upload(v, sizeof(float) * (size_t)nk), *dg = d_upload(g, sizeof(float) * (size_t)(2 * hd));
    int32_t *dpos = d_upload(pos, sizeof(int32_t) * (size_t)n);
    const float eps = 1e-6f, base = 1000000.0f;
    if (!nr)
        nr = hd;
    const float *qg = gains ? dg : NULL, *kg = gains ? dg + hd : NULL;
    const kcuda_rope_t rope = kcuda_rope_plain((int)nr, base);
    float *cs;
    const kcuda_rope_t rope_f = rope_maybe_table(rope, dpos, n, &cs);
    int ok = kcuda_sync(NULL, &err) == 0 &&
             kcuda_qkv_rows(drows[0], 1, rb, dq[0], dk[0], dv, qg, kg, dpos, n, n_head, n_kv, hd, &rope_f, eps, st,
                            &err) == 0 &&
             kcuda_sync(st, &err) == 0 &&
             kcuda_rms_norm_rope(dq[1], qg, dpos, n, n_head, hd, &rope, eps, NULL, &err) == 0 &&
             kcuda_rms_norm_rope(dk[1], kg, dpos, n, n_kv, hd, &rope, eps, NULL, &err) == 0 &&
             kcuda_kv_store_rows(drows[1], 1, rb, dk[1], dv, kvw, n, kvw, NULL, &err) == 0 &&
             kcuda_sync(NULL, &err) == 0;
    int same = ok;
    if (ok) {
        float *a = xmalloc(sizeof(float) * (size_t)nq), *b2 = xmalloc(sizeof(float) * (size_t)nq);
        same &= d_fetch(a, dq[0], sizeof(float) * (size_t)nq, &err) == 0 &&
                d_fetch(b2, dq[1], sizeof(float) * (size_t)nq, &err) == 0 && memcmp(a, b2, sizeof(float) * (size_t)nq) == 0;
        same &= d_fetch(a, dk[0], sizeof(float) * (size_t)nk, &err) == 0 &&
                d_fetch(b2, dk[1], sizeof(float) * (size_t)nk, &err) == 0 && memcmp(a, b2, sizeof(float) * (size_t)nk) == 0;
        if (!same)
            printf("#   q or k differs from kcuda_rms_norm_rope's\n");
        for (int64_t b = 0; b < n; b++) {
            uint8_t *c0 = xmalloc(4 * plane[b]), *c1 = xmalloc(4 * plane[b]);
            if (d_fetch(c0, dc[0][b], 4 * plane[b], &err) != 0 || d_fetch(c1, dc[1][b], 4 * plane[b], &err) != 0 ||
                memcmp(c0, c1, 4 * plane[b]) != 0) {
                printf("#   row %lld: the cache differs from kcuda_kv_store_rows'\n", (long long)b);
                same = 0;
            }
            free(c0);
            free(c1);
        }
        free(a);
        free(b2);
    } else {
        printf("#   %s\n", err.msg);
    }
    tap_ok(same, "qkv_rows: %lld rows, %lld heads over %lld of %lld, %lld rotated%s%s, the bits of norm+rope twice "
           "and kv_store_rows", (long long)n, (long long)n_head, (long long)n_kv, (long long)hd, (long long)nr,
           gains ? "" : ", no norms", g_table ? ", the RoPE table" : "");
    kcuda_free(cs);
    for (int w = 0; w < 2; w++) {
        kcuda_free(dq[w]);
        kcuda_free(dk[w]);
        kcuda_free(drows[w]);
        for (int64_t b = 0; b < n; b++)
            kcuda_free(dc[w][b]);
    }
    kcuda_free(dv), kcuda_free(dg), kcuda_free(dpos);
    kcuda_stream_destroy(st);
    free(q), free(k), free(v), free(g);
}

/* kcuda_attention_rows_qkv against kcuda_qkv_rows then kcuda_attention_rows, from
 * the same caches (random f16 before each row's position, in layer 1 of two): the
 * output and every cache byte, bit for bit. max_len within the one-pass bound folds
 * the q/k work into the attention launch; past it the call takes the two launches. */
static void case_attention_qkv_part(rng_t *r, int64_t n, const int32_t *pos, int64_t n_head, int64_t n_kv,
                                    int64_t hd, int64_t max_len, int64_t nr, int gains)
{
    bl_err_t err = {0};
    const int64_t nq = n * n_head * hd, nk = n * n_kv * hd, kvw = n_kv * hd;
    const size_t rb = (size_t)kvw * 2 + 16;
    float *q = xmalloc(sizeof(float) * (size_t)nq), *k = xmalloc(sizeof(float) * (size_t)nk);
    float *v = xmalloc(sizeof(float) * (size_t)nk), *g = xmalloc(sizeof(float) * (size_t)(2 * hd));
    rand_fill(r, q, nq, 3.0f);
    rand_fill(r, k, nk, 3.0f);
    rand_fill(r, v, nk, 3.0f);
    rand_fill(r, g, 2 * hd, 1.5f);
    kcuda_kv_row_t rows[2][8];
    uint8_t *dc[2][8];
    size_t plane[8];
    for (int64_t b = 0; b < n; b++) {
        plane[b] = rb * (size_t)(pos[b] + 5);
        uint16_t *init = xmalloc(4 * plane[b]);
        for (size_t i = 0; i < 2 * plane[b]; i++)
            init[i] = bl_fp32_to_fp16(rng_f(r, -2.0f, 2.0f));
        for (int w = 0; w < 2; w++) {
            dc[w][b] = d_upload(init, 4 * plane[b]);
            rows[w][b] = (kcuda_kv_row_t){.k = (uint64_t)(uintptr_t)dc[w][b], .layer_bytes = 2 * plane[b],
                                          .v_bytes = plane[b], .pos = pos[b]};
        }
        free(init);
    }
    float *dq[2], *dk[2], *dout[2];
    kcuda_kv_row_t *drows[2];
    const size_t sb = kcuda_attention_scratch_bytes(n, n_head, hd, max_len);
    void *ds = d_poison(sb);
    for (int w = 0; w < 2; w++) {
        dq[w] = d_upload(q, sizeof(float) * (size_t)nq);
        dk[w] = d_upload(k, sizeof(float) * (size_t)nk);
        dout[w] = d_poison(sizeof(float) * (size_t)nq);
        drows[w] = d_upload(rows[w], sizeof(kcuda_kv_row_t) * (size_t)n);
    }
    float *dv = d_upload(v, sizeof(float) * (size_t)nk), *dg = d_upload(g, sizeof(float) * (size_t)(2 * hd));
    int32_t *dpos = d_upload(pos, sizeof(int32_t) * (size_t)n);
    const float eps = 1e-6f, base = 1000000.0f, scale = (float)(1.0 / sqrt((double)hd));
    if (!nr)
        nr = hd;
    const float *qg = gains ? dg : NULL, *kg = gains ? dg + hd : NULL;
    const kcuda_rope_t rope = kcuda_rope_plain((int)nr, base);
    float *cs;
    const kcuda_rope_t rope_f = rope_maybe_table(rope, dpos, n, &cs);
    int ok = kcuda_attention_rows_qkv(drows[0], 1, rb, dq[0], dk[0], dv, qg, kg, dpos, dout[0], n, max_len,
                                      n_head, n_kv, hd, &rope_f, eps, scale, NULL, ds, sb, NULL, &err) == 0 &&
             kcuda_qkv_rows(drows[1], 1, rb, dq[1], dk[1], dv, qg, kg, dpos, n, n_head, n_kv, hd, &rope, eps, NULL,
                            &err) == 0 &&
             kcuda_attention_rows(drows[1], 1, rb, dq[1], dout[1], n, max_len, n_head, n_kv, hd, scale, NULL, ds, sb,
                                  NULL, &err) == 0 &&
             kcuda_sync(NULL, &err) == 0;
    int same = ok;
    if (ok) {
        float *a = xmalloc(sizeof(float) * (size_t)nq), *b2 = xmalloc(sizeof(float) * (size_t)nq);
        if (d_fetch(a, dout[0], sizeof(float) * (size_t)nq, &err) != 0 ||
            d_fetch(b2, dout[1], sizeof(float) * (size_t)nq, &err) != 0 || memcmp(a, b2, sizeof(float) * (size_t)nq) != 0) {
            printf("#   the output differs from qkv_rows then attention_rows\n");
            same = 0;
        }
        for (int64_t b = 0; b < n; b++) {
            uint8_t *c0 = xmalloc(4 * plane[b]), *c1 = xmalloc(4 * plane[b]);
            if (d_fetch(c0, dc[0][b], 4 * plane[b], &err) != 0 || d_fetch(c1, dc[1][b], 4 * plane[b], &err) != 0 ||
                memcmp(c0, c1, 4 * plane[b]) != 0) {
                printf("#   row %lld: the cache differs from qkv_rows'\n", (long long)b);
                same = 0;
            }
            free(c0);
            free(c1);
        }
        free(a);
        free(b2);
    } else {
        printf("#   %s\n", err.msg);
    }
    tap_ok(same, "attention_rows_qkv: %lld rows (last position %d), %lld heads over %lld of %lld, max_len %lld%s: the "
           "bits of qkv_rows then attention_rows (%lld rotated%s%s)", (long long)n, pos[n - 1], (long long)n_head,
           (long long)n_kv, (long long)hd, (long long)max_len,
           max_len <= KCUDA_ATT_SHORT ? " (one launch)" : " (two launches)", (long long)nr, gains ? "" : ", no norms",
           g_table ? ", the RoPE table" : "");
    kcuda_free(cs);
    for (int w = 0; w < 2; w++) {
        kcuda_free(dq[w]);
        kcuda_free(dk[w]);
        kcuda_free(dout[w]);
        kcuda_free(drows[w]);
        for (int64_t b = 0; b < n; b++)
            kcuda_free(dc[w][b]);
    }
    kcuda_free(dv), kcuda_free(dg), kcuda_free(dpos), kcuda_free(ds);
    free(q), free(k), free(v), free(g);
}

static void case_refusals(void)
{
    bl_err_t err = {0};
    void *d = d_alloc(1 << 16);
    const kcuda_kv_view_t kv = {.k = d, .v = d, .row_bytes = 256};
    int ok = kcuda_attention(&kv, d, d, 1, 0, 4, 1, 96, 0.1f, NULL, d, 1 << 16, NULL, &err) == BL_ENOTSUP;
    ok &= kcuda_attention(&kv, d, d, 1, 0, 17 * 2, 2, 64, 0.1f, NULL, d, 1 << 16, NULL, &err) == BL_ENOTSUP;
    ok &= kcuda_attention(&kv, d, d, 1, 0, 6, 4, 64, 0.1f, NULL, d, 1 << 16, NULL, &err) == BL_ENOTSUP;
    ok &= kcuda_attention(&kv, d, d, 1, 4000, 2, 2, 64, 0.1f, NULL, d, 64, NULL, &err) == BL_ERANGE;
    if (!ok)
        printf("#   last message: %s\n", err.msg);
    tap_ok(ok, "attention refuses unsupported shapes and short scratch");
    kcuda_free(d);
}

static void case_qkv_rows(rng_t *r, int64_t n, const int32_t *pos, int64_t n_head, int64_t n_kv, int64_t hd)
{
    case_qkv_rows_part(r, n, pos, n_head, n_kv, hd, 0, 1);
}

static void case_attention_qkv(rng_t *r, int64_t n, const int32_t *pos, int64_t n_head, int64_t n_kv, int64_t hd,
                               int64_t max_len)
{
    case_attention_qkv_part(r, n, pos, n_head, n_kv, hd, max_len, 0, 1);
}

/* The per-head products in double: ref[b, h, o] = sum over k < C of W[h R + o, k]
 * x[b ldx + h C + k], W f16 (H R, C), x rounded to f16 first where round16. */
static void heads_ref(double *ref, const uint16_t *w16, const float *x, int64_t ldx, int round16, int64_t n,
                      int64_t H, int64_t R, int64_t C)
{
    for (int64_t b = 0; b < n; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t o = 0; o < R; o++) {
                double a = 0;
                for (int64_t k = 0; k < C; k++) {
                    const float xv = x[b * ldx + h * C + k];
                    a += (double)bl_fp16_to_fp32(w16[(h * R + o) * C + k]) *
                         (double)(round16 ? bl_fp16_to_fp32(bl_fp32_to_fp16(xv)) : xv);
                }
                ref[(b * H + h) * R + o] = a;
            }
}

/* deepseek2's latent attention pieces (mla.cu): kcuda_mla_attention against
 * kcpu_attention with one cache head of kv_lora + n_rot dims whose rows are also the
 * values (the CPU's cpu_mla), through the decode rows table and the prompt form,
 * each with the positions split over blocks (scratch given) and, in the prompt
 * form, without;
 * kcuda_matvec_heads against a double product of the f16 weights; kcuda_rope_norm
 * against kcpu_rope_norm with a YaRN table. */
static void case_mla(rng_t *r, int64_t n, int64_t pos0, int64_t H, int64_t R, int64_t nr)
{
    bl_err_t err = {0};
    const int64_t D = R + nr, len = pos0 + n;
    const size_t rb = (size_t)D * 2 + 32;
    const float scale = 0.07f;
    float *cf = xmalloc(sizeof(float) * (size_t)(len * D));
    rand_fill(r, cf, len * D, 1.0f);
    uint8_t *hc = xmalloc(rb * (size_t)len);
    memset(hc, 0, rb * (size_t)len);
    const kcpu_kv_view_t hv = {.k = hc, .v = hc, .type = BL_TYPE_F16, .row_bytes = rb};
    kcpu_kv_store(&hv, 0, cf, 0, len, D);
    float *q = xmalloc(sizeof(float) * (size_t)(n * H * D));
    rand_fill(r, q, n * H * D, 1.0f);
    kcpu_ctx_t *c = NULL;
    const kcpu_limits_t lim = {.max_cols = D, .max_batch = n, .max_ctx = len, .head_dim = D};
    if (kcpu_ctx_create(&c, 1, KCPU_PRECISE, &lim, &err) < 0)
        bail("kcpu_ctx_create", &err);
    float *want = xmalloc(sizeof(float) * (size_t)(n * H * D));
    kcpu_attention(c, &hv, q, want, n, pos0, H, 1, D, scale);
    kcpu_ctx_destroy(c);
    /* the card: q split as the model has it, the latent part (n, H, R) and the rotated
     * part inside rows of H heads of nr + 8 (strided) */
    float *ql = xmalloc(sizeof(float) * (size_t)(n * H * R)), *qp = xmalloc(sizeof(float) * (size_t)(n * H * (nr + 8)));
    for (int64_t b = 0; b < n; b++)
        for (int64_t h = 0; h < H; h++) {
            memcpy(ql + (b * H + h) * R, q + (b * H + h) * D, sizeof(float) * (size_t)R);
            memcpy(qp + (b * H + h) * (nr + 8) + 8, q + (b * H + h) * D + R, sizeof(float) * (size_t)nr);
        }
    uint8_t *dc = d_upload(hc, rb * (size_t)len);
    float *dql = d_upload(ql, sizeof(float) * (size_t)(n * H * R));
    float *dqp = d_upload(qp, sizeof(float) * (size_t)(n * H * (nr + 8)));
    float *dout = d_poison(sizeof(float) * (size_t)(n * H * R)), *got = xmalloc(sizeof(float) * (size_t)(n * H * R));
    double *ref = xmalloc(sizeof(double) * (size_t)(n * H * R));
    for (int64_t i = 0; i < n * H; i++)
        for (int64_t d = 0; d < R; d++)
            ref[i * R + d] = want[i * D + d];
    const size_t sb = kcuda_mla_scratch_bytes(n, H, R);
    void *dscr = d_poison(sb);
    /* the tensor-core form rounds the queries and probabilities to f16 */
    const int mma = kcuda_mla_mma(R, nr, rb);
    const double atol = mma ? 4e-3 : 2e-5, rtol = mma ? 4e-3 : 1e-4;
    int ok = 1;
    /* the tensor-core form's heads a block: as it chooses by the launch, then 16 and 32 */
    const int heads_default = kcuda_mla_set_heads(-1);
    static const int heads[] = {0, 16, 32};
    for (int hi = 0; hi < (mma ? 3 : 1); hi++)
        for (int split = 0; split < 2; split++) {
            (void)kcuda_mla_set_heads(heads[hi]);
            ok = kcuda_mla_attention(dc, NULL, 0, rb, pos0, dql, H * R, R, dqp + 8, H * (nr + 8), nr + 8, n, H, R,
                                     nr, scale, dout, H * R, R, split ? dscr : NULL, split ? sb : 0, NULL, &err) == 0 &&
                 d_fetch(got, dout, sizeof(float) * (size_t)(n * H * R), &err) == 0;
            (void)kcuda_mla_set_heads(heads_default);
            if (!ok)
                printf("#   %s\n", err.msg);
            else
                ok = check_close(got, H * R, ref, n, H * R, atol, rtol);
            tap_ok(ok, "mla_attention (%s, prompt form%s, heads a block %d): %lld rows at %lld, %lld heads, %lld + "
                   "%lld dims", mma ? "tensor cores" : "f32", split ? ", split" : "", heads[hi], (long long)n,
                   (long long)pos0, (long long)H, (long long)R, (long long)nr);
        }
    /* the rows table: each row's own position, the cache in layer 1 of two */
    kcuda_kv_row_t rows[64];
    uint8_t *dc2 = d_poison(2 * rb * (size_t)len);
    ok = n <= 64 && kcuda_upload(dc2 + rb * (size_t)len, hc, rb * (size_t)len, NULL, &err) == 0;
    for (int64_t b = 0; ok && b < n; b++)
        rows[b] = (kcuda_kv_row_t){.k = (uint64_t)(uintptr_t)dc2, .layer_bytes = rb * (size_t)len, .v_bytes = 0,
                                   .pos = (int32_t)(pos0 + b)};
    kcuda_kv_row_t *drows = ok ? d_upload(rows, sizeof(kcuda_kv_row_t) * (size_t)n) : NULL;
    ok = ok && kcuda_mla_attention(NULL, drows, 1, rb, 0, dql, H * R, R, dqp + 8, H * (nr + 8), nr + 8, n, H, R, nr,
                                   scale, dout, H * R, R, dscr, sb, NULL, &err) == 0 &&
         d_fetch(got, dout, sizeof(float) * (size_t)(n * H * R), &err) == 0;
    if (!ok)
        printf("#   %s\n", err.msg);
    else
        ok = check_close(got, H * R, ref, n, H * R, atol, rtol);
    tap_ok(ok, "mla_attention (%s, rows table): %lld rows at %lld, %lld heads", mma ? "tensor cores" : "f32",
           (long long)n, (long long)pos0, (long long)H);

    /* per-head products: W (H R, 32) f16 times x (n, H, 32) strided */
    const int64_t C = 40, xr = H * C + 3;
    uint16_t *w16 = xmalloc(sizeof(uint16_t) * (size_t)(H * R * C));
    float *x = xmalloc(sizeof(float) * (size_t)(n * xr)), *y = xmalloc(sizeof(float) * (size_t)(n * H * R));
    for (int64_t i = 0; i < H * R * C; i++)
        w16[i] = bl_fp32_to_fp16(rng_f(r, -1.0f, 1.0f));
    rand_fill(r, x, n * xr, 1.0f);
    heads_ref(ref, w16, x, xr, 0, n, H, R, C);
    void *dw = d_upload(w16, sizeof(uint16_t) * (size_t)(H * R * C));
    float *dx = d_upload(x, sizeof(float) * (size_t)(n * xr));
    ok = kcuda_matvec_heads(dw, H, R, C, dx, xr, C, n, dout, H * R, R, NULL, &err) == 0 &&
         d_fetch(y, dout, sizeof(float) * (size_t)(n * H * R), &err) == 0;
    if (!ok)
        printf("#   %s\n", err.msg);
    else
        ok = check_close(y, H * R, ref, n, H * R, 1e-5, 1e-5);
    tap_ok(ok, "matvec_heads: %lld rows, %lld heads of %lld x %lld", (long long)n, (long long)H, (long long)R,
           (long long)C);
    /* the same on tensor cores (the prompt's form): x rounded to f16, rows of H C + 8 halves */
    const int64_t xr16 = H * C + 8;
    uint16_t *x16 = xmalloc(sizeof(uint16_t) * (size_t)(n * xr16));
    memset(x16, 0, sizeof(uint16_t) * (size_t)(n * xr16));
    for (int64_t b = 0; b < n; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t k = 0; k < C; k++)
                x16[b * xr16 + h * C + k] = bl_fp32_to_fp16(x[b * xr + h * C + k]);
    heads_ref(ref, w16, x, xr, 1, n, H, R, C);
    void *blas = NULL, *dx16 = d_upload(x16, sizeof(uint16_t) * (size_t)(n * xr16));
    ok = kcuda_blas_create(&blas, NULL, &err) == 0 &&
         kcuda_gemm_heads(blas, dw, H, R, C, dx16, xr16, C, n, dout, H * R, R, NULL, &err) == 0 &&
         d_fetch(y, dout, sizeof(float) * (size_t)(n * H * R), &err) == 0;
    if (!ok)
        printf("#   %s\n", err.msg);
    else
        ok = check_close(y, H * R, ref, n, H * R, 1e-4, 1e-4);
    tap_ok(ok, "gemm_heads: %lld rows, %lld heads of %lld x %lld", (long long)n, (long long)H, (long long)R,
           (long long)C);
    kcuda_blas_destroy(blas);
    kcuda_free(dx16);
    free(x16);

    /* NORM RoPE with YaRN, heads strided inside rows */
    const kcpu_rope_t yr = {.n_rot = nr, .base = 10000.0f, .freq_scale = 0.025f, .ext_factor = 1.0f,
                            .corr_lo = 3.0f, .corr_hi = 11.0f, .mscale = 1.2f};
    const kcuda_rope_t cyr = {(int)nr, 10000.0f, 0.025f, 1.0f, 3.0f, 11.0f, 1.2f};
    int32_t *pos = xmalloc(sizeof(int32_t) * (size_t)n);
    for (int64_t b = 0; b < n; b++)
        pos[b] = (int32_t)(pos0 + 1000 * b);
    /* rows of H heads of nr + 8, the rotated dims 5.. of each head */
    const int64_t hs = nr + 8, rs = H * hs + 3;
    float *cs = xmalloc(sizeof(float) * (size_t)(n * nr)), *xa = xmalloc(sizeof(float) * (size_t)(n * rs));
    float *xb = xmalloc(sizeof(float) * (size_t)(n * rs));
    rand_fill(r, xa, n * rs, 1.0f);
    memcpy(xb, xa, sizeof(float) * (size_t)(n * rs));
    kcpu_rope_table(cs, pos, n, &yr);
    kcpu_rope_norm(xb + 5, cs, n, H, rs, hs, nr);
    int32_t *dpos = d_upload(pos, sizeof(int32_t) * (size_t)n);
    float *dxa = d_upload(xa, sizeof(float) * (size_t)(n * rs));
    ok = kcuda_rope_norm(dxa + 5, dpos, n, H, rs, hs, &cyr, NULL, &err) == 0 &&
         d_fetch(xa, dxa, sizeof(float) * (size_t)(n * rs), &err) == 0;
    if (!ok)
        printf("#   %s\n", err.msg);
    else {
        double *rr = xmalloc(sizeof(double) * (size_t)(n * rs));
        for (int64_t i = 0; i < n * rs; i++)
            rr[i] = xb[i];
        ok = check_close(xa, rs, rr, n, rs, 2e-6, 2e-6);
        free(rr);
    }
    tap_ok(ok, "rope_norm with YaRN: %lld rows, %lld heads, %lld rotated", (long long)n, (long long)H, (long long)nr);
    kcuda_free(dc); kcuda_free(dc2); kcuda_free(dql); kcuda_free(dqp); kcuda_free(dout); kcuda_free(drows);
    kcuda_free(dscr);
    kcuda_free(dw); kcuda_free(dx); kcuda_free(dpos); kcuda_free(dxa);
    free(cf); free(hc); free(q); free(want); free(ql); free(qp); free(got); free(ref); free(w16); free(x); free(y);
    free(pos); free(cs); free(xa); free(xb);
}

int main(void)
{
    gpu_test_init("test_kcuda_attention");
    if (kcpu_select("ref") != 0) /* the scalar reference, not the AVX2 kernels */
        bail("kcpu_select(ref)", NULL);
    rng_t r = rng_for(4);
    case_refusals();
    const int32_t qp1[1] = {0}, qp3[3] = {7, 130, 4000};
    case_qkv_rows(&r, 1, qp1, 32, 4, 128);
    case_qkv_rows(&r, 3, qp3, 16, 2, 64);
    case_qkv_rows(&r, 2, qp3, 6, 3, 256);
    case_qkv_rows_part(&r, 3, qp3, 12, 1, 128, 64, 0); /* GLM-4.5: half rotated, no norms */
    /* the q/k work folded into the one-pass attention: Qwen3-30B-A3B's heads, a row
     * at position 0, one filling its grid, every head size, group 16; and past the
     * bound, the two launches */
    const int32_t ap1[1] = {0}, ap3[3] = {7, 511, 100}, ap2[2] = {63, 200}, ap4[2] = {700, 1500};
    case_attention_qkv(&r, 1, ap1, 32, 4, 128, 256);
    case_attention_qkv(&r, 3, ap3, 32, 4, 128, KCUDA_ATT_SHORT);
    case_attention_qkv(&r, 2, ap2, 16, 1, 64, 256);
    case_attention_qkv(&r, 2, ap2, 6, 3, 256, 256);
    case_attention_qkv(&r, 2, ap2, 8, 4, 32, 201);
    case_attention_qkv(&r, 2, ap4, 32, 4, 128, 2048);
    case_attention_qkv_part(&r, 3, ap3, 12, 1, 128, 256, 64, 0);  /* GLM-4.5 */
    case_attention_qkv_part(&r, 2, ap4, 12, 1, 128, 2048, 64, 0);
    /* the same with the step's RoPE table (kcuda_rope_table) in the fused paths */
    g_table = 1;
    case_qkv_rows(&r, 3, qp3, 16, 2, 64);
    case_qkv_rows_part(&r, 3, qp3, 12, 1, 128, 64, 0);
    case_attention_qkv(&r, 3, ap3, 32, 4, 128, KCUDA_ATT_SHORT);
    case_attention_qkv(&r, 2, ap4, 32, 4, 128, 2048);
    case_attention_qkv_part(&r, 3, ap3, 12, 1, 128, 256, 64, 0);
    g_table = 0;

    case_attention(&r, 1, 0, 4, 4, 128);      /* one position */
    case_attention(&r, 1, 36, 8, 2, 128);     /* less than a chunk */
    case_attention(&r, 1, 127, 32, 4, 128);   /* exactly one chunk (Qwen3-30B-A3B heads) */
    case_attention(&r, 2, 127, 8, 8, 256);    /* rows ending at 128 and 129 */
    case_attention(&r, 1, 299, 32, 4, 128);   /* 2 chunks and a part */
    case_attention(&r, 3, 1010, 16, 1, 64);   /* group 16, three causal ends */
    case_attention(&r, 5, 50, 6, 2, 32);
    case_attention(&r, 8, 383, 12, 4, 128);   /* the last row ends a chunk */
    /* gpt-oss: sinks, a window of 128 (the rows' windows start inside a chunk, on a
     * chunk's edge, past whole chunks), heads of 64 in groups of 8 */
    case_attention_ext(&r, 3, 40, 16, 2, 64, 0, 1);
    case_attention_ext(&r, 4, 300, 16, 2, 64, 128, 1);
    case_attention_ext(&r, 2, 1022, 16, 2, 64, 128, 0);
    case_attention_ext(&r, 70, 200, 8, 1, 64, 128, 1);   /* a prompt: two flash tiles */
    case_attention_ext(&r, 5, 60, 8, 2, 128, 16, 1);     /* windows shorter than the rows' spread */
    case_attention_ext(&r, 3, 3000, 8, 1, 64, 128, 1);  /* chunks of 64 */
    case_mla(&r, 3, 40, 8, 64, 32);
    case_mla(&r, 5, 700, 16, 512, 64);  /* DeepSeek-V3's latent and rotated widths */
    case_mla(&r, 40, 0, 4, 64, 32);     /* a prompt from position 0 */
    case_mla(&r, 1, 5000, 128, 512, 64); /* DeepSeek-V3's heads, one row deep: many splits */
    case_mla(&r, 2, 3000, 20, 512, 64);  /* heads not a multiple of a block's 8 or 16 */
    case_mla(&r, 1, 33, 16, 128, 16);    /* tensor cores: a split ending 2 rows into its second tile */
    case_mla(&r, 3, 40, 8, 48, 16);      /* widths only the f32 form takes */
    case_mla(&r, 2, 3000, 20, 480, 64);
    case_mla(&r, 40, 300, 128, 512, 64); /* a prompt of DeepSeek-V3's heads: 32 heads a block */
    const int64_t p1[1] = {0}, p3[3] = {5, 200, 129}, p5[5] = {127, 1, 1013, 300, 40};
    case_rows(&r, 1, p1, 8, 2, 128, 256);
    case_rows(&r, 3, p3, 32, 4, 128, 256);      /* a grid larger than two rows need */
    case_rows(&r, 5, p5, 16, 1, 64, 1024 + 128);
    case_rows_ext(&r, 3, p3, 16, 2, 64, 256, 128, 1);          /* the one-pass kernel, a window and sinks */
    case_rows_ext(&r, 5, p5, 16, 2, 64, 1024 + 128, 128, 1);   /* the split pass */
    case_rows_ext(&r, 5, p5, 16, 2, 64, 1024 + 128, 0, 1);
    /* tensor cores with more than 8 heads a group (the lanes' second head): GLM-4.5's
     * 12 over 1, 16 over 1 and 2 with a window and sinks, every chunk length */
    case_attention(&r, 3, 1010, 12, 1, 128);
    case_attention(&r, 2, 5000, 24, 2, 128);
    case_attention_ext(&r, 4, 300, 16, 1, 128, 128, 1);
    case_rows_ext(&r, 5, p5, 32, 2, 128, 1024 + 128, 100, 1);
    /* the one-pass kernel (max_len <= KCUDA_ATT_SHORT) for every head size, a
     * context filling the grid, more positions than threads, group 16 and group 1 */
    const int64_t s2[2] = {63, 127}, s3[3] = {255, 0, 100}, s4[2] = {17, 200}, s5[1] = {256};
    case_rows(&r, 2, s2, 16, 1, 64, 128);
    case_rows(&r, 3, s3, 6, 3, 256, KCUDA_ATT_SHORT);
    case_rows(&r, 2, s4, 4, 4, 32, 201);
    case_rows(&r, 1, s5, 32, 4, 128, KCUDA_ATT_SHORT + 1); /* just past it: the split pass */
    /* each chunk size (16 up to 4096 positions, 32, 64, 128 past 16384), with
     * causal ends inside a chunk and on its edge */
    case_attention(&r, 2, 1022, 32, 4, 128);  /* chunks of 16: ends at 1023, 1024 */
    case_attention(&r, 3, 3000, 8, 1, 64);    /* chunks of 16, 188 splits */
    case_attention(&r, 1, 5000, 16, 2, 128);  /* chunks of 32 */
    case_attention(&r, 2, 9000, 8, 1, 256);   /* chunks of 64 */
    const int64_t p6[2] = {31, 2047}, p7[3] = {4096, 17, 300}, p8[3] = {9000, 16383, 40};
    case_rows(&r, 2, p6, 32, 4, 128, 2048);   /* chunks of 16, a row ending a chunk */
    case_rows(&r, 3, p7, 16, 2, 128, 4097 + 500); /* chunks of 32 */
    case_rows(&r, 3, p8, 32, 4, 128, 16384);  /* chunks of 64, a row ending the grid */
    /* past 16384: chunks of 128 (the most shared memory at head_dim 128 with group
     * 16), of 64 at head_dim 256 (more than 256 splits), a window inside a chunk */
    const int64_t p9[2] = {16999, 100}, p10[2] = {17000, 16500};
    case_rows(&r, 2, p9, 16, 1, 128, 17000);
    case_rows(&r, 2, p10, 16, 2, 256, 17001);
    case_rows_ext(&r, 2, p10, 16, 2, 64, 17001, 128, 1);
    case_rows(&r, 2, p10, 64, 8, 64, 17001);              /* gpt-oss's heads, tensor cores */
    case_rows_ext(&r, 3, p7, 64, 8, 64, 4097 + 500, 128, 1);
    /* the longest chunks at short contexts (kcuda_attention_set_chunk) */
    const int chunk_old = kcuda_attention_set_chunk(KCUDA_ATT_CHUNK);
    case_rows(&r, 3, p7, 16, 2, 128, 4097 + 500);
    case_attention(&r, 2, 1022, 32, 4, 128);
    case_attention(&r, 1, 5000, 8, 1, 256);
    (void)kcuda_attention_set_chunk(chunk_old);
    /* several chunks a split block (kcuda_attention_set_splits): the running softmax
     * over 2 to 72 chunks, rows ending inside a block's span and on its edge,
     * windows starting inside a block's later chunks, both forms, group 16 */
    const int splits_old = kcuda_attention_set_splits(4);
    case_rows(&r, 3, p7, 16, 2, 128, 4097 + 500);   /* tensor cores, 9 chunks a block */
    case_rows(&r, 2, p9, 16, 1, 128, 17000);        /* group 16: both heads of every lane */
    case_attention(&r, 2, 1022, 32, 4, 128);
    case_attention(&r, 1, 5000, 8, 1, 256);
    case_attention(&r, 5, 50, 6, 2, 32);            /* 4 chunks: one a block */
    case_rows_ext(&r, 5, p5, 16, 2, 64, 1024 + 128, 128, 1);
    case_attention_ext(&r, 4, 300, 16, 2, 64, 128, 1);
    case_attention_ext(&r, 5, 60, 8, 2, 128, 16, 1);
    (void)kcuda_attention_set_splits(1);            /* the whole context in one block */
    case_attention(&r, 3, 1010, 16, 1, 64);
    case_rows(&r, 5, p5, 32, 4, 128, 1024 + 128);
    (void)kcuda_attention_set_splits(64);
    case_rows(&r, 3, p8, 32, 4, 128, 16384);
    case_rows_ext(&r, 2, p10, 16, 2, 64, 17001, 128, 1);
    (void)kcuda_attention_set_splits(splits_old);
    /* the one-pass kernel moved up to its most (kcuda_attention_set_short): long
     * contexts, 8 positions a thread, group 16 */
    const int short_old = kcuda_attention_set_short(KCUDA_ATT_SHORT_MAX);
    case_rows(&r, 2, p6, 32, 4, 128, 2048);
    case_rows(&r, 5, p5, 16, 1, 64, 1024 + 128);
    (void)kcuda_attention_set_short(short_old);
    if (!g_small) {
        const int64_t p2[2] = {4095, 2500};
        case_rows(&r, 2, p2, 32, 4, 128, 4096);
        case_attention(&r, 1, 4095, 32, 4, 128);
        case_attention(&r, 2, 20000, 32, 4, 128);
        const int sp = kcuda_attention_set_splits(64);
        case_attention(&r, 2, 20000, 32, 4, 128);
        (void)kcuda_attention_set_splits(sp);
    }
    return tap_done();
}
