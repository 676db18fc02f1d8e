/* The GGUF reader: opens a GGUF v2/v3 file (or every part of a split model) read-only
 * over mmap, validates all of it before returning, and gives typed access to the
 * metadata and to each tensor's description and bytes in the mapping.
 *
 * Everything the file says is untrusted: bl_gguf_open checks every count, length,
 * type, shape, offset and size against the bytes that are really there, so that a
 * returned bl_gguf_t can be walked without further checks. A handle is immutable
 * after open; concurrent readers on any threads are safe. */
#ifndef BL_GGUF_H
#define BL_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* Limits this reader imposes beyond the format's own; inputs past them are refused
 * with BL_ERANGE. */
#define BL_GGUF_MAX_KEY_LEN 65535u   /* bytes in a metadata key */
#define BL_GGUF_MAX_NAME_LEN 1024u   /* bytes in a tensor name */
#define BL_GGUF_MAX_DIMS 4u          /* dimensions of a tensor */
#define BL_GGUF_MAX_DEPTH 8u         /* nesting of arrays inside arrays */
#define BL_GGUF_MAX_PARTS 9999u      /* parts of a split model */
#define BL_GGUF_DEFAULT_ALIGNMENT 32u

/* Metadata value types, with their GGUF ids. */
typedef enum bl_gguf_type {
    BL_GGUF_U8 = 0,
    BL_GGUF_I8 = 1,
    BL_GGUF_U16 = 2,
    BL_GGUF_I16 = 3,
    BL_GGUF_U32 = 4,
    BL_GGUF_I32 = 5,
    BL_GGUF_F32 = 6,
    BL_GGUF_BOOL = 7,
    BL_GGUF_STRING = 8,
    BL_GGUF_ARRAY = 9,
    BL_GGUF_U64 = 10,
    BL_GGUF_I64 = 11,
    BL_GGUF_F64 = 12,
    BL_GGUF_TYPE_COUNT = 13, /* one past the largest id; not a type */
} bl_gguf_type_t;

typedef struct bl_gguf bl_gguf_t;         /* an open model (one file or all its parts) */
typedef struct bl_gguf_kv bl_gguf_kv_t;   /* one metadata key and its value */
typedef struct bl_gguf_arr bl_gguf_arr_t; /* one array value (top level or nested) */

/* A string as stored in the file: not NUL-terminated, may hold any bytes. ptr points
 * into the mapping and lives as long as the bl_gguf_t. */
typedef struct bl_gguf_str {
    const char *ptr;
    uint64_t len;
} bl_gguf_str_t;

/* One tensor. Filled and validated at open; borrowed from the bl_gguf_t. */
typedef struct bl_gguf_tensor {
    const char *name;     /* NUL-terminated copy of the name (names hold no NUL byte) */
    uint32_t name_len;
    uint32_t type;        /* a bl_type_t (common/quant.h) known to bl_type_info */
    uint32_t n_dims;      /* 1..4 */
    int64_t ne[4];        /* elements per dimension, ne[0] innermost (the row); unused dims are 1 */
    uint64_t nbytes;      /* bytes of data */
    uint64_t offset;      /* offset from its part's data section, as stored */
    uint64_t file_offset; /* absolute offset of its data in its part's file */
    uint32_t part;        /* index of the part (file) holding it, 0-based */
    const void *data;     /* its bytes in that part's read-only mapping */
} bl_gguf_tensor_t;

/* --- opening ------------------------------------------------------------------- */

/* A split model's part name: NAME-NNNNN-of-MMMMM.gguf gives the length of NAME (at
 * least 1) and the two numbers as written, unchecked; any other name gives 0. */
size_t bl_gguf_split_name(const char *path, uint32_t *part, uint32_t *n_parts);

/* Opens and validates path. A name of the form NAME-00001-of-00003.gguf (any part
 * number) opens all three parts NAME-%05d-of-%05d.gguf and presents one model:
 * metadata from the first part, tensors of every part in part order. Returns 0 and
 * sets *out (caller frees with bl_gguf_close), or a negative BL_E* code with err
 * naming the file, the key or tensor, and the byte offset: BL_ENOENT (no such file
 * or missing part), BL_EIO (open/stat/mmap failed), BL_EINVAL (malformed), BL_ERANGE
 * (a count, length, size or offset that overflows or does not fit), BL_ENOTSUP
 * (version 1, big-endian file, unknown tensor type), BL_ENOMEM. */
