/* The control link between a stage's relay and the node on its host (node/main.c,
 * docs/deploy.md "Several hosts"): each message is an envelope byte and its payload.
 * The relay's first message is its setup (the worker's arguments and its rings),
 * then the router's model file (size and fingerprint, before each Plan) and packed
 * control messages (msg.h) go either way.
 *
 * Before any relay, the router asks each node for its host's facts (bp_node_probe):
 * a probe as the first message, which the node answers with its CPUs, memory and CUDA
 * devices; the router says it has the answer, and the node ends the session (closing
 * at once could drop the answer with the connection). The router needs them to place
 * the stages and split the layers before it starts one, which is why they are not
 * part of a relay's session.
 *
 * The bytes come from the network: the _read functions check every field. */
#ifndef BP_NODE_H
#define BP_NODE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "msg.h"

#define BP_NODE_ENV_SETUP 'S' /* the relay's setup (bp_node_setup_t), first and once */
#define BP_NODE_ENV_MSG 'M'   /* a packed control message (bp_msg_pack) */
#define BP_NODE_ENV_FILE 'F'  /* the router's model file (bp_node_file_t), before a Plan */
#define BP_NODE_ENV_PROBE 'P' /* the router's question (bp_node_probe_t), first and once */
#define BP_NODE_ENV_HOST 'H'  /* the node's answer (bp_node_host_t) */
#define BP_NODE_ENV_DONE 'D'  /* the router has the answer (no payload): the node ends the session */

#define BP_NODE_SETUP_MAGIC "BLNODE2"
#define BP_NODE_PROBE_MAGIC "BLPROBE"
#define BP_NODE_HOST_MAGIC "BLHOST3"

/* The worker the node starts and its rings. On the wire as this struct, both hosts
 * little-endian (x86-64, aarch64). With BP_NODE_HOSTTIER the stage's experts rings
 * stay on the node's host: the node starts bloomery-hosttier there on their other
 * ends (its hosttier for this stage) instead of carrying them over a link. */
typedef struct bp_node_setup {
    char magic[8];        /* BP_NODE_SETUP_MAGIC */
    char version[32];     /* the relay's bloomery version (BL_VERSION), NUL-terminated */
    char name[24];        /* the worker's --name: 1-23 of A-Z a-z 0-9 _ . - */
    char identity[40];    /* its routing id: 1-39 bytes of the same */
    uint32_t n_rings;     /* 2, or 4 with the experts rings (the router's hosttier's over
                           * the links, or with BP_NODE_HOSTTIER the node's) */
    int32_t verbosity;    /* its -lv, -1..100 (-1: not given) */
    uint32_t flags;       /* BP_NODE_VERBOSE | BP_NODE_QUIET | BP_NODE_COLORS | BP_NODE_HOSTTIER */
    uint32_t hosttier_threads; /* with BP_NODE_HOSTTIER: its expert pool, 0 (the plan's)
                           * ..256; else 0 */
    uint64_t capacity[4]; /* in, out, experts out, experts in (proto/step.h's fd order):
                           * ring capacities (ring.h's powers of two); past n_rings 0 */
    char hosttier_name[24]; /* with BP_NODE_HOSTTIER: its --name, 1-23 of the name's set,
                           * or all zeros (it logs as "hosttier"); else all zeros */
} bp_node_setup_t;
#define BP_NODE_VERBOSE 1u
#define BP_NODE_QUIET 2u
#define BP_NODE_COLORS 4u
#define BP_NODE_HOSTTIER 8u /* a hosttier on the node's host computes the stage's host-RAM experts */
#define BP_NODE_MAX_HOSTTIER_THREADS 256

/* The router's model file as the relay tells it before each Plan: the node loads the
 * Plan's model only when its own file at that path has the same size and fingerprint
 * (common/fingerprint.h, computed by each side over its own file). */
#define BP_NODE_FINGERPRINT_BYTES 32
typedef struct bp_node_file {
    uint64_t size;        /* bytes of every part, 1..INT64_MAX */
    uint8_t fingerprint[BP_NODE_FINGERPRINT_BYTES]; /* SHA-256: not all zero */
} bp_node_file_t;

/* The router's question for the host's facts. */
#define BP_NODE_PROBE_RATES 1u /* measure the host's memory read rates (about 0.3 s); else 0 */
typedef struct bp_node_probe {
    char magic[8];        /* BP_NODE_PROBE_MAGIC */
    char version[32];     /* the router's bloomery version, NUL-terminated */
    uint32_t flags;       /* BP_NODE_PROBE_* */
    uint32_t pad;         /* 0 */
} bp_node_probe_t;

/* The node's host as its workers would run there: its CPUs, its memory and its CUDA
 * devices (as bloomery-worker --list-devices reports them there). */
