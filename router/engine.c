/* The generation engine (see engine.h): the engine thread with its slots, the FIFO of
 * waiting tasks, the step loop over rt_cluster, sampling, stop conditions and the
 * events it posts to the loop thread. Threads: the engine thread owns the slots (and
 * everything in slot_t); the loop thread submits, cancels and receives events; the
 * fields under rt_engine.mu are the only ones both touch. */
#include "engine.h"
#include "grammar.h"
#include "kcpu.h"
#include "ngram.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "slotfile.h"

#define STOP_MAX_LEN 1024 /* bytes per stop string: bounds the text held back */
#define N_CAND_LOOKUP 128 /* sampler candidates searched for the reported probabilities */
#define CLUSTER_POLL_MS 100 /* how often a wait for the cluster rechecks shutdown and timeouts */

// --- tasks and events -----------------------------------------------------------------------

/* A task lives in one allocation (prompt, stop strings and logit bias behind it) and
 * is freed when its last reference goes: the engine's (dropped when the task leaves
 * the waiting list or its slot), the loop's handle (dropped by the final event's
 * delivery or by rt_engine_cancel) and one per event queued for it. Counts change
 * under rt_engine.mu only. */
struct rt_task {
    rt_task_t *next;              /* waiting list (mu) */
    rt_task_t *all_prev, *all_next; /* every live task, for rt_engine_destroy (mu) */
    uint64_t id;
    rt_task_params_t p;           /* stop[] and sampling.logit_bias point behind the struct */
    const int32_t *prompt;        /* (n_prompt) */
    size_t n_prompt;
    size_t stop_len[RT_MAX_STOP];
    size_t max_stop_len;
    int64_t n_predict;            /* the request's, capped by the server's; -1: none */
    rt_event_fn cb;
    void *ud;
    int64_t t_submit_us;
    /* Set by the loop thread under mu; the engine thread reads it without the lock
     * at each step, and a late read costs one step at most. */
    atomic_int cancelled;
    int refs;                     /* mu */
    int loop_ref;                 /* mu: the loop still holds its handle */
    int waiting;                  /* mu: in the waiting list */
    int io;                       /* RT_SLOT_*: a slot file task (rt_engine_slot_io) */
    const char *io_name;          /* its file name, behind the struct */
};

/* An event on its way to the loop thread. Nodes are recycled through a free list, and
 * their text buffers only grow, so after the first tokens posting allocates nothing. */
typedef struct ev_node {
    struct ev_node *next;
    rt_task_t *task;
    rt_event_t ev;
    char *buf; /* text (TOKEN) or tail (DONE), NUL-terminated */
    size_t cap;
    rt_token_prob_t probs[RT_MAX_N_PROBS];
    char msg[sizeof(((bl_err_t *)0)->msg)];
} ev_node_t;

// --- slots ----------------------------------------------------------------------------------

typedef enum slot_state {
    SLOT_IDLE = 0,
    SLOT_PROMPT = 1, /* evaluating prompt chunks */
    SLOT_GEN = 2,    /* one row per step */
} slot_state_t;

/* Engine thread only. */
typedef struct slot {
    int id;
    slot_state_t state;
    rt_task_t *task;
    int32_t *seq;       /* (n_ctx_slot) the tokens in the cache [0, n_past), then the
                         * prompt rest or the sampled token still to evaluate [n_past, n_seq) */
    int64_t n_past;
    int64_t n_kv;       /* positions the stages hold for it: n_past, or more until the
                         * slot's next step rewinds them (a shared cache counts these) */
    int full;           /* build_step: a shared cache had no room for its next token */
    /* speculative decoding: the draft's cache holds seq[0, d_past); the tokens it
     * proposed for this step are seq[n_past + 1, n_past + 1 + n_draft) */
    int64_t d_past;
    int n_draft;
    int d_wait, d_backoff; /* steps to decode without the draft, after it proposed nothing */
    int32_t mtp_tok;    /* the NextN layer's proposal for the step after the pending token,
                         * from the step that sampled it, or -1 */
    float mtp_p;        /* its probability */
    int64_t n_drafted, n_accepted; /* the task's, for its timings */
    int in_step;        /* build_step: it has rows in the step being built */
    int in_flight;      /* it has rows in a step sent whose answer has not come */
    int64_t n_seq;
    int64_t n_cached;
    int64_t n_decoded;
    uint64_t last_used; /* engine clock: least recently used slot goes first */
    uint64_t start_order;
    rt_sampler_t *smpl;
    rt_detok_t *detok[3]; /* plain, RT_DETOK_SPECIAL, plain with the markers */
    rt_detok_t *dt;       /* the one the task uses */
    char *held;           /* generated text not yet sent (may begin a stop string) */
    size_t held_len, held_cap;
    int64_t t_start_us, t_first_us;
    int got_first;
    int has_new_line;     /* the generated text holds a line break */
    int in_indent;        /* at the leading blanks of a generated line */
    int32_t line_indent;  /* how many there are so far */
    /* a recurrent model's checkpoints of this slot: the stages' entries holding the
     * recurrent state at positions ck_n[i] of seq, oldest first */
    int64_t *ck_id, *ck_n;
    int n_ck;
    int64_t ck_at;      /* with steps in flight: a checkpoint due at this n_past, taken
                         * once none is (ck_pending); 0 none */
    int64_t spec_ck;    /* a recurrent model's verify step: the checkpoint entry of the
                         * state before it, or -1 */
    int64_t spec_pos;   /* and its position */
    /* n-gram speculation (ng_begun: since the task's first proposal): ngram-mod's
     * table holds the task's tokens before ng_mark; ng_low counts verify steps in a
     * row that took under half */
    int64_t ng_mark;
    int ng_begun, ng_low;
    rt_ngram_map_t ng_map; /* ngram-map-k's keys of the task */
} slot_t;

/* A slot's cache state saved in host RAM by the stages (rt_cluster_kv), for the
 * prompt cache: the tokens it holds, under the entry name the stages know it by. */
typedef struct pc_entry {
    int64_t id;
    int32_t *toks;
    int64_t n;
    int64_t bytes;
    uint64_t last_used;
} pc_entry_t;

static void ck_drop(rt_engine_t *e, slot_t *s, int64_t keep);
static void drain(rt_engine_t *e, int32_t n_vocab);
static int build_step_max(rt_engine_t *e, int max_seqs);
static void step_failed(rt_engine_t *e, int rc, const bl_err_t *err);

/* The most tokens the draft proposes for one step. */
#define RT_DRAFT_MAX 64

/* Fewest positions worth saving. */
#define PC_MIN_TOKENS 16

/* An entry of the prompt cache on disk: its meta file pc-ID.meta (the tokens, in a
 * slot file's frame) and the stages' part files pc-ID.L*-* (BP_KV_PART_FMT). */
typedef struct dk_entry {
    int64_t id;
    int32_t *toks;
    int64_t n;
    int64_t bytes;
    uint64_t last_used;
} dk_entry_t;

struct rt_engine {
    rt_engine_opts_t o;
    rt_cluster_t *cluster;
    const rt_tokenizer_t *tok;
    uv_loop_t *loop;
    uv_async_t *async; /* its own allocation: uv_close finishes after rt_engine_destroy */
    int32_t n_vocab_tok;
    int32_t *eog;      /* the end-of-generation ids, banned by ignore_eos */
    size_t n_eog;
    rt_grammar_vocab_t *gvocab; /* the vocabulary's trie for grammars: built by the
                                 * engine thread at the first grammar, then shared */

    pthread_t thread;
    int thread_started;
    kcpu_pool_t *pool;      /* the rows' sampling threads beside this one (NULL: none) */
    struct sample_job {     /* (n_slots): a step's rows to sample, then their tokens */
        slot_t *s;
        const float *row;
        size_t out;         /* the row's index among the step's logit rows */
        int32_t tok;
    } *jobs;
    int n_jobs;             /* the last sample_rows's */
    atomic_int job_next;    /* the next job a sampling thread takes */
    pthread_mutex_t mu;
    pthread_cond_t cv;

    /* --- under mu --- */
    rt_task_t *wait_head, *wait_tail;
    size_t n_waiting;
    rt_task_t *all; /* every live task */
    ev_node_t *ev_head, *ev_tail, *ev_free;
    int delivering;
    int shutdown; /* no new tasks; the engine thread ends everything with 503 */
    int quit;     /* rt_engine_destroy: the engine thread returns */
    int finished; /* the engine thread posted its last events */
    uint64_t next_task_id;
    rt_engine_stats_t stats;
    rt_slot_info_t *info; /* (n_slots) snapshot for rt_engine_slots */

    /* --- engine thread --- */
    slot_t *slots;          /* (n_slots) */
    rt_step_seq_t *seqs;    /* (n_slots) */
    int *seq_slot;          /* (n_slots) */
    /* steps in flight (opts.pipeline > 1), oldest first: each one's sequences */
    struct {
        int ns;
        rt_step_seq_t *seqs; /* (n_slots) */
        int *seq_slot;       /* (n_slots) */
    } fl[RT_CLUSTER_MAX_INFLIGHT];
    int fl_head, fl_n;
    slot_t **order;         /* (n_slots) scratch for ordering prompt slots */
    int32_t cand_id[N_CAND_LOOKUP];
    float cand_p[N_CAND_LOOKUP];
    uint64_t clock;
    uint64_t cluster_starts;
    int64_t last_work_us;    /* engine thread: when it last had a task (sleep) */
    int rr;                 /* first decode slot considered, rotated when rows run short */
    pc_entry_t *pc;         /* the prompt cache's entries (n_pc) */
    size_t n_pc, cap_pc;
    int64_t pc_bytes, pc_next_id;
    int64_t io_next;        /* slot files' io numbers (rt_cluster_kv_io_path) */
    uint64_t draft_starts;  /* the draft processes' starts seen: a restart empties them */
    int draft_off;          /* the draft cannot serve this model (its vocabulary) */
    rt_ngram_mod_t *ngram_mod; /* --spec-type ngram-mod: the slots' table */
    dk_entry_t *dk;         /* the prompt cache on disk (n_dk) */
    size_t n_dk, cap_dk;
    int64_t dk_bytes;
    int posted;             /* events posted since the last uv_async_send */
};

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void rt_task_params_default(rt_task_params_t *p)
{
    memset(p, 0, sizeof *p);
    rt_sampler_params_default(&p->sampling);
    p->n_predict = -1;
    p->n_stop = 0;
    p->n_probs = 0;
    p->cache_prompt = 1;
    p->ignore_eos = 0;
    p->special = 0;
    p->slot_id = -1;
    p->t_max_predict_ms = 0;
    p->spec_n_max = p->spec_n_min = -1;
    p->spec_p_min = -1.0f;
}

// --- task references and the event queue (mu held) ----------------------------------------

/* Drops n references; the last one frees the task. Callers dropping several at
 * once do so in one call, so that no path reads t after a possible free. */
static void task_unref_n_locked(rt_engine_t *e, rt_task_t *t, int n)
{
    t->refs -= n;
    if (t->refs > 0)
        return;
    if (t->all_prev)
        t->all_prev->all_next = t->all_next;
    else
        e->all = t->all_next;
    if (t->all_next)
        t->all_next->all_prev = t->all_prev;
    free(t);
}

static void task_unref_locked(rt_engine_t *e, rt_task_t *t)
{
    task_unref_n_locked(e, t, 1);
}

static ev_node_t *ev_alloc_locked(rt_engine_t *e)
{
    ev_node_t *n = e->ev_free;
    if (n) {
        e->ev_free = n->next;
    } else {
        n = calloc(1, sizeof *n);
        if (!n)
            return NULL;
    }
    n->next = NULL;
    n->task = NULL;
    memset(&n->ev, 0, sizeof n->ev);
    n->msg[0] = '\0';
    return n;
}

static ev_node_t *ev_alloc(rt_engine_t *e)
{
    pthread_mutex_lock(&e->mu);
    ev_node_t *n = ev_alloc_locked(e);
    pthread_mutex_unlock(&e->mu);
    return n;
}

static void ev_recycle_locked(rt_engine_t *e, ev_node_t *n)
{
    n->task = NULL;
    n->next = e->ev_free;
    e->ev_free = n;
}

/* Copies len bytes into the node's buffer; 0, or -1 when it cannot grow (the text is
 * then lost, which only happens when memory is gone). */
static int ev_set_text(ev_node_t *n, const char *s, size_t len)
{
    if (len + 1 > n->cap) {
        size_t cap = n->cap ? n->cap : 256;
        while (cap < len + 1)
            cap *= 2;
        char *b = realloc(n->buf, cap);
        if (!b)
            return -1;
        n->buf = b;
        n->cap = cap;
    }
    if (len)
        memcpy(n->buf, s, len);
    n->buf[len] = '\0';
    return 0;
}

/* Queues n for t unless t was cancelled, in which case no callback may run for it. */
static void ev_post_locked(rt_engine_t *e, rt_task_t *t, ev_node_t *n)
{
    if (atomic_load(&t->cancelled)) {
        ev_recycle_locked(e, n);
        return;
    }
    n->task = t;
    t->refs++;
    if (e->ev_tail)
        e->ev_tail->next = n;
    else
        e->ev_head = n;
    e->ev_tail = n;
    e->posted = 1;
}

static void ev_post(rt_engine_t *e, rt_task_t *t, ev_node_t *n)
{
    pthread_mutex_lock(&e->mu);
    ev_post_locked(e, t, n);
    pthread_mutex_unlock(&e->mu);
}

/* Posts an ERROR event; the caller still drops its own reference. */
static void post_error_locked(rt_engine_t *e, rt_task_t *t, int status, int slot, const char *msg)
{
    ev_node_t *n = ev_alloc_locked(e);
    if (!n) {
        /* Without memory for the event the task still ends: its handle stays with
         * the loop, which sees no final event (the client times out). */
        BL_LOG(BL_LOG_ERROR, "event=event_lost task=%llu reason=out_of_memory",
               (unsigned long long)t->id);
        return;
    }
    n->ev.kind = RT_EV_ERROR;
    n->ev.status = status;
    n->ev.slot = slot;
    snprintf(n->msg, sizeof n->msg, "%s", msg);
    ev_post_locked(e, t, n);
}

static void wake_loop(rt_engine_t *e)
{
    if (e->posted) {
        e->posted = 0;
        (void)uv_async_send(e->async); /* fails only for a closing handle */
    }
}

/* Loop thread: delivers the queued events in order. The lock is dropped around each
 * callback so that the callback may submit or cancel. */
static void on_async(uv_async_t *h)
{
    rt_engine_t *e = h->data;
    pthread_mutex_lock(&e->mu);
    ev_node_t *n;
    while ((n = e->ev_head)) {
        e->ev_head = n->next;
        if (!e->ev_head)
            e->ev_tail = NULL;
        rt_task_t *t = n->task;
        int final = n->ev.kind != RT_EV_TOKEN && n->ev.kind != RT_EV_PROGRESS;
        int run = t->loop_ref && !atomic_load(&t->cancelled);
        e->delivering = 1;
        pthread_mutex_unlock(&e->mu);

        if (run) {
            rt_event_t *ev = &n->ev;
            if (ev->kind == RT_EV_TOKEN) {
                ev->text = n->buf ? n->buf : "";
                ev->probs = n->probs;
            } else if (ev->kind == RT_EV_DONE) {
                ev->tail = n->buf ? n->buf : "";
            } else if (ev->kind == RT_EV_ERROR) {
                ev->message = n->msg;
            }
            t->cb(t->ud, ev);
        }

        pthread_mutex_lock(&e->mu);
        e->delivering = 0;
        int drop = 1; /* the event's reference */
        if (final && t->loop_ref) {
            t->loop_ref = 0;
            drop++;
        }
        task_unref_n_locked(e, t, drop);
        ev_recycle_locked(e, n);
    }
    pthread_mutex_unlock(&e->mu);
}

// --- waiting list (mu held) -----------------------------------------------------------------

static void wait_remove_locked(rt_engine_t *e, rt_task_t *t)
{
    rt_task_t **pp = &e->wait_head, *prev = NULL;
    while (*pp && *pp != t) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp)
        return;
    *pp = t->next;
    if (e->wait_tail == t)
        e->wait_tail = prev;
    t->next = NULL;
    t->waiting = 0;
    e->n_waiting--;
}

/* Fails the tasks that waited longer than --timeout for a slot. */
static void expire_waiting_locked(rt_engine_t *e, int64_t now)
{
    if (e->o.timeout_ms <= 0)
        return;
    rt_task_t *t = e->wait_head;
    while (t) {
        rt_task_t *next = t->next;
        if (now - t->t_submit_us > e->o.timeout_ms * 1000) {
            char msg[128];
            snprintf(msg, sizeof msg, "timed out after %lld ms waiting for a free slot",
                     (long long)e->o.timeout_ms);
            wait_remove_locked(e, t);
            post_error_locked(e, t, 503, -1, msg);
            task_unref_locked(e, t);
        }
        t = next;
    }
}

/* Ends every waiting task with status and msg. */
static void fail_waiting_locked(rt_engine_t *e, int status, const char *msg)
{
    while (e->wait_head) {
        rt_task_t *t = e->wait_head;
        wait_remove_locked(e, t);
        post_error_locked(e, t, status, -1, msg);
        task_unref_locked(e, t);
    }
}

// --- slots ----------------------------------------------------------------------------------

