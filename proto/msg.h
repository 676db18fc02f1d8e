/* Control-plane messages (proto/bloomery.proto) and their framing: one type byte, then
 * the protobuf-c encoding. bp_msg_unpack checks size, type and the fields each
 * message needs, so a caller never sees a message that breaks the plan's invariants.
 * The protobuf-c generated types (Bloomery__Hello, ...) are complete only inside
 * proto/: other modules read messages through the plain structs and readers at the
 * end of this header and send the router's through chan.h, never through protobuf-c.
 * Thread: none shared; a bp_msg_t belongs to one thread. */
#ifndef BP_MSG_H
#define BP_MSG_H

#include <stddef.h>
#include <stdint.h>

#include "cardlink.h"
#include "err.h"

/* The generated types are complete only inside proto/ (and in its tests, which
 * include bloomery.pb-c.h): other modules use the plain structs and readers below. */
struct ProtobufCMessage;
struct Bloomery__Hello;
struct Bloomery__Plan;
struct Bloomery__LoadProgress;
struct Bloomery__Ready;
struct Bloomery__Stats;
struct Bloomery__Error;
struct Bloomery__Shutdown;
struct Bloomery__MoveExperts;
struct Bloomery__CardLink;

/* The version of this wire protocol, carried in Hello.protocol. */
#define BP_PROTOCOL_VERSION 2u
/* The largest framed message (type byte included) either side accepts. */
/* 4 MiB: a plan for 100 layers x 512 experts is under 1 MiB, and protobuf-c may
 * allocate ~30x the input for a message of many tiny submessages, so the limit also
 * bounds what a hostile peer makes the receiver allocate. */
#define BP_MSG_MAX_BYTES ((size_t)4 << 20)
#define BP_MSG_MAX_KERNELS 128 /* Ready.kernels */

typedef enum bp_msg_type {
    BP_MSG_HELLO = 1,
    BP_MSG_PLAN = 2,
    BP_MSG_LOAD_PROGRESS = 3,
    BP_MSG_READY = 4,
    BP_MSG_STATS = 5,
    BP_MSG_ERROR = 6,
    BP_MSG_SHUTDOWN = 7,
    BP_MSG_MOVE_EXPERTS = 8,
    BP_MSG_CARD_LINK = 9,
} bp_msg_type_t;
#define BP_MSG_TYPE_MAX BP_MSG_CARD_LINK

/* One message: the type and a pointer to the protobuf-c struct of that type. A
 * message built by the caller points at the caller's structs (initialise them with
 * the BLOOMERY__HELLO__INIT etc. macros); one from bp_msg_unpack owns its structs
 * and is freed with bp_msg_free. */
