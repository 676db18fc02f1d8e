/* libFuzzer target for the per-step ring messages (proto/step.c), the bytes a peer
 * process writes into shared memory: the first input byte picks the kind the reader
 * expects, the rest is the message. Invariants beside the sanitizers': a parse
 * succeeds or answers BL_EPROTO; an accepted message's counts are what the reader may
 * use (rows within the plan, an EXPERTS message's per-row counts in 1..n_expert_used
 * summing to k, distinct ids below n_expert within each row, tokens (TOKENS, HIDDEN)
 * below n_vocab, a LOGITS message's NextN proposals tokens of the vocabulary (or -1
 * and -1) with probabilities in 0..1, sequences covering n_rows, a KV message's ops
 * each a known op on a slot of the
 * plan with positions inside its cache, a HIDDEN message that names a card buffer
 * names one of the link's and carries no rows), every section lies inside the bytes
 * given, and writing the same header again gives the same size. Seeds:
 * tests/fuzz/corpus/fuzz_step/ (valid messages of each kind). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "step.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const bp_step_limits_t g_lim = {
    .n_slots = 4, .n_batch = 16, .n_ctx = 64, .n_out_max = 4, .n_embd = 8, .n_vocab = 100,
    .n_layer = 3, .n_expert = 6, .n_expert_used = 3, .card_bufs = 2,
};

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_step: %s\n", what);
        abort();
    }
}

static int inside(const void *p, size_t n, const uint8_t *base, size_t size)
{
    const uint8_t *q = p;
    return q >= base && n <= size && (size_t)(q - base) <= size - n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const bp_step_kind_t kinds[] = {BP_STEP_TOKENS, BP_STEP_HIDDEN, BP_STEP_LOGITS,
                                           BP_STEP_EXPERTS, BP_STEP_SUMS};
    const bp_step_kind_t want = kinds[data[0] % 5];
    /* the ring hands readers 16-byte aligned messages */
    const size_t n = size - 1;
    uint8_t *msg = aligned_alloc(16, n ? (n + 15) & ~(size_t)15 : 16);
    check(msg != NULL, "out of memory");
    memcpy(msg, data + 1, n);
    static bp_step_seq_t seqs[4];
    static int32_t ids[16 * 3], counts[16];
    static bp_step_kvop_t kvops[BP_STEP_MAX_KVOPS];
    static bp_step_mtp_t mtp[16];
    bp_step_in_t in = {.seqs = seqs, .ids = ids, .counts = counts, .kvops = kvops, .mtp = mtp};
    bl_err_t err = {0};
    const int rc = bp_step_parse(msg, n, &g_lim, want, BP_STEP_ANY, &in, &err);
    check(rc == 0 || rc == BL_EPROTO, "a parse that is neither ok nor BL_EPROTO");
    check(rc == 0 || err.msg[0], "a refusal without a message");
    if (rc == 0) {
        const bp_step_hdr_t *h = &in.hdr;
        bp_step_layout_t lay;
        check(bp_step_layout(h, &lay, &err) == 0 && lay.nbytes == n, "an accepted size that is not its layout's");
        if (h->kind == BP_STEP_ERROR) {
            check(h->code < 0 && h->text_len <= BP_STEP_MAX_TEXT, "an error without a code or too long");
            check(inside(in.text, h->text_len, msg, n), "error text outside the message");
        } else {
            check(h->n_rows >= 0 && h->n_rows <= g_lim.n_batch, "rows outside the plan");
            if (in.rows)
                check(inside(in.rows, (size_t)h->n_rows * (size_t)h->width * sizeof(float), msg, n),
                      "rows outside the message");
        }
        if (h->card != 0) {
            check(h->kind == BP_STEP_HIDDEN && h->card <= (uint32_t)g_lim.card_bufs,
                  "a card buffer named outside a hidden message or past the link's");
            check(in.rows == NULL, "a card message with rows");
        }
        if (h->kind == BP_STEP_KV) {
            check(want == BP_STEP_TOKENS || want == BP_STEP_HIDDEN || want == BP_STEP_LOGITS,
                  "KV ops accepted off the pipeline");
            check(h->n_seqs >= 1 && h->n_seqs <= BP_STEP_MAX_KVOPS, "KV ops outside the bound");
            for (int32_t i = 0; i < h->n_seqs; i++) {
                const bp_step_kvop_t *o = &kvops[i];
                const int drop = o->op == BP_KV_DROP, none = drop || o->op == BP_KV_CLEAR;
                check(o->op >= BP_KV_SAVE && o->op <= BP_KV_ROLLBACK, "an unknown KV op");
                check(drop || o->op == BP_KV_PERSIST ? o->slot == 0
                                                     : (o->slot >= 0 && o->slot < g_lim.n_slots),
                      "a KV op on a slot outside the plan");
                check(none ? o->n == 0 : (o->n >= 1 && o->n <= g_lim.n_ctx), "KV positions outside the cache");
                check(o->entry >= 0 && o->bytes >= 0, "a KV op with a negative entry or size");
            }
        }
        if (h->kind == BP_STEP_TOKENS || h->kind == BP_STEP_HIDDEN) {
            int64_t rows = 0;
            for (int32_t i = 0; i < h->n_seqs; i++) {
                check(seqs[i].slot >= 0 && seqs[i].slot < g_lim.n_slots, "a slot outside the plan");
                check(seqs[i].n >= 1 && seqs[i].pos >= 0 && seqs[i].pos + seqs[i].n <= g_lim.n_ctx,
                      "a sequence outside its cache");
                rows += seqs[i].n;
            }
            check(rows == h->n_rows, "sequences that do not cover the rows");
        }
        if (h->kind == BP_STEP_TOKENS || h->kind == BP_STEP_HIDDEN)
            for (int32_t i = 0; i < h->n_rows; i++)
                check(ids[i] >= 0 && ids[i] < g_lim.n_vocab, "a token outside the vocabulary");
        if (h->kind == BP_STEP_LOGITS && h->k)
            for (int32_t i = 0; i < h->n_rows; i++)
                check(mtp[i].in >= -1 && mtp[i].in < g_lim.n_vocab && (mtp[i].in < 0) == (mtp[i].tok < 0) &&
                          mtp[i].tok < g_lim.n_vocab && mtp[i].p >= 0.0f && mtp[i].p <= 1.0f,
                      "a NextN proposal outside the vocabulary or not a probability");
        if (h->kind == BP_STEP_EXPERTS) {
            int64_t sum = 0;
            for (int32_t r = 0; r < h->n_rows; r++) {
                check(counts[r] >= 1 && counts[r] <= g_lim.n_expert_used, "a row's count out of range");
                for (int32_t i = 0; i < counts[r]; i++) {
                    const int32_t id = ids[sum + i];
                    check(id >= 0 && id < g_lim.n_expert, "an expert id out of range");
                    for (int32_t j = 0; j < i; j++)
                        check(ids[sum + j] != id, "an expert twice in one row");
                }
                sum += counts[r];
            }
            check(sum == h->k, "counts that do not sum to k");
            check(inside(in.wts, (size_t)h->k * sizeof(float), msg, n), "weights outside the message");
        }
    }
    free(msg);
    return 0;
}
