/* GGUF writer (see gguf_writer.h): owns the in-memory encoding of the key/value
 * section, the tensor table with its offsets, and the streaming of the file.
 * Layout written (GGUF v3, little-endian): magic, version, tensor count, kv count,
 * the key/values, the tensor infos, zero padding to the alignment, then each
 * tensor's bytes followed by zero padding to the alignment. */
#include "gguf_writer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GGUF_MAGIC "GGUF"
#define GGUF_VERSION 3u
#define MAX_KEY_BYTES 65535u

typedef struct gw_tensor {
    char *name;
    uint32_t n_dims;
    int64_t ne[BL_GGUF_MAX_DIMS];
    bl_type_t type;
    uint64_t offset; /* from the start of the data section */
    uint64_t nbytes;
} gw_tensor_t;

/* A growable byte buffer for the encoded key/value section. */
typedef struct gw_buf {
    uint8_t *p;
    size_t len, cap;
} gw_buf_t;

enum { ST_BUILD, ST_WRITING, ST_DONE, ST_FAILED };

struct bl_gguf_writer {
    gw_buf_t kv;     /* encoded key/values, exactly as they go to the file */
    uint64_t n_kv;
    char **keys;     /* for refusing repeats */
    size_t n_keys, keys_cap;

    gw_tensor_t *t;
    size_t n_t, t_cap;
    uint32_t alignment;
    uint64_t data_bytes; /* size of the data section so far, padding included */

    int state;
    FILE *f;
    char *path;
    size_t cur;          /* tensor being written */
    uint64_t cur_done;   /* its bytes written so far */
    uint64_t written;    /* file bytes written */
};

