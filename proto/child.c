/* The child side of the control plane (proto/child.h). */
#include "child.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bl_config.h"
#include "bloomery.pb-c.h"
#include "chan.h"
#include "log.h"
#include "step.h"

extern char **environ;

/* How long one wait on the control socket lasts before the router's liveness and
 * the stop flag are checked again. */
#define POLL_MS 100
#define MAX_COUNTERS BP_CHILD_MAX_COUNTERS

uint64_t bp_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

int bp_child_parent_gone(const bp_child_t *c)
{
    /* PR_SET_PDEATHSIG covers the router's death after the prctl; this covers a
     * death before it (we were re-parented). */
    return getppid() != c->parent;
}

int bp_child_start(bp_child_t *c, const char *endpoint, const char *identity, pid_t parent,
                   const char *label, bl_err_t *err)
{
    memset(c, 0, sizeof *c);
    c->parent = parent;
    c->t0_us = bp_now_us();
    snprintf(c->label, sizeof c->label, "%s", label);
    (void)prctl(PR_SET_PDEATHSIG, SIGKILL); /* best effort; bp_child_parent_gone polls too */
    if (bp_child_parent_gone(c))
        return bl_err_set(err, BL_ECLOSED, "the router (pid %d) is gone", (int)parent);
    return bp_chan_connect(&c->chan, BP_CHAN_DEALER, endpoint, identity, err);
}

void bp_child_stop(bp_child_t *c)
{
    bp_chan_destroy(c->chan);
    c->chan = NULL;
}

int bp_child_send(bp_child_t *c, const bp_msg_t *m)
{
    if (!c->chan)
        return BL_ECLOSED;
    bl_err_t err = {0};
    int rc = bp_chan_send(c->chan, NULL, m, 2000, &err);
    if (rc)
        BL_LOG(BL_LOG_WARN, "event=control_send_failed type=%s reason=\"%s\"",
               bp_msg_type_name(m->type), err.msg);
    return rc;
}

void bp_child_hello(bp_child_t *c, bp_child_kind_t kind, const char *device_name)
{
    bp_child_hello_gpus(c, kind, device_name, NULL, 0);
}

void bp_child_hello_gpus(bp_child_t *c, bp_child_kind_t kind, const char *cpu_name,
                         const bp_gpu_t *gpus, int n_gpus)
{
    char host[64] = "localhost";
    (void)gethostname(host, sizeof host - 1); /* a label only */
    enum { MAX_GPUS = 64 };
    if (n_gpus < 0 || !gpus)
        n_gpus = 0;
    if (n_gpus > MAX_GPUS)
        n_gpus = MAX_GPUS;
    Bloomery__Device dev[1 + MAX_GPUS];
    Bloomery__Device *devs[1 + MAX_GPUS];
    bloomery__device__init(&dev[0]);
    dev[0].kind = BLOOMERY__DEVICE_KIND__DEVICE_KIND_CPU;
    dev[0].name = (char *)cpu_name;
    dev[0].memory_bytes = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    dev[0].cores = (uint32_t)sysconf(_SC_NPROCESSORS_ONLN);
    dev[0].index = -1;
    devs[0] = &dev[0];
    for (int i = 0; i < n_gpus; i++) {
        Bloomery__Device *d = &dev[1 + i];
        bloomery__device__init(d);
        d->kind = BLOOMERY__DEVICE_KIND__DEVICE_KIND_CUDA;
        d->name = (char *)gpus[i].name;
        d->memory_bytes = gpus[i].memory_bytes;
        d->cc_major = gpus[i].cc_major;
        d->cc_minor = gpus[i].cc_minor;
        d->cores = gpus[i].sms;
        d->index = gpus[i].index;
        devs[1 + i] = d;
    }
    Bloomery__Hello h;
    bloomery__hello__init(&h);
    h.kind = kind == BP_CHILD_HOSTTIER ? BLOOMERY__PROCESS_KIND__PROCESS_KIND_HOSTTIER
                                       : BLOOMERY__PROCESS_KIND__PROCESS_KIND_WORKER;
    h.pid = (uint32_t)getpid();
    h.version = (char *)BL_VERSION;
    h.host = host;
    h.devices = devs;
    h.n_devices = 1 + (size_t)n_gpus;
    h.protocol = BP_PROTOCOL_VERSION;
    const bp_msg_t m = {.type = BP_MSG_HELLO, .u.hello = &h};
    (void)bp_child_send(c, &m); /* a lost Hello shows as a load timeout in the router */
}

