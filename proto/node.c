/* The relay's envelopes as the node reads them (node.h). */
#include "node.h"

#include <string.h>

#include "ring.h"

/* The wire layouts: both hosts little-endian, these sizes on either */
_Static_assert(sizeof(bp_node_setup_t) == 152, "the setup is 152 bytes on the wire");
_Static_assert(sizeof(bp_node_file_t) == 40, "the model file is 40 bytes on the wire");

/* A name or routing id: terminated inside its field, 1 or more bytes of A-Z a-z 0-9
 * _ . - */
static int word_ok(const char *s, size_t cap)
{
    const char *end = memchr(s, 0, cap);
    if (!end || end == s)
        return 0;
    for (const char *p = s; p < end; p++)
        if (!(*p == '_' || *p == '-' || *p == '.' || (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') ||
              (*p >= 'A' && *p <= 'Z')))
            return 0;
    return 1;
}

int bp_node_setup_read(bp_node_setup_t *out, const uint8_t *p, size_t n, const char *version, bl_err_t *err)
{
    memset(out, 0, sizeof *out);
    if (n != sizeof *out)
        return bl_err_set(err, BL_EPROTO, "the relay's setup is %zu bytes, not %zu", n, sizeof *out);
    bp_node_setup_t s;
    memcpy(&s, p, sizeof s);
    if (memcmp(s.magic, BP_NODE_SETUP_MAGIC, sizeof BP_NODE_SETUP_MAGIC) != 0)
        return bl_err_set(err, BL_EPROTO, "the relay's setup does not begin with %s", BP_NODE_SETUP_MAGIC);
    if (!memchr(s.version, 0, sizeof s.version))
        return bl_err_set(err, BL_EPROTO, "the relay's setup has a version without its end");
    if (!word_ok(s.name, sizeof s.name) || !word_ok(s.identity, sizeof s.identity))
        return bl_err_set(err, BL_EPROTO, "the relay's setup names the worker outside 1-23 (id 1-39) of A-Z a-z "
                          "0-9 _ . -");
    if (s.n_rings != 2 && s.n_rings != 4)
        return bl_err_set(err, BL_EPROTO, "the relay's setup has %u rings (2 or 4)", s.n_rings);
    if (s.verbosity < -1 || s.verbosity > 100 || (s.flags & ~(BP_NODE_VERBOSE | BP_NODE_QUIET | BP_NODE_COLORS)) ||
        s.pad != 0)
        return bl_err_set(err, BL_EPROTO, "the relay's setup has log settings or padding out of range");
    for (uint32_t i = 0; i < 4; i++) {
        const uint64_t c = s.capacity[i];
        const int ok = i < s.n_rings ? c >= BP_RING_MIN_CAPACITY && c <= BP_RING_MAX_CAPACITY && !(c & (c - 1))
                                     : c == 0;
        if (!ok)
            return bl_err_set(err, BL_EPROTO, "the relay's ring %u has capacity %llu", i, (unsigned long long)c);
    }
    if (strcmp(s.version, version) != 0)
        return bl_err_set(err, BL_EINVAL, "the router is bloomery %s, this node %s", s.version, version);
    *out = s;
    return 0;
}

int bp_node_file_read(bp_node_file_t *out, const uint8_t *p, size_t n, bl_err_t *err)
{
    memset(out, 0, sizeof *out);
    if (n != sizeof *out)
        return bl_err_set(err, BL_EPROTO, "the relay's model file is %zu bytes, not %zu", n, sizeof *out);
    bp_node_file_t f;
    memcpy(&f, p, sizeof f);
    if (f.size == 0 || f.size > (uint64_t)INT64_MAX)
        return bl_err_set(err, BL_EPROTO, "the relay's model file has size %llu", (unsigned long long)f.size);
    uint8_t any = 0;
    for (size_t i = 0; i < sizeof f.fingerprint; i++)
        any |= f.fingerprint[i];
    if (!any) /* SHA-256 gives no such value: a sender that never computed one */
        return bl_err_set(err, BL_EPROTO, "the relay's model file has a fingerprint of zeros");
    *out = f;
    return 0;
}
