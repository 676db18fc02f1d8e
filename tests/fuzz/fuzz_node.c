/* libFuzzer target for a relay's setup as a node reads it (proto/node.c): the input is
 * the payload after the envelope byte. An accepted setup keeps what the node relies
 * on (terminated, non-empty names of the allowed bytes, 2 or 4 rings of valid
 * capacities and none past them, log settings in range, this version) and reads the
 * same from its own bytes again; a refusal says why, the same way twice.
 * Seeds: tests/fuzz/corpus/fuzz_node/. */
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bp_node_setup_t s, t;
    bl_err_t e1 = {0}, e2 = {0};
    const int rc = bp_node_setup_read(&s, data, size, VERSION, &e1);
    check(rc == bp_node_setup_read(&t, data, size, VERSION, &e2), "two reads disagree");
    if (rc != 0) {
        check(rc == BL_EPROTO || rc == BL_EINVAL, "a refusal of another kind");
        check(e1.msg[0] && strcmp(e1.msg, e2.msg) == 0, "a refusal without its reason, or said two ways");
        return 0;
    }
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
    uint8_t again[sizeof s];
    memcpy(again, &s, sizeof s);
    check(bp_node_setup_read(&t, again, sizeof again, VERSION, &e2) == 0 && memcmp(&s, &t, sizeof s) == 0,
          "an accepted setup does not read the same from its own bytes");
    return 0;
}
