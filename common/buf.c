/* Growable NUL-terminated byte buffers (common/buf.h). */
#include "buf.h"

#include <stdlib.h>
#include <string.h>

int bl_buf_add(bl_buf_t *b, const char *s, size_t n, size_t max)
{
    if (max && (n > max || b->n + n > max))
        return BL_ERANGE;
    if (n == 0 && b->p)
        return 0;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return BL_ENOMEM;
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

void bl_buf_reset(bl_buf_t *b)
{
    b->n = 0;
    if (b->p)
        b->p[0] = '\0';
}

void bl_buf_free(bl_buf_t *b)
{
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}