static size_t common_prefix(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    size_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

/* The snapshot for rt_engine_slots and the gauges of rt_engine_get_stats. */
static void update_snapshot_locked(rt_engine_t *e)
{
    uint64_t busy = 0;
    int64_t kv = 0;
    for (int i = 0; i < e->o.n_slots; i++) {
        const slot_t *s = &e->slots[i];
        rt_slot_info_t *in = &e->info[i];
        in->id = s->id;
        in->busy = s->task != NULL;
        in->n_ctx = e->o.n_ctx_slot;
        in->n_past = s->n_past;
        in->n_decoded = s->task ? s->n_decoded : 0;
        in->n_prompt = s->task ? (int64_t)s->task->n_prompt : 0;
        in->task_id = s->task ? s->task->id : 0;
        busy += s->task != NULL;
        kv += s->n_past;
        if ((uint64_t)s->n_past > e->stats.n_tokens_max)
            e->stats.n_tokens_max = (uint64_t)s->n_past;
    }
    e->stats.requests_processing = busy;
    e->stats.requests_deferred = e->n_waiting;
    e->stats.kv_cache_tokens = kv;
}

static void update_snapshot(rt_engine_t *e)
{
    pthread_mutex_lock(&e->mu);
    update_snapshot_locked(e);
    pthread_mutex_unlock(&e->mu);
}

/* Frees the slot and posts the task's final event (NULL: none, it was cancelled) in
 * the same critical section as the snapshot, so that a client that got its DONE sees
 * the slot idle in /slots. */
static void slot_release(rt_engine_t *e, slot_t *s, ev_node_t *final)
{
    rt_task_t *t = s->task;
    rt_sampler_destroy(s->smpl);
    s->smpl = NULL;
    s->task = NULL;
    s->state = SLOT_IDLE;
    s->n_seq = s->n_past; /* a sampled token never evaluated is not in the cache */
    s->held_len = 0;
    s->last_used = ++e->clock;
    pthread_mutex_lock(&e->mu);
    if (final)
        ev_post_locked(e, t, final);
    update_snapshot_locked(e);
    if (t)
        task_unref_locked(e, t);
    pthread_mutex_unlock(&e->mu);
}

/* An ERROR event, not yet posted; NULL without memory (the task then ends silently). */
static ev_node_t *error_event(rt_engine_t *e, int status, int slot, const char *msg)
{
    ev_node_t *n = ev_alloc(e);
    if (!n)
        return NULL;
    n->ev.kind = RT_EV_ERROR;
    n->ev.status = status;
    n->ev.slot = slot;
    snprintf(n->msg, sizeof n->msg, "%s", msg);
    return n;
}

static double ms_between(int64_t a_us, int64_t b_us) { return (double)(b_us - a_us) / 1000.0; }

static rt_timings_t slot_timings(const slot_t *s, int64_t now)
{
    rt_timings_t tm;
    tm.n_prompt = (int64_t)s->task->n_prompt;
    tm.n_cached = s->n_cached;
    tm.n_predicted = s->n_decoded;
    tm.prompt_ms = ms_between(s->t_start_us, s->got_first ? s->t_first_us : now);
    tm.predicted_ms = s->got_first ? ms_between(s->t_first_us, now) : 0.0;
    tm.n_drafted = s->n_drafted;
    tm.n_accepted = s->n_accepted;
    return tm;
}

/* --- the prompt cache in host RAM ---------------------------------------------------------- */

static void pc_stats(rt_engine_t *e, int saves, int hits, int64_t tokens, int evictions)
{
    pthread_mutex_lock(&e->mu);
    e->stats.prompt_cache_saves_total += (uint64_t)saves;
    e->stats.prompt_cache_hits_total += (uint64_t)hits;
    e->stats.prompt_cache_tokens_total += (uint64_t)tokens;
    e->stats.prompt_cache_evictions_total += (uint64_t)evictions;
    e->stats.prompt_cache_entries = (int64_t)e->n_pc;
    e->stats.prompt_cache_bytes = e->pc_bytes;
    pthread_mutex_unlock(&e->mu);
}

static void pc_remove(rt_engine_t *e, size_t i)
{
    e->pc_bytes -= e->pc[i].bytes;
    free(e->pc[i].toks);
    e->pc[i] = e->pc[--e->n_pc];
}

/* Drops entries (listed in ops, then sent) until the cache is within its budget:
 * the least recently used first. A failed drop only leaks stage memory until the
 * next restart; it is logged. */
static void pc_trim(rt_engine_t *e, int64_t extra_bytes)
{
    rt_kv_op_t ops[RT_KV_MAX_OPS];
    int n = 0;
    while (e->o.cache_ram > 0 && e->n_pc > 0 && e->pc_bytes + extra_bytes > e->o.cache_ram &&
           n < RT_KV_MAX_OPS) {
        size_t lru = 0;
        for (size_t i = 1; i < e->n_pc; i++)
            if (e->pc[i].last_used < e->pc[lru].last_used)
                lru = i;
        ops[n++] = (rt_kv_op_t){.op = RT_KV_DROP, .entry = e->pc[lru].id};
        pc_remove(e, lru);
    }
    if (n == 0)
        return;
    bl_err_t err = {0};
    if (rt_cluster_kv(e->cluster, ops, n, &err))
        BL_LOG(BL_LOG_WARN, "event=prompt_cache_drop_failed entries=%d reason=\"%s\"", n, err.msg);
    pc_stats(e, 0, 0, 0, n);
}

// --- the prompt cache on disk (--cache-disk) -------------------------------------------------

static void dk_stats(rt_engine_t *e, int saves, int hits, int64_t tokens, int evictions, int refused)
{
    pthread_mutex_lock(&e->mu);
    e->stats.disk_saves_total += (uint64_t)saves;
    e->stats.disk_hits_total += (uint64_t)hits;
    e->stats.disk_tokens_total += (uint64_t)tokens;
    e->stats.disk_evictions_total += (uint64_t)evictions;
    e->stats.disk_refused_total += (uint64_t)refused;
    e->stats.disk_entries = (int64_t)e->n_dk;
    e->stats.disk_bytes = e->dk_bytes;
    pthread_mutex_unlock(&e->mu);
}

/* Removes entry id's files: its meta file and every stage's part (and a part still
 * being written). */
static void dk_unlink(const char *dir, int64_t id)
{
    char prefix[48], path[4400];
    int pl = snprintf(prefix, sizeof prefix, "pc-%lld.", (long long)id);
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        if (strncmp(de->d_name, prefix, (size_t)pl) != 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        (void)unlink(path);
    }
    if (d)
        closedir(d);
}

static void dk_remove(rt_engine_t *e, size_t i, int refused)
{
    dk_unlink(e->o.cache_dir, e->dk[i].id);
    e->dk_bytes -= e->dk[i].bytes;
    free(e->dk[i].toks);
    e->dk[i] = e->dk[--e->n_dk];
    dk_stats(e, 0, 0, 0, refused ? 0 : 1, refused);
}

static int dk_add(rt_engine_t *e, int64_t id, int32_t *toks, int64_t n, int64_t bytes, uint64_t used)
{
    if (e->n_dk == e->cap_dk) {
        size_t cap = e->cap_dk ? 2 * e->cap_dk : 16;
        dk_entry_t *g = realloc(e->dk, cap * sizeof *g);
        if (!g)
            return BL_ENOMEM;
        e->dk = g;
        e->cap_dk = cap;
    }
    e->dk[e->n_dk++] = (dk_entry_t){.id = id, .toks = toks, .n = n, .bytes = bytes, .last_used = used};
    e->dk_bytes += bytes;
    return 0;
}

/* The least recently used entries go until the folder is within its budget. */
static void dk_trim(rt_engine_t *e)
{
    while (e->o.cache_disk >= 0 && e->n_dk > 1 && e->dk_bytes > e->o.cache_disk) {
        size_t lru = 0;
        for (size_t i = 1; i < e->n_dk; i++)
            if (e->dk[i].last_used < e->dk[lru].last_used)
                lru = i;
        dk_remove(e, lru, 0);
    }
}

static int write_all(int fd, const void *p, size_t n, uint64_t off);

/* Writes a meta file: the tokens in a slot file's frame, under a temporary name then
 * renamed. */
static int dk_write_meta(rt_engine_t *e, int64_t id, const int32_t *toks, int64_t n)
{
    char path[4400], tmp[4410];
    snprintf(path, sizeof path, "%s/pc-%lld.meta", e->o.cache_dir, (long long)id);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    rt_slotfile_hdr_t h = {.version = RT_SLOTFILE_VERSION, .kv_type = e->o.kv_type,
                           .n_layer = e->o.n_layer, .model_id = e->o.model_id,
                           .n_tokens = (uint64_t)n, .sum = bl_sum64(0, toks, 4 * (size_t)n)};
    uint8_t hb[RT_SLOTFILE_HDR_BYTES];
    rt_slotfile_encode(&h, hb);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int ok = fd >= 0 && write_all(fd, hb, sizeof hb, 0) == 0 &&
             write_all(fd, toks, 4 * (size_t)n, sizeof hb) == 0;
    if (fd >= 0 && close(fd) != 0)
        ok = 0;
    if (ok && rename(tmp, path) == 0)
        return 0;
    BL_LOG(BL_LOG_WARN, "event=cache_disk_write_failed entry=%lld reason=\"%s\"", (long long)id,
           strerror(errno));
    (void)unlink(tmp);
    return BL_EIO;
}

/* RAM entry id (n positions of toks, est_bytes in the stages' memory) to disk too,
 * unless an entry there holds it already; the stages write their parts off the
 * step's path, the meta file is written here. */
static void dk_persist(rt_engine_t *e, int64_t id, const int32_t *toks, int64_t n, int64_t est_bytes)
{
    /* a longer entry holds this one's state too; a recurrent state only its own length */
    for (size_t i = 0; i < e->n_dk; i++)
        if ((e->o.recurrent ? e->dk[i].n == n : e->dk[i].n >= n) &&
            common_prefix(e->dk[i].toks, (size_t)e->dk[i].n, toks, (size_t)n) == (size_t)n) {
            e->dk[i].last_used = ++e->clock;
            return;
        }
    int32_t *copy = malloc(4 * (size_t)n);
    if (!copy)
        return;
    memcpy(copy, toks, 4 * (size_t)n);
    rt_kv_op_t op = {.op = RT_KV_PERSIST, .entry = id, .n = n};
    bl_err_t err = {0};
    if (rt_cluster_kv(e->cluster, &op, 1, &err) || dk_write_meta(e, id, toks, n)) {
        if (err.msg[0])
            BL_LOG(BL_LOG_WARN, "event=cache_disk_write_failed entry=%lld reason=\"%s\"", (long long)id,
                   err.msg);
        free(copy);
        return;
    }
    /* the entries this one extends are superseded (not a recurrent state's: the longer
     * one cannot give back the shorter) */
    for (size_t i = 0; i < e->n_dk && !e->o.recurrent;) {
        if (e->dk[i].n < n && common_prefix(e->dk[i].toks, (size_t)e->dk[i].n, toks, (size_t)n) ==
                                  (size_t)e->dk[i].n)
            dk_remove(e, i, 0);
        else
            i++;
    }
    if (dk_add(e, id, copy, n, est_bytes, ++e->clock)) {
        free(copy);
        return;
    }
    dk_stats(e, 1, 0, 0, 0, 0);
    dk_trim(e);
}

/* A file of the folder: its entry, whether it is the meta file, its size and time. */
typedef struct dk_file {
    int64_t id;
    int meta;
    int64_t bytes;
    time_t mtime;
} dk_file_t;

static int dk_file_cmp(const void *a, const void *b)
{
    const dk_file_t *x = a, *y = b;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    return y->meta - x->meta; /* the meta file first */
}

/* A meta file's tokens, checked against this model file, cache type and context:
 * 0 and *toks (caller frees); 1 for another model's or type's (not ours to judge);
 * an error code with err's reason for a damaged one. */
static int dk_read_meta(rt_engine_t *e, int64_t id, int32_t **toks, int64_t *n, bl_err_t *err)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/pc-%lld.meta", e->o.cache_dir, (long long)id);
    rt_slotfile_hdr_t h;
    uint8_t hb[RT_SLOTFILE_HDR_BYTES];
    *toks = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t k = fd >= 0 ? pread(fd, hb, sizeof hb, 0) : -1;
    int rc = rt_slotfile_decode(hb, k > 0 ? (size_t)k : 0, &h, err);
    if (rc == 0 && (h.model_id != e->o.model_id || h.kv_type != e->o.kv_type ||
                    h.n_layer != e->o.n_layer)) {
        if (fd >= 0)
            close(fd);
        return 1;
    }
    if (rc == 0 && (h.n_tokens == 0 || h.data_bytes != 0 || h.n_tokens >= (uint64_t)e->o.n_ctx_slot))
        rc = bl_err_set(err, BL_EINVAL, "%llu tokens", (unsigned long long)h.n_tokens);
    if (rc == 0 && !(*toks = malloc(4 * (size_t)h.n_tokens)))
        rc = bl_err_set(err, BL_ENOMEM, "out of memory");
    if (rc == 0 && pread(fd, *toks, 4 * (size_t)h.n_tokens, RT_SLOTFILE_HDR_BYTES) !=
                       (ssize_t)(4 * h.n_tokens))
        rc = bl_err_set(err, BL_EINVAL, "cut short");
    if (rc == 0 && bl_sum64(0, *toks, 4 * (size_t)h.n_tokens) != h.sum)
        rc = bl_err_set(err, BL_EINVAL, "damaged");
    for (uint64_t t = 0; rc == 0 && t < h.n_tokens; t++)
        if ((*toks)[t] < 0 || (*toks)[t] >= e->n_vocab_tok)
            rc = bl_err_set(err, BL_EINVAL, "a token outside the vocabulary");
    if (fd >= 0)
        close(fd);
    if (rc) {
        free(*toks);
        *toks = NULL;
        return rc;
    }
    *n = (int64_t)h.n_tokens;
    return 0;
}

/* Reads the folder at start, in one pass: each meta file of this model file and
 * cache type becomes an entry (sized by its files, ordered by their age); damaged
 * meta files, parts without a meta file and half-written files are removed; files of
 * another model are left alone. New entry names come after the largest found. */
