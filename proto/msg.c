/* Framing and validation of the control messages: see msg.h. The only file outside
 * the generated code that calls protobuf-c. */
#include "msg.h"

#include "bloomery.pb-c.h"
#include "quant.h"

#include <stdlib.h>
#include <string.h>

/* Indexed by bp_msg_type_t. */
static const struct {
    const char *name;
    const ProtobufCMessageDescriptor *desc;
} g_types[] = {
    [BP_MSG_HELLO] = {"hello", &bloomery__hello__descriptor},
    [BP_MSG_PLAN] = {"plan", &bloomery__plan__descriptor},
    [BP_MSG_LOAD_PROGRESS] = {"load_progress", &bloomery__load_progress__descriptor},
    [BP_MSG_READY] = {"ready", &bloomery__ready__descriptor},
    [BP_MSG_STATS] = {"stats", &bloomery__stats__descriptor},
    [BP_MSG_ERROR] = {"error", &bloomery__error__descriptor},
    [BP_MSG_SHUTDOWN] = {"shutdown", &bloomery__shutdown__descriptor},
    [BP_MSG_MOVE_EXPERTS] = {"move_experts", &bloomery__move_experts__descriptor},
    [BP_MSG_CARD_LINK] = {"card_link", &bloomery__card_link__descriptor},
};

/* Limits that no sane plan reaches; they bound the loops below and what a peer can
 * make the receiver iterate over. */
#define MAX_LAYERS BP_PLAN_MAX_LAYERS
#define MAX_EXPERTS 65536u
#define MAX_CTX (1u << 24)
#define MAX_SLOTS 4096u
/* A card buffer holds n_batch rows of n_embd floats: 65536 x 16384 x 4 bytes at most. */
#define MAX_CARD_BUF_BYTES ((uint64_t)4 << 30)
#define MAX_REASON 1024u

static int known_type(int type)
{
    return type >= 1 && type <= BP_MSG_TYPE_MAX;
}

const char *bp_msg_type_name(int type)
{
    return known_type(type) ? g_types[type].name : "unknown";
}

static int empty(const char *s)
{
    return s == NULL || s[0] == '\0';
}

static int bad(bl_err_t *err, const char *field, const char *why)
{
    return bl_err_set(err, BL_EINVAL, "control message: field %s %s", field, why);
}

static int bad_at(bl_err_t *err, const char *field, size_t i, const char *sub, const char *why)
{
    return bl_err_set(err, BL_EINVAL, "control message: field %s[%zu].%s %s", field, i, sub,
                      why);
}

/* ------------------------------------------------------------ per-type checks */

static int validate_hello(const Bloomery__Hello *h, bl_err_t *err)
{
    if (h->kind < BLOOMERY__PROCESS_KIND__PROCESS_KIND_ROUTER ||
        h->kind > BLOOMERY__PROCESS_KIND__PROCESS_KIND_HOSTTIER)
        return bad(err, "Hello.kind", "is missing or not a process kind");
    if (h->pid == 0)
        return bad(err, "Hello.pid", "is missing");
    if (empty(h->version))
        return bad(err, "Hello.version", "is missing");
    if (h->protocol == 0)
        return bad(err, "Hello.protocol", "is missing");
    if (h->protocol != BP_PROTOCOL_VERSION)
        return bl_err_set(err, BL_ENOTSUP,
                          "control message: field Hello.protocol is %u, this build speaks %u",
                          h->protocol, BP_PROTOCOL_VERSION);
    if (h->n_devices > 0 && h->devices == NULL)
        return bad(err, "Hello.devices", "has a count but no array");
    for (size_t i = 0; i < h->n_devices; i++) {
        const Bloomery__Device *d = h->devices[i];
        if (d == NULL)
            return bad_at(err, "Hello.devices", i, "", "is NULL");
        if (d->kind != BLOOMERY__DEVICE_KIND__DEVICE_KIND_CPU &&
            d->kind != BLOOMERY__DEVICE_KIND__DEVICE_KIND_CUDA)
            return bad_at(err, "Hello.devices", i, "kind", "is missing or not a device kind");
        if (empty(d->name))
            return bad_at(err, "Hello.devices", i, "name", "is missing");
        if (d->kind == BLOOMERY__DEVICE_KIND__DEVICE_KIND_CUDA &&
            (d->cc_major == 0 || d->index < 0))
            return bad_at(err, "Hello.devices", i, "cc_major/index", "is missing for CUDA");
    }
    if (h->kind == BLOOMERY__PROCESS_KIND__PROCESS_KIND_WORKER && h->n_devices == 0)
        return bad(err, "Hello.devices", "is empty for a worker");
    return 0;
}

