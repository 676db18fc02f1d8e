/* Cache part files' header and the checksum of cache files (kvpart.h). */
#include "kvpart.h"

#include <string.h>

static uint64_t rotl(uint64_t x, int r) { return x << r | x >> (64 - r); }

uint64_t bl_sum64(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = rotl(h ^ (w * 0x9E3779B97F4A7C15ull), 31) * 0xC2B2AE3D27D4EB4Full;
    }
    if (i < n) {
        uint64_t w = 0;
        memcpy(&w, b + i, n - i);
        h = rotl(h ^ (w * 0x9E3779B97F4A7C15ull), 31) * 0xC2B2AE3D27D4EB4Full;
    }
    return h;
}

static const char MAGIC[8] = {'B', 'L', 'M', 'K', 'V', 'P', 'T', '1'};

uint64_t bl_kvpart_bytes(const bl_kvpart_t *p)
{
    if (p->layer_end < p->layer_begin || p->kv_layers > p->layer_end - p->layer_begin + 1)
        return 0;
    uint64_t l = (uint64_t)p->kv_layers * (p->planes ? p->planes : 2), r;
    if (__builtin_mul_overflow(l, p->n, &r) || __builtin_mul_overflow(r, p->row_bytes, &r) ||
        __builtin_add_overflow(r, p->rec_bytes, &r))
        return 0;
    return r;
}

void bl_kvpart_encode(const bl_kvpart_t *p, uint8_t out[BL_KVPART_HDR_BYTES])
{
    memset(out, 0, BL_KVPART_HDR_BYTES);
    memcpy(out, MAGIC, 8);
    bl_put_le32(out + 8, p->version);
    bl_put_le32(out + 12, p->kv_type);
    bl_put_le32(out + 16, p->layer_begin);
    bl_put_le32(out + 20, p->layer_end);
    bl_put_le64(out + 24, p->n);
    bl_put_le64(out + 32, p->row_bytes);
    bl_put_le64(out + 40, p->sum);
    bl_put_le32(out + 48, p->planes);
    bl_put_le32(out + 52, p->kv_layers);
    bl_put_le64(out + 56, p->rec_bytes);
    bl_put_le64(out + 64, bl_sum64(0, out, 64));
}

int bl_kvpart_decode(const void *buf, size_t n, bl_kvpart_t *p, bl_err_t *err)
{
    const uint8_t *b = buf;
    if (n < BL_KVPART_HDR_BYTES)
        return bl_err_set(err, BL_EINVAL, "cache part: %zu bytes, shorter than its header", n);
    if (memcmp(b, MAGIC, 8) != 0)
        return bl_err_set(err, BL_EINVAL, "cache part: not a cache part file");
    if (bl_get_le32(b + 8) != BL_KVPART_VERSION) /* before the checksum: version 1's is elsewhere */
        return bl_err_set(err, BL_EINVAL, "cache part: version %u, this build reads %d", bl_get_le32(b + 8),
                          BL_KVPART_VERSION);
    if (bl_get_le64(b + 64) != bl_sum64(0, b, 64) || bl_get_le64(b + 72) != 0 || bl_get_le32(b + 48) < 1 ||
        bl_get_le32(b + 48) > 2)
        return bl_err_set(err, BL_EINVAL, "cache part: the header is damaged");
    *p = (bl_kvpart_t){.version = bl_get_le32(b + 8), .kv_type = bl_get_le32(b + 12),
                       .layer_begin = bl_get_le32(b + 16), .layer_end = bl_get_le32(b + 20),
                       .planes = bl_get_le32(b + 48), .kv_layers = bl_get_le32(b + 52),
                       .n = bl_get_le64(b + 24), .row_bytes = bl_get_le64(b + 32), .sum = bl_get_le64(b + 40),
                       .rec_bytes = bl_get_le64(b + 56)};
    if (p->layer_end <= p->layer_begin || p->layer_end > 65536 || p->n == 0 || p->n > (1u << 24) ||
        p->row_bytes == 0 || p->row_bytes > (1u << 24) || p->kv_layers > p->layer_end - p->layer_begin + 1 ||
        p->rec_bytes > ((uint64_t)1 << 40) || bl_kvpart_bytes(p) == 0)
        return bl_err_set(err, BL_EINVAL, "cache part: layers %u..%u, %llu positions of %llu bytes",
                          p->layer_begin, p->layer_end, (unsigned long long)p->n,
                          (unsigned long long)p->row_bytes);
    return 0;
}