static void dk_scan(rt_engine_t *e)
{
    DIR *d = opendir(e->o.cache_dir);
    if (!d) {
        BL_LOG(BL_LOG_WARN, "event=cache_disk_unreadable dir=\"%s\" reason=\"%s\"", e->o.cache_dir,
               strerror(errno));
        return;
    }
    dk_file_t *files = NULL;
    size_t n_files = 0, cap = 0;
    int64_t max_id = -1;
    struct dirent *de;
    char path[4400];
    while ((de = readdir(d)) != NULL) {
        long long id;
        char rest[64];
        if (sscanf(de->d_name, "pc-%lld.%63s", &id, rest) != 2 || id < 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", e->o.cache_dir, de->d_name);
        size_t nl = strlen(de->d_name);
        struct stat st;
        if (nl > 4 && !strcmp(de->d_name + nl - 4, ".tmp")) { /* a write a crash cut short */
            (void)unlink(path);
            continue;
        }
        if (id > max_id)
            max_id = id;
        if (stat(path, &st) != 0)
            continue;
        if (n_files == cap) {
            cap = cap ? 2 * cap : 64;
            dk_file_t *g = realloc(files, cap * sizeof *g);
            if (!g)
                break;
            files = g;
        }
        files[n_files++] = (dk_file_t){id, !strcmp(rest, "meta"), (int64_t)st.st_size, st.st_mtime};
    }
    closedir(d);
    if (n_files)
        qsort(files, n_files, sizeof *files, dk_file_cmp);
    /* entries, each with its files' bytes; the clock orders them by their meta's age */
    struct found {
        int64_t id, n, bytes;
        int32_t *toks;
        time_t mtime;
    } *ok = n_files ? malloc(n_files * sizeof *ok) : NULL;
    size_t n_ok = 0;
    for (size_t i = 0; i < n_files;) {
        size_t j = i;
        int64_t bytes = 0;
        while (j < n_files && files[j].id == files[i].id)
            bytes += files[j++].bytes;
        const int64_t id = files[i].id;
        if (!files[i].meta) { /* parts whose meta file is gone */
            dk_unlink(e->o.cache_dir, id);
        } else {
            bl_err_t err = {0};
            int32_t *toks = NULL;
            int64_t n = 0;
            int rc = dk_read_meta(e, id, &toks, &n, &err);
            if (rc < 0) {
                BL_LOG(BL_LOG_WARN, "event=cache_disk_entry_refused entry=%lld reason=\"%s\"",
                       (long long)id, err.msg);
                dk_unlink(e->o.cache_dir, id);
                dk_stats(e, 0, 0, 0, 0, 1);
            } else if (rc == 0 && ok) {
                ok[n_ok++] = (struct found){id, n, bytes, toks, files[i].mtime};
            } else {
                free(toks);
            }
        }
        i = j;
    }
    for (size_t i = 1; i < n_ok; i++) /* oldest first */
        for (size_t j = i; j > 0 && ok[j].mtime < ok[j - 1].mtime; j--) {
            struct found t = ok[j];
            ok[j] = ok[j - 1];
            ok[j - 1] = t;
        }
    for (size_t i = 0; i < n_ok; i++)
        if (dk_add(e, ok[i].id, ok[i].toks, ok[i].n, ok[i].bytes, ++e->clock))
            free(ok[i].toks);
    free(ok);
    free(files);
    e->pc_next_id = max_id + 1;
    BL_LOG(BL_LOG_INFO, "event=cache_disk dir=\"%s\" entries=%zu bytes=%lld", e->o.cache_dir, e->n_dk,
           (long long)e->dk_bytes);
    dk_trim(e);
    dk_stats(e, 0, 0, 0, 0, 0);
}

/* Saves what slot s holds before a new prompt overwrites it, unless the cache
 * already has it: the entries it extends are dropped. */
static void pc_save(rt_engine_t *e, slot_t *s)
{
    const int64_t n = s->n_past;
    for (size_t i = 0; i < e->n_pc; i++)
        if ((e->o.recurrent ? e->pc[i].n == n : e->pc[i].n >= n) &&
            common_prefix(e->pc[i].toks, (size_t)e->pc[i].n, s->seq, (size_t)n) == (size_t)n) {
            e->pc[i].last_used = ++e->clock; /* already kept */
            if (e->o.cache_dir)
                dk_persist(e, e->pc[i].id, e->pc[i].toks, e->pc[i].n, e->pc[i].bytes);
            return;
        }
    if (e->n_pc == e->cap_pc) {
        size_t cap = e->cap_pc ? 2 * e->cap_pc : 16;
        pc_entry_t *g = realloc(e->pc, cap * sizeof *g);
        if (!g)
            return;
        e->pc = g;
        e->cap_pc = cap;
    }
    int32_t *toks = malloc((size_t)n * sizeof *toks);
    if (!toks)
        return;
    memcpy(toks, s->seq, (size_t)n * sizeof *toks);
    rt_kv_op_t op = {.op = RT_KV_SAVE, .slot = s->id, .entry = e->pc_next_id++, .n = n};
    bl_err_t err = {0};
    int rc = rt_cluster_kv(e->cluster, &op, 1, &err);
    if (rc) {
        free(toks);
        BL_LOG(BL_LOG_WARN, "event=prompt_cache_save_failed slot=%d n=%lld reason=\"%s\"", s->id,
               (long long)n, err.msg);
        rt_kv_op_t drop = {.op = RT_KV_DROP, .entry = op.entry}; /* what stages before kept */
        if (rc != BL_ECLOSED && rc != BL_EAGAIN && rt_cluster_kv(e->cluster, &drop, 1, &err))
            BL_LOG(BL_LOG_WARN, "event=prompt_cache_drop_failed entries=1 reason=\"%s\"", err.msg);
        return;
    }
    /* the entries this one extends are superseded (not a recurrent state's) */
    rt_kv_op_t drops[RT_KV_MAX_OPS];
    int nd = 0;
    for (size_t i = 0; i < e->n_pc && nd < RT_KV_MAX_OPS && !e->o.recurrent;) {
        if (e->pc[i].n < n && common_prefix(e->pc[i].toks, (size_t)e->pc[i].n, toks, (size_t)n) ==
                                  (size_t)e->pc[i].n) {
            drops[nd++] = (rt_kv_op_t){.op = RT_KV_DROP, .entry = e->pc[i].id};
            pc_remove(e, i);
        } else {
            i++;
        }
    }
    if (nd && rt_cluster_kv(e->cluster, drops, nd, &err))
        BL_LOG(BL_LOG_WARN, "event=prompt_cache_drop_failed entries=%d reason=\"%s\"", nd, err.msg);
    e->pc[e->n_pc++] = (pc_entry_t){.id = op.entry, .toks = toks, .n = n, .bytes = op.bytes,
                                    .last_used = ++e->clock};
    e->pc_bytes += op.bytes;
    BL_LOG(BL_LOG_DEBUG, "event=prompt_cache_save slot=%d n=%lld bytes=%lld entries=%zu", s->id,
           (long long)n, (long long)op.bytes, e->n_pc);
    pc_stats(e, 1, 0, 0, 0);
    if (e->o.cache_dir) {
        dk_persist(e, op.entry, toks, n, op.bytes);
        if (e->o.cache_ram == 0) { /* no cache in RAM: the state was only the disk's source */
            rt_kv_op_t drop = {.op = RT_KV_DROP, .entry = op.entry};
            pc_remove(e, e->n_pc - 1);
            if (rt_cluster_kv(e->cluster, &drop, 1, &err))
                BL_LOG(BL_LOG_WARN, "event=prompt_cache_drop_failed entries=1 reason=\"%s\"", err.msg);
            pc_stats(e, 0, 0, 0, 0);
        }
    }
}

// --- a cache the slots share (-kvu) ---------------------------------------------------------

static int64_t kv_chunks(int64_t n) { return (n + RT_KV_CHUNK - 1) / RT_KV_CHUNK; }

/* Chunks of the shared cache that no slot holds. */
static int64_t kv_free(const rt_engine_t *e)
{
    int64_t used = 0;
    for (int i = 0; i < e->o.n_slots; i++)
        used += kv_chunks(e->slots[i].n_kv);
    return kv_chunks(e->o.kv_pool) - used;
}

/* Frees chunks of the shared cache until want are free, from the idle slots other
 * than keep, the least recently used first; what each held goes to the prompt cache
 * first (when there is one). Returns the chunks free now. */
static int64_t kv_evict(rt_engine_t *e, int64_t want, const slot_t *keep)
{
    int64_t have = kv_free(e);
    while (have < want) {
        slot_t *v = NULL;
        for (int i = 0; i < e->o.n_slots; i++) {
            slot_t *s = &e->slots[i];
            if (s != keep && !s->task && s->n_kv > 0 && (!v || s->last_used < v->last_used))
                v = s;
        }
        if (!v)
            break;
        if ((e->o.cache_ram != 0 || e->o.cache_dir) && v->n_past >= PC_MIN_TOKENS) {
            pc_save(e, v);
            pc_trim(e, 0);
        }
        rt_kv_op_t op = {.op = RT_KV_CLEAR, .slot = v->id};
        bl_err_t err = {0};
        if (rt_cluster_kv(e->cluster, &op, 1, &err)) {
            BL_LOG(BL_LOG_WARN, "event=kv_clear_failed slot=%d reason=\"%s\"", v->id, err.msg);
            break;
        }
        BL_LOG(BL_LOG_DEBUG, "event=kv_evict slot=%d n=%lld", v->id, (long long)v->n_kv);
        v->n_past = v->n_kv = v->n_seq = 0;
        ck_drop(e, v, 0);
        have = kv_free(e);
        pthread_mutex_lock(&e->mu);
        e->stats.kv_evictions_total++;
        pthread_mutex_unlock(&e->mu);
    }
    return have;
}

/* Disk entry id's first n positions into slot s (an entry found damaged, cut short or
 * missing a part is removed: the prompt runs whole and its state is saved anew).
 * Returns the positions s now holds. */
static size_t dk_restore(rt_engine_t *e, slot_t *s, int64_t id, size_t n, size_t keep)
{
    if (e->o.kv_pool) {
        const int64_t want = kv_chunks((int64_t)n) - kv_chunks(s->n_kv);
        if (want > kv_free(e) && kv_evict(e, want, s) < want)
            return keep;
    }
    size_t at = 0;
    while (at < e->n_dk && e->dk[at].id != id)
        at++;
    if (at == e->n_dk) /* evicting saved a state and the budget took this one */
        return keep;
    rt_kv_op_t op = {.op = RT_KV_FETCH, .slot = s->id, .entry = id, .n = (int64_t)n};
    bl_err_t err = {0};
    if (rt_cluster_kv(e->cluster, &op, 1, &err)) {
        BL_LOG(BL_LOG_WARN, "event=cache_disk_entry_refused entry=%lld slot=%d reason=\"%s\"",
               (long long)id, s->id, err.msg);
        dk_remove(e, at, 1);
        s->n_kv = 0;
        return 0; /* what the stages hold of the slot is no use now */
    }
    s->n_kv = (int64_t)n;
    e->dk[at].last_used = ++e->clock;
    memcpy(s->seq, e->dk[at].toks, n * sizeof *s->seq);
    dk_stats(e, 0, 1, (int64_t)n, 0, 0);
    BL_LOG(BL_LOG_DEBUG, "event=cache_disk_hit entry=%lld slot=%d n=%zu", (long long)id, s->id, n);
    return n;
}

/* The prompt's start from the cache into slot s when an entry shares more of it than
 * the slot's own cache (keep positions): returns the positions s now holds. */
static size_t pc_restore(rt_engine_t *e, slot_t *s, const rt_task_t *t, size_t keep)
{
    size_t best = keep;
    pc_entry_t *hit = NULL;
    for (size_t i = 0; i < e->n_pc; i++) {
        size_t l = common_prefix(e->pc[i].toks, (size_t)e->pc[i].n, t->prompt, t->n_prompt);
        /* a recurrent state is only whole: the entry all a prefix, a token left over */
        if (e->o.recurrent && (l != (size_t)e->pc[i].n || l >= t->n_prompt))
            continue;
        if (l > best) {
            best = l;
            hit = &e->pc[i];
        }
    }
    /* an entry on disk that shares more than any in RAM */
    size_t best_dk = best;
    int64_t dk_id = -1;
    for (size_t i = 0; i < e->n_dk; i++) {
        size_t l = common_prefix(e->dk[i].toks, (size_t)e->dk[i].n, t->prompt, t->n_prompt);
        if (e->o.recurrent && (l != (size_t)e->dk[i].n || l >= t->n_prompt))
            continue; /* a recurrent state is only whole, as in RAM */
        if (l > best_dk) {
            best_dk = l;
            dk_id = e->dk[i].id;
        }
    }
    if (best_dk >= t->n_prompt)
        best_dk = t->n_prompt - 1;
    if (dk_id >= 0 && best_dk > keep && best_dk >= PC_MIN_TOKENS &&
        best_dk > (best >= t->n_prompt ? t->n_prompt - 1 : best))
        return dk_restore(e, s, dk_id, best_dk, keep);
    if (best >= t->n_prompt) /* the last token's logits are needed */
        best = t->n_prompt - 1;
    if (!hit || best <= keep || best < PC_MIN_TOKENS)
        return keep;
    if (e->o.kv_pool) { /* a shared cache must have room for what comes in */
        const int64_t id = hit->id;
        const int64_t want = kv_chunks((int64_t)best) - kv_chunks(s->n_kv);
        if (want > kv_free(e) && kv_evict(e, want, s) < want)
            return keep;
        hit = NULL; /* evicting may have saved states and moved the entries */
        for (size_t i = 0; i < e->n_pc && !hit; i++)
            hit = e->pc[i].id == id ? &e->pc[i] : NULL;
        if (!hit)
            return keep;
    }
    rt_kv_op_t op = {.op = RT_KV_LOAD, .slot = s->id, .entry = hit->id, .n = (int64_t)best};
    bl_err_t err = {0};
    if (rt_cluster_kv(e->cluster, &op, 1, &err)) {
        BL_LOG(BL_LOG_WARN, "event=prompt_cache_load_failed slot=%d n=%zu reason=\"%s\"", s->id, best,
               err.msg);
        pc_remove(e, (size_t)(hit - e->pc));
        pc_stats(e, 0, 0, 0, 0);
        s->n_kv = 0;
        return 0; /* the slot's cache holds nothing usable now */
    }
    s->n_kv = (int64_t)best;
    hit->last_used = ++e->clock;
    memcpy(s->seq, hit->toks, best * sizeof *s->seq);
    pc_stats(e, 0, 1, (int64_t)best, 0);
    return best;
}

/* Forgets what the processes held: after a restart every cache starts empty, the
 * saved states too. */
static void forget_caches(rt_engine_t *e)
{
    for (int i = 0; i < e->o.n_slots; i++) {
        e->slots[i].n_past = 0;
        e->slots[i].n_kv = 0;
        e->slots[i].n_seq = 0;
        ck_drop(e, &e->slots[i], 0);
    }
    if (e->o.kv_pool) {
        /* where the processes live on (a refused step), their shared cache must hold
         * what this side counts: nothing */
        rt_kv_op_t ops[RT_KV_MAX_OPS];
        bl_err_t err = {0};
        for (int i = 0; i < e->o.n_slots; i += RT_KV_MAX_OPS) {
            int n = e->o.n_slots - i < RT_KV_MAX_OPS ? e->o.n_slots - i : RT_KV_MAX_OPS;
            for (int j = 0; j < n; j++)
                ops[j] = (rt_kv_op_t){.op = RT_KV_CLEAR, .slot = i + j};
            if (rt_cluster_state(e->cluster) == RT_CLUSTER_READY &&
                rt_cluster_kv(e->cluster, ops, n, &err))
                BL_LOG(BL_LOG_WARN, "event=kv_clear_failed reason=\"%s\"", err.msg);
        }
    }
    while (e->n_pc)
        pc_remove(e, e->n_pc - 1);
    pc_stats(e, 0, 0, 0, 0);
}

/* Ends every task in a slot with an ERROR (a failed step: its rows are lost). */
static void fail_running(rt_engine_t *e, int status, const char *msg)
{
    for (int i = 0; i < e->o.n_slots; i++) {
        slot_t *s = &e->slots[i];
        if (!s->task)
            continue;
        BL_LOG(BL_LOG_WARN, "event=task_failed task=%llu slot=%d status=%d",
               (unsigned long long)s->task->id, s->id, status);
        slot_release(e, s, error_event(e, status, s->id, msg));
    }
}

/* Drops s's checkpoints past position keep (keep 0: all) in the stages and here. */
static void ck_drop(rt_engine_t *e, slot_t *s, int64_t keep)
{
    rt_kv_op_t ops[RT_KV_MAX_OPS];
    int n = 0, k = 0;
    for (int i = 0; i < s->n_ck; i++) {
        if (s->ck_n[i] <= keep) {
            s->ck_id[k] = s->ck_id[i];
            s->ck_n[k++] = s->ck_n[i];
        } else if (n < RT_KV_MAX_OPS) {
            ops[n++] = (rt_kv_op_t){.op = RT_KV_DROP, .entry = s->ck_id[i]};
        }
    }
    s->n_ck = k;
    bl_err_t err = {0};
    if (n && rt_cluster_state(e->cluster) == RT_CLUSTER_READY && rt_cluster_kv(e->cluster, ops, n, &err))
        BL_LOG(BL_LOG_WARN, "event=checkpoint_drop_failed slot=%d entries=%d reason=\"%s\"", s->id, n, err.msg);
}

/* A checkpoint of s at n_past (a recurrent model), the oldest dropped past -ctxcp. */
static void ck_save(rt_engine_t *e, slot_t *s)
{
    if (e->o.ctx_checkpoints <= 0 || s->n_past < 1 || (s->n_ck && s->ck_n[s->n_ck - 1] == s->n_past))
        return;
    bl_err_t err = {0};
    if (s->n_ck == e->o.ctx_checkpoints) {
        rt_kv_op_t drop = {.op = RT_KV_DROP, .entry = s->ck_id[0]};
        if (rt_cluster_kv(e->cluster, &drop, 1, &err))
            BL_LOG(BL_LOG_WARN, "event=checkpoint_drop_failed slot=%d entries=1 reason=\"%s\"", s->id, err.msg);
        memmove(s->ck_id, s->ck_id + 1, (size_t)(s->n_ck - 1) * sizeof *s->ck_id);
        memmove(s->ck_n, s->ck_n + 1, (size_t)(s->n_ck - 1) * sizeof *s->ck_n);
        s->n_ck--;
    }
    rt_kv_op_t op = {.op = RT_KV_CKPT, .slot = s->id, .entry = e->pc_next_id++, .n = s->n_past};
    if (rt_cluster_kv(e->cluster, &op, 1, &err)) {
        BL_LOG(BL_LOG_WARN, "event=checkpoint_failed slot=%d n=%lld reason=\"%s\"", s->id, (long long)s->n_past,
               err.msg);
        rt_kv_op_t drop = {.op = RT_KV_DROP, .entry = op.entry}; /* what stages before kept */
        if (rt_cluster_state(e->cluster) == RT_CLUSTER_READY && rt_cluster_kv(e->cluster, &drop, 1, &err))
            BL_LOG(BL_LOG_WARN, "event=checkpoint_drop_failed slot=%d entries=1 reason=\"%s\"", s->id, err.msg);
        return;
    }
    s->ck_id[s->n_ck] = op.entry;
    s->ck_n[s->n_ck++] = s->n_past;
    pthread_mutex_lock(&e->mu);
    e->stats.checkpoints_total++;
    pthread_mutex_unlock(&e->mu);
    BL_LOG(BL_LOG_DEBUG, "event=checkpoint slot=%d n=%lld bytes=%lld kept=%d", s->id, (long long)s->n_past,
           (long long)op.bytes, s->n_ck);
}

/* Where a recurrent model's slot s can start prompt t: its whole cache when that is a
 * prefix of the prompt short of its last token, else its latest checkpoint inside the
 * shared prefix (*ck: its index), else 0. */
static size_t ck_keep(const slot_t *s, const rt_task_t *t, int *ck)
{
    *ck = -1;
    const size_t common = common_prefix(s->seq, (size_t)s->n_past, t->prompt, t->n_prompt);
    if (common == (size_t)s->n_past && common < t->n_prompt)
        return common;
    const size_t want = common < t->n_prompt ? common : t->n_prompt - 1;
    for (int i = s->n_ck - 1; i >= 0; i--)
        if ((size_t)s->ck_n[i] <= want) {
            *ck = i;
            return (size_t)s->ck_n[i];
        }
    return 0;
}

/* Whether a recurrent model's prompt slot s is at a checkpoint's position: the one
 * before its prompt's last token (a prompt of at least PC_MIN_TOKENS; the next request
 * of the conversation, or the same prompt again, starts there), or a multiple of
 * -cpent inside it. */
static int ck_due(const rt_engine_t *e, const slot_t *s)
{
    if (!e->o.recurrent || e->o.ctx_checkpoints <= 0 || s->n_past >= s->n_seq)
        return 0;
    if (s->n_past == s->n_seq - 1 && s->n_seq - 1 >= PC_MIN_TOKENS)
        return 1;
    return e->o.checkpoint_every > 0 && s->n_past % e->o.checkpoint_every == 0;
}

/* The next position past n_past where prompt slot s takes a checkpoint (ck_due), or 0:
 * none before its prompt's end. */
static int64_t ck_next(const rt_engine_t *e, const slot_t *s)
{
    if (!e->o.recurrent || e->o.ctx_checkpoints <= 0)
        return 0;
    int64_t at = s->n_seq - 1 >= PC_MIN_TOKENS && s->n_seq - 1 > s->n_past ? s->n_seq - 1 : 0;
    if (e->o.checkpoint_every > 0) {
        const int64_t every = (s->n_past / e->o.checkpoint_every + 1) * e->o.checkpoint_every;
        if (every < s->n_seq && (at == 0 || every < at))
            at = every;
    }
    return at;
}

/* Puts t into s: keeps the cached prefix, creates the sampler, resets the text state.
 * Returns 0, or -1 after ending the task with an ERROR. */
static int slot_start(rt_engine_t *e, slot_t *s, rt_task_t *t, int32_t n_vocab)
{
    bl_err_t err = { 0 };
    rt_sampler_t *smpl = NULL;
    if (t->p.sampling.grammar && !e->gvocab && e->tok &&
        rt_sampler_grammar_vocab(&e->gvocab, e->tok, &err))
        BL_LOG(BL_LOG_WARN, "event=grammar_vocab_failed reason=%s", err.msg); /* per sampler */
    t->p.sampling.grammar_vocab = e->gvocab;
    if (rt_sampler_create(&smpl, &t->p.sampling, n_vocab, (int32_t)e->o.n_ctx_slot, e->tok, &err)) {
        pthread_mutex_lock(&e->mu);
        post_error_locked(e, t, 400, s->id, err.msg);
        task_unref_locked(e, t);
        pthread_mutex_unlock(&e->mu);
        return -1;
    }
    size_t keep = 0;
    int ck = -1;
    /* the draft's cache agrees with the new sequence as far as the old one does */
    s->d_past = (int64_t)common_prefix(s->seq, (size_t)s->d_past, t->prompt, t->n_prompt);
    if (t->p.cache_prompt && e->o.recurrent) {
        keep = ck_keep(s, t, &ck);
    } else if (t->p.cache_prompt) {
        keep = common_prefix(s->seq, (size_t)s->n_past, t->prompt, t->n_prompt);
        /* the logits of the prompt's last token are needed: evaluate it again */
        if (keep >= t->n_prompt)
            keep = t->n_prompt - 1;
    }
    const int64_t t_start = now_us(); /* the prompt's time counts the cache's copies */
    const size_t own = keep;
    if (e->o.cache_ram != 0 || e->o.cache_dir) {
        /* what the prompt overwrites goes to the prompt cache first, and the prompt
         * starts from the cache when that holds more of it */
        if (s->n_past >= PC_MIN_TOKENS && (int64_t)keep < s->n_past)
            pc_save(e, s);
        if (t->p.cache_prompt)
            keep = pc_restore(e, s, t, keep);
        pc_trim(e, 0); /* after the load: the state it used is the latest */
    }
    if (e->o.recurrent) {
        if (keep != own) {
            ck_drop(e, s, 0); /* the slot holds another sequence's state now */
        } else if (ck >= 0) {
            /* back to the checkpoint: the K/V rows cut, the recurrent state put back */
            rt_kv_op_t op = {.op = RT_KV_ROLLBACK, .slot = s->id, .entry = s->ck_id[ck], .n = s->ck_n[ck]};
            bl_err_t kerr = {0};
            if (rt_cluster_kv(e->cluster, &op, 1, &kerr)) {
                BL_LOG(BL_LOG_WARN, "event=checkpoint_restore_failed slot=%d n=%lld reason=\"%s\"", s->id,
                       (long long)op.n, kerr.msg);
                keep = 0;
            } else {
                pthread_mutex_lock(&e->mu);
                e->stats.checkpoint_restores_total++;
                pthread_mutex_unlock(&e->mu);
            }
            ck_drop(e, s, (int64_t)keep);
        } else {
            ck_drop(e, s, (int64_t)keep);
        }
    }
    memcpy(s->seq + keep, t->prompt + keep, (t->n_prompt - keep) * sizeof *t->prompt);
    s->n_past = (int64_t)keep;
    s->n_seq = (int64_t)t->n_prompt;
    s->n_cached = (int64_t)keep;
    s->n_decoded = 0;
    s->n_draft = 0;
    s->n_drafted = s->n_accepted = 0;
    s->d_wait = s->d_backoff = 0;
    s->mtp_tok = -1;
    s->ng_begun = s->ng_low = 0;
    s->ng_mark = 0;
    s->task = t;
    s->smpl = smpl;
    /* the penalties look back over the prompt too, as llama-server's do */
    for (size_t i = 0; i < t->n_prompt; i++)
        rt_sampler_accept(smpl, t->prompt[i]);
    s->dt = s->detok[t->p.special == RT_TASK_SPECIAL_MARKERS ? 2 : t->p.special ? 1 : 0];
    rt_detok_reset(s->dt);
    s->held_len = 0;
    s->state = SLOT_PROMPT;
    s->start_order = ++e->clock;
    s->last_used = s->start_order;
    s->t_start_us = t_start;
    s->t_first_us = 0;
    s->got_first = 0;
    s->has_new_line = s->in_indent = 0;
    s->line_indent = 0;
    BL_LOG(BL_LOG_DEBUG, "event=task_start task=%llu slot=%d n_prompt=%zu n_cached=%zu",
           (unsigned long long)t->id, s->id, t->n_prompt, keep);
    return 0;
}

/* The idle slot for t: the one it asks for, else the one sharing the longest prefix
 * with its prompt, else the least recently used. NULL: none now. */
static slot_t *pick_slot(rt_engine_t *e, const rt_task_t *t)
{
    if (t->p.slot_id >= 0) {
        slot_t *s = &e->slots[t->p.slot_id];
        return s->task ? NULL : s;
    }
    slot_t *best = NULL;
    size_t best_lcp = 0;
    for (int i = 0; i < e->o.n_slots; i++) {
        slot_t *s = &e->slots[i];
        if (s->task)
            continue;
        size_t lcp = t->p.cache_prompt
                         ? common_prefix(s->seq, (size_t)s->n_past, t->prompt, t->n_prompt)
                         : 0;
        if (!best || lcp > best_lcp || (lcp == best_lcp && s->last_used < best->last_used)) {
            best = s;
            best_lcp = lcp;
        }
    }
    return best;
}

// --- slot files -----------------------------------------------------------------------------

/* Ends an io task: DONE with its figures, or ERROR (status, msg) when msg is set. */
static void io_end(rt_engine_t *e, rt_task_t *t, int slot, const char *msg, int status, int64_t n,
                   int64_t bytes, int64_t t0)
{
    ev_node_t *nd = msg ? NULL : ev_alloc(e);
    pthread_mutex_lock(&e->mu);
    if (msg) {
        post_error_locked(e, t, status, slot, msg);
    } else if (nd) {
        nd->ev.kind = RT_EV_DONE;
        nd->ev.slot = slot;
        nd->ev.io_tokens = n;
        nd->ev.io_bytes = bytes;
        nd->ev.io_ms = ms_between(t0, now_us());
        ev_post_locked(e, t, nd);
    }
    task_unref_locked(e, t);
    pthread_mutex_unlock(&e->mu);
}

/* Empties slot s in the stages. */
static int io_clear(rt_engine_t *e, slot_t *s, bl_err_t *err)
{
    rt_kv_op_t op = {.op = RT_KV_CLEAR, .slot = s->id};
    int rc = rt_cluster_kv(e->cluster, &op, 1, err);
    s->n_past = s->n_kv = s->n_seq = 0;
    ck_drop(e, s, 0);
    return rc;
}

static int write_all(int fd, const void *p, size_t n, uint64_t off)
{
    for (size_t done = 0; done < n;) {
        ssize_t k = pwrite(fd, (const char *)p + done, n - done, (off_t)(off + done));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        done += (size_t)k;
    }
    return 0;
}

static void io_save(rt_engine_t *e, slot_t *s, rt_task_t *t, const char *path, const char *io,
                    int64_t entry, int64_t t0)
{
    bl_err_t err = {0};
    const int64_t n = s->n_past;
    rt_slotfile_hdr_t h = {.version = RT_SLOTFILE_VERSION, .kv_type = e->o.kv_type,
                           .n_layer = e->o.n_layer, .model_id = e->o.model_id,
                           .n_tokens = (uint64_t)n};
    uint8_t hb[RT_SLOTFILE_HDR_BYTES];
    const uint64_t base = RT_SLOTFILE_HDR_BYTES + 4 * (uint64_t)n;
    int fd = open(io, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int rc = fd < 0 ? bl_err_set(&err, BL_EIO, "%s: %s", io, strerror(errno)) : 0;
    rt_slotfile_encode(&h, hb);
    if (rc == 0 && (write_all(fd, hb, sizeof hb, 0) || write_all(fd, s->seq, 4 * (size_t)n, sizeof hb)))
        rc = bl_err_set(&err, BL_EIO, "%s: %s", io, strerror(errno));
    if (rc == 0 && n > 0) {
        rt_kv_op_t op = {.op = RT_KV_WRITE, .slot = s->id, .entry = entry, .n = n,
                         .bytes = (int64_t)base};
        if ((rc = rt_cluster_kv(e->cluster, &op, 1, &err)) == 0)
            h.data_bytes = (uint64_t)op.bytes - base;
    }
    if (rc == 0)
        rc = rt_slotfile_sum_fd(fd, RT_SLOTFILE_HDR_BYTES, base - RT_SLOTFILE_HDR_BYTES + h.data_bytes,
                                &h.sum, &err);
    if (rc == 0) {
        rt_slotfile_encode(&h, hb);
        if (write_all(fd, hb, sizeof hb, 0) || fsync(fd) != 0)
            rc = bl_err_set(&err, BL_EIO, "%s: %s", io, strerror(errno));
    }
    if (fd >= 0 && close(fd) != 0 && rc == 0)
        rc = bl_err_set(&err, BL_EIO, "%s: %s", io, strerror(errno));
    if (rc == 0 && rename(io, path) != 0)
        rc = bl_err_set(&err, BL_EIO, "%s: %s", path, strerror(errno));
    if (rc) {
        (void)unlink(io);
        BL_LOG(BL_LOG_WARN, "event=slot_save_failed slot=%d file=\"%s\" reason=\"%s\"", s->id,
               t->io_name, err.msg);
        io_end(e, t, s->id, err.msg, 500, 0, 0, t0);
        return;
    }
    BL_LOG(BL_LOG_INFO, "event=slot_save slot=%d file=\"%s\" tokens=%lld bytes=%llu", s->id,
           t->io_name, (long long)n, (unsigned long long)(base + h.data_bytes));
    io_end(e, t, s->id, NULL, 0, n, (int64_t)(base + h.data_bytes), t0);
}

/* The checks of a slot file before any of it goes to the stages; fills h and toks
 * (caller frees). 400's message in err. */
static int io_check(rt_engine_t *e, int fd, rt_slotfile_hdr_t *h, int32_t **toks, bl_err_t *err)
{
    uint8_t hb[RT_SLOTFILE_HDR_BYTES];
    struct stat sb;
    ssize_t k = pread(fd, hb, sizeof hb, 0);
    int rc = rt_slotfile_decode(hb, k > 0 ? (size_t)k : 0, h, err);
    if (rc)
        return rc;
    if (h->model_id != e->o.model_id || h->n_layer != e->o.n_layer)
        return bl_err_set(err, BL_EINVAL, "slot file: written for another model file");
    if (h->kv_type != e->o.kv_type)
        return bl_err_set(err, BL_EINVAL, "slot file: its cache is of another type (-ctk/-ctv)");
    if (h->n_tokens > 0 && h->data_bytes == 0)
        return bl_err_set(err, BL_EINVAL, "slot file: its tokens come without their cache");
    if (h->n_tokens >= (uint64_t)e->o.n_ctx_slot)
        return bl_err_set(err, BL_EINVAL, "slot file: %llu tokens, more than a slot holds (%lld)",
                          (unsigned long long)h->n_tokens, (long long)e->o.n_ctx_slot);
    const uint64_t base = RT_SLOTFILE_HDR_BYTES + 4 * h->n_tokens;
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size != base + h->data_bytes)
        return bl_err_set(err, BL_EINVAL, "slot file: %lld bytes where its header says %llu "
                          "(cut short or grown)", (long long)sb.st_size,
                          (unsigned long long)(base + h->data_bytes));
    uint64_t sum = 0;
    if ((rc = rt_slotfile_sum_fd(fd, RT_SLOTFILE_HDR_BYTES, base - RT_SLOTFILE_HDR_BYTES + h->data_bytes,
                                 &sum, err)))
        return rc;
    if (sum != h->sum)
        return bl_err_set(err, BL_EINVAL, "slot file: damaged (its checksum does not match)");
    *toks = malloc(4 * (size_t)h->n_tokens + 1);
    if (!*toks)
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    k = pread(fd, *toks, 4 * (size_t)h->n_tokens, RT_SLOTFILE_HDR_BYTES);
    if (k != (ssize_t)(4 * h->n_tokens))
        return bl_err_set(err, BL_EIO, "slot file: %s", k < 0 ? strerror(errno) : "short read");
    for (uint64_t i = 0; i < h->n_tokens; i++)
        if ((*toks)[i] < 0 || (*toks)[i] >= e->n_vocab_tok)
            return bl_err_set(err, BL_EINVAL, "slot file: token %llu is %d, outside the vocabulary",
                              (unsigned long long)i, (*toks)[i]);
    return 0;
}

static void io_restore(rt_engine_t *e, slot_t *s, rt_task_t *t, const char *path, const char *io,
                       int64_t entry, int64_t t0)
{
    bl_err_t err = {0};
    rt_slotfile_hdr_t h = {0};
    int32_t *toks = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    int rc = fd < 0 ? bl_err_set(&err, BL_EINVAL, "%s: %s", t->io_name, strerror(errno))
                    : io_check(e, fd, &h, &toks, &err);
    if (fd >= 0)
        close(fd);
    const int64_t n = (int64_t)h.n_tokens;
    int status = rc == BL_EIO || rc == BL_ENOMEM ? 500 : 400;
    if (rc == 0 && e->o.kv_pool) { /* room in the shared cache */
        const int64_t want = kv_chunks(n) - kv_chunks(s->n_kv);
        if (want > kv_free(e) && kv_evict(e, want, s) < want)
            rc = bl_err_set(&err, BL_ERANGE, "no room in the shared KV cache for %lld tokens now",
                            (long long)n), status = 400;
    }
    if (rc == 0 && n == 0)
        rc = io_clear(e, s, &err), status = 500;
    if (rc == 0 && n > 0) {
        const uint64_t base = RT_SLOTFILE_HDR_BYTES + 4 * (uint64_t)n;
        rt_kv_op_t op = {.op = RT_KV_READ, .slot = s->id, .entry = entry, .n = n, .bytes = (int64_t)base};
        if (link(path, io) != 0) {
            rc = bl_err_set(&err, BL_EIO, "%s: %s", io, strerror(errno)), status = 500;
        } else {
            rc = rt_cluster_kv(e->cluster, &op, 1, &err);
            (void)unlink(io);
            if (rc == 0 && (uint64_t)op.bytes != base + h.data_bytes)
                rc = bl_err_set(&err, BL_EINVAL, "slot file: its cache is laid out for other layers "
                                "or heads than this model's"), status = 400;
            if (rc) { /* what the stages hold of it is no use */
                bl_err_t e2 = {0};
                if (rc != BL_EINVAL)
                    status = 400;
                (void)io_clear(e, s, &e2);
            }
        }
    }
    if (rc) {
        free(toks);
        BL_LOG(BL_LOG_WARN, "event=slot_restore_failed slot=%d file=\"%s\" reason=\"%s\"", s->id,
               t->io_name, err.msg);
        io_end(e, t, s->id, err.msg, status, 0, 0, t0);
        return;
    }
    if (n > 0) {
        memcpy(s->seq, toks, 4 * (size_t)n);
        s->n_past = s->n_kv = s->n_seq = n;
        ck_drop(e, s, 0); /* they were of what the slot held before */
    }
    s->d_past = 0;
    s->last_used = ++e->clock;
    free(toks);
    BL_LOG(BL_LOG_INFO, "event=slot_restore slot=%d file=\"%s\" tokens=%lld", s->id, t->io_name,
           (long long)n);
    io_end(e, t, s->id, NULL, 0, n, (int64_t)(RT_SLOTFILE_HDR_BYTES + 4 * (uint64_t)n + h.data_bytes),
           t0);
}

/* Runs an io task on idle slot s (engine thread; the other slots wait meanwhile). */
static void slot_io(rt_engine_t *e, slot_t *s, rt_task_t *t)
{
    const int64_t t0 = now_us();
    bl_err_t err = {0};
    if (t->io == RT_SLOT_ERASE) {
        const int64_t n = s->n_past;
        int rc = io_clear(e, s, &err);
        io_end(e, t, s->id, rc ? err.msg : NULL, 500, n, 0, t0);
        return;
    }
    char path[4352], io[4352];
    const int64_t entry = ++e->io_next;
    if (snprintf(path, sizeof path, "%s/%s", e->o.slot_dir, t->io_name) >= (int)sizeof path ||
        rt_cluster_kv_io_path(e->cluster, entry, io, sizeof io, &err)) {
        io_end(e, t, s->id, "the slot file's path is too long", 400, 0, 0, t0);
        return;
    }
    if (t->io == RT_SLOT_SAVE)
        io_save(e, s, t, path, io, entry, t0);
    else
        io_restore(e, s, t, path, io, entry, t0);
}

/* Moves waiting tasks into idle slots in FIFO order; a task asking for a busy slot
 * waits without holding back the ones behind it. */
static void assign_waiting(rt_engine_t *e, int32_t n_vocab)
{
    for (;;) {
        rt_task_t *t = NULL;
        slot_t *s = NULL;
        pthread_mutex_lock(&e->mu);
        for (rt_task_t *c = e->wait_head; c; c = c->next) {
            if ((s = pick_slot(e, c))) {
                t = c;
                wait_remove_locked(e, t);
                break;
            }
        }
        pthread_mutex_unlock(&e->mu);
        if (!t)
            return;
        drain(e, n_vocab); /* its cache ops must not overtake the steps in flight */
        if (t->io)
            slot_io(e, s, t);
        else
            (void)slot_start(e, s, t, n_vocab); /* a failure already ended the task */
    }
}

// --- text and stop strings ------------------------------------------------------------------

/* Searches the unsent text s (len) for the task's stop strings. Returns the offset of
 * the earliest full match (with *which set), or -1 and *release: how many leading bytes
 * can no longer begin a stop string and may be sent. */
static long find_stop(const rt_task_t *t, const char *s, size_t len, int *which, size_t *release)
{
    long best = -1;
    for (int i = 0; i < t->p.n_stop; i++) {
        size_t sl = t->stop_len[i];
        if (sl > len)
            continue;
        const char *hit = memmem(s, len, t->p.stop[i], sl);
        if (hit && (best < 0 || hit - s < best)) {
            best = hit - s;
            *which = i;
        }
    }
    if (best >= 0)
        return best;

    /* the earliest suffix that is a proper prefix of some stop string stays */
    size_t from = len > t->max_stop_len ? len - t->max_stop_len : 0;
    size_t p = len;
    for (size_t q = from; q < len && p == len; q++) {
        for (int i = 0; i < t->p.n_stop; i++) {
            if (t->stop_len[i] > len - q && memcmp(s + q, t->p.stop[i], len - q) == 0) {
                p = q;
                break;
            }
        }
    }
    /* never cut a character in two */
    while (p > 0 && p < len && ((unsigned char)s[p] & 0xC0) == 0x80)
        p--;
    *release = p;
    return -1;
}

static int held_append(slot_t *s, const char *text, size_t len)
{
    if (s->held_len + len + 1 > s->held_cap) {
        size_t cap = s->held_cap ? s->held_cap : 256;
        while (cap < s->held_len + len + 1)
            cap *= 2;
        char *b = realloc(s->held, cap);
        if (!b)
            return -1;
        s->held = b;
        s->held_cap = cap;
    }
    memcpy(s->held + s->held_len, text, len);
    s->held_len += len;
    return 0;
}

static void held_consume(slot_t *s, size_t n)
{
    memmove(s->held, s->held + n, s->held_len - n);
    s->held_len -= n;
}

// --- the end of a task ----------------------------------------------------------------------

static const char *stop_name(rt_stop_type_t st)
{
    switch (st) {
    case RT_STOP_EOS: return "eos";
    case RT_STOP_WORD: return "word";
    case RT_STOP_LIMIT: return "limit";
    default: return "none";
    }
}

/* Posts DONE and frees the slot. The held text (and, unless a stop string ended the
 * task, the bytes of an unfinished character) is released as the tail. */
/* Whether the disk cache keeps what a finished task leaves in slot s. */
static int dk_due(const rt_engine_t *e, const slot_t *s)
{
    return e->o.cache_dir && s->n_past >= PC_MIN_TOKENS;
}

static void finish_task(rt_engine_t *e, slot_t *s, rt_stop_type_t st, int which)
{
    rt_task_t *t = s->task;
    int64_t now = now_us();
    rt_timings_t tm = slot_timings(s, now);
    ev_node_t *n = ev_alloc(e);
    if (n) {
        n->ev.kind = RT_EV_DONE;
        n->ev.stop_type = st;
        n->ev.stopping_word = st == RT_STOP_WORD ? t->p.stop[which] : NULL;
        n->ev.timings = tm;
        n->ev.slot = s->id;
        size_t tl = 0;
        if (st == RT_STOP_WORD) {
            rt_detok_reset(s->dt);
        } else {
            const char *rest;
            size_t rest_len;
            rt_detok_flush(s->dt, &rest, &rest_len);
            if (held_append(s, rest, rest_len))
                BL_LOG(BL_LOG_ERROR, "event=text_lost task=%llu", (unsigned long long)t->id);
            tl = s->held_len;
        }
        if (ev_set_text(n, s->held, tl)) {
            (void)ev_set_text(n, "", 0);
            tl = 0;
        }
        n->ev.tail_len = tl;
    }
    pthread_mutex_lock(&e->mu); /* counted before the DONE can be seen */
    e->stats.tokens_predicted_total += (uint64_t)s->n_decoded;
    e->stats.tokens_predicted_seconds_total += tm.predicted_ms / 1000.0;
    pthread_mutex_unlock(&e->mu);
    BL_LOG(BL_LOG_INFO,
           "event=task_done task=%llu slot=%d stop=%s n_prompt=%lld n_cached=%lld "
           "n_predicted=%lld prompt_ms=%.1f predicted_ms=%.1f",
           (unsigned long long)t->id, s->id, stop_name(st), (long long)tm.n_prompt,
           (long long)tm.n_cached, (long long)tm.n_predicted, tm.prompt_ms, tm.predicted_ms);
    slot_release(e, s, n);
    /* the prompt cache on disk keeps what a finished task leaves in its slot, after
     * the reply has gone: a restart finds it there (a recurrent state with rejected
     * proposals in it after spec_redo has undone them) */
    if (dk_due(e, s) && !(s->spec_ck >= 0 && s->n_kv > s->n_past))
        pc_save(e, s);
}

// --- sampling one row -----------------------------------------------------------------------

/* Fills the TOKEN event's probabilities: the n_probs most likely tokens by the raw
 * logits, each with its log-softmax and its probability after the sampler's chain (0
 * when the filters dropped it), and the sampled token's own entry. */
static void fill_probs(rt_engine_t *e, slot_t *s, const float *row, int32_t n_vocab, int32_t tok,
                       ev_node_t *n)
{
    int k = s->task->p.n_probs;
    if (k > n_vocab)
        k = n_vocab;
    int32_t top_id[RT_MAX_N_PROBS];
    float top_l[RT_MAX_N_PROBS];
    int nt = 0;
    float mx = -INFINITY;
    for (int32_t i = 0; i < n_vocab; i++) {
        float l = isnan(row[i]) ? -INFINITY : row[i];
        if (l > mx)
            mx = l;
        if (nt < k || l > top_l[nt - 1]) {
            int j = nt < k ? nt++ : nt - 1;
            for (; j > 0 && l > top_l[j - 1]; j--) {
                top_l[j] = top_l[j - 1];
                top_id[j] = top_id[j - 1];
            }
            top_l[j] = l;
            top_id[j] = i;
        }
    }
    double sum = 0;
    if (isfinite(mx))
        for (int32_t i = 0; i < n_vocab; i++)
            if (!isnan(row[i]))
                sum += exp((double)row[i] - mx);
    double lse = isfinite(mx) ? (double)mx + log(sum) : 0.0;

    size_t nc = rt_sampler_last_candidates(s->smpl, e->cand_id, e->cand_p, N_CAND_LOOKUP);
    for (int j = 0; j < nt; j++) {
        rt_token_prob_t *p = &n->probs[j];
        p->id = top_id[j];
        p->logprob = (float)((double)top_l[j] - lse);
        p->prob = 0.0f;
        for (size_t c = 0; c < nc; c++)
            if (e->cand_id[c] == p->id) {
                p->prob = e->cand_p[c];
                break;
            }
    }
    n->ev.n_probs_out = nt;
    float lt = isnan(row[tok]) ? -INFINITY : row[tok];
    n->ev.sampled.id = tok;
    n->ev.sampled.logprob = (float)((double)lt - lse);
    n->ev.sampled.prob = 0.0f;
    for (size_t c = 0; c < nc; c++)
        if (e->cand_id[c] == tok) {
            n->ev.sampled.prob = e->cand_p[c];
            break;
        }
}

/* The slot's logits row came back: sample, emit, check the stop conditions. */
/* n_indent: how much of text (a token's) stays when a line of the generated text
 * starts with fewer than n_indent blanks: up to the line's first other character
 * (the line break and the blanks stay, as llama-server keeps them); len when none
 * does. Lines are those after a generated line break. */
static size_t indent_cut(slot_t *s, int32_t n_indent, const char *text, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        const char c = text[i];
        if (c == '\n') {
            s->in_indent = 1;
            s->line_indent = 0;
        } else if (s->in_indent && (c == ' ' || c == '\t')) {
            s->line_indent++;
        } else if (s->in_indent) {
            s->in_indent = 0;
            if (s->line_indent < n_indent)
                return i;
        }
    }
    return len;
}

