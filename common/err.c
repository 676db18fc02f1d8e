/* Error recording: see err.h. */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>

int bl_err_set(bl_err_t *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

const char *bl_strerror(int code)
{
    switch (code) {
    case BL_OK: return "ok";
    case BL_EINVAL: return "invalid input";
    case BL_ENOMEM: return "out of memory";
    case BL_EIO: return "i/o error";
    case BL_ERANGE: return "out of range";
    case BL_ENOTSUP: return "not supported";
    case BL_ENOENT: return "not found";
    case BL_ETIMEDOUT: return "timed out";
    case BL_ECLOSED: return "closed by the peer";
    case BL_EAGAIN: return "would wait";
    case BL_EPROTO: return "protocol error";
    case BL_EPERM: return "not allowed";
    }
    return "unknown error";
}
