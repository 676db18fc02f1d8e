/* The GGUF reader (see gguf.h): maps each part read-only, walks it once with a
 * bounds-checked cursor, and records keys, arrays and tensors in flat tables that
 * point into the mapping. Nothing is read outside [base, base + size) of a part,
 * and every count from the file is checked against the bytes left before anything
 * is allocated for it. */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quant.h"

#define NONE UINT64_MAX

/* Smallest encoding of one item, used to refuse counts that cannot fit in the bytes
 * left before anything is allocated for them. */
#define MIN_KV_BYTES 14u     /* key length 8 + one key byte + type 4 + a u8 value */
#define MIN_TENSOR_BYTES 29u /* name length 8 + 1 name byte + n_dims 4 + one dim 8 + type 4 + offset 8 */
#define MIN_ARRAY_BYTES 12u  /* element type 4 + count 8 */
#define MIN_STRING_BYTES 8u  /* length 8 */

struct bl_gguf_arr {
    uint32_t elem_type;
    uint32_t depth;          /* 1 for a key's own array */
    uint64_t count;
    const uint8_t *data;     /* element 0 in the mapping */
    uint64_t file_offset;    /* of element 0 */
    const uint64_t *off;     /* string/array elements: offset of each from data */
    uint64_t off_base;       /* index of off[0] in the offset pool while parsing */
    uint64_t first_child;    /* array elements: index of element 0's node */
    uint64_t kv_index;
    const bl_gguf_kv_t *kv;
    const bl_gguf_t *g;
};

struct bl_gguf_kv {
    bl_gguf_str_t key;
    uint32_t type;
    uint32_t part;
    uint64_t key_offset;
    uint64_t val_offset;
    const uint8_t *val;      /* the value's bytes in the mapping (for an array, its header) */
    uint64_t arr_index;      /* NONE unless type is array */
    const bl_gguf_arr_t *arr;
    const char *path;
};

typedef struct part {
    char *path;
    const uint8_t *base;
    uint64_t size;
    bool mapped;             /* munmap at close (not for bl_gguf_open_memory) */
    uint32_t version;
    uint32_t alignment;
    uint64_t n_kv, kv_first;
    uint64_t n_tensors, tensor_first;
    uint64_t data_offset;
} part_t;

struct bl_gguf {
    part_t *parts;
    uint32_t n_parts;

    bl_gguf_kv_t *kvs;       /* every part's keys, part 0's first */
    uint64_t n_kvs, cap_kvs;
    bl_gguf_arr_t *arrs;     /* every array value, nested ones included */
    uint64_t n_arrs, cap_arrs;
    uint64_t *offs;          /* element offsets of string and array arrays */
    uint64_t n_offs, cap_offs;
    bl_gguf_tensor_t *tensors;
    uint64_t *name_off;      /* while parsing: offset of each tensor's name in names */
    uint64_t n_tensors, cap_tensors, cap_name_off;
    char *names;
    uint64_t n_names, cap_names;

    uint64_t *kv_hash;       /* part 0's keys: slot holds kv index + 1, 0 is empty */
    uint64_t kv_mask;
    uint64_t *t_hash;        /* all tensors, same scheme */
    uint64_t t_mask;
};

/* A bounds-checked reader over one part, plus what it is reading for messages. */
typedef struct cur {
    bl_gguf_t *g;
    const uint8_t *base;
    uint64_t size;
    uint64_t pos;
    uint32_t part;
    const char *path;
    bl_err_t *err;
    const char *kind;        /* "header", "key", "tensor" */
    const char *name;        /* the key or tensor name, not NUL-terminated */
    uint64_t name_len;
    uint64_t item_offset;    /* where the key or tensor info starts */
} cur_t;

/* --- small helpers --------------------------------------------------------------- */

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | ((uint64_t)rd32(p + 4) << 32); }

static uint64_t fnv1a(const void *s, uint64_t n)
{
    const uint8_t *p = s;
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Writes at most 48 bytes of s into out, escaping what is not printable ASCII, so
 * that hostile names cannot garble a message. */
static void escape_name(char *out, size_t cap, const char *s, uint64_t n)
{
    size_t o = 0;
    uint64_t i = 0;
    for (; i < n && i < 48 && o + 5 < cap; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 0x20 && ch < 0x7f && ch != '\'' && ch != '\\')
            out[o++] = (char)ch;
        else
            o += (size_t)snprintf(out + o, cap - o, "\\x%02x", ch);
    }
    if (i < n && o + 4 < cap) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o < cap ? o : cap - 1] = '\0';
}

const char *bl_gguf_type_name(uint32_t type)
{
    static const char *const names[BL_GGUF_TYPE_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
    };
    return type < BL_GGUF_TYPE_COUNT ? names[type] : "?";
}

size_t bl_gguf_type_size(uint32_t type)
{
    static const uint8_t sizes[BL_GGUF_TYPE_COUNT] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };
    return type < BL_GGUF_TYPE_COUNT ? sizes[type] : 0;
}

/* Grows a vector to hold n + more items; refuses sizes that overflow. */
static int grow(void **v, uint64_t *cap, uint64_t n, uint64_t more, size_t item)
{
    if (more > UINT64_MAX - n)
        return BL_ENOMEM;
    uint64_t need = n + more;
    if (need <= *cap)
        return 0;
    uint64_t c = *cap ? *cap : 16;
    while (c < need)
        c = c > UINT64_MAX / 2 ? need : c * 2;
    if (c > SIZE_MAX / item)
        return BL_ENOMEM;
    void *p = realloc(*v, (size_t)(c * item));
    if (!p)
        return BL_ENOMEM;
    *v = p;
    *cap = c;
    return 0;
}

/* --- errors while parsing -------------------------------------------------------- */

