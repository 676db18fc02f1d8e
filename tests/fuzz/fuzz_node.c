/* libFuzzer target for the envelopes a node and a router read from the network
 * (proto/node.c): the input is an envelope, its tag byte then the payload. A setup
 * ('S') accepted keeps what the node relies on (terminated, non-empty names of the
 * allowed bytes, 2 or 4 rings of valid capacities and none past them, log settings in
 * range, this version); a model file ('F') accepted has a size in 1..INT64_MAX and a
 * fingerprint not all zero; a probe ('P') is of this version; a node's host facts
 * ('H') have a name of the allowed bytes, 1..BP_NODE_MAX_CPUS CPUs, memory within
 * BP_NODE_MAX_MEM with what is available at most the total, and at most
 * BP_NODE_MAX_DEVICES CUDA devices, each of its own ordinal in range, a printable name
 * ended in its field with zeros after it, free memory at most its total and no
 * padding, with zeros past the last. Each
 * accepted payload reads the same from its own bytes again; a refusal says why, the
 * same way twice. bp_node_env_read, the parser both sides use, agrees with each
 * tag's reader, hands over a control message ('M') that validates and frees it, takes
 * a done ('D') only bare, and refuses every tag it is not told to take.
 * Seeds: tests/fuzz/corpus/fuzz_node/. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "node.h"
#include "ring.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define VERSION "0.1.0"

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_node: %s\n", what);
        abort();
    }
}

// --- each payload's reader, with one signature --------------------------------------

typedef int (*read_fn)(void *out, const uint8_t *p, size_t n, bl_err_t *err);

static int read_setup(void *out, const uint8_t *p, size_t n, bl_err_t *err)
{
    return bp_node_setup_read(out, p, n, VERSION, err);
}
static int read_file(void *out, const uint8_t *p, size_t n, bl_err_t *err) { return bp_node_file_read(out, p, n, err); }
static int read_probe(void *out, const uint8_t *p, size_t n, bl_err_t *err)
{
    return bp_node_probe_read(out, p, n, VERSION, err);
}
static int read_host(void *out, const uint8_t *p, size_t n, bl_err_t *err) { return bp_node_host_read(out, p, n, err); }

static const struct {
    char tag;
    read_fn read;
    size_t size;
} k_readers[] = {
    {BP_NODE_ENV_SETUP, read_setup, sizeof(bp_node_setup_t)},
    {BP_NODE_ENV_FILE, read_file, sizeof(bp_node_file_t)},
    {BP_NODE_ENV_PROBE, read_probe, sizeof(bp_node_probe_t)},
    {BP_NODE_ENV_HOST, read_host, sizeof(bp_node_host_t)},
};

/* Reads n bytes with reader r twice into out (r's struct, as are a and b): the reads
 * agree, a refusal is a protocol or version error with its reason, said the same way
 * twice; an accepted payload is exactly the struct and reads back from its own bytes
 * as itself. 1 when accepted. */
static int read_twice(int r, const uint8_t *p, size_t n, void *out)
{
    union {
        bp_node_setup_t s;
        bp_node_file_t f;
        bp_node_probe_t q;
        bp_node_host_t h;
    } again, own;
    bl_err_t e1 = {0}, e2 = {0};
    const int rc = k_readers[r].read(out, p, n, &e1);
    check(rc == k_readers[r].read(&again, p, n, &e2), "two reads disagree");
    if (rc != 0) {
        check(rc == BL_EPROTO || rc == BL_EINVAL, "a refusal of another kind");
        check(e1.msg[0] && strcmp(e1.msg, e2.msg) == 0, "a refusal without its reason, or said two ways");
        return 0;
    }
    check(n == k_readers[r].size, "a payload of another size accepted");
    memcpy(&own, out, k_readers[r].size);
    check(k_readers[r].read(&again, (const uint8_t *)&own, k_readers[r].size, &e2) == 0 &&
              memcmp(&again, out, k_readers[r].size) == 0,
          "an accepted payload does not read the same from its own bytes");
    return 1;
}

/* A name field as the protocol allows it: ended inside the field, not empty, of these
 * bytes only. */
