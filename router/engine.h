/* The generation engine: slots, the queue of waiting requests, the step loop and
 * sampling. It runs on its own thread (the engine thread owns the slots, the
 * samplers, the streaming detokenizers and the calls into rt_cluster); the HTTP
 * loop thread submits tasks and cancels them, and receives each task's events as
 * callbacks on the loop thread (posted with uv_async_send).
 *
 * A step takes every slot that has work: each decoding slot adds one row, and a
 * slot still reading its prompt adds a chunk of it, up to n_batch rows in all
 * (decode rows first, so streams never wait behind a long prompt). With
 * cache_prompt, a new task in a slot keeps the cached prefix it shares with the
 * slot's last sequence and only evaluates the rest. A task picks the idle slot whose
 * cached sequence shares the longest prefix with its prompt (or the one asked for).
 * When no slot is free it waits in FIFO order. */
#ifndef RT_ENGINE_H
#define RT_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "cluster.h"
#include "err.h"
#include "sampler.h"
#include "tokenizer.h"

typedef struct rt_engine rt_engine_t;
typedef struct rt_task rt_task_t;

#define RT_MAX_STOP 16      /* stop strings per request */
#define RT_MAX_N_PROBS 20   /* most candidates reported per token */
#define RT_GRAMMAR_MAX_BYTES (1 << 20) /* GBNF text of one request */

/* What one request asks for. Strings and arrays are copied by rt_engine_submit. */
typedef struct rt_task_params {
    rt_sampler_params_t sampling; /* logit_bias copied */
    int64_t n_predict;            /* most tokens to generate; -1: until an end token or
                                   * the slot's context is full */
    const char *stop[RT_MAX_STOP]; /* stop strings: generation ends before the first
                                    * occurrence in the generated text, which is not sent */
    int n_stop;
    int n_probs;                  /* 0..RT_MAX_N_PROBS: candidates per token in events */
    int cache_prompt;             /* 1 (default): reuse the slot's cached prefix */
    int ignore_eos;               /* end tokens are sampled around (banned) */
    int special;                  /* detokenize control tokens as text: 0 none,
                                   * 1 all, RT_TASK_SPECIAL_MARKERS the reply
                                   * format's (rt_engine_opts_t markers) */
    int32_t slot_id;              /* -1 (default): any slot */
    int64_t t_max_predict_ms;     /* 0: none; past this long since the first token,
                                   * generation stops at the first token after a line
                                   * break has been generated (llama-server's rule) */
    int return_progress;          /* PROGRESS events after each prompt chunk */
    int32_t n_indent;             /* 0: off; else a generated line indented by fewer
                                   * spaces or tabs ends generation before its first
                                   * other character (code completion) */
    /* speculative decoding: the request's own limits (llama-server's
     * "speculative.n_max", "speculative.n_min", "speculative.p_min"), -1 for the
     * server's (--draft-max, --draft-min, --draft-p-min); n_max counts at most the
     * server's, which sizes the steps */
    int32_t spec_n_max, spec_n_min;
    float spec_p_min;
} rt_task_params_t;

/* The sampling threads the engine starts beside its own for n_slots slots on a host
 * of n_cpus (BLOOMERY_SAMPLE_THREADS=N overrides: N - 1): none for one slot or a host
 * of 2 CPUs or fewer (the worker's threads need them), else one per extra slot up to
 * n_cpus / 2 - 1 and 7. */
int rt_engine_sample_helpers(int n_slots, int n_cpus);

/* A task's draft limits as the engine applies them: its own where the request gave
 * them, else the server's; n_max at most the server's (the steps are sized for it),
 * n_min at most n_max (llama-server's rule). */
typedef struct rt_spec_limits {
    int n_max, n_min;
    float p_min;
} rt_spec_limits_t;
rt_spec_limits_t rt_engine_spec_limits(const rt_engine_t *e, const rt_task_params_t *p);

/* The defaults of llama-server: rt_sampler_params_default, n_predict -1, no stop,
 * n_probs 0, cache_prompt 1, ignore_eos 0, special 0, slot_id -1; the server's draft
 * limits (-1). */
void rt_task_params_default(rt_task_params_t *p);

/* One candidate in a token event: id, its probability after the sampler's filters
 * and temperature, and its log-probability before them (log-softmax of the raw
 * logits, as llama-server's logprobs report). */
