/* Whole-file reads for small inputs (prompts, templates, configuration), bounded so
 * that an untrusted path cannot make the process allocate without limit. */
#ifndef BL_FILE_H
#define BL_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* Reads path ("-" is standard input) into a NUL-terminated buffer the caller frees
 * with free(); *len excludes the NUL. BL_ENOENT (no such file), BL_EIO (cannot open
 * or read; a directory), BL_ERANGE (more than max_bytes), BL_ENOMEM; err names the
 * path. */
int bl_read_file(const char *path, size_t max_bytes, char **out, size_t *len,
                 bl_err_t *err) BL_WUR;

/* One version of a file: what tells a model file replaced or rewritten under a
 * running process from the one it opened. */
typedef struct bl_file_id {
    uint64_t dev, ino, size;
    int64_t mtime_s, mtime_ns;
} bl_file_id_t;

/* The identity of the open file fd (path names it in errors), or of path. BL_EIO
 * (cannot stat), BL_ENOENT (path: no such file), BL_EINVAL (not a regular file). */
int bl_file_id_fd(int fd, const char *path, bl_file_id_t *out, bl_err_t *err) BL_WUR;
int bl_file_id_path(const char *path, bl_file_id_t *out, bl_err_t *err) BL_WUR;

/* 0 if path is still the file of id: same device, inode, size and modification
 * time. Else BL_EIO with a message that names the path and what changed (gone,
 * replaced, resized, modified). */
int bl_file_id_check(const char *path, const bl_file_id_t *id, bl_err_t *err) BL_WUR;

/* mkdir -p: the folders of path (and path itself when whole), mode 0755. BL_ERANGE
 * (a path over PATH_MAX), BL_EIO naming the folder that could not be made. */
int bl_make_dirs(const char *path, int whole, bl_err_t *err) BL_WUR;

#endif
