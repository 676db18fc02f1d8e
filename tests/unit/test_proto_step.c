/* Tests of proto/step.c: every kind of step message round-trips through a buffer and
 * a ring; truncated, oversized, stale, miscounted messages and bad slots, positions,
 * token and expert ids are refused with BL_EPROTO naming the field; a HIDDEN message
 * whose rows are in a card buffer carries none and names a buffer the link has. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "step.h"
#include "test_seed.h"

static const bp_step_limits_t g_lim = {
    .n_slots = 4, .n_batch = 16, .n_ctx = 64, .n_out_max = 4, .n_embd = 8, .n_vocab = 100,
    .n_layer = 3, .n_expert = 6, .n_expert_used = 2,
};

static _Alignas(16) uint8_t g_buf[1 << 14];
static bp_step_seq_t g_seqs[4];
static int32_t g_ids[16 * 2];
static int32_t g_counts[16];
static bp_step_kvop_t g_kvops[BP_STEP_MAX_KVOPS];

static bp_step_in_t fresh_in(void)
{
    return (bp_step_in_t){.seqs = g_seqs, .ids = g_ids, .counts = g_counts, .kvops = g_kvops};
}

/* Writes a TOKENS message of two sequences (slot 1: 3 rows at 5, slot 2: 1 row at 0). */
static size_t write_tokens(uint64_t step)
{
    bl_err_t err = {0};
    bp_step_hdr_t h = {.kind = BP_STEP_TOKENS, .step = step, .n_seqs = 2, .n_rows = 4};
    bp_step_out_t o;
    assert_int_equal(bp_step_write(g_buf, sizeof g_buf, &h, &o, &err), 0);
    o.seqs[0] = (bp_step_seq_t){.slot = 1, .n = 3, .pos = 5, .n_out = 1};
    o.seqs[1] = (bp_step_seq_t){.slot = 2, .n = 1, .pos = 0, .n_out = 1};
    for (int i = 0; i < 4; i++)
        o.tokens[i] = 10 * i + 7;
    return o.nbytes;
}

/* An EXPERTS message of n rows, each with both of its (expert, weight) pairs. */
static size_t write_experts(uint64_t step, int32_t layer, int32_t n)
{
    bl_err_t err = {0};
    bp_step_hdr_t h = {.kind = BP_STEP_EXPERTS, .step = step, .n_rows = n, .width = 8,
                       .k = 2 * n, .layer = layer};
    bp_step_out_t o;
    assert_int_equal(bp_step_write(g_buf, sizeof g_buf, &h, &o, &err), 0);
    for (int i = 0; i < n * 8; i++)
        o.rows[i] = (float)i * 0.5f;
    for (int i = 0; i < n; i++)
        o.counts[i] = 2;
    for (int i = 0; i < n * 2; i++) {
        o.ids[i] = i % 6;
        o.wts[i] = 1.0f / (float)(i + 1);
    }
    return o.nbytes;
}

/* Rows with 1, 2 and 1 pairs: a worker sends only the experts that are not its own. */
static size_t write_experts_ragged(void)
{
    bl_err_t err = {0};
    bp_step_hdr_t h = {.kind = BP_STEP_EXPERTS, .step = 3, .n_rows = 3, .width = 8, .k = 4, .layer = 2};
    bp_step_out_t o;
    assert_int_equal(bp_step_write(g_buf, sizeof g_buf, &h, &o, &err), 0);
    for (int i = 0; i < 3 * 8; i++)
        o.rows[i] = (float)i;
    const int32_t counts[3] = {1, 2, 1}, ids[4] = {5, 0, 3, 0};
    memcpy(o.counts, counts, sizeof counts);
    memcpy(o.ids, ids, sizeof ids);
    for (int i = 0; i < 4; i++)
        o.wts[i] = 0.25f * (float)(i + 1);
    return o.nbytes;
}

/* Offset of the first token of the message write_tokens makes. */
static size_t tokens_offset(void)
{
    bp_step_hdr_t h = {.kind = BP_STEP_TOKENS, .n_seqs = 2, .n_rows = 4};
    bp_step_layout_t lay;
    bl_err_t err = {0};
    assert_int_equal(bp_step_layout(&h, &lay, &err), 0);
    return lay.tokens;
}

