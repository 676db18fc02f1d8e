/* Slot files' frame: names, the model's identity, the header and its checksums.
 * See slotfile.h for the layout. */
#include "slotfile.h"

#include "kvpart.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int rt_slotfile_name_ok(const char *name, bl_err_t *err)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > 255)
        return bl_err_set(err, BL_EINVAL, "Invalid filename: 1 to 255 bytes");
    if (name[0] == '.' || name[n - 1] == '.' || name[n - 1] == ' ')
        return bl_err_set(err, BL_EINVAL, "Invalid filename: it may not begin with '.' or end "
                                          "with '.' or a space");
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)name[i];
        if (c < 0x20 || c == 0x7f || strchr("/\\:*?\"<>|", c))
            return bl_err_set(err, BL_EINVAL, "Invalid filename: byte %zu (0x%02x) is not allowed",
                              i, c);
        /* UTF-8: a lead byte and its continuation bytes, no overlong forms or surrogates */
        int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (!len || i + (size_t)len > n || (len == 2 && c < 0xC2) || c > 0xF4)
            return bl_err_set(err, BL_EINVAL, "Invalid filename: not UTF-8 at byte %zu", i);
        uint32_t cp = len == 1 ? c : c & (0x7F >> len);
        for (int k = 1; k < len; k++) {
            unsigned char d = (unsigned char)name[i + (size_t)k];
            if ((d & 0xC0) != 0x80)
                return bl_err_set(err, BL_EINVAL, "Invalid filename: not UTF-8 at byte %zu", i);
            cp = cp << 6 | (d & 0x3F);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
            (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return bl_err_set(err, BL_EINVAL, "Invalid filename: not UTF-8 at byte %zu", i);
        i += (size_t)len;
    }
    return 0;
}

uint64_t rt_slotfile_model_id(const bl_gguf_t *g)
{
    uint64_t size = 0, h = 0x5107F11Eull;
    const void *p = bl_gguf_part_bytes(g, 0, &size);
    uint64_t head = bl_gguf_data_offset(g, 0);
    if (p && head <= size)
        h = bl_sum64(h, p, (size_t)head);
    for (uint32_t i = 0; bl_gguf_part_path(g, i); i++) {
        uint64_t s = bl_gguf_part_size(g, i);
        h = bl_sum64(h, &s, sizeof s);
    }
    return h;
}

static const char MAGIC[8] = {'B', 'L', 'M', 'S', 'L', 'O', 'T', '1'};

void rt_slotfile_encode(const rt_slotfile_hdr_t *h, uint8_t out[RT_SLOTFILE_HDR_BYTES])
{
    memset(out, 0, RT_SLOTFILE_HDR_BYTES);
    memcpy(out, MAGIC, 8);
    bl_put_le32(out + 8, h->version);
    bl_put_le32(out + 12, h->kv_type);
    bl_put_le64(out + 16, h->model_id);
    bl_put_le64(out + 24, h->n_tokens);
    bl_put_le64(out + 32, h->data_bytes);
    bl_put_le64(out + 40, h->sum);
    bl_put_le32(out + 48, h->n_layer);
    bl_put_le64(out + 56, bl_sum64(0, out, 56));
}

int rt_slotfile_decode(const void *buf, size_t n, rt_slotfile_hdr_t *h, bl_err_t *err)
{
    const uint8_t *b = buf;
    if (n < RT_SLOTFILE_HDR_BYTES)
        return bl_err_set(err, BL_EINVAL, "slot file: %zu bytes, shorter than its header", n);
    if (memcmp(b, MAGIC, 8) != 0)
        return bl_err_set(err, BL_EINVAL, "slot file: not a slot file of this server");
    if (bl_get_le64(b + 56) != bl_sum64(0, b, 56) || bl_get_le32(b + 52) != 0)
        return bl_err_set(err, BL_EINVAL, "slot file: the header is damaged");
    *h = (rt_slotfile_hdr_t){.version = bl_get_le32(b + 8), .kv_type = bl_get_le32(b + 12),
                             .model_id = bl_get_le64(b + 16), .n_tokens = bl_get_le64(b + 24),
                             .data_bytes = bl_get_le64(b + 32), .sum = bl_get_le64(b + 40),
                             .n_layer = bl_get_le32(b + 48)};
    if (h->version != RT_SLOTFILE_VERSION)
        return bl_err_set(err, BL_EINVAL, "slot file: version %u, this server reads %d", h->version,
                          RT_SLOTFILE_VERSION);
    if (h->n_tokens > (1u << 24) || h->data_bytes > (UINT64_MAX >> 2) ||
        (h->n_tokens == 0 && h->data_bytes != 0))
        return bl_err_set(err, BL_EINVAL, "slot file: %llu tokens with %llu bytes of cache",
                          (unsigned long long)h->n_tokens, (unsigned long long)h->data_bytes);
    return 0;
}

int rt_slotfile_sum_fd(int fd, uint64_t off, uint64_t n, uint64_t *out, bl_err_t *err)
{
    enum { CHUNK = 4 << 20 };
    char *buf = malloc(CHUNK);
    if (!buf)
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    uint64_t h = 0;
    int rc = 0;
    /* chunks are multiples of 8, so the sum over pieces is the sum over the whole */
    for (uint64_t done = 0; done < n;) {
        size_t want = n - done < CHUNK ? (size_t)(n - done) : CHUNK;
        ssize_t k = pread(fd, buf, want, (off_t)(off + done));
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            rc = bl_err_set(err, BL_EIO, "slot file: %s", strerror(errno));
            break;
        }
        if ((size_t)k != want && (k == 0 || (size_t)k % 8 != 0)) {
            rc = bl_err_set(err, BL_EIO, "slot file: shorter than its header says");
            break;
        }
        h = bl_sum64(h, buf, (size_t)k);
        done += (uint64_t)k;
    }
    free(buf);
    if (rc == 0)
        *out = h;
    return rc;
}
