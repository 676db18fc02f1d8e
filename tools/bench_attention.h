/* bloomery-bench --attention (bench_attention.c). */
#ifndef BENCH_ATTENTION_H
#define BENCH_ATTENTION_H

#include <stdint.h>

typedef struct bench_att {
    const int64_t *depths; /* cached positions before each row's own (-d) */
    int n_depths;
    const int64_t *rows;   /* rows a step (-np), each over its own cache */
    int n_rows;
    int64_t n_head, n_kv_head, head_dim; /* --att-heads Q,KV and --att-head-dim */
    int64_t ctx;           /* the grid's cap, as the worker's context (0: the largest depth + 1) */
    int64_t layers;        /* layers a replay takes, each with its own cache */
    int64_t reps;          /* timed replays */
    int device;            /* CUDA ordinal */
    int roofline;          /* measure the card's copy rate beside */
    int md;                /* a table, else JSON lines */
} bench_att_t;

/* For each row count and depth: the decode step's attention alone on the card
 * (kcuda_attention_rows_qkv: the q/k norm and RoPE, the cache store and the
 * attention, as a decode graph runs them), `layers` calls over distinct caches
 * captured in one graph and replayed reps times; printed as a table row (md) or a
 * JSON line with the time a layer and the cache bytes read a second. Returns 0, or
 * 1 after printing why it could not run (no CUDA in the build, no device, too
 * little card memory for the caches). */
int bench_attention(const bench_att_t *b);

#endif