/* return_progress: where the prompt of s's task stands, after a chunk. */
static void post_progress(rt_engine_t *e, slot_t *s)
{
    pthread_mutex_lock(&e->mu);
    ev_node_t *n = ev_alloc_locked(e);
    if (n) {
        n->ev.kind = RT_EV_PROGRESS;
        n->ev.slot = s->id;
        n->ev.timings = (rt_timings_t){.n_prompt = (int64_t)s->task->n_prompt, .n_cached = s->n_cached};
        n->ev.progress_done = s->n_past < (int64_t)s->task->n_prompt ? s->n_past : (int64_t)s->task->n_prompt;
        n->ev.progress_ms = ms_between(s->t_start_us, now_us());
        ev_post_locked(e, s->task, n);
    }
    pthread_mutex_unlock(&e->mu);
}

/* tok: the row's token if it was drawn already (sample_rows), else -1. */
static void on_output(rt_engine_t *e, slot_t *s, const float *row, int32_t n_vocab, int32_t tok)
{
    rt_task_t *t = s->task;
    int64_t now = now_us();
    if (t->n_predict == 0) { /* a prompt-only request: the cache is warm, nothing more */
        finish_task(e, s, RT_STOP_LIMIT, 0);
        return;
    }
    if (tok < 0)
        tok = rt_sampler_sample(s->smpl, row);
    rt_sampler_accept_generated(s->smpl, tok);
    s->n_decoded++;
    if (!s->got_first) {
        s->got_first = 1;
        s->t_first_us = now;
        pthread_mutex_lock(&e->mu);
        e->stats.prompt_seconds_total += ms_between(s->t_start_us, now) / 1000.0;
        pthread_mutex_unlock(&e->mu);
    }

    if (rt_tokenizer_is_eog(e->tok, tok)) { /* its text is never sent */
        finish_task(e, s, RT_STOP_EOS, 0);
        return;
    }

    const char *text = "";
    size_t len = 0;
    bl_err_t err = { 0 };
    if (rt_detok_push(s->dt, tok, &text, &len, &err)) {
        /* an id past the tokenizer's vocabulary (a padded output row) has no text */
        text = "";
        len = 0;
    }
    const size_t whole = len;
    if (t->p.n_indent > 0)
        len = indent_cut(s, t->p.n_indent, text, len);
    const int had_new_line = s->has_new_line;
    if (memchr(text, '\n', len))
        s->has_new_line = 1;
    if (held_append(s, text, len))
        BL_LOG(BL_LOG_ERROR, "event=text_lost task=%llu", (unsigned long long)t->id);

    int which = -1;
    size_t release = s->held_len;
    long hit = t->p.n_stop ? find_stop(t, s->held, s->held_len, &which, &release) : -1;
    if (hit >= 0)
        release = (size_t)hit;

    ev_node_t *n = ev_alloc(e);
    if (n) {
        n->ev.kind = RT_EV_TOKEN;
        n->ev.token = tok;
        n->ev.slot = s->id;
        if (ev_set_text(n, s->held, release)) {
            (void)ev_set_text(n, "", 0);
            release = 0;
        }
        n->ev.len = release;
        if (t->p.n_probs > 0)
            fill_probs(e, s, row, n_vocab, tok, n);
        n->ev.timings = slot_timings(s, now);
        ev_post(e, t, n);
    }
    held_consume(s, release);

    if (hit >= 0) {
        s->held_len = 0; /* the stop string and what follows it are never sent */
        finish_task(e, s, RT_STOP_WORD, which);
        return;
    }
    if (len < whole) { /* a line indented less than n_indent: it and the rest go */
        rt_detok_reset(s->dt);
        finish_task(e, s, RT_STOP_LIMIT, 0);
        return;
    }
    if ((t->n_predict > 0 && s->n_decoded >= t->n_predict) || s->n_past >= e->o.n_ctx_slot ||
        (t->p.t_max_predict_ms > 0 && had_new_line &&
         now - s->t_first_us >= t->p.t_max_predict_ms * 1000)) {
        finish_task(e, s, RT_STOP_LIMIT, 0);
        return;
    }
    s->seq[s->n_past] = tok;
    s->n_seq = s->n_past + 1;
    s->state = SLOT_GEN;
}

