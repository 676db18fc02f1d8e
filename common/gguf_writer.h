/* GGUF writer: metadata and tensor descriptions are collected in memory, then the
 * file is streamed out (header, key/values, tensor infos, aligned tensor data), so
 * a writer never needs every weight in RAM at once. Output bytes depend only on
 * the calls made, never on the host: every number is written little-endian.
 *
 * Prefix bl_gw_. One writer per thread; nothing here is thread-safe.
 *
 * Use:
 *   bl_gw_create(&w, &err);
 *   bl_gw_set_str(w, "general.architecture", "qwen3moe", &err); ...
 *   bl_gw_add_tensor(w, "token_embd.weight", BL_TYPE_Q4_K, 2, ne, &err); ...
 *   then either bl_gw_write_file(w, path, fill, ud, &err)   (a callback per tensor)
 *   or bl_gw_begin(w, path), bl_gw_write_data(...) in tensor order, bl_gw_finish(w)
 *   bl_gw_destroy(w);
 *
 * Keys and tensor names are unique (a repeat is refused). Tensor data follows
 * the order of bl_gw_add_tensor calls; the writer inserts the alignment padding
 * between tensors itself. */
#ifndef BL_GGUF_WRITER_H
#define BL_GGUF_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "gguf.h" /* bl_gguf_type_t: the metadata value types */
#include "quant.h"

#define BL_GW_MAX_NAME 63 /* bytes of a tensor name; ggml keeps 64 with the NUL */

typedef struct bl_gguf_writer bl_gguf_writer_t;

/* Creates an empty writer (alignment 32). Caller frees with bl_gw_destroy. */
int bl_gw_create(bl_gguf_writer_t **out, bl_err_t *err) BL_WUR;

/* Frees the writer. If a file was begun but not finished, it is closed and
 * removed, so that a failed run never leaves a truncated model behind. NULL is a no-op. */
void bl_gw_destroy(bl_gguf_writer_t *w);

/* --- metadata -------------------------------------------------------------------
 * Each call appends one key/value, in call order. Keys are 1..65535 bytes.
 * BL_EINVAL for a repeated or empty key, or a call after bl_gw_begin.
 * Setting "general.alignment" (u32, a power of two, multiple of 8) also sets the
 * alignment the writer pads to; it must come before the first bl_gw_add_tensor. */
int bl_gw_set_u8(bl_gguf_writer_t *w, const char *key, uint8_t v, bl_err_t *err) BL_WUR;
int bl_gw_set_i8(bl_gguf_writer_t *w, const char *key, int8_t v, bl_err_t *err) BL_WUR;
int bl_gw_set_u16(bl_gguf_writer_t *w, const char *key, uint16_t v, bl_err_t *err) BL_WUR;
int bl_gw_set_i16(bl_gguf_writer_t *w, const char *key, int16_t v, bl_err_t *err) BL_WUR;
int bl_gw_set_u32(bl_gguf_writer_t *w, const char *key, uint32_t v, bl_err_t *err) BL_WUR;
int bl_gw_set_i32(bl_gguf_writer_t *w, const char *key, int32_t v, bl_err_t *err) BL_WUR;
int bl_gw_set_u64(bl_gguf_writer_t *w, const char *key, uint64_t v, bl_err_t *err) BL_WUR;
int bl_gw_set_i64(bl_gguf_writer_t *w, const char *key, int64_t v, bl_err_t *err) BL_WUR;
int bl_gw_set_f32(bl_gguf_writer_t *w, const char *key, float v, bl_err_t *err) BL_WUR;
int bl_gw_set_f64(bl_gguf_writer_t *w, const char *key, double v, bl_err_t *err) BL_WUR;
int bl_gw_set_bool(bl_gguf_writer_t *w, const char *key, int v, bl_err_t *err) BL_WUR;
/* A NUL-terminated UTF-8 string (the NUL is not stored). */
int bl_gw_set_str(bl_gguf_writer_t *w, const char *key, const char *v, bl_err_t *err) BL_WUR;
/* A string of len bytes that may hold any byte, NUL included. */
int bl_gw_set_strn(bl_gguf_writer_t *w, const char *key, const char *v, size_t len,
                   bl_err_t *err) BL_WUR;

