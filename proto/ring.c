/* The shared-memory SPSC ring and its spin-then-park doorbells: see ring.h for the
 * contract and ring_impl.h for the segment layout.
 *
 * Memory orders, in one place:
 * - head and tail are byte counters that only grow (mod 2^64). The producer writes a
 *   frame and its payload with plain stores, then stores head with release; the
 *   consumer loads head with acquire, so every byte before head is visible to it.
 * - The consumer reads a payload, then stores tail with release; the producer loads
 *   tail with acquire before it writes over those bytes, so the consumer's reads are
 *   done before the producer's new writes land (no torn read of a reused slot).
 * - Parking is a store-buffer (Dekker) pattern: the waiter increments waiters, then
 *   checks the ring; the ringer publishes, then checks waiters. A seq_cst fence sits
 *   between the store and the load on both sides, so at least one of them sees the
 *   other: either the waiter sees the data and does not sleep, or the ringer sees the
 *   waiter's flag, clears it, and bumps seq + FUTEX_WAKE. The waiter read seq before its last check, and
 *   FUTEX_WAIT compares seq atomically in the kernel, so a wake between the check and
 *   the sleep is not lost. */
#include "ring.h"

#include "ring_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct bp_ring {
    ring_shared_t *sh;     /* the mapping: control page, then data */
    uint8_t *data;         /* sh + BP_RING_HDR_NBYTES */
    size_t capacity;       /* private copy, validated at attach; never re-read */
    size_t mask;           /* capacity - 1 */
    size_t map_nbytes;
    int fd;
    bp_ring_role_t role;
    uint32_t spin_us;
    bool broken;           /* a protocol error was seen; every call fails after */
    char name[64];

    /* Producer side: head not yet published may run ahead of sh->head while a
     * reservation is open (a pad frame written before the message). */
    uint64_t head;
    uint64_t head_pub;     /* what we last stored to sh->head; never re-read from there,
                            * since the consumer can write the shared page too */
    uint64_t tail_seen;    /* last tail loaded; refreshed only when the ring looks full */
    size_t reserved;       /* payload bytes reserved, 0 when none */
    bool has_reservation;

    /* Consumer side. */
    uint64_t tail;
    uint64_t head_seen;    /* last head loaded; refreshed only when the ring looks empty */
    size_t held_rec;       /* record bytes of the peeked message, 0 when none */
    const void *held_data;
    size_t held_len;

    uint64_t seq;          /* next message number (produced or consumed) */
    uint64_t consumed_seen; /* producer: the consumer's count last loaded */
    uint64_t consumed_want; /* producer: what bp_ring_wait_consumed waits for */
    bp_ring_stats_t stats;
};

/* ---------------------------------------------------------------- small helpers */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