/* Waits for a message of type; what else arrives is dropped (Shutdown ends the wait). */
static int recv_type(bp_child_t *c, bp_msg_type_t type, bp_msg_t *out, bl_err_t *err)
{
    for (;;) {
        if (bp_child_parent_gone(c))
            return bl_err_set(err, BL_ECLOSED, "the router is gone");
        bp_msg_t m = {0};
        int rc = bp_chan_recv(c->chan, NULL, &m, POLL_MS, err);
        if (rc == 0 && m.type == type) {
            *out = m;
            return 0;
        }
        if (rc && rc != BL_ETIMEDOUT)
            BL_LOG(BL_LOG_WARN, "event=bad_control_message reason=\"%s\"", err->msg);
        const int shutdown = rc == 0 && m.type == BP_MSG_SHUTDOWN;
        if (rc == 0 && !shutdown)
            BL_LOG(BL_LOG_DEBUG, "event=control_message_dropped type=%s waiting_for=%s",
                   bp_msg_type_name((int)m.type), bp_msg_type_name((int)type));
        bp_msg_free(&m);
        if (shutdown)
            return bl_err_set(err, BL_ECLOSED, "shutdown while waiting for the %s", bp_msg_type_name((int)type));
    }
}

int bp_child_recv_plan(bp_child_t *c, bp_msg_t *plan, bl_err_t *err)
{
    return recv_type(c, BP_MSG_PLAN, plan, err);
}

int bp_child_send_card(bp_child_t *c, const bp_card_msg_t *cm, bl_err_t *err)
{
    if (cm->n_bufs < 0 || cm->n_bufs > BP_CARD_MAX_BUFS)
        return bl_err_set(err, BL_EINVAL, "card link %u: %d buffers", cm->link, cm->n_bufs);
    ProtobufCBinaryData mem[BP_CARD_MAX_BUFS], ev[BP_CARD_MAX_BUFS];
    for (int i = 0; i < cm->n_bufs; i++) {
        mem[i] = (ProtobufCBinaryData){BP_CARD_HANDLE_BYTES, (uint8_t *)cm->mem[i]};
        ev[i] = (ProtobufCBinaryData){BP_CARD_HANDLE_BYTES, (uint8_t *)cm->ev[i]};
    }
    Bloomery__CardLink cl;
    bloomery__card_link__init(&cl);
    cl.link = cm->link;
    cl.answer = cm->answer != 0;
    cl.ok = cm->ok != 0;
    cl.reason = (char *)(cm->reason ? cm->reason : "");
    cl.device = cm->device;
    cl.buf_bytes = cm->buf_bytes;
    cl.buffers = mem;
    cl.n_buffers = (size_t)cm->n_bufs;
    cl.events = ev;
    cl.n_events = (size_t)cm->n_bufs;
    const bp_msg_t m = {.type = BP_MSG_CARD_LINK, .u.card_link = &cl};
    int rc = bp_msg_validate(&m, err);
    if (rc)
        return rc;
    if (!c->chan)
        return bl_err_set(err, BL_ECLOSED, "card link %u: no control channel", cm->link);
    return bp_chan_send(c->chan, NULL, &m, 2000, err);
}

int bp_child_recv_card(bp_child_t *c, bp_msg_t *hold, bp_card_msg_t *out, bl_err_t *err)
{
    memset(out, 0, sizeof *out);
    out->reason = "";
    int rc = recv_type(c, BP_MSG_CARD_LINK, hold, err);
    return rc ? rc : bp_card_msg_read(hold, out, err);
}

void bp_child_progress(bp_child_t *c, uint64_t done, uint64_t total, const char *stage)
{
    const uint64_t now = bp_now_us();
    if (done && done < total && now - c->progress_us < BP_CHILD_PROGRESS_US)
        return;
    c->progress_us = now;
    Bloomery__LoadProgress p;
    bloomery__load_progress__init(&p);
    p.bytes_done = done;
    p.bytes_total = total;
    p.stage = (char *)stage;
    const bp_msg_t m = {.type = BP_MSG_LOAD_PROGRESS, .u.load_progress = &p};
    (void)bp_child_send(c, &m); /* progress is informational */
}

void bp_child_copy_progress(void *ud, uint64_t done, uint64_t total)
{
    bp_child_t *c = ud;
    if (!total)
        return;
    c->copy_total = total;
    bp_child_progress(c, done, total, c->copy_stage ? c->copy_stage : "copy");
}

void bp_child_copy_done(bp_child_t *c, uint64_t other_total)
{
    const uint64_t t = c->copy_total ? c->copy_total : other_total;
    bp_child_progress(c, t, t, c->copy_stage ? c->copy_stage : "copy");
}

