/* Tests of proto/msg.c: pack/unpack round trips of every message type, the size and
 * type checks, validation that names the missing field, and truncated, flipped and
 * random bytes refused without a crash; a card link's offer and answer with their
 * handles, and the offers a peer may not make. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bloomery.pb-c.h"
#include "msg.h"
#include "rng.h"

static uint64_t g_seed;

/* Packs m into a fresh buffer, unpacks it, and returns the copy. */
static uint8_t g_buf[1 << 16];
static size_t g_len;

static void round_trip(const bp_msg_t *m, bp_msg_t *out)
{
    bl_err_t err = {0};
    assert_int_equal(bp_msg_pack(m, g_buf, sizeof g_buf, &g_len, &err), 0);
    assert_int_equal(g_len, bp_msg_packed_size(m));
    assert_int_equal(g_buf[0], m->type);
    int rc = bp_msg_unpack(out, g_buf, g_len, &err);
    if (rc)
        fail_msg("unpack: %s", err.msg);
    assert_int_equal(out->type, m->type);
}

/* A valid Hello from a worker with one CUDA device. */
static Bloomery__Device g_dev = BLOOMERY__DEVICE__INIT;
static Bloomery__Device *g_devs[1] = {&g_dev};
static Bloomery__Hello g_hello = BLOOMERY__HELLO__INIT;

static bp_msg_t make_hello(void)
{
    bloomery__device__init(&g_dev);
    g_dev.kind = BLOOMERY__DEVICE_KIND__DEVICE_KIND_CUDA;
    g_dev.name = "NVIDIA H200";
    g_dev.memory_bytes = 141ull << 30;
    g_dev.cc_major = 9;
    g_dev.cc_minor = 0;
    g_dev.cores = 132;
    g_dev.index = 0;
    bloomery__hello__init(&g_hello);
    g_hello.kind = BLOOMERY__PROCESS_KIND__PROCESS_KIND_WORKER;
    g_hello.pid = 4242;
    g_hello.version = "0.1.0";
    g_hello.host = "node1";
    g_hello.protocol = BP_PROTOCOL_VERSION;
    g_hello.n_devices = 1;
    g_hello.devices = g_devs;
    return (bp_msg_t){.type = BP_MSG_HELLO, .u.hello = &g_hello};
}

static void test_msg_hello_round_trip(void **state)
{
    (void)state;
    bp_msg_t m = make_hello(), out;
    round_trip(&m, &out);
    const Bloomery__Hello *h = out.u.hello;
    assert_int_equal(h->kind, BLOOMERY__PROCESS_KIND__PROCESS_KIND_WORKER);
    assert_int_equal(h->pid, 4242);
    assert_string_equal(h->version, "0.1.0");
    assert_string_equal(h->host, "node1");
    assert_int_equal(h->n_devices, 1);
    assert_string_equal(h->devices[0]->name, "NVIDIA H200");
    assert_int_equal(h->devices[0]->memory_bytes, 141ull << 30);
    assert_int_equal(h->devices[0]->cc_major, 9);
    assert_int_equal(h->devices[0]->cores, 132);
    bp_msg_free(&out);
}

/* A plan of 4 layers over two stages, 8 experts per layer, each placed somewhere. */
static Bloomery__Stage g_st[2];
static Bloomery__Stage *g_stp[2] = {&g_st[0], &g_st[1]};
static Bloomery__ExpertPlacement g_pl[32];
static Bloomery__ExpertPlacement *g_plp[32];
static Bloomery__Plan g_plan;

static bp_msg_t make_plan(void)
{
    bloomery__plan__init(&g_plan);
    for (int i = 0; i < 2; i++) {
        bloomery__stage__init(&g_st[i]);
        g_st[i].process = (uint32_t)i;
        g_st[i].layer_begin = (uint32_t)(2 * i);
        g_st[i].layer_end = (uint32_t)(2 * i + 2);
    }
    for (int i = 0; i < 32; i++) {
        bloomery__expert_placement__init(&g_pl[i]);
        g_pl[i].layer = (uint32_t)(i / 8);
        g_pl[i].expert = (uint32_t)(i % 8);
        g_pl[i].process = (uint32_t)(i % 3);
        g_plp[i] = &g_pl[i];
    }
    g_plan.model_path = "/models/qwen3-30b-a3b.gguf";
    g_plan.n_layers = 4;
    g_plan.n_expert = 8;
    g_plan.n_stages = 2;
    g_plan.stages = g_stp;
    g_plan.n_placements = 32;
    g_plan.placements = g_plp;
    g_plan.kv_type = BLOOMERY__KV_TYPE__KV_TYPE_F16;
    g_plan.n_ctx = 32768;
    g_plan.n_slots = 4;
    g_plan.threads = 16;
    g_plan.you = 1;
    return (bp_msg_t){.type = BP_MSG_PLAN, .u.plan = &g_plan};
}