/* Formats "<file>: <key 'x'|tensor 'y'|header> at offset N: <what>". */
static int refuse(cur_t *c, int code, uint64_t off, const char *fmt, ...) BL_PRINTF(4, 5);
static int refuse(cur_t *c, int code, uint64_t off, const char *fmt, ...)
{
    char what[320], ctx[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (c->name) {
        char esc[224];
        escape_name(esc, sizeof esc, c->name, c->name_len);
        snprintf(ctx, sizeof ctx, "%s '%s'", c->kind, esc);
    } else {
        snprintf(ctx, sizeof ctx, "%s", c->kind);
    }
    return bl_err_set(c->err, code, "%s: %s at offset %llu: %s", c->path, ctx,
                      (unsigned long long)off, what);
}

static int fail_nomem(cur_t *c)
{
    return bl_err_set(c->err, BL_ENOMEM, "%s: out of memory while reading offset %llu", c->path,
                      (unsigned long long)c->pos);
}

static uint64_t left(const cur_t *c) { return c->size - c->pos; }

/* Checks that n bytes remain at the cursor. */
static int need(cur_t *c, uint64_t n, const char *what)
{
    if (n > left(c))
        return refuse(c, BL_EINVAL, c->pos, "file ends inside %s (needs %llu bytes, %llu left)", what,
                    (unsigned long long)n, (unsigned long long)left(c));
    return 0;
}

static int read_u32(cur_t *c, uint32_t *v, const char *what)
{
    int rc = need(c, 4, what);
    if (rc)
        return rc;
    *v = rd32(c->base + c->pos);
    c->pos += 4;
    return 0;
}

static int read_u64(cur_t *c, uint64_t *v, const char *what)
{
    int rc = need(c, 8, what);
    if (rc)
        return rc;
    *v = rd64(c->base + c->pos);
    c->pos += 8;
    return 0;
}

/* A length-prefixed string; *s points into the mapping. */
static int read_str(cur_t *c, bl_gguf_str_t *s, const char *what)
{
    uint64_t at = c->pos, n;
    int rc = read_u64(c, &n, what);
    if (rc)
        return rc;
    if (n > left(c))
        return refuse(c, BL_ERANGE, at, "%s length %llu exceeds the %llu bytes left in the file", what,
                    (unsigned long long)n, (unsigned long long)left(c));
    s->ptr = (const char *)(c->base + c->pos);
    s->len = n;
    c->pos += n;
    return 0;
}

/* --- metadata values ------------------------------------------------------------- */

static int parse_array(cur_t *c, uint64_t node, uint32_t depth, uint64_t kv_index);

/* A value of a non-array type: checks it fits and that a bool is 0 or 1. */
static int parse_scalar(cur_t *c, uint32_t type)
{
    if (type == BL_GGUF_STRING) {
        bl_gguf_str_t s;
        return read_str(c, &s, "string value");
    }
    size_t sz = bl_gguf_type_size(type);
    int rc = need(c, sz, "value");
    if (rc)
        return rc;
    if (type == BL_GGUF_BOOL && c->base[c->pos] > 1)
        return refuse(c, BL_EINVAL, c->pos, "bool value is %u (not 0 or 1)", c->base[c->pos]);
    c->pos += sz;
    return 0;
}

/* Reads an array's header and elements into the already reserved node g->arrs[node].
 * Nodes are addressed by index because nested arrays may grow (move) the table. */
static int parse_array(cur_t *c, uint64_t node, uint32_t depth, uint64_t kv_index)
{
    bl_gguf_t *g = c->g;
    uint64_t at = c->pos, count;
    uint32_t et;
    int rc;

    if (depth > BL_GGUF_MAX_DEPTH)
        return refuse(c, BL_ERANGE, at, "arrays nested deeper than %u", BL_GGUF_MAX_DEPTH);
    if ((rc = read_u32(c, &et, "array element type")) || (rc = read_u64(c, &count, "array count")))
        return rc;
    if (et >= BL_GGUF_TYPE_COUNT)
        return refuse(c, BL_EINVAL, at, "unknown array element type %u", et);
    uint64_t min = et == BL_GGUF_STRING ? MIN_STRING_BYTES
                 : et == BL_GGUF_ARRAY  ? MIN_ARRAY_BYTES
                                        : bl_gguf_type_size(et);
    if (count > left(c) / min)
        return refuse(c, BL_ERANGE, at,
                    "array of %llu %s elements needs at least %llu bytes per element, %llu left",
                    (unsigned long long)count, bl_gguf_type_name(et), (unsigned long long)min,
                    (unsigned long long)left(c));

    bl_gguf_arr_t *a = &g->arrs[node];
    memset(a, 0, sizeof *a);
    a->elem_type = et;
    a->depth = depth;
    a->count = count;
    a->data = c->base + c->pos;
    a->file_offset = c->pos;
    a->off_base = NONE;
    a->first_child = NONE;
    a->kv_index = kv_index;

    if (et != BL_GGUF_STRING && et != BL_GGUF_ARRAY) {
        if (et == BL_GGUF_BOOL)
            for (uint64_t i = 0; i < count; i++)
                if (c->base[c->pos + i] > 1)
                    return refuse(c, BL_EINVAL, c->pos + i, "bool element %llu is %u (not 0 or 1)",
                                (unsigned long long)i, c->base[c->pos + i]);
        c->pos += count * min; /* fits: count <= left / min */
        return 0;
    }

    /* Variable-size elements: record where each starts so access is O(1) later. */
    if (grow((void **)&g->offs, &g->cap_offs, g->n_offs, count, sizeof *g->offs))
        return fail_nomem(c);
    uint64_t off_base = g->n_offs;
    g->n_offs += count;
    g->arrs[node].off_base = off_base;
    uint64_t start = c->pos;

    if (et == BL_GGUF_STRING) {
        for (uint64_t i = 0; i < count; i++) {
            bl_gguf_str_t s;
            g->offs[off_base + i] = c->pos - start;
            if ((rc = read_str(c, &s, "string element")))
                return rc;
        }
        return 0;
    }

    /* Children take consecutive nodes, reserved before any of them is parsed, so that
     * element i is node first_child + i whatever the grandchildren append. */
    if (grow((void **)&g->arrs, &g->cap_arrs, g->n_arrs, count, sizeof *g->arrs))
        return fail_nomem(c);
    uint64_t first = g->n_arrs;
    g->n_arrs += count;
    g->arrs[node].first_child = first;
    for (uint64_t i = 0; i < count; i++) {
        g->offs[off_base + i] = c->pos - start;
        if ((rc = parse_array(c, first + i, depth + 1, kv_index)))
            return rc;
    }
    return 0;
}

/* --- hash tables over keys and tensor names -------------------------------------- */

static uint64_t table_size(uint64_t n)
{
    uint64_t s = 16;
    while (s < n * 2)
        s *= 2;
    return s;
}

/* Index of the kv named (s, n) in the table h, or NONE. */
static uint64_t kv_lookup(const bl_gguf_t *g, const uint64_t *h, uint64_t mask, const char *s,
                          uint64_t n)
{
    for (uint64_t i = fnv1a(s, n) & mask;; i = (i + 1) & mask) {
        if (!h[i])
            return NONE;
        const bl_gguf_kv_t *kv = &g->kvs[h[i] - 1];
        if (kv->key.len == n && memcmp(kv->key.ptr, s, n) == 0)
            return h[i] - 1;
    }
}

static uint64_t tensor_lookup(const bl_gguf_t *g, const char *s, uint64_t n)
{
    if (!g->t_hash)
        return NONE;
    for (uint64_t i = fnv1a(s, n) & g->t_mask;; i = (i + 1) & g->t_mask) {
        if (!g->t_hash[i])
            return NONE;
        const bl_gguf_tensor_t *t = &g->tensors[g->t_hash[i] - 1];
        if (t->name_len == n && memcmp(t->name, s, n) == 0)
            return g->t_hash[i] - 1;
    }
}

/* Builds a table over the keys of part p, refusing duplicates. The table is kept
 * for part 0 (lookups) and dropped for the others. */
static int index_keys(cur_t *c, const part_t *p, uint64_t **out, uint64_t *out_mask)
{
    bl_gguf_t *g = c->g;
    uint64_t size = table_size(p->n_kv);
    uint64_t *h = calloc(size, sizeof *h);
    if (!h)
        return fail_nomem(c);
    for (uint64_t k = p->kv_first; k < p->kv_first + p->n_kv; k++) {
        const bl_gguf_kv_t *kv = &g->kvs[k];
        uint64_t dup = kv_lookup(g, h, size - 1, kv->key.ptr, kv->key.len);
        if (dup != NONE) {
            c->kind = "key";
            c->name = kv->key.ptr;
            c->name_len = kv->key.len;
            free(h);
            return refuse(c, BL_EINVAL, kv->key_offset, "duplicate key (first at offset %llu)",
                        (unsigned long long)g->kvs[dup].key_offset);
        }
        uint64_t i = fnv1a(kv->key.ptr, kv->key.len) & (size - 1);
        while (h[i])
            i = (i + 1) & (size - 1);
        h[i] = k + 1;
    }
    *out = h;
    *out_mask = size - 1;
    return 0;
}

/* --- one part -------------------------------------------------------------------- */

/* Finds key in part p by a linear scan (used for the few split.* keys of later parts). */
static const bl_gguf_kv_t *part_kv(const bl_gguf_t *g, const part_t *p, const char *key)
{
    uint64_t n = strlen(key);
    for (uint64_t k = p->kv_first; k < p->kv_first + p->n_kv; k++)
        if (g->kvs[k].key.len == n && memcmp(g->kvs[k].key.ptr, key, n) == 0)
            return &g->kvs[k];
    return NULL;
}

static int parse_header(cur_t *c, part_t *p)
{
    uint32_t version;
    int rc;

    c->kind = "header";
    if (c->size == 0)
        return bl_err_set(c->err, BL_EINVAL, "%s: file is empty (not a GGUF file)", c->path);
    if (c->size < 4 || memcmp(c->base, "GGUF", 4) != 0) {
        char esc[64];
        escape_name(esc, sizeof esc, (const char *)c->base, c->size < 4 ? c->size : 4);
        return bl_err_set(c->err, BL_EINVAL, "%s: bad magic '%s' at offset 0 (not a GGUF file)",
                          c->path, esc);
    }
    c->pos = 4;
    if ((rc = read_u32(c, &version, "the version")))
        return rc;
    if (version == 1)
        return refuse(c, BL_ENOTSUP, 4, "GGUF version 1 is not supported (only 2 and 3)");
    if (version == 0x02000000u || version == 0x03000000u)
        return refuse(c, BL_ENOTSUP, 4, "big-endian GGUF (version %u byte-swapped) is not supported",
                    version >> 24);
    if (version != 2 && version != 3)
        return refuse(c, BL_ENOTSUP, 4, "unsupported GGUF version %u (only 2 and 3)", version);
    p->version = version;
    if ((rc = read_u64(c, &p->n_tensors, "the tensor count")) ||
        (rc = read_u64(c, &p->n_kv, "the key count")))
        return rc;
    if (p->n_kv > left(c) / MIN_KV_BYTES)
        return refuse(c, BL_ERANGE, 16, "key count %llu cannot fit in the %llu bytes left",
                    (unsigned long long)p->n_kv, (unsigned long long)left(c));
    if (p->n_tensors > left(c) / MIN_TENSOR_BYTES)
        return refuse(c, BL_ERANGE, 8, "tensor count %llu cannot fit in the %llu bytes left",
                    (unsigned long long)p->n_tensors, (unsigned long long)left(c));
    return 0;
}

static int parse_kvs(cur_t *c, part_t *p)
{
    bl_gguf_t *g = c->g;
    int rc;

    p->kv_first = g->n_kvs;
    p->alignment = BL_GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t k = 0; k < p->n_kv; k++) {
        bl_gguf_kv_t kv = { .part = c->part, .arr_index = NONE };
        uint64_t at = c->pos, len;

        c->kind = "key";
        c->name = NULL;
        c->item_offset = at;
        if ((rc = read_u64(c, &len, "a key length")))
            return rc;
        if (len == 0)
            return refuse(c, BL_EINVAL, at, "key %llu of %llu is empty", (unsigned long long)k,
                        (unsigned long long)p->n_kv);
        if (len > BL_GGUF_MAX_KEY_LEN || len > left(c))
            return refuse(c, BL_ERANGE, at, "key length %llu exceeds %s (%llu)", (unsigned long long)len,
                        len > BL_GGUF_MAX_KEY_LEN ? "the limit" : "the bytes left in the file",
                        (unsigned long long)(len > BL_GGUF_MAX_KEY_LEN ? BL_GGUF_MAX_KEY_LEN : left(c)));
        kv.key.ptr = (const char *)(c->base + c->pos);
        kv.key.len = len;
        kv.key_offset = at;
        c->pos += len;
        c->name = kv.key.ptr;
        c->name_len = len;
        if (memchr(kv.key.ptr, 0, len))
            return refuse(c, BL_EINVAL, at, "key contains a NUL byte");
        if ((rc = read_u32(c, &kv.type, "the value type")))
            return rc;
        if (kv.type >= BL_GGUF_TYPE_COUNT)
            return refuse(c, BL_EINVAL, c->pos - 4, "unknown value type %u", kv.type);
        kv.val_offset = c->pos;
        kv.val = c->base + c->pos;

        if (kv.type == BL_GGUF_ARRAY) {
            if (grow((void **)&g->arrs, &g->cap_arrs, g->n_arrs, 1, sizeof *g->arrs))
                return fail_nomem(c);
            kv.arr_index = g->n_arrs++;
            rc = parse_array(c, kv.arr_index, 1, g->n_kvs);
        } else {
            rc = parse_scalar(c, kv.type);
        }
        if (rc)
            return rc;

        static const char align_key[] = "general.alignment";
        if (len == sizeof align_key - 1 && memcmp(kv.key.ptr, align_key, len) == 0) {
            if (kv.type != BL_GGUF_U32)
                return refuse(c, BL_EINVAL, at, "has type %s; expected u32", bl_gguf_type_name(kv.type));
            uint32_t a = rd32(kv.val);
            if (a == 0 || (a & (a - 1)))
                return refuse(c, BL_EINVAL, at, "alignment %u is not a nonzero power of two", a);
            p->alignment = a;
        }

        if (grow((void **)&g->kvs, &g->cap_kvs, g->n_kvs, 1, sizeof *g->kvs))
            return fail_nomem(c);
        g->kvs[g->n_kvs++] = kv;
    }
    c->name = NULL;
    return 0;
}