static int buf_reserve(gw_buf_t *b, size_t extra)
{
    if (b->len + extra < b->len)
        return BL_ERANGE;
    if (b->len + extra <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) {
        if (cap > SIZE_MAX / 2)
            return BL_ERANGE;
        cap *= 2;
    }
    uint8_t *p = realloc(b->p, cap);
    if (!p)
        return BL_ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

/* The put_* helpers assume the caller reserved room: encoding is then a plain
 * sequence of stores, and a failure can only happen in buf_reserve. */
static void put_bytes(gw_buf_t *b, const void *p, size_t n)
{
    if (n)
        memcpy(b->p + b->len, p, n);
    b->len += n;
}

static void put_le(gw_buf_t *b, uint64_t v, int nbytes)
{
    for (int i = 0; i < nbytes; i++)
        b->p[b->len++] = (uint8_t)(v >> (8 * i));
}

static void put_str(gw_buf_t *b, const char *s, size_t n)
{
    put_le(b, n, 8);
    put_bytes(b, s, n);
}

/* Reads element i of a host array of type t as its raw bit pattern. */
static uint64_t scalar_bits(bl_gguf_type_t t, const void *data, size_t i)
{
    switch (t) {
    case BL_GGUF_U8: case BL_GGUF_I8: return ((const uint8_t *)data)[i];
    case BL_GGUF_BOOL: return ((const uint8_t *)data)[i] != 0;
    case BL_GGUF_U16: case BL_GGUF_I16: return ((const uint16_t *)data)[i];
    case BL_GGUF_U32: case BL_GGUF_I32: return ((const uint32_t *)data)[i];
    case BL_GGUF_F32: { uint32_t u; memcpy(&u, (const float *)data + i, 4); return u; }
    case BL_GGUF_F64: { uint64_t u; memcpy(&u, (const double *)data + i, 8); return u; }
    case BL_GGUF_U64: case BL_GGUF_I64: return ((const uint64_t *)data)[i];
    case BL_GGUF_STRING: case BL_GGUF_ARRAY: case BL_GGUF_TYPE_COUNT: break;
    }
    return 0;
}

int bl_gw_create(bl_gguf_writer_t **out, bl_err_t *err)
{
    bl_gguf_writer_t *w = calloc(1, sizeof *w);
    if (!w)
        return bl_err_set(err, BL_ENOMEM, "gguf writer: out of memory");
    w->alignment = BL_GGUF_DEFAULT_ALIGNMENT;
    w->state = ST_BUILD;
    *out = w;
    return 0;
}

void bl_gw_destroy(bl_gguf_writer_t *w)
{
    if (!w)
        return;
    if (w->f) {
        /* Closing only; the file is removed below, so its status does not matter. */
        (void)fclose(w->f);
        if (w->path)
            (void)unlink(w->path);
    }
    for (size_t i = 0; i < w->n_keys; i++)
        free(w->keys[i]);
    free(w->keys);
    for (size_t i = 0; i < w->n_t; i++)
        free(w->t[i].name);
    free(w->t);
    free(w->kv.p);
    free(w->path);
    free(w);
}

/* Checks the key and records it; the caller then appends the encoded value. */
static int key_begin(bl_gguf_writer_t *w, const char *key, bl_err_t *err)
{
    if (w->state != ST_BUILD)
        return bl_err_set(err, BL_EINVAL, "gguf writer: key '%s' set after the file was begun",
                          key ? key : "(null)");
    if (!key || !key[0])
        return bl_err_set(err, BL_EINVAL, "gguf writer: empty metadata key");
    size_t klen = strlen(key);
    if (klen > MAX_KEY_BYTES)
        return bl_err_set(err, BL_EINVAL, "gguf writer: metadata key of %zu bytes (limit %u)",
                          klen, MAX_KEY_BYTES);
    for (size_t i = 0; i < w->n_keys; i++)
        if (strcmp(w->keys[i], key) == 0)
            return bl_err_set(err, BL_EINVAL, "gguf writer: metadata key '%s' set twice", key);
    if (w->n_keys == w->keys_cap) {
        size_t cap = w->keys_cap ? w->keys_cap * 2 : 64;
        char **k = realloc(w->keys, cap * sizeof *k);
        if (!k)
            return bl_err_set(err, BL_ENOMEM, "gguf writer: out of memory at key '%s'", key);
        w->keys = k;
        w->keys_cap = cap;
    }
    char *copy = strdup(key);
    if (!copy)
        return bl_err_set(err, BL_ENOMEM, "gguf writer: out of memory at key '%s'", key);
    w->keys[w->n_keys++] = copy;
    return 0;
}

/* Undoes key_begin when the value could not be encoded, so the writer stays usable. */
static void key_abort(bl_gguf_writer_t *w)
{
    free(w->keys[--w->n_keys]);
}

static int set_scalar(bl_gguf_writer_t *w, const char *key, bl_gguf_type_t t, uint64_t bits,
                      bl_err_t *err)
{
    int rc = key_begin(w, key, err);
    if (rc)
        return rc;
    size_t klen = strlen(key);
    if (buf_reserve(&w->kv, 8 + klen + 4 + 8)) {
        key_abort(w);
        return bl_err_set(err, BL_ENOMEM, "gguf writer: out of memory at key '%s'", key);
    }
    put_str(&w->kv, key, klen);
    put_le(&w->kv, (uint64_t)t, 4);
    put_le(&w->kv, bits, (int)bl_gguf_type_size(t));
    w->n_kv++;
    return 0;
}

int bl_gw_set_u8(bl_gguf_writer_t *w, const char *key, uint8_t v, bl_err_t *err)
{
    return set_scalar(w, key, BL_GGUF_U8, v, err);
}

int bl_gw_set_i8(bl_gguf_writer_t *w, const char *key, int8_t v, bl_err_t *err)
{
    return set_scalar(w, key, BL_GGUF_I8, (uint8_t)v, err);
}

int bl_gw_set_u16(bl_gguf_writer_t *w, const char *key, uint16_t v, bl_err_t *err)
{
    return set_scalar(w, key, BL_GGUF_U16, v, err);
}

int bl_gw_set_i16(bl_gguf_writer_t *w, const char *key, int16_t v, bl_err_t *err)
{
    return set_scalar(w, key, BL_GGUF_I16, (uint16_t)v, err);
}

int bl_gw_set_u32(bl_gguf_writer_t *w, const char *key, uint32_t v, bl_err_t *err)
{
    /* general.alignment is both metadata and the writer's padding rule. */
    if (key && strcmp(key, "general.alignment") == 0 && w->state == ST_BUILD) {
        if (v < 8 || v % 8 || (v & (v - 1)))
            return bl_err_set(err, BL_EINVAL,
                              "gguf writer: general.alignment %u is not a power of two >= 8", v);
        if (w->n_t)
            return bl_err_set(err, BL_EINVAL,
                              "gguf writer: general.alignment set after tensor '%s' was added",
                              w->t[0].name);
    }
    int rc = set_scalar(w, key, BL_GGUF_U32, v, err);
    if (rc == 0 && strcmp(key, "general.alignment") == 0)
        w->alignment = v;
    return rc;
}

int bl_gw_set_i32(bl_gguf_writer_t *w, const char *key, int32_t v, bl_err_t *err)
{
    return set_scalar(w, key, BL_GGUF_I32, (uint32_t)v, err);
}

int bl_gw_set_u64(bl_gguf_writer_t *w, const char *key, uint64_t v, bl_err_t *err)
{
    return set_scalar(w, key, BL_GGUF_U64, v, err);
}

int bl_gw_set_i64(bl_gguf_writer_t *w, const char *key, int64_t v, bl_err_t *err)
{
    return set_scalar(w, key, BL_GGUF_I64, (uint64_t)v, err);
}

int bl_gw_set_f32(bl_gguf_writer_t *w, const char *key, float v, bl_err_t *err)
{
    return set_scalar(w, key, BL_GGUF_F32, scalar_bits(BL_GGUF_F32, &v, 0), err);
}

int bl_gw_set_f64(bl_gguf_writer_t *w, const char *key, double v, bl_err_t *err)
{
    return set_scalar(w, key, BL_GGUF_F64, scalar_bits(BL_GGUF_F64, &v, 0), err);
}

int bl_gw_set_bool(bl_gguf_writer_t *w, const char *key, int v, bl_err_t *err)
{
    return set_scalar(w, key, BL_GGUF_BOOL, v != 0, err);
}

int bl_gw_set_strn(bl_gguf_writer_t *w, const char *key, const char *v, size_t len,
                   bl_err_t *err)
{
    if (!v && len)
        return bl_err_set(err, BL_EINVAL, "gguf writer: NULL string for key '%s'",
                          key ? key : "(null)");
    int rc = key_begin(w, key, err);
    if (rc)
        return rc;
    size_t klen = strlen(key);
    if (len > SIZE_MAX - 64 - klen || buf_reserve(&w->kv, 8 + klen + 4 + 8 + len)) {
        key_abort(w);
        return bl_err_set(err, BL_ENOMEM, "gguf writer: out of memory at key '%s'", key);
    }
    put_str(&w->kv, key, klen);
    put_le(&w->kv, BL_GGUF_STRING, 4);
    put_str(&w->kv, v, len);
    w->n_kv++;
    return 0;
}

int bl_gw_set_str(bl_gguf_writer_t *w, const char *key, const char *v, bl_err_t *err)
{
    if (!v)
        return bl_err_set(err, BL_EINVAL, "gguf writer: NULL string for key '%s'",
                          key ? key : "(null)");
    return bl_gw_set_strn(w, key, v, strlen(v), err);
}

int bl_gw_set_arr(bl_gguf_writer_t *w, const char *key, bl_gguf_type_t elem, const void *data,
                  size_t n, bl_err_t *err)
{
    size_t es = bl_gguf_type_size(elem);
    if (es == 0)
        return bl_err_set(err, BL_EINVAL,
                          "gguf writer: key '%s': array element type %d is not a scalar",
                          key ? key : "(null)", (int)elem);
    if (!data && n)
        return bl_err_set(err, BL_EINVAL, "gguf writer: NULL array for key '%s'",
                          key ? key : "(null)");
    int rc = key_begin(w, key, err);
    if (rc)
        return rc;
    size_t klen = strlen(key);
    if (n > (SIZE_MAX - 64 - klen) / es || buf_reserve(&w->kv, 8 + klen + 4 + 4 + 8 + n * es)) {
        key_abort(w);
        return bl_err_set(err, BL_ENOMEM, "gguf writer: out of memory at key '%s' (%zu elements)",
                          key, n);
    }
    put_str(&w->kv, key, klen);
    put_le(&w->kv, BL_GGUF_ARRAY, 4);
    put_le(&w->kv, (uint64_t)elem, 4);
    put_le(&w->kv, n, 8);
    for (size_t i = 0; i < n; i++)
        put_le(&w->kv, scalar_bits(elem, data, i), (int)es);
    w->n_kv++;
    return 0;
}

int bl_gw_set_arr_str(bl_gguf_writer_t *w, const char *key, const char *const *v, size_t n,
                      bl_err_t *err)
{
    if (!v && n)
        return bl_err_set(err, BL_EINVAL, "gguf writer: NULL array for key '%s'",
                          key ? key : "(null)");
    for (size_t i = 0; i < n; i++)
        if (!v[i])
            return bl_err_set(err, BL_EINVAL, "gguf writer: key '%s': string %zu is NULL",
                              key ? key : "(null)", i);
    int rc = key_begin(w, key, err);
    if (rc)
        return rc;
    size_t klen = strlen(key);
    /* Encoded strings are appended one at a time, so a failure part way leaves a
     * partial entry: it is cut back to where this key began. */
    size_t start = w->kv.len;
    if (buf_reserve(&w->kv, 8 + klen + 4 + 4 + 8))
        goto fail;
    put_str(&w->kv, key, klen);
    put_le(&w->kv, BL_GGUF_ARRAY, 4);
    put_le(&w->kv, BL_GGUF_STRING, 4);
    put_le(&w->kv, n, 8);
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(v[i]);
        if (len > SIZE_MAX - 8 || buf_reserve(&w->kv, 8 + len))
            goto fail;
        put_str(&w->kv, v[i], len);
    }
    w->n_kv++;
    return 0;
fail:
    w->kv.len = start;
    key_abort(w);
    return bl_err_set(err, BL_ENOMEM, "gguf writer: out of memory at key '%s' (%zu strings)",
                      key, n);
}