static int name_ok(const char *s, size_t cap)
{
    static const char allowed[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-";
    const char *end = memchr(s, 0, cap);
    return end && end > s && strspn(s, allowed) == (size_t)(end - s);
}

// --- what an accepted payload must hold -----------------------------------------------

static void setup_holds(const bp_node_setup_t *s)
{
    check(name_ok(s->name, sizeof s->name) && name_ok(s->identity, sizeof s->identity),
          "an empty, unterminated or odd name accepted");
    check(strcmp(s->version, VERSION) == 0, "another version accepted");
    check(s->n_rings == 2 || s->n_rings == 4, "a ring count accepted");
    for (int i = 0; i < 4; i++) {
        const uint64_t c = s->capacity[i];
        if ((uint32_t)i < s->n_rings)
            check(c >= BP_RING_MIN_CAPACITY && c <= BP_RING_MAX_CAPACITY && !(c & (c - 1)), "a capacity accepted");
        else
            check(c == 0, "a capacity past the rings accepted");
    }
    check(s->verbosity >= -1 && s->verbosity <= 100, "a verbosity accepted");
    static const char zero[sizeof s->hosttier_name];
    if (s->flags & BP_NODE_HOSTTIER) {
        check(s->n_rings == 4, "a hosttier without the experts rings accepted");
        check(s->hosttier_threads <= BP_NODE_MAX_HOSTTIER_THREADS, "a hosttier's threads accepted");
        check(memcmp(s->hosttier_name, zero, sizeof zero) == 0 || name_ok(s->hosttier_name, sizeof s->hosttier_name),
              "a hosttier's odd name accepted");
    } else {
        check(s->hosttier_threads == 0 && memcmp(s->hosttier_name, zero, sizeof zero) == 0,
              "hosttier settings without a hosttier accepted");
    }
}

static void file_holds(const bp_node_file_t *f)
{
    check(f->size >= 1 && f->size <= (uint64_t)INT64_MAX, "a file size accepted");
    uint8_t any = 0;
    for (size_t i = 0; i < sizeof f->fingerprint; i++)
        any |= f->fingerprint[i];
    check(any != 0, "a fingerprint of zeros accepted");
}

static void host_holds(const bp_node_host_t *h)
{
    check(name_ok(h->hostname, sizeof h->hostname), "an empty, unterminated or odd host name accepted");
    check(h->n_cpus >= 1 && h->n_cpus <= BP_NODE_MAX_CPUS, "a CPU count accepted");
    check(h->mem_available <= BP_NODE_MAX_MEM && h->mem_total <= BP_NODE_MAX_MEM &&
              (!h->mem_total || h->mem_available <= h->mem_total), "a memory size accepted");
    check(h->read_mbps_one <= BP_NODE_MAX_MBPS && h->read_mbps_all <= BP_NODE_MAX_MBPS, "a read rate accepted");
    check(h->n_devices <= BP_NODE_MAX_DEVICES, "a device count accepted");
    for (uint32_t i = 0; i < BP_NODE_MAX_DEVICES; i++) {
        const bp_node_device_t *d = &h->device[i];
        if (i >= h->n_devices) {
            static const bp_node_device_t zero;
            check(memcmp(d, &zero, sizeof zero) == 0, "a device past the count accepted");
            continue;
        }
        check(d->index >= 0 && d->index <= BP_NODE_MAX_ORDINAL && d->read_mbps <= BP_NODE_MAX_MBPS,
              "an ordinal or a card's read rate accepted");
        for (uint32_t k = 0; k < i; k++)
            check(h->device[k].index != d->index, "one ordinal twice accepted");
        const char *end = memchr(d->name, 0, sizeof d->name);
        check(end && end > d->name, "an empty or unterminated device name accepted");
        for (const char *c = d->name; c < d->name + sizeof d->name; c++)
            check(c < end ? *c >= 0x20 && *c <= 0x7e : *c == 0, "a device name of other bytes accepted");
        check(d->total_bytes <= BP_NODE_MAX_MEM && d->free_bytes <= d->total_bytes, "a card's memory accepted");
    }
}

/* The envelope parser against the readers it calls. */
static void env_one(const uint8_t *data, size_t size)
{
    bp_node_env_t env, none;
    bl_err_t e1 = {0}, e2 = {0};
    const int rc = bp_node_env_read(&env, data, size, "SFPHMD", VERSION, &e1);
    check(bp_node_env_read(&none, data, size, "", VERSION, &e2) == BL_EPROTO, "a tag taken that was not asked for");
    if (rc != 0) {
        check(rc < 0 && e1.msg[0], "a refusal without its code or reason");
        check(env.tag == 0 && env.msg.u.base == NULL, "a refusal that left something behind");
        return;
    }
    check(size >= 1 && env.tag == (char)data[0], "the tag read is not the envelope's");
    if (env.tag == BP_NODE_ENV_MSG) {
        check(env.msg.u.base != NULL && bp_msg_validate(&env.msg, &e2) == 0, "a control message that does not "
              "validate");
        bp_msg_free(&env.msg);
        return;
    }
    if (env.tag == BP_NODE_ENV_DONE) {
        check(size == 1, "a done envelope with a payload accepted");
        return;
    }
    int found = 0;
    for (size_t r = 0; r < sizeof k_readers / sizeof k_readers[0]; r++) {
        if (k_readers[r].tag != env.tag)
            continue;
        bp_node_env_t one;
        check(k_readers[r].read(&one.u, data + 1, size - 1, &e2) == 0 &&
                  memcmp(&one.u, &env.u, k_readers[r].size) == 0, "an envelope read two ways");
        found = 1;
    }
    check(found, "a tag outside the protocol accepted");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    env_one(data, size);
    if (size == 0)
        return 0;
    bp_node_env_t env;
    for (int r = 0; r < (int)(sizeof k_readers / sizeof k_readers[0]); r++) {
        if (k_readers[r].tag != (char)data[0] || !read_twice(r, data + 1, size - 1, &env.u))
            continue;
        if (data[0] == BP_NODE_ENV_SETUP)
            setup_holds(&env.u.setup);
        else if (data[0] == BP_NODE_ENV_FILE)
            file_holds(&env.u.file);
        else if (data[0] == BP_NODE_ENV_PROBE)
            check(strcmp(env.u.probe.version, VERSION) == 0, "a probe of another version accepted");
        else
            host_holds(&env.u.host);
    }
    return 0;
}
