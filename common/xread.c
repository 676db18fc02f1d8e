/* Expert reads from the model's files (xread.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bl_config.h"
#include "file.h"
#include "log.h"
#include "xread.h"

#if BL_HAVE_LIBURING
#include <liburing.h>
#endif

#define XR_MAX_FILES 256
#define XR_MAX_DEPTH 256
#define XR_DEFAULT_DEPTH 8
#define XR_MAX_READ (1u << 30) /* one request's bytes: io_uring takes 32-bit lengths */
#define XR_RETRIES 16 /* EAGAIN completions of one read before it fails */
#define XR_DIRECT_ALIGN 4096 /* when the system does not say (statx STATX_DIOALIGN) */

typedef struct xfile {
    char *path;
    int fd;
    int direct;
    size_t align; /* offset and length alignment: 1, or the O_DIRECT block */
    bl_file_id_t id; /* at open */
} xfile_t;

struct bl_xr {
    xfile_t *f;
    int n;
    int depth;
    size_t mem_align;
    bl_xr_pread_fn fake;
    void *fake_ctx;
    int uring; /* the backend */
#if BL_HAVE_LIBURING
    struct io_uring ring;
    uint8_t *reg_base; /* the registered region, or NULL */
    size_t reg_len;
#endif
};

static uint64_t round_down(uint64_t v, size_t a) { return v / a * a; }
static uint64_t round_up(uint64_t v, size_t a) { return (v + a - 1) / a * a; }

/* The O_DIRECT alignment the file system asks for, or XR_DIRECT_ALIGN. */
static void direct_align(int fd, size_t *off_align, size_t *mem_align)
{
    *off_align = *mem_align = XR_DIRECT_ALIGN;
#ifdef STATX_DIOALIGN
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) &&
        sx.stx_dio_offset_align > 0 && sx.stx_dio_mem_align > 0) {
        *off_align = sx.stx_dio_offset_align;
        *mem_align = sx.stx_dio_mem_align;
    }
#else
    (void)fd;
#endif
}

/* Opens one file, with O_DIRECT where asked and taken: a file system that refuses
 * the flag at open (tmpfs) or at the first read is read through the page cache, and
 * that is logged. */
