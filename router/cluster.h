/* The router's side of the engine's processes: it spawns one bloomery-worker per
 * pipeline stage and one bloomery-hosttier, creates the shared-memory rings between
 * them (router -> worker 0 -> ... -> worker N-1 -> router; each worker <-> the
 * hosttier), hands each its plan over the ZeroMQ control channel, waits until all
 * report ready, and from then on runs steps through the rings. A supervisor thread
 * inside owns the children and the control socket: it notices a child that dies
 * within a second, fails the step in flight with an error naming the process,
 * stops the other children, and starts the whole set again (a worker's KV caches
 * die with it, so nothing survives a restart but the model file).
 *
 * Threads: rt_cluster_create/_destroy and the getters from any one thread;
 * rt_cluster_step from one thread at a time (the engine thread). */
#ifndef RT_CLUSTER_H
#define RT_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "plan.h"

typedef struct rt_cluster rt_cluster_t;

#define RT_CLUSTER_MAX_STAGES 64
#define RT_CLUSTER_MAX_LAYERS 4096
#define RT_CLUSTER_MAX_TIERS 16 /* BP_PLAN_MAX_TIERS */

typedef struct rt_cluster_opts {
    const char *model_path;  /* GGUF file (first part of a split file) */
    const char *bin_dir;     /* folder holding bloomery-worker and bloomery-hosttier */
    const char *runtime_dir; /* folder for the control socket (ipc://); created if missing */
    int n_workers;           /* pipeline stages, 1..n_layer; layers split evenly, earlier
                              * stages taking the remainder */
    int n_threads;           /* threads per worker for decode (-t) */
    int n_threads_batch;     /* threads per worker for prompt steps (-tb) */
    int n_threads_hosttier;  /* threads of the hosttier's expert pool */
    int n_slots;             /* KV caches per worker (-np) */
    int64_t n_ctx_slot;      /* positions per slot's cache */
    const char *slot_dir;    /* the folder of slot files (--slot-save-path), or NULL */
    const char *cache_dir;   /* the prompt cache on disk (--cache-disk), or NULL */
    int mtp;                 /* the last stage runs the NextN layer: each step's answer
                              * carries its proposals (rt_cluster_mtp) */
    int64_t kv_pool;         /* positions one cache holds for all slots together (-kvu),
                              * handed out in BP_KV_CHUNK chunks; 0: each slot owns
                              * n_ctx_slot */
    int64_t n_batch;         /* most rows one step may carry (-ub) */
    int64_t logit_rows;      /* most logit rows one step returns (at most n_batch; 0: one
                              * per slot, at least 8) */
    uint32_t kv_type;        /* a bl_type_t id (common/quant.h): f16, f32 or q8_0 */
    /* The stages of a placement plan (common/plan.h); n_stage_ends 0: the layers split
     * evenly over n_workers on the CPU, earlier stages taking the remainder */
    int n_stage_ends;        /* n_workers when given */
    int64_t stage_end[RT_CLUSTER_MAX_STAGES]; /* stage i: layers [end of i-1, stage_end[i]) */
    int stage_device[RT_CLUSTER_MAX_STAGES];  /* -1 the CPU, else a CUDA ordinal */
    /* A stage's own threads for decode and prompt steps alike (a hostfile line's
     * threads=: its host is not the router's), 1..256; 0: n_threads and
     * n_threads_batch */
    int stage_threads[RT_CLUSTER_MAX_STAGES];
    /* Stages on other hosts (docs/deploy.md, "Several hosts"): stage i's worker runs
     * under the node at remote[i] ("tcp://HOST:PORT"), reached through a relay
     * (bloomery-node in bin_dir) started in its place; NULL: on this host. The links'
     * keys come from secret_path (required when any stage is remote). */
    const char *remote[RT_CLUSTER_MAX_STAGES];
    /* A remote stage whose host runs its own hosttier (a hostfile's hosttier line of
     * that host): node_hosttier[i] 1, and its node starts bloomery-hosttier there for
     * the stage's host layers (host_layers 2) with node_hosttier_threads[i] threads
     * (0: the plan's) and node_hosttier_name[i] as its --name (NULL: none) */
    uint8_t node_hosttier[RT_CLUSTER_MAX_STAGES];
    int node_hosttier_threads[RT_CLUSTER_MAX_STAGES];
    const char *node_hosttier_name[RT_CLUSTER_MAX_STAGES];
    /* A hostfile's name= labels (NULL: "worker<i>", "hosttier"): each stage's and the
     * hosttier's log name and error label, given to the process as --name; its routing
     * id, /metrics' process label and the router's process= fields keep the tag. */
    const char *stage_name[RT_CLUSTER_MAX_STAGES];
    const char *hosttier_name;
    const char *secret_path;
    /* Layers whose routed experts are in host RAM: 1, computed by this host's hosttier,
     * which runs only when one is 1; 2, by the hosttier of their stage's host (a
     * node_hosttier stage's layers); 0, with their layer's worker */
    uint8_t host_layers[RT_CLUSTER_MAX_LAYERS];
    /* Expert tiers (common/plan.h's bl_plan_tier_t): tier k, a worker on CUDA device
     * tier_device[k] of this host, computes the routed experts of the layers whose
     * tier_layers entry is k + 1, for whichever stage holds them */
    int n_tiers;
    int tier_device[RT_CLUSTER_MAX_TIERS];
    uint8_t tier_layers[RT_CLUSTER_MAX_LAYERS];
    int flash_attn;          /* WK_FLASH_*: prompt attention on a card (-fa) */
    int no_mmap;             /* workers copy every weight into their memory (--no-mmap) */
    int mlock;               /* workers and hosttier lock their weights in RAM (--mlock) */
    int no_op_offload;       /* cards never copy host experts in for prompts (--no-op-offload) */
    int no_peer_copy;        /* two card stages of this host pass the rows between them
                              * through the host ring, not card to card (--no-peer-copy) */
    int poll;                /* CPU pools' idle wait, 0..100 (--poll) */
    int cpu_strict;          /* CPU pool threads pinned one to a CPU (--cpu-strict 1) */
    int64_t experts_vram;    /* card bytes for resident expert slots (--experts-vram):
                              * BL_EXPERTS_VRAM_AUTO (-1) sizes them from the card; 0, as
                              * in zeroed options, is none */
    int no_residency;        /* host-RAM experts never move into card slots (--no-residency) */
    int64_t experts_ram;     /* bytes the hosttier's experts may take in RAM, the rest paged
                              * from the model file (the plan's --experts-ram); 0: all in RAM */
    int step_timeout_ms;     /* a step without an answer for this long counts the processes
                              * as hung: the step fails and the whole set restarts (0: wait
                              * as long as they live) */
    int verbose;             /* children log at DEBUG */
    int verbosity;           /* the children's -lv (llama.cpp's threshold); -1: not given */
    int log_colors;          /* children colour their level names */
    int quiet;               /* children write no log lines (--log-disable); a load
                              * failure still reaches the router as an Error */
} rt_cluster_opts_t;

