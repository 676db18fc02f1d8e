/* libFuzzer target for the envelopes a node and a router read from the network
 * (proto/node.c): the input is an envelope, its tag byte then the payload. A setup
 * ('S') accepted keeps what the node relies on (terminated, non-empty names of the
 * allowed bytes, 2 or 4 rings of valid capacities and none past them, log settings in
 * range, this version); a model file ('F') accepted has a size in 1..INT64_MAX and a
 * fingerprint not all zero; a probe ('P') is of this version; a node's host facts
 * ('H') have a name of the allowed bytes, 1..BP_NODE_MAX_CPUS CPUs, no padding, and
 * memory within BP_NODE_MAX_MEM with what is available at most the total. Each
 * accepted payload reads the same from its own bytes again; a refusal says why, the
 * same way twice.
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

/* The same refusal twice, with its reason. */
static void check_refusal(int rc, int again, const bl_err_t *e1, const bl_err_t *e2)
{
    check(rc == again, "two reads disagree");
    check(rc == BL_EPROTO || rc == BL_EINVAL, "a refusal of another kind");
    check(e1->msg[0] && strcmp(e1->msg, e2->msg) == 0, "a refusal without its reason, or said two ways");
}

static void setup_one(const uint8_t *data, size_t size)
{
    bp_node_setup_t s, t;
    bl_err_t e1 = {0}, e2 = {0};
    const int rc = bp_node_setup_read(&s, data, size, VERSION, &e1);
    const int again = bp_node_setup_read(&t, data, size, VERSION, &e2);
    if (rc != 0) {
        check_refusal(rc, again, &e1, &e2);
        return;
    }
    check(again == 0, "two reads disagree");
    check(size == sizeof s, "a setup of another size accepted");
    check(memchr(s.name, 0, sizeof s.name) && s.name[0] && memchr(s.identity, 0, sizeof s.identity) &&
              s.identity[0], "an empty or unterminated name accepted");
    check(strcmp(s.version, VERSION) == 0, "another version accepted");
    check(s.n_rings == 2 || s.n_rings == 4, "a ring count accepted");
    for (int i = 0; i < 4; i++) {
        const uint64_t c = s.capacity[i];
        if ((uint32_t)i < s.n_rings)
            check(c >= BP_RING_MIN_CAPACITY && c <= BP_RING_MAX_CAPACITY && !(c & (c - 1)), "a capacity accepted");
        else
            check(c == 0, "a capacity past the rings accepted");
    }
    check(s.verbosity >= -1 && s.verbosity <= 100, "a verbosity accepted");
    uint8_t own[sizeof s];
    memcpy(own, &s, sizeof s);
    check(bp_node_setup_read(&t, own, sizeof own, VERSION, &e2) == 0 && memcmp(&s, &t, sizeof s) == 0,
          "an accepted setup does not read the same from its own bytes");
}

static void file_one(const uint8_t *data, size_t size)
{
    bp_node_file_t f, g;
    bl_err_t e1 = {0}, e2 = {0};
    const int rc = bp_node_file_read(&f, data, size, &e1);
    const int again = bp_node_file_read(&g, data, size, &e2);
    if (rc != 0) {
        check_refusal(rc, again, &e1, &e2);
        return;
    }
    check(again == 0, "two reads disagree");
    check(size == sizeof f, "a model file of another size accepted");
    check(f.size >= 1 && f.size <= (uint64_t)INT64_MAX, "a file size accepted");
    uint8_t any = 0;
    for (size_t i = 0; i < sizeof f.fingerprint; i++)
        any |= f.fingerprint[i];
    check(any != 0, "a fingerprint of zeros accepted");
    uint8_t own[sizeof f];
    memcpy(own, &f, sizeof f);
    check(bp_node_file_read(&g, own, sizeof own, &e2) == 0 && memcmp(&f, &g, sizeof f) == 0,
          "an accepted model file does not read the same from its own bytes");
}

static void probe_one(const uint8_t *data, size_t size)
{
    bp_node_probe_t q, r;
    bl_err_t e1 = {0}, e2 = {0};
    const int rc = bp_node_probe_read(&q, data, size, VERSION, &e1);
    const int again = bp_node_probe_read(&r, data, size, VERSION, &e2);
    if (rc != 0) {
        check_refusal(rc, again, &e1, &e2);
        return;
    }
    check(again == 0, "two reads disagree");
    check(size == sizeof q && strcmp(q.version, VERSION) == 0, "a probe of another size or version accepted");
    uint8_t own[sizeof q];
    memcpy(own, &q, sizeof q);
    check(bp_node_probe_read(&r, own, sizeof own, VERSION, &e2) == 0 && memcmp(&q, &r, sizeof q) == 0,
          "an accepted probe does not read the same from its own bytes");
}

static void host_one(const uint8_t *data, size_t size)
{
    bp_node_host_t h, g;
    bl_err_t e1 = {0}, e2 = {0};
    const int rc = bp_node_host_read(&h, data, size, &e1);
    const int again = bp_node_host_read(&g, data, size, &e2);
    if (rc != 0) {
        check_refusal(rc, again, &e1, &e2);
        return;
    }
    check(again == 0, "two reads disagree");
    check(size == sizeof h, "host facts of another size accepted");
    const char *end = memchr(h.hostname, 0, sizeof h.hostname);
    check(end && end > h.hostname, "an empty or unterminated host name accepted");
    for (const char *c = h.hostname; c < end; c++)
        check(*c == '_' || *c == '-' || *c == '.' || (*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'z') ||
                  (*c >= 'A' && *c <= 'Z'), "a host name byte accepted");
    check(h.n_cpus >= 1 && h.n_cpus <= BP_NODE_MAX_CPUS && h.pad == 0, "a CPU count or padding accepted");
    check(h.mem_available <= BP_NODE_MAX_MEM && h.mem_total <= BP_NODE_MAX_MEM &&
              (!h.mem_total || h.mem_available <= h.mem_total), "a memory size accepted");
    uint8_t own[sizeof h];
    memcpy(own, &h, sizeof h);
    check(bp_node_host_read(&g, own, sizeof own, &e2) == 0 && memcmp(&h, &g, sizeof h) == 0,
          "accepted host facts do not read the same from their own bytes");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (data[0] == BP_NODE_ENV_SETUP)
        setup_one(data + 1, size - 1);
    else if (data[0] == BP_NODE_ENV_FILE)
        file_one(data + 1, size - 1);
    else if (data[0] == BP_NODE_ENV_PROBE)
        probe_one(data + 1, size - 1);
    else if (data[0] == BP_NODE_ENV_HOST)
        host_one(data + 1, size - 1);
    return 0;
}
