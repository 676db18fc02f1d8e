/* Slot files (--slot-save-path): a slot's cache on disk, as llama-server's
 * POST /slots/ID?action=save|restore writes and reads it. The stages write and read
 * the cache's bytes themselves (rt_cluster_kv WRITE and READ, each stage its layers
 * at an offset); this module owns the frame around them:
 *
 *   0   "BLMSLOT1"
 *   8   u32 version (1)           12  u32 KV type (a bl_type_t id)
 *   16  u64 the model's identity (rt_slotfile_model_id)
 *   24  u64 tokens                32  u64 bytes of the stages' parts together
 *   40  u64 checksum of everything after the header (tokens and parts)
 *   48  u32 the model's layers    52  u32 0
 *   56  u64 checksum of bytes 0..56
 *   64  the tokens (i32 each), then the parts in layer order
 *
 * all little-endian. A file is written under a temporary name and renamed when whole,
 * so that a crash leaves no half file under the name asked for. */
#ifndef RT_SLOTFILE_H
#define RT_SLOTFILE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "gguf.h"
#include "kvpart.h"

#define RT_SLOTFILE_HDR_BYTES 64
#define RT_SLOTFILE_VERSION 1

typedef struct rt_slotfile_hdr {
    uint32_t version, kv_type, n_layer;
    uint64_t model_id, n_tokens, data_bytes, sum;
} rt_slotfile_hdr_t;

/* Whether name is a file name llama-server accepts for a slot file: 1..255 bytes of
 * UTF-8, no control characters, none of / \ : * ? " < > |, not beginning with '.' or
 * ending with '.' or a space. BL_EINVAL naming the fault. */
int rt_slotfile_name_ok(const char *name, bl_err_t *err) BL_WUR;

/* The identity of the model file g: a checksum of its header, metadata and tensor
 * list (the bytes before the tensor data) and of every part's size. */
uint64_t rt_slotfile_model_id(const bl_gguf_t *g);

void rt_slotfile_encode(const rt_slotfile_hdr_t *h, uint8_t out[RT_SLOTFILE_HDR_BYTES]);
/* Reads a header from buf (n bytes): BL_EINVAL naming what is wrong (too short, not a
 * slot file, another version, a damaged header, counts that cannot be). */
int rt_slotfile_decode(const void *buf, size_t n, rt_slotfile_hdr_t *h, bl_err_t *err) BL_WUR;

/* The checksum of bytes off..off+n of the open file fd (bl_sum64 over them).
 * BL_EIO naming the file's error, or a file shorter than that. */
int rt_slotfile_sum_fd(int fd, uint64_t off, uint64_t n, uint64_t *out, bl_err_t *err) BL_WUR;

#endif