/* An array of n scalars of type elem (any type but STRING and ARRAY). data points
 * at n values of the matching C type (uint8_t, int8_t, ..., float, double); BOOL
 * elements are read as uint8_t, any non-zero byte meaning true. n may be 0. */
int bl_gw_set_arr(bl_gguf_writer_t *w, const char *key, bl_gguf_type_t elem, const void *data,
                  size_t n, bl_err_t *err) BL_WUR;
/* An array of n NUL-terminated strings. */
int bl_gw_set_arr_str(bl_gguf_writer_t *w, const char *key, const char *const *v, size_t n,
                      bl_err_t *err) BL_WUR;

/* --- tensors ----------------------------------------------------------------------
 * Declares the next tensor: ne[0] is the row length (the contiguous dimension) and
 * must be a multiple of the type's block size; 1..4 dimensions, each >= 1.
 * Offsets are assigned in call order. BL_EINVAL for a bad name (empty, longer
 * than 63 bytes, repeated), a type without a known block size or a bad shape;
 * BL_ERANGE when the byte size overflows. */
int bl_gw_add_tensor(bl_gguf_writer_t *w, const char *name, bl_type_t type, int n_dims,
                     const int64_t *ne, bl_err_t *err) BL_WUR;

size_t bl_gw_tensor_count(const bl_gguf_writer_t *w);
/* Bytes of tensor i's data (without padding); 0 for an index out of range. */
uint64_t bl_gw_tensor_nbytes(const bl_gguf_writer_t *w, size_t i);
/* Name of tensor i (borrowed), or NULL for an index out of range. */
const char *bl_gw_tensor_name(const bl_gguf_writer_t *w, size_t i);

/* --- output -----------------------------------------------------------------------
 * Creates (or truncates) path and writes everything up to the start of tensor
 * data. No metadata or tensor may be added afterwards. BL_EIO names the file. */
int bl_gw_begin(bl_gguf_writer_t *w, const char *path, bl_err_t *err) BL_WUR;

/* Appends n bytes of tensor data; a call may end inside a tensor or span several.
 * When a tensor's last byte is written the padding up to the alignment follows.
 * BL_EINVAL when the bytes go past the last tensor. */
int bl_gw_write_data(bl_gguf_writer_t *w, const void *buf, size_t n, bl_err_t *err) BL_WUR;

/* As bl_gw_write_data, but n bytes the file leaves as a hole (a sparse file: no
 * disk block, read as zeros): a file with every tensor's name, type and shape and
 * no weights, for what reads only the header (--dry-run, the placement plan). */
int bl_gw_skip_data(bl_gguf_writer_t *w, uint64_t n, bl_err_t *err) BL_WUR;

/* Index of the tensor the next bl_gw_write_data bytes belong to (== count when
 * all data is written). */
size_t bl_gw_current_tensor(const bl_gguf_writer_t *w);

/* Checks every tensor got all its bytes (BL_EINVAL naming the first short one),
 * flushes and closes the file. */
int bl_gw_finish(bl_gguf_writer_t *w, bl_err_t *err) BL_WUR;

/* Bytes written to the file so far (the file size after bl_gw_finish). */
uint64_t bl_gw_bytes_written(const bl_gguf_writer_t *w);

/* Produces tensor i's data by calling bl_gw_write_data(w, ...) exactly
 * bl_gw_tensor_nbytes(w, i) bytes in total, in as many pieces as it likes.
 * Returns 0 or a negative BL_E* code with err filled. */
typedef int (*bl_gw_fill_fn)(void *ud, bl_gguf_writer_t *w, size_t i, bl_err_t *err);

/* bl_gw_begin, then fill for each tensor in order (checking each wrote exactly
 * its size), then bl_gw_finish. */
int bl_gw_write_file(bl_gguf_writer_t *w, const char *path, bl_gw_fill_fn fill, void *ud,
                     bl_err_t *err) BL_WUR;

#endif