int bl_gguf_open(bl_gguf_t **out, const char *path, bl_err_t *err) BL_WUR;

/* As bl_gguf_open, over size bytes at data that the caller keeps alive and unchanged
 * until bl_gguf_close. name is used in messages only. No split handling. */
int bl_gguf_open_memory(bl_gguf_t **out, const void *data, size_t size, const char *name,
                        bl_err_t *err) BL_WUR;

/* Unmaps and frees everything; g may be NULL. All pointers obtained from g die. */
void bl_gguf_close(bl_gguf_t *g);

/* --- the model as a whole ------------------------------------------------------ */

uint32_t bl_gguf_version(const bl_gguf_t *g);   /* of the first part: 2 or 3 */
uint32_t bl_gguf_alignment(const bl_gguf_t *g); /* of the first part */
uint32_t bl_gguf_n_parts(const bl_gguf_t *g);
const char *bl_gguf_part_path(const bl_gguf_t *g, uint32_t part); /* NULL if out of range */
uint64_t bl_gguf_part_size(const bl_gguf_t *g, uint32_t part);     /* file bytes */
uint64_t bl_gguf_data_offset(const bl_gguf_t *g, uint32_t part);   /* data section start */
/* The part's bytes as mapped (or as given to bl_gguf_open_memory); NULL and 0 when
 * part is out of range. For mlock and madvise over a whole file. */
const void *bl_gguf_part_bytes(const bl_gguf_t *g, uint32_t part, uint64_t *size);

/* --- metadata ------------------------------------------------------------------ */

/* Keys of the first part, in file order. */
uint64_t bl_gguf_n_kv(const bl_gguf_t *g);
const bl_gguf_kv_t *bl_gguf_kv_at(const bl_gguf_t *g, uint64_t i);     /* NULL if out of range */
const bl_gguf_kv_t *bl_gguf_find_kv(const bl_gguf_t *g, const char *key); /* NULL if absent; O(1) */

bl_gguf_str_t bl_gguf_kv_key(const bl_gguf_kv_t *kv);
bl_gguf_type_t bl_gguf_kv_type(const bl_gguf_kv_t *kv);
uint64_t bl_gguf_kv_offset(const bl_gguf_kv_t *kv); /* file offset of the key */

/* Typed getters. Integers widen where no value is lost (u8..u32 to u64, a
 * non-negative signed value to an unsigned type, an unsigned value that fits to a
 * signed type, an integer exactly representable to f32/f64, f32 to f64). A type that
 * cannot convert fails with BL_EINVAL, a value that does not fit with BL_ERANGE; the
 * message names the key. */
int bl_gguf_kv_u32(const bl_gguf_kv_t *kv, uint32_t *out, bl_err_t *err) BL_WUR;
int bl_gguf_kv_u64(const bl_gguf_kv_t *kv, uint64_t *out, bl_err_t *err) BL_WUR;
int bl_gguf_kv_i64(const bl_gguf_kv_t *kv, int64_t *out, bl_err_t *err) BL_WUR;
int bl_gguf_kv_f32(const bl_gguf_kv_t *kv, float *out, bl_err_t *err) BL_WUR;
int bl_gguf_kv_f64(const bl_gguf_kv_t *kv, double *out, bl_err_t *err) BL_WUR;
int bl_gguf_kv_bool(const bl_gguf_kv_t *kv, int *out, bl_err_t *err) BL_WUR;
int bl_gguf_kv_str(const bl_gguf_kv_t *kv, bl_gguf_str_t *out, bl_err_t *err) BL_WUR;
int bl_gguf_kv_arr(const bl_gguf_kv_t *kv, const bl_gguf_arr_t **out, bl_err_t *err) BL_WUR;

