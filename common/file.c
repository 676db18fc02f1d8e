/* Whole-file reads: see file.h. */
#include "file.h"

#include <errno.h>
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
