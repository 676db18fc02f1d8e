/* The per-step messages on the shared-memory rings (proto/ring.h) and their checks:
 * router -> stage 0 (tokens), stage -> next stage (hidden rows), last stage -> router
 * (logits), worker -> hosttier (rows for the routed experts), hosttier -> worker (their
 * sums), and an error that a failing stage sends on in place of its output, so that it
 * reaches the router. Every message echoes a step counter, so a stale reply is caught.
 *
 * A message is a header, then sections that each start 16-byte aligned:
 *   TOKENS   hdr | seqs (n_seqs) | tokens int32 (n_rows)
 *   HIDDEN   hdr | seqs (n_seqs) | tokens int32 (n_rows) | rows float (n_rows, width =
 *            n_embd); with hdr.card set, hdr | seqs | tokens: the rows are in a card
 *            buffer of the link between the two stages (proto/cardlink.h), not in the
 *            message. The tokens are the step's, for a NextN layer on the last stage
 *   LOGITS   hdr | rows float (n_rows, width = n_vocab); with hdr.k 1, then | mtp
 *            (n_rows): the NextN layer's proposal from each row (Plan.mtp)
 *   EXPERTS  hdr | rows float (n_rows, width = n_embd) | counts int32 (n_rows)
 *                | ids int32 (k) | weights float (k): row i's counts[i] (expert,
 *                weight) pairs follow row i-1's; k is their total, so a worker sends
 *                only the experts that are not its own
 *   SUMS     hdr | rows float (n_rows, width = n_embd)
 *   ERROR    hdr (code, text_len) | text (text_len bytes, no NUL)
 *   KV       hdr (n_seqs: the ops) | ops (n_seqs): saves of a slot's cache to host
 *            memory, loads back into a slot, drops; it runs down the pipeline in
 *            step order (each stage does its layers' part and passes it on) and the
 *            last stage sends it back to the router, each op's bytes summed
 * The writer reserves the whole message in the ring and fills it in place; the reader
 * checks a peeked message against its plan limits before it uses any count in it.
 * Nothing here allocates or logs. */
#ifndef BP_STEP_H
#define BP_STEP_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "ring.h"

/* The ring fds a child finds open at start (the router dup2()s them there):
 * a worker reads its input at 3 and writes its output at 4; with a hosttier it
 * writes expert rows at 5 and reads their sums at 6; then, for each expert tier k
 * of the plan (Plan.tiers), rows at bp_step_fd_tier(hosttier, k) and sums at the
 * next. The hosttier, and each tier, reads worker i's rows at 3 + 2i and writes the
 * sums at 4 + 2i. */
#define BP_STEP_FD_IN 3
#define BP_STEP_FD_OUT 4
#define BP_STEP_FD_EXPERTS_OUT 5
#define BP_STEP_FD_EXPERTS_IN 6
#define BP_STEP_FD_HOSTTIER_BASE 3
/* A worker's fd for the rows to expert tier k; hosttier: whether the plan has one. */
static inline int bp_step_fd_tier(int hosttier, int k)
{
    return BP_STEP_FD_EXPERTS_OUT + 2 * ((hosttier ? 1 : 0) + k);
}

#define BP_STEP_MAGIC 0x50455453u /* "STEP" little-endian */
/* Longest error text carried (longer text is cut). */
#define BP_STEP_MAX_TEXT 1024u
/* A reader that accepts any step counter (a stage takes what its input sends). */
#define BP_STEP_ANY UINT64_MAX

typedef enum bp_step_kind {
    BP_STEP_TOKENS = 1,
    BP_STEP_HIDDEN = 2,
    BP_STEP_LOGITS = 3,
    BP_STEP_EXPERTS = 4,
    BP_STEP_SUMS = 5,
    BP_STEP_ERROR = 6,
    BP_STEP_KV = 7,
} bp_step_kind_t;

/* The most ops one KV message carries. */
#define BP_STEP_MAX_KVOPS 64

