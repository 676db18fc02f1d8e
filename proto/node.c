/* The relay's envelopes as the node reads them (node.h). */
#include "node.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "link.h"
#include "msg.h"
#include "plan.h"
#include "ring.h"

/* The wire layouts: both hosts little-endian, these sizes on either */
_Static_assert(sizeof(bp_node_setup_t) == 176, "the setup is 176 bytes on the wire");
_Static_assert(sizeof(bp_node_file_t) == 40, "the model file is 40 bytes on the wire");
_Static_assert(sizeof(bp_node_probe_t) == 48, "the probe is 48 bytes on the wire");
_Static_assert(sizeof(bp_node_device_t) == 88, "a device is 88 bytes on the wire");
_Static_assert(sizeof(bp_node_host_t) == 104 + BP_NODE_MAX_DEVICES * 88, "the host's facts are 1512 bytes on the wire");
_Static_assert(BP_NODE_MAX_DEVICES == BL_PLAN_MAX_DEVICES, "a node reports as many devices as a plan takes");

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

/* Whether the n bytes at p are all zero. */
static int zeros(const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return 0;
    return 1;
}

/* A payload of one of the fixed layouts: n bytes of p into dst (size bytes), which
 * begin with magic (and its NUL) when magic is given, and a version field (cap bytes
 * at version_at, or none when cap is 0) that ends inside it. what names it. The
 * reader's out (size bytes) is emptied first: it holds only what was accepted. */
static int fixed_read(void *out, void *dst, size_t size, const uint8_t *p, size_t n, const char *magic,
                      size_t version_at, size_t cap, const char *what, bl_err_t *err)
{
    memset(out, 0, size);
    if (n != size)
        return bl_err_set(err, BL_EPROTO, "%s is %zu bytes, not %zu", what, n, size);
    memcpy(dst, p, size);
    if (magic && memcmp(dst, magic, strlen(magic) + 1) != 0)
        return bl_err_set(err, BL_EPROTO, "%s does not begin with %s", what, magic);
    if (cap && !memchr((const char *)dst + version_at, 0, cap))
        return bl_err_set(err, BL_EPROTO, "%s has a version without its end", what);
    return 0;
}

/* The peer's version against this side's: another is refused with both named. */
static int same_version(const char *theirs, const char *ours, bl_err_t *err)
{
    return strcmp(theirs, ours) == 0 ? 0
                                     : bl_err_set(err, BL_EINVAL, "the router is bloomery %s, this node %s", theirs,
                                                  ours);
}

int bp_node_setup_read(bp_node_setup_t *out, const uint8_t *p, size_t n, const char *version, bl_err_t *err)
{
    bp_node_setup_t s;
    const int rc = fixed_read(out, &s, sizeof s, p, n, BP_NODE_SETUP_MAGIC, offsetof(bp_node_setup_t, version),
                              sizeof s.version, "the relay's setup", err);
    if (rc)
        return rc;
    if (!word_ok(s.name, sizeof s.name) || !word_ok(s.identity, sizeof s.identity))
        return bl_err_set(err, BL_EPROTO, "the relay's setup names the worker outside 1-23 (id 1-39) of A-Z a-z "
                          "0-9 _ . -");
    if (s.n_rings != 2 && s.n_rings != 4)
        return bl_err_set(err, BL_EPROTO, "the relay's setup has %u rings (2 or 4)", s.n_rings);
    if (s.verbosity < -1 || s.verbosity > 100 ||
        (s.flags & ~(BP_NODE_VERBOSE | BP_NODE_QUIET | BP_NODE_COLORS | BP_NODE_HOSTTIER)))
        return bl_err_set(err, BL_EPROTO, "the relay's setup has log settings or flags out of range");
    if (s.flags & BP_NODE_HOSTTIER) {
        if (s.n_rings != 4)
            return bl_err_set(err, BL_EPROTO, "the relay's setup asks for a hosttier without the experts rings");
        if (s.hosttier_threads > BP_NODE_MAX_HOSTTIER_THREADS)
            return bl_err_set(err, BL_EPROTO, "the relay's setup gives the hosttier %u threads (0..%d)",
                              s.hosttier_threads, BP_NODE_MAX_HOSTTIER_THREADS);
        if (!zeros(s.hosttier_name, sizeof s.hosttier_name) && !word_ok(s.hosttier_name, sizeof s.hosttier_name))
            return bl_err_set(err, BL_EPROTO, "the relay's setup names the hosttier outside 1-23 of A-Z a-z 0-9 "
                              "_ . -");
    } else if (s.hosttier_threads != 0 || !zeros(s.hosttier_name, sizeof s.hosttier_name)) {
        return bl_err_set(err, BL_EPROTO, "the relay's setup gives hosttier settings without a hosttier");
    }
    for (uint32_t i = 0; i < 4; i++) {
        const uint64_t c = s.capacity[i];
        const int ok = i < s.n_rings ? c >= BP_RING_MIN_CAPACITY && c <= BP_RING_MAX_CAPACITY && !(c & (c - 1))
                                     : c == 0;
        if (!ok)
            return bl_err_set(err, BL_EPROTO, "the relay's ring %u has capacity %llu", i, (unsigned long long)c);
    }
    if (same_version(s.version, version, err) != 0)
        return BL_EINVAL;
    *out = s;
    return 0;
}

