/* A model file's identity by its content, cheap enough to take on every start: two
 * hosts compare fingerprints to know they hold the same model before one loads it
 * for the other (docs/deploy.md, "Several hosts"). A size alone does not tell another
 * version of a file, or another quant of the same shape, from the right one; a hash
 * of every byte would read tens of gigabytes.
 *
 * The fingerprint is SHA-256 over, for each part of the model (a split model's parts
 * in order): the part's size, its GGUF header (metadata and tensor infos, up to the
 * data section) and a fixed sample of its data section: BL_FINGERPRINT_SAMPLES blocks
 * of BL_FINGERPRINT_BLOCK bytes at evenly spaced offsets and the section's last
 * block (a data section of at most BL_FINGERPRINT_SAMPLES + 1 blocks is hashed
 * whole). Any change to the metadata, the tensor table (another quant, other shapes,
 * other offsets) or the length, and any change inside a sampled block, changes it;
 * a change confined to the bytes between samples does not. About 4 MiB read per part
 * besides the header, whatever the file's size: on the 2-core development VM, 4-18
 * ms for an 18 GiB file with a small header, 19-41 ms for a file with Qwen3's 6 MB
 * tokenizer in its header (most of it the GGUF reader's validation of the header). */
#ifndef BL_FINGERPRINT_H
#define BL_FINGERPRINT_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define BL_FINGERPRINT_BYTES 32
#define BL_FINGERPRINT_SAMPLES 64
#define BL_FINGERPRINT_BLOCK ((uint64_t)64 << 10)

/* The fingerprint of the model at path (bl_gguf_open's naming: a split model's part
 * opens every part) into out, and the bytes of all its parts into *size. The file is
 * validated as bl_gguf_open does: BL_ENOENT (no such file or a missing part), and
 * bl_gguf_open's errors for a file that is not GGUF or is truncated, with err naming
 * the file; BL_EIO (a read failed, or a part changed size while it was read);
 * BL_ENOMEM. Reads with pread, never through a mapping, so that a file truncated
 * meanwhile is an error rather than a SIGBUS. Any thread. */
int bl_model_fingerprint(const char *path, uint8_t out[BL_FINGERPRINT_BYTES], uint64_t *size,
                         bl_err_t *err) BL_WUR;

/* The first n_digits hex digits (lower case, at most 2 * BL_FINGERPRINT_BYTES) of fp
 * into out, NUL-terminated: out holds n_digits + 1 bytes. */
void bl_fingerprint_hex(const uint8_t fp[BL_FINGERPRINT_BYTES], int n_digits, char *out);

#endif