// --- the step -------------------------------------------------------------------------------

static void reap_cancelled(rt_engine_t *e)
{
    for (int i = 0; i < e->o.n_slots; i++) {
        slot_t *s = &e->slots[i];
        if (s->task && !s->in_flight && atomic_load(&s->task->cancelled)) {
            BL_LOG(BL_LOG_INFO, "event=task_cancelled task=%llu slot=%d",
                   (unsigned long long)s->task->id, s->id);
            slot_release(e, s, NULL);
        }
    }
}

/* Builds the step: one row per decoding slot, then prompt chunks sharing the rest of
 * n_batch, oldest task first. Returns the number of sequences. */
/* With a shared cache: the positions slot s may reach in this step, from what it
 * holds and the chunks free after what the step's earlier rows took (*taken), idle
 * slots' caches evicted when that is short of end. */
static int64_t kv_reach(rt_engine_t *e, const slot_t *s, int64_t end, const int64_t *taken)
{
    int64_t reach = (kv_chunks(s->n_kv) + kv_free(e) - *taken) * RT_KV_CHUNK;
    if (reach < end) {
        (void)kv_evict(e, kv_chunks(end) - kv_chunks(s->n_kv) + *taken, s);
        reach = (kv_chunks(s->n_kv) + kv_free(e) - *taken) * RT_KV_CHUNK;
    }
    return reach;
}

// --- speculative decoding -------------------------------------------------------------------

/* Keeps the first keep of slot s's proposals (those a step will verify): the draft's
 * cache holds the pending token and its proposals up to the last it was given, so
 * the dropped ones leave it too, or its next catch-up would start past them. */
static void keep_proposals(slot_t *s, int keep)
{
    if (keep >= s->n_draft)
        return;
    s->n_draft = keep < 0 ? 0 : keep;
    if (s->d_past > s->n_past + 1 + s->n_draft)
        s->d_past = s->n_past + 1 + s->n_draft;
}

int rt_engine_sample_helpers(int n_slots, int n_cpus)
{
    int h = n_cpus / 2 - 1;
    if (h > n_slots - 1)
        h = n_slots - 1;
    if (h > 7)
        h = 7;
    return h > 0 ? h : 0;
}

rt_spec_limits_t rt_engine_spec_limits(const rt_engine_t *e, const rt_task_params_t *p)
{
    rt_spec_limits_t l = {.n_max = e->o.draft_max, .n_min = e->o.draft_min, .p_min = e->o.draft_p_min};
    if (p->spec_n_max >= 0 && p->spec_n_max < l.n_max)
        l.n_max = p->spec_n_max;
    if (p->spec_n_min >= 0)
        l.n_min = p->spec_n_min;
    if (l.n_min > l.n_max)
        l.n_min = l.n_max;
    if (p->spec_p_min >= 0.0f)
        l.p_min = p->spec_p_min;
    return l;
}

/* /metrics: a step with proposals to verify is coming. */
static void count_draft_step(rt_engine_t *e)
{
    pthread_mutex_lock(&e->mu);
    e->stats.draft_steps_total++;
    pthread_mutex_unlock(&e->mu);
}

/* Slot s's draft limits (its task's). */
static rt_spec_limits_t spec_limits(const rt_engine_t *e, const slot_t *s)
{
    return rt_engine_spec_limits(e, &s->task->p);
}

/* The most tokens a verify step of generating slot s may propose, at most want: what
 * its context and its task's n_predict leave room for (the verification adds a token
 * of its own), and a draft model's context. */
static int64_t draft_cap(const rt_engine_t *e, const slot_t *s, int64_t want)
{
    int64_t k = want;
    if (k > e->o.n_ctx_slot - 2 - s->n_past) /* positions n_past..n_past+k in the context */
        k = e->o.n_ctx_slot - 2 - s->n_past;
    if (e->o.draft && k > e->o.draft_ctx - 1 - s->n_past) /* and the draft's up to n_past+k-1 */
        k = e->o.draft_ctx - 1 - s->n_past;
    if (s->task->n_predict > 0 && k > s->task->n_predict - s->n_decoded - 1)
        k = s->task->n_predict - s->n_decoded - 1;
    return k;
}

/* --spec-type draft-mtp: each generating slot's proposal is the one the NextN layer
 * made in the step that sampled its pending token (take_results keeps it), one token,
 * when the layer gives it draft_p_min or more and there is room to verify it. Slots
 * in a step in flight wait for its answer (pipelined steps). */
static void spec_mtp(rt_engine_t *e)
{
    uint64_t drafted = 0;
    for (int i = 0; i < e->o.n_slots; i++) {
        slot_t *s = &e->slots[i];
        if (s->in_flight)
            continue;
        keep_proposals(s, 0); /* any a step left out */
        const int32_t tok = s->mtp_tok;
        s->mtp_tok = -1; /* one step's: a proposal not verified now is stale next time */
        if (s->state != SLOT_GEN || !s->task || tok < 0)
            continue;
        const rt_spec_limits_t l = spec_limits(e, s);
        if (s->mtp_p < l.p_min || rt_tokenizer_is_eog(e->tok, tok) || l.n_max < 1 || l.n_min > 1 ||
            draft_cap(e, s, 1) < 1)
            continue;
        s->seq[s->n_past + 1] = tok;
        s->n_draft = 1;
        drafted++;
    }
    if (drafted)
        count_draft_step(e);
}

/* ngram-mod's table: 4 Mi entries (16 MiB), as llama.cpp's; emptied when a task
 * starts with it over a quarter full, or after verify steps of one slot that took
 * under half of what it proposed, NGRAM_LOW_STEPS in a row (text unlike what came
 * before: the old entries only cost verifications). */
#define NGRAM_MOD_ENTRIES ((size_t)4 << 20)
#define NGRAM_LOW_STEPS 3
/* New tokens of a slot's task go into the table this many at a time. */
#define NGRAM_ADD_EVERY 32

/* --spec-type ngram-simple, ngram-map-k and ngram-mod: each generating slot's
 * proposals come from the tokens it has (router/ngram.h), within its draft limits
 * and the room to verify them; fewer than the limits' n_min are none. No model runs
 * for them. */
static void spec_ngram(rt_engine_t *e)
{
    uint64_t drafted = 0;
    for (int i = 0; i < e->o.n_slots; i++) {
        slot_t *s = &e->slots[i];
        if (s->in_flight)
            continue;
        keep_proposals(s, 0); /* any a step left out */
        if (s->state != SLOT_GEN || !s->task)
            continue;
        const rt_spec_limits_t l = spec_limits(e, s);
        const int64_t cap = draft_cap(e, s, l.n_max);
        if (cap < 1 || cap < l.n_min)
            continue;
        const int64_t n = s->n_past + 1; /* through the pending token */
        int32_t *out = s->seq + n;
        int k;
        if (e->o.ngram == RT_NGRAM_MOD) {
            rt_ngram_mod_t *m = e->ngram_mod;
            if (!s->ng_begun) { /* the task's prompt goes in whole */
                if (rt_ngram_mod_used(m) * 4 > rt_ngram_mod_entries(m)) {
                    BL_LOG(BL_LOG_INFO, "event=ngram_reset reason=full used=%zu entries=%zu", rt_ngram_mod_used(m),
                           rt_ngram_mod_entries(m));
                    rt_ngram_mod_reset(m);
                }
                s->ng_mark = rt_ngram_mod_add(m, s->seq, n, 0);
                s->ng_begun = 1;
            } else if (n - s->ng_mark >= NGRAM_ADD_EVERY + rt_ngram_mod_size_n(m)) {
                s->ng_mark = rt_ngram_mod_add(m, s->seq, n, s->ng_mark);
            }
            k = rt_ngram_mod_draft(m, s->seq, n, l.n_min, (int)cap, out, (int)cap);
        } else if (e->o.ngram == RT_NGRAM_MAP_K) {
            if (!s->ng_begun) {
                rt_ngram_map_begin(&s->ng_map, e->o.ngram_n, e->o.draft_max, (int64_t)s->task->n_prompt);
                s->ng_begun = 1;
            }
            k = rt_ngram_map_draft(&s->ng_map, s->seq, n, out, (int)cap);
        } else {
            k = rt_ngram_simple(s->seq, n, e->o.ngram_n, (int)cap, out, (int)cap);
        }
        if (k < l.n_min)
            k = 0;
        s->n_draft = k;
        drafted += k > 0;
    }
    if (drafted)
        count_draft_step(e);
}

/* After a verify step of slot s that took taken of k n-gram proposals: ngram-map-k's
 * key remembers taken; ngram-mod's table is emptied after NGRAM_LOW_STEPS steps in a
 * row that took under half. */
static void ngram_taken(rt_engine_t *e, slot_t *s, int k, int taken)
{
    if (e->o.ngram == RT_NGRAM_MAP_K)
        rt_ngram_map_accept(&s->ng_map, taken);
    if (e->o.ngram != RT_NGRAM_MOD || k < 1)
        return;
    if (2 * taken >= k) {
        s->ng_low = 0;
        return;
    }
    if (++s->ng_low >= NGRAM_LOW_STEPS) {
        BL_LOG(BL_LOG_INFO, "event=ngram_reset reason=rejected slot=%d steps=%d", s->id, s->ng_low);
        rt_ngram_mod_reset(e->ngram_mod);
        s->ng_low = 0;
    }
}

