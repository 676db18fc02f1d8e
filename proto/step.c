/* The per-step ring messages: layout, writing in place, and the checks a receiver
 * runs on a peer's bytes before it trusts a count. See step.h. */
#include "step.h"

#include <string.h>

_Static_assert(sizeof(bp_step_hdr_t) == 48, "step header is 48 bytes on the wire");
_Static_assert(sizeof(bp_step_seq_t) == 24, "step sequence is 24 bytes on the wire");
_Static_assert(sizeof(bp_step_mtp_t) == 16, "a NextN proposal is 16 bytes on the wire");
_Static_assert(sizeof(bp_step_hdr_t) % BP_RING_ALIGN == 0, "sections after the header align");

static const char *const g_kind_names[] = {
    [BP_STEP_TOKENS] = "tokens", [BP_STEP_HIDDEN] = "hidden", [BP_STEP_LOGITS] = "logits",
    [BP_STEP_EXPERTS] = "experts", [BP_STEP_SUMS] = "sums", [BP_STEP_ERROR] = "error", [BP_STEP_KV] = "kv",
};

const char *bp_step_kind_name(uint32_t kind)
{
    return kind >= BP_STEP_TOKENS && kind <= BP_STEP_KV ? g_kind_names[kind] : "unknown";
}

/* ------------------------------------------------------------------ layout */

/* Appends a section of n elements of size sz at *at (16-byte aligned) and returns its
 * offset; counts are bounded by the caller to int32 ranges, so size_t does not wrap
 * on a 64-bit host except through n * sz, which is checked. */
static int section(size_t *at, uint64_t n, size_t sz, size_t *off)
{
    size_t start = (*at + 15u) & ~(size_t)15u;
    if (n > (SIZE_MAX - start) / sz)
        return -1;
    *off = start;
    *at = start + (size_t)n * sz;
    return 0;
}

int bp_step_layout(const bp_step_hdr_t *h, bp_step_layout_t *out, bl_err_t *err)
{
    memset(out, 0, sizeof *out);
    if (h->n_seqs < 0 || h->n_rows < 0 || h->width < 0 || h->k < 0)
        return bl_err_set(err, BL_EINVAL, "step message %s: negative count",
                          bp_step_kind_name(h->kind));
    size_t at = sizeof(bp_step_hdr_t);
    uint64_t rows = (uint64_t)h->n_rows;
    uint64_t cells = rows * (uint64_t)h->width; /* both < 2^31: no wrap */
    uint64_t picks = (uint64_t)h->k;
    int bad = 0;
    switch (h->kind) {
    case BP_STEP_TOKENS:
        bad |= section(&at, (uint64_t)h->n_seqs, sizeof(bp_step_seq_t), &out->seqs);
        bad |= section(&at, rows, sizeof(int32_t), &out->tokens);
        break;
    case BP_STEP_HIDDEN:
        bad |= section(&at, (uint64_t)h->n_seqs, sizeof(bp_step_seq_t), &out->seqs);
        bad |= section(&at, rows, sizeof(int32_t), &out->tokens);
        if (!h->card) /* else the rows are in a card buffer */
            bad |= section(&at, cells, sizeof(float), &out->rows);
        break;
    case BP_STEP_LOGITS:
        bad |= section(&at, cells, sizeof(float), &out->rows);
        if (h->k)
            bad |= section(&at, rows, sizeof(bp_step_mtp_t), &out->mtp);
        break;
    case BP_STEP_SUMS:
        bad |= section(&at, cells, sizeof(float), &out->rows);
        break;
    case BP_STEP_EXPERTS:
        bad |= section(&at, cells, sizeof(float), &out->rows);
        bad |= section(&at, rows, sizeof(int32_t), &out->counts);
        bad |= section(&at, picks, sizeof(int32_t), &out->ids);
        bad |= section(&at, picks, sizeof(float), &out->wts);
        break;
    case BP_STEP_ERROR:
        bad |= section(&at, h->text_len, 1, &out->text);
        break;
    case BP_STEP_KV:
        bad |= section(&at, (uint64_t)h->n_seqs, sizeof(bp_step_kvop_t), &out->kvops);
        break;
    default:
        return bl_err_set(err, BL_EINVAL, "step message: unknown kind %u", h->kind);
    }
    if (bad)
        return bl_err_set(err, BL_ERANGE, "step message %s: size overflows",
                          bp_step_kind_name(h->kind));
    out->nbytes = at;
    return 0;
}

/* ------------------------------------------------------------------ writing */