/* bp_plan_read: the plain plan of a received message. Every expert of a layer
 * listed makes it a host layer; a layer with some listed is refused, as is an expert
 * listed twice; the KV type arrives as a bl_type_t id. */
static void test_msg_plan_read(void **state)
{
    (void)state;
    bp_msg_t m = make_plan(), out;
    g_plan.n_placements = 16; /* layers 0 and 1: all 8 experts each */
    g_st[1].gpu = 1;          /* stage 1 on CUDA device 0 */
    g_st[1].threads = 12;     /* its host's own thread counts; stage 0 the plan's */
    g_st[1].threads_batch = 24;
    g_plan.kv_type = BLOOMERY__KV_TYPE__KV_TYPE_Q8_0;
    round_trip(&m, &out);
    static bp_plan_t pl;
    bl_err_t err = {0};
    assert_int_equal(bp_plan_read(&out, &pl, &err), 0);
    assert_string_equal(pl.model_path, "/models/qwen3-30b-a3b.gguf");
    assert_int_equal(pl.n_stages, 2);
    assert_int_equal(pl.stages[0].device, -1);
    assert_int_equal(pl.stages[1].device, 0);
    assert_int_equal(pl.stages[1].layer_begin, 2);
    assert_int_equal(pl.stages[0].threads, 0);
    assert_int_equal(pl.stages[0].threads_batch, 0);
    assert_int_equal(pl.stages[1].threads, 12);
    assert_int_equal(pl.stages[1].threads_batch, 24);
    assert_int_equal(pl.host[0], 1);
    assert_int_equal(pl.host[1], 1);
    assert_int_equal(pl.host[2], 0);
    assert_int_equal(pl.kv_type, 8);
    assert_int_equal(pl.you, 1);
    bp_msg_free(&out);

    m = make_plan();
    g_plan.n_placements = 12; /* layer 1 with only 4 of its 8 */
    round_trip(&m, &out);
    assert_int_equal(bp_plan_read(&out, &pl, &err), BL_ENOTSUP);
    assert_non_null(strstr(err.msg, "layer 1"));
    bp_msg_free(&out);

    m = make_plan();
    g_plan.n_placements = 16;
    g_pl[9].expert = 0; /* layer 1, expert 0 twice */
    round_trip(&m, &out);
    assert_int_equal(bp_plan_read(&out, &pl, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "twice"));
    bp_msg_free(&out);

    bp_msg_t hello = {.type = BP_MSG_HELLO};
    assert_int_equal(bp_plan_read(&hello, &pl, &err), BL_EINVAL);
}

/* Expert tiers: a layer whose placements all name a tier's process is that tier's
 * (tier[l] its index + 1), one whose placements name any other process the
 * hosttier's; a layer split between a tier and the hosttier, a tier with a stage's
 * process or an earlier tier's, and a tier's gpu out of range are refused. */