/* The CUDA devices of this host as the bloomery-worker in bin_dir sees them, for the
 * placement plan (bp_list_devices: at most cap devices, 30 s). A worker built without
 * CUDA, or a host without a GPU, gives none. BL_ENOENT (no worker in bin_dir), and
 * bp_list_devices' errors. */
int rt_cluster_devices(const char *bin_dir, bl_device_t *out, int cap, int *n, bl_err_t *err) BL_WUR;

/* State of the processes, for /health and the engine. */
typedef enum rt_cluster_state {
    RT_CLUSTER_LOADING = 1,    /* first start: children loading */
    RT_CLUSTER_READY = 2,      /* steps run */
    RT_CLUSTER_RESTARTING = 3, /* a child died; the set is being started again */
    RT_CLUSTER_FAILED = 4,     /* the first start failed (rt_cluster_error says why),
                                * or restarts keep failing: the server should exit */
    RT_CLUSTER_STOPPED = 5,
    RT_CLUSTER_SLEEPING = 6,   /* rt_cluster_sleep stopped the set: no processes, no
                                * memory held; rt_cluster_wake starts it (LOADING) */
} rt_cluster_state_t;

/* Copies opts, starts the supervisor thread, which spawns the children, and returns
 * at once; the state is LOADING until every child reports ready. Load progress is
 * logged (event=load_progress). BL_EINVAL (bad options, named), BL_ENOENT (a program
 * missing in bin_dir), BL_ENOMEM, BL_EIO. Caller frees with rt_cluster_destroy. */
int rt_cluster_create(rt_cluster_t **out, const rt_cluster_opts_t *opts, bl_err_t *err) BL_WUR;

/* Sends every child a Shutdown, waits for them (grace 2 s, then SIGKILL), reaps them,
 * destroys the rings (memfd: nothing named is left behind), joins the supervisor.
 * A step blocked in rt_cluster_step returns BL_ECLOSED. NULL is a no-op. */
void rt_cluster_destroy(rt_cluster_t *c);

rt_cluster_state_t rt_cluster_state(const rt_cluster_t *c);

