/* The placement plan, one owner for bloomery-serve, bloomery-cli and bloomery-bench:
 * from a model's file (its architecture facts and tensor sizes), the devices the
 * workers report and llama.cpp's placement flags with their meaning, where every
 * weight lives and runs:
 *   - stages: contiguous layer ranges, each on the CPU or on one CUDA device (of this
 *     machine, or with a hostfile, of the stage's host);
 *   - the expert table: for every (layer, routed expert), with its layer's stage
 *     (on that card, or in the CPU worker), in host RAM (the hosttier), or on an
 *     expert tier's card.
 * The dense parts of a layer (attention, norms, router) and its KV cache always sit
 * with the layer's stage.
 *
 * Flags, as llama.cpp reads them:
 *   -ngl N      the last N layers on the GPUs (N above the layer count: all, the head
 *               included); auto, all or -1: every layer; 0: the CPU;
 *   -dev LIST   none, or CUDA devices by name (cuda0, CUDA1); default every device;
 *   -sm MODE    layer (default: GPU layers split over the devices), none (the main
 *               GPU, -mg, only); row is refused;
 *   -ts A,B,..  the GPU layers split by these proportions (default: by free memory);
 *   --cpu-moe   every layer's routed experts in host RAM (-ot \.ffn_(up|down|gate)_exps=CPU);
 *   -ncmoe N    the routed experts of the first N layers in host RAM;
 *   -ot RE=BUFT tensors whose name RE finds go to BUFT: CPU (host RAM), CUDAn (that
 *               card), or HOSTTIER (the hosttier even beside a CPU worker); the first
 *               pattern that finds a tensor decides it, -ot patterns before --cpu-moe's
 *               and -ncmoe's; routed experts on a card without a stage of its own make
 *               it an expert tier (bl_plan_tier_t);
 *   --fit on|off  on (the default): when none of -ngl N, --cpu-moe, -ncmoe, -ot is
 *               given, the routed experts of as many leading layers as needed go to
 *               host RAM so that every card keeps -fitt MiB (default 1024) free, and
 *               if even that does not fit, leading layers go to the CPU; off: the plan
 *               is refused with the sizes when a card cannot hold its stage.
 * Routed experts move between card and host a whole layer at a time for now. */
#ifndef BL_PLAN_H
#define BL_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "arch.h"
#include "args.h"
#include "err.h"
#include "gguf.h"
#include "quant.h"

#define BL_PLAN_MAX_DEVICES 16
#define BL_PLAN_MAX_STAGES 64
#define BL_PLAN_DEVICE_CPU (-1)

/* A device a worker can run a stage on, as its Hello reports it. */
typedef struct bl_device {
    int index;            /* CUDA ordinal */
    char name[64];        /* "NVIDIA H200" */
    uint64_t total_bytes;
    uint64_t free_bytes;  /* 0: not known (nothing is checked against it) */
    uint32_t read_mbps;   /* its memory's rate, a device-to-device copy's bytes read and
                           * written a second, in MB/s; 0: not known */
} bl_device_t;

/* A hostfile's stage and its host as the plan sees them (bl_plan_split_hosts): one
 * CPU worker or one card of a worker line, with what its node (or, on the router's
 * host, this machine) reports. CPU stages whose hosts have the same name (compared
 * without regard to case, as the hostfile compares them) share that host's memory;
 * a card stage has its card's. */
typedef struct bl_stage_host {
    const char *name;     /* the host as the hostfile writes it; borrowed */
    int remote;           /* on another host than the router's: its memory is not ram_avail's */
    int threads;          /* the stage's threads (threads=, else -t); below 1 counts as 1 */
    int n_cpus;           /* CPUs the stage's process may run on there; 0: not known (no cap) */
    uint64_t mem_avail;   /* the host's MemAvailable; 0: not known (no cap) */
    uint64_t mem_total;   /* its MemTotal, for reports; 0: not known */
    uint32_t read_mbps_one; /* the host's memory read rate with one thread and with all its */
    uint32_t read_mbps_all; /* CPUs, MB/s (bl_mem_read_mbps); 0: not known */
    const bl_device_t *card; /* the stage's card as its host reports it (borrowed), or NULL:
                              * the stage runs on that host's CPU */
    int hosttier;         /* the hostfile runs a hosttier on this host: a remote stage's
                           * routed experts in host RAM are that hosttier's (its node
                           * starts it), not the router's */
} bl_stage_host_t;