int bl_gw_add_tensor(bl_gguf_writer_t *w, const char *name, bl_type_t type, int n_dims,
                     const int64_t *ne, bl_err_t *err)
{
    if (w->state != ST_BUILD)
        return bl_err_set(err, BL_EINVAL, "gguf writer: tensor '%s' added after the file was begun",
                          name ? name : "(null)");
    if (!name || !name[0])
        return bl_err_set(err, BL_EINVAL, "gguf writer: empty tensor name");
    size_t nlen = strlen(name);
    if (nlen > BL_GW_MAX_NAME)
        return bl_err_set(err, BL_EINVAL, "gguf writer: tensor name '%s' is %zu bytes (limit %d)",
                          name, nlen, BL_GW_MAX_NAME);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return bl_err_set(err, BL_EINVAL, "gguf writer: tensor '%s' added twice", name);
    const bl_type_info_t *ti = bl_type_info((uint32_t)type);
    if (!ti || ti->block_elems == 0)
        return bl_err_set(err, BL_EINVAL, "gguf writer: tensor '%s': unknown type %d", name,
                          (int)type);
    if (n_dims < 1 || n_dims > (int)BL_GGUF_MAX_DIMS || !ne)
        return bl_err_set(err, BL_EINVAL, "gguf writer: tensor '%s': %d dimensions (1..%u)", name,
                          n_dims, BL_GGUF_MAX_DIMS);
    for (int d = 0; d < n_dims; d++)
        if (ne[d] < 1)
            return bl_err_set(err, BL_EINVAL, "gguf writer: tensor '%s': ne[%d] = %lld", name, d,
                              (long long)ne[d]);
    if (ne[0] % ti->block_elems)
        return bl_err_set(err, BL_EINVAL,
                          "gguf writer: tensor '%s': row length %lld is not a multiple of %s's "
                          "block of %u", name, (long long)ne[0], ti->name, ti->block_elems);

    /* Bytes = blocks per row * block bytes * rows, each step checked for overflow. */
    uint64_t nbytes = (uint64_t)(ne[0] / ti->block_elems) * ti->block_bytes;
    for (int d = 1; d < n_dims; d++) {
        if (nbytes > UINT64_MAX / (uint64_t)ne[d])
            return bl_err_set(err, BL_ERANGE, "gguf writer: tensor '%s': size overflows", name);
        nbytes *= (uint64_t)ne[d];
    }
    uint64_t padded = nbytes + (w->alignment - nbytes % w->alignment) % w->alignment;
    if (padded < nbytes || w->data_bytes > UINT64_MAX - padded)
        return bl_err_set(err, BL_ERANGE, "gguf writer: tensor '%s': data section overflows", name);

    if (w->n_t == w->t_cap) {
        size_t cap = w->t_cap ? w->t_cap * 2 : 64;
        gw_tensor_t *t = realloc(w->t, cap * sizeof *t);
        if (!t)
            return bl_err_set(err, BL_ENOMEM, "gguf writer: out of memory at tensor '%s'", name);
        w->t = t;
        w->t_cap = cap;
    }
    gw_tensor_t *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    if (!t->name)
        return bl_err_set(err, BL_ENOMEM, "gguf writer: out of memory at tensor '%s'", name);
    t->n_dims = (uint32_t)n_dims;
    for (int d = 0; d < n_dims; d++)
        t->ne[d] = ne[d];
    t->type = type;
    t->offset = w->data_bytes;
    t->nbytes = nbytes;
    w->data_bytes += padded;
    w->n_t++;
    return 0;
}