static void test_msg_plan_read_tiers(void **state)
{
    (void)state;
    static Bloomery__ExpertTier tr[2];
    static Bloomery__ExpertTier *trp[2] = {&tr[0], &tr[1]};
    static bp_plan_t pl;
    bl_err_t err = {0};
    bp_msg_t m = make_plan(), out;
    for (int k = 0; k < 2; k++) {
        bloomery__expert_tier__init(&tr[k]);
        tr[k].process = (uint32_t)(3 + k);
        tr[k].gpu = k == 0 ? 2u : 0u; /* CUDA1, then the CPU */
    }
    g_plan.tiers = trp;
    g_plan.n_tiers = 2;
    for (int i = 0; i < 32; i++) /* layer 0 the hosttier's (process 2), 1 and 3 tier 0's, 2 tier 1's */
        g_pl[i].process = i < 8 ? 2u : i / 8 == 2 ? 4u : 3u;
    round_trip(&m, &out);
    assert_int_equal(bp_plan_read(&out, &pl, &err), 0);
    assert_int_equal(pl.n_tiers, 2);
    assert_int_equal(pl.tiers[0].process, 3);
    assert_int_equal(pl.tiers[0].device, 1);
    assert_int_equal(pl.tiers[1].device, -1);
    assert_int_equal(pl.host[0], 1);
    assert_int_equal(pl.tier[0], 0);
    assert_int_equal(pl.host[1], 0);
    assert_int_equal(pl.tier[1], 1);
    assert_int_equal(pl.tier[2], 2);
    assert_int_equal(pl.tier[3], 1);
    assert_int_equal(pl.host_process, 2);
    bp_msg_free(&out);

    m = make_plan();
    g_plan.tiers = trp;
    g_plan.n_tiers = 2;
    for (int i = 0; i < 32; i++) /* layer 1: half tier 0's, half the hosttier's */
        g_pl[i].process = i / 8 == 1 && i % 2 ? 3u : 2u;
    round_trip(&m, &out);
    assert_int_equal(bp_plan_read(&out, &pl, &err), BL_ENOTSUP);
    assert_non_null(strstr(err.msg, "layer 1"));
    bp_msg_free(&out);

    uint8_t buf[4096];
    size_t n = 0;
    const uint32_t bad[3][2] = {{1, 1}, {3, 1}, {5, 300}}; /* a stage's process, tier 0's, a gpu past 256 */
    for (int b = 0; b < 3; b++) {
        m = make_plan();
        g_plan.tiers = trp;
        g_plan.n_tiers = 2;
        tr[1].process = bad[b][0];
        tr[1].gpu = bad[b][1];
        /* the checks bp_msg_unpack runs too (bp_msg_validate) */
        assert_int_equal(bp_msg_pack(&m, buf, sizeof buf, &n, &err), BL_EINVAL);
        assert_non_null(strstr(err.msg, "Plan.tiers"));
    }
    tr[1].process = 4;
    tr[1].gpu = 0;
}

/* The residency fields: experts_vram -1 (automatic), 0 (no slots) and a size arrive
 * as sent, as does no_residency; an unset field reads as 0 and false. */
static void test_msg_plan_read_carries_residency(void **state)
{
    (void)state;
    static bp_plan_t pl;
    bl_err_t err = {0};
    const int64_t sizes[] = {-1, 0, (int64_t)5 << 30, INT64_MAX};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        bp_msg_t m = make_plan(), out;
        g_plan.n_placements = 16;
        g_plan.experts_vram = sizes[i];
        g_plan.experts_ram = sizes[i] < 0 ? 1 : sizes[i];
        g_plan.no_residency = i % 2;
        round_trip(&m, &out);
        assert_int_equal(bp_plan_read(&out, &pl, &err), 0);
        assert_true(pl.experts_vram == sizes[i]);
        assert_true(pl.experts_ram == (sizes[i] < 0 ? 1 : sizes[i]));
        assert_int_equal(pl.no_residency, (int)(i % 2));
        bp_msg_free(&out);
    }
    bp_msg_t m = make_plan(), out;
    round_trip(&m, &out);
    assert_int_equal(bp_plan_read(&out, &pl, &err), 0);
    assert_true(pl.experts_vram == 0 && pl.experts_ram == 0);
    assert_int_equal(pl.no_residency, 0);
    bp_msg_free(&out);
}

/* A field this version does not know is refused: both ends run one version, and
 * protobuf-c would pack such a field back in a form its decoder refuses (found by
 * fuzz_msg: a tag of field 0 in two bytes). */
static void test_msg_unknown_fields_are_refused(void **state)
{
    (void)state;
    bp_msg_t out;
    bl_err_t err = {0};
    const uint8_t zero_tag[] = {BP_MSG_READY, 0x80, 0x00, 0x09};
    assert_int_equal(bp_msg_unpack(&out, zero_tag, sizeof zero_tag, &err), BL_EINVAL);
    bp_msg_free(&out);
    /* a Ready (process 1) with field 99 = 1 after it */
    const uint8_t field99[] = {BP_MSG_READY, 0x08, 0x01, 0x98, 0x06, 0x01};
    assert_int_equal(bp_msg_unpack(&out, field99, sizeof field99, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "does not know"));
    bp_msg_free(&out);
    /* a plan of nested messages without one still unpacks */
    bp_msg_t m = make_plan();
    uint8_t buf[4096];
    size_t n = 0;
    assert_int_equal(bp_msg_pack(&m, buf, sizeof buf, &n, &err), 0);
    assert_int_equal(bp_msg_unpack(&out, buf, n, &err), 0);
    bp_msg_free(&out);
}

