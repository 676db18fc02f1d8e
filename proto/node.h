/* The control link between a stage's relay and the node on its host (node/main.c,
 * docs/deploy.md "Several hosts"): each message is an envelope byte and its payload.
 * The relay's first message is its setup (the worker's arguments and its rings),
 * then the router's model file (size and fingerprint, before each Plan) and packed
 * control messages (msg.h) go either way. The bytes come
 * from the network: bp_node_setup_read checks every field. */
#ifndef BP_NODE_H
#define BP_NODE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define BP_NODE_ENV_SETUP 'S' /* the relay's setup (bp_node_setup_t), first and once */
#define BP_NODE_ENV_MSG 'M'   /* a packed control message (bp_msg_pack) */
#define BP_NODE_ENV_FILE 'F'  /* the router's model file (bp_node_file_t), before a Plan */

#define BP_NODE_SETUP_MAGIC "BLNODE1"

/* The worker the node starts and its rings. On the wire as this struct, both hosts
 * little-endian (x86-64, aarch64). */
typedef struct bp_node_setup {
    char magic[8];        /* BP_NODE_SETUP_MAGIC */
    char version[32];     /* the relay's bloomery version (BL_VERSION), NUL-terminated */
    char name[24];        /* the worker's --name: 1-23 of A-Z a-z 0-9 _ . - */
    char identity[40];    /* its routing id: 1-39 bytes of the same */
    uint32_t n_rings;     /* 2, or 4 with the hosttier's */
    int32_t verbosity;    /* its -lv, -1..100 (-1: not given) */
    uint32_t flags;       /* BP_NODE_VERBOSE | BP_NODE_QUIET | BP_NODE_COLORS */
    uint32_t pad;         /* 0 */
    uint64_t capacity[4]; /* in, out, experts out, experts in (proto/step.h's fd order):
                           * ring capacities (ring.h's powers of two); past n_rings 0 */
} bp_node_setup_t;
#define BP_NODE_VERBOSE 1u
#define BP_NODE_QUIET 2u
#define BP_NODE_COLORS 4u

/* The router's model file as the relay tells it before each Plan: the node loads the
 * Plan's model only when its own file at that path has the same size and fingerprint
 * (common/fingerprint.h, computed by each side over its own file). */
#define BP_NODE_FINGERPRINT_BYTES 32
typedef struct bp_node_file {
    uint64_t size;        /* bytes of every part, 1..INT64_MAX */
    uint8_t fingerprint[BP_NODE_FINGERPRINT_BYTES]; /* SHA-256: not all zero */
} bp_node_file_t;

/* A setup from a payload of n bytes into *out. BL_EPROTO naming the field that is
 * wrong (size, magic, an unterminated or empty string, a byte outside a name's set,
 * ring count or capacity, log settings, padding); BL_EINVAL for another version
 * than version (naming both). */
int bp_node_setup_read(bp_node_setup_t *out, const uint8_t *p, size_t n, const char *version,
                       bl_err_t *err) BL_WUR;

/* The router's model file from a payload of n bytes into *out. BL_EPROTO naming the
 * field that is wrong (the payload's size, a size of 0 or past INT64_MAX, a
 * fingerprint of zeros). */
int bp_node_file_read(bp_node_file_t *out, const uint8_t *p, size_t n, bl_err_t *err) BL_WUR;

#endif