void bp_child_ready(bp_child_t *c, uint64_t n_vocab, uint64_t n_embd, uint64_t n_layer, const char *kernels)
{
    Bloomery__Ready r;
    bloomery__ready__init(&r);
    r.process = c->process;
    r.n_vocab = n_vocab;
    r.n_embd = n_embd;
    r.n_layer = n_layer;
    char k[BP_MSG_MAX_KERNELS + 1];
    snprintf(k, sizeof k, "%s", kernels ? kernels : "");
    r.kernels = k;
    const bp_msg_t m = {.type = BP_MSG_READY, .u.ready = &r};
    (void)bp_child_send(c, &m); /* a lost Ready shows as a load timeout in the router */
}

static int child_send(void *ud, const bp_msg_t *m) { return bp_child_send(ud, m); }

void bp_child_fatal(bp_child_t *c, const bl_err_t *e)
{
    BL_LOG(BL_LOG_ERROR, "event=start_failed reason=\"%s\"", e->msg);
    char text[sizeof e->msg + 40];
    snprintf(text, sizeof text, "%s: %s", c->label, e->msg);
    (void)bp_msg_fatal(c->process, e->code, text, child_send, c); /* best effort: the exit status tells the rest */
}

static void send_stats(bp_child_t *c, bp_child_stats_fn stats, void *ud)
{
    bp_counter_t v[MAX_COUNTERS];
    int n = stats ? stats(ud, v, MAX_COUNTERS) : 0;
    n = n < 0 ? 0 : n > MAX_COUNTERS ? MAX_COUNTERS : n;
    Bloomery__Counter pc[MAX_COUNTERS], *pp[MAX_COUNTERS];
    for (int i = 0; i < n; i++) {
        bloomery__counter__init(&pc[i]);
        pc[i].name = (char *)v[i].name;
        pc[i].value = v[i].value;
        pp[i] = &pc[i];
    }
    Bloomery__Stats s;
    bloomery__stats__init(&s);
    s.process = c->process;
    s.uptime_us = bp_now_us() - c->t0_us;
    s.counters = pp;
    s.n_counters = (size_t)n;
    const bp_msg_t m = {.type = BP_MSG_STATS, .u.stats = &s};
    (void)bp_child_send(c, &m); /* a lost reply only leaves a gap in /metrics */
}

void bp_child_control_loop(bp_child_t *c, _Atomic int *stop, bp_child_stats_fn stats, void *ud)
{
    while (!atomic_load_explicit(stop, memory_order_relaxed) && !bp_child_parent_gone(c)) {
        bp_msg_t m = {0};
        bl_err_t err = {0};
        int rc = bp_chan_recv(c->chan, NULL, &m, POLL_MS, &err);
        if (rc == 0 && m.type == BP_MSG_SHUTDOWN)
            atomic_store_explicit(stop, 1, memory_order_relaxed);
        else if (rc == 0 && m.type == BP_MSG_STATS)
            send_stats(c, stats, ud);
        else if (rc && rc != BL_ETIMEDOUT)
            BL_LOG(BL_LOG_WARN, "event=bad_control_message reason=\"%s\"", err.msg);
        bp_msg_free(&m);
    }
    atomic_store_explicit(stop, 1, memory_order_relaxed);
}

int bp_spawn(pid_t *pid, char *const argv[], const int *fds, int n_fds, int new_pgroup, const char *what,
             bl_err_t *err)
{
    enum { MAX_FDS = 256 };
    *pid = 0;
    if (n_fds < 0 || n_fds > MAX_FDS)
        return bl_err_set(err, BL_EINVAL, "%s: %d descriptors to pass", what, n_fds);
    int tmp[MAX_FDS], n_tmp = 0, rc = 0;
    for (; n_tmp < n_fds; n_tmp++)
        if ((tmp[n_tmp] = fcntl(fds[n_tmp], F_DUPFD_CLOEXEC, BP_STEP_FD_IN + n_fds)) < 0) {
            rc = bl_err_set(err, BL_EIO, "%s: dup of a ring fd: %s", what, strerror(errno));
            goto out;
        }
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&at);
    for (int f = 0; f < n_fds; f++)
        posix_spawn_file_actions_adddup2(&fa, tmp[f], BP_STEP_FD_IN + f);
    /* nothing else of the parent's leaks into the child (listening sockets, ...) */
    posix_spawn_file_actions_addclosefrom_np(&fa, BP_STEP_FD_IN + n_fds);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &all);
    short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
    if (new_pgroup) {
        posix_spawnattr_setpgroup(&at, 0);
        flags |= POSIX_SPAWN_SETPGROUP;
    }
    posix_spawnattr_setflags(&at, flags);
    const int e = posix_spawn(pid, argv[0], &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    if (e != 0) {
        *pid = 0;
        rc = bl_err_set(err, e == ENOENT ? BL_ENOENT : BL_EIO, "%s: cannot start %s: %s", what, argv[0],
                        strerror(e));
    }
out:
    for (int f = 0; f < n_tmp; f++)
        close(tmp[f]);
    return rc;
}