/* What a card stage weighs in a hostfile's split against a CPU stage's threads where
 * the rates are not measured: a card reads its memory several times faster than a
 * host's cores do, so it counts as this many threads (a 16-thread CPU stage beside a
 * card gets 16/80 of their layers; with the hosts' rates measured but not the
 * card's, as this many of its host's one thread's rate), and the card's memory caps
 * what it takes. */
#define BL_PLAN_CARD_THREADS 64

/* The placement flags as given (NULL / 0: not given) and what the plan sizes. */
typedef struct bl_place_opts {
    const char *gpu_layers;   /* -ngl */
    const char *devices;      /* -dev */
    const char *split_mode;   /* -sm */
    int64_t main_gpu;         /* -mg */
    const char *tensor_split; /* -ts */
    int cpu_moe;              /* --cpu-moe */
    int64_t n_cpu_moe;        /* -ncmoe */
    const char *const *override_tensor; /* -ot, each "RE=BUFT[,RE=BUFT...]" */
    int n_override_tensor;
    const char *fit;          /* --fit: "on", "off" or NULL (on) */
    int64_t fit_target_mib;   /* -fitt: MiB each card keeps free; < 0: 1024 */
    int n_cpu_stages;         /* stages the CPU layers are split into (--workers); 0: 1;
                               * more than there are CPU layers: BL_EINVAL */
    const int64_t *stage_ends; /* the stages' ends (a hostfile's layers=): n_hosts of them
                               * with hosts, else n_cpu_stages of the CPU stages;
                               * increasing, the last the layers' (the CPU layers')
                               * count, else BL_EINVAL; NULL: split by hosts, else
                               * evenly, earlier stages taking the remainder */
    const bl_stage_host_t *hosts; /* a hostfile's n_hosts stages in order, or NULL. Given,
                               * they are the plan's stages, each on its card or its
                               * host's CPU (-dev, -ts, -sm other than layer, and -ngl N
                               * where a stage has a card are refused; -ot's CUDAn too);
                               * without stage_ends the layers split by
                               * bl_plan_split_hosts; a remote stage's memory is never
                               * counted against ram_avail, and host RAM beside a card of
                               * another host is refused (it would be the hosttier's) */
    int n_hosts;
    int64_t n_ctx_total;      /* KV positions over every slot */
    double kv_elem_bytes;     /* bytes of one cached K or V element (2 for f16) */
    int64_t n_batch;          /* rows of a step, for the scratch */
    int64_t n_seqs;           /* slots: a hybrid model keeps one recurrent state each per
                               * DeltaNet layer; 0 counts as 1 */
    /* RAM for the routed experts the host keeps (--experts-ram): 0 (the zero value)
     * no limit; > 0 bytes; BL_EXPERTS_RAM_AUTO (-1) what ram_avail spares with a
     * margin after the CPU stages' other weights and caches. Experts past it stay
     * in the model file, paged by the hosttier */
    int64_t experts_ram;
    uint64_t ram_avail;       /* the machine's available memory (bl_mem_available); 0:
                               * unknown, and auto is no limit */
    int mtp;                  /* the last stage runs the first NextN layer (--spec-type
                               * draft-mtp): its weights and K/V rows count there */
} bl_place_opts_t;

typedef struct bl_plan_stage {
    int device;             /* BL_PLAN_DEVICE_CPU or a CUDA ordinal */
    bl_device_t card;       /* a card stage's card, as its host reported it (all zeros on
                             * the CPU): what it is checked against */
    int64_t lb, le;         /* layers [lb, le) */
    uint64_t weight_bytes;  /* what the stage holds: dense parts, its experts, embd, head */
    uint64_t expert_bytes;  /* of which routed experts */
    uint64_t kv_bytes;      /* the cache: K/V rows of its attention layers and the
                             * recurrent states of its DeltaNet layers */
    uint64_t state_bytes;   /* of which recurrent states (every slot's) */
    uint64_t host_expert_bytes; /* routed experts of its layers that a hosttier keeps
                                 * (not in weight_bytes) */
    int node_hosttier;      /* those are kept by the hosttier of its own host, another than
                             * the router's (bl_stage_host_t.hosttier), not in host_bytes */
    uint64_t scratch_bytes; /* an estimate of the backend's scratch (cards only) */
} bl_plan_stage_t;

/* An expert tier: a card of this host without a stage of its own that holds the
 * routed experts of the layers -ot puts there (-ot ...exps=CUDA1 beside stages on
 * CUDA0), computed for their stages by a worker of its own. */
typedef struct bl_plan_tier {
    int device;             /* a CUDA ordinal */
    bl_device_t card;       /* as its host reported it */
    int n_layers;           /* layers whose experts it holds */
    uint64_t expert_bytes;  /* their routed experts */
    uint64_t scratch_bytes; /* an estimate of its scratch: a call's rows, choices and products */
} bl_plan_tier_t;