typedef enum bp_kv_op {
    BP_KV_SAVE = 1,  /* positions 0..n of slot's cache into host memory, as entry */
    BP_KV_LOAD = 2,  /* entry's first n positions into slot's cache (its n_past becomes n) */
    BP_KV_DROP = 3,  /* entry's memory freed (an unknown entry is no error) */
    BP_KV_CLEAR = 4, /* slot's cache emptied: its chunks of a shared cache go back */
    BP_KV_WRITE = 5, /* positions 0..n of slot's cache written to the plan's slot_dir file
                      * BP_KV_IO_NAME(entry) at offset bytes; each stage adds its bytes */
    BP_KV_READ = 6,  /* the same file read into slot's positions 0..n (n_past becomes n) */
    BP_KV_PERSIST = 7, /* entry's saved state (SAVE) written to the plan's cache_dir, one
                        * part file per stage (BP_KV_PART_FMT), by a thread of the
                        * stage's own: the op returns at once; n: the entry's positions */
    BP_KV_FETCH = 8,   /* entry's part files read into slot's positions 0..n (each stage
                        * checks its part's header and checksum first) */
    BP_KV_CKPT = 9,    /* a checkpoint: the recurrent state of slot's n positions (n: all it
                        * holds) kept as entry; nothing for a stage without recurrent layers */
    BP_KV_ROLLBACK = 10, /* slot's cache cut back to the n positions of checkpoint entry,
                        * and the entry's recurrent state put back */
} bp_kv_op_t;

/* A stage's part file of entry in cache_dir: layers lb..le. The stage writes it under
 * the name with ".tmp" after it and renames it when whole. */
#define BP_KV_PART_FMT "%s/pc-%lld.L%lld-%lld"

/* The file in the plan's slot_dir that WRITE and READ ops of entry use: the router
 * makes it (or links a slot file there) and renames or removes it afterwards. */
#define BP_KV_IO_FMT "%s/.bloomery-io-%lld"

/* A cache shared by the slots (Plan.kv_pool) is handed out in chunks of this many
 * positions: a slot holding n positions holds ceil(n / BP_KV_CHUNK) chunks, so the
 * router and the stages count the same. */
#define BP_KV_CHUNK 256

/* One op of a KV message; 32 bytes. */
typedef struct bp_step_kvop {
    int32_t op;    /* bp_kv_op_t */
    int32_t slot;  /* SAVE, LOAD, CLEAR; 0 for DROP */
    int64_t entry; /* the router's name for a saved state, >= 0 (0 for CLEAR) */
    int64_t n;     /* SAVE, LOAD: positions, 1..n_ctx; DROP, CLEAR: 0 */
    int64_t bytes; /* host bytes the stages so far hold for the entry (each adds its own) */
} bp_step_kvop_t;

/* 48 bytes; fields a kind does not use are 0. */
typedef struct bp_step_hdr {
    uint32_t magic;
    uint32_t kind;     /* bp_step_kind_t */
    uint64_t step;     /* the router's step counter, or the worker's experts call counter */
    int32_t n_seqs;    /* TOKENS, HIDDEN */
    int32_t n_rows;    /* rows of every section */
    int32_t width;     /* floats per row: n_embd, or n_vocab for LOGITS */
    int32_t k;         /* EXPERTS: (expert, weight) pairs of all rows */
    int32_t layer;     /* EXPERTS, SUMS */
    int32_t code;      /* ERROR: a negative BL_E* code */
    uint32_t text_len; /* ERROR: bytes of text */
    uint32_t card;     /* HIDDEN: 0, the rows follow the sequences; k + 1, they are in
                        * card buffer k of the link (proto/cardlink.h) */
} bp_step_hdr_t;

/* One sequence of a TOKENS or HIDDEN message (rt_step_seq_t on the wire). */
typedef struct bp_step_seq {
    int32_t slot;
    int32_t n;     /* rows */
    int64_t pos;   /* position of its first row */
    int32_t n_out; /* logits for its last n_out rows */
    int32_t _pad;
} bp_step_seq_t;

/* A LOGITS row's NextN proposal (worker/wk.h's wk_mtp_row_t on the wire); 16 bytes. */
typedef struct bp_step_mtp {
    int32_t in;  /* the token the layer read after the row, or -1: no proposal */
    int32_t tok; /* the token it proposes after that one, or -1 with in */
    float p;     /* its probability, 0..1 */
    int32_t _pad;
} bp_step_mtp_t;

/* What a receiver accepts: from the plan and the model. */
typedef struct bp_step_limits {
    int32_t n_slots;
    int32_t n_batch;       /* rows per step */
    int64_t n_ctx;         /* positions per slot */
    int32_t n_out_max;     /* logits rows per step */
    int32_t n_embd;
    int32_t n_vocab;
    int32_t n_layer;
    int32_t n_expert;
    int32_t n_expert_used;
    int32_t card_bufs;     /* card buffers of the link this reader opened (each holds
                            * n_batch rows of n_embd floats); 0: a HIDDEN message that
                            * names one is refused */
} bp_step_limits_t;

/* Byte offsets of a message's sections (0 where the kind has none) and its size. */
typedef struct bp_step_layout {
    size_t seqs, tokens, rows, counts, ids, wts, text, kvops, mtp;
    size_t nbytes;
} bp_step_layout_t;