static void expect_proto(size_t n, bp_step_kind_t want, uint64_t step, const char *field)
{
    bl_err_t err = {0};
    bp_step_in_t in = fresh_in();
    assert_int_equal(bp_step_parse(g_buf, n, &g_lim, want, step, &in, &err), BL_EPROTO);
    if (field && !strstr(err.msg, field))
        fail_msg("error '%s' does not name '%s'", err.msg, field);
}

static void test_step_tokens_round_trip(void **state)
{
    (void)state;
    size_t n = write_tokens(9);
    assert_int_equal(n % 16, 0);
    bl_err_t err = {0};
    bp_step_in_t in = fresh_in();
    assert_int_equal(bp_step_parse(g_buf, n, &g_lim, BP_STEP_TOKENS, 9, &in, &err), 0);
    assert_int_equal(in.hdr.n_seqs, 2);
    assert_int_equal(g_seqs[0].slot, 1);
    assert_int_equal(g_seqs[0].pos, 5);
    assert_int_equal(g_seqs[1].n, 1);
    assert_int_equal(g_ids[3], 37);
    assert_int_equal(bp_step_parse(g_buf, n, &g_lim, BP_STEP_TOKENS, BP_STEP_ANY, &in, &err), 0);
}

static void test_step_hidden_logits_sums_round_trip(void **state)
{
    (void)state;
    bl_err_t err = {0};
    bp_step_out_t o;
    bp_step_hdr_t h = {.kind = BP_STEP_HIDDEN, .step = 3, .n_seqs = 1, .n_rows = 2, .width = 8};
    assert_int_equal(bp_step_write(g_buf, sizeof g_buf, &h, &o, &err), 0);
    o.seqs[0] = (bp_step_seq_t){.slot = 0, .n = 2, .pos = 0, .n_out = 0};
    o.tokens[0] = 41; /* the step's tokens go on with the rows (a NextN layer reads them) */
    o.tokens[1] = 99;
    for (int i = 0; i < 16; i++)
        o.rows[i] = (float)i;
    assert_int_equal(((uintptr_t)o.rows) % 16, 0);
    bp_step_in_t in = fresh_in();
    assert_int_equal(bp_step_parse(g_buf, o.nbytes, &g_lim, BP_STEP_HIDDEN, 3, &in, &err), 0);
    assert_true(in.rows[15] == 15.0f);
    assert_int_equal(g_ids[0], 41);
    assert_int_equal(g_ids[1], 99);
    o.tokens[1] = 100; /* outside the vocabulary */
    assert_int_equal(bp_step_parse(g_buf, o.nbytes, &g_lim, BP_STEP_HIDDEN, 3, &in, &err), BL_EPROTO);
    assert_non_null(strstr(err.msg, "tokens[]"));

    h = (bp_step_hdr_t){.kind = BP_STEP_LOGITS, .step = 4, .n_rows = 2, .width = 100};
    assert_int_equal(bp_step_write(g_buf, sizeof g_buf, &h, &o, &err), 0);
    o.rows[199] = 1.5f;
    assert_int_equal(bp_step_parse(g_buf, o.nbytes, &g_lim, BP_STEP_LOGITS, 4, &in, &err), 0);
    assert_true(in.rows[199] == 1.5f);
    /* no logits wanted: still a valid reply */
    h.n_rows = 0;
    assert_int_equal(bp_step_write(g_buf, sizeof g_buf, &h, &o, &err), 0);
    assert_int_equal(bp_step_parse(g_buf, o.nbytes, &g_lim, BP_STEP_LOGITS, 4, &in, &err), 0);

    /* with the NextN layer's proposals (k 1): one a row, copied out and checked */
    bp_step_mtp_t mtp[4];
    in.mtp = mtp;
    h = (bp_step_hdr_t){.kind = BP_STEP_LOGITS, .step = 6, .n_rows = 2, .width = 100, .k = 1};
    assert_int_equal(bp_step_write(g_buf, sizeof g_buf, &h, &o, &err), 0);
    assert_non_null(o.mtp);
    assert_int_equal(((uintptr_t)o.mtp) % 16, 0);
    o.mtp[0] = (bp_step_mtp_t){.in = -1, .tok = -1};
    o.mtp[1] = (bp_step_mtp_t){.in = 7, .tok = 99, .p = 0.25f};
    assert_int_equal(bp_step_parse(g_buf, o.nbytes, &g_lim, BP_STEP_LOGITS, 6, &in, &err), 0);
    assert_int_equal(mtp[1].tok, 99);
    assert_true(mtp[1].p == 0.25f);
    const bp_step_mtp_t bad[] = {{.in = 100, .tok = 1}, {.in = -2, .tok = -1}, {.in = 3, .tok = -1},
                                 {.in = -1, .tok = 5}, {.in = 3, .tok = 100}, {.in = 3, .tok = 4, .p = 1.5f},
                                 {.in = 3, .tok = 4, .p = NAN}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(bp_step_write(g_buf, sizeof g_buf, &h, &o, &err), 0);
        o.mtp[0] = (bp_step_mtp_t){.in = -1, .tok = -1};
        o.mtp[1] = bad[i];
        assert_int_equal(bp_step_parse(g_buf, o.nbytes, &g_lim, BP_STEP_LOGITS, 6, &in, &err), BL_EPROTO);
        assert_non_null(strstr(err.msg, "mtp[]"));
    }
    h.k = 2; /* proposals are one a row */
    assert_int_equal(bp_step_write(g_buf, sizeof g_buf, &h, &o, &err), 0);
    assert_int_equal(bp_step_parse(g_buf, o.nbytes, &g_lim, BP_STEP_LOGITS, 6, &in, &err), BL_EPROTO);
    assert_non_null(strstr(err.msg, "field k"));
    h.k = 1; /* a reader with no room for them */
    assert_int_equal(bp_step_write(g_buf, sizeof g_buf, &h, &o, &err), 0);
    o.mtp[0] = o.mtp[1] = (bp_step_mtp_t){.in = -1, .tok = -1};
    in.mtp = NULL;
    assert_int_equal(bp_step_parse(g_buf, o.nbytes, &g_lim, BP_STEP_LOGITS, 6, &in, &err), BL_EINVAL);

    h = (bp_step_hdr_t){.kind = BP_STEP_SUMS, .step = 5, .n_rows = 1, .width = 8, .layer = 2};
    assert_int_equal(bp_step_write(g_buf, sizeof g_buf, &h, &o, &err), 0);
    assert_int_equal(bp_step_parse(g_buf, o.nbytes, &g_lim, BP_STEP_SUMS, 5, &in, &err), 0);
    assert_int_equal(in.hdr.layer, 2);
}