static int parse_tensor_infos(cur_t *c, part_t *p)
{
    bl_gguf_t *g = c->g;
    int rc;

    p->tensor_first = g->n_tensors;
    if (p->n_tensors > left(c) / MIN_TENSOR_BYTES) {
        c->kind = "header";
        return refuse(c, BL_ERANGE, 8, "tensor count %llu cannot fit in the %llu bytes left after the keys",
                    (unsigned long long)p->n_tensors, (unsigned long long)left(c));
    }
    if (grow((void **)&g->tensors, &g->cap_tensors, g->n_tensors, p->n_tensors, sizeof *g->tensors) ||
        grow((void **)&g->name_off, &g->cap_name_off, g->n_tensors, p->n_tensors, sizeof *g->name_off))
        return fail_nomem(c);

    for (uint64_t k = 0; k < p->n_tensors; k++) {
        bl_gguf_tensor_t t = { .part = c->part };
        bl_gguf_str_t name;
        uint64_t at = c->pos;

        c->kind = "tensor";
        c->name = NULL;
        c->item_offset = at;
        {
            uint64_t len;
            if ((rc = read_u64(c, &len, "a tensor name length")))
                return rc;
            if (len == 0)
                return refuse(c, BL_EINVAL, at, "tensor %llu has an empty name", (unsigned long long)k);
            if (len > BL_GGUF_MAX_NAME_LEN || len > left(c))
                return refuse(c, BL_ERANGE, at, "tensor name length %llu exceeds %s (%llu)",
                            (unsigned long long)len,
                            len > BL_GGUF_MAX_NAME_LEN ? "the limit" : "the bytes left in the file",
                            (unsigned long long)(len > BL_GGUF_MAX_NAME_LEN ? BL_GGUF_MAX_NAME_LEN
                                                                            : left(c)));
            name.ptr = (const char *)(c->base + c->pos);
            name.len = len;
            c->pos += len;
        }
        c->name = name.ptr;
        c->name_len = name.len;
        if (memchr(name.ptr, 0, name.len))
            return refuse(c, BL_EINVAL, at, "tensor name contains a NUL byte");
        t.name_len = (uint32_t)name.len;

        if ((rc = read_u32(c, &t.n_dims, "n_dims")))
            return rc;
        if (t.n_dims == 0 || t.n_dims > BL_GGUF_MAX_DIMS)
            return refuse(c, BL_EINVAL, at, "n_dims is %u (must be 1..%u)", t.n_dims, BL_GGUF_MAX_DIMS);
        int64_t nelem = 1;
        for (uint32_t d = 0; d < BL_GGUF_MAX_DIMS; d++)
            t.ne[d] = 1;
        for (uint32_t d = 0; d < t.n_dims; d++) {
            uint64_t v;
            if ((rc = read_u64(c, &v, "a dimension")))
                return rc;
            if (v == 0 || v > (uint64_t)INT64_MAX)
                return refuse(c, BL_EINVAL, at, "dimension %u is %lld (must be positive)", d, (long long)v);
            t.ne[d] = (int64_t)v;
            if (__builtin_mul_overflow(nelem, t.ne[d], &nelem))
                return refuse(c, BL_ERANGE, at, "element count overflows int64 at dimension %u", d);
        }
        if ((rc = read_u32(c, &t.type, "the tensor type")))
            return rc;
        const bl_type_info_t *ti = bl_type_info(t.type);
        if (!ti || ti->block_elems == 0 || ti->block_bytes == 0)
            return refuse(c, BL_ENOTSUP, at, "unknown tensor type id %u", t.type);
        if (t.ne[0] % ti->block_elems)
            return refuse(c, BL_EINVAL, at, "row length %lld is not a multiple of the %s block size %u",
                        (long long)t.ne[0], ti->name, ti->block_elems);
        size_t row;
        bl_err_t rerr;
        uint64_t nbytes;
        if (bl_row_bytes(t.type, t.ne[0], &row, &rerr))
            return refuse(c, BL_ERANGE, at, "row of %lld %s elements: %s", (long long)t.ne[0], ti->name,
                        rerr.msg);
        if (__builtin_mul_overflow((uint64_t)row, (uint64_t)(nelem / t.ne[0]), &nbytes))
            return refuse(c, BL_ERANGE, at, "byte size of %lld %s elements overflows", (long long)nelem,
                        ti->name);
        t.nbytes = nbytes;
        if ((rc = read_u64(c, &t.offset, "the data offset")))
            return rc;
        if (t.offset % p->alignment)
            return refuse(c, BL_EINVAL, at, "data offset %llu is not a multiple of the alignment %u",
                        (unsigned long long)t.offset, p->alignment);

        /* Names are copied (NUL-terminated) so callers can use them as C strings. */
        if (grow((void **)&g->names, &g->cap_names, g->n_names, name.len + 1, 1))
            return fail_nomem(c);
        memcpy(g->names + g->n_names, name.ptr, name.len);
        g->names[g->n_names + name.len] = '\0';
        g->name_off[g->n_tensors] = g->n_names;
        g->n_names += name.len + 1;
        t.file_offset = at; /* the info's offset until the data section is known */
        g->tensors[g->n_tensors++] = t;
    }
    c->name = NULL;
    return 0;
}

