/* The hostfile of a cluster: which processes of one model run where (the router,
 * one worker per GPU or a CPU worker, at most one hosttier per host), one entry a
 * line, as docs/deploy.md describes. The file is untrusted text: every refusal is
 * BL_EINVAL with a message "NAME:LINE: ..." naming the line, and the lines involved
 * for the rules over the whole file. The parsed table is the caller's, freed with
 * bl_hostfile_free. No state is shared: any thread may parse its own. */
#ifndef BL_HOSTFILE_H
#define BL_HOSTFILE_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"

#define BL_HOSTFILE_MAX_BYTES (1u << 20) /* the whole file */
#define BL_HOSTFILE_MAX_ENTRIES 4096
#define BL_HOSTFILE_MAX_LINE 1024        /* bytes of one line, not counting its end */
#define BL_HOSTFILE_MAX_GPUS 64          /* CUDA ordinals 0..63 */
#define BL_HOSTFILE_MAX_THREADS 1024
#define BL_HOSTFILE_MAX_LAYERS 4096      /* layers=A-B with B <= this */
/* name=WORD: at most this many bytes, so that a card's stage of a line of several
 * ("NAME.K", K its place on the line) still fits a process's log name */
#define BL_HOSTFILE_MAX_NAME 20

typedef enum bl_host_role {
    BL_HOST_ROUTER = 1,   /* bloomery-serve: PORT is its cluster port */
    BL_HOST_WORKER = 2,   /* bloomery-worker: PORT is its data port */
    BL_HOST_HOSTTIER = 3, /* bloomery-hosttier: PORT is its data port */
} bl_host_role_t;

typedef struct bl_host_entry {
    /* A DNS name or IPv4 address as written; an IPv6 address without its brackets,
     * in inet_ntop's form ("[0:0::1]" is "::1"), so that one address reads one way. */
    char host[256];
    uint16_t port;             /* 1..65535 */
    bl_host_role_t role;
    int all_gpus;              /* a worker's GPUS field is "all" (then n_gpus is 0) */
    int n_gpus;                /* 0: a CPU worker (or not a worker) */
    int gpus[BL_HOSTFILE_MAX_GPUS]; /* distinct CUDA ordinals, as listed */
    int threads;               /* threads=N; 0: not given */
    int64_t layer_begin, layer_end; /* layers=A-B, B exclusive; -1: not given */
    char name[BL_HOSTFILE_MAX_NAME + 1]; /* name=WORD, unique in the file; "": not given */
    int line;                  /* 1-based line of the file */
} bl_host_entry_t;

typedef struct bl_hostfile {
    bl_host_entry_t *e; /* n entries in file order */
    int n;
} bl_hostfile_t;

/* Parses len bytes of text (no NUL needed; a NUL inside is refused), naming it
 * name in messages (NULL: "hostfile"). On success *out holds the entries (free with
 * bl_hostfile_free); on failure *out is empty. BL_EINVAL (a line that does not parse,
 * or a rule over the file broken: one router, a worker, one hosttier per host, no
 * HOST:PORT twice, no GPU of a host twice, layer ranges that tile), BL_ENOMEM. */
int bl_hostfile_parse(const char *text, size_t len, const char *name, bl_hostfile_t *out,
                      bl_err_t *err) BL_WUR;

/* Reads path (at most BL_HOSTFILE_MAX_BYTES; "-" is standard input) and parses it,
 * named by its path. BL_ENOENT (no such file), BL_EIO (cannot read it), and the
 * errors of bl_hostfile_parse (a file over the limit is BL_EINVAL, as in parse). */
int bl_hostfile_load(const char *path, bl_hostfile_t *out, bl_err_t *err) BL_WUR;

/* Frees the entries and empties h; an empty h (or NULL) is a no-op. */
void bl_hostfile_free(bl_hostfile_t *h);

/* "router", "worker", "hosttier"; "?" for another value. */
const char *bl_host_role_name(bl_host_role_t r);

/* The router's entry (a parsed file has exactly one); NULL for an empty h. */
const bl_host_entry_t *bl_hostfile_router(const bl_hostfile_t *h);

/* The entry after prev (NULL: the first) whose role is role (0: any) and whose host
 * is host (NULL: any; compared as the parser compares hosts: DNS names without
 * regard to case, IPv6 in inet_ntop's form, with or without brackets), or NULL. A
 * host's workers: for (p = NULL; (p = bl_hostfile_next(h, p, "a", BL_HOST_WORKER));). */
const bl_host_entry_t *bl_hostfile_next(const bl_hostfile_t *h, const bl_host_entry_t *prev,
                                        const char *host, bl_host_role_t role);

#endif