typedef struct rt_token_prob {
    int32_t id;
    float prob;
    float logprob;
} rt_token_prob_t;

typedef enum rt_stop_type {
    RT_STOP_NONE = 0,
    RT_STOP_EOS = 1,   /* an end-of-generation token ("stop") */
    RT_STOP_WORD = 2,  /* a stop string ("stop") */
    RT_STOP_LIMIT = 3, /* n_predict, the context, or the time limit ("length") */
} rt_stop_type_t;

typedef struct rt_timings {
    int64_t n_prompt;     /* prompt tokens of the task */
    int64_t n_cached;     /* of which came from the slot's cache */
    int64_t n_predicted;  /* tokens generated */
    double prompt_ms;     /* from the first prompt step to the first token */
    double predicted_ms;  /* from the first token to the end */
    int64_t n_drafted;    /* speculative decoding: tokens the draft model proposed */
    int64_t n_accepted;   /* of which the model took */
} rt_timings_t;

typedef enum rt_event_kind {
    RT_EV_TOKEN = 1, /* a generated token and the text it completes */
    RT_EV_DONE = 2,  /* the task ended normally (last event) */
    RT_EV_ERROR = 3, /* the task failed (last event) */
    RT_EV_PROGRESS = 4, /* return_progress: a prompt chunk was evaluated (timings hold
                         * n_prompt and n_cached; progress_done the positions evaluated
                         * so far, cached ones included; progress_ms since the start) */
} rt_event_kind_t;

/* An event; every pointer is valid only during the callback. */
typedef struct rt_event {
    rt_event_kind_t kind;
    /* TOKEN */
    int32_t token;
    const char *text;  /* text released by this token: complete UTF-8, with text that
                        * might begin a stop string held back until it is decided */
    size_t len;
    const rt_token_prob_t *probs; /* n_probs candidates, most likely first */
    int n_probs_out;
    rt_token_prob_t sampled;      /* the sampled token's own probability entry */
    /* DONE */
    rt_stop_type_t stop_type;
    const char *stopping_word;    /* RT_STOP_WORD: the stop string matched */
    const char *tail;             /* DONE: text held back that is now released (may be "") */
    size_t tail_len;
    rt_timings_t timings;         /* TOKEN and DONE */
    int64_t progress_done;        /* PROGRESS */
    double progress_ms;
    int64_t io_tokens, io_bytes;  /* DONE of rt_engine_slot_io: tokens saved, restored
                                   * or erased, and bytes written or read */
    double io_ms;
    int slot;                     /* slot that ran the task */
    /* ERROR */
    int status;                   /* HTTP status: 500 (a process died, named in message),
                                   * 503 (shutting down), 400 (the task cannot run) */
    const char *message;
} rt_event_t;

/* Called on the loop thread. After a DONE or ERROR event, or after rt_engine_cancel
 * returned, no more calls come for that task. */
typedef void (*rt_event_fn)(void *ud, const rt_event_t *ev);

enum { RT_TASK_SPECIAL_MARKERS = 2 };

enum { RT_NGRAM_NONE = 0, RT_NGRAM_SIMPLE = 1, RT_NGRAM_MOD = 2, RT_NGRAM_MAP_K = 3 };