static inline uint64_t now_ns(void)
{
    /* CLOCK_MONOTONIC is served by the vDSO: no system call. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline size_t rec_nbytes(size_t payload)
{
    return (BP_RING_FRAME_NBYTES + payload + (BP_RING_ALIGN - 1)) & ~(size_t)(BP_RING_ALIGN - 1);
}

/* The shared (not _PRIVATE) futex ops: the word lives in a mapping two processes
 * share, and the private ops key the wait queue on this process's mm only. */
static int futex_wait(_Atomic uint32_t *addr, uint32_t expected, uint64_t timeout_ns)
{
    struct timespec ts = {
        .tv_sec = (time_t)(timeout_ns / 1000000000ull),
        .tv_nsec = (long)(timeout_ns % 1000000000ull),
    };
    return (int)syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, expected, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr)
{
    (void)syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Called after publishing (head or tail already stored). See the file comment for why
 * the fence is seq_cst and why seq is bumped before the wake. */
static inline void bell_ring(bp_ring_t *r, ring_bell_t *b)
{
    atomic_thread_fence(memory_order_seq_cst);
    /* The plain load keeps the common case (nobody parked) free of a locked RMW; the
     * exchange clears the flag so that one park costs one FUTEX_WAKE, not one per
     * message pushed while the woken waiter waits for a CPU. */
    if (atomic_load_explicit(&b->waiters, memory_order_relaxed) != 0 &&
        atomic_exchange_explicit(&b->waiters, 0, memory_order_relaxed) != 0) {
        atomic_fetch_add_explicit(&b->seq, 1, memory_order_release);
        futex_wake_all(&b->seq);
        r->stats.wakes++;
    }
}

static inline uint32_t peer_bit(const bp_ring_t *r)
{
    return r->role == BP_RING_PRODUCER ? (uint32_t)BP_RING_CONSUMER : (uint32_t)BP_RING_PRODUCER;
}

static inline bool peer_gone(const bp_ring_t *r)
{
    return (atomic_load_explicit(&r->sh->closed, memory_order_acquire) & peer_bit(r)) != 0;
}

/* Whether the consumer can go on: a message, or the producer closed. */
static bool data_ready(bp_ring_t *r)
{
    return atomic_load_explicit(&r->sh->head, memory_order_acquire) != r->tail || peer_gone(r);
}

/* Whether the producer can go on: tail moved since we last looked, or the consumer
 * closed. The caller re-checks the actual room. */
static bool space_ready(bp_ring_t *r)
{
    return atomic_load_explicit(&r->sh->tail, memory_order_acquire) != r->tail_seen || peer_gone(r);
}

/* Spin for up to spin_us on ready(), then park on the bell's futex until ready(), the
 * timeout, or a wake. 0 when ready, BL_ETIMEDOUT, BL_EAGAIN (timeout_us == 0). */
static int bell_wait(bp_ring_t *r, ring_bell_t *b, bool (*ready)(bp_ring_t *),
                     int64_t timeout_us)
{
    if (ready(r))
        return 0;
    if (timeout_us == 0)
        return BL_EAGAIN;
    uint64_t start = now_ns();
    uint64_t deadline = timeout_us < 0 ? UINT64_MAX : start + (uint64_t)timeout_us * 1000u;
    uint64_t spin_end = start + (uint64_t)r->spin_us * 1000u;
    if (spin_end > deadline)
        spin_end = deadline;
    /* Read the clock only every 64 pauses: a pause is 10-140 cycles, the clock ~20 ns. */
    for (uint32_t i = 1;; i++) {
        if (ready(r))
            return 0;
        cpu_relax();
        if ((i & 63) == 0 && now_ns() >= spin_end)
            break;
    }
    for (;;) {
        uint64_t t = now_ns();
        if (t >= deadline) {
            atomic_store_explicit(&b->waiters, 0, memory_order_relaxed);
            return BL_ETIMEDOUT;
        }
        /* One waiter per bell (one consumer, one producer), so waiters is a flag: we
         * set it, the ringer clears it when it wakes us, and we clear it when we leave
         * without having slept on it. */
        atomic_store_explicit(&b->waiters, 1, memory_order_seq_cst);
        atomic_thread_fence(memory_order_seq_cst);
        uint32_t seq = atomic_load_explicit(&b->seq, memory_order_acquire);
        if (ready(r)) {
            atomic_store_explicit(&b->waiters, 0, memory_order_relaxed);
            return 0;
        }
        r->stats.parks++;
        /* Sleep at most 1 s at a time so a clock step or a lost wake costs little. */
        uint64_t left = deadline - t;
        (void)futex_wait(&b->seq, seq, left < 1000000000ull ? left : 1000000000ull);
        if (ready(r)) {
            atomic_store_explicit(&b->waiters, 0, memory_order_relaxed);
            return 0;
        }
    }
}

static int fail_broken(const bp_ring_t *r, bl_err_t *err)
{
    return bl_err_set(err, BL_EPROTO, "ring %s: an earlier protocol error broke this handle",
                      r->name);
}

/* ------------------------------------------------------------ create and attach */

size_t bp_ring_max_msg(size_t capacity)
{
    return capacity / 2 - BP_RING_FRAME_NBYTES;
}

static int check_capacity(const char *name, size_t capacity, bl_err_t *err)
{
    if (capacity < BP_RING_MIN_CAPACITY || capacity > BP_RING_MAX_CAPACITY ||
        (capacity & (capacity - 1)) != 0)
        return bl_err_set(err, BL_EINVAL,
                          "ring %s: capacity %zu is not a power of two in [%zu, %zu]", name,
                          capacity, BP_RING_MIN_CAPACITY, BP_RING_MAX_CAPACITY);
    return 0;
}

static int check_role(const char *name, bp_ring_role_t role, bl_err_t *err)
{
    if (role != BP_RING_PRODUCER && role != BP_RING_CONSUMER)
        return bl_err_set(err, BL_EINVAL, "ring %s: role %d is neither producer nor consumer",
                          name, (int)role);
    return 0;
}

/* Maps fd (already the right size) and fills a handle. Takes ownership of fd. */
static int map_ring(bp_ring_t **out, int fd, const char *name, size_t map_nbytes,
                    bp_ring_role_t role, bl_err_t *err)
{
    int rc;
    void *p = MAP_FAILED;
    bp_ring_t *r = calloc(1, sizeof *r);
    if (!r) {
        rc = bl_err_set(err, BL_ENOMEM, "ring %s: out of memory for the handle", name);
        goto fail;
    }
    p = mmap(NULL, map_nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        rc = bl_err_set(err, BL_EIO, "ring %s: mmap of %zu bytes: %s", name, map_nbytes,
                        strerror(errno));
        goto fail;
    }
    r->sh = p;
    r->data = (uint8_t *)p + BP_RING_HDR_NBYTES;
    r->map_nbytes = map_nbytes;
    r->capacity = map_nbytes - BP_RING_HDR_NBYTES;
    r->mask = r->capacity - 1;
    r->fd = fd;
    r->role = role;
    r->spin_us = BP_RING_DEFAULT_SPIN_US;
    snprintf(r->name, sizeof r->name, "%s", name);
    *out = r;
    return 0;
fail:
    free(r);
    close(fd);
    return rc;
}

static void init_shared(bp_ring_t *r, size_t capacity)
{
    ring_shared_t *sh = r->sh;
    /* ftruncate gave zeroed pages, so the atomics start at 0. */
    sh->version = BP_RING_VERSION;
    sh->hdr_nbytes = BP_RING_HDR_NBYTES;
    sh->capacity = capacity;
    snprintf(sh->name, sizeof sh->name, "%s", r->name);
    /* The magic last, released: an attacher that sees it sees the rest. (The fd is
     * normally handed over after this returns, which orders it anyway.) */
    atomic_thread_fence(memory_order_release);
    sh->magic = BP_RING_MAGIC;
}

int bp_ring_create(bp_ring_t **out, const char *name, size_t capacity,
                   bp_ring_role_t role, bl_err_t *err)
{
    *out = NULL;
    int rc = check_capacity(name, capacity, err);
    if (rc == 0)
        rc = check_role(name, role, err);
    if (rc)
        return rc;
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return bl_err_set(err, BL_EIO, "ring %s: memfd_create: %s", name, strerror(errno));
    size_t nbytes = BP_RING_HDR_NBYTES + capacity;
    /* Sealed against resizing: a peer that shrank the file would make our next access
     * past the new end a SIGBUS instead of an error code. */
    if (ftruncate(fd, (off_t)nbytes) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        rc = bl_err_set(err, BL_EIO, "ring %s: sizing and sealing %zu bytes: %s", name,
                        nbytes, strerror(errno));
        close(fd);
        return rc;
    }
    rc = map_ring(out, fd, name, nbytes, role, err);
    if (rc)
        return rc;
    init_shared(*out, capacity);
    return 0;
}

int bp_ring_create_shm(bp_ring_t **out, const char *shm_name, size_t capacity,
                       bp_ring_role_t role, bl_err_t *err)
{
    *out = NULL;
    int rc = check_capacity(shm_name, capacity, err);
    if (rc == 0)
        rc = check_role(shm_name, role, err);
    if (rc)
        return rc;
    int fd = shm_open(shm_name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return bl_err_set(err, errno == EINVAL ? BL_EINVAL : BL_EIO, "ring %s: shm_open: %s",
                          shm_name, strerror(errno));
    size_t nbytes = BP_RING_HDR_NBYTES + capacity;
    if (ftruncate(fd, (off_t)nbytes) != 0) {
        rc = bl_err_set(err, BL_EIO, "ring %s: ftruncate to %zu bytes: %s", shm_name, nbytes,
                        strerror(errno));
        close(fd);
        shm_unlink(shm_name);
        return rc;
    }
    rc = map_ring(out, fd, shm_name, nbytes, role, err);
    if (rc) {
        shm_unlink(shm_name);
        return rc;
    }
    init_shared(*out, capacity);
    return 0;
}

/* Validates the segment behind fd (ours: a dup) and maps it. Takes ownership of fd. */
static int attach_owned_fd(bp_ring_t **out, int fd, const char *name, bp_ring_role_t role,
                           bool need_seal, bl_err_t *err)
{
    int rc;
    bp_ring_t *r = NULL;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = bl_err_set(err, BL_EIO, "ring %s: fstat: %s", name, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode) || st.st_size < (off_t)(BP_RING_HDR_NBYTES + BP_RING_MIN_CAPACITY) ||
        (uint64_t)st.st_size > BP_RING_HDR_NBYTES + (uint64_t)BP_RING_MAX_CAPACITY) {
        rc = bl_err_set(err, BL_EINVAL, "ring %s: segment of %lld bytes is not a ring", name,
                        (long long)st.st_size);
        goto fail;
    }
    if (need_seal) {
        int seals = fcntl(fd, F_GET_SEALS);
        if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
            rc = bl_err_set(err, BL_EINVAL, "ring %s: memfd is not sealed against shrinking",
                            name);
            goto fail;
        }
    }
    size_t nbytes = (size_t)st.st_size;
    rc = map_ring(out, fd, name, nbytes, role, err);
    fd = -1; /* map_ring owns it now, on success and failure */
    if (rc)
        goto fail;
    r = *out;
    /* Read the header fields once into locals: the peer may change them under us. */
    uint64_t magic = r->sh->magic;
    atomic_thread_fence(memory_order_acquire);
    uint32_t version = r->sh->version, hdr_nbytes = r->sh->hdr_nbytes;
    uint64_t capacity = r->sh->capacity;
    if (magic != BP_RING_MAGIC) {
        rc = bl_err_set(err, BL_EINVAL, "ring %s: bad magic 0x%016llx", name,
                        (unsigned long long)magic);
    } else if (version != BP_RING_VERSION || hdr_nbytes != BP_RING_HDR_NBYTES) {
        rc = bl_err_set(err, BL_EINVAL, "ring %s: version %u header %u, expected %u and %u",
                        name, version, hdr_nbytes, BP_RING_VERSION, BP_RING_HDR_NBYTES);
    } else if (capacity != r->capacity) {
        rc = bl_err_set(err, BL_EINVAL, "ring %s: header capacity %llu, segment holds %zu",
                        name, (unsigned long long)capacity, r->capacity);
    } else {
        rc = check_capacity(name, r->capacity, err);
    }
    if (rc)
        goto fail;
    /* Pick up where the ring is (normally all zero at attach). */
    uint64_t head = atomic_load_explicit(&r->sh->head, memory_order_acquire);
    uint64_t tail = atomic_load_explicit(&r->sh->tail, memory_order_acquire);
    if (head - tail > r->capacity || (head & (BP_RING_ALIGN - 1)) || (tail & (BP_RING_ALIGN - 1))) {
        rc = bl_err_set(err, BL_EPROTO, "ring %s: head %llu and tail %llu are inconsistent",
                        name, (unsigned long long)head, (unsigned long long)tail);
        goto fail;
    }
    if (role == BP_RING_PRODUCER) {
        r->head = head;
        r->head_pub = head;
        r->tail_seen = tail;
        r->seq = atomic_load_explicit(&r->sh->produced, memory_order_relaxed);
        r->consumed_seen = atomic_load_explicit(&r->sh->consumed, memory_order_relaxed);
    } else {
        r->tail = tail;
        r->head_seen = tail;
        r->seq = atomic_load_explicit(&r->sh->consumed, memory_order_relaxed);
    }
    return 0;
fail:
    /* Not bp_ring_destroy: a failed attach must not mark the creator's peer closed. */
    if (r) {
        munmap(r->sh, r->map_nbytes);
        close(r->fd);
        free(r);
        *out = NULL;
    } else if (fd >= 0) {
        close(fd);
    }
    return rc;
}

int bp_ring_attach_fd(bp_ring_t **out, int fd, const char *name, bp_ring_role_t role,
                      bl_err_t *err)
{
    *out = NULL;
    int rc = check_role(name, role, err);
    if (rc)
        return rc;
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0)
        return bl_err_set(err, BL_EIO, "ring %s: dup of fd %d: %s", name, fd, strerror(errno));
    return attach_owned_fd(out, own, name, role, true, err);
}