/* Computes h's layout from its kind and counts. BL_EINVAL (unknown kind, a negative
 * count), BL_ERANGE (the size overflows). */
int bp_step_layout(const bp_step_hdr_t *h, bp_step_layout_t *out, bl_err_t *err) BL_WUR;

/* A message being written: pointers into the reserved ring room. */
typedef struct bp_step_out {
    bp_step_seq_t *seqs;
    int32_t *tokens; /* TOKENS */
    float *rows;     /* NULL for a HIDDEN message whose rows are in a card buffer */
    int32_t *counts; /* EXPERTS */
    int32_t *ids;    /* EXPERTS */
    float *wts;      /* EXPERTS */
    char *text;      /* ERROR */
    bp_step_kvop_t *kvops; /* KV */
    bp_step_mtp_t *mtp;    /* LOGITS with hdr.k 1 */
    size_t nbytes;   /* pass to bp_ring_commit */
} bp_step_out_t;

/* Reserves room for a message with header h (magic is filled in) in r, writes the
 * header and points out at its sections, for the caller to fill and commit with
 * bp_ring_commit(r, out->nbytes). Errors of bp_step_layout and bp_ring_reserve. */
int bp_step_reserve(bp_ring_t *r, const bp_step_hdr_t *h, bp_step_out_t *out,
                    int64_t timeout_us, bl_err_t *err) BL_WUR;

/* Writes the same into buf (cap bytes) instead of a ring (for tests and the
 * router's copies). BL_ERANGE if it does not fit. */
int bp_step_write(void *buf, size_t cap, const bp_step_hdr_t *h, bp_step_out_t *out,
                  bl_err_t *err) BL_WUR;

/* Reserves, fills and commits an ERROR message: code (negative) and text, cut at
 * BP_STEP_MAX_TEXT bytes. */
int bp_step_push_error(bp_ring_t *r, uint64_t step, int code, const char *text,
                       int64_t timeout_us, bl_err_t *err) BL_WUR;

/* A message read: the header and the index arrays copied out of the shared memory
 * (a peer cannot change them after they were checked), the floats pointed at. */
typedef struct bp_step_in {
    bp_step_hdr_t hdr;
    bp_step_seq_t *seqs; /* set by the caller: room for limits.n_slots sequences */
    int32_t *ids;        /* set by the caller: room for n_batch tokens (TOKENS) or
                          * n_batch * n_expert_used expert ids (EXPERTS); may be NULL
                          * when the caller never accepts either kind */
    int32_t *counts;     /* set by the caller: room for n_batch pair counts (EXPERTS) */
    const float *rows;   /* NULL where hdr.card names a card buffer */
    const float *wts;
    const char *text;    /* ERROR: hdr.text_len bytes, not NUL-terminated */
    bp_step_kvop_t *kvops; /* set by the caller: room for BP_STEP_MAX_KVOPS ops (KV);
                            * may be NULL when the caller never accepts KV */
    bp_step_mtp_t *mtp;    /* set by the caller: room for n_out_max proposals (LOGITS with
                            * hdr.k 1); may be NULL when the caller never accepts them */
} bp_step_in_t;

/* Checks nbytes of an untrusted message against lim, expecting kind want (an ERROR
 * is always accepted, and a KV where want is TOKENS, HIDDEN or LOGITS, the
 * pipeline's kinds: check in->hdr.kind) and step counter want_step (or
 * BP_STEP_ANY), and fills in. Checks: size, magic, kind, step; counts within lim
 * (rows 1..n_batch, widths equal to the model's, layer below n_layer); for
 * sequences: slot below n_slots, n >= 1 and summing to n_rows, pos >= 0, pos + n <=
 * n_ctx, n_out in 0..n; token ids below n_vocab; for experts: each row's count in
 * 1..n_expert_used, the counts summing to k, ids below n_expert, no id twice in a
 * row; for KV ops: a known op, slot below n_slots, entry >= 0, n in 1..n_ctx (0 for
 * DROP), bytes >= 0; card only on a HIDDEN message and naming one of lim's card_bufs
 * (its rows, at most n_batch, fit the buffer); the size equal to the layout's. BL_EPROTO naming the field and the
 * value; nothing is read past nbytes. */
int bp_step_parse(const void *msg, size_t nbytes, const bp_step_limits_t *lim,
                  bp_step_kind_t want, uint64_t want_step, bp_step_in_t *in,
                  bl_err_t *err) BL_WUR;

/* "tokens", "hidden", ...; "unknown" otherwise. */
const char *bp_step_kind_name(uint32_t kind);

#endif