typedef struct rt_engine_opts {
    const char *const *markers; /* the texts of the control tokens the reply format is
                                 * split on (NULL-terminated; NULL: none) */
    int n_slots;
    int64_t n_ctx_slot;     /* positions per slot */
    const char *slot_dir;   /* --slot-save-path: the folder of slot files (borrowed),
                             * or NULL: rt_engine_slot_io's save and restore refused */
    uint64_t model_id;      /* rt_slotfile_model_id of the model file */
    const char *cache_dir;  /* --cache-disk: the prompt cache's folder on disk (borrowed),
                             * or NULL: none */
    int64_t cache_disk;     /* --cache-disk-size: bytes its entries may take; -1: no bound */
    uint32_t kv_type, n_layer; /* the cache's type (bl_type_t) and the model's layers */
    rt_cluster_t *draft;    /* -md: the draft model's processes (borrowed; slots and
                             * context as the model's), or NULL: no speculative decoding */
    int draft_max, draft_min; /* tokens drafted per step at most, and the fewest worth a
                             * verification (fewer: the step decodes one token) */
    float draft_p_min;      /* drafting stops at a token the draft gives less than this */
    int mtp;                /* --spec-type draft-mtp: the model's NextN layer proposes one
                             * token a step (rt_cluster_mtp) with draft_min, draft_p_min and
                             * the limits a draft has; draft is NULL */
    int ngram;              /* --spec-type ngram-simple / -mod / -map-k (RT_NGRAM_*): proposals
                             * from the slot's own tokens (router/ngram.h), at most
                             * draft_max and none fewer than draft_min; draft is NULL */
    int ngram_n;            /* the n-gram looked up (ngram-simple's and ngram-map-k's size-n,
                             * ngram-mod's n-match: 1..RT_NGRAM_MAX_N) */
    int64_t draft_ctx;      /* positions of a slot's cache in the draft's processes (its
                             * n_ctx_slot): past them a slot decodes without proposals */
    int64_t kv_pool;        /* -kvu: positions the slots' caches hold together (the
                             * cluster's kv_pool, in BP_KV_CHUNK chunks); 0: each slot
                             * holds n_ctx_slot of its own */
    int64_t n_batch;        /* most rows per step (the cluster's n_batch) */
    int64_t n_predict_max;  /* server-wide cap (-n): -1 none */
    int64_t timeout_ms;     /* --timeout: a task waiting longer than this for a slot
                             * fails with 503; 0: no limit */
    int64_t cache_ram;      /* -cram: bytes of host RAM the prompt cache may hold (the
                             * stages' saved cache states together); 0: no prompt cache;
                             * -1: no bound */
    int pipeline;           /* steps in flight at once (1..RT_CLUSTER_MAX_INFLIGHT): with
                             * several stages, each works on its own step; 1: one step
                             * at a time (a draft, a shared cache or a recurrent model
                             * need 1) */
    int recurrent;          /* the model's cache holds a recurrent state (qwen3next): it
                             * cannot be cut back to a prefix; a slot goes back only to
                             * one of its checkpoints, or runs its prompt whole */
    int ctx_checkpoints;    /* -ctxcp: checkpoints a slot keeps (recurrent models; the
                             * oldest go first); 0: none */
    int64_t checkpoint_every; /* -cpent: a checkpoint every this many prompt tokens, besides
                             * the one before a prompt's last token; <= 0: only that one */
    int64_t sleep_idle_ms;  /* --sleep-idle-seconds: after this long without work the
                             * model's processes stop (rt_cluster_sleep) until the next
                             * task wakes them; 0: never */
} rt_engine_opts_t;

/* Starts the engine thread. tok is borrowed (its detokenizing side is used from the
 * engine thread; the loop thread may keep tokenizing with it), cluster and loop
 * are borrowed. Caller frees with rt_engine_destroy. */
int rt_engine_create(rt_engine_t **out, const rt_engine_opts_t *o, rt_cluster_t *cluster,
                     const rt_tokenizer_t *tok, uv_loop_t *loop, bl_err_t *err) BL_WUR;

/* Stops taking tasks; every queued or running task ends with an ERROR 503 "server
 * is shutting down", delivered on the loop thread, which must keep running until
 * rt_engine_drained says 1. Loop thread. */
void rt_engine_shutdown(rt_engine_t *e);
int rt_engine_drained(const rt_engine_t *e);
/* Joins the thread and frees everything. Call after rt_engine_shutdown and once the
 * loop has delivered the last events. */
void rt_engine_destroy(rt_engine_t *e);

/* Queues a generation of prompt (n tokens, copied). Loop thread only. Returns 0 and
 * *task (a handle for rt_engine_cancel, owned by the engine), or, without queueing:
 * BL_EINVAL (bad params, named; empty prompt; a grammar over RT_GRAMMAR_MAX_BYTES),
 * BL_ERANGE (only: the prompt does not fit a slot's context; the message says both sizes), BL_ECLOSED (shutting down), BL_ENOMEM. */
int rt_engine_submit(rt_engine_t *e, const int32_t *prompt, size_t n,
                     const rt_task_params_t *p, rt_event_fn cb, void *ud, rt_task_t **task,
                     bl_err_t *err) BL_WUR;

