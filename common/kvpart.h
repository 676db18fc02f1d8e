/* Cache files on disk: the checksum they share, and the part of a saved cache state
 * that one stage writes for its layers (the prompt cache on disk, --cache-disk).
 *
 * A part file is an 80-byte header, then the stage's state as it holds it in host
 * memory: (kv_layers, planes, n, row_bytes), K then V per layer that keeps rows (or
 * one plane where the value is the key's row), then rec_bytes of the recurrent state
 * of a hybrid model's DeltaNet layers:
 *
 *   0   "BLMKVPT1"
 *   8   u32 version (2)            12  u32 KV type (a bl_type_t id)
 *   16  u32 first layer            20  u32 end of the layers
 *   24  u64 positions              32  u64 bytes of one position of one layer's K
 *   40  u64 checksum of the state  48  u32 planes a layer (1 or 2)
 *   52  u32 layers that keep rows  56  u64 bytes of the recurrent state
 *   64  u64 checksum of bytes 0..64  72  8 bytes 0
 *
 * (version 1's 64-byte header had neither count: its files are refused and rebuilt)
 * all little-endian. */
#ifndef BL_KVPART_H
#define BL_KVPART_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* A checksum of n bytes (updating h; start with 0), 8 bytes at a time: to tell a
 * damaged file, not for security. Over pieces whose lengths are multiples of 8 (the
 * last any length), the same as over the whole. */
uint64_t bl_sum64(uint64_t h, const void *p, size_t n);

/* Little-endian fields of the cache files' headers. */
static inline void bl_put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void bl_put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t bl_get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t bl_get_le64(const uint8_t *p)
{
    return (uint64_t)bl_get_le32(p) | (uint64_t)bl_get_le32(p + 4) << 32;
}

#define BL_KVPART_HDR_BYTES 80
#define BL_KVPART_VERSION 2

typedef struct bl_kvpart {
    uint32_t version, kv_type, layer_begin, layer_end;
    uint32_t planes;    /* 1 or 2 */
    uint32_t kv_layers; /* the stage's layers that keep K/V rows (a hybrid's attention
                         * layers, and a last stage's NextN layer where it runs one), at
                         * most layer_end - layer_begin + 1 */
    uint64_t n, row_bytes, sum;
    uint64_t rec_bytes; /* the recurrent state after the rows (0 without one) */
} bl_kvpart_t;

/* The state's bytes: kv_layers * planes * n * row_bytes + rec_bytes, or 0 when that
 * overflows. */
uint64_t bl_kvpart_bytes(const bl_kvpart_t *p);
void bl_kvpart_encode(const bl_kvpart_t *p, uint8_t out[BL_KVPART_HDR_BYTES]);
/* BL_EINVAL naming what is wrong: too short, not a part file, another version, a
 * damaged header, counts that cannot be. */
int bl_kvpart_decode(const void *buf, size_t n, bl_kvpart_t *p, bl_err_t *err) BL_WUR;

#endif