/* After a step with the NextN layer: slot s's proposal for its next step, from the
 * logit row that gave its pending token (row of mtp), when the layer read that token
 * after the row (it read the row's most likely one: a sampler that drew another one
 * gets no proposal). */
static void mtp_keep(slot_t *s, const rt_mtp_t *mtp, size_t row)
{
    s->mtp_tok = -1;
    if (!mtp || s->state != SLOT_GEN || !s->task || mtp[row].in < 0 || mtp[row].in != s->seq[s->n_past])
        return;
    s->mtp_tok = mtp[row].tok;
    s->mtp_p = mtp[row].p;
}

/* The draft model proposes tokens for every generating slot: it first catches up
 * with what the slot's sequence holds beyond its own cache (the prompt, the
 * tokens taken since), then writes one token a step while it is sure enough of
 * them (draft_p_min), up to draft_max; they go after the pending token in seq, for
 * build_step to verify. A slot whose catch-up does not fit the step proposes
 * nothing this time. A failing draft step forgets the draft's caches and the step
 * goes on without proposals. */
static void spec_draft(rt_engine_t *e, int32_t n_vocab)
{
    rt_cluster_t *d = e->o.draft;
    for (int i = 0; i < e->o.n_slots; i++)
        keep_proposals(&e->slots[i], 0); /* any a step left out */
    if (!d || e->draft_off || rt_cluster_state(d) != RT_CLUSTER_READY)
        return;
    rt_cluster_stats_t cs;
    rt_cluster_get_stats(d, &cs);
    if (cs.starts != e->draft_starts) { /* new processes: empty caches */
        e->draft_starts = cs.starts;
        for (int i = 0; i < e->o.n_slots; i++)
            e->slots[i].d_past = 0;
    }
    if (rt_cluster_n_vocab(d) != n_vocab) {
        BL_LOG(BL_LOG_WARN, "event=draft_off reason=\"the draft model has %lld tokens, the model "
                            "%d\"", (long long)rt_cluster_n_vocab(d), n_vocab);
        e->draft_off = 1;
        return;
    }
    int active[4096], cap[4096];
    int n_active = 0;
    for (int i = 0; i < e->o.n_slots; i++) {
        slot_t *s = &e->slots[i];
        active[i] = cap[i] = 0;
        if (s->state != SLOT_GEN || !s->task)
            continue;
        const rt_spec_limits_t l = spec_limits(e, s);
        const int64_t k = draft_cap(e, s, l.n_max);
        if (k < 1 || k < l.n_min)
            continue;
        if (s->d_wait > 0) { /* the draft was unsure here lately: it catches up later */
            s->d_wait--;
            continue;
        }
        active[i] = 1;
        cap[i] = (int)k;
        n_active++;
    }
    for (int it = 0; n_active > 0 && it < e->o.draft_max; it++) {
        int ns = 0;
        int64_t rows = 0;
        for (int i = 0; i < e->o.n_slots && rows < e->o.n_batch; i++) {
            slot_t *s = &e->slots[i];
            if (!active[i])
                continue;
            int64_t pos = it == 0 ? s->d_past : s->n_past + it, n = s->n_past + 1 + it - pos;
            int out = 1;
            if (rows + n > e->o.n_batch) { /* only part of the catch-up: no proposal now */
                n = e->o.n_batch - rows;
                out = 0;
                active[i] = 0;
                n_active--;
            }
            e->seqs[ns] = (rt_step_seq_t){.slot = s->id, .n = (int32_t)n, .pos = pos, .n_out = out,
                                          .tokens = s->seq + pos};
            e->seq_slot[ns++] = i;
            rows += n;
        }
        if (ns == 0)
            break;
        const float *logits = NULL; /* in the draft's ring until rt_cluster_view_end */
        bl_err_t err = {0};
        if (rt_cluster_step_view(d, e->seqs, ns, &logits, &err)) {
            BL_LOG(BL_LOG_WARN, "event=draft_step_failed reason=\"%s\"", err.msg);
            for (int i = 0; i < e->o.n_slots; i++)
                e->slots[i].d_past = e->slots[i].n_draft = 0;
            return;
        }
        size_t out = 0;
        for (int j = 0; j < ns; j++) {
            slot_t *s = &e->slots[e->seq_slot[j]];
            s->d_past = e->seqs[j].pos + e->seqs[j].n;
            if (!e->seqs[j].n_out)
                continue;
            float p = 0.0f;
            int32_t tok = (int32_t)kcpu_row_top1(logits + out++ * (size_t)n_vocab, n_vocab, &p);
            if (p < spec_limits(e, s).p_min || rt_tokenizer_is_eog(e->tok, tok)) {
                active[e->seq_slot[j]] = 0;
                n_active--;
                continue;
            }
            s->seq[s->n_past + 1 + s->n_draft++] = tok;
            if (s->n_draft >= cap[e->seq_slot[j]]) {
                active[e->seq_slot[j]] = 0;
                n_active--;
            }
        }
        (void)rt_cluster_view_end(d, 0);
    }
    uint64_t drafted = 0;
    for (int i = 0; i < e->o.n_slots; i++) {
        slot_t *s = &e->slots[i];
        if (s->task && s->n_draft < spec_limits(e, s).n_min)
            keep_proposals(s, 0);
        drafted += (uint64_t)s->n_draft;
        /* a draft that proposes nothing costs a step for nothing: the next tries wait
         * 1, 2, 4, then 8 steps while it stays so */
        if (cap[i] > 0 && !s->n_draft && s->state == SLOT_GEN && s->task) {
            s->d_backoff = s->d_backoff ? (s->d_backoff < 8 ? 2 * s->d_backoff : 8) : 1;
            s->d_wait = s->d_backoff;
        }
    }
    if (drafted)
        count_draft_step(e);
}

/* A shared cache too full for a generating slot's next token, or for any slot to go
 * on: the newest task holding chunks that is not in the step being built gives them
 * back and starts over when there is room (a generating one recomputes its prompt
 * and what it wrote, then goes on where it was: preemption by recomputation, so
 * the older tasks always finish). Returns that slot, or NULL. */
static slot_t *kv_preempt(rt_engine_t *e)
{
    slot_t *v = NULL;
    for (int i = 0; i < e->o.n_slots; i++) {
        slot_t *s = &e->slots[i];
        if (s->task && !s->in_step && s->n_kv > 0 && (!v || s->start_order > v->start_order))
            v = s;
    }
    if (!v)
        return NULL;
    rt_kv_op_t op = {.op = RT_KV_CLEAR, .slot = v->id};
    bl_err_t err = {0};
    if (rt_cluster_kv(e->cluster, &op, 1, &err)) {
        BL_LOG(BL_LOG_WARN, "event=kv_clear_failed slot=%d reason=\"%s\"", v->id, err.msg);
        return NULL;
    }
    BL_LOG(BL_LOG_INFO, "event=kv_preempt slot=%d task=%llu n=%lld state=%s reason=\"the shared "
                        "KV cache is full\"", v->id, (unsigned long long)v->task->id,
           (long long)v->n_kv, v->state == SLOT_GEN ? "gen" : "prompt");
    if (v->state == SLOT_GEN)
        v->state = SLOT_PROMPT; /* its whole sequence again, the sampled token last */
    v->n_past = v->n_kv = 0;
    if (!v->got_first)
        v->n_cached = 0;
    pthread_mutex_lock(&e->mu);
    e->stats.kv_preemptions_total++;
    pthread_mutex_unlock(&e->mu);
    return v;
}

static int build_step(rt_engine_t *e)
{
    return build_step_max(e, e->o.n_slots);
}

/* build_step with at most max_seqs sequences (a share of the slots, when several
 * steps are in flight). */
static int build_step_max(rt_engine_t *e, int max_seqs)
{
    int ns = 0;
    int64_t rows = 0;
    int64_t taken = 0; /* chunks of a shared cache the step's rows take (or give back) */
    for (int i = 0; i < e->o.n_slots; i++)
        e->slots[i].in_step = 0;
    for (int i = 0; i < e->o.n_slots && rows < e->o.n_batch; i++) {
        slot_t *s = &e->slots[(e->rr + i) % e->o.n_slots];
        if (s->state != SLOT_GEN || s->in_flight || ns >= max_seqs)
            continue;
        if (rows + 1 + s->n_draft > e->o.n_batch) /* the proposals that fit the step */
            keep_proposals(s, (int)(e->o.n_batch - rows - 1));
        if (e->o.kv_pool) {
            int64_t reach;
            slot_t *v = NULL;
            if (s->n_draft && kv_reach(e, s, s->n_past + 1 + s->n_draft, &taken) <
                                  s->n_past + 1 + s->n_draft)
                keep_proposals(s, 0); /* proposals take no room from other slots */
            while ((reach = kv_reach(e, s, s->n_past + 1, &taken)) < s->n_past + 1 &&
                   (v = kv_preempt(e)) != NULL && v != s)
                ;
            if (v == s)
                continue; /* itself the newest: it waits, a prompt again */
            if (reach < s->n_past + 1) {
                s->full = 1; /* no room at all: it ends as at a full context */
                continue;
            }
            taken += kv_chunks(s->n_past + 1 + s->n_draft) - kv_chunks(s->n_kv);
        }
        s->in_step = 1;
        /* the pending token, then the draft's proposals: a logit row for each */
        e->seqs[ns] = (rt_step_seq_t){ .slot = s->id, .n = 1 + s->n_draft, .pos = s->n_past,
                                        .n_out = 1 + s->n_draft, .tokens = s->seq + s->n_past };
        e->seq_slot[ns++] = s->id;
        rows += 1 + s->n_draft;
    }
    e->rr = (e->rr + 1) % e->o.n_slots;

    int np = 0;
    for (int i = 0; i < e->o.n_slots; i++) {
        slot_t *s = &e->slots[i];
        if (s->state != SLOT_PROMPT || s->in_flight)
            continue;
        int j = np++;
        for (; j > 0 && e->order[j - 1]->start_order > s->start_order; j--)
            e->order[j] = e->order[j - 1];
        e->order[j] = s;
    }
    for (int i = 0; i < np && ns < max_seqs; i++) {
        int64_t budget = e->o.n_batch - rows;
        if (budget <= 0)
            break;
        int64_t share = (budget + (np - i) - 1) / (np - i);
        slot_t *s = e->order[i];
        int64_t take = s->n_seq - s->n_past;
        if (take > share)
            take = share;
        const int64_t ck_at = ck_next(e, s);
        if (ck_at > s->n_past && take > ck_at - s->n_past)
            take = ck_at - s->n_past; /* the chunk ends where a checkpoint is due */
        if (e->o.kv_pool) {
            /* what the shared cache has room for; the prompt's rest waits for more */
            const int64_t room = kv_reach(e, s, s->n_past + take, &taken) - s->n_past;
            if (take > room)
                take = room;
            if (take <= 0)
                continue;
            taken += kv_chunks(s->n_past + take) - kv_chunks(s->n_kv);
        }
        s->in_step = 1;
        e->seqs[ns] = (rt_step_seq_t){ .slot = s->id, .n = (int32_t)take, .pos = s->n_past,
                                        .n_out = s->n_past + take == s->n_seq ? 1 : 0,
                                        .tokens = s->seq + s->n_past };
        e->seq_slot[ns++] = s->id;
        rows += take;
    }
    return ns;
}

/* Runs one step and hands each output row to its slot. */
/* A verified step of slot s: the pending token and k proposals evaluated, k + 1 logit
 * rows. Each row gives a token as a plain step would (the sampler, stop strings and
 * limits as ever); a proposal the token equals is taken and the next row gives the
 * token after it; the first that differs (or the task's end) stops there. So the
 * text is what decoding one token a step gives, with as many tokens a step as the
 * model agrees with, plus one. */
static void spec_take(rt_engine_t *e, slot_t *s, const rt_step_seq_t *q, const float *rows,
                      int32_t n_vocab)
{
    const int k = q->n - 1;
    int32_t prop[RT_DRAFT_MAX];
    memcpy(prop, s->seq + q->pos + 1, (size_t)k * sizeof *prop);
    s->n_past = q->pos + 1;
    s->n_kv = q->pos + q->n; /* the stages wrote every row; the next step rewinds */
    s->n_drafted += k;
    int taken = 0;
    for (int i = 0; i <= k; i++) {
        if (!s->task)
            break;
        if (atomic_load(&s->task->cancelled)) {
            slot_release(e, s, NULL);
            break;
        }
        on_output(e, s, rows + (size_t)i * (size_t)n_vocab, n_vocab, -1);
        if (!s->task || s->state != SLOT_GEN || i == k || s->seq[s->n_past] != prop[i])
            break;
        s->n_past++; /* the proposal is the model's own token: its row is next */
        taken++;
    }
    s->n_accepted += taken;
    ngram_taken(e, s, k, taken);
    if (taken > 0)
        s->d_backoff = 0;
    if (s->d_past > s->n_past)
        s->d_past = s->n_past;
    s->n_draft = 0;
    pthread_mutex_lock(&e->mu);
    e->stats.drafted_total += (uint64_t)k;
    e->stats.accepted_total += (uint64_t)taken;
    pthread_mutex_unlock(&e->mu);
}

/* A step's times for /metrics: its answer awaited from t0 to t1, then taken. */
static void step_times(rt_engine_t *e, int64_t t0, int64_t t1)
{
    const int64_t t2 = now_us();
    pthread_mutex_lock(&e->mu);
    e->stats.step_wait_seconds_total += (double)(t1 - t0) * 1e-6;
    e->stats.step_output_seconds_total += (double)(t2 - t1) * 1e-6;
    pthread_mutex_unlock(&e->mu);
}

/* A sampling thread's share: jobs taken one at a time until none is left (rows differ
 * in cost: penalties, grammars). */
static void sample_task(void *ctx, int ith, int nth)
{
    (void)ith;
    (void)nth;
    rt_engine_t *e = ctx;
    for (int i; (i = atomic_fetch_add(&e->job_next, 1)) < e->n_jobs;)
        e->jobs[i].tok = rt_sampler_sample(e->jobs[i].s->smpl, e->jobs[i].row);
}

/* Draws the tokens of the step's plain output rows (one row, a task that wants a
 * token), each with its slot's own sampler, over the pool's threads: the rows
 * take_results hands to on_output, in the same order, so each slot's sampler sees
 * the same calls as one at a time (job k: the k-th such row, e->n_jobs of them).
 * Returns whether take_results will read the logits again: a verification's rows,
 * or a task that reports probabilities. */
static int sample_rows(rt_engine_t *e, const rt_step_seq_t *seqs, const int *seq_slot, int ns,
                       const float *logits, int32_t n_vocab)
{
    int nj = 0, again = 0;
    size_t out = 0;
    for (int j = 0; j < ns; j++) {
        slot_t *s = &e->slots[seq_slot[j]];
        if (seqs[j].n_out > 1) {
            out += (size_t)seqs[j].n_out;
            again = 1;
            continue;
        }
        if (!seqs[j].n_out)
            continue;
        const size_t at = out++;
        if (s->task && !atomic_load(&s->task->cancelled) && s->task->n_predict != 0) {
            e->jobs[nj++] = (struct sample_job){.s = s, .row = logits + at * (size_t)n_vocab, .out = at, .tok = -1};
            again |= s->task->p.n_probs > 0;
        }
    }
    e->n_jobs = nj;
    atomic_store(&e->job_next, 0);
    if (e->pool && nj > 1)
        kcpu_pool_run(e->pool, sample_task, e);
    else
        sample_task(e, 0, 1);
    return again;
}

/* The step's answer in the ring (rt_cluster_step_view or _recv_view): its tokens
 * drawn there, then the rows copied out only where they are read again. Returns
 * the logits take_results reads (NULL: none needed). */
static const float *take_view(rt_engine_t *e, const rt_step_seq_t *seqs, const int *seq_slot, int ns,
                              const float *view, int32_t n_vocab)
{
    const int again = sample_rows(e, seqs, seq_slot, ns, view, n_vocab);
    return rt_cluster_view_end(e->cluster, again);
}

/* A step's answer: each sequence's rows into its slot, the logit rows to its task,
 * after take_view drew the tokens (logits NULL where no row is read again). */
static void take_results(rt_engine_t *e, const rt_step_seq_t *seqs, const int *seq_slot, int ns,
                         const float *logits, int32_t n_vocab)
{
    uint64_t prompt_rows = 0;
    for (int j = 0; j < ns; j++) {
        slot_t *s = &e->slots[seq_slot[j]];
        if (s->state == SLOT_PROMPT)
            prompt_rows += (uint64_t)seqs[j].n;
    }
    pthread_mutex_lock(&e->mu);
    e->stats.n_decode_total++;
    e->stats.n_busy_slots_total += (uint64_t)ns;
    e->stats.prompt_tokens_total += prompt_rows;
    pthread_mutex_unlock(&e->mu);

    const rt_mtp_t *mtp = e->o.mtp ? rt_cluster_mtp(e->cluster) : NULL;
    const int nj = e->n_jobs;
    int jk = 0; /* the next drawn row's job */
    size_t out = 0;
    for (int j = 0; j < ns; j++) {
        slot_t *s = &e->slots[seq_slot[j]];
        if (seqs[j].n_out > 1) { /* a verification: the rows the model agrees with */
            const int64_t at = s->n_past;
            spec_take(e, s, &seqs[j], logits + out * (size_t)n_vocab, n_vocab);
            /* the pending token came from the row of the last proposal taken */
            mtp_keep(s, mtp, out + (size_t)(s->n_past - at - 1));
            out += (size_t)seqs[j].n_out;
            continue;
        }
        s->n_past += seqs[j].n;
        s->n_kv = s->n_past;
        if (s->state == SLOT_PROMPT && s->task && ck_due(e, s)) {
            if (e->fl_n > 0) /* a cache op waits until no step is in flight */
                s->ck_at = s->n_past;
            else
                ck_save(e, s);
        }
        if (s->state == SLOT_PROMPT && s->task && s->task->p.return_progress && !s->got_first)
            post_progress(e, s);
        if (!seqs[j].n_out)
            continue;
        const size_t at = out++;
        /* NULL where take_view found no reader: every row on_output gets was drawn */
        const float *row = logits ? logits + at * (size_t)n_vocab : NULL;
        if (!s->task)
            continue;
        int32_t tok = -1;
        if (jk < nj && e->jobs[jk].out == at)
            tok = e->jobs[jk++].tok;
        if (atomic_load(&s->task->cancelled)) {
            slot_release(e, s, NULL);
            continue;
        }
        on_output(e, s, row, n_vocab, tok);
        mtp_keep(s, mtp, out - 1);
    }
}