static void test_msg_plan_round_trip(void **state)
{
    (void)state;
    bp_msg_t m = make_plan(), out;
    round_trip(&m, &out);
    const Bloomery__Plan *p = out.u.plan;
    assert_string_equal(p->model_path, "/models/qwen3-30b-a3b.gguf");
    assert_int_equal(p->n_stages, 2);
    assert_int_equal(p->stages[1]->layer_begin, 2);
    assert_int_equal(p->stages[1]->layer_end, 4);
    assert_int_equal(p->n_placements, 32);
    for (int i = 0; i < 32; i++) {
        assert_int_equal(p->placements[i]->layer, i / 8);
        assert_int_equal(p->placements[i]->expert, i % 8);
        assert_int_equal(p->placements[i]->process, i % 3);
    }
    assert_int_equal(p->kv_type, BLOOMERY__KV_TYPE__KV_TYPE_F16);
    assert_int_equal(p->n_ctx, 32768);
    assert_int_equal(p->you, 1);
    bp_msg_free(&out);
}

static void test_msg_small_messages_round_trip(void **state)
{
    (void)state;
    bp_msg_t out;

    Bloomery__LoadProgress lp = BLOOMERY__LOAD_PROGRESS__INIT;
    lp.bytes_done = 5;
    lp.bytes_total = 1ull << 40;
    lp.stage = "upload";
    round_trip(&(bp_msg_t){.type = BP_MSG_LOAD_PROGRESS, .u.load_progress = &lp}, &out);
    assert_int_equal(out.u.load_progress->bytes_total, 1ull << 40);
    assert_string_equal(out.u.load_progress->stage, "upload");
    bp_msg_free(&out);

    Bloomery__Ready rd = BLOOMERY__READY__INIT;
    rd.process = 3;
    rd.kernels = "CUDA1 NVIDIA H200 (sm_90)";
    rd.n_vocab = 151936;
    rd.n_embd = 2048;
    rd.n_layer = 48;
    round_trip(&(bp_msg_t){.type = BP_MSG_READY, .u.ready = &rd}, &out);
    assert_int_equal(out.u.ready->process, 3);
    uint64_t nv, ne, nl;
    const char *kernels;
    bp_msg_ready_facts(&out, &nv, &ne, &nl, &kernels);
    assert_string_equal(kernels, "CUDA1 NVIDIA H200 (sm_90)");
    assert_int_equal(nv, 151936);
    assert_int_equal(ne, 2048);
    assert_int_equal(nl, 48);
    bp_msg_free(&out);
    /* kernels not told (an older child): "" */
    rd.kernels = NULL;
    round_trip(&(bp_msg_t){.type = BP_MSG_READY, .u.ready = &rd}, &out);
    bp_msg_ready_facts(&out, &nv, &ne, &nl, &kernels);
    assert_string_equal(kernels, "");
    bp_msg_free(&out);

    /* An all-default message packs to the type byte alone. */
    Bloomery__Shutdown sd = BLOOMERY__SHUTDOWN__INIT;
    round_trip(&(bp_msg_t){.type = BP_MSG_SHUTDOWN, .u.shutdown = &sd}, &out);
    assert_int_equal(g_len, 1);
    bp_msg_free(&out);

    Bloomery__Counter c0 = BLOOMERY__COUNTER__INIT, c1 = BLOOMERY__COUNTER__INIT;
    c0.name = "steps";
    c0.value = 100;
    c1.name = "ring_parks";
    c1.value = 7;
    Bloomery__Counter *cs[2] = {&c0, &c1};
    Bloomery__Stats st = BLOOMERY__STATS__INIT;
    st.n_counters = 2;
    st.counters = cs;
    round_trip(&(bp_msg_t){.type = BP_MSG_STATS, .u.stats = &st}, &out);
    assert_int_equal(out.u.stats->n_counters, 2);
    assert_string_equal(out.u.stats->counters[1]->name, "ring_parks");
    assert_int_equal(out.u.stats->counters[1]->value, 7);
    bp_msg_free(&out);

    Bloomery__Error er = BLOOMERY__ERROR__INIT;
    er.code = BL_EIO;
    er.message = "model.gguf: short read at offset 4096";
    er.process = 2;
    er.fatal = 1;
    round_trip(&(bp_msg_t){.type = BP_MSG_ERROR, .u.error = &er}, &out);
    assert_int_equal(out.u.error->code, BL_EIO);
    assert_string_equal(out.u.error->message, "model.gguf: short read at offset 4096");
    assert_true(out.u.error->fatal);
    bp_msg_free(&out);

    Bloomery__ExpertMove mv = BLOOMERY__EXPERT_MOVE__INIT;
    mv.layer = 10;
    mv.expert = 100;
    mv.from = 3;
    mv.to = 0;
    Bloomery__ExpertMove *mvs[1] = {&mv};
    Bloomery__MoveExperts me = BLOOMERY__MOVE_EXPERTS__INIT;
    me.epoch = 9;
    me.n_moves = 1;
    me.moves = mvs;
    round_trip(&(bp_msg_t){.type = BP_MSG_MOVE_EXPERTS, .u.move_experts = &me}, &out);
    assert_int_equal(out.u.move_experts->moves[0]->expert, 100);
    assert_int_equal(out.u.move_experts->moves[0]->from, 3);
    bp_msg_free(&out);
}

