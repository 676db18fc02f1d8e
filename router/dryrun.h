/* bloomery-serve --dry-run: the plan a start would make for a model on this machine,
 * written for a person (stdout) before anything is loaded. Every number comes from
 * where the start takes it: the plan (common/plan.c) for what goes where, the model
 * file's tensor table (bl_plan_model_bytes) for the model, the devices
 * bloomery-worker --list-devices reports; this file only lays them out. */
#ifndef RT_DRYRUN_H
#define RT_DRYRUN_H

#include <stdint.h>
#include <stdio.h>

#include "arch.h"
#include "gguf.h"
#include "plan.h"

typedef struct rt_dry_run {
    const char *model_path;
    const bl_gguf_t *g;
    const bl_arch_t *a;
    const bl_device_t *devs;  /* this host's CUDA devices as the worker reports them */
    int n_devs;               /* -1: not known (asking for them failed) */
    const char *gpu_note;     /* why the plan was given none of them, or NULL */
    const char *remote[BL_PLAN_MAX_STAGES]; /* a stage's node on another host (--hostfile), or NULL */
    const bl_stage_host_t *hosts; /* a hostfile's stages and their hosts, plan->n_stages of them,
                                * or NULL */
    int hosts_split;          /* 1: the plan split the layers by them; 0: the hostfile's layers= */
    const bl_plan_t *plan;    /* NULL: no plan (error says why) */
    const char *error;        /* the start's error, or NULL: it fits */
    int64_t n_ctx, n_ctx_slot, n_slots;
    int kv_unified;
    uint32_t kv_type;         /* a bl_type_t: f16, f32 or q8_0 */
    int64_t threads, threads_batch;
    int64_t experts_vram;     /* --experts-vram: bytes or BL_EXPERTS_VRAM_AUTO */
    int residency;            /* 0: --no-residency */
    const char *draft_path;   /* -md, or NULL */
    int64_t draft_layers;
    int draft_device;         /* the draft's card, or -1: the CPU */
    int mtp;                  /* --spec-type draft-mtp: the model's NextN layer drafts */
    int starting;             /* 1: the start screen of a real start (a terminal), not a dry run */
} rt_dry_run_t;

/* Writes the report: the machine, the model, the placement per stage, the context
 * and whether it fits (with the start's error when it does not). A real start on a
 * terminal shows it too (starting), as its start screen. */
void rt_dry_run_print(FILE *f, const rt_dry_run_t *d);

#endif
