/* A growable byte buffer, kept NUL-terminated: the one the router's reply
 * splitters, the JSON-schema converter and the hub client's HTTP replies append to. */
#ifndef BL_BUF_H
#define BL_BUF_H

#include <stddef.h>

#include "err.h"

typedef struct bl_buf {
    char *p;    /* NUL-terminated once anything was added (even nothing); else NULL */
    size_t n;   /* bytes, without the NUL */
    size_t cap;
} bl_buf_t;

/* Appends s[0..n). max bounds b->n (0: no bound): BL_ERANGE past it, BL_ENOMEM;
 * b is unchanged on failure. */
int bl_buf_add(bl_buf_t *b, const char *s, size_t n, size_t max) BL_WUR;
/* Empties b and keeps its bytes for reuse (p stays NUL-terminated). */
void bl_buf_reset(bl_buf_t *b);
/* Frees the bytes; b is empty again. */
void bl_buf_free(bl_buf_t *b);

#endif