static void test_step_experts_round_trip(void **state)
{
    (void)state;
    size_t n = write_experts(11, 1, 3);
    bl_err_t err = {0};
    bp_step_in_t in = fresh_in();
    assert_int_equal(bp_step_parse(g_buf, n, &g_lim, BP_STEP_EXPERTS, 11, &in, &err), 0);
    assert_int_equal(in.hdr.n_rows, 3);
    assert_int_equal(g_ids[5], 5);
    assert_true(in.wts[1] == 0.5f);
    assert_true(in.rows[23] == 11.5f);
}

static void test_step_experts_with_a_count_per_row(void **state)
{
    (void)state;
    size_t n = write_experts_ragged();
    bl_err_t err = {0};
    bp_step_in_t in = fresh_in();
    assert_int_equal(bp_step_parse(g_buf, n, &g_lim, BP_STEP_EXPERTS, 3, &in, &err), 0);
    assert_int_equal(in.hdr.k, 4);
    assert_int_equal(g_counts[0], 1);
    assert_int_equal(g_counts[1], 2);
    assert_int_equal(g_ids[3], 0);
    assert_true(in.wts[3] == 1.0f);

    bp_step_hdr_t *h = (bp_step_hdr_t *)g_buf;
    bp_step_layout_t lay;
    assert_int_equal(bp_step_layout(h, &lay, &err), 0);
    int32_t *counts = (int32_t *)(g_buf + lay.counts), *ids = (int32_t *)(g_buf + lay.ids);
    counts[0] = 0; /* a row without a pair */
    expect_proto(n, BP_STEP_EXPERTS, 3, "counts[]");
    counts[0] = 3; /* more than the model's experts per row */
    expect_proto(n, BP_STEP_EXPERTS, 3, "counts[]");
    counts[0] = 2; /* counts that do not sum to k */
    expect_proto(n, BP_STEP_EXPERTS, 3, "sum of the rows' counts");
    counts[0] = 1;
    ids[2] = 0; /* row 1: expert 0 twice */
    expect_proto(n, BP_STEP_EXPERTS, 3, "twice");
    ids[2] = 3;
    h->k = 2; /* fewer pairs than rows */
    expect_proto(n, BP_STEP_EXPERTS, 3, "k");
    h->k = 7; /* more than n_rows * n_expert_used */
    expect_proto(n, BP_STEP_EXPERTS, 3, "k");
}

