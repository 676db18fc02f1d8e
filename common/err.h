/* Error codes and the caller-owned error message every fallible function fills.
 *
 * A fallible function returns 0 or a negative BL_E* code and, on failure, writes
 * one sentence into a bl_err_t naming the input at fault (file, key, tensor,
 * byte offset, value, limit). The buffer is the caller's; nothing is allocated. */
#ifndef BL_ERR_H
#define BL_ERR_H

#include <stddef.h>

#define BL_WUR __attribute__((warn_unused_result))
#define BL_PRINTF(a, b) __attribute__((format(printf, a, b)))

enum {
    BL_OK = 0,
    BL_EINVAL = -1,   /* an argument or an input is malformed */
    BL_ENOMEM = -2,   /* an allocation failed */
    BL_EIO = -3,      /* a system call on a file failed */
    BL_ERANGE = -4,   /* a count, size or offset is out of range or overflows */
    BL_ENOTSUP = -5,  /* a valid input this build does not handle (type, version) */
    BL_ENOENT = -6,   /* a named thing (file, key, tensor) does not exist */
    BL_ETIMEDOUT = -7, /* a peer did not answer within the timeout */
    BL_ECLOSED = -8,  /* a peer closed its end (or a ring is drained and closed) */
    BL_EAGAIN = -9,   /* no message or no room now, and the caller asked not to wait */
    BL_EPROTO = -10,  /* a peer's bytes break the protocol (corrupt header, index) */
    BL_EPERM = -11,   /* a peer is not allowed: it does not hold the cluster's secret */
};

typedef struct bl_err {
    int code;
    char msg[512];
} bl_err_t;

/* Records code and a formatted message in err (which may be NULL) and returns code,
 * so a failure reads `return bl_err_set(err, BL_EINVAL, "...", ...);`. */
int bl_err_set(bl_err_t *err, int code, const char *fmt, ...) BL_PRINTF(3, 4);

/* A short fixed name for a code ("invalid input", ...). */
const char *bl_strerror(int code);

#endif