/* The message must name the field. */
static void expect_invalid(const bp_msg_t *m, int code, const char *field)
{
    bl_err_t err = {0};
    size_t n;
    assert_int_equal(bp_msg_pack(m, g_buf, sizeof g_buf, &n, &err), code);
    if (!strstr(err.msg, field))
        fail_msg("expected '%s' in: %s", field, err.msg);
}

static void test_msg_validation_names_the_field(void **state)
{
    (void)state;
    bp_msg_t m = make_hello();
    g_hello.pid = 0;
    expect_invalid(&m, BL_EINVAL, "Hello.pid");
    m = make_hello();
    g_hello.kind = 0;
    expect_invalid(&m, BL_EINVAL, "Hello.kind");
    m = make_hello();
    g_hello.version = "";
    expect_invalid(&m, BL_EINVAL, "Hello.version");
    m = make_hello();
    g_hello.protocol = 99;
    expect_invalid(&m, BL_ENOTSUP, "Hello.protocol");
    m = make_hello();
    g_dev.name = NULL;
    expect_invalid(&m, BL_EINVAL, "Hello.devices[0].name");
    m = make_hello();
    g_hello.n_devices = 0;
    expect_invalid(&m, BL_EINVAL, "Hello.devices");

    char longer[BP_MSG_MAX_KERNELS + 2];
    memset(longer, 'k', sizeof longer - 1);
    longer[sizeof longer - 1] = 0;
    Bloomery__Ready rd = BLOOMERY__READY__INIT;
    rd.kernels = longer;
    expect_invalid(&(bp_msg_t){.type = BP_MSG_READY, .u.ready = &rd}, BL_EINVAL, "Ready.kernels");
    Bloomery__LoadProgress lp = BLOOMERY__LOAD_PROGRESS__INIT;
    lp.stage = "weights";
    lp.bytes_done = 2;
    lp.bytes_total = 1;
    expect_invalid(&(bp_msg_t){.type = BP_MSG_LOAD_PROGRESS, .u.load_progress = &lp}, BL_EINVAL,
                   "LoadProgress.bytes_done");

    m = make_plan();
    g_plan.model_path = "";
    expect_invalid(&m, BL_EINVAL, "Plan.model_path");
    m = make_plan();
    g_st[1].layer_begin = 1; /* overlaps stage 0 */
    expect_invalid(&m, BL_EINVAL, "Plan.stages[1].layer_begin");
    m = make_plan();
    g_plan.n_stages = 1; /* layers 2-3 belong to nobody */
    expect_invalid(&m, BL_EINVAL, "Plan.stages");
    /* a stage's own thread counts past a worker's pool */
    static const char *const threads_field[2] = {"Plan.stages[1].threads", "Plan.stages[0].threads_batch"};
    for (int f = 0; f < 2; f++) {
        m = make_plan();
        if (f == 0)
            g_st[1].threads = 257;
        else
            g_st[0].threads_batch = 1000;
        expect_invalid(&m, BL_EINVAL, threads_field[f]);
    }
    m = make_plan();
    g_pl[5].expert = 8;
    expect_invalid(&m, BL_EINVAL, "Plan.placements[5].expert");
    m = make_plan();
    g_pl[31].layer = 4;
    expect_invalid(&m, BL_EINVAL, "Plan.placements[31].layer");
    m = make_plan();
    g_plan.kv_type = 0;
    expect_invalid(&m, BL_EINVAL, "Plan.kv_type");
    m = make_plan();
    g_plan.experts_vram = -2;
    expect_invalid(&m, BL_EINVAL, "Plan.experts_vram");
    m = make_plan();
    g_plan.experts_vram = INT64_MIN;
    expect_invalid(&m, BL_EINVAL, "Plan.experts_vram");
    m = make_plan();
    g_plan.experts_ram = -1;
    expect_invalid(&m, BL_EINVAL, "Plan.experts_ram");
    m = make_plan();
    g_plan.n_ctx = 0;
    expect_invalid(&m, BL_EINVAL, "Plan.n_ctx");
    m = make_plan();
    g_plan.n_slots = 0;
    expect_invalid(&m, BL_EINVAL, "Plan.n_slots");

    Bloomery__Error er = BLOOMERY__ERROR__INIT;
    er.code = 0;
    er.message = "x";
    expect_invalid(&(bp_msg_t){.type = BP_MSG_ERROR, .u.error = &er}, BL_EINVAL, "Error.code");

    /* A type that does not match the struct it points at. */
    m = make_hello();
    m.type = BP_MSG_PLAN;
    expect_invalid(&m, BL_EINVAL, "plan does not hold a plan struct");
    m.type = (bp_msg_type_t)42;
    expect_invalid(&m, BL_EINVAL, "unknown type 42");
}

