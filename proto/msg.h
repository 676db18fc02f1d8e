/* Control-plane messages (proto/bloomery.proto) and their framing: one type byte, then
 * the protobuf-c encoding. bp_msg_unpack checks size, type and the fields each
 * message needs, so a caller never sees a message that breaks the plan's invariants.
 * The protobuf-c generated types (Bloomery__Hello, ...) are reached only through this
 * header; other modules build and read them here, never through protobuf-c directly.
 * Thread: none shared; a bp_msg_t belongs to one thread. */
#ifndef BP_MSG_H
#define BP_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "bloomery.pb-c.h"
#include "err.h"

/* The version of this wire protocol, carried in Hello.protocol. */
#define BP_PROTOCOL_VERSION 1u
/* The largest framed message (type byte included) either side accepts. */
/* 4 MiB: a plan for 100 layers x 512 experts is under 1 MiB, and protobuf-c may
 * allocate ~30x the input for a message of many tiny submessages, so the limit also
 * bounds what a hostile peer makes the receiver allocate. */
#define BP_MSG_MAX_BYTES ((size_t)4 << 20)

typedef enum bp_msg_type {
    BP_MSG_HELLO = 1,
    BP_MSG_PLAN = 2,
    BP_MSG_LOAD_PROGRESS = 3,
    BP_MSG_READY = 4,
    BP_MSG_STATS = 5,
    BP_MSG_ERROR = 6,
    BP_MSG_SHUTDOWN = 7,
    BP_MSG_MOVE_EXPERTS = 8,
} bp_msg_type_t;
#define BP_MSG_TYPE_MAX BP_MSG_MOVE_EXPERTS

/* One message: the type and a pointer to the protobuf-c struct of that type. A
 * message built by the caller points at the caller's structs (initialise them with
 * the BLOOMERY__HELLO__INIT etc. macros); one from bp_msg_unpack owns its structs
 * and is freed with bp_msg_free. */
typedef struct bp_msg {
    bp_msg_type_t type;
    union {
        ProtobufCMessage *base;
        Bloomery__Hello *hello;
        Bloomery__Plan *plan;
        Bloomery__LoadProgress *load_progress;
        Bloomery__Ready *ready;
        Bloomery__Stats *stats;
        Bloomery__Error *error;
        Bloomery__Shutdown *shutdown;
        Bloomery__MoveExperts *move_experts;
    } u;
    int _owned; /* set by bp_msg_unpack */
} bp_msg_t;

/* "hello", "plan", ...; "unknown" outside the enum. */
const char *bp_msg_type_name(int type);

/* Checks that m's type is known, that m.u points at a struct of that type, and the
 * fields the type needs (see msg.c, validate_*). BL_EINVAL naming the message and the
 * field. Run by bp_msg_pack and bp_msg_unpack. */
int bp_msg_validate(const bp_msg_t *m, bl_err_t *err) BL_WUR;

/* The framed size of m (type byte + encoding); 0 if m's type is unknown. */
size_t bp_msg_packed_size(const bp_msg_t *m);

/* Validates m and writes its framing into buf (cap bytes); *nbytes is the size written.
 * BL_EINVAL (invalid message), BL_ERANGE (larger than cap or BP_MSG_MAX_BYTES). */
int bp_msg_pack(const bp_msg_t *m, uint8_t *buf, size_t cap, size_t *nbytes,
                bl_err_t *err) BL_WUR;

/* Decodes nbytes of untrusted framing into *out, which the caller frees with
 * bp_msg_free (also after a failure: it is then empty). BL_ERANGE (empty or larger
 * than BP_MSG_MAX_BYTES), BL_EINVAL (unknown type byte, bytes that do not decode,
 * a missing or out-of-range field: the message names it), BL_ENOMEM. */
int bp_msg_unpack(bp_msg_t *out, const uint8_t *buf, size_t nbytes, bl_err_t *err) BL_WUR;

/* Frees what bp_msg_unpack allocated; a caller-built message is left alone. */
void bp_msg_free(bp_msg_t *m);

/* Most layers a Plan may carry (Plan.n_layers). */
#define BP_PLAN_MAX_LAYERS 4096u

/* The layers of a validated Plan whose routed experts are in host RAM, from its
 * placements (each names an expert that the hosttier computes): out[l] = 1 where
 * every expert of layer l is listed, 0 where none is (out has n_layers entries, at
 * most BP_PLAN_MAX_LAYERS in a plan bp_msg_unpack accepted).
 * BL_ENOTSUP where a layer has some of its experts listed (a layer's experts move
 * together for now), BL_EINVAL for an expert listed twice. */
int bp_plan_host_layers(const Bloomery__Plan *p, uint8_t *out, bl_err_t *err) BL_WUR;

#endif