static int validate_plan(const Bloomery__Plan *p, bl_err_t *err)
{
    if (empty(p->model_path))
        return bad(err, "Plan.model_path", "is missing");
    if (p->n_layers == 0 || p->n_layers > MAX_LAYERS)
        return bad(err, "Plan.n_layers", "is missing or above 4096");
    if (p->n_expert > MAX_EXPERTS)
        return bad(err, "Plan.n_expert", "is above 65536");
    if (p->n_stages == 0 || p->stages == NULL)
        return bad(err, "Plan.stages", "is empty");
    /* Stages tile [0, n_layers) in order: each begins where the previous ended. */
    uint32_t next = 0;
    for (size_t i = 0; i < p->n_stages; i++) {
        const Bloomery__Stage *s = p->stages[i];
        if (s == NULL)
            return bad_at(err, "Plan.stages", i, "", "is NULL");
        if (s->layer_begin != next)
            return bad_at(err, "Plan.stages", i, "layer_begin",
                          "does not continue the previous stage");
        if (s->layer_end <= s->layer_begin || s->layer_end > p->n_layers)
            return bad_at(err, "Plan.stages", i, "layer_end", "is not in (layer_begin, n_layers]");
        if (s->gpu > 256)
            return bad_at(err, "Plan.stages", i, "gpu", "is not 0 (CPU) or 1 + a CUDA ordinal 0..255");
        if (s->card_next && (i + 1 >= p->n_stages || s->gpu == 0 || !p->stages[i + 1] || p->stages[i + 1]->gpu == 0))
            return bad_at(err, "Plan.stages", i, "card_next", "is set where this stage or the next is not on a card");
        if (s->threads > BP_PLAN_MAX_THREADS)
            return bad_at(err, "Plan.stages", i, "threads", "is above 256");
        if (s->threads_batch > BP_PLAN_MAX_THREADS)
            return bad_at(err, "Plan.stages", i, "threads_batch", "is above 256");
        next = s->layer_end;
    }
    if (next != p->n_layers)
        return bad(err, "Plan.stages", "do not cover every layer");
    if (p->n_placements > 0 && p->placements == NULL)
        return bad(err, "Plan.placements", "has a count but no array");
    for (size_t i = 0; i < p->n_placements; i++) {
        const Bloomery__ExpertPlacement *e = p->placements[i];
        if (e == NULL)
            return bad_at(err, "Plan.placements", i, "", "is NULL");
        if (e->layer >= p->n_layers)
            return bad_at(err, "Plan.placements", i, "layer", "is not below n_layers");
        if (e->expert >= p->n_expert)
            return bad_at(err, "Plan.placements", i, "expert", "is not below n_expert");
    }
    if (p->n_tiers > BP_PLAN_MAX_TIERS || (p->n_tiers > 0 && p->tiers == NULL))
        return bad(err, "Plan.tiers", "has more than 16 entries, or a count but no array");
    for (size_t i = 0; i < p->n_tiers; i++) {
        if (p->tiers[i] == NULL)
            return bad_at(err, "Plan.tiers", i, "", "is NULL");
        if (p->tiers[i]->gpu > 256)
            return bad_at(err, "Plan.tiers", i, "gpu", "is not 0 (CPU) or 1 + a CUDA ordinal 0..255");
        for (size_t j = 0; j < p->n_stages; j++)
            if (p->stages[j]->process == p->tiers[i]->process)
                return bad_at(err, "Plan.tiers", i, "process", "is a stage's");
        for (size_t j = 0; j < i; j++)
            if (p->tiers[j]->process == p->tiers[i]->process)
                return bad_at(err, "Plan.tiers", i, "process", "is an earlier tier's");
    }
    if (p->kv_type < BLOOMERY__KV_TYPE__KV_TYPE_F16 || p->kv_type > BLOOMERY__KV_TYPE__KV_TYPE_Q4_0)
        return bad(err, "Plan.kv_type", "is missing or not a KV cache type");
    if (p->n_ctx == 0 || p->n_ctx > MAX_CTX)
        return bad(err, "Plan.n_ctx", "is missing or above 2^24");
    if (p->n_slots == 0 || p->n_slots > MAX_SLOTS)
        return bad(err, "Plan.n_slots", "is missing or above 4096");
    if (p->experts_vram < -1)
        return bad(err, "Plan.experts_vram", "is below -1 (automatic)");
    if (p->experts_ram < 0)
        return bad(err, "Plan.experts_ram", "is negative");
    if (p->kv_pool > MAX_CTX)
        return bad(err, "Plan.kv_pool", "is above 2^24");
    if (p->slot_dir && strlen(p->slot_dir) > 4000)
        return bad(err, "Plan.slot_dir", "is longer than 4000 bytes");
    if (p->cache_dir && strlen(p->cache_dir) > 4000)
        return bad(err, "Plan.cache_dir", "is longer than 4000 bytes");
    return 0;
}

