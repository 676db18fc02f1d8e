/* A model file's fingerprint (fingerprint.h): the GGUF reader finds each part's data
 * section, pread reads the header and the samples, libcrypto hashes them. */
#include "fingerprint.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf.h"

/* Names this scheme inside the hash: a later change of what is sampled gives other
 * fingerprints rather than equal ones over other bytes. */
#define DOMAIN "bloomery model fingerprint 1"
#define CHUNK ((size_t)1 << 20)

static void put_u64(EVP_MD_CTX *md, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i)); /* little-endian whatever the host */
    /* SHA-256's update fails only on a context that did not initialise, checked once */
    (void)EVP_DigestUpdate(md, b, sizeof b);
}

/* Hashes n bytes of fd from off, through buf (CHUNK bytes). */
static int hash_range(EVP_MD_CTX *md, int fd, const char *path, uint64_t off, uint64_t n, uint8_t *buf,
                      bl_err_t *err)
{
    while (n > 0) {
        const size_t want = n < CHUNK ? (size_t)n : CHUNK;
        const ssize_t r = pread(fd, buf, want, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return bl_err_set(err, BL_EIO, "%s: read at offset %llu: %s", path, (unsigned long long)off,
                              strerror(errno));
        if (r == 0)
            return bl_err_set(err, BL_EIO, "%s: the file ends at offset %llu while it was read (it changed)",
                              path, (unsigned long long)off);
        if (EVP_DigestUpdate(md, buf, (size_t)r) != 1)
            return bl_err_set(err, BL_EIO, "%s: SHA-256 failed", path);
        off += (uint64_t)r;
        n -= (uint64_t)r;
    }
    return 0;
}

/* One part: its size, its header, then its data section whole or sampled. */
static int hash_part(EVP_MD_CTX *md, const char *path, uint64_t size, uint64_t data_off, uint8_t *buf,
                     bl_err_t *err)
{
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return bl_err_set(err, errno == ENOENT ? BL_ENOENT : BL_EIO, "%s: %s", path, strerror(errno));
    struct stat sb;
    int rc = 0;
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size != size) {
        rc = bl_err_set(err, BL_EIO, "%s: the file changed size while it was read", path);
        goto out;
    }
    put_u64(md, size);
    put_u64(md, data_off);
    if ((rc = hash_range(md, fd, path, 0, data_off, buf, err)) != 0)
        goto out;
    const uint64_t len = size - data_off, B = BL_FINGERPRINT_BLOCK;
    if (len <= (BL_FINGERPRINT_SAMPLES + 1) * B) {
        rc = hash_range(md, fd, path, data_off, len, buf, err);
        goto out;
    }
    /* evenly spaced over [data_off, size - B], then the last block; the step is
     * divided first so that no product overflows */
    const uint64_t step = (len - B) / BL_FINGERPRINT_SAMPLES;
    for (uint64_t k = 0; rc == 0 && k < BL_FINGERPRINT_SAMPLES; k++)
        rc = hash_range(md, fd, path, data_off + k * step, B, buf, err);
    if (rc == 0)
        rc = hash_range(md, fd, path, size - B, B, buf, err);
out:
    close(fd);
    return rc;
}

int bl_model_fingerprint(const char *path, uint8_t out[BL_FINGERPRINT_BYTES], uint64_t *size, bl_err_t *err)
{
    memset(out, 0, BL_FINGERPRINT_BYTES);
    *size = 0;
    bl_gguf_t *g = NULL;
    int rc = bl_gguf_open(&g, path, err);
    if (rc)
        return rc;
    uint8_t *buf = malloc(CHUNK);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (!buf || !md) {
        rc = bl_err_set(err, BL_ENOMEM, "%s: out of memory for its fingerprint", path);
        goto out;
    }
    if (EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
        rc = bl_err_set(err, BL_EIO, "%s: SHA-256 is not available", path);
        goto out;
    }
    (void)EVP_DigestUpdate(md, DOMAIN, sizeof DOMAIN); /* as put_u64's */
    const uint32_t n_parts = bl_gguf_n_parts(g);
    put_u64(md, n_parts);
    uint64_t total = 0;
    for (uint32_t p = 0; rc == 0 && p < n_parts; p++) {
        const uint64_t part_size = bl_gguf_part_size(g, p);
        /* the reader checked every tensor against the file; a part without tensors
         * may end inside the padding before its data section */
        uint64_t data_off = bl_gguf_data_offset(g, p);
        data_off = data_off < part_size ? data_off : part_size;
        rc = hash_part(md, bl_gguf_part_path(g, p), part_size, data_off, buf, err);
        total += part_size;
    }
    unsigned int n = 0;
    if (rc == 0 && (EVP_DigestFinal_ex(md, out, &n) != 1 || n != BL_FINGERPRINT_BYTES))
        rc = bl_err_set(err, BL_EIO, "%s: SHA-256 failed", path);
    if (rc == 0)
        *size = total;
out:
    if (rc)
        memset(out, 0, BL_FINGERPRINT_BYTES);
    EVP_MD_CTX_free(md);
    free(buf);
    bl_gguf_close(g);
    return rc;
}

void bl_fingerprint_hex(const uint8_t fp[BL_FINGERPRINT_BYTES], int n_digits, char *out)
{
    static const char hex[] = "0123456789abcdef";
    if (n_digits < 0)
        n_digits = 0;
    if (n_digits > 2 * BL_FINGERPRINT_BYTES)
        n_digits = 2 * BL_FINGERPRINT_BYTES;
    for (int i = 0; i < n_digits; i++)
        out[i] = hex[(fp[i / 2] >> (i % 2 ? 0 : 4)) & 15];
    out[n_digits] = '\0';
}