static int cmp_offset(const void *a, const void *b, void *arg)
{
    const bl_gguf_tensor_t *t = arg;
    uint64_t x = t[*(const uint64_t *)a].offset, y = t[*(const uint64_t *)b].offset;
    return x < y ? -1 : x > y;
}

/* Places the data section, then checks every tensor lies inside the file and that no
 * two overlap. */
static int place_tensors(cur_t *c, part_t *p)
{
    bl_gguf_t *g = c->g;
    uint64_t a = p->alignment;

    if (c->pos > UINT64_MAX - (a - 1))
        return refuse(c, BL_ERANGE, c->pos, "data section start overflows");
    p->data_offset = (c->pos + a - 1) / a * a;
    c->kind = "tensor";
    for (uint64_t k = p->tensor_first; k < p->tensor_first + p->n_tensors; k++) {
        bl_gguf_tensor_t *t = &g->tensors[k];
        uint64_t info_at = t->file_offset, start, end;
        c->name = g->names + g->name_off[k];
        c->name_len = t->name_len;
        if (__builtin_add_overflow(p->data_offset, t->offset, &start) ||
            __builtin_add_overflow(start, t->nbytes, &end) || end > p->size)
            return refuse(c, BL_ERANGE, info_at,
                        "%llu bytes of data at data section %llu + offset %llu end past the end of "
                        "the file (%llu bytes)",
                        (unsigned long long)t->nbytes, (unsigned long long)p->data_offset,
                        (unsigned long long)t->offset, (unsigned long long)p->size);
        t->file_offset = start;
        t->data = p->base + start;
    }

    if (p->n_tensors < 2)
        return 0;
    uint64_t *order = malloc(p->n_tensors * sizeof *order);
    if (!order)
        return fail_nomem(c);
    for (uint64_t i = 0; i < p->n_tensors; i++)
        order[i] = p->tensor_first + i;
    qsort_r(order, p->n_tensors, sizeof *order, cmp_offset, g->tensors);
    int rc = 0;
    for (uint64_t i = 1; i < p->n_tensors; i++) {
        const bl_gguf_tensor_t *x = &g->tensors[order[i - 1]], *y = &g->tensors[order[i]];
        if (x->offset + x->nbytes > y->offset) {
            char ex[224];
            escape_name(ex, sizeof ex, g->names + g->name_off[order[i - 1]], x->name_len);
            c->name = g->names + g->name_off[order[i]];
            c->name_len = y->name_len;
            rc = refuse(c, BL_EINVAL, y->file_offset,
                      "data [%llu, %llu) overlaps tensor '%s' at [%llu, %llu)",
                      (unsigned long long)y->file_offset, (unsigned long long)(y->file_offset + y->nbytes),
                      ex, (unsigned long long)x->file_offset,
                      (unsigned long long)(x->file_offset + x->nbytes));
            break;
        }
    }
    free(order);
    return rc;
}