/* Sleep (llama-server's --sleep-idle-seconds): rt_cluster_sleep turns a READY set
 * SLEEPING at once (no step may start) and has the supervisor stop its processes
 * gracefully; rt_cluster_wake starts it again (LOADING, then READY, as a restart:
 * starts counts it and every cache is empty), also when it comes before the
 * processes are gone. Both return at once. */
void rt_cluster_sleep(rt_cluster_t *c);
void rt_cluster_wake(rt_cluster_t *c);

/* Waits until the state is READY, FAILED or STOPPED, or timeout_ms passes (negative:
 * no limit); returns the state. */
rt_cluster_state_t rt_cluster_wait(rt_cluster_t *c, int timeout_ms);

/* Why the cluster is FAILED, or the last child failure ("worker 0 (pid 123) died:
 * killed by signal 9"); "" when none. Copied into buf. */
const char *rt_cluster_error(rt_cluster_t *c, char *buf, size_t cap);

/* Whether the cluster is RESTARTING after a restart that failed (a stage's host lost:
 * a set with stages on other hosts keeps trying): then 1, with why it is down in why
 * ("the model's processes are restarting: <the last failure>"), and the server
 * answers 503 with it, waiting requests too, until the set is whole again. During a
 * first restart requests wait, as a reload may take minutes. */
int rt_cluster_down(rt_cluster_t *c, char *why, size_t cap);

/* Model facts the workers report in their Ready (filled once READY). */
int64_t rt_cluster_n_vocab(const rt_cluster_t *c);
int64_t rt_cluster_n_embd(const rt_cluster_t *c);

/* One sequence's part of a step: n rows of tokens at positions pos.. in slot's
 * cache (pos <= what the cache holds: a smaller pos drops what came after it, for
 * prompt-cache reuse), logits wanted for the last n_out rows (0 or 1 in practice). */
typedef struct rt_step_seq {
    int32_t slot;
    int32_t n;
    int64_t pos;
    int32_t n_out;
    const int32_t *tokens; /* (n) */
} rt_step_seq_t;

/* Runs one step through the pipeline and points *logits at (sum of n_out, n_vocab)
 * floats in sequence order, valid until the next call. Rows of all sequences
 * together are at most n_batch. Returns 0, or: BL_EINVAL/BL_ERANGE (the step does not
 * fit the plan: slot, rows, positions; nothing ran), BL_ECLOSED (a child died or the
 * cluster is stopping: err names the process; every slot's cache is gone, so the
 * engine must forget its prompt caches; a death between steps is reported once, to
 * the first later step with a sequence at pos > 0: a step of only new sequences runs
 * on the restarted set), BL_EAGAIN (not READY; nothing ran),
 * BL_EPROTO (a child sent something malformed: the cluster restarts), BL_EIO.
 * Blocks while the step runs; a dead child ends the wait within a second. */
int rt_cluster_step(rt_cluster_t *c, const rt_step_seq_t *seqs, int n_seqs, const float **logits,
                    bl_err_t *err) BL_WUR;

/* With o.mtp: the NextN layer's proposal from each logit row of the last answer
 * (rt_cluster_step or _recv), in the same order; valid as the logits. NULL without. */
typedef struct rt_mtp {
    int32_t in;  /* the token the layer read after the row (its most likely one), or -1:
                  * no proposal from this row */
    int32_t tok; /* the token it proposes after that one */
    float p;     /* its probability */
} rt_mtp_t;
const rt_mtp_t *rt_cluster_mtp(const rt_cluster_t *c);

/* The most steps in flight at once (rt_cluster_step_send). */
#define RT_CLUSTER_MAX_INFLIGHT 8

/* A pipeline of several stages kept busy: rt_cluster_step_send puts a step in flight
 * and returns (the stages work on it while the next is sent), rt_cluster_step_recv
 * waits for the oldest one's answer (*logits as rt_cluster_step's, valid until the
 * next recv). Errors as rt_cluster_step's; a failed recv, or a send failing for
 * another reason than BL_EINVAL or BL_EAGAIN, ends every step in flight.
 * rt_cluster_step and rt_cluster_kv refuse (BL_EINVAL) while steps are in flight:
 * their answers would come after those. Engine thread. */
int rt_cluster_step_send(rt_cluster_t *c, const rt_step_seq_t *seqs, int n_seqs, bl_err_t *err) BL_WUR;
int rt_cluster_step_recv(rt_cluster_t *c, const float **logits, bl_err_t *err) BL_WUR;

/* rt_cluster_step and rt_cluster_step_recv with the answer left where it came: *view
 * points at the logit rows in the last stage's ring, not copied out (at 8 rows of a
 * 152k vocabulary, 4.8 MB a step). On success the cluster stays locked for the
 * caller, which reads the rows and then calls rt_cluster_view_end, and nothing else
 * on c, before: keep 1 copies the rows out first and returns the copy (valid as
 * rt_cluster_step's logits), keep 0 returns NULL; either way the ring's message is
 * given back and *view is invalid. On an error nothing is held. */