#define BP_NODE_MAX_CPUS 65536u
#define BP_NODE_MAX_MEM ((uint64_t)1 << 56)
#define BP_NODE_MAX_DEVICES 16  /* the plan's BL_PLAN_MAX_DEVICES */
#define BP_NODE_MAX_ORDINAL 255 /* a Plan's Stage.gpu is 1 + at most this */
#define BP_NODE_MAX_MBPS 100000000u /* a memory read rate past 100 TB/s is not a host's */
typedef struct bp_node_device {
    int32_t index;        /* its CUDA ordinal, 0..BP_NODE_MAX_ORDINAL, no two alike */
    uint32_t read_mbps;   /* its memory's rate (bl_device_t's), 0: not known; at most BP_NODE_MAX_MBPS */
    char name[64];        /* "NVIDIA GB10": 1-63 bytes of printable ASCII, then zeros */
    uint64_t total_bytes; /* at most BP_NODE_MAX_MEM */
    uint64_t free_bytes;  /* at most total_bytes; 0: not known */
} bp_node_device_t;
typedef struct bp_node_host {
    char magic[8];        /* BP_NODE_HOST_MAGIC */
    char hostname[64];    /* the node's host name: 1-63 of A-Z a-z 0-9 _ . - */
    uint32_t n_cpus;      /* CPUs its workers may run on (its affinity), 1..BP_NODE_MAX_CPUS */
    uint32_t n_devices;   /* CUDA devices, 0..BP_NODE_MAX_DEVICES */
    uint64_t mem_available; /* MemAvailable in bytes, 0: not known; at most BP_NODE_MAX_MEM */
    uint64_t mem_total;   /* MemTotal, 0: not known; else at least mem_available */
    uint32_t read_mbps_one; /* its memory read rate with one thread and with n_cpus, MB/s (0:
                             * not measured, the probe did not ask) */
    uint32_t read_mbps_all; /* (bl_mem_read_mbps); 0: not known; at most BP_NODE_MAX_MBPS */
    bp_node_device_t device[BP_NODE_MAX_DEVICES]; /* the first n_devices; the others all zeros */
} bp_node_host_t;

/* A setup from a payload of n bytes into *out. BL_EPROTO naming the field that is
 * wrong (size, magic, an unterminated or empty string, a byte outside a name's set,
 * ring count or capacity, log settings and flags; a hosttier without the experts
 * rings, its threads past 256, its name, or either given without the flag); BL_EINVAL
 * for another version than version (naming both). */
int bp_node_setup_read(bp_node_setup_t *out, const uint8_t *p, size_t n, const char *version,
                       bl_err_t *err) BL_WUR;

/* The router's model file from a payload of n bytes into *out. BL_EPROTO naming the
 * field that is wrong (the payload's size, a size of 0 or past INT64_MAX, a
 * fingerprint of zeros). */
int bp_node_file_read(bp_node_file_t *out, const uint8_t *p, size_t n, bl_err_t *err) BL_WUR;

/* A probe (BL_EPROTO: size, magic, an unterminated version; BL_EINVAL: another
 * version than version, naming both) and the node's answer (BL_EPROTO naming the
 * field: size, magic, flags, host name, CPU count, memory, read rates, device count, and of a device by
 * its place: ordinal, one ordinal twice, name, memory, padding; an unused device
 * entry that is not zeros). */
int bp_node_probe_read(bp_node_probe_t *out, const uint8_t *p, size_t n, const char *version,
                       bl_err_t *err) BL_WUR;
int bp_node_host_read(bp_node_host_t *out, const uint8_t *p, size_t n, bl_err_t *err) BL_WUR;

/* One envelope as read: its tag and what the tag's reader made of the payload. */
typedef struct bp_node_env {
    char tag;             /* BP_NODE_ENV_* */
    union {
        bp_node_setup_t setup; /* S */
        bp_node_file_t file;   /* F */
        bp_node_probe_t probe; /* P */
        bp_node_host_t host;   /* H */
    } u;
    bp_msg_t msg;         /* M: the control message, unpacked and validated; the caller
                           * frees it with bp_msg_free (a no-op for the other tags) */
} bp_node_env_t;

/* An envelope of n bytes into *out: its tag must be one of accept (the tags this side
 * takes at this point, "FM" for a node's session), and its payload is read by the
 * tag's reader above (version: this side's, for a setup and a probe), a control
 * message by bp_msg_unpack; a D carries nothing. BL_EPROTO (no bytes, a tag not in
 * accept, bytes after a D), else the reader's error, which names the field. On
 * failure *out holds nothing to free. The one parser of the node protocol. */
int bp_node_env_read(bp_node_env_t *out, const uint8_t *p, size_t n, const char *accept, const char *version,
                     bl_err_t *err) BL_WUR;

/* Asks the node at endpoint (its control port, "tcp://HOST:PORT") for its host's
 * facts over a link keyed by the cluster's secret (flags: BP_NODE_PROBE_RATES when the
 * answer's read rates are wanted, else they come as 0), and waits until the node has
 * ended that session, so that a relay started next finds it listening. timeout_ms
 * bounds the handshake and the answer each. Errors name the endpoint: BL_ETIMEDOUT
 * and BL_EPERM (no handshake: no node there, or another secret; bp_link_wait_up's
 * reasons), the node's refusal as it gave it (another version: BL_EINVAL), BL_EPROTO
 * (an answer that breaks the protocol), BL_ECLOSED, BL_ENOMEM. The caller's thread. */
int bp_node_probe(const char *endpoint, const uint8_t key[32], const char *version, uint32_t flags,
                  int timeout_ms, bp_node_host_t *out, bl_err_t *err) BL_WUR;

#endif
