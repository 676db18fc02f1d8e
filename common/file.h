/* Whole-file reads for small inputs (prompts, templates, configuration), bounded so
 * that an untrusted path cannot make the process allocate without limit. */
#ifndef BL_FILE_H
#define BL_FILE_H

#include <stddef.h>

#include "err.h"

/* Reads path ("-" is standard input) into a NUL-terminated buffer the caller frees
 * with free(); *len excludes the NUL. BL_ENOENT (no such file), BL_EIO (cannot open
 * or read; a directory), BL_ERANGE (more than max_bytes), BL_ENOMEM; err names the
 * path. */
int bl_read_file(const char *path, size_t max_bytes, char **out, size_t *len,
                 bl_err_t *err) BL_WUR;

#endif
