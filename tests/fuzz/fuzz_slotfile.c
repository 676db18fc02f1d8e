/* libFuzzer target for slot files (router/slotfile.c): the file names a client asks
 * for, and the header and checksums of a file read back from --slot-save-path.
 * Byte 0 modulo 3 picks: 0, the rest is a file name (an accepted one holds no path
 * separator, no control byte, is UTF-8 and does not begin with '.'); 1, the rest is a
 * slot file or a meta file of the prompt cache on disk (an accepted header encodes
 * back to the same 64 bytes, and its checksum over the file's bytes agrees with the
 * one read through a file in pieces); 2, the rest is a stage's part file of that
 * cache (common/kvpart.c: an accepted header encodes back to itself and its state's
 * size is the product of its counts).
 * Seeds: tests/fuzz/corpus/fuzz_slotfile/. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvpart.h"
#include "slotfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_slotfile: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    bl_err_t err = {0};
    if (data[0] % 3 == 2) {
        bl_kvpart_t k;
        if (bl_kvpart_decode(p, n, &k, &err) == 0) {
            uint8_t again[BL_KVPART_HDR_BYTES];
            bl_kvpart_encode(&k, again);
            check(memcmp(again, p, sizeof again) == 0, "a part header does not encode back to itself");
            check(k.kv_layers <= k.layer_end - k.layer_begin + 1 && (k.planes == 1 || k.planes == 2),
                  "a part's counts out of range");
            check(bl_kvpart_bytes(&k) == (uint64_t)k.kv_layers * k.planes * k.n * k.row_bytes + k.rec_bytes,
                  "a part's size is not its rows' and its recurrent state's");
        } else {
            check(err.msg[0] != '\0', "a refusal without a reason");
        }
        return 0;
    }
    if (data[0] % 3 == 0) {
        char *name = malloc(n + 1);
        if (!name)
            return 0;
        memcpy(name, p, n);
        name[n] = '\0';
        if (rt_slotfile_name_ok(name, &err) == 0) {
            size_t l = strlen(name);
            check(l >= 1 && l <= 255 && name[0] != '.' && !strchr(name, '/') && !strchr(name, '\\'),
                  "a name with a path in it was accepted");
            for (size_t i = 0; i < l; i++)
                check((unsigned char)name[i] >= 0x20 && name[i] != 0x7f, "a control byte was accepted");
        } else {
            check(err.msg[0] != '\0', "a refusal without a reason");
        }
        free(name);
        return 0;
    }
    rt_slotfile_hdr_t h;
    if (rt_slotfile_decode(p, n, &h, &err) == 0) {
        uint8_t again[RT_SLOTFILE_HDR_BYTES];
        rt_slotfile_encode(&h, again);
        check(memcmp(again, p, sizeof again) == 0, "a header does not encode back to itself");
        check(h.version == RT_SLOTFILE_VERSION && h.n_tokens <= (1u << 24), "bounds not held");
    } else {
        check(err.msg[0] != '\0', "a refusal without a reason");
    }
    /* the checksum through a file, in pieces, equals the one over the bytes */
    int fd = memfd_create("slotfile", 0);
    if (fd < 0)
        return 0;
    if (write(fd, p, n) == (ssize_t)n) {
        uint64_t got = 0;
        uint64_t off = n > 8 ? 8 : 0;
        if (rt_slotfile_sum_fd(fd, off, n - off, &got, &err) == 0)
            check(got == bl_sum64(0, p + off, n - off), "the file's checksum differs");
        check(rt_slotfile_sum_fd(fd, 0, n + 1, &got, &err) != 0, "a range past the end was read");
    }
    close(fd);
    return 0;
}