/* Validation also runs on receive: pm (a message with a bad field) packed without
 * validation, as a peer could send it, is refused naming field, and leaves nothing
 * to free. */
static void expect_refused_on_receive(bp_msg_type_t type, const ProtobufCMessage *pm, const char *field)
{
    uint8_t buf[4096];
    buf[0] = (uint8_t)type;
    const size_t n = 1 + protobuf_c_message_pack(pm, buf + 1);
    bp_msg_t out;
    bl_err_t err = {0};
    assert_int_equal(bp_msg_unpack(&out, buf, n, &err), BL_EINVAL);
    if (!strstr(err.msg, field))
        fail_msg("expected '%s' in: %s", field, err.msg);
    assert_null(out.u.base);
    bp_msg_free(&out); /* harmless after a failure */
}

/* A CardLink offer of link 0: two buffers of 1 MiB on CUDA1, distinct handles. */
static uint8_t g_handles[2 * BP_CARD_MAX_BUFS][BP_CARD_HANDLE_BYTES];
static ProtobufCBinaryData g_cmem[BP_CARD_MAX_BUFS + 1], g_cev[BP_CARD_MAX_BUFS + 1];
static Bloomery__CardLink g_card;

static bp_msg_t make_offer(int n_bufs)
{
    bloomery__card_link__init(&g_card);
    for (int i = 0; i < 2 * BP_CARD_MAX_BUFS; i++)
        memset(g_handles[i], 0x40 + i, BP_CARD_HANDLE_BYTES);
    for (int i = 0; i <= BP_CARD_MAX_BUFS; i++) {
        g_cmem[i] = (ProtobufCBinaryData){BP_CARD_HANDLE_BYTES, g_handles[i % BP_CARD_MAX_BUFS]};
        g_cev[i] = (ProtobufCBinaryData){BP_CARD_HANDLE_BYTES, g_handles[BP_CARD_MAX_BUFS + i % BP_CARD_MAX_BUFS]};
    }
    g_card.link = 0;
    g_card.ok = 1;
    g_card.reason = "";
    g_card.device = 1;
    g_card.buf_bytes = 1 << 20;
    g_card.n_buffers = g_card.n_events = (size_t)n_bufs;
    g_card.buffers = g_cmem;
    g_card.events = g_cev;
    return (bp_msg_t){.type = BP_MSG_CARD_LINK, .u.card_link = &g_card};
}