static int validate_load_progress(const Bloomery__LoadProgress *l, bl_err_t *err)
{
    if (l->bytes_done > l->bytes_total)
        return bad(err, "LoadProgress.bytes_done", "exceeds bytes_total");
    if (empty(l->stage))
        return bad(err, "LoadProgress.stage", "is missing");
    return 0;
}

static int validate_ready(const Bloomery__Ready *r, bl_err_t *err)
{
    if (r->kernels && strlen(r->kernels) > BP_MSG_MAX_KERNELS)
        return bad(err, "Ready.kernels", "is longer than 128 bytes");
    return 0;
}

static int validate_stats(const Bloomery__Stats *s, bl_err_t *err)
{
    if (s->n_counters > 0 && s->counters == NULL)
        return bad(err, "Stats.counters", "has a count but no array");
    for (size_t i = 0; i < s->n_counters; i++) {
        if (s->counters[i] == NULL)
            return bad_at(err, "Stats.counters", i, "", "is NULL");
        if (empty(s->counters[i]->name))
            return bad_at(err, "Stats.counters", i, "name", "is missing");
    }
    return 0;
}

static int validate_error(const Bloomery__Error *e, bl_err_t *err)
{
    if (e->code >= 0)
        return bad(err, "Error.code", "is missing or not negative");
    if (empty(e->message))
        return bad(err, "Error.message", "is missing");
    return 0;
}

static int validate_move_experts(const Bloomery__MoveExperts *m, bl_err_t *err)
{
    if (m->n_moves == 0 || m->moves == NULL)
        return bad(err, "MoveExperts.moves", "is empty");
    for (size_t i = 0; i < m->n_moves; i++) {
        const Bloomery__ExpertMove *e = m->moves[i];
        if (e == NULL)
            return bad_at(err, "MoveExperts.moves", i, "", "is NULL");
        if (e->layer >= MAX_LAYERS)
            return bad_at(err, "MoveExperts.moves", i, "layer", "is above 4096");
        if (e->expert >= MAX_EXPERTS)
            return bad_at(err, "MoveExperts.moves", i, "expert", "is above 65536");
        if (e->from == e->to)
            return bad_at(err, "MoveExperts.moves", i, "to", "equals from");
    }
    return 0;
}