int bp_ring_attach_shm(bp_ring_t **out, const char *shm_name, bp_ring_role_t role,
                       bl_err_t *err)
{
    *out = NULL;
    int rc = check_role(shm_name, role, err);
    if (rc)
        return rc;
    int fd = shm_open(shm_name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return bl_err_set(err, errno == ENOENT ? BL_ENOENT : BL_EIO, "ring %s: shm_open: %s",
                          shm_name, strerror(errno));
    return attach_owned_fd(out, fd, shm_name, role, false, err);
}

int bp_ring_unlink_shm(const char *shm_name, bl_err_t *err)
{
    if (shm_unlink(shm_name) != 0)
        return bl_err_set(err, errno == ENOENT ? BL_ENOENT : BL_EIO, "ring %s: shm_unlink: %s",
                          shm_name, strerror(errno));
    return 0;
}

void bp_ring_close(bp_ring_t *r)
{
    if (!r)
        return;
    atomic_fetch_or_explicit(&r->sh->closed, (uint32_t)r->role, memory_order_seq_cst);
    /* Wake whoever is parked on either bell, unconditionally: closing is rare and the
     * peer must not sleep out its timeout. seq is bumped first so a waiter between its
     * check and its FUTEX_WAIT returns at once. */
    atomic_fetch_add_explicit(&r->sh->data_bell.seq, 1, memory_order_seq_cst);
    atomic_fetch_add_explicit(&r->sh->space_bell.seq, 1, memory_order_seq_cst);
    futex_wake_all(&r->sh->data_bell.seq);
    futex_wake_all(&r->sh->space_bell.seq);
}

void bp_ring_destroy(bp_ring_t *r)
{
    if (!r)
        return;
    bp_ring_close(r);
    munmap(r->sh, r->map_nbytes);
    close(r->fd);
    free(r);
}

int bp_ring_fd(const bp_ring_t *r) { return r->fd; }
size_t bp_ring_capacity(const bp_ring_t *r) { return r->capacity; }
void bp_ring_mapping(const bp_ring_t *r, void **p, size_t *nbytes)
{
    *p = r->sh;
    *nbytes = r->map_nbytes;
}
const char *bp_ring_name(const bp_ring_t *r) { return r->name; }
void bp_ring_set_spin_us(bp_ring_t *r, uint32_t spin_us) { r->spin_us = spin_us; }
int bp_ring_peer_closed(const bp_ring_t *r) { return peer_gone(r); }

void bp_ring_get_stats(const bp_ring_t *r, bp_ring_stats_t *out) { *out = r->stats; }

/* --------------------------------------------------------------------- producer */

/* Loads the consumer's tail and checks it against what we know: it may not pass our
 * published head nor fall more than capacity behind it, and it stays aligned. */
static int load_tail(bp_ring_t *r, bl_err_t *err)
{
    uint64_t tail = atomic_load_explicit(&r->sh->tail, memory_order_acquire);
    uint64_t pub = r->head_pub;
    if (pub - tail > r->capacity || tail - r->tail_seen > pub - r->tail_seen ||
        (tail & (BP_RING_ALIGN - 1))) {
        r->broken = true;
        return bl_err_set(err, BL_EPROTO,
                          "ring %s: consumer tail %llu out of range (head %llu, capacity %zu)",
                          r->name, (unsigned long long)tail, (unsigned long long)pub,
                          r->capacity);
    }
    r->tail_seen = tail;
    return 0;
}

int bp_ring_reserve(bp_ring_t *r, size_t nbytes, void **out, int64_t timeout_us,
                    bl_err_t *err)
{
    *out = NULL;
    if (r->role != BP_RING_PRODUCER)
        return bl_err_set(err, BL_EINVAL, "ring %s: reserve on the consumer side", r->name);
    if (r->broken)
        return fail_broken(r, err);
    if (nbytes > bp_ring_max_msg(r->capacity))
        return bl_err_set(err, BL_ERANGE,
                          "ring %s: message of %zu bytes exceeds the limit of %zu (capacity %zu)",
                          r->name, nbytes, bp_ring_max_msg(r->capacity), r->capacity);
    /* A reservation replaced before commit: its pad (if any) was not published, so
     * start again from the published head. */
    if (r->has_reservation)
        r->head = r->head_pub;
    r->has_reservation = false;
    size_t rec = rec_nbytes(nbytes);
    int64_t left_us = timeout_us;
    uint64_t start = 0;
    for (;;) {
        if (peer_gone(r))
            return bl_err_set(err, BL_ECLOSED, "ring %s: the consumer closed", r->name);
        size_t pos = (size_t)(r->head & r->mask);
        size_t to_end = r->capacity - pos;
        size_t need = rec <= to_end ? rec : to_end + rec;
        size_t used = (size_t)(r->head - r->tail_seen);
        if (r->capacity - used < need) {
            int rc = load_tail(r, err);
            if (rc)
                return rc;
            used = (size_t)(r->head - r->tail_seen);
        }
        if (r->capacity - used >= need) {
            if (rec > to_end) {
                /* Pad to the end: the message starts at offset 0, whole. */
                ring_frame_t pad = {(uint32_t)(to_end - BP_RING_FRAME_NBYTES), RING_FRAME_PAD,
                                    r->seq};
                memcpy(r->data + pos, &pad, sizeof pad);
                r->head += to_end;
                pos = 0;
            }
            r->reserved = nbytes;
            r->has_reservation = true;
            *out = r->data + pos + BP_RING_FRAME_NBYTES;
            return 0;
        }
        /* Full: wait for the consumer, for what is left of the timeout. */
        if (timeout_us > 0) {
            uint64_t t = now_ns();
            if (start == 0)
                start = t;
            left_us = timeout_us - (int64_t)((t - start) / 1000u);
            if (left_us <= 0)
                left_us = 1; /* one last look, then ETIMEDOUT from bell_wait */
        }
        int rc = bell_wait(r, &r->sh->space_bell, space_ready, left_us);
        if (rc == BL_EAGAIN)
            return bl_err_set(err, rc, "ring %s: full (%zu of %zu bytes used)", r->name, used,
                              r->capacity);
        if (rc == BL_ETIMEDOUT)
            return bl_err_set(err, rc, "ring %s: no room after %lld us; consumer stalled?",
                              r->name, (long long)timeout_us);
    }
}

int bp_ring_commit(bp_ring_t *r, size_t nbytes, bl_err_t *err)
{
    if (!r->has_reservation)
        return bl_err_set(err, BL_EINVAL, "ring %s: commit without a reservation", r->name);
    if (nbytes > r->reserved)
        return bl_err_set(err, BL_EINVAL, "ring %s: commit of %zu bytes, %zu reserved",
                          r->name, nbytes, r->reserved);
    size_t pos = (size_t)(r->head & r->mask);
    ring_frame_t fr = {(uint32_t)nbytes, RING_FRAME_MSG, r->seq};
    memcpy(r->data + pos, &fr, sizeof fr);
    r->head += rec_nbytes(nbytes);
    r->seq++;
    r->has_reservation = false;
    r->stats.msgs++;
    atomic_store_explicit(&r->sh->produced, r->seq, memory_order_relaxed);
    /* Release: the frame, the payload (and a pad frame) are visible before head. */
    r->head_pub = r->head;
    atomic_store_explicit(&r->sh->head, r->head, memory_order_release);
    bell_ring(r, &r->sh->data_bell);
    return 0;
}

int bp_ring_push(bp_ring_t *r, const void *data, size_t nbytes, int64_t timeout_us,
                 bl_err_t *err)
{
    void *dst;
    int rc = bp_ring_reserve(r, nbytes, &dst, timeout_us, err);
    if (rc)
        return rc;
    if (nbytes)
        memcpy(dst, data, nbytes);
    return bp_ring_commit(r, nbytes, err);
}

uint64_t bp_ring_produced(const bp_ring_t *r)
{
    return r->role == BP_RING_PRODUCER ? r->seq : 0;
}

/* Whether the consumer's count reached what bp_ring_wait_consumed waits for, or the
 * consumer closed. The caller checks the count it reads. */
static bool consumed_ready(bp_ring_t *r)
{
    return atomic_load_explicit(&r->sh->consumed, memory_order_acquire) >= r->consumed_want || peer_gone(r);
}

/* Loads the consumer's message count and checks it: never past what we produced,
 * never back. */
static int load_consumed(bp_ring_t *r, bl_err_t *err)
{
    uint64_t c = atomic_load_explicit(&r->sh->consumed, memory_order_acquire);
    if (c > r->seq || c < r->consumed_seen) {
        r->broken = true;
        return bl_err_set(err, BL_EPROTO, "ring %s: consumer count %llu out of range (produced %llu, last seen %llu)",
                          r->name, (unsigned long long)c, (unsigned long long)r->seq,
                          (unsigned long long)r->consumed_seen);
    }
    r->consumed_seen = c;
    return 0;
}

int bp_ring_wait_consumed(bp_ring_t *r, uint64_t n, int64_t timeout_us, bl_err_t *err)
{
    if (r->role != BP_RING_PRODUCER)
        return bl_err_set(err, BL_EINVAL, "ring %s: waiting for releases on the consumer side", r->name);
    if (r->broken)
        return fail_broken(r, err);
    if (n > r->seq)
        return bl_err_set(err, BL_EINVAL, "ring %s: waiting for %llu releases of %llu messages", r->name,
                          (unsigned long long)n, (unsigned long long)r->seq);
    int rc = load_consumed(r, err);
    if (rc)
        return rc;
    if (r->consumed_seen >= n)
        return 0;
    if (peer_gone(r))
        return bl_err_set(err, BL_ECLOSED, "ring %s: the consumer closed", r->name);
    /* The consumer rings the space bell at every release, so this is the wait a full
     * ring makes. */
    r->consumed_want = n;
    rc = bell_wait(r, &r->sh->space_bell, consumed_ready, timeout_us);
    if (rc == BL_EAGAIN)
        return bl_err_set(err, rc, "ring %s: %llu of %llu messages released", r->name,
                          (unsigned long long)r->consumed_seen, (unsigned long long)n);
    if (rc == BL_ETIMEDOUT)
        return bl_err_set(err, rc, "ring %s: message %llu not released after %lld us; consumer stalled?",
                          r->name, (unsigned long long)n, (long long)timeout_us);
    if ((rc = load_consumed(r, err)) != 0)
        return rc;
    if (r->consumed_seen >= n)
        return 0;
    return bl_err_set(err, BL_ECLOSED, "ring %s: the consumer closed", r->name);
}

/* --------------------------------------------------------------------- consumer */

static int corrupt(bp_ring_t *r, bl_err_t *err, size_t pos, const char *what,
                   unsigned long long value)
{
    r->broken = true;
    return bl_err_set(err, BL_EPROTO, "ring %s: corrupt frame at offset %zu: %s %llu", r->name,
                      pos, what, value);
}

int bp_ring_peek(bp_ring_t *r, const void **data, size_t *nbytes, int64_t timeout_us,
                 bl_err_t *err)
{
    *data = NULL;
    *nbytes = 0;
    if (r->role != BP_RING_CONSUMER)
        return bl_err_set(err, BL_EINVAL, "ring %s: peek on the producer side", r->name);
    if (r->broken)
        return fail_broken(r, err);
    if (r->held_rec) {
        *data = r->held_data;
        *nbytes = r->held_len;
        return 0;
    }
    uint64_t start = 0;
    for (;;) {
        if (r->head_seen == r->tail) {
            uint64_t head = atomic_load_explicit(&r->sh->head, memory_order_acquire);
            if (head - r->tail > r->capacity || (head & (BP_RING_ALIGN - 1))) {
                r->broken = true;
                return bl_err_set(err, BL_EPROTO,
                                  "ring %s: producer head %llu out of range (tail %llu, "
                                  "capacity %zu)",
                                  r->name, (unsigned long long)head,
                                  (unsigned long long)r->tail, r->capacity);
            }
            r->head_seen = head;
        }
        if (r->head_seen == r->tail) {
            if (peer_gone(r)) {
                /* The producer may have pushed, then closed: look at head once more,
                 * after the acquire load of closed. */
                if (atomic_load_explicit(&r->sh->head, memory_order_acquire) != r->tail)
                    continue;
                return bl_err_set(err, BL_ECLOSED, "ring %s: the producer closed", r->name);
            }
            int64_t left_us = timeout_us;
            if (timeout_us > 0) {
                uint64_t t = now_ns();
                if (start == 0)
                    start = t;
                left_us = timeout_us - (int64_t)((t - start) / 1000u);
                if (left_us <= 0)
                    left_us = 1;
            }
            int rc = bell_wait(r, &r->sh->data_bell, data_ready, left_us);
            if (rc == BL_EAGAIN)
                return bl_err_set(err, rc, "ring %s: empty", r->name);
            if (rc == BL_ETIMEDOUT)
                return bl_err_set(err, rc, "ring %s: no message after %lld us; producer stalled?",
                                  r->name, (long long)timeout_us);
            continue;
        }
        /* One copy of the frame: the fields we check are the fields we use. */
        size_t pos = (size_t)(r->tail & r->mask);
        size_t avail = (size_t)(r->head_seen - r->tail);
        size_t to_end = r->capacity - pos;
        ring_frame_t fr;
        memcpy(&fr, r->data + pos, sizeof fr);
        if (fr.flags == RING_FRAME_PAD) {
            if (fr.len != to_end - BP_RING_FRAME_NBYTES)
                return corrupt(r, err, pos, "pad length", fr.len);
            if (avail < to_end)
                return corrupt(r, err, pos, "pad past head, available", avail);
            r->tail += to_end;
            /* Free the pad now, so a producer waiting for room sees it. */
            atomic_store_explicit(&r->sh->tail, r->tail, memory_order_release);
            continue;
        }
        if (fr.flags != RING_FRAME_MSG)
            return corrupt(r, err, pos, "flags", fr.flags);
        if (fr.len > bp_ring_max_msg(r->capacity))
            return corrupt(r, err, pos, "length", fr.len);
        size_t rec = rec_nbytes(fr.len);
        if (rec > to_end)
            return corrupt(r, err, pos, "length past the end of the ring", fr.len);
        if (rec > avail)
            return corrupt(r, err, pos, "length past head", fr.len);
        if (fr.seq != r->seq)
            return corrupt(r, err, pos, "sequence number", (unsigned long long)fr.seq);
        r->held_rec = rec;
        r->held_data = r->data + pos + BP_RING_FRAME_NBYTES;
        r->held_len = fr.len;
        *data = r->held_data;
        *nbytes = r->held_len;
        return 0;
    }
}

void bp_ring_release(bp_ring_t *r)
{
    if (r->role != BP_RING_CONSUMER || r->held_rec == 0)
        return;
    r->tail += r->held_rec;
    r->held_rec = 0;
    r->seq++;
    r->stats.msgs++;
    /* Release, as tail: what this side did for the message before releasing it (a
     * copy out of a card buffer it names, waited for) happens before a producer's
     * bp_ring_wait_consumed returns. */
    atomic_store_explicit(&r->sh->consumed, r->seq, memory_order_release);
    /* Release: our reads of the payload complete before the producer may reuse it. */
    atomic_store_explicit(&r->sh->tail, r->tail, memory_order_release);
    bell_ring(r, &r->sh->space_bell);
}

int bp_ring_pop(bp_ring_t *r, void *buf, size_t cap, size_t *nbytes, int64_t timeout_us,
                bl_err_t *err)
{
    const void *src;
    int rc = bp_ring_peek(r, &src, nbytes, timeout_us, err);
    if (rc)
        return rc;
    if (*nbytes > cap)
        return bl_err_set(err, BL_ERANGE, "ring %s: message of %zu bytes, buffer of %zu",
                          r->name, *nbytes, cap);
    if (*nbytes)
        memcpy(buf, src, *nbytes);
    bp_ring_release(r);
    return 0;
}