size_t bl_gw_tensor_count(const bl_gguf_writer_t *w)
{
    return w->n_t;
}

uint64_t bl_gw_tensor_nbytes(const bl_gguf_writer_t *w, size_t i)
{
    return i < w->n_t ? w->t[i].nbytes : 0;
}

const char *bl_gw_tensor_name(const bl_gguf_writer_t *w, size_t i)
{
    return i < w->n_t ? w->t[i].name : NULL;
}

size_t bl_gw_current_tensor(const bl_gguf_writer_t *w)
{
    return w->cur;
}

uint64_t bl_gw_bytes_written(const bl_gguf_writer_t *w)
{
    return w->written;
}

static int file_write(bl_gguf_writer_t *w, const void *p, size_t n, bl_err_t *err)
{
    if (n && fwrite(p, 1, n, w->f) != n) {
        w->state = ST_FAILED;
        return bl_err_set(err, BL_EIO, "%s: write failed at byte %llu: %s", w->path,
                          (unsigned long long)w->written, strerror(errno));
    }
    w->written += n;
    return 0;
}

static int write_zeros(bl_gguf_writer_t *w, uint64_t n, bl_err_t *err)
{
    static const uint8_t zeros[256];
    while (n) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        int rc = file_write(w, zeros, k, err);
        if (rc)
            return rc;
        n -= k;
    }
    return 0;
}