/* A slot's cache to or from a file (llama-server's /slots/ID?action=...): action
 * RT_SLOT_SAVE writes what slot holds to opts.slot_dir/filename, RT_SLOT_RESTORE
 * puts such a file's tokens and cache into it (the file checked first: its frame,
 * checksums, the model file it was written for, the cache type, its size), and
 * RT_SLOT_ERASE empties it (filename NULL). Queued like a generation for that slot,
 * it runs when the slot is idle; the DONE event carries io_tokens, io_bytes and
 * io_ms, an ERROR 400 a file that is refused (named), 500 an I/O failure. Loop
 * thread only; the handle as rt_engine_submit's. BL_EINVAL (slot out of range, a
 * file name refused, no folder for save or restore), BL_ECLOSED, BL_ENOMEM. */
enum { RT_SLOT_SAVE = 1, RT_SLOT_RESTORE = 2, RT_SLOT_ERASE = 3 };
int rt_engine_slot_io(rt_engine_t *e, int slot, int action, const char *filename, rt_event_fn cb,
                      void *ud, rt_task_t **task, bl_err_t *err) BL_WUR;

/* The client went away: the task stops within one step and its slot is freed. No
 * callback for it runs after this returns. Loop thread only. The handle is valid until
 * the task's DONE or ERROR callback returns (cancelling from inside that callback is
 * fine) or until this call: do not cancel a task after its last event. */
void rt_engine_cancel(rt_engine_t *e, rt_task_t *task);

/* Snapshots for /slots, /metrics, /props (thread-safe). */
typedef struct rt_slot_info {
    int id;
    int busy;             /* processing a task */
    int64_t n_ctx;
    int64_t n_past;       /* tokens in its cache */
    int64_t n_decoded;    /* tokens generated for the current task */
    int64_t n_prompt;     /* prompt tokens of the current task */
    uint64_t task_id;
} rt_slot_info_t;

typedef struct rt_engine_stats {
    uint64_t prompt_tokens_total;     /* prompt tokens evaluated (cache hits excluded) */
    double prompt_seconds_total;
    uint64_t tokens_predicted_total;
    double tokens_predicted_seconds_total;
    uint64_t n_decode_total;          /* steps */
    uint64_t n_busy_slots_total;      /* sum over steps of the slots in the step */
    uint64_t requests_processing;     /* tasks in slots now */
    uint64_t requests_deferred;       /* tasks waiting for a slot now */
    uint64_t n_tokens_max;            /* largest n_past any slot reached */
    int64_t kv_cache_tokens;          /* sum of n_past over slots */
    /* the prompt cache in host RAM */
    uint64_t prompt_cache_saves_total;   /* slot states saved */
    uint64_t prompt_cache_hits_total;    /* prompts that started from a saved state */
    uint64_t prompt_cache_tokens_total;  /* positions those restored */
    uint64_t prompt_cache_evictions_total;
    uint64_t kv_evictions_total; /* idle slots' caches emptied for room in a shared one */
    uint64_t checkpoints_total, checkpoint_restores_total; /* a recurrent model's (-ctxcp) */
    uint64_t draft_steps_total, drafted_total, accepted_total; /* speculative decoding */
    /* the prompt cache on disk (--cache-disk) */
    uint64_t disk_saves_total, disk_hits_total, disk_tokens_total, disk_evictions_total,
        disk_refused_total;         /* refused: an entry found damaged, cut or missing */
    int64_t disk_entries, disk_bytes;
    uint64_t kv_preemptions_total; /* tasks whose cache gave way in a shared one, to be
                                    * recomputed */
    int64_t prompt_cache_entries;
    int64_t prompt_cache_bytes;
    /* where the engine thread's steps go: waiting for the stages' answer (from the
     * step's send, or the wait's start with several in flight, to its logits), and
     * taking it (sampling, text, events) */
    double step_wait_seconds_total, step_output_seconds_total;
} rt_engine_stats_t;

/* Fills slots[0..n_slots) and returns n_slots (at most cap). */
int rt_engine_slots(rt_engine_t *e, rt_slot_info_t *slots, int cap);
void rt_engine_get_stats(rt_engine_t *e, rt_engine_stats_t *out);
int rt_engine_n_slots(const rt_engine_t *e);
int64_t rt_engine_n_ctx_slot(const rt_engine_t *e);

#endif