static int validate_card_link(const Bloomery__CardLink *c, bl_err_t *err)
{
    if (c->link + 1 >= BP_PLAN_MAX_STAGES)
        return bad(err, "CardLink.link", "is not a stage with a next one");
    if (c->reason && strlen(c->reason) > MAX_REASON)
        return bad(err, "CardLink.reason", "is longer than 1024 bytes");
    if (!c->ok && empty(c->reason))
        return bad(err, "CardLink.reason", "is missing where ok is false");
    if (c->n_buffers > 0 && c->buffers == NULL)
        return bad(err, "CardLink.buffers", "has a count but no array");
    if (c->n_events > 0 && c->events == NULL)
        return bad(err, "CardLink.events", "has a count but no array");
    if (c->answer || !c->ok) {
        /* only an offer that worked carries handles */
        if (c->n_buffers || c->n_events || c->buf_bytes || c->device)
            return bad(err, "CardLink.buffers", "are given where no offer is made");
        return 0;
    }
    if (c->device < 0 || c->device > 255)
        return bad(err, "CardLink.device", "is not a CUDA ordinal 0..255");
    if (c->buf_bytes == 0 || c->buf_bytes > MAX_CARD_BUF_BYTES)
        return bad(err, "CardLink.buf_bytes", "is missing or above 4 GiB");
    if (c->n_buffers < 1 || c->n_buffers > BP_CARD_MAX_BUFS)
        return bad(err, "CardLink.buffers", "is not 1..4 handles");
    if (c->n_events != c->n_buffers)
        return bad(err, "CardLink.events", "are not one per buffer");
    for (size_t i = 0; i < c->n_buffers; i++) {
        if (c->buffers[i].len != BP_CARD_HANDLE_BYTES || !c->buffers[i].data)
            return bad_at(err, "CardLink.buffers", i, "len", "is not 64 bytes");
        if (c->events[i].len != BP_CARD_HANDLE_BYTES || !c->events[i].data)
            return bad_at(err, "CardLink.events", i, "len", "is not 64 bytes");
    }
    return 0;
}

int bp_msg_validate(const bp_msg_t *m, bl_err_t *err)
{
    if (!known_type((int)m->type))
        return bl_err_set(err, BL_EINVAL, "control message: unknown type %d", (int)m->type);
    if (m->u.base == NULL || m->u.base->descriptor != g_types[m->type].desc)
        return bl_err_set(err, BL_EINVAL, "control message: %s does not hold a %s struct",
                          g_types[m->type].name, g_types[m->type].name);
    switch (m->type) {
    case BP_MSG_HELLO: return validate_hello(m->u.hello, err);
    case BP_MSG_PLAN: return validate_plan(m->u.plan, err);
    case BP_MSG_LOAD_PROGRESS: return validate_load_progress(m->u.load_progress, err);
    case BP_MSG_STATS: return validate_stats(m->u.stats, err);
    case BP_MSG_ERROR: return validate_error(m->u.error, err);
    case BP_MSG_MOVE_EXPERTS: return validate_move_experts(m->u.move_experts, err);
    case BP_MSG_CARD_LINK: return validate_card_link(m->u.card_link, err);
    case BP_MSG_READY: return validate_ready(m->u.ready, err);
    case BP_MSG_SHUTDOWN:
        return 0;
    }
    return 0;
}

/* ------------------------------------------------------------ pack and unpack */

size_t bp_msg_packed_size(const bp_msg_t *m)
{
    if (!known_type((int)m->type) || m->u.base == NULL)
        return 0;
    return 1 + protobuf_c_message_get_packed_size(m->u.base);
}

int bp_msg_pack(const bp_msg_t *m, uint8_t *buf, size_t cap, size_t *nbytes, bl_err_t *err)
{
    *nbytes = 0;
    int rc = bp_msg_validate(m, err);
    if (rc)
        return rc;
    size_t n = bp_msg_packed_size(m);
    if (n > BP_MSG_MAX_BYTES)
        return bl_err_set(err, BL_ERANGE, "control message: %s of %zu bytes exceeds %zu",
                          g_types[m->type].name, n, BP_MSG_MAX_BYTES);
    if (n > cap)
        return bl_err_set(err, BL_ERANGE, "control message: %s of %zu bytes, buffer of %zu",
                          g_types[m->type].name, n, cap);
    buf[0] = (uint8_t)m->type;
    size_t body = protobuf_c_message_pack(m->u.base, buf + 1);
    if (body + 1 != n) /* our invariant: the size we asked for is the size written */
        return bl_err_set(err, BL_EINVAL, "control message: %s packed to %zu bytes, not %zu",
                          g_types[m->type].name, body + 1, n);
    *nbytes = n;
    return 0;
}

/* A field this side does not know, anywhere in m: both ends run the same version
 * (Hello says so), so such a field is garbage, and protobuf-c would pack it back in
 * a form its own decoder refuses. */