static uint64_t pad_to(uint64_t pos, uint32_t align)
{
    return (align - pos % align) % align;
}

/* Skips past tensors whose data is complete (including empty-size ones, which
 * cannot occur today but cost nothing to handle). */
static void advance(bl_gguf_writer_t *w)
{
    while (w->cur < w->n_t && w->cur_done == w->t[w->cur].nbytes) {
        w->cur++;
        w->cur_done = 0;
    }
}

int bl_gw_begin(bl_gguf_writer_t *w, const char *path, bl_err_t *err)
{
    if (w->state != ST_BUILD)
        return bl_err_set(err, BL_EINVAL, "gguf writer: %s: file already begun", path);
    w->path = strdup(path);
    if (!w->path)
        return bl_err_set(err, BL_ENOMEM, "gguf writer: out of memory");
    w->f = fopen(path, "wb");
    if (!w->f) {
        int e = errno;
        free(w->path);
        w->path = NULL;
        return bl_err_set(err, BL_EIO, "%s: cannot create: %s", path, strerror(e));
    }
    /* Large stdio buffer: tensor data arrives row by row, in pieces of a few KiB. */
    (void)setvbuf(w->f, NULL, _IOFBF, 1 << 20); /* only a hint; the default buffer works too */
    w->state = ST_WRITING;

    gw_buf_t h = {0};
    int rc = 0;
    size_t info_bytes = 24;
    for (size_t i = 0; i < w->n_t; i++)
        info_bytes += 8 + strlen(w->t[i].name) + 4 + 8 * w->t[i].n_dims + 4 + 8;
    if (buf_reserve(&h, info_bytes)) {
        rc = bl_err_set(err, BL_ENOMEM, "gguf writer: out of memory for %zu tensor infos", w->n_t);
        goto fail;
    }
    put_bytes(&h, GGUF_MAGIC, 4);
    put_le(&h, GGUF_VERSION, 4);
    put_le(&h, w->n_t, 8);
    put_le(&h, w->n_kv, 8);
    size_t head = h.len;
    if ((rc = file_write(w, h.p, head, err)) || (rc = file_write(w, w->kv.p, w->kv.len, err)))
        goto fail;
    h.len = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        const gw_tensor_t *t = &w->t[i];
        put_str(&h, t->name, strlen(t->name));
        put_le(&h, t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims; d++)
            put_le(&h, (uint64_t)t->ne[d], 8);
        put_le(&h, (uint64_t)t->type, 4);
        put_le(&h, t->offset, 8);
    }
    if ((rc = file_write(w, h.p, h.len, err)) ||
        (rc = write_zeros(w, pad_to(w->written, w->alignment), err)))
        goto fail;
    free(h.p);
    w->cur = 0;
    w->cur_done = 0;
    advance(w);
    return 0;
fail:
    free(h.p);
    w->state = ST_FAILED;
    return rc;
}

/* n bytes of tensor data from buf, or (buf NULL) a hole the file system leaves
 * unallocated, which reads as zeros. */