#define BL_PLAN_MAX_TIERS 16

typedef struct bl_plan {
    int n_stages;
    bl_plan_stage_t stage[BL_PLAN_MAX_STAGES];
    int64_t n_layer, n_expert;
    int64_t n_dense_lead;   /* leading layers without routed experts */
    uint8_t *host;          /* (n_layer * n_expert): 1 where the expert is in host RAM */
    int n_tiers;
    bl_plan_tier_t tier[BL_PLAN_MAX_TIERS];
    uint8_t *tier_of;       /* (n_layer): k + 1 where tier k holds the layer's routed experts,
                             * else 0 */
    uint64_t host_bytes;    /* routed experts in host RAM of this host (the hosttier's) */
    int n_host_layers;      /* layers with an expert there */
    int hosttier;           /* this host's hosttier process computes them */
    uint64_t node_host_bytes; /* routed experts in host RAM of other hosts, their
                             * hosttiers' (bl_plan_stage_t.node_hosttier) */
    int n_node_host_layers; /* layers of those */
    uint64_t experts_ram;   /* the host experts' RAM budget (resolved; UINT64_MAX: none) */
    uint64_t ram_avail;     /* the available memory it was resolved from (0: unknown) */
    uint64_t host_ram_bytes, host_disk_bytes; /* host_bytes split by that budget */
    int disk_moved;         /* layers whose experts left their CPU worker for the pager */
    int fit_moved;          /* --fit put the experts of this many leading layers in RAM */
    int fit_cpu_layers;     /* --fit moved this many leading layers to the CPU */
    int64_t fit_target_mib;
} bl_plan_t;

/* Builds p for the model in g (facts a) on devs[0..n_devs) (the CUDA devices; none:
 * the CPU only). Errors name the flag and the reason: BL_EINVAL (a value that does
 * not parse: -ngl, -dev, -ts, -sm, -ot's regex or buffer type, --fit; -ncmoe above
 * the layer count; contradicting flags), BL_ENOTSUP (-sm row; a device that does not
 * exist; an -ot pattern that matches no tensor, or places a layer's dense part or
 * part of its experts apart from it; host RAM beside another host's card),
 * BL_ENOMEM (a stage that does not fit its card, or no split of a hostfile's stages
 * fits their memories, with the sizes and, with a hostfile, the host). With hosts,
 * devs are not read (each stage carries its card). Caller frees with bl_plan_free. */
int bl_plan_build(bl_plan_t *p, const bl_gguf_t *g, const bl_arch_t *a, const bl_device_t *devs, int n_devs,
                  const bl_place_opts_t *o, bl_err_t *err) BL_WUR;
void bl_plan_free(bl_plan_t *p);

/* --- the flags, one table for every program ------------------------------------------ */

#define BL_PLAN_MAX_OT 64

/* The placement flags as given on a command line (NULL / 0: not given). */
typedef struct bl_place_flags {
    const char *gpu_layers, *devices, *split_mode, *tensor_split, *fit, *fit_target;
    int64_t main_gpu, n_cpu_moe, fit_ctx;
    int cpu_moe;
    const char *override_tensor[BL_PLAN_MAX_OT];
    int n_override_tensor;
    /* Residency, which moves the hottest host-RAM experts of a card's stage into card
     * slots while it runs (the worker's wk_model_opts_t.experts_vram and .residency) */
    int64_t experts_vram; /* --experts-vram in bytes, or BL_EXPERTS_VRAM_AUTO */
    int64_t experts_ram;  /* --experts-ram in bytes, or BL_EXPERTS_RAM_AUTO */
    int no_residency;     /* --no-residency */
} bl_place_flags_t;

/* Appends the placement flags to a[*n..cap), with llama.cpp's spellings, their
 * LLAMA_ARG_* variables and one help text: -ngl, -dev, -sm, -mg, -ts, -cmoe, -ncmoe,
 * -ot (repeatable), -fit, -fitt, -fitc, and bloomery's --experts-vram
 * (BLOOMERY_EXPERTS_VRAM), --experts-ram (BLOOMERY_EXPERTS_RAM) and --no-residency
 * (BLOOMERY_NO_RESIDENCY), all into f (f must outlive the parse). Sets
 * f->experts_vram and f->experts_ram to their defaults (auto), so call it before the
 * parse. BL_ERANGE when cap is too small. */
int bl_plan_args(bl_arg_t *a, int *n, int cap, bl_place_flags_t *f) BL_WUR;