static int has_unknown(const ProtobufCMessage *m, int depth)
{
    if (!m || depth > 8)
        return m != NULL;
    if (m->n_unknown_fields)
        return 1;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        if (f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        const uint8_t *base = (const uint8_t *)m;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            const size_t n = *(const size_t *)(base + f->quantifier_offset);
            ProtobufCMessage *const *v = *(ProtobufCMessage *const *const *)(base + f->offset);
            for (size_t j = 0; j < n; j++)
                if (has_unknown(v[j], depth + 1))
                    return 1;
        } else if (has_unknown(*(ProtobufCMessage *const *)(base + f->offset), depth + 1)) {
            return 1;
        }
    }
    return 0;
}

int bp_msg_unpack(bp_msg_t *out, const uint8_t *buf, size_t nbytes, bl_err_t *err)
{
    int rc;
    memset(out, 0, sizeof *out);
    if (nbytes == 0)
        return bl_err_set(err, BL_ERANGE, "control message: empty");
    if (nbytes > BP_MSG_MAX_BYTES)
        return bl_err_set(err, BL_ERANGE, "control message: %zu bytes exceeds %zu", nbytes,
                          BP_MSG_MAX_BYTES);
    int type = buf[0];
    if (!known_type(type))
        return bl_err_set(err, BL_EINVAL, "control message: unknown type byte %d", type);
    /* protobuf-c bounds every length and count by the input, so garbage fails here. */
    ProtobufCMessage *pm = protobuf_c_message_unpack(g_types[type].desc, NULL, nbytes - 1, buf + 1);
    if (pm == NULL)
        return bl_err_set(err, BL_EINVAL, "control message: %s of %zu bytes does not decode",
                          g_types[type].name, nbytes);
    out->type = (bp_msg_type_t)type;
    out->u.base = pm;
    out->_owned = 1;
    if (has_unknown(pm, 0)) {
        rc = bl_err_set(err, BL_EINVAL, "control message: %s carries a field this version does not know",
                        g_types[type].name);
        goto fail;
    }
    rc = bp_msg_validate(out, err);
    if (rc)
        goto fail;
    return 0;
fail:
    bp_msg_free(out);
    return rc;
}

void bp_msg_free(bp_msg_t *m)
{
    if (m->_owned && m->u.base)
        protobuf_c_message_free_unpacked(m->u.base, NULL);
    memset(m, 0, sizeof *m);
}

/* Plan.tiers' index of process, or -1: the hosttier's. */
static int tier_of(const Bloomery__Plan *p, uint32_t process)
{
    for (size_t k = 0; k < p->n_tiers; k++)
        if (p->tiers[k]->process == process)
            return (int)k;
    return -1;
}

/* The placements as whole layers: host[l] 1 where the hosttier computes layer l's
 * experts, tier[l] k + 1 where tier k does. */
static int placed_layers(const Bloomery__Plan *p, uint8_t *host, uint8_t *tier, bl_err_t *err)
{
    const size_t nl = p->n_layers, ne = p->n_expert;
    memset(host, 0, nl);
    memset(tier, 0, nl);
    if (p->n_placements == 0)
        return 0;
    if (ne == 0)
        return bl_err_set(err, BL_EINVAL, "Plan.placements: a model without routed experts");
    uint8_t *seen = calloc(nl * ne, 1);
    uint32_t *count = calloc(nl, sizeof *count);
    int16_t *who = malloc(nl * sizeof *who); /* the layer's first placement's tier, -1 the hosttier */
    int rc = seen && count && who ? 0 : bl_err_set(err, BL_ENOMEM, "out of memory for the plan's placements");
    for (size_t i = 0; rc == 0 && i < p->n_placements; i++) {
        const Bloomery__ExpertPlacement *e = p->placements[i];
        uint8_t *s = &seen[(size_t)e->layer * ne + e->expert];
        const int k = tier_of(p, e->process);
        if (*s)
            rc = bl_err_set(err, BL_EINVAL, "Plan.placements[%zu]: expert %u of layer %u is listed twice", i,
                            e->expert, e->layer);
        else if (count[e->layer] && who[e->layer] != k)
            rc = bl_err_set(err, BL_ENOTSUP, "Plan.placements[%zu]: expert %u of layer %u names process %u, "
                            "another than the layer's other experts; a layer's experts are placed together", i,
                            e->expert, e->layer, e->process);
        *s = 1;
        who[e->layer] = (int16_t)k;
        count[e->layer]++;
    }
    for (size_t l = 0; rc == 0 && l < nl; l++) {
        if (count[l] != 0 && count[l] != ne)
            rc = bl_err_set(err, BL_ENOTSUP, "Plan.placements: %u of the %zu routed experts of layer %zu are "
                            "placed apart from their stage; a layer's experts are placed together", count[l], ne, l);
        else if (count[l] == ne && who[l] < 0)
            host[l] = 1;
        else if (count[l] == ne)
            tier[l] = (uint8_t)(who[l] + 1);
    }
    free(seen);
    free(count);
    free(who);
    return rc;
}