static void point(uint8_t *base, const bp_step_hdr_t *h, const bp_step_layout_t *lay,
                  bp_step_out_t *out)
{
    bp_step_hdr_t hw = *h;
    hw.magic = BP_STEP_MAGIC;
    memcpy(base, &hw, sizeof hw);
    out->seqs = lay->seqs ? (bp_step_seq_t *)(base + lay->seqs) : NULL;
    out->tokens = lay->tokens ? (int32_t *)(base + lay->tokens) : NULL;
    out->rows = lay->rows ? (float *)(base + lay->rows) : NULL;
    out->counts = lay->counts ? (int32_t *)(base + lay->counts) : NULL;
    out->ids = lay->ids ? (int32_t *)(base + lay->ids) : NULL;
    out->wts = lay->wts ? (float *)(base + lay->wts) : NULL;
    out->text = lay->text ? (char *)(base + lay->text) : NULL;
    out->kvops = lay->kvops ? (bp_step_kvop_t *)(base + lay->kvops) : NULL;
    out->mtp = lay->mtp ? (bp_step_mtp_t *)(base + lay->mtp) : NULL;
    out->nbytes = lay->nbytes;
}

int bp_step_reserve(bp_ring_t *r, const bp_step_hdr_t *h, bp_step_out_t *out,
                    int64_t timeout_us, bl_err_t *err)
{
    bp_step_layout_t lay;
    int rc = bp_step_layout(h, &lay, err);
    if (rc)
        return rc;
    void *p;
    if ((rc = bp_ring_reserve(r, lay.nbytes, &p, timeout_us, err)) != 0)
        return rc;
    point(p, h, &lay, out);
    return 0;
}

int bp_step_write(void *buf, size_t cap, const bp_step_hdr_t *h, bp_step_out_t *out,
                  bl_err_t *err)
{
    bp_step_layout_t lay;
    int rc = bp_step_layout(h, &lay, err);
    if (rc)
        return rc;
    if (lay.nbytes > cap)
        return bl_err_set(err, BL_ERANGE, "step message %s of %zu bytes, buffer of %zu",
                          bp_step_kind_name(h->kind), lay.nbytes, cap);
    point(buf, h, &lay, out);
    return 0;
}

int bp_step_push_error(bp_ring_t *r, uint64_t step, int code, const char *text,
                       int64_t timeout_us, bl_err_t *err)
{
    size_t len = strnlen(text, BP_STEP_MAX_TEXT);
    bp_step_hdr_t h = {.kind = BP_STEP_ERROR, .step = step, .code = code < 0 ? code : BL_EIO,
                       .text_len = (uint32_t)len};
    bp_step_out_t o;
    int rc = bp_step_reserve(r, &h, &o, timeout_us, err);
    if (rc)
        return rc;
    memcpy(o.text, text, len);
    return bp_ring_commit(r, o.nbytes, err);
}

/* ------------------------------------------------------------------ reading */

static int bad(bl_err_t *err, const bp_step_hdr_t *h, const char *field, int64_t value,
               const char *why)
{
    return bl_err_set(err, BL_EPROTO, "step message %s (step %llu): field %s = %lld %s",
                      bp_step_kind_name(h->kind), (unsigned long long)h->step, field,
                      (long long)value, why);
}

/* Checks the copied sequences: each inside the plan, the rows adding up. */
static int check_seqs(const bp_step_hdr_t *h, const bp_step_seq_t *s, const bp_step_limits_t *lim,
                      bl_err_t *err)
{
    int64_t rows = 0;
    for (int32_t i = 0; i < h->n_seqs; i++) {
        if (s[i].slot < 0 || s[i].slot >= lim->n_slots)
            return bad(err, h, "seqs[].slot", s[i].slot, "is outside the plan's slots");
        if (s[i].n < 1 || s[i].n > h->n_rows)
            return bad(err, h, "seqs[].n", s[i].n, "is not in 1..n_rows");
        if (s[i].pos < 0 || s[i].pos > lim->n_ctx - s[i].n)
            return bad(err, h, "seqs[].pos", s[i].pos, "puts the rows past the slot's context");
        if (s[i].n_out < 0 || s[i].n_out > s[i].n)
            return bad(err, h, "seqs[].n_out", s[i].n_out, "is not in 0..n");
        rows += s[i].n;
    }
    if (rows != h->n_rows)
        return bad(err, h, "n_rows", h->n_rows, "differs from the sequences' rows");
    return 0;
}

