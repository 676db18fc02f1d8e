/* Expert reads from the model's files: the disk tier's reader. A request names a
 * file, a byte range and a buffer; the reader fills the buffer with an aligned
 * superset of the range (O_DIRECT needs block-aligned offsets, lengths and memory)
 * and points at the range inside it, so the neighbours read for alignment are simply
 * dropped. Several requests are in flight at once through io_uring (registered
 * buffers where the caller registered its slot memory), or through pread where
 * io_uring is refused: by seccomp, a container, an old kernel. The backend and the
 * reason for a fallback are logged once at open.
 *
 * Every failure names the file and the offset: a read error, a short read (the file
 * ended before the range), a file replaced or changed since open (bl_xr_check).
 *
 * Threads: one thread at a time per reader. */
#ifndef BL_XREAD_H
#define BL_XREAD_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"

typedef struct bl_xr bl_xr_t;

typedef enum bl_xr_kind {
    BL_XR_AUTO = 0,  /* io_uring where the system gives it, else pread */
    BL_XR_URING = 1, /* io_uring or an error */
    BL_XR_PREAD = 2, /* pread only */
} bl_xr_kind_t;

/* A stand-in for pread(2) (tests and fuzzing: errors, short reads, delays). It
 * returns what pread returns, with errno set on -1. With it the reader uses the
 * pread backend and never opens O_DIRECT. */
typedef ssize_t (*bl_xr_pread_fn)(void *ctx, int file, void *buf, size_t n, uint64_t off);

typedef struct bl_xr_opts {
    int kind;              /* bl_xr_kind_t */
    int depth;             /* reads in flight, 1..256 (0: 8) */
    int direct;            /* 1: O_DIRECT where the file system takes it (the page
                            * cache would otherwise hide the disk and cost RAM) */
    bl_xr_pread_fn fake;   /* NULL: the real files */
    void *fake_ctx;
} bl_xr_opts_t;

typedef struct bl_xr_req {
    int file;            /* index into the paths given at open */
    uint64_t off;        /* the range wanted */
    size_t len;
    uint8_t *buf;        /* aligned to bl_xr_mem_align; cap >= bl_xr_span(off, len) */
    size_t cap;
    const uint8_t *data; /* out: the range's first byte, inside buf */
} bl_xr_req_t;

/* Opens the n paths (the parts of a split model) and the backend. BL_ENOENT / BL_EIO
 * (a file that cannot be opened, named), BL_EINVAL (bad options), BL_ENOTSUP
 * (BL_XR_URING and io_uring refused, with the system's reason), BL_ENOMEM. */
int bl_xr_open(bl_xr_t **out, const char *const *paths, int n, const bl_xr_opts_t *o, bl_err_t *err) BL_WUR;
void bl_xr_close(bl_xr_t *x); /* NULL is a no-op */

/* "io_uring" or "pread". */
const char *bl_xr_backend(const bl_xr_t *x);
/* Whether file i is read with O_DIRECT. */
int bl_xr_direct(const bl_xr_t *x, int file);
/* The alignment buffers need (1 when no file is read with O_DIRECT). */
size_t bl_xr_mem_align(const bl_xr_t *x);
/* Bytes of buffer a read of [off, off + len) of file i takes with its alignment. */
size_t bl_xr_span(const bl_xr_t *x, int file, uint64_t off, size_t len);
/* The size of file i at open. */
uint64_t bl_xr_file_size(const bl_xr_t *x, int file);

/* Registers [base, base + len) with io_uring so that reads into it skip the per-read
 * page pinning (one region; a second call replaces it). A refusal (the locked-memory
 * limit) is logged and reads go on unregistered; returns 0 either way, or BL_EINVAL. */
int bl_xr_register(bl_xr_t *x, void *base, size_t len, bl_err_t *err) BL_WUR;

/* Reads every request, depth at a time, and sets each one's data. On failure the
 * reads already in flight are drained, and err names the first failure's file,
 * offset and cause: BL_EIO (a read error, or the file ended inside a range), BL_EINVAL
 * (a bad request: file index, a buffer too small or misaligned), BL_ERANGE (a range
 * past the file's size at open). */
int bl_xr_read(bl_xr_t *x, bl_xr_req_t *reqs, int n, bl_err_t *err) BL_WUR;

/* Whether each file is still the one opened: same device, inode, size and
 * modification time, at its path. BL_EIO naming the file and what changed. */
int bl_xr_check(const bl_xr_t *x, bl_err_t *err) BL_WUR;

#endif