/* A recurrent model's verify steps (a draft's proposals): the state before each is
 * kept as a checkpoint, since the rows the model rejects cannot be cut off the
 * recurrent state afterwards. Returns 0, or -1 after the running tasks failed. */
static int spec_checkpoints(rt_engine_t *e, int ns)
{
    rt_kv_op_t ops[RT_KV_MAX_OPS];
    int n = 0;
    for (int j = 0; j < ns; j++) {
        slot_t *s = &e->slots[e->seq_slot[j]];
        s->spec_ck = -1;
        if (e->seqs[j].n_out <= 1)
            continue;
        if (n == RT_KV_MAX_OPS) { /* no room for its checkpoint: it decodes one token */
            e->seqs[j].n = e->seqs[j].n_out = 1;
            keep_proposals(s, 0);
            continue;
        }
        s->spec_ck = e->pc_next_id++;
        s->spec_pos = e->seqs[j].pos;
        ops[n++] = (rt_kv_op_t){.op = RT_KV_CKPT, .slot = s->id, .entry = s->spec_ck, .n = s->spec_pos};
    }
    bl_err_t err = {0};
    int rc = n ? rt_cluster_kv(e->cluster, ops, n, &err) : 0;
    if (rc) {
        step_failed(e, rc, &err);
        return -1;
    }
    return 0;
}

/* After a recurrent model's verify steps: a slot that took fewer rows than the stages
 * ran goes back to the state before the step and runs the rows it took again (their
 * logits are not needed), so that its state is that of its tokens. */
static void spec_redo(rt_engine_t *e)
{
    rt_kv_op_t back[RT_KV_MAX_OPS], drop[RT_KV_MAX_OPS];
    int nb = 0, nd = 0, ns = 0;
    slot_t *done[RT_KV_MAX_OPS]; /* finished in the step: their disk cache entry is due */
    int n_done = 0;
    for (int i = 0; i < e->o.n_slots && nd < RT_KV_MAX_OPS; i++) {
        slot_t *s = &e->slots[i];
        if (s->spec_ck < 0)
            continue;
        drop[nd++] = (rt_kv_op_t){.op = RT_KV_DROP, .entry = s->spec_ck};
        if (s->n_kv > s->n_past) { /* rows past what it took: back, then its rows again */
            if (!s->task && dk_due(e, s))
                done[n_done++] = s;
            back[nb++] = (rt_kv_op_t){.op = RT_KV_ROLLBACK, .slot = s->id, .entry = s->spec_ck, .n = s->spec_pos};
            e->seqs[ns] = (rt_step_seq_t){.slot = s->id, .n = (int32_t)(s->n_past - s->spec_pos),
                                          .pos = s->spec_pos, .n_out = 0, .tokens = s->seq + s->spec_pos};
            e->seq_slot[ns++] = s->id;
            s->n_kv = s->n_past;
        }
        s->spec_ck = -1;
    }
    bl_err_t err = {0};
    const float *logits = NULL;
    int rc = 0;
    if (nb && (rc = rt_cluster_kv(e->cluster, back, nb, &err)) == 0)
        rc = rt_cluster_step(e->cluster, e->seqs, ns, &logits, &err);
    if (rc == 0 && nd)
        rc = rt_cluster_kv(e->cluster, drop, nd, &err);
    if (rc) {
        step_failed(e, rc, &err);
        return;
    }
    for (int i = 0; i < n_done; i++)
        pc_save(e, done[i]);
}

/* The step failed (rc, err): the rows are lost and the caches may be gone with the
 * processes: the running tasks end, and the waiting ones run once READY. */
static void step_failed(rt_engine_t *e, int rc, const bl_err_t *err)
{
    BL_LOG(BL_LOG_WARN, "event=step_failed code=%d reason=\"%s\"", rc, err->msg);
    const char *msg = err->msg[0] ? err->msg : bl_strerror(rc);
    char buf[sizeof err->msg];
    if (rc == BL_EAGAIN) {
        rt_cluster_error(e->cluster, buf, sizeof buf);
        msg = buf[0] ? buf : "the model processes are restarting";
    }
    fail_running(e, 500, msg);
    forget_caches(e);
}

/* Forgets the steps in flight: their answers will not come (the set went away). */
static void forget_in_flight(rt_engine_t *e)
{
    e->fl_head = e->fl_n = 0;
    for (int i = 0; i < e->o.n_slots; i++)
        e->slots[i].in_flight = 0;
    rt_cluster_forget_in_flight(e->cluster);
}

/* The oldest step in flight's answer, taken (or its failure handled). */
static void recv_one(rt_engine_t *e, int32_t n_vocab)
{
    const int at = e->fl_head;
    e->fl_head = (e->fl_head + 1) % e->o.pipeline;
    e->fl_n--;
    for (int j = 0; j < e->fl[at].ns; j++)
        e->slots[e->fl[at].seq_slot[j]].in_flight = 0;
    const float *view = NULL;
    bl_err_t err = {0};
    const int64_t t0 = now_us();
    int rc = rt_cluster_step_recv_view(e->cluster, &view, &err);
    if (rc) {
        forget_in_flight(e);
        step_failed(e, rc, &err);
        return;
    }
    const int64_t t1 = now_us();
    const float *logits = take_view(e, e->fl[at].seqs, e->fl[at].seq_slot, e->fl[at].ns, view, n_vocab);
    take_results(e, e->fl[at].seqs, e->fl[at].seq_slot, e->fl[at].ns, logits, n_vocab);
    step_times(e, t0, t1);
}

/* Takes every step in flight's answer: before a KV op, which must not overtake them. */
static void drain(rt_engine_t *e, int32_t n_vocab)
{
    while (e->fl_n > 0)
        recv_one(e, n_vocab);
}

/* The checkpoints that came due while steps were in flight (a recurrent model): the
 * steps drained (their answers may make more due), then each taken where its slot
 * still holds that prompt at that position. A slot with one due is in no step until
 * it is taken, so the state saved is the one at its position. */
static void ck_pending(rt_engine_t *e, int32_t n_vocab)
{
    int any = 0;
    for (int i = 0; i < e->o.n_slots && !any; i++)
        any = e->slots[i].ck_at > 0;
    if (!any)
        return;
    drain(e, n_vocab);
    for (int i = 0; i < e->o.n_slots; i++) {
        slot_t *s = &e->slots[i];
        if (s->ck_at > 0 && s->ck_at == s->n_past && s->state == SLOT_PROMPT && s->task)
            ck_save(e, s);
        s->ck_at = 0;
    }
}

/* Several stages kept busy (opts.pipeline steps in flight): steps of the slots not in
 * flight are sent while the stages work on the earlier ones, so that decode rows of
 * different slots are in different stages at once; then the oldest answer is taken.
 * A slot is in one step at a time, so each sequence's rows go in order. */
static void run_pipelined(rt_engine_t *e, int32_t n_vocab)
{
    bl_err_t err = {0};
    ck_pending(e, n_vocab);
    /* each step takes an equal share of the busy slots, so that every stage has one */
    int busy = 0;
    for (int i = 0; i < e->o.n_slots; i++)
        busy += e->slots[i].state == SLOT_GEN || e->slots[i].state == SLOT_PROMPT;
    const int share = (busy + e->o.pipeline - 1) / e->o.pipeline;
    while (e->fl_n < e->o.pipeline) {
        if (e->o.mtp) /* the proposals of the slots whose answers came */
            spec_mtp(e);
        else if (e->o.ngram)
            spec_ngram(e);
        int ns = build_step_max(e, share > 0 ? share : 1);
        if (ns == 0)
            break;
        int rc = rt_cluster_step_send(e->cluster, e->seqs, ns, &err);
        if (rc) {
            forget_in_flight(e);
            step_failed(e, rc, &err);
            return;
        }
        const int at = (e->fl_head + e->fl_n) % e->o.pipeline;
        memcpy(e->fl[at].seqs, e->seqs, (size_t)ns * sizeof *e->seqs);
        memcpy(e->fl[at].seq_slot, e->seq_slot, (size_t)ns * sizeof *e->seq_slot);
        e->fl[at].ns = ns;
        e->fl_n++;
        for (int j = 0; j < ns; j++)
            e->slots[e->seq_slot[j]].in_flight = 1;
    }
    if (e->fl_n > 0)
        recv_one(e, n_vocab);
}

static void run_step(rt_engine_t *e, int32_t n_vocab)
{
    if (e->o.pipeline > 1) {
        run_pipelined(e, n_vocab);
        return;
    }
    if (e->o.mtp)
        spec_mtp(e);
    else if (e->o.ngram)
        spec_ngram(e);
    else
        spec_draft(e, n_vocab);
    int ns = build_step(e);
    if (e->o.kv_pool) {
        /* the generating slots that found no room end as at a full context */
        for (int i = 0; i < e->o.n_slots; i++) {
            slot_t *s = &e->slots[i];
            if (s->full) {
                s->full = 0;
                if (s->task && s->state == SLOT_GEN)
                    finish_task(e, s, RT_STOP_LIMIT, 0);
            }
        }
        /* prompts alone hold the cache, none able to go on: the newest gives way */
        for (int k = 0; ns == 0 && k < e->o.n_slots && kv_preempt(e); k++)
            ns = build_step(e);
    }
    if (ns == 0)
        return;
    const float *logits = NULL;
    bl_err_t err = { 0 };
    if (e->o.recurrent && spec_checkpoints(e, ns) != 0)
        return;
    const int64_t t0 = now_us();
    const float *view = NULL;
    int rc = rt_cluster_step_view(e->cluster, e->seqs, ns, &view, &err);
    if (rc) {
        step_failed(e, rc, &err);
        return;
    }
    const int64_t t1 = now_us();
    logits = take_view(e, e->seqs, e->seq_slot, ns, view, n_vocab);
    take_results(e, e->seqs, e->seq_slot, ns, logits, n_vocab);
    step_times(e, t0, t1);
    if (e->o.recurrent)
        spec_redo(e);
}

static int any_busy(const rt_engine_t *e)
{
    for (int i = 0; i < e->o.n_slots; i++)
        if (e->slots[i].task)
            return 1;
    return 0;
}

/* The engine has no work: waits for some (under mu). With --sleep-idle-seconds and
 * READY processes, waits at most until the idle time is up and returns 1 when it is
 * (the caller puts the processes to sleep); while they load or restart, looks again
 * every 200 ms, the idle time counting from READY; else 0. */
static int idle_wait_locked(rt_engine_t *e)
{
    const rt_cluster_state_t st = rt_cluster_state(e->cluster);
    if (e->o.sleep_idle_ms <= 0 || st == RT_CLUSTER_SLEEPING || st == RT_CLUSTER_FAILED ||
        st == RT_CLUSTER_STOPPED) { /* nothing to time */
        pthread_cond_wait(&e->cv, &e->mu);
        return 0;
    }
    int64_t due;
    if (st != RT_CLUSTER_READY) { /* loading: the idle time counts from READY */
        e->last_work_us = now_us();
        due = e->last_work_us + 200000;
    } else {
        due = e->last_work_us + e->o.sleep_idle_ms * 1000;
        if (now_us() >= due)
            return 1;
    }
    struct timespec ts = {.tv_sec = (time_t)(due / 1000000), .tv_nsec = (long)(due % 1000000) * 1000};
    pthread_cond_timedwait(&e->cv, &e->mu, &ts);
    return 0;
}

static void *engine_main(void *arg)
{
    rt_engine_t *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        if (e->shutdown || e->quit) {
            pthread_mutex_unlock(&e->mu);
            break;
        }
        expire_waiting_locked(e, now_us());
        if (!any_busy(e) && !e->wait_head) {
            wake_loop(e);
            if (idle_wait_locked(e)) { /* idle long enough: the processes go */
                pthread_mutex_unlock(&e->mu);
                BL_LOG(BL_LOG_INFO, "event=sleep idle_s=%.1f", (double)e->o.sleep_idle_ms / 1000.0);
                rt_cluster_sleep(e->cluster);
                if (e->o.draft)
                    rt_cluster_sleep(e->o.draft);
                forget_caches(e);
                update_snapshot(e);
                wake_loop(e);
                continue;
            }
            pthread_mutex_unlock(&e->mu);
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        e->last_work_us = now_us();

        rt_cluster_state_t st = rt_cluster_state(e->cluster);
        if (st == RT_CLUSTER_SLEEPING) { /* work again: load the model, then go on */
            BL_LOG(BL_LOG_INFO, "event=wake");
            rt_cluster_wake(e->cluster);
            if (e->o.draft)
                rt_cluster_wake(e->o.draft);
        }
        if (st != RT_CLUSTER_READY) {
            char buf[sizeof(((bl_err_t *)0)->msg)];
            rt_cluster_error(e->cluster, buf, sizeof buf);
            if (any_busy(e)) { /* the processes went away between two steps */
                forget_in_flight(e);
                fail_running(e, 500, buf[0] ? buf : "the model processes are restarting");
                forget_caches(e);
            }
            if (st == RT_CLUSTER_FAILED || st == RT_CLUSTER_STOPPED) {
                pthread_mutex_lock(&e->mu);
                if (st == RT_CLUSTER_FAILED)
                    fail_waiting_locked(e, 500, buf[0] ? buf : "the model processes failed");
                else
                    fail_waiting_locked(e, 503, "server is shutting down");
                pthread_mutex_unlock(&e->mu);
            } else {
                char down[sizeof buf + 64];
                if (rt_cluster_down(e->cluster, down, sizeof down)) { /* not a passing restart */
                    pthread_mutex_lock(&e->mu);
                    fail_waiting_locked(e, 503, down);
                    pthread_mutex_unlock(&e->mu);
                }
                wake_loop(e);
                (void)rt_cluster_wait(e->cluster, CLUSTER_POLL_MS);
            }
            update_snapshot(e);
            wake_loop(e);
            continue;
        }
        rt_cluster_stats_t cs;
        rt_cluster_get_stats(e->cluster, &cs);
        if (cs.starts != e->cluster_starts) { /* a restart: the new processes start empty */
            if (e->cluster_starts != 0) {
                forget_in_flight(e);
                fail_running(e, 500, "the model processes were restarted");
                forget_caches(e);
            }
            e->cluster_starts = cs.starts;
        }
        int32_t n_vocab = (int32_t)rt_cluster_n_vocab(e->cluster);

        reap_cancelled(e);
        assign_waiting(e, n_vocab);
        run_step(e, n_vocab);
        update_snapshot(e);
        wake_loop(e);
    }

    /* shutting down: every task still here ends with 503 */
    for (int i = 0; i < e->o.n_slots; i++) {
        slot_t *s = &e->slots[i];
        if (s->task) {
            slot_release(e, s, error_event(e, 503, s->id, "server is shutting down"));
        }
    }
    pthread_mutex_lock(&e->mu);
    fail_waiting_locked(e, 503, "server is shutting down");
    e->finished = 1;
    e->posted = 1;
    pthread_mutex_unlock(&e->mu);
    update_snapshot(e);
    wake_loop(e);
    return NULL;
}

// --- entry points ---------------------------------------------------------------------------

static void free_async(uv_handle_t *h) { free(h); }