static void test_msg_card_link_round_trip(void **state)
{
    (void)state;
    bp_msg_t m = make_offer(2), out;
    round_trip(&m, &out);
    bp_card_msg_t cm;
    bl_err_t err = {0};
    assert_int_equal(bp_card_msg_read(&out, &cm, &err), 0);
    assert_int_equal(cm.link, 0);
    assert_false(cm.answer);
    assert_true(cm.ok);
    assert_int_equal(cm.device, 1);
    assert_int_equal(cm.buf_bytes, 1 << 20);
    assert_int_equal(cm.n_bufs, 2);
    assert_memory_equal(cm.mem[1], g_handles[1], BP_CARD_HANDLE_BYTES);
    assert_memory_equal(cm.ev[0], g_handles[BP_CARD_MAX_BUFS], BP_CARD_HANDLE_BYTES);
    bp_msg_free(&out);
    /* the answers: opened, and refused with the reason */
    Bloomery__CardLink a = BLOOMERY__CARD_LINK__INIT;
    a.link = 3;
    a.answer = 1;
    a.ok = 1;
    round_trip(&(bp_msg_t){.type = BP_MSG_CARD_LINK, .u.card_link = &a}, &out);
    assert_int_equal(bp_card_msg_read(&out, &cm, &err), 0);
    assert_true(cm.answer && cm.ok);
    assert_int_equal(cm.link, 3);
    assert_int_equal(cm.n_bufs, 0);
    assert_string_equal(cm.reason, "");
    bp_msg_free(&out);
    a.ok = 0;
    a.reason = "CUDA1 cannot reach CUDA0's memory (no peer access between them)";
    round_trip(&(bp_msg_t){.type = BP_MSG_CARD_LINK, .u.card_link = &a}, &out);
    assert_int_equal(bp_card_msg_read(&out, &cm, &err), 0);
    assert_false(cm.ok);
    assert_string_equal(cm.reason, a.reason);
    bp_msg_free(&out);
    /* a plan's stage that passes its rows on card to card */
    m = make_plan();
    g_st[0].gpu = 1;
    g_st[1].gpu = 2;
    g_st[0].card_next = 1;
    round_trip(&m, &out);
    static bp_plan_t pl;
    assert_int_equal(bp_plan_read(&out, &pl, &err), 0);
    assert_true(pl.stages[0].card_next);
    assert_false(pl.stages[1].card_next);
    bp_msg_free(&out);
    assert_int_equal(bp_card_msg_read(&m, &cm, &err), BL_EINVAL); /* not a card link */
}

static void test_msg_card_link_refusals(void **state)
{
    (void)state;
    bp_msg_t m = make_offer(0);
    expect_invalid(&m, BL_EINVAL, "CardLink.buffers");
    m = make_offer(BP_CARD_MAX_BUFS + 1);
    expect_invalid(&m, BL_EINVAL, "CardLink.buffers");
    m = make_offer(2);
    g_card.n_events = 1;
    expect_invalid(&m, BL_EINVAL, "CardLink.events");
    m = make_offer(2);
    g_cmem[1].len = 63;
    expect_invalid(&m, BL_EINVAL, "CardLink.buffers[1].len");
    m = make_offer(2);
    g_cev[0].len = 65;
    expect_invalid(&m, BL_EINVAL, "CardLink.events[0].len");
    m = make_offer(2);
    g_card.buf_bytes = 0;
    expect_invalid(&m, BL_EINVAL, "CardLink.buf_bytes");
    m = make_offer(2);
    g_card.buf_bytes = (5ull << 30);
    expect_invalid(&m, BL_EINVAL, "CardLink.buf_bytes");
    m = make_offer(2);
    g_card.device = -1;
    expect_invalid(&m, BL_EINVAL, "CardLink.device");
    m = make_offer(2);
    g_card.link = BP_PLAN_MAX_STAGES - 1; /* the last stage has no next */
    expect_invalid(&m, BL_EINVAL, "CardLink.link");
    m = make_offer(2);
    g_card.ok = 0; /* a refusal says why, and carries no handles */
    g_card.reason = "no card";
    expect_invalid(&m, BL_EINVAL, "CardLink.buffers");
    m = make_offer(0);
    g_card.ok = 0;
    g_card.reason = "";
    g_card.buf_bytes = 0;
    g_card.device = 0;
    expect_invalid(&m, BL_EINVAL, "CardLink.reason");
    m = make_offer(2);
    g_card.answer = 1; /* an answer carries none either */
    expect_invalid(&m, BL_EINVAL, "CardLink.buffers");
    /* card_next only between two card stages, never on the last */
    m = make_plan();
    g_st[0].card_next = 1;
    expect_invalid(&m, BL_EINVAL, "Plan.stages[0].card_next");
    m = make_plan();
    g_st[0].gpu = 1;
    g_st[1].gpu = 1;
    g_st[1].card_next = 1;
    expect_invalid(&m, BL_EINVAL, "Plan.stages[1].card_next");
    /* and on receive: a peer's offer of a handle of 16 bytes */
    make_offer(1);
    g_cmem[0].len = 16;
    expect_refused_on_receive(BP_MSG_CARD_LINK, &g_card.base, "CardLink.buffers[0].len");
}

