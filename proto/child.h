/* The control plane as a child process sees it (bloomery-worker, bloomery-hosttier):
 * connect a DEALER to the router's control socket, say Hello, wait for the Plan,
 * report load progress, Ready, Stats and fatal errors, and serve Shutdown and Stats
 * requests until told to stop or the router is gone.
 *
 * Thread: the child's control thread owns a bp_child_t (its ZeroMQ socket); the
 * stop flag given to bp_child_control_loop may be set by any thread. */
#ifndef BP_CHILD_H
#define BP_CHILD_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"
#include "msg.h"
#include "plan.h"

typedef struct bp_chan bp_chan_t;

typedef struct bp_child {
    bp_chan_t *chan;
    pid_t parent;     /* the router */
    uint32_t process; /* this process's id in the plan, once known */
    char label[32];   /* "worker 0", "hosttier": starts every error text */
    uint64_t t0_us;   /* start, for Stats.uptime */
    uint64_t progress_us; /* the last LoadProgress sent */
    const char *copy_stage; /* bp_child_copy_progress's stage name ("weights") */
    uint64_t copy_total;    /* the bytes the load's copy reported (0: it copied none) */
} bp_child_t;

typedef enum bp_child_kind {
    BP_CHILD_WORKER = 1,
    BP_CHILD_HOSTTIER = 2,
} bp_child_kind_t;

typedef struct bp_counter {
    const char *name;
    uint64_t value;
} bp_counter_t;

/* Starts argv[0] (a path) with argv, this process's environment, and fds[0..n_fds)
 * at BP_STEP_FD_IN + i (proto/step.h) and no other descriptor above them: the sources
 * are first duplicated above every target, so that no dup2 overwrites one still
 * needed. Default signal actions and an empty mask, whatever the caller's threads
 * had; new_pgroup: its own process group (a Ctrl-C at the terminal then reaches the
 * parent only, which stops its children in order). what names the child in errors.
 * BL_ENOENT (no such program), BL_EIO. */
int bp_spawn(pid_t *pid, char *const argv[], const int *fds, int n_fds, int new_pgroup, const char *what,
             bl_err_t *err) BL_WUR;

/* This host's CUDA devices as bin (a bloomery-worker) reports them: runs `bin
 * --list-devices` and reads its lines, "cuda INDEX TOTAL FREE NAME", into out (at most
 * cap; 30 s). Names are cut to bl_device_t's field, bytes outside printable ASCII as '?'.
 * A worker built without CUDA, or a host without a GPU, gives none. BL_EPROTO (a line
 * that does not parse, quoted), BL_ETIMEDOUT, BL_EIO (it cannot start or fails). The
 * one reader of that listing: the router's plan and a node's answer to a probe. */
int bp_list_devices(const char *bin, bl_device_t *out, int cap, int *n, bl_err_t *err) BL_WUR;

/* Monotonic microseconds. */
uint64_t bp_now_us(void);

/* Asks to be killed with the router (PR_SET_PDEATHSIG), checks the router is still
 * the parent, and connects to endpoint as identity. BL_ECLOSED (the router is gone),
 * the channel's errors. Undo with bp_child_stop (also after a failure). */
int bp_child_start(bp_child_t *c, const char *endpoint, const char *identity, pid_t parent,
                   const char *label, bl_err_t *err) BL_WUR;
void bp_child_stop(bp_child_t *c);

/* Whether the router is gone (we were re-parented). */
int bp_child_parent_gone(const bp_child_t *c);

/* Sends m; a failure is logged and returned (the callers' messages are best effort:
 * a lost one shows in the router as a timeout or a gap in its stats). */
int bp_child_send(bp_child_t *c, const bp_msg_t *m);

/* Hello with this host's CPU or RAM as the device inventory. */
void bp_child_hello(bp_child_t *c, bp_child_kind_t kind, const char *device_name);

/* A CUDA device for the Hello inventory (plain C: the protobuf types stay in proto/). */
typedef struct bp_gpu {
    const char *name;      /* "NVIDIA H200"; borrowed for the call */
    uint64_t memory_bytes;
    uint32_t cc_major, cc_minor;
    uint32_t sms;
    int32_t index;         /* the CUDA ordinal */
} bp_gpu_t;

/* bp_child_hello with the host's CUDA devices listed after the CPU (at most 64). */
void bp_child_hello_gpus(bp_child_t *c, bp_child_kind_t kind, const char *cpu_name,
                         const bp_gpu_t *gpus, int n_gpus);

/* Waits for the Plan (*plan freed by the caller with bp_msg_free, also on failure).
 * BL_ECLOSED on Shutdown or when the router is gone; malformed messages are logged
 * and skipped. */
int bp_child_recv_plan(bp_child_t *c, bp_msg_t *plan, bl_err_t *err) BL_WUR;

/* Sends a CardLink offer or answer (proto/cardlink.h) to the router, which relays it
 * to the link's other end. BL_EINVAL (an invalid message, named), bp_child_send's. */
int bp_child_send_card(bp_child_t *c, const bp_card_msg_t *cm, bl_err_t *err) BL_WUR;
/* Waits for the next CardLink message the router relays into *hold (freed by the
 * caller with bp_msg_free, also on failure) and reads it into *out (its reason points
 * into *hold). BL_ECLOSED on Shutdown or when the router is gone; other messages
 * meanwhile are logged and dropped (a Stats request waits for Ready: the router
 * asks only ready children). */
int bp_child_recv_card(bp_child_t *c, bp_msg_t *hold, bp_card_msg_t *out, bl_err_t *err) BL_WUR;

/* Sends a LoadProgress: the first and the last of a stage (done 0, done == total)
 * always, the others at most every BP_CHILD_PROGRESS_US, so that a loop may call it
 * for every chunk it moves. */
void bp_child_progress(bp_child_t *c, uint64_t done, uint64_t total, const char *stage);
#define BP_CHILD_PROGRESS_US 250000
/* A load's copy progress, as a callback (ud: the bp_child_t): sent under c->copy_stage;
 * a total of 0 (nothing copied: a card stage's host copy, a mapping kept) says
 * nothing. bp_child_copy_done sends the stage's last report: the copy's total, or
 * other_total (the file a mapping reads) when nothing was copied. */
void bp_child_copy_progress(void *ud, uint64_t done, uint64_t total);
void bp_child_copy_done(bp_child_t *c, uint64_t other_total);
/* Ready: the model facts the router checks (those of the file the process loaded:
 * a plan that named another file shows there), and the kernels this process runs
 * ("CPU avx512", "CUDA0 NVIDIA H200 (sm_90)"; cut at BP_MSG_MAX_KERNELS). */
void bp_child_ready(bp_child_t *c, uint64_t n_vocab, uint64_t n_embd, uint64_t n_layer, const char *kernels);
/* Logs e and sends it as a fatal Error, "<label>: <message>". */
void bp_child_fatal(bp_child_t *c, const bl_err_t *e);

/* Serves the router until *stop is set, Shutdown arrives (which sets *stop) or the
 * router is gone (which sets it too): Stats requests are answered with the counters
 * stats(ud, out, cap) fills (it returns how many; cap is BP_CHILD_MAX_COUNTERS, which
 * holds a worker's per-layer counters of a 94-layer model with room). */
#define BP_CHILD_MAX_COUNTERS 256
typedef int (*bp_child_stats_fn)(void *ud, bp_counter_t *out, int cap);
void bp_child_control_loop(bp_child_t *c, _Atomic int *stop, bp_child_stats_fn stats, void *ud);

#endif