// --- the host's CUDA devices, as bloomery-worker reports them ----------------------------

/* One line of `bloomery-worker --list-devices`: "cuda INDEX TOTAL FREE [read_mbps=N]
 * NAME" (a line without the rate: not known). */
static int parse_device_line(const char *line, bl_device_t *d, bl_err_t *err)
{
    int idx = -1, used = 0, used_rate = 0;
    uint64_t total = 0, free_b = 0, rate = 0;
    if (sscanf(line, "cuda %d %" SCNu64 " %" SCNu64 " %n", &idx, &total, &free_b, &used) != 3 || used == 0 ||
        idx < 0 || idx > 255 || free_b > total)
        return bl_err_set(err, BL_EPROTO, "bloomery-worker --list-devices: a line that does not parse: \"%.80s\"",
                          line);
    if (strncmp(line + used, "read_mbps=", 10) == 0) {
        if (sscanf(line + used, "read_mbps=%" SCNu64 " %n", &rate, &used_rate) != 1 || used_rate == 0 ||
            !isdigit((unsigned char)line[used + 10]) || rate > 100000000u)
            return bl_err_set(err, BL_EPROTO, "bloomery-worker --list-devices: CUDA%d's read rate does not parse: "
                              "\"%.80s\"", idx, line);
        used += used_rate;
    }
    if (!line[used])
        return bl_err_set(err, BL_EPROTO, "bloomery-worker --list-devices: CUDA%d has no name", idx);
    memset(d, 0, sizeof *d);
    d->index = idx;
    d->total_bytes = total;
    d->free_bytes = free_b;
    d->read_mbps = (uint32_t)rate;
    size_t k = 0;
    for (const char *c = line + used; *c && k + 1 < sizeof d->name; c++) /* printable, for logs and the wire */
        d->name[k++] = *c >= 0x20 && *c < 0x7f ? *c : '?';
    return 0;
}

int bp_list_devices(const char *bin, bl_device_t *out, int cap, int *n, bl_err_t *err)
{
    *n = 0;
    int rc = 0;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return bl_err_set(err, BL_EIO, "pipe: %s", strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    char *argv[] = {(char *)bin, (char *)"--list-devices", NULL}; /* posix_spawn writes none of it */
    pid_t pid = -1;
    const int se = posix_spawn(&pid, bin, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (se != 0) {
        close(fds[0]);
        return bl_err_set(err, BL_EIO, "cannot start %s --list-devices: %s", bin, strerror(se));
    }
    char buf[16384];
    size_t len = 0;
    const int64_t deadline = (int64_t)time(NULL) + 30;
    for (;;) {
        struct pollfd pf = {.fd = fds[0], .events = POLLIN};
        const int64_t left = deadline - (int64_t)time(NULL);
        if (left <= 0) {
            rc = bl_err_set(err, BL_ETIMEDOUT, "%s --list-devices gave no answer in 30 s", bin);
            break;
        }
        const int pr = poll(&pf, 1, (int)(left * 1000));
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            continue;
        const ssize_t k = read(fds[0], buf + len, sizeof buf - 1 - len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        len += (size_t)k;
        if (len == sizeof buf - 1) {
            rc = bl_err_set(err, BL_EPROTO, "%s --list-devices: more than %zu bytes", bin, sizeof buf - 1);
            break;
        }
    }
    close(fds[0]);
    if (rc)
        kill(pid, SIGKILL);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (rc)
        return rc;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return bl_err_set(err, BL_EIO, "%s --list-devices failed (status %d)", bin, status);
    buf[len] = '\0';
    for (char *line = buf, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        if (!nl)
            return bl_err_set(err, BL_EPROTO, "%s --list-devices: a line without its end", bin);
        *nl = '\0';
        if (*n >= cap)
            break;
        if ((rc = parse_device_line(line, &out[*n], err)) != 0)
            return rc;
        (*n)++;
    }
    return 0;
}
