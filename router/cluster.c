/* The engine's processes from the router's side (see cluster.h): the supervisor
 * thread spawns the workers and the hosttier, wires the rings between them, hands
 * out the plan over the ZeroMQ ROUTER socket, watches the children, and restarts
 * the whole set when one dies; rt_cluster_step runs one step through the rings.
 *
 * A dense (qwen3) model has no routed experts, so no hosttier is started for it:
 * an idle process would cost a model load and a ring pair for nothing, and the
 * workers run their dense FFNs themselves.
 *
 * Locks: mu guards state, the error texts and the wait condition; step_mu is held by
 * rt_cluster_step for a whole step, and by the supervisor while it tears the rings
 * down, so a step never sees a ring disappear under it. */
#include "cluster.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "arch.h"
#include "bl_config.h"
#include "chan.h"
#include "child.h"
#include "file.h"
#include "gguf.h"
#include "log.h"
#include "progress.h"
#include "step.h"


#define MAX_WORKERS 64
/* How often the supervisor looks at its children, and a waiting step at the flags. */
#define POLL_MS 100
/* How often a running set looks at its model files (a stat each). */
#define FILES_CHECK_MS 1000
/* start_set and watch_set: a model file changed; the cluster fails. */
#define RT_SET_CHANGED 3
#define POLL_US 100000
/* A child that neither reports Ready nor dies within this long fails the start. */
#define LOAD_TIMEOUT_MS (10 * 60 * 1000)
/* After a child exits during load, how long its Error message may still arrive. */
#define LAST_WORDS_MS 300
#define GRACE_MS 2000
/* Restarts that fail in a row before the cluster gives up (FAILED). */
#define MAX_FAILED_RESTARTS 3

typedef struct child {
    char name[24];     /* "worker 0", "hosttier", "tier 0": in errors */
    char tag[24];      /* "worker0": its log name */
    char identity[40]; /* routing id, unique per start so a reconnect is never confused */
    pid_t pid;         /* 0 when not running */
    int hosttier;
    int tier;          /* k + 1 for expert tier k (a worker in the tier role), else 0 */
    int hello, ready;
    /* a card link's offer for this worker that came before its Hello, packed (0 bytes:
     * none); relayed once it has said Hello */
    uint8_t card_offer[1600]; /* the largest valid CardLink packs to 1571 bytes */
    size_t card_offer_len;
    char last_words[512]; /* its fatal Error after load, told with its death */
    char kernels[BP_MSG_MAX_KERNELS + 16]; /* Ready.kernels, escaped (under mu) */
    char load_stage[16];  /* its last LoadProgress's stage ("" none yet this start) */
    bl_progress_t load;   /* that stage's bytes and rate */
    int64_t load_line_ms; /* its last event=load_progress line */
    rt_child_stats_t stats; /* under mu; stats.n 0 until the first report */
} child_t;

struct rt_cluster {
    rt_cluster_opts_t o; /* strings point into the copies below; o.remote[i] are the
                          * cluster's own copies (freed with it), NULL past n_workers */
    char *model_path, *bin_dir, *runtime_dir;
    char worker_bin[PATH_MAX], hosttier_bin[PATH_MAX], node_bin[PATH_MAX];
    char *secret_path;
    char endpoint[160], sock_path[128];

    /* Model facts read from the file at create (they size the rings). */
    int64_t n_layer, n_embd, n_vocab, n_expert, n_expert_used;
    int has_hosttier;
    /* The model's files (the parts of a split one) as they were at create: a file
     * replaced or rewritten since is noticed while the set runs and before a restart,
     * and the cluster fails rather than go on with other weights than it loaded. */
    int n_files;
    char **file_paths;
    bl_file_id_t *file_ids;
    int n_children; /* workers, then the hosttier, then the expert tiers */
    child_t kids[MAX_WORKERS + 1 + RT_CLUSTER_MAX_TIERS];
    bl_progress_t load_bar; /* on a terminal: the children's weights loaded, summed */
    int64_t load_deadline;  /* ms: a start fails when no child moved on by then */
    bp_step_limits_t lim; /* what the router accepts from the last stage */

    /* Rings of the current set. The router keeps a handle on every ring it made,
     * including those between children, until the children are gone: destroying a
     * handle marks its side closed, which the children would take as the end. */
    bp_ring_t *to_first, *from_last;        /* the router's ends */
    bp_ring_t *links[MAX_WORKERS];          /* stage i -> stage i+1 */
    bp_ring_t *x_req[MAX_WORKERS], *x_rep[MAX_WORKERS]; /* worker i <-> hosttier */
    bp_ring_t *t_req[RT_CLUSTER_MAX_TIERS][MAX_WORKERS]; /* worker i <-> tier k */
    bp_ring_t *t_rep[RT_CLUSTER_MAX_TIERS][MAX_WORKERS];

    /* ---- supervisor thread */
    pthread_t sup;
    bp_chan_t *chan;
    uint64_t gen;

    /* ---- step thread (under step_mu) */
    pthread_mutex_t step_mu;
    uint64_t step_no;
    float *logits;           /* (n_out_max, n_vocab) */
    const float *view;       /* the answer left in the ring (rt_cluster_step_view), or NULL */
    int32_t view_rows;
    bp_step_mtp_t *mtp_in;   /* (n_out_max) the last answer's NextN proposals, as read */
    rt_mtp_t *mtp;           /* (n_out_max) the same for the engine (o.mtp) */
    /* steps sent whose answers have not come back, oldest first (rt_cluster_step_send) */
    struct {
        uint64_t step;
        int32_t n_out;
        int64_t deadline;
    } fl[RT_CLUSTER_MAX_INFLIGHT];
    int fl_head, fl_n;