/* The flags into o's placement fields (the sizes are the caller's): -fitt's list
 * must give one margin (BL_EINVAL for a value that does not parse, BL_ENOTSUP for
 * margins that differ between cards). */
int bl_plan_opts(bl_place_opts_t *o, const bl_place_flags_t *f, bl_err_t *err) BL_WUR;

/* The layers' split over a hostfile's n stages (its workers without layers=): ends[i]
 * the end of stage i's layers (the last n_layers). Each stage gets layers in
 * proportion to its weight, at least one: a CPU stage its threads capped by its
 * host's CPUs (a host's speed on the CPU follows the threads it runs, and threads past
 * its CPUs only share them), a card stage BL_PLAN_CARD_THREADS. Where every stage's
 * host has measured read rates, a decode's speed is its memory's: a host's CPU stages
 * together read at min(read_mbps_all, T * read_mbps_one) MB/s for their T threads
 * (at most its CPUs), shared among them by their threads, and a card stage weighs
 * its card's read_mbps (BL_PLAN_CARD_THREADS times its host's read_mbps_one where
 * that is not known). Then no memory is
 * given more than it holds of its stages' bytes: a host's RAM its mem_avail (its CPU
 * stages together), a card room[i] (what its free memory holds of weights and cache
 * once the plan's margin and scratch are kept; UINT64_MAX, or room NULL: not known).
 * Layer l takes bytes[l] (its weights and cache), the first stage also first (the
 * token embedding), the last also last (the output norm and head). A memory over
 * gives layers, one at a time from its stage with the most per weight, to the stage
 * of a memory not yet over with the fewest per weight. BL_EINVAL (no stage, more
 * stages than layers), BL_ENOMEM (no split fits: err names the host, and the card,
 * the memory it has and what its stages need at the least). */
int bl_plan_split_hosts(const uint64_t *bytes, int64_t n_layers, uint64_t first, uint64_t last,
                        const bl_stage_host_t *hosts, const uint64_t *room, int n, int64_t *ends,
                        bl_err_t *err) BL_WUR;
/* Whether every one of the n stages' hosts has both read rates, so that
 * bl_plan_split_hosts weighs the stages by them rather than by threads. */
int bl_plan_hosts_measured(const bl_stage_host_t *hosts, int n);

/* Whether layer l has any expert in host RAM (of this host, or of its stage's host). */
int bl_plan_layer_host(const bl_plan_t *p, int64_t l);
/* Whether layer l's experts in host RAM are another host's: its stage's hosttier's. */
int bl_plan_layer_node_hosttier(const bl_plan_t *p, int64_t l);

/* What a card stage takes of its card: weights, cache and scratch (what --fit and the
 * refusals hold against the free memory, less the -fitt margin). */
uint64_t bl_plan_stage_need(const bl_plan_stage_t *st);

/* How stage i of p sits on its card as the plan judges it: BL_PLAN_FITS (weights,
 * cache and scratch with the -fitt margin within the free memory, or a CPU stage, or
 * a card whose free memory is not known), BL_PLAN_TIGHT (weights and cache fit, the
 * scratch or the margin do not: what --fit off and a chosen placement accept),
 * BL_PLAN_OVER (weights and cache alone pass it: what the plan refuses). */
enum { BL_PLAN_FITS = 0, BL_PLAN_TIGHT = 1, BL_PLAN_OVER = 2 };
int bl_plan_stage_fit(const bl_plan_t *p, int i);

/* "12.3 MiB" below a GiB, else "4.56 GiB": the plan's lines and messages. */
void bl_plan_fmt_size(char *buf, size_t cap, uint64_t bytes);

/* The model file's tensors by their part in the model (bl_arch_role) and by type. */
#define BL_PLAN_N_ROLES (BL_ROLE_FFN + 1)
typedef struct bl_model_bytes {
    uint64_t role_bytes[BL_PLAN_N_ROLES], role_params[BL_PLAN_N_ROLES];
    uint64_t type_bytes[BL_TYPE_COUNT], type_tensors[BL_TYPE_COUNT];
    uint64_t bytes, params, tensors;
} bl_model_bytes_t;

void bl_plan_model_bytes(const bl_gguf_t *g, const bl_arch_t *a, bl_model_bytes_t *out);

/* Writes the plan as lines ("stage 0: layers 0..47 on CUDA0 ...", a summary, the
 * routed experts on the card per layer) into buf; returns the length it needed. */
size_t bl_plan_format(const bl_plan_t *p, char *buf, size_t cap);

#endif
