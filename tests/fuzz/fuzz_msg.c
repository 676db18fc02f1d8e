/* libFuzzer target for the control-plane messages (proto/msg.c), the bytes a peer
 * process or a remote worker sends on the ZeroMQ channel: one framed message, then
 * what the receivers read of it. Invariants beside the sanitizers': an accepted
 * message validates, packs again to a framing that unpacks to the same type and
 * size; a Plan's plain form (bp_plan_read) has stages that cover the layers in
 * order, host layers only below n_layers, a KV type of f16, f32 or q8_0, a card
 * link only from a card stage to a next card stage, and a refusal says why; a
 * CardLink reads as an offer of 1..BP_CARD_MAX_BUFS handles or as none; the readers
 * of the other kinds give bounded values. Seeds:
 * tests/fuzz/corpus/fuzz_msg/ (a valid message of each kind). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_msg: %s\n", what);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bp_msg_t m = {0};
    bl_err_t err = {0};
    const int rc = bp_msg_unpack(&m, data, size, &err);
    check(rc == 0 || err.msg[0], "a refusal without a message");
    if (rc != 0) {
        bp_msg_free(&m);
        return 0;
    }
    check(bp_msg_validate(&m, &err) == 0, "an accepted message that does not validate");
    const size_t n = bp_msg_packed_size(&m);
    check(n > 0 && n <= BP_MSG_MAX_BYTES, "an accepted message without a packed size");
    uint8_t *buf = malloc(n);
    check(buf != NULL, "out of memory");
    size_t wrote = 0;
    check(bp_msg_pack(&m, buf, n, &wrote, &err) == 0 && wrote == n, "an accepted message does not pack again");
    bp_msg_t again = {0};
    const int rc2 = bp_msg_unpack(&again, buf, wrote, &err);
    if (rc2 != 0)
        fprintf(stderr, "fuzz_msg: the repacked message: %s\n", err.msg);
    check(rc2 == 0 && again.type == m.type, "a repacked message does not unpack");
    check(bp_msg_packed_size(&again) == n, "a repacked message changed size");
    bp_msg_free(&again);
    free(buf);

    switch (m.type) {
    case BP_MSG_PLAN: {
        static bp_plan_t p;
        const int pr = bp_plan_read(&m, &p, &err);
        check(pr == 0 || err.msg[0], "a plan refused without a message");
        if (pr == 0) {
            uint32_t next = 0;
            for (int i = 0; i < p.n_stages; i++) {
                check(p.stages[i].layer_begin == next && p.stages[i].layer_end > next, "stages out of order");
                check(p.stages[i].device >= -1 && p.stages[i].device <= 255, "a stage's device out of range");
                check(!p.stages[i].card_next || (i + 1 < p.n_stages && p.stages[i].device >= 0 &&
                                                 p.stages[i + 1].device >= 0),
                      "a card link from or to a stage off the cards");
                next = p.stages[i].layer_end;
            }
            check(next == p.n_layers, "stages that do not cover the layers");
            for (uint32_t l = p.n_layers; l < BP_PLAN_MAX_LAYERS; l++)
                check(!p.host[l], "a host layer past the model's layers");
            check(p.kv_type == 0 || p.kv_type == 1 || p.kv_type == 8, "a KV type that is not f16, f32 or q8_0");
            check(p.model_path != NULL, "a plan without its model");
        }
        break;
    }
    case BP_MSG_HELLO:
        check(bp_msg_hello_version(&m) != NULL, "a Hello without a version");
        break;
    case BP_MSG_ERROR: {
        int32_t code;
        int fatal;
        const char *text;
        bp_msg_error_info(&m, &code, &fatal, &text);
        check(text != NULL, "an Error without text");
        break;
    }
    case BP_MSG_STATS: {
        uint64_t up;
        bp_msg_counter_t cs[8];
        const int k = bp_msg_stats_read(&m, &up, cs, 8);
        check(k >= 0 && k <= 8, "more counters than room");
        for (int i = 0; i < k; i++)
            check(cs[i].name != NULL, "a counter without a name");
        break;
    }
    case BP_MSG_CARD_LINK: {
        bp_card_msg_t cm;
        check(bp_card_msg_read(&m, &cm, &err) == 0, "an accepted card link that does not read");
        check(cm.reason != NULL && (cm.ok || cm.reason[0]), "a card link refused without a reason");
        check(cm.link + 1 < BP_PLAN_MAX_STAGES, "a card link past the stages");
        if (cm.ok && !cm.answer)
            check(cm.n_bufs >= 1 && cm.n_bufs <= BP_CARD_MAX_BUFS && cm.buf_bytes > 0, "an offer without buffers");
        else
            check(cm.n_bufs == 0, "handles outside an offer");
        break;
    }
    case BP_MSG_LOAD_PROGRESS: {
        uint64_t d, t;
        const char *st;
        bp_msg_progress_info(&m, &d, &t, &st);
        check(st != NULL, "progress without a stage");
        break;
    }
    default:
        break;
    }
    bp_msg_free(&m);
    return 0;
}