static int parse_part(bl_gguf_t *g, uint32_t pi, bl_err_t *err)
{
    part_t *p = &g->parts[pi];
    cur_t c = { .g = g, .base = p->base, .size = p->size, .part = pi, .path = p->path, .err = err,
                .kind = "header" };
    int rc;

    if ((rc = parse_header(&c, p)) || (rc = parse_kvs(&c, p)))
        return rc;
    if (pi == 0) {
        if ((rc = index_keys(&c, p, &g->kv_hash, &g->kv_mask)))
            return rc;
    } else {
        uint64_t *h, mask;
        if ((rc = index_keys(&c, p, &h, &mask)))
            return rc;
        free(h);
    }
    if ((rc = parse_tensor_infos(&c, p)))
        return rc;
    return place_tensors(&c, p);
}

/* --- split models ---------------------------------------------------------------- */

size_t bl_gguf_split_name(const char *path, uint32_t *part, uint32_t *n_parts)
{
    static const size_t tail = sizeof "-00001-of-00003.gguf" - 1;
    size_t len = strlen(path);
    if (len <= tail)
        return 0;
    const char *s = path + len - tail;
    uint32_t no = 0, count = 0;
    if (s[0] != '-' || memcmp(s + 6, "-of-", 4) != 0 || memcmp(s + 15, ".gguf", 5) != 0)
        return 0;
    for (int i = 0; i < 5; i++) {
        if (s[1 + i] < '0' || s[1 + i] > '9' || s[10 + i] < '0' || s[10 + i] > '9')
            return 0;
        no = no * 10 + (uint32_t)(s[1 + i] - '0');
        count = count * 10 + (uint32_t)(s[10 + i] - '0');
    }
    *part = no;
    *n_parts = count;
    return len - tail;
}

/* If path ends in -NNNNN-of-MMMMM.gguf with 1 <= NNNNN <= MMMMM, returns the length of
 * the stem before it and sets *n_parts; else returns 0. */
static size_t split_stem(const char *path, uint32_t *n_parts)
{
    uint32_t no, count;
    size_t stem = bl_gguf_split_name(path, &no, &count);
    if (!stem || no < 1 || no > count)
        return 0;
    *n_parts = count;
    return stem;
}

/* Reads an integer split.* key of part p as u64; *present tells if it was there. */
static int split_key(bl_gguf_t *g, uint32_t pi, const char *key, uint64_t *v, bool *present, bl_err_t *err)
{
    const bl_gguf_kv_t *kv = part_kv(g, &g->parts[pi], key);
    *present = kv != NULL;
    if (!kv)
        return 0;
    bl_err_t e;
    if (bl_gguf_kv_u64(kv, v, &e))
        return bl_err_set(err, BL_EINVAL, "%s: key '%s' at offset %llu: %s is not a non-negative integer",
                          g->parts[pi].path, key, (unsigned long long)kv->key_offset,
                          bl_gguf_type_name(kv->type));
    return 0;
}

/* Checks split.no, split.count and split.tensors.count where present. */
static int check_split(bl_gguf_t *g, bool named_split, bl_err_t *err)
{
    for (uint32_t pi = 0; pi < g->n_parts; pi++) {
        const part_t *p = &g->parts[pi];
        uint64_t no, count, tensors;
        bool has_no, has_count, has_tensors;
        int rc;
        if ((rc = split_key(g, pi, "split.no", &no, &has_no, err)) ||
            (rc = split_key(g, pi, "split.count", &count, &has_count, err)) ||
            (rc = split_key(g, pi, "split.tensors.count", &tensors, &has_tensors, err)))
            return rc;
        if (has_count && count != g->n_parts) {
            const bl_gguf_kv_t *kv = part_kv(g, p, "split.count");
            if (!named_split)
                return bl_err_set(err, BL_EINVAL,
                                  "%s: key 'split.count' at offset %llu: is %llu but the file name is not "
                                  "NAME-%%05d-of-%%05d.gguf",
                                  p->path, (unsigned long long)kv->key_offset, (unsigned long long)count);
            return bl_err_set(err, BL_EINVAL,
                              "%s: key 'split.count' at offset %llu: is %llu but the file name says %u parts",
                              p->path, (unsigned long long)kv->key_offset, (unsigned long long)count,
                              g->n_parts);
        }
        if (has_no && no != pi)
            return bl_err_set(err, BL_EINVAL,
                              "%s: key 'split.no' at offset %llu: is %llu but this is part %u (0-based)",
                              p->path, (unsigned long long)part_kv(g, p, "split.no")->key_offset,
                              (unsigned long long)no, pi);
        if (has_tensors && tensors != g->n_tensors)
            return bl_err_set(err, BL_EINVAL,
                              "%s: key 'split.tensors.count' at offset %llu: is %llu but the parts "
                              "hold %llu tensors",
                              p->path, (unsigned long long)part_kv(g, p, "split.tensors.count")->key_offset,
                              (unsigned long long)tensors, (unsigned long long)g->n_tensors);
    }
    return 0;
}

/* --- assembling the model -------------------------------------------------------- */

/* Resolves the indices recorded while tables could still move into pointers, and
 * indexes tensor names, refusing duplicates across all parts. */
static int finish(bl_gguf_t *g, bl_err_t *err)
{
    for (uint64_t i = 0; i < g->n_kvs; i++) {
        bl_gguf_kv_t *kv = &g->kvs[i];
        kv->path = g->parts[kv->part].path;
        kv->arr = kv->arr_index == NONE ? NULL : &g->arrs[kv->arr_index];
    }
    for (uint64_t i = 0; i < g->n_arrs; i++) {
        bl_gguf_arr_t *a = &g->arrs[i];
        a->off = a->off_base == NONE || !g->offs ? NULL : g->offs + a->off_base;
        a->kv = &g->kvs[a->kv_index];
        a->g = g;
    }
    for (uint64_t i = 0; i < g->n_tensors; i++)
        g->tensors[i].name = g->names + g->name_off[i];

    uint64_t size = table_size(g->n_tensors);
    g->t_hash = calloc(size, sizeof *g->t_hash);
    if (!g->t_hash)
        return bl_err_set(err, BL_ENOMEM, "%s: out of memory indexing tensors", g->parts[0].path);
    g->t_mask = size - 1;
    for (uint64_t k = 0; k < g->n_tensors; k++) {
        const bl_gguf_tensor_t *t = &g->tensors[k];
        uint64_t dup = tensor_lookup(g, t->name, t->name_len);
        if (dup != NONE) {
            char esc[224];
            escape_name(esc, sizeof esc, t->name, t->name_len);
            return bl_err_set(err, BL_EINVAL,
                              "%s: tensor '%s' at offset %llu: duplicate tensor name (first in %s)",
                              g->parts[t->part].path, esc, (unsigned long long)t->file_offset,
                              g->parts[g->tensors[dup].part].path);
        }
        uint64_t i = fnv1a(t->name, t->name_len) & g->t_mask;
        while (g->t_hash[i])
            i = (i + 1) & g->t_mask;
        g->t_hash[i] = k + 1;
    }
    free(g->name_off);
    g->name_off = NULL;
    return 0;
}