int rt_cluster_step_view(rt_cluster_t *c, const rt_step_seq_t *seqs, int n_seqs, const float **view,
                         bl_err_t *err) BL_WUR;
int rt_cluster_step_recv_view(rt_cluster_t *c, const float **view, bl_err_t *err) BL_WUR;
const float *rt_cluster_view_end(rt_cluster_t *c, int keep);
int rt_cluster_in_flight(rt_cluster_t *c);
/* Forgets the steps in flight (the engine saw the set go away between steps). */
void rt_cluster_forget_in_flight(rt_cluster_t *c);

/* Sends KV ops (proto/step.h: a slot's cache saved to host memory under an entry
 * name, loaded back into a slot, dropped, a slot's cache emptied) down the pipeline in step order, and
 * waits for them to come back; each op's bytes is then what the stages together
 * hold for its entry. Returns 0, or what rt_cluster_step returns, or the first
 * failing op's error as a stage named it (BL_ENOENT: a load of an entry a stage does
 * not hold; BL_ENOMEM). On an error the ops after the failing one did not run and
 * the slots they name hold nothing usable. Engine thread. */
enum { RT_KV_SAVE = 1, RT_KV_LOAD = 2, RT_KV_DROP = 3, RT_KV_CLEAR = 4, RT_KV_WRITE = 5,
       RT_KV_READ = 6, RT_KV_PERSIST = 7, RT_KV_FETCH = 8, RT_KV_CKPT = 9, RT_KV_ROLLBACK = 10 };
/* A shared cache (kv_pool) goes to the slots in chunks of this many positions. */
#define RT_KV_CHUNK 256
#define RT_KV_MAX_OPS 64
typedef struct rt_kv_op {
    int op;        /* RT_KV_* */
    int32_t slot;  /* SAVE, LOAD, CLEAR, WRITE, READ */
    int64_t entry; /* >= 0; WRITE, READ: the io file's number (rt_cluster_kv_io_path) */
    int64_t n;     /* SAVE, LOAD, WRITE, READ: positions 0..n */
    int64_t bytes; /* SAVE, LOAD out: host bytes the stages hold for the entry; WRITE,
                    * READ in: the file offset of the first stage's part, out: the end
                    * of the last stage's */
} rt_kv_op_t;
int rt_cluster_kv(rt_cluster_t *c, rt_kv_op_t *ops, int n_ops, bl_err_t *err) BL_WUR;
/* The path of the file WRITE and READ ops of number `entry` use, in opts.slot_dir
 * (BL_EINVAL when there is none, or the path does not fit cap). */
int rt_cluster_kv_io_path(const rt_cluster_t *c, int64_t entry, char *out, size_t cap,
                          bl_err_t *err) BL_WUR;

/* How many times the set was (re)started, and counters for /metrics. */
typedef struct rt_cluster_stats {
    uint64_t starts;
    uint64_t child_deaths;
    uint64_t steps;
    uint64_t rows;
} rt_cluster_stats_t;
void rt_cluster_get_stats(const rt_cluster_t *c, rt_cluster_stats_t *out);

/* The counters a child last reported in its Stats (the supervisor asks every child
 * for them every RT_CLUSTER_STATS_MS while the set runs): as many as a child sends
 * (proto/child.h's BP_CHILD_MAX_COUNTERS), so that a worker's two counters per layer
 * of a 94-layer model fit. About 10 KiB per child: keep arrays of them off the stack. */
#define RT_CLUSTER_STATS_MS 2000
#define RT_CLUSTER_MAX_COUNTERS 256
typedef struct rt_child_stats {
    char process[24];  /* "worker0", "hosttier" */
    uint64_t uptime_us;
    int n;
    struct {
        char name[32]; /* [a-z0-9_] only: a child's other names are dropped */
        uint64_t value;
    } c[RT_CLUSTER_MAX_COUNTERS];
} rt_child_stats_t;

/* Copies the latest Stats of the running children into out (at most cap); returns
 * how many. Children that have not reported yet are left out. Thread-safe. */
int rt_cluster_child_stats(rt_cluster_t *c, rt_child_stats_t *out, int cap);

/* The kernels each child of the running set reported at Ready, one line each, into
 * buf (cap bytes, cut there): "  worker0: CPU avx512\n". Thread-safe. */
void rt_cluster_kernels(rt_cluster_t *c, char *buf, size_t cap);

#endif