/* The same by key; a missing key is BL_ENOENT naming the key and the file. */
int bl_gguf_get_u32(const bl_gguf_t *g, const char *key, uint32_t *out, bl_err_t *err) BL_WUR;
int bl_gguf_get_u64(const bl_gguf_t *g, const char *key, uint64_t *out, bl_err_t *err) BL_WUR;
int bl_gguf_get_i64(const bl_gguf_t *g, const char *key, int64_t *out, bl_err_t *err) BL_WUR;
int bl_gguf_get_f32(const bl_gguf_t *g, const char *key, float *out, bl_err_t *err) BL_WUR;
int bl_gguf_get_f64(const bl_gguf_t *g, const char *key, double *out, bl_err_t *err) BL_WUR;
int bl_gguf_get_bool(const bl_gguf_t *g, const char *key, int *out, bl_err_t *err) BL_WUR;
int bl_gguf_get_str(const bl_gguf_t *g, const char *key, bl_gguf_str_t *out, bl_err_t *err) BL_WUR;

/* An integer of the file's architecture: "<general.architecture>.<key>", e.g. key
 * "block_count" reads "qwen3moe.block_count". BL_ENOENT (no architecture, no such
 * key), BL_EINVAL (not an integer), as bl_gguf_get_i64. */
int bl_gguf_get_arch_i64(const bl_gguf_t *g, const char *key, int64_t *out, bl_err_t *err) BL_WUR;
int bl_gguf_get_arr(const bl_gguf_t *g, const char *key, const bl_gguf_arr_t **out,
                    bl_err_t *err) BL_WUR;

/* --- arrays -------------------------------------------------------------------- */

/* Element access is O(1) for every element type: open records where each string or
 * nested array element starts, so walking a 151,936-token vocabulary is O(n). */
bl_gguf_type_t bl_gguf_arr_type(const bl_gguf_arr_t *a); /* element type */
uint64_t bl_gguf_arr_count(const bl_gguf_arr_t *a);
uint64_t bl_gguf_arr_offset(const bl_gguf_arr_t *a);     /* file offset of element 0 */
const bl_gguf_kv_t *bl_gguf_arr_kv(const bl_gguf_arr_t *a); /* the key it belongs to */

/* Element i with the conversions of the kv getters; BL_ERANGE if i >= count. */
int bl_gguf_arr_u32(const bl_gguf_arr_t *a, uint64_t i, uint32_t *out, bl_err_t *err) BL_WUR;
int bl_gguf_arr_u64(const bl_gguf_arr_t *a, uint64_t i, uint64_t *out, bl_err_t *err) BL_WUR;
int bl_gguf_arr_i64(const bl_gguf_arr_t *a, uint64_t i, int64_t *out, bl_err_t *err) BL_WUR;
int bl_gguf_arr_f32(const bl_gguf_arr_t *a, uint64_t i, float *out, bl_err_t *err) BL_WUR;
int bl_gguf_arr_f64(const bl_gguf_arr_t *a, uint64_t i, double *out, bl_err_t *err) BL_WUR;
int bl_gguf_arr_bool(const bl_gguf_arr_t *a, uint64_t i, int *out, bl_err_t *err) BL_WUR;
int bl_gguf_arr_str(const bl_gguf_arr_t *a, uint64_t i, bl_gguf_str_t *out, bl_err_t *err) BL_WUR;
int bl_gguf_arr_arr(const bl_gguf_arr_t *a, uint64_t i, const bl_gguf_arr_t **out,
                    bl_err_t *err) BL_WUR;

/* The raw little-endian bytes of a fixed-size element type (all but string and array):
 * count * bl_gguf_type_size(type) bytes in the mapping, or NULL for string/array.
 * Lets a caller copy a large i32 or f32 array in one go. */
const void *bl_gguf_arr_data(const bl_gguf_arr_t *a);

/* --- tensors ------------------------------------------------------------------- */

uint64_t bl_gguf_n_tensors(const bl_gguf_t *g);
const bl_gguf_tensor_t *bl_gguf_tensor_at(const bl_gguf_t *g, uint64_t i); /* NULL if out of range */
const bl_gguf_tensor_t *bl_gguf_find_tensor(const bl_gguf_t *g, const char *name); /* NULL if absent */

/* --- helpers ------------------------------------------------------------------- */

/* "u8", "string", "array", ...; "?" for an unknown id. */
const char *bl_gguf_type_name(uint32_t type);
/* Bytes of one value of a fixed-size type; 0 for string, array and unknown ids. */
size_t bl_gguf_type_size(uint32_t type);

#endif