static int map_part(part_t *p, bl_err_t *err)
{
    int fd = open(p->path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        return bl_err_set(err, e == ENOENT ? BL_ENOENT : BL_EIO, "%s: cannot open: %s", p->path,
                          strerror(e));
    }
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0) {
        rc = bl_err_set(err, BL_EIO, "%s: cannot stat: %s", p->path, strerror(errno));
        goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
        rc = bl_err_set(err, BL_EINVAL, "%s: is a directory, not a GGUF file", p->path);
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = bl_err_set(err, BL_EINVAL, "%s: is not a regular file", p->path);
        goto fail;
    }
    if (st.st_size == 0) {
        rc = bl_err_set(err, BL_EINVAL, "%s: file is empty (not a GGUF file)", p->path);
        goto fail;
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        rc = bl_err_set(err, BL_ERANGE, "%s: file of %lld bytes cannot be mapped", p->path,
                        (long long)st.st_size);
        goto fail;
    }
    /* Shared, not private: nothing writes it either way, but a card worker registers
     * (pins for DMA) the host experts' pages of this mapping, and a long-term pin of a
     * private file mapping has the kernel copy each page out first; on the H200's 6.18
     * kernel that pin never returned for some files (docs/architecture.md). */
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        rc = bl_err_set(err, BL_EIO, "%s: cannot map %lld bytes: %s", p->path, (long long)st.st_size,
                        strerror(errno));
        goto fail;
    }
    p->base = m;
    p->size = (uint64_t)st.st_size;
    p->mapped = true;
fail:
    close(fd);
    return rc;
}

static bl_gguf_t *alloc_model(uint32_t n_parts)
{
    bl_gguf_t *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->parts = calloc(n_parts, sizeof *g->parts);
    if (!g->parts) {
        free(g);
        return NULL;
    }
    g->n_parts = n_parts;
    return g;
}

int bl_gguf_open(bl_gguf_t **out, const char *path, bl_err_t *err)
{
    uint32_t n_parts = 1;
    size_t stem = split_stem(path, &n_parts);
    bl_gguf_t *g = NULL;
    int rc;

    *out = NULL;
    if (n_parts > BL_GGUF_MAX_PARTS)
        return bl_err_set(err, BL_ERANGE, "%s: %u parts exceeds the limit of %u", path, n_parts,
                          BL_GGUF_MAX_PARTS);
    if (!(g = alloc_model(n_parts)))
        return bl_err_set(err, BL_ENOMEM, "%s: out of memory", path);
    for (uint32_t i = 0; i < n_parts; i++) {
        part_t *p = &g->parts[i];
        if (stem) {
            size_t cap = stem + 32;
            if (!(p->path = malloc(cap))) {
                rc = bl_err_set(err, BL_ENOMEM, "%s: out of memory", path);
                goto fail;
            }
            snprintf(p->path, cap, "%.*s-%05u-of-%05u.gguf", (int)stem, path, i + 1, n_parts);
        } else if (!(p->path = strdup(path))) {
            rc = bl_err_set(err, BL_ENOMEM, "%s: out of memory", path);
            goto fail;
        }
        if ((rc = map_part(p, err))) {
            if (rc == BL_ENOENT && stem)
                bl_err_set(err, BL_ENOENT, "%s: missing split part %u of %u (opening %s)", p->path, i + 1,
                           n_parts, path);
            goto fail;
        }
        if ((rc = parse_part(g, i, err)))
            goto fail;
    }
    if ((rc = finish(g, err)) || (rc = check_split(g, stem != 0, err)))
        goto fail;
    *out = g;
    return 0;
fail:
    bl_gguf_close(g);
    return rc;
}

int bl_gguf_open_memory(bl_gguf_t **out, const void *data, size_t size, const char *name, bl_err_t *err)
{
    bl_gguf_t *g = alloc_model(1);
    int rc;

    *out = NULL;
    if (!g)
        return bl_err_set(err, BL_ENOMEM, "%s: out of memory", name);
    if (!(g->parts[0].path = strdup(name))) {
        rc = bl_err_set(err, BL_ENOMEM, "%s: out of memory", name);
        goto fail;
    }
    g->parts[0].base = data;
    g->parts[0].size = size;
    if ((rc = parse_part(g, 0, err)) || (rc = finish(g, err)) || (rc = check_split(g, false, err)))
        goto fail;
    *out = g;
    return 0;
fail:
    bl_gguf_close(g);
    return rc;
}

void bl_gguf_close(bl_gguf_t *g)
{
    if (!g)
        return;
    for (uint32_t i = 0; i < g->n_parts; i++) {
        part_t *p = &g->parts[i];
        if (p->mapped)
            munmap((void *)p->base, (size_t)p->size);
        free(p->path);
    }
    free(g->parts);
    free(g->kvs);
    free(g->arrs);
    free(g->offs);
    free(g->tensors);
    free(g->name_off);
    free(g->names);
    free(g->kv_hash);
    free(g->t_hash);
    free(g);
}

/* --- whole-model accessors ------------------------------------------------------- */

uint32_t bl_gguf_version(const bl_gguf_t *g) { return g->parts[0].version; }
uint32_t bl_gguf_alignment(const bl_gguf_t *g) { return g->parts[0].alignment; }
uint32_t bl_gguf_n_parts(const bl_gguf_t *g) { return g->n_parts; }
const char *bl_gguf_part_path(const bl_gguf_t *g, uint32_t part)
{
    return part < g->n_parts ? g->parts[part].path : NULL;
}
uint64_t bl_gguf_part_size(const bl_gguf_t *g, uint32_t part)
{
    return part < g->n_parts ? g->parts[part].size : 0;
}
uint64_t bl_gguf_data_offset(const bl_gguf_t *g, uint32_t part)
{
    return part < g->n_parts ? g->parts[part].data_offset : 0;
}

const void *bl_gguf_part_bytes(const bl_gguf_t *g, uint32_t part, uint64_t *size)
{
    *size = part < g->n_parts ? g->parts[part].size : 0;
    return part < g->n_parts ? g->parts[part].base : NULL;
}