static void test_step_error_through_ring(void **state)
{
    (void)state;
    bl_err_t err = {0};
    bp_ring_t *p, *c;
    assert_int_equal(bp_ring_create(&p, "test-step", 1 << 16, BP_RING_PRODUCER, &err), 0);
    assert_int_equal(bp_ring_attach_fd(&c, bp_ring_fd(p), "test-step", BP_RING_CONSUMER, &err), 0);
    assert_int_equal(bp_step_push_error(p, 7, BL_EINVAL, "worker 1: token 5 out of range", 0,
                                        &err), 0);
    const void *m;
    size_t n;
    assert_int_equal(bp_ring_peek(c, &m, &n, 0, &err), 0);
    bp_step_in_t in = fresh_in();
    assert_int_equal(bp_step_parse(m, n, &g_lim, BP_STEP_LOGITS, 7, &in, &err), 0);
    assert_int_equal(in.hdr.kind, BP_STEP_ERROR);
    assert_int_equal(in.hdr.code, BL_EINVAL);
    assert_int_equal(in.hdr.text_len, strlen("worker 1: token 5 out of range"));
    assert_memory_equal(in.text, "worker 1: token 5", 17);
    bp_ring_release(c);

    /* an over-long text is cut, not refused */
    char longtext[3000];
    memset(longtext, 'x', sizeof longtext - 1);
    longtext[sizeof longtext - 1] = '\0';
    assert_int_equal(bp_step_push_error(p, 8, BL_EIO, longtext, 0, &err), 0);
    assert_int_equal(bp_ring_peek(c, &m, &n, 0, &err), 0);
    assert_int_equal(bp_step_parse(m, n, &g_lim, BP_STEP_LOGITS, 8, &in, &err), 0);
    assert_int_equal(in.hdr.text_len, BP_STEP_MAX_TEXT);
    bp_ring_release(c);
    bp_ring_destroy(c);
    bp_ring_destroy(p);
}

static void test_step_rejects_truncated_and_oversized(void **state)
{
    (void)state;
    size_t n = write_tokens(1);
    expect_proto(0, BP_STEP_TOKENS, 1, "shorter than its header");
    expect_proto(20, BP_STEP_TOKENS, 1, "shorter than its header");
    expect_proto(n - 4, BP_STEP_TOKENS, 1, "bytes");
    expect_proto(n + 16, BP_STEP_TOKENS, 1, "bytes");
    n = write_experts(1, 0, 2);
    expect_proto(n - 1, BP_STEP_EXPERTS, 1, "bytes");
}