/* The KV cache types a plan carries: bl_type_t ids and KvType. */
static const struct {
    uint32_t bl;
    Bloomery__KvType proto;
} kv_types[] = {
    {BL_TYPE_F16, BLOOMERY__KV_TYPE__KV_TYPE_F16},
    {BL_TYPE_F32, BLOOMERY__KV_TYPE__KV_TYPE_F32},
    {BL_TYPE_Q8_0, BLOOMERY__KV_TYPE__KV_TYPE_Q8_0},
};

int bp_kv_type_proto(uint32_t bl_type)
{
    for (size_t i = 0; i < sizeof kv_types / sizeof kv_types[0]; i++)
        if (kv_types[i].bl == bl_type)
            return (int)kv_types[i].proto;
    return -1;
}

int bp_plan_read(const bp_msg_t *m, bp_plan_t *out, bl_err_t *err)
{
    memset(out, 0, sizeof *out);
    if (m->type != BP_MSG_PLAN || !m->u.plan)
        return bl_err_set(err, BL_EINVAL, "not a plan");
    const Bloomery__Plan *p = m->u.plan;
    if (p->n_layers > BP_PLAN_MAX_LAYERS || p->n_stages > BP_PLAN_MAX_STAGES)
        return bl_err_set(err, BL_EINVAL, "plan: %u layers, %zu stages (at most %u, %d)", p->n_layers, p->n_stages,
                          BP_PLAN_MAX_LAYERS, BP_PLAN_MAX_STAGES);
    out->model_path = p->model_path;
    out->n_layers = p->n_layers;
    out->n_expert = p->n_expert;
    out->n_stages = (int)p->n_stages;
    for (size_t i = 0; i < p->n_stages; i++) {
        const Bloomery__Stage *st = p->stages[i];
        /* Stage.gpu: 0 the CPU, N CUDA device N - 1 */
        if (st->gpu > 256)
            return bl_err_set(err, BL_EINVAL, "plan: stage %zu's gpu %u is out of range", i, st->gpu);
        out->stages[i] = (bp_plan_stage_t){.process = st->process, .layer_begin = st->layer_begin,
                                           .layer_end = st->layer_end, .device = st->gpu ? (int)st->gpu - 1 : -1,
                                           .card_next = st->card_next,
                                           .threads = st->threads, .threads_batch = st->threads_batch};
    }
    int rc = placed_layers(p, out->host, out->tier, err);
    if (rc)
        return rc;
    out->n_tiers = (int)p->n_tiers;
    for (size_t k = 0; k < p->n_tiers; k++)
        out->tiers[k] = (bp_plan_tier_t){.process = p->tiers[k]->process,
                                         .device = p->tiers[k]->gpu ? (int)p->tiers[k]->gpu - 1 : -1};
    for (size_t i = 0; i < p->n_placements; i++)
        if (tier_of(p, p->placements[i]->process) < 0) {
            out->host_process = p->placements[i]->process;
            break;
        }
    out->kv_type = UINT32_MAX;
    for (size_t i = 0; i < sizeof kv_types / sizeof kv_types[0]; i++)
        if ((int)kv_types[i].proto == (int)p->kv_type)
            out->kv_type = kv_types[i].bl;
    if (out->kv_type == UINT32_MAX)
        return bl_err_set(err, BL_ENOTSUP, "plan: KV cache type %d is not f16, f32 or q8_0", (int)p->kv_type);
    out->n_ctx = p->n_ctx;
    out->n_slots = p->n_slots;
    out->threads = p->threads;
    out->threads_batch = p->threads_batch;
    out->n_batch = p->n_batch;
    out->you = p->you;
    out->flash_attn = p->flash_attn;
    out->no_mmap = p->no_mmap;
    out->mlock = p->mlock;
    out->no_op_offload = p->no_op_offload;
    out->poll = p->poll;
    out->cpu_strict = p->cpu_strict;
    out->experts_vram = p->experts_vram;
    out->no_residency = p->no_residency;
    out->experts_ram = p->experts_ram;
    out->kv_pool = p->kv_pool;
    out->slot_dir = p->slot_dir ? p->slot_dir : "";
    out->cache_dir = p->cache_dir ? p->cache_dir : "";
    out->mtp = p->mtp;
    return 0;
}

