/* What the router-level fuzz targets (fuzz_http, fuzz_chat, fuzz_tools) share: a
 * model that lives in memory. A byte-level tokenizer (one token per byte, Qwen's
 * special tokens, a few whole words the fake model writes), Qwen3's chat template
 * (tests/fuzz/qwen3.jinja), and the rt_cluster_* functions the engine calls, over a
 * fake cluster that starts no process and answers each step with logits that favour
 * one of three short scripted replies.
 *
 * Everything is built on first use and kept until the process exits (a fuzz target
 * runs one process for millions of inputs). Any thread may call the getters after
 * the first call returned; the fake cluster's step comes from the engine thread. */
#ifndef FUZZ_APP_H
#define FUZZ_APP_H

#include <stdint.h>

#include "cluster.h"
#include "template.h"
#include "tokenizer.h"

/* Positions each fake slot holds, and the slots there are. */
#define FZ_N_CTX 16384
#define FZ_N_SLOTS 2
#define FZ_N_BATCH 512

rt_tokenizer_t *fz_tokenizer(void);
/* Qwen3's template and its text; the text is NUL-terminated. */
rt_template_t *fz_template(void);
const char *fz_template_source(void);
/* The fake cluster, READY from the start. Its step aborts (a finding) when the
 * engine sends a sequence the cluster's contract forbids: an unknown slot, a
 * position past what the slot holds, more rows than n_batch, no logits asked of the
 * last row. */
rt_cluster_t *fz_cluster(void);

#endif