int rt_engine_create(rt_engine_t **out, const rt_engine_opts_t *o, rt_cluster_t *cluster,
                     const rt_tokenizer_t *tok, uv_loop_t *loop, bl_err_t *err)
{
    *out = NULL;
    if (!o || !cluster || !tok || !loop)
        return bl_err_set(err, BL_EINVAL, "engine: options, cluster, tokenizer and loop are required");
    if (o->n_slots < 1 || o->n_slots > 4096)
        return bl_err_set(err, BL_EINVAL, "engine: n_slots %d is outside 1..4096", o->n_slots);
    if (o->n_ctx_slot < 2 || o->n_ctx_slot > INT32_MAX)
        return bl_err_set(err, BL_EINVAL, "engine: n_ctx_slot %lld is outside 2..%d",
                          (long long)o->n_ctx_slot, INT32_MAX);
    if (o->n_batch < 1 || o->n_batch > INT32_MAX)
        return bl_err_set(err, BL_EINVAL, "engine: n_batch %lld is outside 1..%d",
                          (long long)o->n_batch, INT32_MAX);
    if (o->draft && (o->draft_max < 1 || o->draft_max > RT_DRAFT_MAX || o->draft_min < 0 ||
                     o->draft_min > o->draft_max || !(o->draft_p_min >= 0.0f && o->draft_p_min <= 1.0f)))
        return bl_err_set(err, BL_EINVAL, "engine: draft-max %d (1..%d), draft-min %d (0..draft-max), "
                          "draft-p-min %g (0..1)", o->draft_max, RT_DRAFT_MAX, o->draft_min,
                          (double)o->draft_p_min);
    if (o->ngram && (o->ngram < RT_NGRAM_SIMPLE || o->ngram > RT_NGRAM_MAP_K || o->draft || o->mtp ||
                     o->ngram_n < 1 || o->ngram_n > RT_NGRAM_MAX_N || o->draft_max < 1 ||
                     o->draft_max > RT_DRAFT_MAX || o->draft_min < 0 || o->draft_min > o->draft_max))
        return bl_err_set(err, BL_EINVAL, "engine: n-gram speculation %d with n %d (1..%d), draft-max %d (1..%d), "
                          "draft-min %d (0..draft-max), and no draft model or NextN layer", o->ngram, o->ngram_n,
                          RT_NGRAM_MAX_N, o->draft_max, RT_DRAFT_MAX, o->draft_min);

    rt_engine_t *e = calloc(1, sizeof *e);
    if (!e)
        return bl_err_set(err, BL_ENOMEM, "engine: out of memory");
    e->o = *o;
    e->last_work_us = now_us();
    if (e->o.timeout_ms < 0)
        e->o.timeout_ms = 0;
    e->cluster = cluster;
    e->tok = tok;
    e->loop = loop;
    e->n_vocab_tok = (int32_t)rt_tokenizer_n_vocab(tok);
    int mu_ok = 0, cv_ok = 0;
    int rc = BL_ENOMEM, have_msg = 0; /* have_msg: err already names the failure */

    if (pthread_mutex_init(&e->mu, NULL))
        goto fail;
    mu_ok = 1;
    pthread_condattr_t ca;
    int cv_rc = pthread_condattr_init(&ca);
    if (cv_rc == 0) { /* idle_wait_locked's deadlines are CLOCK_MONOTONIC */
        cv_rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        cv_rc = cv_rc ? cv_rc : pthread_cond_init(&e->cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (cv_rc)
        goto fail;
    cv_ok = 1;

    for (int32_t i = 0; i < e->n_vocab_tok; i++)
        e->n_eog += rt_tokenizer_is_eog(tok, i) != 0;
    e->eog = malloc((e->n_eog ? e->n_eog : 1) * sizeof *e->eog);
    size_t n_slots = (size_t)o->n_slots;
    if (e->o.pipeline < 1)
        e->o.pipeline = 1;
    if (e->o.pipeline > RT_CLUSTER_MAX_INFLIGHT)
        e->o.pipeline = RT_CLUSTER_MAX_INFLIGHT;
    if (e->o.ngram == RT_NGRAM_MOD && !(e->ngram_mod = rt_ngram_mod_new(e->o.ngram_n, NGRAM_MOD_ENTRIES)))
        goto fail;
    e->slots = calloc(n_slots, sizeof *e->slots);
    e->seqs = calloc(n_slots, sizeof *e->seqs);
    e->seq_slot = calloc(n_slots, sizeof *e->seq_slot);
    for (int i = 0; i < e->o.pipeline; i++) {
        e->fl[i].seqs = calloc(n_slots, sizeof *e->fl[i].seqs);
        e->fl[i].seq_slot = calloc(n_slots, sizeof *e->fl[i].seq_slot);
        if (!e->fl[i].seqs || !e->fl[i].seq_slot)
            goto fail;
    }
    e->order = calloc(n_slots, sizeof *e->order);
    e->info = calloc(n_slots, sizeof *e->info);
    if (!e->eog || !e->slots || !e->seqs || !e->seq_slot || !e->order || !e->info)
        goto fail;
    for (int32_t i = 0, j = 0; i < e->n_vocab_tok; i++)
        if (rt_tokenizer_is_eog(tok, i))
            e->eog[j++] = i;
    for (int i = 0; i < o->n_slots; i++) {
        slot_t *s = &e->slots[i];
        s->id = i;
        s->seq = malloc((size_t)o->n_ctx_slot * sizeof *s->seq);
        s->held_cap = 2 * STOP_MAX_LEN;
        s->held = malloc(s->held_cap);
        const size_t nck = o->recurrent && o->ctx_checkpoints > 0 ? (size_t)o->ctx_checkpoints : 1;
        s->spec_ck = -1;
        s->ck_id = malloc(nck * sizeof *s->ck_id);
        s->ck_n = malloc(nck * sizeof *s->ck_n);
        if (!s->seq || !s->held || !s->ck_id || !s->ck_n)
            goto fail;
        if ((rc = rt_detok_create(&s->detok[0], tok, 0, err)) ||
            (rc = rt_detok_create(&s->detok[1], tok, RT_DETOK_SPECIAL, err)) ||
            (rc = rt_detok_create(&s->detok[2], tok, 0, err))) {
            have_msg = 1;
            goto fail;
        }
        for (const char *const *m = o->markers; m && *m; m++) {
            int32_t id = rt_tokenizer_find(tok, *m, strlen(*m));
            if (id >= 0 && rt_tokenizer_token_type(tok, id) == RT_TOKEN_CONTROL &&
                rt_detok_keep(s->detok[2], id))
                goto fail;
        }
        e->info[i].id = i;
        e->info[i].n_ctx = o->n_ctx_slot;
    }

    e->async = calloc(1, sizeof *e->async);
    if (!e->async)
        goto fail;
    if (uv_async_init(loop, e->async, on_async)) {
        free(e->async);
        e->async = NULL;
        rc = bl_err_set(err, BL_EIO, "engine: uv_async_init failed");
        have_msg = 1;
        goto fail;
    }
    e->async->data = e;
    const long n_cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int helpers = rt_engine_sample_helpers(o->n_slots, n_cpus > 0 ? (int)n_cpus : 1);
    const char *hv = getenv("BLOOMERY_SAMPLE_THREADS"); /* the sampling threads, helpers + 1 */
    const int threads = hv && *hv ? atoi(hv) : 0;
    if (threads >= 1 && threads <= 65)
        helpers = threads - 1;
    if (!(e->jobs = calloc((size_t)o->n_slots, sizeof *e->jobs))) {
        rc = bl_err_set(err, BL_ENOMEM, "engine: out of memory for %d slots' sampling", o->n_slots);
        have_msg = 1;
        goto fail;
    }
    if (helpers > 0) {
        if ((rc = kcpu_pool_create(&e->pool, helpers + 1, err))) {
            have_msg = 1;
            goto fail;
        }
        kcpu_pool_set_poll(e->pool, 0); /* between steps the helpers sleep: the worker computes */
    }
    if (e->o.cache_dir) /* before the thread: the entries and their names are known */
        dk_scan(e);
    if (pthread_create(&e->thread, NULL, engine_main, e)) {
        rc = bl_err_set(err, BL_ENOMEM, "engine: cannot start the engine thread");
        have_msg = 1;
        goto fail;
    }
    e->thread_started = 1;
    *out = e;
    return 0;

fail:
    if (!have_msg)
        rc = bl_err_set(err, BL_ENOMEM, "engine: out of memory for %d slots of %lld positions",
                   o->n_slots, (long long)o->n_ctx_slot);
    if (e->async)
        uv_close((uv_handle_t *)e->async, free_async);
    e->async = NULL;
    if (e->slots)
        for (int i = 0; i < o->n_slots; i++) {
            free(e->slots[i].seq);
            free(e->slots[i].held);
            free(e->slots[i].ck_id);
            free(e->slots[i].ck_n);
            rt_ngram_map_free(&e->slots[i].ng_map);
            for (int k = 0; k < 3; k++)
                rt_detok_destroy(e->slots[i].detok[k]);
        }
    rt_ngram_mod_free(e->ngram_mod);
    free(e->slots);
    free(e->seqs);
    free(e->seq_slot);
    for (int i = 0; i < RT_CLUSTER_MAX_INFLIGHT; i++) {
        free(e->fl[i].seqs);
        free(e->fl[i].seq_slot);
    }
    free(e->order);
    free(e->info);
    free(e->eog);
    kcpu_pool_destroy(e->pool);
    free(e->jobs);
    if (cv_ok)
        pthread_cond_destroy(&e->cv);
    if (mu_ok)
        pthread_mutex_destroy(&e->mu);
    free(e);
    return rc;
}

void rt_engine_shutdown(rt_engine_t *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->mu);
    e->shutdown = 1;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

int rt_engine_drained(const rt_engine_t *e)
{
    rt_engine_t *m = (rt_engine_t *)e; /* the lock only; nothing visible changes */
    pthread_mutex_lock(&m->mu);
    int d = m->finished && !m->ev_head && !m->delivering;
    pthread_mutex_unlock(&m->mu);
    return d;
}

void rt_engine_destroy(rt_engine_t *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->mu);
    e->shutdown = 1;
    e->quit = 1;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (e->thread_started)
        pthread_join(e->thread, NULL);
    kcpu_pool_destroy(e->pool);
    free(e->jobs);

    /* events never delivered, and tasks whose handle the loop still held */
    ev_node_t *n = e->ev_head;
    while (n) {
        ev_node_t *next = n->next;
        free(n->buf);
        free(n);
        n = next;
    }
    for (n = e->ev_free; n;) {
        ev_node_t *next = n->next;
        free(n->buf);
        free(n);
        n = next;
    }
    for (rt_task_t *t = e->all; t;) {
        rt_task_t *next = t->all_next;
        free(t);
        t = next;
    }
    for (int i = 0; i < e->o.n_slots; i++) {
        slot_t *s = &e->slots[i];
        rt_sampler_destroy(s->smpl);
        s->smpl = NULL;
        for (int k = 0; k < 3; k++)
            rt_detok_destroy(s->detok[k]);
        free(s->seq);
        free(s->held);
        free(s->ck_id);
        free(s->ck_n);
        rt_ngram_map_free(&s->ng_map);
    }
    rt_grammar_vocab_destroy(e->gvocab); /* after the samplers that borrowed it */
    if (e->async)
        uv_close((uv_handle_t *)e->async, free_async);
    for (size_t i = 0; i < e->n_pc; i++)
        free(e->pc[i].toks);
    free(e->pc);
    for (size_t i = 0; i < e->n_dk; i++)
        free(e->dk[i].toks);
    free(e->dk);
    rt_ngram_mod_free(e->ngram_mod);
    free(e->slots);
    free(e->seqs);
    free(e->seq_slot);
    for (int i = 0; i < RT_CLUSTER_MAX_INFLIGHT; i++) {
        free(e->fl[i].seqs);
        free(e->fl[i].seq_slot);
    }
    free(e->order);
    free(e->info);
    free(e->eog);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

static int valid_utf8(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            k = 1;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            k = 2;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            k = 3;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (i + k >= n)
            return 0;
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xC0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + j] & 0x3F);
        }
        if ((k == 1 && cp < 0x80) || (k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += k + 1;
    }
    return 1;
}

static int enqueue(rt_engine_t *e, rt_task_t *t, rt_task_t **task, bl_err_t *err);

int rt_engine_slot_io(rt_engine_t *e, int slot, int action, const char *filename, rt_event_fn cb,
                      void *ud, rt_task_t **task, bl_err_t *err)
{
    *task = NULL;
    if (!cb || action < RT_SLOT_SAVE || action > RT_SLOT_ERASE)
        return bl_err_set(err, BL_EINVAL, "engine: a slot action and a callback are required");
    if (slot < 0 || slot >= e->o.n_slots)
        return bl_err_set(err, BL_EINVAL, "Invalid slot ID %d: this server has slots 0..%d", slot,
                          e->o.n_slots - 1);
    if (action != RT_SLOT_ERASE) {
        if (!e->o.slot_dir)
            return bl_err_set(err, BL_EINVAL, "no folder for slot files (--slot-save-path)");
        int rc = rt_slotfile_name_ok(filename, err);
        if (rc)
            return rc;
    }
    size_t nl = action != RT_SLOT_ERASE ? strlen(filename) : 0;
    rt_task_t *t = calloc(1, sizeof *t + nl + 1);
    if (!t)
        return bl_err_set(err, BL_ENOMEM, "engine: out of memory");
    char *name = (char *)(t + 1);
    if (nl)
        memcpy(name, filename, nl);
    rt_task_params_default(&t->p);
    t->p.slot_id = slot;
    t->io = action;
    t->io_name = name;
    t->cb = cb;
    t->ud = ud;
    return enqueue(e, t, task, err);
}

int rt_engine_submit(rt_engine_t *e, const int32_t *prompt, size_t n, const rt_task_params_t *p,
                     rt_event_fn cb, void *ud, rt_task_t **task, bl_err_t *err)
{
    *task = NULL;
    if (!p || !cb)
        return bl_err_set(err, BL_EINVAL, "engine: params and callback are required");
    if (n == 0 || !prompt)
        return bl_err_set(err, BL_EINVAL, "the prompt is empty");
    if ((int64_t)n >= e->o.n_ctx_slot)
        return bl_err_set(err, BL_ERANGE,
                          "the request exceeds the available context size, try increasing it "
                          "(the prompt has %zu tokens, the context of a slot %lld)",
                          n, (long long)e->o.n_ctx_slot);
    for (size_t i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= e->n_vocab_tok)
            return bl_err_set(err, BL_EINVAL,
                              "prompt token %zu is %d, outside the vocabulary (%d tokens)", i,
                              prompt[i], e->n_vocab_tok);
    int rc = rt_sampler_params_check(&p->sampling, e->n_vocab_tok, err);
    if (rc)
        return rc;
    if (p->n_probs < 0 || p->n_probs > RT_MAX_N_PROBS)
        return bl_err_set(err, BL_EINVAL, "n_probs %d is outside 0..%d", p->n_probs,
                          RT_MAX_N_PROBS);
    if (p->n_stop < 0 || p->n_stop > RT_MAX_STOP)
        return bl_err_set(err, BL_EINVAL, "'stop' has %d strings; at most %d", p->n_stop,
                          RT_MAX_STOP);
    if (p->slot_id < -1 || p->slot_id >= e->o.n_slots)
        return bl_err_set(err, BL_EINVAL, "id_slot %d is outside -1..%d", p->slot_id,
                          e->o.n_slots - 1);
    size_t stop_bytes = 0;
    for (int i = 0; i < p->n_stop; i++) {
        if (!p->stop[i])
            return bl_err_set(err, BL_EINVAL, "stop string %d is missing", i);
        size_t sl = strlen(p->stop[i]);
        if (sl > STOP_MAX_LEN)
            return bl_err_set(err, BL_EINVAL, "'stop' string %d is %zu bytes; at most %d", i,
                              sl, STOP_MAX_LEN);
        if (!valid_utf8((const unsigned char *)p->stop[i], sl))
            return bl_err_set(err, BL_EINVAL, "'stop' string %d is not valid UTF-8", i);
        stop_bytes += sl + 1;
    }
    size_t n_bias = p->sampling.n_logit_bias;
    if (n_bias > SIZE_MAX / 2 / sizeof(rt_logit_bias_t))
        return bl_err_set(err, BL_EINVAL, "'logit_bias' has %zu entries", n_bias);
    size_t n_bias_all = n_bias + (p->ignore_eos ? e->n_eog : 0);
    size_t grammar_len = p->sampling.grammar ? p->sampling.grammar_len : 0;
    if (grammar_len > RT_GRAMMAR_MAX_BYTES)
        return bl_err_set(err, BL_EINVAL, "the grammar is %zu bytes; at most %d", grammar_len,
                          RT_GRAMMAR_MAX_BYTES);

    size_t size = sizeof(rt_task_t) + n_bias_all * sizeof(rt_logit_bias_t) +
                  n * sizeof(int32_t) + stop_bytes + grammar_len + 1;
    rt_task_t *t = calloc(1, size);
    if (!t)
        return bl_err_set(err, BL_ENOMEM, "engine: out of memory for a task of %zu tokens", n);
    /* layout behind the struct: bias, prompt, stop strings (alignment descending) */
    rt_logit_bias_t *bias = (rt_logit_bias_t *)(t + 1);
    int32_t *pr = (int32_t *)(bias + n_bias_all);
    char *sp = (char *)(pr + n);
    t->p = *p;
    if (n_bias)
        memcpy(bias, p->sampling.logit_bias, n_bias * sizeof *bias);
    if (p->ignore_eos)
        for (size_t i = 0; i < e->n_eog; i++)
            bias[n_bias + i] = (rt_logit_bias_t){ e->eog[i], -INFINITY };
    t->p.sampling.logit_bias = n_bias_all ? bias : NULL;
    t->p.sampling.n_logit_bias = n_bias_all;
    memcpy(pr, prompt, n * sizeof *pr);
    t->prompt = pr;
    t->n_prompt = n;
    int ns = 0;
    for (int i = 0; i < p->n_stop; i++) {
        size_t sl = strlen(p->stop[i]);
        if (sl == 0) /* an empty stop string would end every generation at once */
            continue;
        memcpy(sp, p->stop[i], sl + 1);
        t->p.stop[ns] = sp;
        t->stop_len[ns] = sl;
        if (sl > t->max_stop_len)
            t->max_stop_len = sl;
        sp += sl + 1;
        ns++;
    }
    for (int i = ns; i < RT_MAX_STOP; i++)
        t->p.stop[i] = NULL;
    t->p.n_stop = ns;
    if (p->sampling.grammar) { /* the grammar's text, last */
        memcpy(sp, p->sampling.grammar, grammar_len);
        sp[grammar_len] = '\0';
        t->p.sampling.grammar = sp;
    }
    t->n_predict = p->n_predict < 0 ? -1 : p->n_predict;
    if (e->o.n_predict_max >= 0 && (t->n_predict < 0 || t->n_predict > e->o.n_predict_max))
        t->n_predict = e->o.n_predict_max;
    if (t->p.t_max_predict_ms < 0)
        t->p.t_max_predict_ms = 0;
    t->cb = cb;
    t->ud = ud;
    return enqueue(e, t, task, err);
}

/* Puts t (filled) at the end of the waiting list. */
static int enqueue(rt_engine_t *e, rt_task_t *t, rt_task_t **task, bl_err_t *err)
{
    t->t_submit_us = now_us();
    atomic_init(&t->cancelled, 0);
    t->refs = 2; /* the engine's and the loop's handle */
    t->loop_ref = 1;

    pthread_mutex_lock(&e->mu);
    if (e->shutdown) {
        pthread_mutex_unlock(&e->mu);
        free(t);
        return bl_err_set(err, BL_ECLOSED, "server is shutting down");
    }
    t->id = ++e->next_task_id;
    t->all_next = e->all;
    if (e->all)
        e->all->all_prev = t;
    e->all = t;
    t->waiting = 1;
    if (e->wait_tail)
        e->wait_tail->next = t;
    else
        e->wait_head = t;
    e->wait_tail = t;
    e->n_waiting++;
    e->stats.requests_deferred = e->n_waiting;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    *task = t;
    return 0;
}

void rt_engine_cancel(rt_engine_t *e, rt_task_t *t)
{
    if (!e || !t)
        return;
    pthread_mutex_lock(&e->mu);
    if (!t->loop_ref) { /* cancelled already */
        pthread_mutex_unlock(&e->mu);
        return;
    }
    atomic_store(&t->cancelled, 1);
    /* events still queued for it are dropped, each with its reference */
    ev_node_t **pp = &e->ev_head, *prev = NULL;
    while (*pp) {
        ev_node_t *n = *pp;
        if (n->task == t) {
            *pp = n->next;
            if (e->ev_tail == n)
                e->ev_tail = prev;
            task_unref_locked(e, t);
            ev_recycle_locked(e, n);
        } else {
            prev = n;
            pp = &n->next;
        }
    }
    int drop = 1; /* the loop's */
    if (t->waiting) {
        wait_remove_locked(e, t);
        e->stats.requests_deferred = e->n_waiting;
        drop++; /* and the engine's */
    }
    t->loop_ref = 0;
    task_unref_n_locked(e, t, drop);
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

int rt_engine_slots(rt_engine_t *e, rt_slot_info_t *slots, int cap)
{
    pthread_mutex_lock(&e->mu);
    int n = e->o.n_slots < cap ? e->o.n_slots : cap;
    if (n > 0)
        memcpy(slots, e->info, (size_t)n * sizeof *slots);
    pthread_mutex_unlock(&e->mu);
    return n < 0 ? 0 : n;
}

void rt_engine_get_stats(rt_engine_t *e, rt_engine_stats_t *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->stats;
    out->requests_deferred = e->n_waiting;
    pthread_mutex_unlock(&e->mu);
}

int rt_engine_n_slots(const rt_engine_t *e) { return e->o.n_slots; }

int64_t rt_engine_n_ctx_slot(const rt_engine_t *e) { return e->o.n_ctx_slot; }