uint64_t bl_gguf_n_kv(const bl_gguf_t *g) { return g->parts[0].n_kv; }
const bl_gguf_kv_t *bl_gguf_kv_at(const bl_gguf_t *g, uint64_t i)
{
    return i < g->parts[0].n_kv ? &g->kvs[i] : NULL;
}
const bl_gguf_kv_t *bl_gguf_find_kv(const bl_gguf_t *g, const char *key)
{
    uint64_t i = kv_lookup(g, g->kv_hash, g->kv_mask, key, strlen(key));
    return i == NONE ? NULL : &g->kvs[i];
}
bl_gguf_str_t bl_gguf_kv_key(const bl_gguf_kv_t *kv) { return kv->key; }
bl_gguf_type_t bl_gguf_kv_type(const bl_gguf_kv_t *kv) { return (bl_gguf_type_t)kv->type; }
uint64_t bl_gguf_kv_offset(const bl_gguf_kv_t *kv) { return kv->key_offset; }

uint64_t bl_gguf_n_tensors(const bl_gguf_t *g) { return g->n_tensors; }
const bl_gguf_tensor_t *bl_gguf_tensor_at(const bl_gguf_t *g, uint64_t i)
{
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}
const bl_gguf_tensor_t *bl_gguf_find_tensor(const bl_gguf_t *g, const char *name)
{
    uint64_t i = tensor_lookup(g, name, strlen(name));
    return i == NONE ? NULL : &g->tensors[i];
}

/* --- typed getters --------------------------------------------------------------- */

enum want { W_U32, W_U64, W_I64, W_F32, W_F64 };
static const char *const want_name[] = { "u32", "u64", "i64", "f32", "f64" };

/* Describes a value for messages: the key, and the element index inside an array. */
typedef struct who {
    const bl_gguf_kv_t *kv;
    const bl_gguf_arr_t *arr; /* NULL for the key's own value */
    uint64_t index;
} who_t;

static int mismatch(const who_t *w, int code, uint32_t type, const char *expected, const char *why,
                    bl_err_t *err)
{
    char esc[224], elem[64] = "";
    escape_name(esc, sizeof esc, w->kv->key.ptr, w->kv->key.len);
    if (w->arr)
        snprintf(elem, sizeof elem, " element %llu%s", (unsigned long long)w->index,
                 w->arr->depth > 1 ? " of a nested array" : "");
    if (why)
        return bl_err_set(err, code, "%s: key '%s'%s at offset %llu: %s value %s does not fit %s",
                          w->kv->path, esc, elem, (unsigned long long)w->kv->key_offset,
                          bl_gguf_type_name(type), why, expected);
    return bl_err_set(err, code, "%s: key '%s'%s at offset %llu: has type %s; expected %s", w->kv->path,
                      esc, elem, (unsigned long long)w->kv->key_offset, bl_gguf_type_name(type), expected);
}

static bool is_unsigned(uint32_t t)
{
    return t == BL_GGUF_U8 || t == BL_GGUF_U16 || t == BL_GGUF_U32 || t == BL_GGUF_U64;
}
static bool is_signed(uint32_t t)
{
    return t == BL_GGUF_I8 || t == BL_GGUF_I16 || t == BL_GGUF_I32 || t == BL_GGUF_I64;
}

/* Converts the value of type `type` at p (inside the mapping, already validated) into
 * what w asks for, refusing any loss. */
static int convert(uint32_t type, const uint8_t *p, enum want w, void *out, const who_t *who, bl_err_t *err)
{
    if (is_unsigned(type) || is_signed(type)) {
        uint64_t u = 0;
        int64_t s = 0;
        bool neg = false;
        switch (type) {
        case BL_GGUF_U8: u = p[0]; break;
        case BL_GGUF_U16: u = rd16(p); break;
        case BL_GGUF_U32: u = rd32(p); break;
        case BL_GGUF_U64: u = rd64(p); break;
        case BL_GGUF_I8: s = (int8_t)p[0]; break;
        case BL_GGUF_I16: s = (int16_t)rd16(p); break;
        case BL_GGUF_I32: s = (int32_t)rd32(p); break;
        case BL_GGUF_I64: s = (int64_t)rd64(p); break;
        }
        if (is_signed(type)) {
            neg = s < 0;
            u = neg ? 0 : (uint64_t)s;
        }
        /* Magnitude, for the float checks: an integer is exact in f32 up to 2^24 and in
         * f64 up to 2^53. */
        uint64_t mag = neg ? (uint64_t)(-(s + 1)) + 1 : u;
        switch (w) {
        case W_U32:
            if (neg || u > UINT32_MAX)
                return mismatch(who, BL_ERANGE, type, want_name[w], neg ? "(negative)" : "(too large)", err);
            *(uint32_t *)out = (uint32_t)u;
            return 0;
        case W_U64:
            if (neg)
                return mismatch(who, BL_ERANGE, type, want_name[w], "(negative)", err);
            *(uint64_t *)out = u;
            return 0;
        case W_I64:
            if (!neg && u > (uint64_t)INT64_MAX)
                return mismatch(who, BL_ERANGE, type, want_name[w], "(too large)", err);
            *(int64_t *)out = neg ? s : (int64_t)u;
            return 0;
        case W_F32:
            if (mag > (1ull << 24))
                return mismatch(who, BL_ERANGE, type, want_name[w], "(not exact)", err);
            *(float *)out = neg ? (float)s : (float)u;
            return 0;
        case W_F64:
            if (mag > (1ull << 53))
                return mismatch(who, BL_ERANGE, type, want_name[w], "(not exact)", err);
            *(double *)out = neg ? (double)s : (double)u;
            return 0;
        }
    }
    if (type == BL_GGUF_F32 && (w == W_F32 || w == W_F64)) {
        uint32_t bits = rd32(p);
        float f;
        memcpy(&f, &bits, sizeof f);
        if (w == W_F32)
            *(float *)out = f;
        else
            *(double *)out = f;
        return 0;
    }
    if (type == BL_GGUF_F64 && (w == W_F32 || w == W_F64)) {
        uint64_t bits = rd64(p);
        double d;
        memcpy(&d, &bits, sizeof d);
        if (w == W_F64) {
            *(double *)out = d;
            return 0;
        }
        if (!isfinite(d) || (fabs(d) <= FLT_MAX && (double)(float)d == d)) {
            *(float *)out = (float)d;
            return 0;
        }
        return mismatch(who, BL_ERANGE, type, want_name[w], "(not exact)", err);
    }
    return mismatch(who, BL_EINVAL, type, want_name[w], NULL, err);
}

static int kv_num(const bl_gguf_kv_t *kv, enum want w, void *out, bl_err_t *err)
{
    who_t who = { .kv = kv };
    return convert(kv->type, kv->val, w, out, &who, err);
}

#define KV_NUM(suffix, type, want)                                          \
    int bl_gguf_kv_##suffix(const bl_gguf_kv_t *kv, type *out, bl_err_t *err) \
    {                                                                       \
        return kv_num(kv, want, out, err);                                  \
    }