static void test_step_rejects_bad_header(void **state)
{
    (void)state;
    size_t n = write_tokens(1);
    bp_step_hdr_t *h = (bp_step_hdr_t *)g_buf;
    expect_proto(n, BP_STEP_HIDDEN, 1, "where hidden was expected");
    expect_proto(n, BP_STEP_TOKENS, 2, "stale step 1");
    h->magic ^= 1;
    expect_proto(n, BP_STEP_TOKENS, 1, "magic");
    h->magic ^= 1;
    h->kind = 77;
    expect_proto(n, BP_STEP_TOKENS, 1, "unknown");
    h->kind = BP_STEP_TOKENS;
    h->n_rows = 17; /* past n_batch */
    expect_proto(n, BP_STEP_TOKENS, 1, "n_rows");
    h->n_rows = -1;
    expect_proto(n, BP_STEP_TOKENS, 1, "n_rows");
    h->n_rows = 4;
    h->n_seqs = 5; /* more than the slots */
    expect_proto(n, BP_STEP_TOKENS, 1, "n_seqs");
    h->n_seqs = 0x7fffffff;
    expect_proto(n, BP_STEP_TOKENS, 1, "n_seqs");
    h->n_seqs = 2;
    h->width = 8; /* tokens carry no floats */
    expect_proto(n, BP_STEP_TOKENS, 1, "width");
    h->width = 0;
    h->code = BL_EIO;
    expect_proto(n, BP_STEP_TOKENS, 1, "code");
}

static void test_step_rejects_bad_sequences(void **state)
{
    (void)state;
    bp_step_seq_t *s = (bp_step_seq_t *)(g_buf + sizeof(bp_step_hdr_t));
    size_t n = write_tokens(1);
    s[0].slot = 4;
    expect_proto(n, BP_STEP_TOKENS, 1, "slot");
    n = write_tokens(1);
    s[1].slot = -1;
    expect_proto(n, BP_STEP_TOKENS, 1, "slot");
    n = write_tokens(1);
    s[0].pos = 62; /* 62 + 3 > n_ctx 64 */
    expect_proto(n, BP_STEP_TOKENS, 1, "pos");
    n = write_tokens(1);
    s[0].pos = INT64_MAX;
    expect_proto(n, BP_STEP_TOKENS, 1, "pos");
    n = write_tokens(1);
    s[0].pos = -1;
    expect_proto(n, BP_STEP_TOKENS, 1, "pos");
    n = write_tokens(1);
    s[0].n_out = 4;
    expect_proto(n, BP_STEP_TOKENS, 1, "n_out");
    n = write_tokens(1);
    s[0].n = 2; /* rows no longer add up */
    expect_proto(n, BP_STEP_TOKENS, 1, "n_rows");
    n = write_tokens(1);
    s[1].n = 0;
    expect_proto(n, BP_STEP_TOKENS, 1, "seqs[].n");
}

static void test_step_rejects_bad_ids(void **state)
{
    (void)state;
    size_t n = write_tokens(1);
    int32_t *tok = (int32_t *)(g_buf + tokens_offset());
    tok[2] = 100; /* n_vocab */
    expect_proto(n, BP_STEP_TOKENS, 1, "tokens[]");
    tok[2] = -5;
    expect_proto(n, BP_STEP_TOKENS, 1, "tokens[]");

    n = write_experts(1, 0, 2);
    bp_step_hdr_t *h = (bp_step_hdr_t *)g_buf;
    bp_step_layout_t lay;
    bl_err_t err = {0};
    assert_int_equal(bp_step_layout(h, &lay, &err), 0);
    int32_t *ids = (int32_t *)(g_buf + lay.ids);
    ids[3] = 6;
    expect_proto(n, BP_STEP_EXPERTS, 1, "ids[]");
    ids[3] = 0;
    h->layer = 3;
    expect_proto(n, BP_STEP_EXPERTS, 1, "layer");
    h->layer = 0;
    h->k = 5;
    expect_proto(n, BP_STEP_EXPERTS, 1, "k");
    h->k = 4;
    h->width = 9;
    expect_proto(n, BP_STEP_EXPERTS, 1, "width");
}

/* A KV message: save slot 1's 10 positions as entry 7, load entry 3's 5 into slot
 * 0, drop entry 2. */