static int put_data(bl_gguf_writer_t *w, const void *buf, uint64_t n, bl_err_t *err)
{
    if (w->state != ST_WRITING)
        return bl_err_set(err, BL_EINVAL, "gguf writer: %s: tensor data written %s",
                          w->path ? w->path : "(no file)",
                          w->state == ST_BUILD ? "before bl_gw_begin" : "after a failure or finish");
    const uint8_t *p = buf;
    while (n) {
        if (w->cur >= w->n_t) {
            w->state = ST_FAILED;
            return bl_err_set(err, BL_EINVAL,
                              "gguf writer: %s: %llu bytes of tensor data past the last tensor",
                              w->path, (unsigned long long)n);
        }
        const gw_tensor_t *t = &w->t[w->cur];
        uint64_t left = t->nbytes - w->cur_done;
        uint64_t k = n < left ? n : left;
        int rc = 0;
        if (p) {
            rc = file_write(w, p, (size_t)k, err);
            p += k;
        } else if (k > INT64_MAX || fseeko(w->f, (off_t)k, SEEK_CUR) != 0) {
            w->state = ST_FAILED;
            rc = bl_err_set(err, BL_EIO, "%s: seek failed at byte %llu: %s", w->path,
                            (unsigned long long)w->written, strerror(errno));
        } else {
            w->written += k;
        }
        if (rc)
            return rc;
        n -= k;
        w->cur_done += k;
        if (w->cur_done == t->nbytes) {
            rc = write_zeros(w, pad_to(w->written, w->alignment), err);
            if (rc)
                return rc;
            advance(w);
        }
    }
    return 0;
}

int bl_gw_write_data(bl_gguf_writer_t *w, const void *buf, size_t n, bl_err_t *err)
{
    if (!buf && n)
        return bl_err_set(err, BL_EINVAL, "gguf writer: %s: %zu bytes of data from NULL", w->path ? w->path : "?", n);
    return put_data(w, buf ? buf : "", n, err);
}

int bl_gw_skip_data(bl_gguf_writer_t *w, uint64_t n, bl_err_t *err)
{
    return put_data(w, NULL, n, err);
}

int bl_gw_finish(bl_gguf_writer_t *w, bl_err_t *err)
{
    if (w->state != ST_WRITING)
        return bl_err_set(err, BL_EINVAL, "gguf writer: %s: finish without a begun file",
                          w->path ? w->path : "(no file)");
    if (w->cur < w->n_t) {
        w->state = ST_FAILED;
        return bl_err_set(err, BL_EINVAL,
                          "gguf writer: %s: tensor '%s' got %llu of its %llu bytes", w->path,
                          w->t[w->cur].name, (unsigned long long)w->cur_done,
                          (unsigned long long)w->t[w->cur].nbytes);
    }
    FILE *f = w->f;
    w->f = NULL;
    int bad = fflush(f) != 0 || ferror(f);
    int e = errno;
    /* a hole at the end (bl_gw_skip_data) is no byte yet: the size makes it one */
    if (!bad && (ftello(f) < 0 || ftruncate(fileno(f), (off_t)w->written) != 0)) {
        bad = 1;
        e = errno;
    }
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    if (bad) {
        w->state = ST_FAILED;
        (void)unlink(w->path); /* a short file must not pass for a model */
        return bl_err_set(err, BL_EIO, "%s: write failed: %s", w->path, strerror(e));
    }
    w->state = ST_DONE;
    return 0;
}

int bl_gw_write_file(bl_gguf_writer_t *w, const char *path, bl_gw_fill_fn fill, void *ud,
                     bl_err_t *err)
{
    int rc = bl_gw_begin(w, path, err);
    if (rc)
        return rc;
    for (size_t i = 0; i < w->n_t; i++) {
        uint64_t before = w->written;
        size_t cur_before = w->cur;
        rc = fill(ud, w, i, err);
        if (rc)
            goto fail;
        /* The callback must have written exactly this tensor: the cursor sits on
         * the next one and no byte of the next one was written. */
        if (cur_before != i || w->cur != i + 1 || w->cur_done != 0) {
            rc = bl_err_set(err, BL_EINVAL,
                            "gguf writer: %s: tensor '%s' was given %llu bytes, expected %llu",
                            path, w->t[i].name,
                            (unsigned long long)(w->written - before),
                            (unsigned long long)w->t[i].nbytes);
            goto fail;
        }
    }
    return bl_gw_finish(w, err);
fail:
    w->state = ST_FAILED;
    return rc;
}