KV_NUM(u32, uint32_t, W_U32)
KV_NUM(u64, uint64_t, W_U64)
KV_NUM(i64, int64_t, W_I64)
KV_NUM(f32, float, W_F32)
KV_NUM(f64, double, W_F64)
#undef KV_NUM

int bl_gguf_kv_bool(const bl_gguf_kv_t *kv, int *out, bl_err_t *err)
{
    who_t who = { .kv = kv };
    if (kv->type != BL_GGUF_BOOL)
        return mismatch(&who, BL_EINVAL, kv->type, "bool", NULL, err);
    *out = kv->val[0];
    return 0;
}

int bl_gguf_kv_str(const bl_gguf_kv_t *kv, bl_gguf_str_t *out, bl_err_t *err)
{
    who_t who = { .kv = kv };
    if (kv->type != BL_GGUF_STRING)
        return mismatch(&who, BL_EINVAL, kv->type, "string", NULL, err);
    out->len = rd64(kv->val);
    out->ptr = (const char *)kv->val + 8;
    return 0;
}

int bl_gguf_kv_arr(const bl_gguf_kv_t *kv, const bl_gguf_arr_t **out, bl_err_t *err)
{
    who_t who = { .kv = kv };
    if (kv->type != BL_GGUF_ARRAY)
        return mismatch(&who, BL_EINVAL, kv->type, "array", NULL, err);
    *out = kv->arr;
    return 0;
}

static const bl_gguf_kv_t *must_find(const bl_gguf_t *g, const char *key, bl_err_t *err)
{
    const bl_gguf_kv_t *kv = bl_gguf_find_kv(g, key);
    if (!kv) {
        char esc[224];
        escape_name(esc, sizeof esc, key, strlen(key));
        bl_err_set(err, BL_ENOENT, "%s: key '%s' not found", g->parts[0].path, esc);
    }
    return kv;
}

#define GET_BY_KEY(suffix, type)                                                              \
    int bl_gguf_get_##suffix(const bl_gguf_t *g, const char *key, type *out, bl_err_t *err)  \
    {                                                                                         \
        const bl_gguf_kv_t *kv = must_find(g, key, err);                                      \
        return kv ? bl_gguf_kv_##suffix(kv, out, err) : BL_ENOENT;                            \
    }
GET_BY_KEY(u32, uint32_t)
GET_BY_KEY(u64, uint64_t)
GET_BY_KEY(i64, int64_t)
GET_BY_KEY(f32, float)
GET_BY_KEY(f64, double)
GET_BY_KEY(bool, int)
GET_BY_KEY(str, bl_gguf_str_t)
GET_BY_KEY(arr, const bl_gguf_arr_t *)
#undef GET_BY_KEY

int bl_gguf_get_arch_i64(const bl_gguf_t *g, const char *key, int64_t *out, bl_err_t *err)
{
    bl_gguf_str_t arch = {0};
    int rc = bl_gguf_get_str(g, "general.architecture", &arch, err);
    if (rc)
        return rc;
    char full[160];
    snprintf(full, sizeof full, "%.*s.%s", (int)(arch.len < 64 ? arch.len : 64), arch.ptr, key);
    return bl_gguf_get_i64(g, full, out, err);
}

/* --- arrays ---------------------------------------------------------------------- */

bl_gguf_type_t bl_gguf_arr_type(const bl_gguf_arr_t *a) { return (bl_gguf_type_t)a->elem_type; }
uint64_t bl_gguf_arr_count(const bl_gguf_arr_t *a) { return a->count; }
uint64_t bl_gguf_arr_offset(const bl_gguf_arr_t *a) { return a->file_offset; }
const bl_gguf_kv_t *bl_gguf_arr_kv(const bl_gguf_arr_t *a) { return a->kv; }

const void *bl_gguf_arr_data(const bl_gguf_arr_t *a)
{
    return a->elem_type == BL_GGUF_STRING || a->elem_type == BL_GGUF_ARRAY ? NULL : a->data;
}

/* Checks i against the count; fills w for messages. */
static int elem(const bl_gguf_arr_t *a, uint64_t i, who_t *w, bl_err_t *err)
{
    *w = (who_t){ .kv = a->kv, .arr = a, .index = i };
    if (i >= a->count) {
        char esc[224];
        escape_name(esc, sizeof esc, a->kv->key.ptr, a->kv->key.len);
        return bl_err_set(err, BL_ERANGE,
                          "%s: key '%s' at offset %llu: element %llu is past the %llu elements",
                          a->kv->path, esc, (unsigned long long)a->kv->key_offset, (unsigned long long)i,
                          (unsigned long long)a->count);
    }
    return 0;
}

static int arr_num(const bl_gguf_arr_t *a, uint64_t i, enum want w, void *out, bl_err_t *err)
{
    who_t who;
    int rc = elem(a, i, &who, err);
    if (rc)
        return rc;
    size_t sz = bl_gguf_type_size(a->elem_type);
    if (!sz)
        return mismatch(&who, BL_EINVAL, a->elem_type, want_name[w], NULL, err);
    return convert(a->elem_type, a->data + i * sz, w, out, &who, err);
}

#define ARR_NUM(suffix, type, want)                                                          \
    int bl_gguf_arr_##suffix(const bl_gguf_arr_t *a, uint64_t i, type *out, bl_err_t *err) \
    {                                                                                       \
        return arr_num(a, i, want, out, err);                                               \
    }
ARR_NUM(u32, uint32_t, W_U32)
ARR_NUM(u64, uint64_t, W_U64)
ARR_NUM(i64, int64_t, W_I64)
ARR_NUM(f32, float, W_F32)
ARR_NUM(f64, double, W_F64)
#undef ARR_NUM

int bl_gguf_arr_bool(const bl_gguf_arr_t *a, uint64_t i, int *out, bl_err_t *err)
{
    who_t who;
    int rc = elem(a, i, &who, err);
    if (rc)
        return rc;
    if (a->elem_type != BL_GGUF_BOOL)
        return mismatch(&who, BL_EINVAL, a->elem_type, "bool", NULL, err);
    *out = a->data[i];
    return 0;
}

int bl_gguf_arr_str(const bl_gguf_arr_t *a, uint64_t i, bl_gguf_str_t *out, bl_err_t *err)
{
    who_t who;
    int rc = elem(a, i, &who, err);
    if (rc)
        return rc;
    if (a->elem_type != BL_GGUF_STRING)
        return mismatch(&who, BL_EINVAL, a->elem_type, "string", NULL, err);
    const uint8_t *p = a->data + a->off[i];
    out->len = rd64(p);
    out->ptr = (const char *)p + 8;
    return 0;
}

int bl_gguf_arr_arr(const bl_gguf_arr_t *a, uint64_t i, const bl_gguf_arr_t **out, bl_err_t *err)
{
    who_t who;
    int rc = elem(a, i, &who, err);
    if (rc)
        return rc;
    if (a->elem_type != BL_GGUF_ARRAY)
        return mismatch(&who, BL_EINVAL, a->elem_type, "array", NULL, err);
    *out = &a->g->arrs[a->first_child + i];
    return 0;
}