static int file_open(bl_xr_t *x, xfile_t *f, const char *path, int want_direct, bl_err_t *err)
{
    f->fd = -1;
    if (!(f->path = strdup(path)))
        return bl_err_set(err, BL_ENOMEM, "out of memory for a path");
    f->align = 1;
    if (want_direct && !x->fake) {
        f->fd = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
        if (f->fd >= 0) {
            size_t oa, ma;
            direct_align(f->fd, &oa, &ma);
            /* a probe read of the first block: some file systems take the flag at
             * open and refuse the reads */
            void *probe = NULL;
            ssize_t got = -1;
            if (posix_memalign(&probe, ma > 4096 ? ma : 4096, oa > 4096 ? oa : 4096) == 0) {
                got = pread(f->fd, probe, oa > 4096 ? oa : 4096, 0);
                free(probe);
            }
            if (got >= 0) {
                f->direct = 1;
                f->align = oa;
                if (ma > x->mem_align)
                    x->mem_align = ma;
            } else {
                BL_LOG(BL_LOG_WARN, "event=xread_direct_refused path=%s why=\"%s\"", path, strerror(errno));
                close(f->fd);
                f->fd = -1;
            }
        } else if (errno != ENOENT && errno != EACCES) {
            BL_LOG(BL_LOG_WARN, "event=xread_direct_refused path=%s why=\"%s\"", path, strerror(errno));
        }
    }
    if (f->fd < 0 && (f->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return bl_err_set(err, errno == ENOENT ? BL_ENOENT : BL_EIO, "%s: cannot open: %s", path, strerror(errno));
    return bl_file_id_fd(f->fd, path, &f->id, err);
}

/* The io_uring backend, or the reason it cannot be had. */
static int uring_open(bl_xr_t *x, char *why, size_t cap)
{
#if BL_HAVE_LIBURING
    const int rc = io_uring_queue_init((unsigned)x->depth, &x->ring, 0);
    if (rc < 0) {
        snprintf(why, cap, "io_uring_setup: %s", strerror(-rc));
        return 0;
    }
    /* a ring can be set up and its reads still refused (seccomp on io_uring_enter
     * or on the read op): a NOP round trip proves the path */
    struct io_uring_sqe *sqe = io_uring_get_sqe(&x->ring);
    struct io_uring_cqe *cqe = NULL;
    int ok = 0;
    if (sqe) {
        io_uring_prep_nop(sqe);
        int s = io_uring_submit(&x->ring);
        if (s == 1 && io_uring_wait_cqe(&x->ring, &cqe) == 0) {
            ok = cqe->res == 0;
            if (!ok)
                snprintf(why, cap, "a NOP failed: %s", strerror(-cqe->res));
            io_uring_cqe_seen(&x->ring, cqe);
        } else {
            snprintf(why, cap, "io_uring_enter: %s", strerror(s < 0 ? -s : EIO));
        }
    }
    if (!ok)
        io_uring_queue_exit(&x->ring);
    return ok;
#else
    (void)x;
    snprintf(why, cap, "this build has no liburing");
    return 0;
#endif
}

int bl_xr_open(bl_xr_t **out, const char *const *paths, int n, const bl_xr_opts_t *o, bl_err_t *err)
{
    *out = NULL;
    bl_xr_opts_t d = {0};
    if (!o)
        o = &d;
    if (!paths || n < 1 || n > XR_MAX_FILES)
        return bl_err_set(err, BL_EINVAL, "xread: %d files (1..%d)", n, XR_MAX_FILES);
    if (o->kind < BL_XR_AUTO || o->kind > BL_XR_PREAD || o->depth < 0 || o->depth > XR_MAX_DEPTH)
        return bl_err_set(err, BL_EINVAL, "xread: backend %d or depth %d out of range (depth 1..%d)", o->kind,
                          o->depth, XR_MAX_DEPTH);
    if (o->fake && o->kind == BL_XR_URING)
        return bl_err_set(err, BL_EINVAL, "xread: a stand-in for pread runs on the pread backend only");
    bl_xr_t *x = calloc(1, sizeof *x);
    if (!x || !(x->f = calloc((size_t)n, sizeof *x->f))) {
        free(x);
        return bl_err_set(err, BL_ENOMEM, "out of memory for a reader");
    }
    x->depth = o->depth ? o->depth : XR_DEFAULT_DEPTH;
    x->mem_align = 1;
    x->fake = o->fake;
    x->fake_ctx = o->fake_ctx;
    int rc = 0;
    for (int i = 0; i < n; i++) {
        x->n = i + 1; /* closed on failure from here */
        if (!paths[i]) {
            rc = bl_err_set(err, BL_EINVAL, "xread: file %d has no path", i);
            goto fail;
        }
        if ((rc = file_open(x, &x->f[i], paths[i], o->direct, err)) < 0)
            goto fail;
    }
    char why[256] = "";
    if (!x->fake && o->kind != BL_XR_PREAD) {
        x->uring = uring_open(x, why, sizeof why);
        if (!x->uring && o->kind == BL_XR_URING) {
            rc = bl_err_set(err, BL_ENOTSUP, "io_uring refused (%s)", why);
            goto fail;
        }
    } else {
        snprintf(why, sizeof why, "%s", x->fake ? "a stand-in for pread" : "asked for");
    }
    if (x->uring)
        BL_LOG(BL_LOG_INFO, "event=xread backend=io_uring depth=%d direct=%d files=%d", x->depth,
               x->f[0].direct, x->n);
    else
        BL_LOG(BL_LOG_INFO, "event=xread backend=pread why=\"%s\" direct=%d files=%d", why, x->f[0].direct, x->n);
    *out = x;
    return 0;
fail:
    bl_xr_close(x);
    return rc;
}

void bl_xr_close(bl_xr_t *x)
{
    if (!x)
        return;
#if BL_HAVE_LIBURING
    if (x->uring)
        io_uring_queue_exit(&x->ring);
#endif
    for (int i = 0; i < x->n; i++) {
        if (x->f[i].fd >= 0)
            close(x->f[i].fd);
        free(x->f[i].path);
    }
    free(x->f);
    free(x);
}

const char *bl_xr_backend(const bl_xr_t *x) { return x->uring ? "io_uring" : "pread"; }
int bl_xr_direct(const bl_xr_t *x, int file) { return file >= 0 && file < x->n && x->f[file].direct; }
size_t bl_xr_mem_align(const bl_xr_t *x) { return x->mem_align; }
uint64_t bl_xr_file_size(const bl_xr_t *x, int file) { return file >= 0 && file < x->n ? x->f[file].id.size : 0; }

size_t bl_xr_span(const bl_xr_t *x, int file, uint64_t off, size_t len)
{
    const size_t a = file >= 0 && file < x->n ? x->f[file].align : 1;
    return (size_t)(round_up(off + len, a) - round_down(off, a));
}

int bl_xr_register(bl_xr_t *x, void *base, size_t len, bl_err_t *err)
{
    if (!base || len == 0)
        return bl_err_set(err, BL_EINVAL, "xread: an empty region to register");
#if BL_HAVE_LIBURING
    if (!x->uring)
        return 0;
    if (x->reg_base) {
        (void)io_uring_unregister_buffers(&x->ring);
        x->reg_base = NULL;
    }
    struct iovec iov = {.iov_base = base, .iov_len = len};
    const int rc = io_uring_register_buffers(&x->ring, &iov, 1);
    if (rc < 0) {
        BL_LOG(BL_LOG_WARN, "event=xread_register_refused bytes=%zu why=\"%s\"", len, strerror(-rc));
        return 0;
    }
    x->reg_base = base;
    x->reg_len = len;
#else
    (void)x;
#endif
    return 0;
}

/* One request's read: [a0, a0 + need) into buf, of which done bytes are in. */
typedef struct slot {
    int req;
    uint64_t a0;
    size_t need; /* bytes through the range's end */
    size_t want; /* bytes asked of the system: need rounded up to the block */
    size_t done;
    int retries; /* EAGAIN / EINTR completions resubmitted */
} slot_t;

static int check_req(const bl_xr_t *x, const bl_xr_req_t *r, int i, bl_err_t *err)
{
    if (r->file < 0 || r->file >= x->n)
        return bl_err_set(err, BL_EINVAL, "xread: request %d names file %d of %d", i, r->file, x->n);
    const xfile_t *f = &x->f[r->file];
    if (r->len == 0 || r->off > f->id.size || r->len > f->id.size - r->off)
        return bl_err_set(err, BL_ERANGE, "%s: %zu bytes at offset %llu pass the file's end (%llu bytes)", f->path,
                          r->len, (unsigned long long)r->off, (unsigned long long)f->id.size);
    if (!r->buf || r->cap < bl_xr_span(x, r->file, r->off, r->len))
        return bl_err_set(err, BL_EINVAL, "%s: a buffer of %zu bytes for %zu bytes at offset %llu (needs %zu)",
                          f->path, r->cap, r->len, (unsigned long long)r->off,
                          bl_xr_span(x, r->file, r->off, r->len));
    if (bl_xr_span(x, r->file, r->off, r->len) > XR_MAX_READ)
        return bl_err_set(err, BL_ERANGE, "%s: %zu bytes at offset %llu in one read (at most %u)", f->path, r->len,
                          (unsigned long long)r->off, XR_MAX_READ);
    if ((uintptr_t)r->buf % x->mem_align)
        return bl_err_set(err, BL_EINVAL, "%s: a buffer at %p is not aligned to %zu bytes", f->path,
                          (void *)r->buf, x->mem_align);
    return 0;
}

static void slot_init(const bl_xr_t *x, const bl_xr_req_t *r, int i, slot_t *s)
{
    const size_t a = x->f[r->file].align;
    s->req = i;
    s->a0 = round_down(r->off, a);
    s->need = (size_t)(r->off + r->len - s->a0);
    s->want = (size_t)round_up(s->need, a);
    s->done = 0;
    s->retries = 0;
}

/* What one completed read of got bytes (or -errno) means for its slot: 1 done,
 * 0 more to read, or an error. A read that returns 0 before the range's end means
 * the file ended early (it shrank under the reader). */
static int slot_account(const bl_xr_t *x, bl_xr_req_t *reqs, slot_t *s, ssize_t got, bl_err_t *err)
{
    bl_xr_req_t *r = &reqs[s->req];
    const xfile_t *f = &x->f[r->file];
    const unsigned long long at = (unsigned long long)(s->a0 + s->done);
    if (got < 0)
        return bl_err_set(err, BL_EIO, "%s: read of %zu bytes at offset %llu failed: %s", f->path,
                          s->want - s->done, at, strerror((int)-got));
    if ((size_t)got > s->want - s->done)
        return bl_err_set(err, BL_EIO, "%s: a read at offset %llu returned %zd bytes of %zu asked", f->path, at, got,
                          s->want - s->done);
    if (got == 0)
        return bl_err_set(err, BL_EIO, "%s: short read at offset %llu: %zu of %zu bytes (the file ends early)",
                          f->path, (unsigned long long)s->a0, s->done, s->need);
    s->done += (size_t)got;
    if (s->done < s->need)
        return 0;
    r->data = r->buf + (r->off - s->a0);
    return 1;
}

static ssize_t one_pread(bl_xr_t *x, const bl_xr_req_t *r, const slot_t *s)
{
    uint8_t *dst = r->buf + s->done;
    const size_t n = s->want - s->done;
    const uint64_t at = s->a0 + s->done;
    ssize_t got;
    do
        got = x->fake ? x->fake(x->fake_ctx, r->file, dst, n, at) : pread(x->f[r->file].fd, dst, n, (off_t)at);
    while (got < 0 && errno == EINTR);
    return got < 0 ? -(ssize_t)(errno ? errno : EIO) : got;
}

static int read_pread(bl_xr_t *x, bl_xr_req_t *reqs, int n, bl_err_t *err)
{
    for (int i = 0; i < n; i++) {
        slot_t s;
        slot_init(x, &reqs[i], i, &s);
        int rc;
        while ((rc = slot_account(x, reqs, &s, one_pread(x, &reqs[i], &s), err)) == 0)
            ;
        if (rc < 0)
            return rc;
    }
    return 0;
}

#if BL_HAVE_LIBURING
static void uring_prep(bl_xr_t *x, struct io_uring_sqe *sqe, const bl_xr_req_t *r, slot_t *s)
{
    uint8_t *dst = r->buf + s->done;
    const size_t n = s->want - s->done;
    const int fd = x->f[r->file].fd;
    if (x->reg_base && dst >= x->reg_base && dst + n <= x->reg_base + x->reg_len)
        io_uring_prep_read_fixed(sqe, fd, dst, (unsigned)n, s->a0 + s->done, 0);
    else
        io_uring_prep_read(sqe, fd, dst, (unsigned)n, s->a0 + s->done);
    io_uring_sqe_set_data(sqe, s);
}

static int read_uring(bl_xr_t *x, bl_xr_req_t *reqs, int n, bl_err_t *err)
{
    slot_t slots[XR_MAX_DEPTH];
    slot_t *free_[XR_MAX_DEPTH];
    int n_free = x->depth, next = 0, inflight = 0, rc = 0;
    for (int i = 0; i < x->depth; i++)
        free_[i] = &slots[i];
    while ((rc == 0 && next < n) || inflight > 0) {
        int queued = 0;
        while (rc == 0 && next < n && n_free > 0) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&x->ring);
            if (!sqe)
                break;
            slot_t *s = free_[--n_free];
            slot_init(x, &reqs[next], next, s);
            uring_prep(x, sqe, &reqs[next], s);
            next++;
            queued++;
            inflight++;
        }
        if (queued) {
            int s;
            do
                s = io_uring_submit(&x->ring);
            while (s == -EINTR);
            if (s < 0) {
                /* nothing of this batch went out, so nothing more will complete */
                inflight -= queued;
                if (rc == 0)
                    rc = bl_err_set(err, BL_EIO, "io_uring submit: %s", strerror(-s));
                if (inflight == 0)
                    break;
            }
        }
        if (inflight == 0)
            continue;
        struct io_uring_cqe *cqe = NULL;
        int w;
        do
            w = io_uring_wait_cqe(&x->ring, &cqe);
        while (w == -EINTR);
        if (w < 0) {
            /* the ring itself failed; what is in flight can no longer be waited on */
            return rc < 0 ? rc : bl_err_set(err, BL_EIO, "io_uring wait: %s", strerror(-w));
        }
        slot_t *s = io_uring_cqe_get_data(cqe);
        const int res = cqe->res;
        io_uring_cqe_seen(&x->ring, cqe);
        inflight--;
        if (!s)
            continue;
        int r;
        if ((res == -EINTR || res == -EAGAIN) && ++s->retries <= XR_RETRIES)
            r = 0;
        else
            r = slot_account(x, reqs, s, res, rc < 0 ? NULL : err);
        if (r == 0 && rc == 0) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&x->ring);
            if (sqe) {
                uring_prep(x, sqe, &reqs[s->req], s);
                inflight++;
                int q;
                do
                    q = io_uring_submit(&x->ring);
                while (q == -EINTR);
                if (q < 0) {
                    inflight--;
                    rc = bl_err_set(err, BL_EIO, "io_uring submit: %s", strerror(-q));
                    free_[n_free++] = s;
                }
                continue;
            }
            rc = bl_err_set(err, BL_EIO, "io_uring: no submission entry for a continued read");
        } else if (r < 0 && rc == 0) {
            rc = r;
        }
        free_[n_free++] = s;
    }
    return rc;
}
#endif

int bl_xr_read(bl_xr_t *x, bl_xr_req_t *reqs, int n, bl_err_t *err)
{
    if (n < 0 || (n > 0 && !reqs))
        return bl_err_set(err, BL_EINVAL, "xread: %d requests", n);
    for (int i = 0; i < n; i++) {
        reqs[i].data = NULL;
        const int rc = check_req(x, &reqs[i], i, err);
        if (rc < 0)
            return rc;
    }
#if BL_HAVE_LIBURING
    if (x->uring)
        return read_uring(x, reqs, n, err);
#endif
    return read_pread(x, reqs, n, err);
}

int bl_xr_check(const bl_xr_t *x, bl_err_t *err)
{
    for (int i = 0; i < x->n; i++) {
        const int rc = bl_file_id_check(x->f[i].path, &x->f[i].id, err);
        if (rc < 0)
            return rc;
    }
    return 0;
}