int bp_card_msg_read(const bp_msg_t *m, bp_card_msg_t *out, bl_err_t *err)
{
    memset(out, 0, sizeof *out);
    out->reason = "";
    if (m->type != BP_MSG_CARD_LINK || !m->u.card_link)
        return bl_err_set(err, BL_EINVAL, "not a card link message");
    const Bloomery__CardLink *c = m->u.card_link;
    int rc = validate_card_link(c, err); /* unpack validated it; a caller-built one may not be */
    if (rc)
        return rc;
    out->link = c->link;
    out->answer = c->answer;
    out->ok = c->ok;
    out->reason = c->reason ? c->reason : "";
    out->device = c->device;
    out->buf_bytes = c->buf_bytes;
    out->n_bufs = (int)c->n_buffers;
    for (size_t i = 0; i < c->n_buffers; i++) {
        memcpy(out->mem[i], c->buffers[i].data, BP_CARD_HANDLE_BYTES);
        memcpy(out->ev[i], c->events[i].data, BP_CARD_HANDLE_BYTES);
    }
    return 0;
}

const char *bp_msg_hello_version(const bp_msg_t *m)
{
    return m->type == BP_MSG_HELLO && m->u.hello && m->u.hello->version ? m->u.hello->version : "";
}

void bp_msg_ready_facts(const bp_msg_t *m, uint64_t *n_vocab, uint64_t *n_embd, uint64_t *n_layer,
                        const char **kernels)
{
    const int ok = m->type == BP_MSG_READY && m->u.ready;
    *n_vocab = ok ? m->u.ready->n_vocab : 0;
    *n_embd = ok ? m->u.ready->n_embd : 0;
    *n_layer = ok ? m->u.ready->n_layer : 0;
    *kernels = ok && m->u.ready->kernels ? m->u.ready->kernels : "";
}

int bp_msg_fatal(uint32_t process, int code, const char *text, bp_msg_send_fn send, void *ud)
{
    Bloomery__Error er;
    bloomery__error__init(&er);
    er.code = code < 0 ? code : BL_EIO; /* validate_error refuses a code that is not negative */
    er.message = (char *)text;          /* protobuf-c's fields are not const; packing only reads it */
    er.process = process;
    er.fatal = 1;
    const bp_msg_t m = {.type = BP_MSG_ERROR, .u.error = &er};
    return send(ud, &m);
}

void bp_msg_error_info(const bp_msg_t *m, int32_t *code, int *fatal, const char **message)
{
    const int ok = m->type == BP_MSG_ERROR && m->u.error;
    *code = ok ? m->u.error->code : 0;
    *fatal = ok ? m->u.error->fatal : 0;
    *message = ok && m->u.error->message ? m->u.error->message : "";
}

int bp_msg_stats_read(const bp_msg_t *m, uint64_t *uptime_us, bp_msg_counter_t *out, int cap)
{
    *uptime_us = 0;
    if (m->type != BP_MSG_STATS || !m->u.stats)
        return 0;
    const Bloomery__Stats *s = m->u.stats;
    *uptime_us = s->uptime_us;
    int n = 0;
    for (size_t i = 0; i < s->n_counters && n < cap; i++)
        out[n++] = (bp_msg_counter_t){s->counters[i]->name ? s->counters[i]->name : "", s->counters[i]->value};
    return n;
}

void bp_msg_progress_info(const bp_msg_t *m, uint64_t *done, uint64_t *total, const char **stage)
{
    const int ok = m->type == BP_MSG_LOAD_PROGRESS && m->u.load_progress;
    *done = ok ? m->u.load_progress->bytes_done : 0;
    *total = ok ? m->u.load_progress->bytes_total : 0;
    *stage = ok && m->u.load_progress->stage ? m->u.load_progress->stage : "";
}