int bp_step_parse(const void *msg, size_t nbytes, const bp_step_limits_t *lim,
                  bp_step_kind_t want, uint64_t want_step, bp_step_in_t *in, bl_err_t *err)
{
    bp_step_hdr_t *h = &in->hdr;
    in->rows = in->wts = NULL;
    in->text = NULL;
    if (nbytes < sizeof *h) {
        memset(h, 0, sizeof *h);
        return bl_err_set(err, BL_EPROTO, "step message: %zu bytes, shorter than its header",
                          nbytes);
    }
    memcpy(h, msg, sizeof *h); /* one copy: later checks see what this side will use */
    if (h->magic != BP_STEP_MAGIC)
        return bad(err, h, "magic", h->magic, "is not a step message");
    const int kv_ok = want == BP_STEP_TOKENS || want == BP_STEP_HIDDEN || want == BP_STEP_LOGITS;
    if (h->kind != (uint32_t)want && h->kind != BP_STEP_ERROR && !(h->kind == BP_STEP_KV && kv_ok))
        return bl_err_set(err, BL_EPROTO, "step message: kind %s (%u) where %s was expected",
                          bp_step_kind_name(h->kind), h->kind, bp_step_kind_name(want));
    if (want_step != BP_STEP_ANY && h->step != want_step)
        return bl_err_set(err, BL_EPROTO, "step message %s: stale step %llu, expected %llu",
                          bp_step_kind_name(h->kind), (unsigned long long)h->step,
                          (unsigned long long)want_step);

    /* Bound every count before the layout multiplies them. */
    int32_t want_width = 0, min_rows = 1, max_rows = lim->n_batch;
    switch (h->kind) {
    case BP_STEP_TOKENS: break;
    case BP_STEP_HIDDEN:
    case BP_STEP_SUMS:
    case BP_STEP_EXPERTS: want_width = lim->n_embd; break;
    case BP_STEP_LOGITS:
        want_width = lim->n_vocab;
        min_rows = 0; /* a prompt chunk that wants no logits still says it is done */
        max_rows = lim->n_out_max;
        break;
    case BP_STEP_ERROR:
    case BP_STEP_KV: min_rows = max_rows = 0; break;
    }
    if (h->n_rows < min_rows || h->n_rows > max_rows)
        return bad(err, h, "n_rows", h->n_rows, "is outside the plan's rows per step");
    if (h->width != want_width)
        return bad(err, h, "width", h->width, "differs from the model's");
    int seqs = h->kind == BP_STEP_TOKENS || h->kind == BP_STEP_HIDDEN;
    if (h->kind == BP_STEP_KV ? (h->n_seqs < 1 || h->n_seqs > BP_STEP_MAX_KVOPS)
        : seqs                ? (h->n_seqs < 1 || h->n_seqs > lim->n_slots)
                              : h->n_seqs != 0)
        return bad(err, h, "n_seqs", h->n_seqs, "is outside the plan's slots or ops");
    int experts = h->kind == BP_STEP_EXPERTS || h->kind == BP_STEP_SUMS;
    if (experts ? (h->layer < 0 || h->layer >= lim->n_layer) : h->layer != 0)
        return bad(err, h, "layer", h->layer, "is not a layer of the model");
    if (h->kind == BP_STEP_EXPERTS
            ? h->k < h->n_rows || (int64_t)h->k > (int64_t)h->n_rows * lim->n_expert_used
            : h->kind == BP_STEP_LOGITS ? h->k != 0 && h->k != 1 : h->k != 0)
        return bad(err, h, "k", h->k, h->kind == BP_STEP_LOGITS ? "is not 0 or 1 (NextN proposals)"
                   : "is not in n_rows..n_rows * the model's experts per row");
    if (h->kind == BP_STEP_ERROR) {
        if (h->code >= 0)
            return bad(err, h, "code", h->code, "is not an error code");
        if (h->text_len > BP_STEP_MAX_TEXT)
            return bad(err, h, "text_len", h->text_len, "exceeds 1024");
    } else if (h->code != 0 || h->text_len != 0) {
        return bad(err, h, "code", h->code, "is set outside an error");
    }
    /* A card buffer holds n_batch rows (checked when the link opened), so the rows
     * bound above fit it; the index is the peer's word, bounded here. */
    if (h->card != 0 && h->kind != BP_STEP_HIDDEN)
        return bad(err, h, "card", h->card, "is set outside a hidden message");
    if (h->card > (uint32_t)(lim->card_bufs > 0 ? lim->card_bufs : 0))
        return bad(err, h, "card", h->card, "names a card buffer the link does not have");

    bp_step_layout_t lay;
    int rc = bp_step_layout(h, &lay, err);
    if (rc)
        return bl_err_set(err, BL_EPROTO, "%s", err ? err->msg : "step message: bad layout");
    if (lay.nbytes != nbytes)
        return bl_err_set(err, BL_EPROTO, "step message %s (step %llu): %zu bytes, its counts "
                          "make %zu", bp_step_kind_name(h->kind), (unsigned long long)h->step,
                          nbytes, lay.nbytes);

    const uint8_t *base = msg;
    if (seqs) {
        if (in->seqs == NULL)
            return bl_err_set(err, BL_EINVAL, "step message: no room for sequences");
        memcpy(in->seqs, base + lay.seqs, (size_t)h->n_seqs * sizeof *in->seqs);
        if ((rc = check_seqs(h, in->seqs, lim, err)) != 0)
            return rc;
    }
    if (h->kind == BP_STEP_EXPERTS) {
        if (in->counts == NULL)
            return bl_err_set(err, BL_EINVAL, "step message: no room for pair counts");
        memcpy(in->counts, base + lay.counts, (size_t)h->n_rows * sizeof *in->counts);
        int64_t sum = 0;
        for (int32_t i = 0; i < h->n_rows; i++) {
            if (in->counts[i] < 1 || in->counts[i] > lim->n_expert_used)
                return bad(err, h, "counts[]", in->counts[i], "is not in 1..the model's experts per row");
            sum += in->counts[i];
        }
        if (sum != h->k)
            return bad(err, h, "k", h->k, "differs from the sum of the rows' counts");
    }
    if (h->kind == BP_STEP_LOGITS && h->k) {
        if (in->mtp == NULL)
            return bl_err_set(err, BL_EINVAL, "step message: no room for NextN proposals");
        memcpy(in->mtp, base + lay.mtp, (size_t)h->n_rows * sizeof *in->mtp);
        for (int32_t i = 0; i < h->n_rows; i++) {
            const bp_step_mtp_t *q = &in->mtp[i];
            if (q->in < -1 || q->in >= lim->n_vocab)
                return bad(err, h, "mtp[].in", q->in, "is not a token of the vocabulary, or -1");
            if (q->tok < -1 || q->tok >= lim->n_vocab || (q->in < 0) != (q->tok < 0))
                return bad(err, h, "mtp[].tok", q->tok, "is not a token of the vocabulary, or -1 where in is");
            if (!(q->p >= 0.0f && q->p <= 1.0f))
                return bad(err, h, "mtp[].p", i, "(of this row) is not a probability in 0..1");
        }
    }
    if (h->kind == BP_STEP_TOKENS || h->kind == BP_STEP_HIDDEN || h->kind == BP_STEP_EXPERTS) {
        int tokens = h->kind != BP_STEP_EXPERTS;
        size_t n = tokens ? (size_t)h->n_rows : (size_t)h->k;
        int32_t hi = tokens ? lim->n_vocab : lim->n_expert;
        if (in->ids == NULL)
            return bl_err_set(err, BL_EINVAL, "step message: no room for ids");
        memcpy(in->ids, base + (tokens ? lay.tokens : lay.ids), n * sizeof *in->ids);
        for (size_t i = 0; i < n; i++)
            if (in->ids[i] < 0 || in->ids[i] >= hi)
                return bad(err, h, tokens ? "tokens[]" : "ids[]", in->ids[i],
                           tokens ? "is not a token of the vocabulary" : "is not an expert");
        /* a row's expert twice would count it twice */
        for (int32_t r = 0, at = 0; !tokens && r < h->n_rows; at += in->counts[r++])
            for (int32_t i = 1; i < in->counts[r]; i++)
                for (int32_t j = 0; j < i; j++)
                    if (in->ids[at + i] == in->ids[at + j])
                        return bad(err, h, "ids[]", in->ids[at + i], "appears twice in one row");
    }
    if (h->kind == BP_STEP_KV) {
        if (in->kvops == NULL)
            return bl_err_set(err, BL_EINVAL, "step message: no room for KV ops");
        memcpy(in->kvops, base + lay.kvops, (size_t)h->n_seqs * sizeof *in->kvops);
        for (int32_t i = 0; i < h->n_seqs; i++) {
            const bp_step_kvop_t *o = &in->kvops[i];
            const int drop = o->op == BP_KV_DROP, clear = o->op == BP_KV_CLEAR;
            if (o->op < BP_KV_SAVE || o->op > BP_KV_ROLLBACK)
                return bad(err, h, "ops[].op", o->op, "is not a KV op");
            if (drop || o->op == BP_KV_PERSIST ? o->slot != 0 : (o->slot < 0 || o->slot >= lim->n_slots))
                return bad(err, h, "ops[].slot", o->slot, "is outside the plan's slots");
            if (o->entry < 0)
                return bad(err, h, "ops[].entry", o->entry, "is negative");
            if (drop || clear ? o->n != 0 : (o->n < 1 || o->n > lim->n_ctx))
                return bad(err, h, "ops[].n", o->n, "is not in 1..the slot's context");
            if (o->bytes < 0)
                return bad(err, h, "ops[].bytes", o->bytes, "is negative");
        }
    }
    if (lay.rows)
        in->rows = (const float *)(base + lay.rows);
    if (lay.wts)
        in->wts = (const float *)(base + lay.wts);
    if (h->kind == BP_STEP_ERROR)
        in->text = (const char *)(base + lay.text);
    return 0;
}