static size_t write_kv(bp_step_kvop_t **ops)
{
    bl_err_t err = {0};
    bp_step_hdr_t h = {.kind = BP_STEP_KV, .step = 4, .n_seqs = 3};
    bp_step_out_t o;
    assert_int_equal(bp_step_write(g_buf, sizeof g_buf, &h, &o, &err), 0);
    o.kvops[0] = (bp_step_kvop_t){.op = BP_KV_SAVE, .slot = 1, .entry = 7, .n = 10};
    o.kvops[1] = (bp_step_kvop_t){.op = BP_KV_LOAD, .slot = 0, .entry = 3, .n = 5, .bytes = 40};
    o.kvops[2] = (bp_step_kvop_t){.op = BP_KV_DROP, .entry = 2};
    *ops = o.kvops;
    return o.nbytes;
}

static void test_step_kv_ops(void **state)
{
    (void)state;
    bl_err_t err = {0};
    bp_step_kvop_t *ops;
    size_t n = write_kv(&ops);
    /* read where the pipeline's kinds are read; nowhere else */
    static const bp_step_kind_t ok[] = {BP_STEP_TOKENS, BP_STEP_HIDDEN, BP_STEP_LOGITS};
    for (size_t k = 0; k < 3; k++) {
        bp_step_in_t in = fresh_in();
        assert_int_equal(bp_step_parse(g_buf, n, &g_lim, ok[k], 4, &in, &err), 0);
        assert_int_equal(in.hdr.kind, BP_STEP_KV);
        assert_int_equal(in.hdr.n_seqs, 3);
        assert_int_equal(in.kvops[0].op, BP_KV_SAVE);
        assert_int_equal(in.kvops[1].entry, 3);
        assert_int_equal(in.kvops[1].bytes, 40);
        assert_int_equal(in.kvops[2].op, BP_KV_DROP);
    }
    expect_proto(n, BP_STEP_EXPERTS, 4, "kind kv");
    expect_proto(n, BP_STEP_SUMS, 4, "kind kv");
    /* each field out of range, named */
    static const struct {
        int at;
        bp_step_kvop_t op;
        const char *field;
    } bad[] = {
        {0, {.op = BP_KV_ROLLBACK + 1, .slot = 1, .entry = 7, .n = 10}, "ops[].op"},
        {0, {.op = 0, .slot = 1, .entry = 7, .n = 10}, "ops[].op"},
        {0, {.op = BP_KV_SAVE, .slot = 4, .entry = 7, .n = 10}, "ops[].slot"},
        {0, {.op = BP_KV_SAVE, .slot = -1, .entry = 7, .n = 10}, "ops[].slot"},
        {2, {.op = BP_KV_DROP, .slot = 1, .entry = 2}, "ops[].slot"},
        {0, {.op = BP_KV_SAVE, .slot = 1, .entry = -1, .n = 10}, "ops[].entry"},
        {0, {.op = BP_KV_SAVE, .slot = 1, .entry = 7, .n = 0}, "ops[].n"},
        {1, {.op = BP_KV_LOAD, .slot = 0, .entry = 3, .n = 65}, "ops[].n"},
        {2, {.op = BP_KV_DROP, .entry = 2, .n = 1}, "ops[].n"},
        {1, {.op = BP_KV_LOAD, .slot = 0, .entry = 3, .n = 5, .bytes = -1}, "ops[].bytes"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        write_kv(&ops);
        ops[bad[i].at] = bad[i].op;
        expect_proto(n, BP_STEP_TOKENS, 4, bad[i].field);
    }
    /* no ops, too many */
    bp_step_hdr_t h = {.magic = BP_STEP_MAGIC, .kind = BP_STEP_KV, .step = 4, .n_seqs = 0};
    memcpy(g_buf, &h, sizeof h);
    expect_proto(sizeof h, BP_STEP_TOKENS, 4, "n_seqs");
    h.n_seqs = BP_STEP_MAX_KVOPS + 1;
    memcpy(g_buf, &h, sizeof h);
    expect_proto(sizeof h + (BP_STEP_MAX_KVOPS + 1) * sizeof(bp_step_kvop_t), BP_STEP_TOKENS, 4,
                 "n_seqs");
}

/* A HIDDEN message of 3 rows in card buffer `card` (1-based), with its sequences. */
static size_t write_card_hidden(uint32_t card)
{
    bl_err_t err = {0};
    bp_step_hdr_t h = {.kind = BP_STEP_HIDDEN, .step = 12, .n_seqs = 1, .n_rows = 3, .width = 8, .card = card};
    bp_step_out_t o;
    assert_int_equal(bp_step_write(g_buf, sizeof g_buf, &h, &o, &err), 0);
    assert_null(o.rows);
    o.seqs[0] = (bp_step_seq_t){.slot = 0, .n = 3, .pos = 4, .n_out = 1};
    for (int i = 0; i < 3; i++)
        o.tokens[i] = 10 + i;
    return o.nbytes;
}

static void test_step_card_hidden_carries_no_rows(void **state)
{
    (void)state;
    const bp_step_limits_t lim = {.n_slots = 4, .n_batch = 16, .n_ctx = 64, .n_out_max = 4, .n_embd = 8,
                                  .n_vocab = 100, .n_layer = 3, .card_bufs = 2};
    const size_t n = write_card_hidden(2);
    /* header, one sequence and its tokens: the rows' 96 bytes stay on the card */
    assert_int_equal(n, ((sizeof(bp_step_hdr_t) + sizeof(bp_step_seq_t) + 15) & ~(size_t)15) + 3 * sizeof(int32_t));
    bl_err_t err = {0};
    bp_step_in_t in = fresh_in();
    assert_int_equal(bp_step_parse(g_buf, n, &lim, BP_STEP_HIDDEN, 12, &in, &err), 0);
    assert_int_equal(in.hdr.card, 2);
    assert_int_equal(in.hdr.n_rows, 3);
    assert_null(in.rows);
    assert_int_equal(g_seqs[0].pos, 4);
    /* a host message on the same link still carries its rows */
    bp_step_hdr_t h = {.kind = BP_STEP_HIDDEN, .step = 13, .n_seqs = 1, .n_rows = 3, .width = 8};
    bp_step_out_t o;
    assert_int_equal(bp_step_write(g_buf, sizeof g_buf, &h, &o, &err), 0);
    o.seqs[0] = (bp_step_seq_t){.slot = 0, .n = 3, .pos = 7, .n_out = 0};
    memset(o.tokens, 0, 3 * sizeof *o.tokens);
    assert_int_equal(bp_step_parse(g_buf, o.nbytes, &lim, BP_STEP_HIDDEN, 13, &in, &err), 0);
    assert_non_null(in.rows);
}

static void test_step_rejects_bad_card_buffers(void **state)
{
    (void)state;
    bp_step_limits_t lim = g_lim;
    lim.card_bufs = 2;
    bl_err_t err = {0};
    bp_step_in_t in = fresh_in();
    /* past the link's buffers */
    size_t n = write_card_hidden(3);
    assert_int_equal(bp_step_parse(g_buf, n, &lim, BP_STEP_HIDDEN, BP_STEP_ANY, &in, &err), BL_EPROTO);
    assert_non_null(strstr(err.msg, "card"));
    n = write_card_hidden(UINT32_MAX);
    assert_int_equal(bp_step_parse(g_buf, n, &lim, BP_STEP_HIDDEN, BP_STEP_ANY, &in, &err), BL_EPROTO);
    /* a reader without a card link takes none */
    n = write_card_hidden(1);
    expect_proto(n, BP_STEP_HIDDEN, BP_STEP_ANY, "card");
    /* a card message with the rows appended after all: the size is not its layout's */
    assert_int_equal(bp_step_parse(g_buf, n + 96, &lim, BP_STEP_HIDDEN, BP_STEP_ANY, &in, &err), BL_EPROTO);
    /* more rows than a buffer holds (n_batch): refused as any HIDDEN message */
    bp_step_hdr_t big = {.kind = BP_STEP_HIDDEN, .n_seqs = 1, .n_rows = 17, .width = 8, .card = 1};
    bp_step_out_t o;
    assert_int_equal(bp_step_write(g_buf, sizeof g_buf, &big, &o, &err), 0);
    o.seqs[0] = (bp_step_seq_t){.slot = 0, .n = 17, .pos = 0};
    assert_int_equal(bp_step_parse(g_buf, o.nbytes, &lim, BP_STEP_HIDDEN, BP_STEP_ANY, &in, &err), BL_EPROTO);
    assert_non_null(strstr(err.msg, "n_rows"));
    /* sequences that do not cover the rows, as with rows in the message */
    n = write_card_hidden(1);
    ((bp_step_seq_t *)(g_buf + sizeof(bp_step_hdr_t)))->n = 2;
    assert_int_equal(bp_step_parse(g_buf, n, &lim, BP_STEP_HIDDEN, BP_STEP_ANY, &in, &err), BL_EPROTO);
    /* the card flag on other kinds */
    n = write_tokens(1);
    ((bp_step_hdr_t *)g_buf)->card = 1;
    assert_int_equal(bp_step_parse(g_buf, n, &lim, BP_STEP_TOKENS, BP_STEP_ANY, &in, &err), BL_EPROTO);
    assert_non_null(strstr(err.msg, "card"));
}

static void test_step_layout_refuses_negative_and_unknown(void **state)
{
    (void)state;
    bl_err_t err = {0};
    bp_step_layout_t lay;
    bp_step_hdr_t h = {.kind = BP_STEP_HIDDEN, .n_seqs = 1, .n_rows = -3, .width = 8};
    assert_int_equal(bp_step_layout(&h, &lay, &err), BL_EINVAL);
    h = (bp_step_hdr_t){.kind = 0};
    assert_int_equal(bp_step_layout(&h, &lay, &err), BL_EINVAL);
    h = (bp_step_hdr_t){.kind = BP_STEP_SUMS, .n_rows = 4, .width = 8};
    bp_step_out_t o;
    assert_int_equal(bp_step_write(g_buf, 100, &h, &o, &err), BL_ERANGE);
}

/* Valid messages with random bytes changed and random lengths: every parse either
 * succeeds or says BL_EPROTO, and (under ASan) reads nothing outside the bytes. */
static void test_step_survives_corrupted_messages(void **state)
{
    (void)state;
    rng_t r = rng_for(1);
    for (int it = 0; it < 20000; it++) {
        size_t n = it % 2 ? write_tokens(4) : write_experts(4, 1, 3);
        int flips = (int)(rng_next(&r) % 4);
        for (int f = 0; f < flips; f++)
            g_buf[rng_next(&r) % n] ^= (uint8_t)(1u << (rng_next(&r) % 8));
        size_t len = rng_next(&r) % 3 == 0 ? (size_t)(rng_next(&r) % (n + 32)) : n;
        bl_err_t err = {0};
        bp_step_in_t in = fresh_in();
        int rc = bp_step_parse(g_buf, len, &g_lim, it % 2 ? BP_STEP_TOKENS : BP_STEP_EXPERTS,
                               BP_STEP_ANY, &in, &err);
        if (rc != 0 && rc != BL_EPROTO)
            fail_msg("iteration %d: rc %d (%s)", it, rc, err.msg);
    }
}

int main(void)
{
    test_seed_init("test_proto_step");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_tokens_round_trip),
        cmocka_unit_test(test_step_hidden_logits_sums_round_trip),
        cmocka_unit_test(test_step_experts_round_trip),
        cmocka_unit_test(test_step_experts_with_a_count_per_row),
        cmocka_unit_test(test_step_error_through_ring),
        cmocka_unit_test(test_step_rejects_truncated_and_oversized),
        cmocka_unit_test(test_step_rejects_bad_header),
        cmocka_unit_test(test_step_rejects_bad_sequences),
        cmocka_unit_test(test_step_rejects_bad_ids),
        cmocka_unit_test(test_step_kv_ops),
        cmocka_unit_test(test_step_card_hidden_carries_no_rows),
        cmocka_unit_test(test_step_rejects_bad_card_buffers),
        cmocka_unit_test(test_step_layout_refuses_negative_and_unknown),
        cmocka_unit_test(test_step_survives_corrupted_messages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