    /* ---- shared */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    rt_cluster_state_t state;  /* under mu */
    int failed_restarts;       /* under mu: restarts that failed since the set was last whole */
    char error[1024];          /* under mu */
    int pending_closed;        /* under mu: a death the engine has not been told of: the
                                * next step that reads a cache ends with BL_ECLOSED */
    _Atomic int broken;        /* the set is dead or being torn down: steps end */
    _Atomic int stopping;      /* destroy was called */
    _Atomic int restart_req;   /* a step saw a protocol error or no answer: restart the set */
    _Atomic int sleep_req;     /* rt_cluster_sleep: stop the set and hold it (SLEEPING) */
    int wake_req;              /* under mu: rt_cluster_wake: start the held set again */
    _Atomic uint64_t starts, child_deaths, steps, rows;
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void set_state(rt_cluster_t *c, rt_cluster_state_t s)
{
    pthread_mutex_lock(&c->mu);
    c->state = s;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void set_error(rt_cluster_t *c, const char *msg)
{
    pthread_mutex_lock(&c->mu);
    snprintf(c->error, sizeof c->error, "%s", msg);
    pthread_mutex_unlock(&c->mu);
}

/* ------------------------------------------------------------ model facts */

static void mark_broken(rt_cluster_t *c, const char *why);

static void free_files(rt_cluster_t *c)
{
    for (int i = 0; c->file_paths && i < c->n_files; i++)
        free(c->file_paths[i]);
    free(c->file_paths);
    free(c->file_ids);
}

/* 0 while every model file is the one read at create; else BL_EIO naming it. */
static int files_changed(const rt_cluster_t *c, bl_err_t *err)
{
    for (int i = 0; i < c->n_files; i++) {
        const int rc = bl_file_id_check(c->file_paths[i], &c->file_ids[i], err);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* The cluster's end when a model file changed: the reason logged and kept for
 * /health and the requests, and no restart. */
static void fail_changed(rt_cluster_t *c, const bl_err_t *err)
{
    char why[sizeof err->msg + 96];
    snprintf(why, sizeof why, "%s; the server stops: start it again to load the file as it is now", err->msg);
    BL_LOG(BL_LOG_ERROR, "event=model_changed reason=\"%s\"", err->msg);
    mark_broken(c, why);
}

/* Reads what the plan and the ring sizes need; the workers check the rest. */
static int read_model(rt_cluster_t *c, bl_err_t *err)
{
    bl_gguf_t *g;
    int rc = bl_gguf_open(&g, c->model_path, err);
    if (rc)
        return rc;
    /* the architecture's one reader: the layers a step runs (NextN layers apart),
     * the routed experts */
    bl_arch_t a;
    if ((rc = bl_arch_read(&a, g, c->model_path, err)) == 0) {
        c->n_layer = a.n_layer;
        c->n_embd = a.n_embd;
        c->n_expert = a.moe ? a.n_expert : 0;
        c->n_expert_used = a.moe ? a.n_expert_used : 0;
    }
    const uint32_t np = bl_gguf_n_parts(g);
    if (rc == 0 && !(c->file_paths = calloc(np, sizeof *c->file_paths)))
        rc = bl_err_set(err, BL_ENOMEM, "cluster: out of memory");
    if (rc == 0 && !(c->file_ids = calloc(np, sizeof *c->file_ids)))
        rc = bl_err_set(err, BL_ENOMEM, "cluster: out of memory");
    for (uint32_t i = 0; rc == 0 && i < np; i++, c->n_files++) {
        if (!(c->file_paths[i] = strdup(bl_gguf_part_path(g, i))))
            rc = bl_err_set(err, BL_ENOMEM, "cluster: out of memory");
        else
            rc = bl_file_id_path(c->file_paths[i], &c->file_ids[i], err);
    }
    const bl_gguf_tensor_t *emb = rc == 0 ? bl_gguf_find_tensor(g, "token_embd.weight") : NULL;
    if (rc == 0 && (!emb || emb->n_dims != 2 || emb->ne[1] < 1 || emb->ne[1] > INT32_MAX))
        rc = bl_err_set(err, BL_ENOENT, "%s: tensor 'token_embd.weight' is missing or not 2-D",
                        c->model_path);
    if (rc == 0)
        c->n_vocab = emb->ne[1];
    bl_gguf_close(g);
    return rc;
}

/* ------------------------------------------------------------ rings */

/* The smallest power-of-two capacity whose largest message holds msg bytes. */
static size_t ring_capacity(size_t msg)
{
    size_t want = msg < BP_STEP_MAX_TEXT + 64 ? BP_STEP_MAX_TEXT + 64 : msg;
    size_t cap = BP_RING_MIN_CAPACITY;
    while (cap < BP_RING_MAX_CAPACITY && bp_ring_max_msg(cap) < want)
        cap <<= 1;
    return cap;
}

static size_t msg_size(uint32_t kind, int32_t n_seqs, int32_t rows, int32_t width, int32_t k)
{
    bp_step_hdr_t h = {.kind = kind, .n_seqs = n_seqs, .n_rows = rows, .width = width, .k = k};
    bp_step_layout_t lay;
    bl_err_t err;
    return bp_step_layout(&h, &lay, &err) == 0 ? lay.nbytes : SIZE_MAX;
}

static int make_ring(bp_ring_t **r, const char *what, int i, size_t msg, bp_ring_role_t role,
                     bl_err_t *err)
{
    char name[48];
    snprintf(name, sizeof name, "bloomery-%s%d", what, i);
    return bp_ring_create(r, name, ring_capacity(msg), role, err);
}

static void destroy_rings(rt_cluster_t *c)
{
    bp_ring_destroy(c->to_first);
    bp_ring_destroy(c->from_last);
    c->to_first = c->from_last = NULL;
    for (int i = 0; i < MAX_WORKERS; i++) {
        bp_ring_destroy(c->links[i]);
        bp_ring_destroy(c->x_req[i]);
        bp_ring_destroy(c->x_rep[i]);
        c->links[i] = c->x_req[i] = c->x_rep[i] = NULL;
        for (int k = 0; k < RT_CLUSTER_MAX_TIERS; k++) {
            bp_ring_destroy(c->t_req[k][i]);
            bp_ring_destroy(c->t_rep[k][i]);
            c->t_req[k][i] = c->t_rep[k][i] = NULL;
        }
    }
}

static int create_rings(rt_cluster_t *c, bl_err_t *err)
{
    int nw = c->o.n_workers, slots = c->o.n_slots, batch = (int)c->o.n_batch;
    int embd = (int)c->n_embd, k = (int)c->n_expert_used;
    size_t tokens = msg_size(BP_STEP_TOKENS, slots, batch, 0, 0);
    size_t hidden = msg_size(BP_STEP_HIDDEN, slots, batch, embd, 0);
    size_t logits = msg_size(BP_STEP_LOGITS, 0, c->lim.n_out_max, (int)c->n_vocab, c->o.mtp ? 1 : 0);
    size_t xreq = msg_size(BP_STEP_EXPERTS, 0, batch, embd, batch * k); /* every pair of every row */
    size_t xrep = msg_size(BP_STEP_SUMS, 0, batch, embd, 0);
    int rc = make_ring(&c->to_first, "tokens", 0, tokens, BP_RING_PRODUCER, err);
    if (rc == 0)
        rc = make_ring(&c->from_last, "logits", 0, logits, BP_RING_CONSUMER, err);
    for (int i = 0; rc == 0 && i + 1 < nw; i++)
        rc = make_ring(&c->links[i], "hidden", i, hidden, BP_RING_PRODUCER, err);
    /* a stage's experts rings: to this host's hosttier, or, for a stage whose host
     * runs its own, sized here for its relay to tell the node */
    for (int i = 0; rc == 0 && i < nw; i++) {
        if (!c->has_hosttier && !c->o.node_hosttier[i])
            continue;
        rc = make_ring(&c->x_req[i], "experts", i, xreq, BP_RING_PRODUCER, err);
        if (rc == 0)
            rc = make_ring(&c->x_rep[i], "sums", i, xrep, BP_RING_PRODUCER, err);
    }
    for (int t = 0; t < c->o.n_tiers; t++)
        for (int i = 0; rc == 0 && i < nw; i++) {
            char what[24];
            snprintf(what, sizeof what, "tier%d-experts", t);
            rc = make_ring(&c->t_req[t][i], what, i, xreq, BP_RING_PRODUCER, err);
            snprintf(what, sizeof what, "tier%d-sums", t);
            if (rc == 0)
                rc = make_ring(&c->t_rep[t][i], what, i, xrep, BP_RING_PRODUCER, err);
        }
    if (rc)
        destroy_rings(c);
    return rc;
}

/* ------------------------------------------------------------ spawning */

/* Starts child i with its rings at the fds proto/step.h names (bp_spawn). */
static int spawn_child(rt_cluster_t *c, int i, bl_err_t *err)
{
    child_t *k = &c->kids[i];
    int nw = c->o.n_workers;
    int src[2 * (MAX_WORKERS + RT_CLUSTER_MAX_TIERS + 1)];
    int n_fds = 0;
    if (k->hosttier || k->tier) { /* a ring pair per worker (proto/step.h) */
        for (int w = 0; w < nw; w++) {
            src[n_fds++] = bp_ring_fd(k->tier ? c->t_req[k->tier - 1][w] : c->x_req[w]);
            src[n_fds++] = bp_ring_fd(k->tier ? c->t_rep[k->tier - 1][w] : c->x_rep[w]);
        }
    } else {
        src[n_fds++] = bp_ring_fd(i == 0 ? c->to_first : c->links[i - 1]);
        src[n_fds++] = bp_ring_fd(i == nw - 1 ? c->from_last : c->links[i]);
        if (c->has_hosttier || c->o.node_hosttier[i]) {
            src[n_fds++] = bp_ring_fd(c->x_req[i]);
            src[n_fds++] = bp_ring_fd(c->x_rep[i]);
        }
        for (int t = 0; t < c->o.n_tiers; t++) { /* at bp_step_fd_tier(has_hosttier, t) */
            src[n_fds++] = bp_ring_fd(c->t_req[t][i]);
            src[n_fds++] = bp_ring_fd(c->t_rep[t][i]);
        }
    }
    int rc = 0;
    char parent[24], threads[24], ht_threads[24];
    snprintf(parent, sizeof parent, "%d", (int)getpid());
    snprintf(threads, sizeof threads, "%d", c->o.n_threads_hosttier > 0 ? c->o.n_threads_hosttier
                                                                        : c->o.n_threads);
    char *argv[34];
    int a = 0;
    const char *remote = !k->hosttier && !k->tier ? c->o.remote[i] : NULL;
    argv[a++] = k->hosttier ? c->hosttier_bin : remote ? c->node_bin : c->worker_bin;
    if (remote) { /* the stage's relay to the node on its host */
        argv[a++] = (char *)"--relay";
        argv[a++] = (char *)remote;
        argv[a++] = (char *)"--secret";
        argv[a++] = c->secret_path;
        if (c->o.node_hosttier[i]) { /* the stage's host-RAM experts on its own host */
            snprintf(ht_threads, sizeof ht_threads, "%d", c->o.node_hosttier_threads[i]);
            argv[a++] = (char *)"--node-hosttier";
            argv[a++] = (char *)"--hosttier-threads";
            argv[a++] = ht_threads;
            if (c->o.node_hosttier_name[i]) {
                argv[a++] = (char *)"--hosttier-name";
                argv[a++] = (char *)c->o.node_hosttier_name[i];
            }
        }
    }
    argv[a++] = (char *)"--control";
    argv[a++] = c->endpoint;
    argv[a++] = (char *)"--identity";
    argv[a++] = k->identity;
    argv[a++] = (char *)"--parent";
    argv[a++] = parent;
    const char *label = k->hosttier ? c->o.hosttier_name : k->tier ? NULL : c->o.stage_name[i];
    if (k->hosttier) {
        argv[a++] = (char *)"--threads";
        argv[a++] = threads;
    }
    if (!k->hosttier || label) {
        argv[a++] = (char *)"--name";
        argv[a++] = label ? (char *)label : k->tag;
    }
    if (c->o.verbose)
        argv[a++] = (char *)"--verbose";
    if (c->o.quiet)
        argv[a++] = (char *)"--log-disable";
    char lv[16];
    if (c->o.verbosity >= 0) {
        snprintf(lv, sizeof lv, "%d", c->o.verbosity);
        argv[a++] = (char *)"-lv";
        argv[a++] = lv;
    }
    if (c->o.log_colors)
        argv[a++] = (char *)"--log-colors";
    argv[a] = NULL;

    /* its own process group: a Ctrl-C at the terminal reaches the router, which stops
     * the children in order, rather than killing them under it */
    pid_t pid;
    if ((rc = bp_spawn(&pid, argv, src, n_fds, 1, k->name, err)) != 0)
        return rc;
    k->pid = pid;
    k->hello = k->ready = 0;
    k->card_offer_len = 0; /* an offer of the last set means nothing to this one */
    k->last_words[0] = '\0';
    BL_LOG(BL_LOG_INFO, "event=child_started process=%s%s%s pid=%d", k->tag, label ? " name=" : "",
           label ? label : "", (int)pid);
    return 0;
}

/* "killed by signal 9", "exited with status 1". */
static void describe_status(int status, char *buf, size_t cap)
{
    if (WIFSIGNALED(status))
        snprintf(buf, cap, "killed by signal %d", WTERMSIG(status));
    else
        snprintf(buf, cap, "exited with status %d", WEXITSTATUS(status));
}

/* Returns the index of a child that has exited (reaped; *status set), or -1. */
static int reap_one(rt_cluster_t *c, int *status)
{
    for (int i = 0; i < c->n_children; i++) {
        if (c->kids[i].pid <= 0)
            continue;
        pid_t r = waitpid(c->kids[i].pid, status, WNOHANG);
        if (r == c->kids[i].pid || (r < 0 && errno == ECHILD))
            return i;
    }
    return -1;
}

/* Stops every child: Shutdown and a grace (graceful), then SIGKILL; reaps them all
 * and destroys the rings with no step in flight. */
static void stop_set(rt_cluster_t *c, int graceful)
{
    atomic_store(&c->broken, 1);
    if (graceful && c->chan) {
        for (int i = 0; i < c->n_children; i++) {
            child_t *k = &c->kids[i];
            bp_peer_t to = {.len = strlen(k->identity)};
            memcpy(to.id, k->identity, to.len);
            bl_err_t err;
            if (k->pid > 0 && k->hello &&
                bp_chan_send_shutdown(c->chan, &to, "router stopping", GRACE_MS, 100, &err) != 0)
                BL_LOG(BL_LOG_DEBUG, "event=shutdown_not_sent process=%s reason=\"%s\"",
                       k->tag, err.msg);
        }
        int64_t until = now_ms() + GRACE_MS;
        int live = 1;
        while (live && now_ms() < until) {
            live = 0;
            for (int i = 0; i < c->n_children; i++) {
                if (c->kids[i].pid > 0 && waitpid(c->kids[i].pid, NULL, WNOHANG) == 0)
                    live = 1;
                else
                    c->kids[i].pid = 0;
            }
            if (live)
                usleep(10000);
        }
    }
    for (int i = 0; i < c->n_children; i++) {
        if (c->kids[i].pid > 0) {
            kill(c->kids[i].pid, SIGKILL);
            while (waitpid(c->kids[i].pid, NULL, 0) < 0 && errno == EINTR) {
            }
            c->kids[i].pid = 0;
        }
    }
    /* A step still waiting sees broken within POLL_US and lets go of step_mu. */
    pthread_mutex_lock(&c->step_mu);
    destroy_rings(c);
    pthread_mutex_unlock(&c->step_mu);
}

/* ------------------------------------------------------------ control plane */

static int child_of(rt_cluster_t *c, const bp_peer_t *p)
{
    for (int i = 0; i < c->n_children; i++)
        if (strlen(c->kids[i].identity) == p->len &&
            memcmp(c->kids[i].identity, p->id, p->len) == 0)
            return i;
    return -1;
}

/* Whether stage s and the next are both on cards of this host (a relayed stage's
 * worker is another host's). */
static int card_pair(const rt_cluster_t *c, int s)
{
    return c->o.n_stage_ends && c->o.stage_device[s] >= 0 && c->o.stage_device[s + 1] >= 0 && !c->o.remote[s] &&
           !c->o.remote[s + 1];
}

/* Whether stage s and the next may pass their rows card to card: such a pair, and
 * not turned off. The workers then try, and keep the ring where they cannot
 * (docs/transport.md). */
static int card_link(const rt_cluster_t *c, int s)
{
    return !c->o.no_peer_copy && card_pair(c, s);
}

/* Sends m to child k. */
static int send_to(rt_cluster_t *c, const child_t *k, const bp_msg_t *m)
{
    bl_err_t err = {0};
    bp_peer_t to = {.len = strlen(k->identity)};
    memcpy(to.id, k->identity, to.len);
    if (bp_chan_send(c->chan, &to, m, 1000, &err) != 0) {
        set_error(c, err.msg);
        return err.code ? err.code : BL_EIO;
    }
    return 0;
}

/* A CardLink from child i on its way to the link's other end: an offer from the
 * sending stage goes to the next one (kept until that one has said Hello: a socket
 * that has not connected yet cannot be sent to), an answer from the receiving stage
 * back. A message of a link the plan has not, or from the wrong end, is dropped
 * (logged): the ends then wait until the load times out, as for a child that never
 * answers. */
static int relay_card(rt_cluster_t *c, int i, const bp_msg_t *m)
{
    bp_card_msg_t cm;
    bl_err_t err = {0};
    const int nw = c->o.n_workers;
    if (bp_card_msg_read(m, &cm, &err) != 0 || (int)cm.link + 1 >= nw || !card_link(c, (int)cm.link) ||
        i != (int)cm.link + (cm.answer ? 1 : 0)) {
        BL_LOG(BL_LOG_WARN, "event=card_link_dropped process=%s link=%u answer=%d", c->kids[i].tag, cm.link,
               cm.answer);
        return 0;
    }
    child_t *to = &c->kids[cm.answer ? cm.link : cm.link + 1];
    if (to->hello)
        return send_to(c, to, m);
    if (bp_msg_pack(m, to->card_offer, sizeof to->card_offer, &to->card_offer_len, &err) != 0) {
        set_error(c, err.msg);
        return err.code ? err.code : BL_EIO;
    }
    return 0;
}

/* The offer kept for child k, relayed now that it has said Hello. */
static int relay_kept_offer(rt_cluster_t *c, child_t *k)
{
    if (k->card_offer_len == 0)
        return 0;
    bp_msg_t m = {0};
    bl_err_t err = {0};
    int rc = bp_msg_unpack(&m, k->card_offer, k->card_offer_len, &err);
    k->card_offer_len = 0;
    if (rc != 0)
        set_error(c, err.msg);
    else
        rc = send_to(c, k, &m);
    bp_msg_free(&m);
    return rc;
}

/* Where stage s's layers end: the plan's stages, or an even split, earlier stages
 * taking the remainder. */
static int64_t stage_end(const rt_cluster_t *c, int s)
{
    if (c->o.n_stage_ends)
        return c->o.stage_end[s];
    const int64_t base = c->n_layer / c->o.n_workers, extra = c->n_layer % c->o.n_workers;
    return base * (s + 1) + (s + 1 < extra ? s + 1 : extra);
}

/* The stage that runs layer l. */
static int stage_of_layer(const rt_cluster_t *c, int64_t l)
{
    int s = 0;
    while (s < c->o.n_workers - 1 && l >= stage_end(c, s))
        s++;
    return s;
}

static int send_plan(rt_cluster_t *c, int i, const bp_peer_t *to, bl_err_t *err)
{
    /* on the stack (some 6 KiB, the host-layer table): a static one would be shared with
     * the supervisor of another cluster of the process (a draft's, started beside the
     * model's), whose plan could overwrite this one before it is sent */
    bp_plan_t p;
    memset(&p, 0, sizeof p);
    const int nw = c->o.n_workers;
    for (int s = 0; s < nw; s++) {
        const int64_t lb = s ? stage_end(c, s - 1) : 0, le = stage_end(c, s);
        const int dev = c->o.n_stage_ends ? c->o.stage_device[s] : -1;
        const uint32_t threads = (uint32_t)c->o.stage_threads[s];
        p.stages[s] = (bp_plan_stage_t){.process = (uint32_t)s, .layer_begin = (uint32_t)lb,
                                        .layer_end = (uint32_t)le, .device = dev, .threads = threads,
                                        .threads_batch = threads};
    }
    for (int s = 0; s + 1 < nw; s++)
        p.stages[s].card_next = card_link(c, s);
    p.n_stages = nw;
    p.model_path = c->model_path;
    p.n_layers = (uint32_t)c->n_layer;
    p.n_expert = (uint32_t)c->n_expert;
    /* every expert of a host layer: computed by this host's hosttier, or by the
     * hosttier a remote stage's node runs, which this host's must not load */
    const int to_hosttier = c->kids[i].hosttier;
    for (int64_t l = 0; l < c->n_layer; l++)
        p.host[l] = to_hosttier ? c->o.host_layers[l] == 1 : c->o.host_layers[l] != 0;
    p.host_process = (uint32_t)nw;
    /* the tiers' processes follow the hosttier's */
    p.n_tiers = c->o.n_tiers;
    for (int t = 0; t < c->o.n_tiers; t++)
        p.tiers[t] = (bp_plan_tier_t){.process = (uint32_t)(nw + c->has_hosttier + t), .device = c->o.tier_device[t]};
    for (int64_t l = 0; c->o.n_tiers && l < c->n_layer; l++)
        p.tier[l] = c->o.tier_layers[l];
    p.kv_type = c->o.kv_type;
    p.n_ctx = (uint32_t)c->o.n_ctx_slot;
    p.kv_pool = (uint32_t)c->o.kv_pool;
    p.slot_dir = c->o.slot_dir ? c->o.slot_dir : "";
    p.cache_dir = c->o.cache_dir ? c->o.cache_dir : "";
    p.mtp = c->o.mtp;
    p.n_slots = (uint32_t)c->o.n_slots;
    p.threads = (uint32_t)c->o.n_threads;
    p.threads_batch = (uint32_t)c->o.n_threads_batch;
    p.n_batch = (uint32_t)c->o.n_batch;
    p.flash_attn = (uint32_t)c->o.flash_attn;
    p.no_mmap = c->o.no_mmap != 0;
    p.mlock = c->o.mlock != 0;
    p.no_op_offload = c->o.no_op_offload != 0;
    p.poll = (uint32_t)c->o.poll;
    p.cpu_strict = c->o.cpu_strict != 0;
    p.experts_vram = c->o.experts_vram;
    p.no_residency = c->o.no_residency != 0;
    p.experts_ram = c->o.experts_ram;
    p.you = (uint32_t)i;
    return bp_chan_send_plan(c->chan, to, &p, 1000, err);
}

_Static_assert(RT_CLUSTER_MAX_COUNTERS >= BP_CHILD_MAX_COUNTERS, "a child's Stats fit");

/* Keeps a child's Stats for /metrics; names outside [a-z0-9_] (or too long) are
 * dropped, so that they can go into metric names as they are. */
static void store_stats(rt_cluster_t *c, child_t *k, const bp_msg_t *m)
{
    rt_child_stats_t st; /* 10 KiB, with cs 14: the supervisor's stack has room */
    memset(&st, 0, sizeof st);
    snprintf(st.process, sizeof st.process, "%s", k->tag);
    bp_msg_counter_t cs[RT_CLUSTER_MAX_COUNTERS];
    const int n = bp_msg_stats_read(m, &st.uptime_us, cs, RT_CLUSTER_MAX_COUNTERS);
    for (int i = 0; i < n && st.n < RT_CLUSTER_MAX_COUNTERS; i++) {
        const char *name = cs[i].name;
        size_t len = strlen(name);
        if (len == 0 || len >= sizeof st.c[0].name || strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789_") != len)
            continue;
        memcpy(st.c[st.n].name, name, len + 1);
        st.c[st.n].value = cs[i].value;
        st.n++;
    }
    pthread_mutex_lock(&c->mu);
    k->stats = st;
    pthread_mutex_unlock(&c->mu);
}

/* Asks every ready child for its Stats (the replies arrive through pump). */
static void request_stats(rt_cluster_t *c)
{
    for (int i = 0; i < c->n_children; i++) {
        child_t *k = &c->kids[i];
        if (!k->ready || k->pid == 0)
            continue;
        bp_peer_t to = {.len = strlen(k->identity)};
        memcpy(to.id, k->identity, to.len);
        bl_err_t err = {0};
        if (bp_chan_send_stats_request(c->chan, &to, (uint32_t)i, 0, &err) != 0)
            BL_LOG(BL_LOG_DEBUG, "event=stats_request_failed process=%s reason=\"%s\"", k->tag, err.msg);
    }
}

/* Handles one control message. During a start (loading) a fatal Error ends it:
 * returns the error's code with the child's text in c->error. */
/* A child's LoadProgress: its event=load_progress line at each new stage, at the end
 * of one and (away from a terminal, where the bar shows it) every
 * BL_PROGRESS_PERIOD_S; the bar of the sum over the children's stages past the
 * mapping; and more time for the start, which fails only when no child moves on for
 * LOAD_TIMEOUT_MS. */
static void load_progress(rt_cluster_t *c, child_t *k, const char *stage, uint64_t done, uint64_t total)
{
    char esc[sizeof k->load_stage];
    bl_log_escape(esc, sizeof esc, stage, strlen(stage));
    const int64_t now = now_ms();
    const int fresh = strcmp(esc, k->load_stage) != 0;
    if (fresh) {
        snprintf(k->load_stage, sizeof k->load_stage, "%s", esc);
        bl_progress_begin(&k->load, BL_PROGRESS_QUIET, "", "", total, 0);
    }
    const int finished = done >= total && (fresh || k->load.done < k->load.total);
    bl_progress_update(&k->load, done, total);
    if (fresh || finished ||
        (!bl_log_terminal() && (double)(now - k->load_line_ms) >= BL_PROGRESS_PERIOD_S * 1e3)) {
        char f[160];
        bl_progress_format_fields(&k->load, bl_progress_now_us(), f, sizeof f);
        BL_LOG(BL_LOG_INFO, "event=load_progress process=%s stage=%s %s", k->tag, k->load_stage, f);
        k->load_line_ms = now;
    }
    c->load_deadline = now + LOAD_TIMEOUT_MS;
    uint64_t sum_done = 0, sum_total = 0;
    for (int i = 0; i < c->n_children; i++)
        if (c->kids[i].load_stage[0] && strcmp(c->kids[i].load_stage, "mmap") != 0) {
            sum_done += c->kids[i].load.done;
            sum_total += c->kids[i].load.total;
        }
    bl_progress_update(&c->load_bar, sum_done, sum_total);
}

static int on_message(rt_cluster_t *c, const bp_peer_t *from, const bp_msg_t *m, int loading)
{
    char who[64];
    int i = child_of(c, from);
    if (i < 0) {
        BL_LOG(BL_LOG_WARN, "event=unknown_peer peer=%s type=%s",
               bp_peer_name(from, who, sizeof who), bp_msg_type_name(m->type));
        return 0;
    }
    child_t *k = &c->kids[i];
    bl_err_t err = {0};
    char esc[400];
    switch (m->type) {
    case BP_MSG_HELLO: {
        const char *version = bp_msg_hello_version(m);
        if (strcmp(version, BL_VERSION) != 0) {
            bl_log_escape(esc, sizeof esc, version, strlen(version));
            snprintf(err.msg, sizeof err.msg, "%s: version %s, the router is %s", k->name, esc,
                     BL_VERSION);
            set_error(c, err.msg);
            return BL_ENOTSUP;
        }
        k->hello = 1;
        if (send_plan(c, i, from, &err) != 0) {
            set_error(c, err.msg);
            return err.code ? err.code : BL_EIO;
        }
        return relay_kept_offer(c, k);
    }
    case BP_MSG_LOAD_PROGRESS: {
        uint64_t done, total;
        const char *stage;
        bp_msg_progress_info(m, &done, &total, &stage);
        load_progress(c, k, stage, done, total);
        return 0;
    }
    case BP_MSG_READY: {
        uint64_t nv, ne, nl;
        const char *kernels;
        bp_msg_ready_facts(m, &nv, &ne, &nl, &kernels);
        if (!k->hosttier && !k->tier && (nv != (uint64_t)c->n_vocab || ne != (uint64_t)c->n_embd || nl != (uint64_t)c->n_layer)) {
            snprintf(err.msg, sizeof err.msg, "%s: reports n_vocab %llu, n_embd %llu, %llu layers; the file "
                     "says %lld, %lld, %lld", k->name, (unsigned long long)nv, (unsigned long long)ne,
                     (unsigned long long)nl, (long long)c->n_vocab, (long long)c->n_embd, (long long)c->n_layer);
            set_error(c, err.msg);
            return BL_EPROTO;
        }
        k->ready = 1;
        pthread_mutex_lock(&c->mu);
        bl_log_escape(k->kernels, sizeof k->kernels, kernels, strlen(kernels));
        pthread_mutex_unlock(&c->mu);
        BL_LOG(BL_LOG_INFO, "event=child_ready process=%s pid=%d kernels=\"%s\"", k->tag, (int)k->pid,
               k->kernels);
        return 0;
    }
    case BP_MSG_ERROR: {
        int32_t code;
        int fatal;
        const char *text;
        bp_msg_error_info(m, &code, &fatal, &text);
        bl_log_escape(esc, sizeof esc, text, strlen(text));
        BL_LOG(BL_LOG_ERROR, "event=child_error process=%s code=%d fatal=%d reason=\"%s\"",
               k->tag, code, fatal, esc);
        if (loading && fatal) {
            /* Children prefix their texts with their name; keep ours if one does not. */
            if (strncmp(text, k->name, strlen(k->name)) == 0)
                snprintf(err.msg, sizeof err.msg, "%s", esc);
            else
                snprintf(err.msg, sizeof err.msg, "%s: %s", k->name, esc);
            set_error(c, err.msg);
            return code;
        }
        if (fatal) /* it exits next: its death says why */
            snprintf(k->last_words, sizeof k->last_words, "%s", esc);
        return 0;
    }
    case BP_MSG_STATS:
        store_stats(c, k, m);
        return 0;
    case BP_MSG_CARD_LINK:
        return k->hosttier || k->tier ? 0 : relay_card(c, i, m);
    default:
        return 0;
    }
}

/* Receives control messages for up to timeout_ms. */
static int pump(rt_cluster_t *c, int timeout_ms, int loading)
{
    bp_peer_t from;
    bp_msg_t m = {0};
    bl_err_t err = {0};
    int rc = bp_chan_recv(c->chan, &from, &m, timeout_ms, &err);
    if (rc == 0)
        rc = on_message(c, &from, &m, loading);
    else if (rc == BL_ETIMEDOUT)
        rc = 0;
    else {
        char esc[600];
        BL_LOG(BL_LOG_WARN, "event=bad_control_message reason=\"%s\"",
               bl_log_escape(esc, sizeof esc, err.msg, strlen(err.msg)));
        rc = 0; /* a bad message loses that message only */
    }
    bp_msg_free(&m);
    return rc;
}

/* ------------------------------------------------------------ one start */

/* Creates the rings, spawns every child and waits until all are ready. On failure
 * c->error says why and everything started is stopped again. */
static int start_set(rt_cluster_t *c)
{
    bl_err_t err = {0};
    int rc;
    if ((rc = files_changed(c, &err)) < 0) {
        fail_changed(c, &err);
        return RT_SET_CHANGED;
    }
    c->gen++;
    pthread_mutex_lock(&c->mu); /* a new set has reported nothing yet */
    for (int i = 0; i < c->n_children; i++) {
        c->kids[i].stats.n = 0;
        c->kids[i].load_stage[0] = 0;
    }
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < c->n_children; i++) {
        child_t *k = &c->kids[i];
        char tag[sizeof k->tag];
        memcpy(tag, k->tag, sizeof tag);
        snprintf(k->identity, sizeof k->identity, "%s.%d.%llu", tag, (int)getpid(),
                 (unsigned long long)c->gen);
    }
    rc = create_rings(c, &err);
    for (int i = 0; rc == 0 && i < c->n_children; i++)
        rc = spawn_child(c, i, &err);
    if (rc) {
        set_error(c, err.msg);
        stop_set(c, 0);
        return rc;
    }
    c->load_deadline = now_ms() + LOAD_TIMEOUT_MS;
    bl_progress_begin(&c->load_bar, BL_PROGRESS_BAR, "loading", "", 0, 0);
    for (;;) {
        int n_ready = 0;
        for (int i = 0; i < c->n_children; i++)
            n_ready += c->kids[i].ready;
        if (n_ready == c->n_children)
            break;
        if (atomic_load(&c->stopping)) {
            set_error(c, "the cluster was stopped while loading");
            rc = BL_ECLOSED;
            break;
        }
        if ((rc = pump(c, POLL_MS, 1)) != 0)
            break;
        int status, i = reap_one(c, &status);
        if (i >= 0) {
            child_t *k = &c->kids[i];
            char how[64];
            describe_status(status, how, sizeof how);
            pid_t pid = k->pid;
            k->pid = 0;
            /* Its Error message may still be on its way: that is the better reason. */
            int64_t until = now_ms() + LAST_WORDS_MS;
            while (rc == 0 && now_ms() < until)
                rc = pump(c, 20, 1);
            if (rc == 0) {
                snprintf(err.msg, sizeof err.msg, "%s (pid %d) %s while loading %s", k->name,
                         (int)pid, how, c->model_path);
                set_error(c, err.msg);
                rc = BL_EIO;
            }
            BL_LOG(BL_LOG_ERROR, "event=child_exited_during_load process=%s %s", k->tag, how);
            break;
        }
        if (now_ms() > c->load_deadline) {
            snprintf(err.msg, sizeof err.msg, "the children reported no loading progress for %d s",
                     LOAD_TIMEOUT_MS / 1000);
            set_error(c, err.msg);
            rc = BL_ETIMEDOUT;
            break;
        }
    }
    bl_progress_end(&c->load_bar, rc == 0);
    if (rc) {
        stop_set(c, 0);
        return rc;
    }
    atomic_fetch_add(&c->starts, 1);
    atomic_store(&c->broken, 0);
    atomic_store(&c->restart_req, 0);
    char tiers[24] = "";
    if (c->o.n_tiers)
        snprintf(tiers, sizeof tiers, " tiers=%d", c->o.n_tiers);
    BL_LOG(BL_LOG_INFO, "event=cluster_ready workers=%d hosttier=%d start=%llu%s", c->o.n_workers, c->has_hosttier,
           (unsigned long long)atomic_load(&c->starts), tiers);
    return 0;
}

/* Tells steps the set is gone. The reason is set before broken (both under mu), so a
 * step that sees broken finds the reason. */
static void mark_broken(rt_cluster_t *c, const char *why)
{
    pthread_mutex_lock(&c->mu);
    snprintf(c->error, sizeof c->error, "%s", why);
    c->pending_closed = 1;
    c->state = RT_CLUSTER_RESTARTING;
    atomic_store(&c->broken, 1);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Watches a running set: control messages, dead children, restart and sleep
 * requests, the model's files. Returns when the set must go (1: restart it, 2: hold
 * it stopped until woken, RT_SET_CHANGED: a model file changed, 0: the cluster is
 * stopping). */
static int watch_set(rt_cluster_t *c)
{
    int64_t next_stats = now_ms(), next_files = now_ms() + FILES_CHECK_MS;
    while (!atomic_load(&c->stopping)) {
        if (now_ms() >= next_stats) {
            request_stats(c);
            next_stats = now_ms() + RT_CLUSTER_STATS_MS;
        }
        if (now_ms() >= next_files) {
            bl_err_t err = {0};
            if (files_changed(c, &err) < 0) {
                fail_changed(c, &err);
                return RT_SET_CHANGED;
            }
            next_files = now_ms() + FILES_CHECK_MS;
        }
        (void)pump(c, POLL_MS, 0); /* after load, messages are informational */
        int status, i = reap_one(c, &status);
        if (i >= 0) {
            child_t *k = &c->kids[i];
            char how[64], msg[800];
            describe_status(status, how, sizeof how);
            snprintf(msg, sizeof msg, "%s (pid %d) died: %s%s%s%s", k->name, (int)k->pid, how,
                     k->last_words[0] ? " (" : "", k->last_words, k->last_words[0] ? ")" : "");
            k->pid = 0;
            BL_LOG(BL_LOG_ERROR, "event=child_died process=%s %s", k->tag, how);
            atomic_fetch_add(&c->child_deaths, 1);
            mark_broken(c, msg);
            return 1;
        }
        if (atomic_load(&c->restart_req)) {
            BL_LOG(BL_LOG_WARN, "event=cluster_restart reason=step_failed");
            if (!atomic_load(&c->broken)) /* a step that timed out has marked it already */
                mark_broken(c, "a child broke the step protocol; the engine's processes restart");
            return 1;
        }
        if (atomic_load(&c->sleep_req))
            return 2;
    }
    return 0;
}

/* The set is stopped for sleep: SLEEPING until rt_cluster_wake (1: start it again,
 * LOADING) or destroy (0). Its processes are gone, so their memory and devices are
 * free meanwhile. */
static int hold_asleep(rt_cluster_t *c)
{
    BL_LOG(BL_LOG_INFO, "event=sleeping");
    pthread_mutex_lock(&c->mu);
    atomic_store(&c->sleep_req, 0);
    c->state = RT_CLUSTER_SLEEPING;
    pthread_cond_broadcast(&c->cv);
    while (!c->wake_req && !atomic_load(&c->stopping)) /* destroy signals cv too */
        pthread_cond_wait(&c->cv, &c->mu);
    const int wake = c->wake_req && !atomic_load(&c->stopping);
    c->wake_req = 0;
    if (wake) {
        c->state = RT_CLUSTER_LOADING;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    if (wake)
        BL_LOG(BL_LOG_INFO, "event=waking");
    return wake;
}

static void *supervisor_main(void *arg)
{
    rt_cluster_t *c = arg;
    bl_err_t err = {0};
    if (bp_chan_bind(&c->chan, BP_CHAN_ROUTER, c->endpoint, &err) != 0) {
        set_error(c, err.msg);
        set_state(c, RT_CLUSTER_FAILED);
        return NULL;
    }
    int failed = 0, first = 1, remote = 0;
    for (int s = 0; s < c->o.n_workers && s < RT_CLUSTER_MAX_STAGES; s++)
        remote |= c->o.remote[s] != NULL;
    while (!atomic_load(&c->stopping)) {
        const int started = start_set(c);
        if (started == RT_SET_CHANGED) {
            set_state(c, RT_CLUSTER_FAILED);
            break;
        }
        if (started != 0) {
            /* The first start failing is the user's problem (a bad file): report it.
             * Later ones may be passing trouble: retry a few times; with stages on
             * other hosts without limit, since a host that went away may come back
             * (the HTTP routes answer 503 with the reason meanwhile). */
            ++failed;
            pthread_mutex_lock(&c->mu);
            c->failed_restarts = failed;
            pthread_mutex_unlock(&c->mu);
            if (first || (!remote && failed >= MAX_FAILED_RESTARTS) || atomic_load(&c->stopping)) {
                set_state(c, atomic_load(&c->stopping) ? RT_CLUSTER_STOPPED : RT_CLUSTER_FAILED);
                break;
            }
            if (remote) {
                char why[sizeof c->error];
                BL_LOG(BL_LOG_WARN, "event=restart_failed attempt=%d reason=\"%s\"", failed,
                       rt_cluster_error(c, why, sizeof why));
            }
            for (int i = 0; i < (remote && failed > 2 ? 25 : 2) && !atomic_load(&c->stopping); i++)
                usleep(100000);
            continue;
        }
        first = failed = 0;
        pthread_mutex_lock(&c->mu);
        c->failed_restarts = 0;
        pthread_mutex_unlock(&c->mu);
        set_state(c, RT_CLUSTER_READY);
        int why = watch_set(c);
        stop_set(c, why != 1);
        if (why == RT_SET_CHANGED) {
            set_state(c, RT_CLUSTER_FAILED);
            break;
        }
        if (why == 2 && hold_asleep(c))
            continue;
        if (why != 1)
            break;
    }
    bp_chan_destroy(c->chan);
    c->chan = NULL;
    unlink(c->sock_path); /* ZeroMQ leaves the ipc file behind on some versions */
    pthread_mutex_lock(&c->mu);
    if (c->state != RT_CLUSTER_FAILED)
        c->state = RT_CLUSTER_STOPPED;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ------------------------------------------------------------ public */

static int check_opts(const rt_cluster_opts_t *o, bl_err_t *err)
{
    if (!o->model_path || !o->model_path[0])
        return bl_err_set(err, BL_EINVAL, "cluster: no model path");
    if (!o->bin_dir || !o->bin_dir[0])
        return bl_err_set(err, BL_EINVAL, "cluster: no bin_dir");
    if (!o->runtime_dir || !o->runtime_dir[0])
        return bl_err_set(err, BL_EINVAL, "cluster: no runtime_dir");
    if (o->n_workers < 1 || o->n_workers > MAX_WORKERS)
        return bl_err_set(err, BL_EINVAL, "cluster: n_workers %d is not in 1..%d", o->n_workers,
                          MAX_WORKERS);
    if (o->n_threads < 1 || o->n_threads > 256)
        return bl_err_set(err, BL_EINVAL, "cluster: n_threads %d is not in 1..256", o->n_threads);
    if (o->n_stage_ends != 0 && (o->n_stage_ends != o->n_workers || o->n_workers > RT_CLUSTER_MAX_STAGES))
        return bl_err_set(err, BL_EINVAL, "cluster: %d stage ends for %d workers", o->n_stage_ends,
                          o->n_workers);
    for (int i = 0; i < o->n_stage_ends; i++)
        if (o->stage_device[i] < -1 || o->stage_device[i] > 255)
            return bl_err_set(err, BL_EINVAL, "cluster: stage %d's device %d is not -1 or a CUDA ordinal", i,
                              o->stage_device[i]);
    for (int i = 0; i < o->n_workers && i < RT_CLUSTER_MAX_STAGES; i++)
        if (o->stage_threads[i] < 0 || o->stage_threads[i] > 256)
            return bl_err_set(err, BL_EINVAL, "cluster: stage %d's threads %d is not 0 (as n_threads) or 1..256", i,
                              o->stage_threads[i]);
    if (o->n_tiers < 0 || o->n_tiers > RT_CLUSTER_MAX_TIERS)
        return bl_err_set(err, BL_EINVAL, "cluster: %d expert tiers (at most %d)", o->n_tiers, RT_CLUSTER_MAX_TIERS);
    for (int k = 0; k < o->n_tiers; k++)
        if (o->tier_device[k] < -1 || o->tier_device[k] > 255)
            return bl_err_set(err, BL_EINVAL, "cluster: tier %d's device %d is not -1 or a CUDA ordinal", k,
                              o->tier_device[k]);
    for (int l = 0; o->n_tiers && l < RT_CLUSTER_MAX_LAYERS; l++)
        if (o->tier_layers[l] > o->n_tiers || (o->tier_layers[l] && o->host_layers[l]))
            return bl_err_set(err, BL_EINVAL, "cluster: layer %d's tier %u of %d%s", l, o->tier_layers[l], o->n_tiers,
                              o->host_layers[l] ? ", and the hosttier's too" : "");
    for (int s = 0; o->n_tiers && s < o->n_workers && s < RT_CLUSTER_MAX_STAGES; s++)
        if (o->remote[s])
            return bl_err_set(err, BL_EINVAL, "cluster: expert tiers serve the stages of this host, and stage %d is "
                              "on another", s);
    for (int s = 0; s < o->n_workers && s < RT_CLUSTER_MAX_STAGES; s++)
        if (o->node_hosttier[s] > 1 || (o->node_hosttier[s] && !o->remote[s]) || o->node_hosttier_threads[s] < 0 ||
            o->node_hosttier_threads[s] > 256)
            return bl_err_set(err, BL_EINVAL, "cluster: stage %d's own hosttier (%u, %d threads) needs a stage on "
                              "another host and 0..256 threads", s, o->node_hosttier[s], o->node_hosttier_threads[s]);
    for (int l = 0; l < RT_CLUSTER_MAX_LAYERS; l++)
        if (o->host_layers[l] > 2)
            return bl_err_set(err, BL_EINVAL, "cluster: layer %d's host entry %u (0, 1 or 2)", l, o->host_layers[l]);
    if (o->n_slots < 1 || o->n_slots > 4096)
        return bl_err_set(err, BL_EINVAL, "cluster: n_slots %d is not in 1..4096", o->n_slots);
    if (o->n_ctx_slot < 1 || o->n_ctx_slot > (1 << 24))
        return bl_err_set(err, BL_EINVAL, "cluster: n_ctx_slot %lld is not in 1..2^24",
                          (long long)o->n_ctx_slot);
    if (o->kv_pool < 0 || o->kv_pool > (1 << 24) || (o->kv_pool && o->kv_pool < o->n_ctx_slot))
        return bl_err_set(err, BL_EINVAL, "cluster: kv_pool %lld is not 0 or n_ctx_slot..2^24",
                          (long long)o->kv_pool);
    if (o->n_batch < 1 || o->n_batch > 65536)
        return bl_err_set(err, BL_EINVAL, "cluster: n_batch %lld is not in 1..65536",
                          (long long)o->n_batch);
    if (o->kv_type != 0u && o->kv_type != 1u && o->kv_type != 8u)
        return bl_err_set(err, BL_EINVAL, "cluster: KV type %u is not f32, f16 or q8_0",
                          o->kv_type);
    if (o->step_timeout_ms < 0)
        return bl_err_set(err, BL_EINVAL, "cluster: step timeout %d ms is negative", o->step_timeout_ms);
    return 0;
}

static int find_program(char *out, size_t cap, const char *dir, const char *name, bl_err_t *err)
{
    if ((size_t)snprintf(out, cap, "%s/%s", dir, name) >= cap)
        return bl_err_set(err, BL_ERANGE, "cluster: path %s/%s is too long", dir, name);
    if (access(out, X_OK) != 0)
        return bl_err_set(err, BL_ENOENT, "cluster: %s: %s", out, strerror(errno));
    return 0;
}

/* The cluster's copies of the stages' node endpoints. */
static void free_remote(rt_cluster_t *c)
{
    for (int s = 0; s < RT_CLUSTER_MAX_STAGES; s++)
        free((char *)c->o.remote[s]); /* allocated by rt_cluster_create: const only to the caller */
}

int rt_cluster_create(rt_cluster_t **out, const rt_cluster_opts_t *opts, bl_err_t *err)
{
    *out = NULL;
    int rc = check_opts(opts, err);
    if (rc)
        return rc;
    rt_cluster_t *c = calloc(1, sizeof *c);
    if (!c)
        return bl_err_set(err, BL_ENOMEM, "cluster: out of memory");
    c->o = *opts;
    memset(c->o.remote, 0, sizeof c->o.remote); /* the copies below, or none */
    c->model_path = strdup(opts->model_path);
    c->bin_dir = strdup(opts->bin_dir);
    c->runtime_dir = strdup(opts->runtime_dir);
    if (!c->model_path || !c->bin_dir || !c->runtime_dir) {
        rc = bl_err_set(err, BL_ENOMEM, "cluster: out of memory");
        goto fail;
    }
    c->o.model_path = c->model_path;
    c->o.bin_dir = c->bin_dir;
    c->o.runtime_dir = c->runtime_dir;
    if (c->o.n_threads_batch < 1)
        c->o.n_threads_batch = c->o.n_threads;
    if ((rc = find_program(c->worker_bin, sizeof c->worker_bin, c->bin_dir, "bloomery-worker",
                           err)) ||
        (rc = read_model(c, err)))
        goto fail;
    if (c->n_layer > RT_CLUSTER_MAX_LAYERS) {
        rc = bl_err_set(err, BL_ENOTSUP, "cluster: %lld layers (at most %d)", (long long)c->n_layer,
                        RT_CLUSTER_MAX_LAYERS);
        goto fail;
    }
    if (c->o.n_workers > c->n_layer) {
        rc = bl_err_set(err, BL_EINVAL, "cluster: %d workers for %lld layers", c->o.n_workers,
                        (long long)c->n_layer);
        goto fail;
    }
    /* The hosttier runs where the plan put a layer's routed experts in host RAM; a
     * dense model has none to send. */
    c->has_hosttier = 0;
    for (int64_t l = 0; c->n_expert > 0 && l < c->n_layer && l < RT_CLUSTER_MAX_LAYERS; l++)
        c->has_hosttier |= c->o.host_layers[l] == 1;
    if (c->o.n_stage_ends) {
        int64_t prev = 0;
        for (int s = 0; s < c->o.n_workers; s++) {
            if (c->o.stage_end[s] <= prev || c->o.stage_end[s] > c->n_layer ||
                (s == c->o.n_workers - 1 && c->o.stage_end[s] != c->n_layer)) {
                rc = bl_err_set(err, BL_EINVAL, "cluster: stage %d ends at layer %lld, after %lld, of %lld", s,
                                (long long)c->o.stage_end[s], (long long)prev, (long long)c->n_layer);
                goto fail;
            }
            prev = c->o.stage_end[s];
        }
    }
    /* a layer of a stage with its own hosttier is that hosttier's (2), and only those */
    for (int64_t l = 0; l < c->n_layer; l++) {
        const int s = stage_of_layer(c, l);
        if (c->o.host_layers[l] && (c->o.host_layers[l] == 2) != (c->o.node_hosttier[s] != 0)) {
            rc = bl_err_set(err, BL_EINVAL, "cluster: layer %lld's host entry %u, and its stage %d %s", (long long)l,
                            c->o.host_layers[l], s, c->o.node_hosttier[s] ? "has a hosttier of its own" : "has none");
            goto fail;
        }
    }
    if (c->has_hosttier && (rc = find_program(c->hosttier_bin, sizeof c->hosttier_bin,
                                              c->bin_dir, "bloomery-hosttier", err)))
        goto fail;
    int any_remote = 0;
    for (int s = 0; s < c->o.n_workers && s < RT_CLUSTER_MAX_STAGES; s++) {
        if (!opts->remote[s])
            continue;
        any_remote = 1;
        if (!(c->o.remote[s] = strdup(opts->remote[s]))) {
            rc = bl_err_set(err, BL_ENOMEM, "cluster: out of memory");
            goto fail;
        }
    }
    if (any_remote && !opts->secret_path) {
        rc = bl_err_set(err, BL_EINVAL, "cluster: a stage on another host needs the cluster's secret file");
        goto fail;
    }
    c->o.secret_path = NULL;
    if (any_remote && (!(c->o.secret_path = c->secret_path = strdup(opts->secret_path)) ||
                       (rc = find_program(c->node_bin, sizeof c->node_bin, c->bin_dir, "bloomery-node", err)))) {
        if (!rc)
            rc = bl_err_set(err, BL_ENOMEM, "cluster: out of memory");
        goto fail;
    }
    /* Said once here: the workers say why a link they try stays off. */
    for (int s = 0; c->o.no_peer_copy && s + 1 < c->o.n_workers; s++)
        if (card_pair(c, s))
            BL_LOG(BL_LOG_INFO, "event=card_link_off link=%d reason=\"--no-peer-copy\"", s);
    if (mkdir(c->runtime_dir, 0700) != 0 && errno != EEXIST) {
        rc = bl_err_set(err, BL_EIO, "cluster: mkdir %s: %s", c->runtime_dir, strerror(errno));
        goto fail;
    }
    /* A name unique per process and cluster, so that tests may run several. */
    static _Atomic unsigned g_seq;
    char name[48];
    snprintf(name, sizeof name, "bloomery-%d-%u", (int)getpid(), atomic_fetch_add(&g_seq, 1));
    if ((rc = bp_chan_ipc_endpoint(c->endpoint, sizeof c->endpoint, c->runtime_dir, name, err)))
        goto fail;
    snprintf(c->sock_path, sizeof c->sock_path, "%s", c->endpoint + strlen("ipc://"));

    c->n_children = c->o.n_workers + (c->has_hosttier ? 1 : 0) + c->o.n_tiers;
    for (int i = 0; i < c->o.n_workers; i++) {
        snprintf(c->kids[i].name, sizeof c->kids[i].name, "worker %d", i);
        snprintf(c->kids[i].tag, sizeof c->kids[i].tag, "worker%d", i);
    }
    if (c->has_hosttier) {
        child_t *h = &c->kids[c->o.n_workers];
        snprintf(h->name, sizeof h->name, "hosttier");
        snprintf(h->tag, sizeof h->tag, "hosttier");
        h->hosttier = 1;
    }
    for (int t = 0; t < c->o.n_tiers; t++) {
        child_t *k = &c->kids[c->o.n_workers + c->has_hosttier + t];
        snprintf(k->name, sizeof k->name, "tier %d", t);
        snprintf(k->tag, sizeof k->tag, "tier%d", t);
        k->tier = t + 1;
    }
    /* Logits rows per step: one per slot for decode, a few more for a caller that wants
     * the last rows of a prompt; the ring is sized for this many. */
    int64_t n_out_max = c->o.n_slots < 8 ? 8 : c->o.n_slots;
    if (c->o.logit_rows > n_out_max) /* a verification step: a row for each proposal */
        n_out_max = c->o.logit_rows;
    if (n_out_max > c->o.n_batch)
        n_out_max = c->o.n_batch;
    c->lim = (bp_step_limits_t){.n_slots = c->o.n_slots, .n_batch = (int32_t)c->o.n_batch,
                                .n_ctx = c->o.n_ctx_slot, .n_out_max = (int32_t)n_out_max,
                                .n_embd = (int32_t)c->n_embd, .n_vocab = (int32_t)c->n_vocab,
                                .n_layer = (int32_t)c->n_layer, .n_expert = (int32_t)c->n_expert,
                                .n_expert_used = (int32_t)c->n_expert_used};
    c->logits = malloc((size_t)n_out_max * (size_t)c->n_vocab * sizeof(float));
    c->mtp_in = calloc((size_t)n_out_max, sizeof *c->mtp_in);
    c->mtp = calloc((size_t)n_out_max, sizeof *c->mtp);
    if (!c->logits || !c->mtp_in || !c->mtp) {
        rc = bl_err_set(err, BL_ENOMEM, "cluster: out of memory for logits");
        goto fail;
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->step_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    c->state = RT_CLUSTER_LOADING;
    atomic_store(&c->broken, 1);
    if (pthread_create(&c->sup, NULL, supervisor_main, c) != 0) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        pthread_mutex_destroy(&c->step_mu);
        rc = bl_err_set(err, BL_ENOMEM, "cluster: cannot start the supervisor thread");
        goto fail;
    }
    *out = c;
    return 0;
fail:
    free_files(c);
    free(c->logits);
    free(c->mtp_in);
    free(c->mtp);
    free(c->model_path);
    free(c->bin_dir);
    free(c->runtime_dir);
    free(c->secret_path);
    free_remote(c);
    free(c);
    return rc;
}

void rt_cluster_destroy(rt_cluster_t *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu); /* a supervisor holding a set asleep waits on cv */
    atomic_store(&c->stopping, 1);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->sup, NULL);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->step_mu);
    free_files(c);
    free(c->logits);
    free(c->mtp_in);
    free(c->mtp);
    free(c->model_path);
    free(c->bin_dir);
    free(c->runtime_dir);
    free(c->secret_path);
    free_remote(c);
    free(c);
}

rt_cluster_state_t rt_cluster_state(const rt_cluster_t *c)
{
    rt_cluster_t *m = (rt_cluster_t *)c; /* the lock is not part of the value */
    pthread_mutex_lock(&m->mu);
    rt_cluster_state_t s = m->state;
    pthread_mutex_unlock(&m->mu);
    return s;
}

void rt_cluster_sleep(rt_cluster_t *c)
{
    /* SLEEPING at once, so that no step starts on a set about to stop */
    pthread_mutex_lock(&c->mu);
    if (c->state == RT_CLUSTER_READY) {
        c->state = RT_CLUSTER_SLEEPING;
        atomic_store(&c->sleep_req, 1);
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
}

void rt_cluster_wake(rt_cluster_t *c)
{
    pthread_mutex_lock(&c->mu);
    c->wake_req = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

rt_cluster_state_t rt_cluster_wait(rt_cluster_t *c, int timeout_ms)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->mu);
    while (c->state != RT_CLUSTER_READY && c->state != RT_CLUSTER_FAILED &&
           c->state != RT_CLUSTER_STOPPED) {
        if (timeout_ms < 0)
            pthread_cond_wait(&c->cv, &c->mu);
        else if (pthread_cond_timedwait(&c->cv, &c->mu, &until) == ETIMEDOUT)
            break;
    }
    rt_cluster_state_t s = c->state;
    pthread_mutex_unlock(&c->mu);
    return s;
}

const char *rt_cluster_error(rt_cluster_t *c, char *buf, size_t cap)
{
    pthread_mutex_lock(&c->mu);
    snprintf(buf, cap, "%s", c->error);
    pthread_mutex_unlock(&c->mu);
    return buf;
}

int rt_cluster_down(rt_cluster_t *c, char *why, size_t cap)
{
    pthread_mutex_lock(&c->mu);
    const int down = c->state == RT_CLUSTER_RESTARTING && c->failed_restarts > 0;
    if (down)
        snprintf(why, cap, "the model's processes are restarting%s%s", c->error[0] ? ": " : "", c->error);
    pthread_mutex_unlock(&c->mu);
    return down;
}

int64_t rt_cluster_n_vocab(const rt_cluster_t *c)
{
    return c->n_vocab;
}

int64_t rt_cluster_n_embd(const rt_cluster_t *c)
{
    return c->n_embd;
}

int rt_cluster_child_stats(rt_cluster_t *c, rt_child_stats_t *out, int cap)
{
    int n = 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n_children && n < cap; i++)
        if (c->kids[i].stats.n > 0)
            out[n++] = c->kids[i].stats;
    pthread_mutex_unlock(&c->mu);
    return n;
}

void rt_cluster_kernels(rt_cluster_t *c, char *buf, size_t cap)
{
    size_t o = 0;
    if (cap)
        buf[0] = 0;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n_children && o < cap; i++) {
        const child_t *k = &c->kids[i];
        const int n = snprintf(buf + o, cap - o, "  %s: %s\n", k->tag, k->kernels[0] ? k->kernels : "?");
        o += n > 0 ? (size_t)n : 0;
    }
    pthread_mutex_unlock(&c->mu);
}

void rt_cluster_get_stats(const rt_cluster_t *c, rt_cluster_stats_t *out)
{
    rt_cluster_t *m = (rt_cluster_t *)c; /* atomics are read, not changed */
    out->starts = atomic_load(&m->starts);
    out->child_deaths = atomic_load(&m->child_deaths);
    out->steps = atomic_load(&m->steps);
    out->rows = atomic_load(&m->rows);
}

/* ------------------------------------------------------------ steps */

/* The checks the workers would make anyway, made here so that a step that cannot run
 * never reaches them (and leaves every cache as it was). */
static int check_step(const rt_cluster_t *c, const rt_step_seq_t *seqs, int n_seqs,
                      int32_t *rows, int32_t *outs, bl_err_t *err)
{
    if (n_seqs < 1 || n_seqs > c->o.n_slots)
        return bl_err_set(err, BL_EINVAL, "step: %d sequences, the plan has %d slots", n_seqs,
                          c->o.n_slots);
    int64_t r = 0, o = 0;
    for (int i = 0; i < n_seqs; i++) {
        const rt_step_seq_t *s = &seqs[i];
        if (s->slot < 0 || s->slot >= c->o.n_slots)
            return bl_err_set(err, BL_EINVAL, "step: sequence %d: slot %d is not in 0..%d", i,
                              s->slot, c->o.n_slots - 1);
        for (int j = 0; j < i; j++)
            if (seqs[j].slot == s->slot)
                return bl_err_set(err, BL_EINVAL, "step: sequences %d and %d share slot %d", j,
                                  i, s->slot);
        if (s->n < 1 || !s->tokens)
            return bl_err_set(err, BL_EINVAL, "step: sequence %d has no rows", i);
        if (s->n_out < 0 || s->n_out > s->n)
            return bl_err_set(err, BL_EINVAL, "step: sequence %d: n_out %d is not in 0..%d", i,
                              s->n_out, s->n);
        if (s->pos < 0 || s->pos > c->o.n_ctx_slot - s->n)
            return bl_err_set(err, BL_ERANGE, "step: sequence %d: positions %lld..%lld exceed "
                              "the slot's context of %lld", i, (long long)s->pos,
                              (long long)s->pos + s->n, (long long)c->o.n_ctx_slot);
        for (int32_t t = 0; t < s->n; t++)
            if (s->tokens[t] < 0 || s->tokens[t] >= c->n_vocab)
                return bl_err_set(err, BL_EINVAL, "step: sequence %d: token %d at row %d is not "
                                  "in the vocabulary of %lld", i, s->tokens[t], t,
                                  (long long)c->n_vocab);
        r += s->n;
        o += s->n_out;
    }
    if (r > c->o.n_batch)
        return bl_err_set(err, BL_ERANGE, "step: %lld rows exceed the batch of %lld", (long long)r,
                          (long long)c->o.n_batch);
    if (o > c->lim.n_out_max)
        return bl_err_set(err, BL_ERANGE, "step: %lld logits rows exceed the %d a step returns",
                          (long long)o, c->lim.n_out_max);
    *rows = (int32_t)r;
    *outs = (int32_t)o;
    return 0;
}

/* The reason a step ends because the set went away. */
static int closed(rt_cluster_t *c, bl_err_t *err)
{
    pthread_mutex_lock(&c->mu);
    c->pending_closed = 0;
    int rc = bl_err_set(err, BL_ECLOSED, "%s",
                        atomic_load(&c->stopping) ? "the cluster is stopping"
                        : c->error[0]             ? c->error
                                                  : "the engine's processes are restarting");
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* A step that got no answer within o.step_timeout_ms: the processes are taken for
 * hung (alive but stuck: a deadlock, a stopped process, a wedged device); the
 * supervisor restarts the whole set, which ends them (Shutdown, then SIGKILL). */
static int hung(rt_cluster_t *c, uint64_t step, bl_err_t *err)
{
    char why[160];
    snprintf(why, sizeof why, "step %llu: no answer from the engine's processes in %.1f s; they restart",
             (unsigned long long)step, c->o.step_timeout_ms / 1000.0);
    BL_LOG(BL_LOG_ERROR, "event=step_timeout step=%llu timeout_ms=%d", (unsigned long long)step,
           c->o.step_timeout_ms);
    mark_broken(c, why); /* /health says restarting at once, and the engine hears it here */
    atomic_store(&c->restart_req, 1);
    return closed(c, err);
}

/* Whether a message may go down the pipeline now. reads_cache: it continues what
 * a slot's cache holds. */
static int pipe_ready(rt_cluster_t *c, int reads_cache, bl_err_t *err)
{
    /* A step that reads no cache (every sequence starts at 0) is as good on a new
     * set as on the old one; only one that continues a sequence learns, once, that
     * the caches are gone. So a death while idle does not fail the next request. */
    pthread_mutex_lock(&c->mu);
    rt_cluster_state_t st = c->state;
    int pending = c->pending_closed;
    if (pending && !reads_cache && st == RT_CLUSTER_READY && !atomic_load(&c->broken))
        c->pending_closed = pending = 0;
    pthread_mutex_unlock(&c->mu);
    if ((pending && reads_cache) || atomic_load(&c->stopping))
        return closed(c, err);
    if (st != RT_CLUSTER_READY || atomic_load(&c->broken))
        return bl_err_set(err, BL_EAGAIN, "step: the engine's processes are %s",
                          st == RT_CLUSTER_LOADING ? "loading"
                          : st == RT_CLUSTER_FAILED ? "failed"
                          : st == RT_CLUSTER_STOPPED ? "stopped" : "restarting");
    return 0;
}

/* Room for a message with header h on the first stage's ring, waiting while the
 * pipeline is full. */
static int pipe_reserve(rt_cluster_t *c, const bp_step_hdr_t *h, bp_step_out_t *o, int64_t deadline,
                        bl_err_t *err)
{
    int rc;
    while ((rc = bp_step_reserve(c->to_first, h, o, POLL_US, err)) == BL_ETIMEDOUT) {
        if (atomic_load(&c->broken))
            return closed(c, err);
        if (deadline && now_ms() > deadline)
            return hung(c, h->step, err);
    }
    return rc == BL_ECLOSED ? closed(c, err) : rc;
}

/* The last stage's answer to step, parsed into in (release the ring after); an
 * ERROR it carries becomes the return code with its text. */
static int pipe_answer(rt_cluster_t *c, uint64_t step, int64_t deadline, bp_step_in_t *in, bl_err_t *err)
{
    const void *msg;
    size_t nbytes;
    int rc;
    while ((rc = bp_ring_peek(c->from_last, &msg, &nbytes, POLL_US, err)) == BL_ETIMEDOUT) {
        if (atomic_load(&c->broken) || atomic_load(&c->stopping))
            return closed(c, err);
        if (deadline && now_ms() > deadline)
            return hung(c, step, err);
    }
    if (rc == BL_ECLOSED)
        return closed(c, err);
    if (rc) { /* the ring is corrupt: only a new set helps */
        atomic_store(&c->restart_req, 1);
        return rc;
    }
    rc = bp_step_parse(msg, nbytes, &c->lim, BP_STEP_LOGITS, step, in, err);
    if (rc == 0 && in->hdr.kind == BP_STEP_ERROR)
        rc = bl_err_set(err, in->hdr.code, "%.*s", (int)in->hdr.text_len, in->text);
    if (rc)
        bp_ring_release(c->from_last);
    if (rc == BL_EPROTO)
        atomic_store(&c->restart_req, 1);
    return rc;
}

/* Sends a step down the pipeline; its answer is the last of the steps in flight. */
static int send_locked(rt_cluster_t *c, const rt_step_seq_t *seqs, int n_seqs, int32_t n_rows, int32_t n_out,
                       bl_err_t *err)
{
    if (c->fl_n == RT_CLUSTER_MAX_INFLIGHT)
        return bl_err_set(err, BL_EINVAL, "step: %d steps in flight already", c->fl_n);
    int reads_cache = 0;
    for (int i = 0; i < n_seqs; i++)
        reads_cache |= seqs[i].pos > 0;
    int rc = pipe_ready(c, reads_cache, err);
    if (rc)
        return rc;
    uint64_t step = ++c->step_no;
    bp_step_hdr_t h = {.kind = BP_STEP_TOKENS, .step = step, .n_seqs = n_seqs, .n_rows = n_rows};
    bp_step_out_t o;
    const int64_t deadline = c->o.step_timeout_ms > 0 ? now_ms() + c->o.step_timeout_ms : 0;
    if ((rc = pipe_reserve(c, &h, &o, deadline, err)) != 0)
        return rc;
    int32_t row = 0;
    for (int i = 0; i < n_seqs; i++) {
        o.seqs[i] = (bp_step_seq_t){.slot = seqs[i].slot, .n = seqs[i].n, .pos = seqs[i].pos,
                                    .n_out = seqs[i].n_out};
        memcpy(o.tokens + row, seqs[i].tokens, (size_t)seqs[i].n * sizeof(int32_t));
        row += seqs[i].n;
    }
    if ((rc = bp_ring_commit(c->to_first, o.nbytes, err)) != 0)
        return rc;
    const int at = (c->fl_head + c->fl_n) % RT_CLUSTER_MAX_INFLIGHT;
    c->fl[at].step = step;
    c->fl[at].n_out = n_out;
    c->fl[at].deadline = deadline;
    c->fl_n++;
    return 0;
}

/* The answer of the oldest step in flight: copied out of the ring (view 0), or left
 * there for rt_cluster_view_end (view 1; *logits points into the message). On an
 * error every step in flight is gone with it (the set restarts or is dead). */
static int recv_locked(rt_cluster_t *c, const float **logits, int view, bl_err_t *err)
{
    if (c->fl_n == 0)
        return bl_err_set(err, BL_EINVAL, "step: no step in flight to wait for");
    const uint64_t step = c->fl[c->fl_head].step;
    const int32_t n_out = c->fl[c->fl_head].n_out;
    const int64_t deadline = c->fl[c->fl_head].deadline;
    c->fl_head = (c->fl_head + 1) % RT_CLUSTER_MAX_INFLIGHT;
    c->fl_n--;
    bp_step_in_t in = {.mtp = c->mtp_in};
    int rc = pipe_answer(c, step, deadline, &in, err);
    if (rc == 0 && (in.hdr.kind != BP_STEP_LOGITS || in.hdr.n_rows != n_out || in.hdr.k != (c->o.mtp ? 1 : 0))) {
        rc = bl_err_set(err, BL_EPROTO, "step %llu: %s of %d rows%s from the last stage, %d logits rows%s asked",
                        (unsigned long long)step, bp_step_kind_name(in.hdr.kind), in.hdr.n_rows,
                        in.hdr.k ? " with NextN proposals" : "", n_out, c->o.mtp ? " with NextN proposals" : "");
        atomic_store(&c->restart_req, 1);
        bp_ring_release(c->from_last);
    } else if (rc == 0) {
        for (int32_t i = 0; c->o.mtp && i < n_out; i++)
            c->mtp[i] = (rt_mtp_t){.in = c->mtp_in[i].in, .tok = c->mtp_in[i].tok, .p = c->mtp_in[i].p};
        if (view) {
            c->view = in.rows;
            c->view_rows = n_out;
            *logits = in.rows;
        } else {
            memcpy(c->logits, in.rows, (size_t)n_out * (size_t)c->n_vocab * sizeof(float));
            *logits = c->logits;
            bp_ring_release(c->from_last);
        }
    }
    if (rc)
        c->fl_n = c->fl_head = 0;
    return rc;
}

const rt_mtp_t *rt_cluster_mtp(const rt_cluster_t *c) { return c->o.mtp ? c->mtp : NULL; }

_Static_assert(RT_KV_MAX_OPS == BP_STEP_MAX_KVOPS, "one bound for KV ops");
_Static_assert(RT_KV_CHUNK == BP_KV_CHUNK, "the engine counts a shared cache's chunks as the "
                                          "stages do");
_Static_assert((int)RT_KV_SAVE == (int)BP_KV_SAVE && (int)RT_KV_LOAD == (int)BP_KV_LOAD &&
                   (int)RT_KV_DROP == (int)BP_KV_DROP && (int)RT_KV_CLEAR == (int)BP_KV_CLEAR &&
                   (int)RT_KV_WRITE == (int)BP_KV_WRITE && (int)RT_KV_READ == (int)BP_KV_READ &&
                   (int)RT_KV_PERSIST == (int)BP_KV_PERSIST && (int)RT_KV_FETCH == (int)BP_KV_FETCH &&
                   (int)RT_KV_CKPT == (int)BP_KV_CKPT && (int)RT_KV_ROLLBACK == (int)BP_KV_ROLLBACK,
               "the engine's KV op codes are the wire's");

int rt_cluster_kv(rt_cluster_t *c, rt_kv_op_t *ops, int n_ops, bl_err_t *err)
{
    if (n_ops < 1 || n_ops > BP_STEP_MAX_KVOPS)
        return bl_err_set(err, BL_EINVAL, "kv: %d ops (1..%d)", n_ops, BP_STEP_MAX_KVOPS);
    for (int i = 0; i < n_ops; i++)
        if ((ops[i].op < RT_KV_SAVE || ops[i].op > RT_KV_ROLLBACK) ||
            (ops[i].op != BP_KV_DROP && ops[i].op != BP_KV_PERSIST &&
             (ops[i].slot < 0 || ops[i].slot >= c->lim.n_slots)) ||
            ((ops[i].op == BP_KV_PERSIST || ops[i].op == BP_KV_FETCH) && !c->o.cache_dir) ||
            (ops[i].op != BP_KV_DROP && ops[i].op != BP_KV_CLEAR &&
             (ops[i].n < 1 || ops[i].n > c->lim.n_ctx)) ||
            ops[i].entry < 0 || ((ops[i].op == BP_KV_WRITE || ops[i].op == BP_KV_READ) &&
                                 (ops[i].bytes < 0 || !c->o.slot_dir)))
            return bl_err_set(err, BL_EINVAL, "kv: op %d (slot %d, %lld positions) is outside the plan", i,
                              ops[i].slot, (long long)ops[i].n);
    pthread_mutex_lock(&c->step_mu);
    if (c->fl_n > 0) { /* its answer would come after theirs */
        pthread_mutex_unlock(&c->step_mu);
        return bl_err_set(err, BL_EINVAL, "kv: %d steps in flight (wait for their answers first)", c->fl_n);
    }
    int reads_cache = 0;
    for (int i = 0; i < n_ops; i++)
        reads_cache |= ops[i].op == BP_KV_SAVE || ops[i].op == BP_KV_CKPT;
    int rc = pipe_ready(c, reads_cache, err);
    uint64_t step = 0;
    const int64_t deadline = c->o.step_timeout_ms > 0 ? now_ms() + c->o.step_timeout_ms : 0;
    bp_step_out_t o;
    if (rc == 0) {
        step = ++c->step_no;
        bp_step_hdr_t h = {.kind = BP_STEP_KV, .step = step, .n_seqs = n_ops};
        rc = pipe_reserve(c, &h, &o, deadline, err);
    }
    if (rc == 0) {
        for (int i = 0; i < n_ops; i++)
            o.kvops[i] = (bp_step_kvop_t){.op = ops[i].op,
                                          .slot = ops[i].op == BP_KV_DROP || ops[i].op == BP_KV_PERSIST
                                                      ? 0 : ops[i].slot,
                                          .entry = ops[i].op == BP_KV_CLEAR ? 0 : ops[i].entry,
                                          .n = ops[i].op == BP_KV_DROP || ops[i].op == BP_KV_CLEAR
                                                   ? 0 : ops[i].n,
                                          .bytes = ops[i].op == BP_KV_WRITE || ops[i].op == BP_KV_READ
                                                       ? ops[i].bytes : 0};
        rc = bp_ring_commit(c->to_first, o.nbytes, err);
    }
    bp_step_kvop_t back[BP_STEP_MAX_KVOPS];
    bp_step_in_t in = {.kvops = back};
    if (rc == 0 && (rc = pipe_answer(c, step, deadline, &in, err)) == 0) {
        if (in.hdr.kind != BP_STEP_KV || in.hdr.n_seqs != n_ops) {
            rc = bl_err_set(err, BL_EPROTO, "kv %llu: %s from the last stage, not the %d ops sent",
                            (unsigned long long)step, bp_step_kind_name(in.hdr.kind), n_ops);
            atomic_store(&c->restart_req, 1);
        } else {
            for (int i = 0; i < n_ops; i++)
                ops[i].bytes = back[i].bytes;
        }
        bp_ring_release(c->from_last);
    }
    pthread_mutex_unlock(&c->step_mu);
    return rc;
}

int rt_cluster_kv_io_path(const rt_cluster_t *c, int64_t entry, char *out, size_t cap,
                          bl_err_t *err)
{
    if (!c->o.slot_dir)
        return bl_err_set(err, BL_EINVAL, "no folder for slot files");
    int n = snprintf(out, cap, BP_KV_IO_FMT, c->o.slot_dir, (long long)entry);
    if (n < 0 || (size_t)n >= cap)
        return bl_err_set(err, BL_EINVAL, "the slot files' folder's path is too long");
    return 0;
}

/* rt_cluster_step, and with view rt_cluster_step_view (step_mu stays held on success). */
static int step_answer(rt_cluster_t *c, const rt_step_seq_t *seqs, int n_seqs, const float **logits, int view,
                       bl_err_t *err)
{
    *logits = NULL;
    int32_t n_rows = 0, n_out = 0;
    int rc = check_step(c, seqs, n_seqs, &n_rows, &n_out, err);
    if (rc)
        return rc;
    pthread_mutex_lock(&c->step_mu);
    if (c->fl_n > 0)
        rc = bl_err_set(err, BL_EINVAL, "step: %d steps in flight (wait for their answers first)", c->fl_n);
    else if ((rc = send_locked(c, seqs, n_seqs, n_rows, n_out, err)) == 0)
        rc = recv_locked(c, logits, view, err);
    if (rc || !view)
        pthread_mutex_unlock(&c->step_mu);
    if (rc == 0) {
        atomic_fetch_add_explicit(&c->steps, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&c->rows, (uint64_t)n_rows, memory_order_relaxed);
    }
    return rc;
}

int rt_cluster_step_send(rt_cluster_t *c, const rt_step_seq_t *seqs, int n_seqs, bl_err_t *err)
{
    int32_t n_rows = 0, n_out = 0;
    int rc = check_step(c, seqs, n_seqs, &n_rows, &n_out, err);
    if (rc)
        return rc;
    pthread_mutex_lock(&c->step_mu);
    rc = send_locked(c, seqs, n_seqs, n_rows, n_out, err);
    if (rc && rc != BL_EINVAL && rc != BL_EAGAIN)
        c->fl_n = c->fl_head = 0; /* the set is going: so are the steps before this one */
    pthread_mutex_unlock(&c->step_mu);
    if (rc == 0) {
        atomic_fetch_add_explicit(&c->steps, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&c->rows, (uint64_t)n_rows, memory_order_relaxed);
    }
    return rc;
}

int rt_cluster_step(rt_cluster_t *c, const rt_step_seq_t *seqs, int n_seqs, const float **logits,
                    bl_err_t *err)
{
    return step_answer(c, seqs, n_seqs, logits, 0, err);
}

int rt_cluster_step_view(rt_cluster_t *c, const rt_step_seq_t *seqs, int n_seqs, const float **view,
                         bl_err_t *err)
{
    return step_answer(c, seqs, n_seqs, view, 1, err);
}

static int recv_answer(rt_cluster_t *c, const float **logits, int view, bl_err_t *err)
{
    *logits = NULL;
    pthread_mutex_lock(&c->step_mu);
    int rc = recv_locked(c, logits, view, err);
    if (rc || !view)
        pthread_mutex_unlock(&c->step_mu);
    return rc;
}

int rt_cluster_step_recv(rt_cluster_t *c, const float **logits, bl_err_t *err)
{
    return recv_answer(c, logits, 0, err);
}

int rt_cluster_step_recv_view(rt_cluster_t *c, const float **view, bl_err_t *err)
{
    return recv_answer(c, view, 1, err);
}

const float *rt_cluster_view_end(rt_cluster_t *c, int keep)
{
    const float *out = NULL;
    if (c->view) {
        if (keep) {
            memcpy(c->logits, c->view, (size_t)c->view_rows * (size_t)c->n_vocab * sizeof(float));
            out = c->logits;
        }
        bp_ring_release(c->from_last);
        c->view = NULL;
        c->view_rows = 0;
    }
    pthread_mutex_unlock(&c->step_mu);
    return out;
}

int rt_cluster_in_flight(rt_cluster_t *c)
{
    pthread_mutex_lock(&c->step_mu);
    int n = c->fl_n;
    pthread_mutex_unlock(&c->step_mu);
    return n;
}

void rt_cluster_forget_in_flight(rt_cluster_t *c)
{
    pthread_mutex_lock(&c->step_mu);
    c->fl_n = c->fl_head = 0;
    pthread_mutex_unlock(&c->step_mu);
}

/* --- the devices ------------------------------------------------------------------ */

int rt_cluster_devices(const char *bin_dir, bl_device_t *out, int cap, int *n, bl_err_t *err)
{
    *n = 0;
    char bin[PATH_MAX];
    const int rc = find_program(bin, sizeof bin, bin_dir, "bloomery-worker", err);
    return rc ? rc : bp_list_devices(bin, out, cap, n, err);
}