typedef struct bp_msg {
    bp_msg_type_t type;
    union {
        struct ProtobufCMessage *base;
        struct Bloomery__Hello *hello;
        struct Bloomery__Plan *plan;
        struct Bloomery__LoadProgress *load_progress;
        struct Bloomery__Ready *ready;
        struct Bloomery__Stats *stats;
        struct Bloomery__Error *error;
        struct Bloomery__Shutdown *shutdown;
        struct Bloomery__MoveExperts *move_experts;
        struct Bloomery__CardLink *card_link;
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
 * than BP_MSG_MAX_BYTES), BL_EINVAL (unknown type byte, bytes that do not decode, a
 * field this version does not know, a missing or out-of-range field: the message
 * names it), BL_ENOMEM. */
int bp_msg_unpack(bp_msg_t *out, const uint8_t *buf, size_t nbytes, bl_err_t *err) BL_WUR;

/* Frees what bp_msg_unpack allocated; a caller-built message is left alone. */
void bp_msg_free(bp_msg_t *m);

/* Most layers a Plan may carry (Plan.n_layers), and stages. */
#define BP_PLAN_MAX_LAYERS 4096u
#define BP_PLAN_MAX_STAGES 64
/* Most threads of a stage's compute pool (Stage.threads, threads_batch). */
#define BP_PLAN_MAX_THREADS 256u

/* Most expert tiers a Plan may carry (Plan.tiers). */
#define BP_PLAN_MAX_TIERS 16

/* --- the messages as the processes use them ------------------------------------- */

/* An expert tier (Plan.tiers): the worker that computes the routed experts of the
 * layers bp_plan_t.tier gives it. */
typedef struct bp_plan_tier {
    uint32_t process;
    int device;            /* -1 the CPU, else a CUDA ordinal */
} bp_plan_tier_t;

typedef struct bp_plan_stage {
    uint32_t process;      /* the worker's id in the plan */
    uint32_t layer_begin, layer_end;
    int device;            /* -1 the CPU, else a CUDA ordinal */
    int card_next;         /* its output goes card to card to the next stage where both
                            * can (bp_card_msg_t); set only between two card stages */
    uint32_t threads;      /* its decode threads, 0..BP_PLAN_MAX_THREADS; 0: the plan's */
    uint32_t threads_batch; /* its prompt-step threads, likewise */
} bp_plan_stage_t;

/* The Plan: what the router sends each child. */
typedef struct bp_plan {
    const char *model_path; /* borrowed: the sender's, or the message's (valid while it is) */
    uint32_t n_layers, n_expert;
    int n_stages;
    bp_plan_stage_t stages[BP_PLAN_MAX_STAGES];
    uint8_t host[BP_PLAN_MAX_LAYERS]; /* 1 where the layer's routed experts are in host RAM,
                                       * computed by the hosttier (process host_process) */
    uint32_t host_process;
    int n_tiers;
    bp_plan_tier_t tiers[BP_PLAN_MAX_TIERS];
    uint8_t tier[BP_PLAN_MAX_LAYERS]; /* k + 1 where tiers[k] computes the layer's routed
                                       * experts; 0: the hosttier or its stage (host) */
    uint32_t kv_type;      /* a bl_type_t id: f16, f32 or q8_0 */
    uint32_t n_ctx, n_slots, threads, threads_batch, n_batch, you, flash_attn;
    int no_mmap, mlock;
    int no_op_offload;     /* a card never copies host experts in for a prompt step */
    uint32_t poll;         /* CPU pools' idle wait, 0..100 (kcpu_pool_set_poll) */
    int cpu_strict;        /* CPU pool threads pinned one to a CPU (--cpu-strict 1) */
    int64_t experts_vram;  /* card bytes for resident expert slots (--experts-vram):
                            * -1 automatic, 0 none */
    int no_residency;      /* host-RAM experts never move into card slots (--no-residency) */
    int64_t experts_ram;   /* bytes the hosttier's experts may take in RAM, the rest paged
                            * from the model file (--experts-ram); 0: all in RAM */
    uint32_t kv_pool;      /* positions one cache holds for all slots together (-kvu), in
                            * BP_KV_CHUNK chunks; 0: each slot owns n_ctx */
    const char *slot_dir;  /* borrowed like model_path: the folder of slot files
                            * (--slot-save-path), where WRITE and READ ops go; "": none */
    const char *cache_dir; /* likewise: the prompt cache on disk (--cache-disk), where
                            * PERSIST and FETCH ops go; "": none */
    int mtp;               /* the last stage runs the NextN layer; its LOGITS carry the
                            * proposals (proto/step.h) */
} bp_plan_t;

/* A validated Plan message into p: the stages, the tiers, the host and tier layers
 * from its placements (each names the process that computes an expert: a tier's, else
 * the hosttier's; a layer is a host or tier layer when every expert of it is listed,
 * all with one process), the KV type as a bl_type_t id. BL_ENOTSUP where a layer has
 * some of its experts listed or names two processes (a layer's experts move together
 * for now), BL_EINVAL (an expert listed twice, a stage's or tier's device or the KV
 * type out of range, a tier's process a stage's or another tier's; bp_msg_unpack
 * already refused an experts_vram below -1). */
int bp_plan_read(const bp_msg_t *m, bp_plan_t *p, bl_err_t *err) BL_WUR;

/* CardLink (proto/cardlink.h): the offer of the link between stage `link` and the
 * next, or the answer to it. The handles are opaque bytes here; the ends check what
 * they open. */
typedef struct bp_card_msg {
    uint32_t link;
    int answer;            /* 0: the sender's offer; 1: the receiver's answer */
    int ok;                /* offer: exported; answer: opened; 0: the host ring carries the rows */
    const char *reason;    /* why not ok; "" when ok (borrowed like bp_plan_t's strings) */
    int device;            /* offer: the sender's CUDA ordinal */
    uint64_t buf_bytes;    /* offer: bytes of each buffer */
    int n_bufs;            /* offer: 1..BP_CARD_MAX_BUFS when ok, else 0 */
    uint8_t mem[BP_CARD_MAX_BUFS][BP_CARD_HANDLE_BYTES];
    uint8_t ev[BP_CARD_MAX_BUFS][BP_CARD_HANDLE_BYTES];
} bp_card_msg_t;

/* A validated CardLink message into out. BL_EINVAL when m is none. */
int bp_card_msg_read(const bp_msg_t *m, bp_card_msg_t *out, bl_err_t *err) BL_WUR;

/* LoadProgress: bytes done and in all, and what is being loaded ("" when m is none). */
void bp_msg_progress_info(const bp_msg_t *m, uint64_t *done, uint64_t *total, const char **stage);
/* The Plan's KvType value of a bl_type_t id (f16, f32, q8_0), or -1 for another. */
int bp_kv_type_proto(uint32_t bl_type);

/* Hello.version; "" when m is no Hello. */
const char *bp_msg_hello_version(const bp_msg_t *m);
/* Ready's model facts (0 from a hosttier, or when m is no Ready) and the kernels it
 * runs ("" when not told; untrusted text, at most BP_MSG_MAX_KERNELS bytes). */
void bp_msg_ready_facts(const bp_msg_t *m, uint64_t *n_vocab, uint64_t *n_embd, uint64_t *n_layer,
                        const char **kernels);
/* A fatal Error of process `process`, built on the stack and handed to send(ud, m),
 * whose result it returns: how a child and a node tell their router that a process
 * cannot go on. code is a negative BL_E* code (another value sends BL_EIO); text is
 * borrowed for the call. */
typedef int (*bp_msg_send_fn)(void *ud, const bp_msg_t *m);
int bp_msg_fatal(uint32_t process, int code, const char *text, bp_msg_send_fn send, void *ud);

/* Error's code, whether it is fatal, and its text ("" when none). */
void bp_msg_error_info(const bp_msg_t *m, int32_t *code, int *fatal, const char **message);

typedef struct bp_msg_counter {
    const char *name;      /* borrowed from the message */
    uint64_t value;
} bp_msg_counter_t;
/* Stats: the child's uptime and up to cap counters into out; returns how many. */
int bp_msg_stats_read(const bp_msg_t *m, uint64_t *uptime_us, bp_msg_counter_t *out, int cap);

#endif
