/* Whole-file reads and file identities: see file.h. */
#include "file.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int bl_read_file(const char *path, size_t max_bytes, char **out, size_t *len, bl_err_t *err)
{
    *out = NULL;
    *len = 0;
    int is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f)
        return bl_err_set(err, errno == ENOENT ? BL_ENOENT : BL_EIO, "%s: %s", path,
                          strerror(errno));
    struct stat st;
    if (!is_stdin && fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) {
        fclose(f);
        return bl_err_set(err, BL_EIO, "%s: is a directory", path);
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (n == cap) {
            if (cap > max_bytes) {
                rc = bl_err_set(err, BL_ERANGE, "%s: larger than %zu bytes", path, max_bytes);
                goto fail;
            }
            size_t ncap = cap ? cap * 2 : 4096;
            if (ncap > max_bytes + 1)
                ncap = max_bytes + 1; /* one byte past the limit proves it is exceeded */
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                rc = bl_err_set(err, BL_ENOMEM, "%s: out of memory", path);
                goto fail;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        rc = bl_err_set(err, BL_EIO, "%s: read error", path);
        goto fail;
    }
    if (n > max_bytes) {
        rc = bl_err_set(err, BL_ERANGE, "%s: larger than %zu bytes", path, max_bytes);
        goto fail;
    }
    if (!is_stdin)
        fclose(f);
    if (!buf && !(buf = malloc(1)))
        return bl_err_set(err, BL_ENOMEM, "%s: out of memory", path);
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
fail:
    if (!is_stdin)
        fclose(f);
    free(buf);
    return rc;
}

static int id_of(const struct stat *st, const char *path, bl_file_id_t *out, bl_err_t *err)
{
    if (!S_ISREG(st->st_mode))
        return bl_err_set(err, BL_EINVAL, "%s: not a regular file", path);
    *out = (bl_file_id_t){.dev = (uint64_t)st->st_dev, .ino = (uint64_t)st->st_ino, .size = (uint64_t)st->st_size,
                          .mtime_s = (int64_t)st->st_mtim.tv_sec, .mtime_ns = (int64_t)st->st_mtim.tv_nsec};
    return 0;
}

int bl_file_id_fd(int fd, const char *path, bl_file_id_t *out, bl_err_t *err)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return bl_err_set(err, BL_EIO, "%s: cannot stat: %s", path, strerror(errno));
    return id_of(&st, path, out, err);
}

int bl_file_id_path(const char *path, bl_file_id_t *out, bl_err_t *err)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return bl_err_set(err, errno == ENOENT ? BL_ENOENT : BL_EIO, "%s: cannot stat: %s", path, strerror(errno));
    return id_of(&st, path, out, err);
}

int bl_file_id_check(const char *path, const bl_file_id_t *id, bl_err_t *err)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return bl_err_set(err, BL_EIO, "%s: the model file is gone since it was opened: %s", path, strerror(errno));
    if ((uint64_t)st.st_dev != id->dev || (uint64_t)st.st_ino != id->ino)
        return bl_err_set(err, BL_EIO, "%s: the model file was replaced since it was opened", path);
    if ((uint64_t)st.st_size != id->size)
        return bl_err_set(err, BL_EIO, "%s: the model file changed size since it was opened (%llu -> %llu bytes)",
                          path, (unsigned long long)id->size, (unsigned long long)st.st_size);
    if ((int64_t)st.st_mtim.tv_sec != id->mtime_s || (int64_t)st.st_mtim.tv_nsec != id->mtime_ns)
        return bl_err_set(err, BL_EIO, "%s: the model file was modified since it was opened", path);
    return 0;
}

/* mkdir -p of path's folders (and of path itself when whole). */
int bl_make_dirs(const char *path, int whole, bl_err_t *err)
{
    char tmp[PATH_MAX];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s", path) >= sizeof tmp)
        return bl_err_set(err, BL_ERANGE, "path too long: %.200s", path);
    if (!whole) {
        char *s = strrchr(tmp, '/');
        if (!s)
            return 0;
        *s = '\0';
    }
    for (char *p = tmp + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return bl_err_set(err, BL_EIO, "cannot create the folder %.300s: %s", tmp,
                                  strerror(errno));
            *p = c;
            if (!c)
                return 0;
        }
    }
}