int bp_node_file_read(bp_node_file_t *out, const uint8_t *p, size_t n, bl_err_t *err)
{
    bp_node_file_t f;
    const int rc = fixed_read(out, &f, sizeof f, p, n, NULL, 0, 0, "the relay's model file", err);
    if (rc)
        return rc;
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

int bp_node_probe_read(bp_node_probe_t *out, const uint8_t *p, size_t n, const char *version, bl_err_t *err)
{
    bp_node_probe_t q;
    int rc = fixed_read(out, &q, sizeof q, p, n, BP_NODE_PROBE_MAGIC, offsetof(bp_node_probe_t, version),
                        sizeof q.version, "the router's probe", err);
    if (rc == 0 && ((q.flags & ~BP_NODE_PROBE_RATES) || q.pad))
        rc = bl_err_set(err, BL_EPROTO, "the router's probe has flags 0x%x or padding %u", q.flags, q.pad);
    if (rc == 0 && (rc = same_version(q.version, version, err)) == 0)
        *out = q;
    return rc;
}

/* Device i of the node's answer h: an ordinal in range and not one of an earlier
 * device's, a name of printable ASCII ended inside its field with zeros after it,
 * free memory at most the total, a read rate in range. */
static int device_read(const bp_node_host_t *h, uint32_t i, bl_err_t *err)
{
    const bp_node_device_t *d = &h->device[i];
    if (d->index < 0 || d->index > BP_NODE_MAX_ORDINAL)
        return bl_err_set(err, BL_EPROTO, "the node's device %u has CUDA ordinal %d (0..%d)", i, (int)d->index,
                          BP_NODE_MAX_ORDINAL);
    for (uint32_t k = 0; k < i; k++)
        if (h->device[k].index == d->index)
            return bl_err_set(err, BL_EPROTO, "the node's devices %u and %u are both CUDA%d", k, i, (int)d->index);
    const char *end = memchr(d->name, 0, sizeof d->name);
    if (!end || end == d->name || !zeros(end, sizeof d->name - (size_t)(end - d->name)))
        return bl_err_set(err, BL_EPROTO, "the node's device %u (CUDA%d) has a name that is empty, not ended in "
                          "its 64 bytes or not followed by zeros", i, (int)d->index);
    for (const char *c = d->name; c < end; c++)
        if (*c < 0x20 || *c > 0x7e)
            return bl_err_set(err, BL_EPROTO, "the node's device %u (CUDA%d) has a name with byte 0x%02x (not "
                              "printable ASCII)", i, (int)d->index, (unsigned)(uint8_t)*c);
    if (d->total_bytes > BP_NODE_MAX_MEM || d->free_bytes > d->total_bytes)
        return bl_err_set(err, BL_EPROTO, "the node's device %u (CUDA%d) has %llu bytes free of %llu", i,
                          (int)d->index, (unsigned long long)d->free_bytes, (unsigned long long)d->total_bytes);
    if (d->read_mbps > BP_NODE_MAX_MBPS)
        return bl_err_set(err, BL_EPROTO, "the node's device %u (CUDA%d) reads its memory at %u MB/s (at most %u)",
                          i, (int)d->index, d->read_mbps, BP_NODE_MAX_MBPS);
    return 0;
}

int bp_node_host_read(bp_node_host_t *out, const uint8_t *p, size_t n, bl_err_t *err)
{
    bp_node_host_t h;
    int rc = fixed_read(out, &h, sizeof h, p, n, BP_NODE_HOST_MAGIC, 0, 0, "the node's answer", err);
    if (rc)
        return rc;
    if (!word_ok(h.hostname, sizeof h.hostname))
        return bl_err_set(err, BL_EPROTO, "the node's host name is not 1-63 of A-Z a-z 0-9 _ . -");
    if (h.n_cpus < 1 || h.n_cpus > BP_NODE_MAX_CPUS)
        return bl_err_set(err, BL_EPROTO, "the node's host has %u CPUs (1..%u)", h.n_cpus, BP_NODE_MAX_CPUS);
    if (h.mem_available > BP_NODE_MAX_MEM || h.mem_total > BP_NODE_MAX_MEM ||
        (h.mem_total && h.mem_available > h.mem_total))
        return bl_err_set(err, BL_EPROTO, "the node's host has %llu bytes of memory available of %llu",
                          (unsigned long long)h.mem_available, (unsigned long long)h.mem_total);
    if (h.read_mbps_one > BP_NODE_MAX_MBPS || h.read_mbps_all > BP_NODE_MAX_MBPS)
        return bl_err_set(err, BL_EPROTO, "the node's host reads its memory at %u MB/s with one thread and %u with "
                          "all (at most %u)", h.read_mbps_one, h.read_mbps_all, BP_NODE_MAX_MBPS);
    if (h.n_devices > BP_NODE_MAX_DEVICES)
        return bl_err_set(err, BL_EPROTO, "the node's host has %u CUDA devices (at most %u)", h.n_devices,
                          BP_NODE_MAX_DEVICES);
    for (uint32_t i = 0; i < h.n_devices; i++)
        if ((rc = device_read(&h, i, err)) != 0)
            return rc;
    if (!zeros(&h.device[h.n_devices], sizeof h.device[0] * (BP_NODE_MAX_DEVICES - h.n_devices)))
        return bl_err_set(err, BL_EPROTO, "the node's answer has bytes past its %u devices", h.n_devices);
    *out = h;
    return 0;
}

int bp_node_env_read(bp_node_env_t *out, const uint8_t *p, size_t n, const char *accept, const char *version,
                     bl_err_t *err)
{
    memset(out, 0, sizeof *out);
    if (n == 0)
        return bl_err_set(err, BL_EPROTO, "an empty envelope");
    const char tag = (char)p[0];
    if (!tag || !strchr(accept, tag))
        return bl_err_set(err, BL_EPROTO, "an envelope tagged %d ('%c') where only \"%s\" are taken", p[0],
                          p[0] >= 0x20 && p[0] < 0x7f ? p[0] : '?', accept);
    int rc;
    switch (tag) {
    case BP_NODE_ENV_SETUP: rc = bp_node_setup_read(&out->u.setup, p + 1, n - 1, version, err); break;
    case BP_NODE_ENV_FILE: rc = bp_node_file_read(&out->u.file, p + 1, n - 1, err); break;
    case BP_NODE_ENV_PROBE: rc = bp_node_probe_read(&out->u.probe, p + 1, n - 1, version, err); break;
    case BP_NODE_ENV_HOST: rc = bp_node_host_read(&out->u.host, p + 1, n - 1, err); break;
    case BP_NODE_ENV_MSG: rc = bp_msg_unpack(&out->msg, p + 1, n - 1, err); break;
    case BP_NODE_ENV_DONE:
        rc = n == 1 ? 0 : bl_err_set(err, BL_EPROTO, "a done envelope carries %zu bytes", n - 1);
        break;
    default: rc = bl_err_set(err, BL_EPROTO, "an envelope tagged %d is not of the node protocol", p[0]); break;
    }
    if (rc) {
        memset(out, 0, sizeof *out); /* bp_msg_unpack left nothing to free on failure */
        return rc;
    }
    out->tag = tag;
    return 0;
}

/* The node's answer: its facts, or its refusal as a packed Error. */
static int probe_answer(const uint8_t *buf, size_t n, const char *endpoint, bp_node_host_t *out, bl_err_t *err)
{
    bl_err_t why = {0};
    bp_node_env_t env;
    if (bp_node_env_read(&env, buf, n, "HM", "", &why) != 0)
        return bl_err_set(err, why.code, "the node at %s answered a probe with what breaks the protocol: %s",
                          endpoint, why.msg);
    int rc = 0;
    if (env.tag == BP_NODE_ENV_HOST) {
        *out = env.u.host;
    } else {
        int32_t code = 0;
        int fatal = 0;
        const char *text = "";
        bp_msg_error_info(&env.msg, &code, &fatal, &text);
        rc = env.msg.type == BP_MSG_ERROR
                 ? bl_err_set(err, code, "the node at %s: %s", endpoint, text)
                 : bl_err_set(err, BL_EPROTO, "the node at %s answered a probe with a %s message", endpoint,
                              bp_msg_type_name((int)env.msg.type));
    }
    bp_msg_free(&env.msg);
    return rc;
}

int bp_node_probe(const char *endpoint, const uint8_t key[32], const char *version, uint32_t flags,
                  int timeout_ms, bp_node_host_t *out, bl_err_t *err)
{
    memset(out, 0, sizeof *out);
    /* an answer is the facts or an Error of a sentence: far below this */
    enum { CAP = 16384 };
    uint8_t *buf = malloc(CAP);
    bp_link_t *l = NULL;
    bl_err_t why = {0};
    int rc = buf ? bp_link_connect(&l, endpoint, key, CAP, NULL, &why) : BL_ENOMEM;
    if (rc == 0)
        rc = bp_link_wait_up(l, timeout_ms, &why);
    if (rc == 0) {
        bp_node_probe_t q;
        memset(&q, 0, sizeof q);
        memcpy(q.magic, BP_NODE_PROBE_MAGIC, sizeof BP_NODE_PROBE_MAGIC);
        snprintf(q.version, sizeof q.version, "%s", version);
        q.flags = flags;
        buf[0] = (uint8_t)BP_NODE_ENV_PROBE;
        memcpy(buf + 1, &q, sizeof q);
        rc = bp_link_send(l, buf, 1 + sizeof q, timeout_ms, &why);
    }
    size_t n = 0;
    if (rc == 0)
        rc = bp_link_recv(l, buf, CAP, &n, timeout_ms, &why);
    if (rc == 0) {
        rc = probe_answer(buf, n, endpoint, out, err);
        /* then the node closes the session; it is waited for, as a relay that connected
         * before the node listens again would find the old session's link taken */
        const uint8_t done = (uint8_t)BP_NODE_ENV_DONE;
        bl_err_t e2 = {0};
        if (bp_link_send(l, &done, 1, timeout_ms, &e2) == 0)
            for (int i = 0; i < 100 && bp_link_peer_up(l); i++)
                (void)!bp_link_recv(l, buf, CAP, &n, timeout_ms / 100 + 1, &e2); /* nothing more is expected */
    } else if (rc == BL_ENOMEM && !l) {
        bl_err_set(err, BL_ENOMEM, "the node at %s: out of memory for its probe", endpoint);
    } else {
        bl_err_set(err, rc, "the node at %s: %s", endpoint, why.msg);
    }
    bp_link_close(l);
    free(buf);
    if (rc)
        memset(out, 0, sizeof *out);
    return rc;
}
