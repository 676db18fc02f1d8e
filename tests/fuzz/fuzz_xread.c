/* libFuzzer target for the disk tier's reader (common/xread.c) against a disk that
 * misbehaves as the input says: the first bytes choose up to 16 requests (offset,
 * length, spare buffer), the rest script the stand-in for pread call by call (full,
 * short by k bytes, EINTR, EIO, EAGAIN, an early end, a delay); once the script runs
 * out the disk answers in full. Invariants beside the sanitizers': a read that
 * succeeds gives every range's exact bytes inside its buffer; a failure names the
 * file; the reader never asks the disk for bytes outside a request's buffer. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "xread.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { FILE_SIZE = 65536 + 77, MAX_REQS = 16 };

static char g_path[64];
static uint8_t g_file[FILE_SIZE];

typedef struct script {
    const uint8_t *p;
    size_t n, at;
    uint8_t *lo[MAX_REQS], *hi[MAX_REQS]; /* each request's buffer */
    int n_bufs;
} script_t;

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_xread: %s\n", what);
        abort();
    }
}

static ssize_t disk(void *ctx, int file, void *buf, size_t n, uint64_t off)
{
    script_t *s = ctx;
    check(file == 0, "a read of a file that was not opened");
    int inside = 0;
    for (int i = 0; i < s->n_bufs; i++)
        inside |= (uint8_t *)buf >= s->lo[i] && (uint8_t *)buf + n <= s->hi[i];
    check(inside, "a read outside every request's buffer");
    const uint8_t op = s->at < s->n ? s->p[s->at++] : 0;
    if (off >= FILE_SIZE)
        return 0;
    size_t k = n < FILE_SIZE - off ? n : (size_t)(FILE_SIZE - off);
    switch (op % 8) {
    case 1: /* short */
        if (k > 1)
            k = 1 + (size_t)(op >> 3) % k;
        break;
    case 2:
        errno = EINTR;
        return -1;
    case 3:
        errno = EIO;
        return -1;
    case 4:
        errno = EAGAIN;
        return -1;
    case 5: /* the file ends here */
        return 0;
    case 6: { /* a slow disk */
        struct timespec ts = {0, 1000};
        nanosleep(&ts, NULL);
        break;
    }
    default:
        break;
    }
    memcpy(buf, g_file + off, k);
    return (ssize_t)k;
}

static void remove_file(void) { unlink(g_path); }

static void init(void)
{
    if (g_path[0])
        return;
    atexit(remove_file);
    bl_log_init("fuzz", BL_LOG_OFF);
    for (size_t i = 0; i < FILE_SIZE; i++)
        g_file[i] = (uint8_t)(i * 131 + (i >> 8));
    snprintf(g_path, sizeof g_path, "/tmp/fuzz_xread_%d.bin", (int)getpid());
    FILE *f = fopen(g_path, "wb");
    check(f && fwrite(g_file, 1, FILE_SIZE, f) == FILE_SIZE && fclose(f) == 0, "cannot write the file");
}

static uint32_t take(const uint8_t **p, size_t *n, int bytes)
{
    uint32_t v = 0;
    for (int i = 0; i < bytes; i++) {
        v = v << 8 | (*n ? **p : 0);
        if (*n) {
            (*p)++;
            (*n)--;
        }
    }
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    init();
    if (size > 4096)
        return 0;
    const uint8_t *p = data;
    size_t n = size;
    const int n_reqs = (int)(take(&p, &n, 1) % MAX_REQS) + 1;
    bl_xr_req_t r[MAX_REQS];
    script_t s = {0};
    for (int i = 0; i < n_reqs; i++) {
        uint32_t off = take(&p, &n, 3) % (FILE_SIZE + 16); /* a few past the end */
        uint32_t len = take(&p, &n, 2);
        uint32_t spare = take(&p, &n, 1);
        r[i] = (bl_xr_req_t){.file = 0, .off = off, .len = len};
        r[i].cap = (size_t)len + (spare % 4 == 0 ? 0 : spare); /* some too small on purpose below */
        if (spare == 255 && len > 0)
            r[i].cap = len - 1;
        r[i].buf = malloc(r[i].cap ? r[i].cap : 1);
        check(r[i].buf != NULL, "out of memory");
        s.lo[i] = r[i].buf;
        s.hi[i] = r[i].buf + r[i].cap;
    }
    s.n_bufs = n_reqs;
    s.p = p;
    s.n = n;
    const char *paths[1] = {g_path};
    bl_xr_opts_t o = {.kind = BL_XR_AUTO, .depth = 1 + (int)(size % 8), .fake = disk, .fake_ctx = &s};
    bl_xr_t *x = NULL;
    bl_err_t err = {0};
    check(bl_xr_open(&x, paths, 1, &o, &err) == 0, "open failed");
    const int rc = bl_xr_read(x, r, n_reqs, &err);
    if (rc == 0) {
        for (int i = 0; i < n_reqs; i++) {
            check(r[i].data && r[i].data >= r[i].buf && r[i].data + r[i].len <= r[i].buf + r[i].cap,
                  "a range outside its buffer");
            check(memcmp(r[i].data, g_file + r[i].off, r[i].len) == 0, "wrong bytes");
        }
    } else {
        check(rc < 0 && err.msg[0], "a failure without a message");
        check(strstr(err.msg, g_path) != NULL || strstr(err.msg, "xread") != NULL, "a failure that names nothing");
    }
    bl_xr_close(x);
    for (int i = 0; i < n_reqs; i++)
        free(r[i].buf);
    return 0;
}