static void test_msg_unpack_rejects_invalid_fields_from_peer(void **state)
{
    (void)state;
    make_plan();
    g_pl[0].expert = 1000;
    expect_refused_on_receive(BP_MSG_PLAN, &g_plan.base, "Plan.placements[0].expert");
    make_plan();
    g_plan.experts_vram = -5;
    expect_refused_on_receive(BP_MSG_PLAN, &g_plan.base, "Plan.experts_vram");
}

static void test_msg_unpack_rejects_type_and_size(void **state)
{
    (void)state;
    bp_msg_t out;
    bl_err_t err = {0};
    uint8_t b[4] = {0, 0, 0, 0};
    assert_int_equal(bp_msg_unpack(&out, b, 0, &err), BL_ERANGE);
    assert_int_equal(bp_msg_unpack(&out, b, 1, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "unknown type byte 0"));
    b[0] = 200;
    assert_int_equal(bp_msg_unpack(&out, b, 1, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "unknown type byte 200"));
    assert_int_equal(bp_msg_unpack(&out, b, BP_MSG_MAX_BYTES + 1, &err), BL_ERANGE);
    /* Pack refuses a buffer too small, naming both sizes. */
    bp_msg_t m = make_plan();
    size_t n;
    assert_int_equal(bp_msg_pack(&m, g_buf, 10, &n, &err), BL_ERANGE);
    assert_non_null(strstr(err.msg, "buffer of 10"));
}

/* Every prefix of a valid encoding, and random single-byte changes, either decode to
 * a valid message or fail with a code: never a crash or a leak (ASan checks both). */
static void test_msg_truncated_and_flipped_bytes_never_crash(void **state)
{
    (void)state;
    bp_msg_t m = make_plan();
    uint8_t good[4096], bad_buf[4096];
    size_t n;
    bl_err_t err = {0};
    assert_int_equal(bp_msg_pack(&m, good, sizeof good, &n, &err), 0);
    bp_msg_t out;
    int ok = 0, refused = 0;
    for (size_t len = 0; len < n; len++) {
        int rc = bp_msg_unpack(&out, good, len, &err);
        rc == 0 ? ok++ : refused++;
        bp_msg_free(&out);
    }
    assert_true(refused > 0);
    bl_rng_t rng;
    bl_rng_seed(&rng, g_seed);
    for (int it = 0; it < 20000; it++) {
        memcpy(bad_buf, good, n);
        int flips = 1 + (int)(bl_rng_next(&rng) % 4);
        for (int f = 0; f < flips; f++)
            bad_buf[1 + bl_rng_next(&rng) % (n - 1)] = (uint8_t)bl_rng_next(&rng);
        int rc = bp_msg_unpack(&out, bad_buf, n, &err);
        rc == 0 ? ok++ : refused++;
        if (rc == 0)
            assert_int_equal(bp_msg_validate(&out, &err), 0);
        bp_msg_free(&out);
    }
    /* Pure garbage with every type byte. */
    for (int it = 0; it < 20000; it++) {
        size_t len = 1 + bl_rng_next(&rng) % 512;
        for (size_t k = 0; k < len; k++)
            bad_buf[k] = (uint8_t)bl_rng_next(&rng);
        bad_buf[0] = (uint8_t)(1 + it % BP_MSG_TYPE_MAX);
        int rc = bp_msg_unpack(&out, bad_buf, len, &err);
        rc == 0 ? ok++ : refused++;
        bp_msg_free(&out);
    }
    printf("# fuzzed unpack: %d accepted (valid), %d refused\n", ok, refused);
}

int main(void)
{
    const char *s = getenv("BLOOMERY_TEST_SEED");
    g_seed = s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    printf("# seed %" PRIu64 " (BLOOMERY_TEST_SEED replays it)\n", g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_msg_hello_round_trip),
        cmocka_unit_test(test_msg_plan_round_trip),
        cmocka_unit_test(test_msg_plan_read),
        cmocka_unit_test(test_msg_plan_read_tiers),
        cmocka_unit_test(test_msg_plan_read_carries_residency),
        cmocka_unit_test(test_msg_unknown_fields_are_refused),
        cmocka_unit_test(test_msg_small_messages_round_trip),
        cmocka_unit_test(test_msg_validation_names_the_field),
        cmocka_unit_test(test_msg_card_link_round_trip),
        cmocka_unit_test(test_msg_card_link_refusals),
        cmocka_unit_test(test_msg_unpack_rejects_invalid_fields_from_peer),
        cmocka_unit_test(test_msg_unpack_rejects_type_and_size),
        cmocka_unit_test(test_msg_truncated_and_flipped_bytes_never_crash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
