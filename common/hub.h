/* Models from the Hugging Face hub: `-hf user/model[:quant]` names a GGUF file of a
 * repository; bl_hub_resolve finds it in the hub's local cache (the layout
 * huggingface_hub and llama.cpp share: models--user--model/{refs,blobs,snapshots}) or
 * downloads it there, every part of a split model, resuming a partial download and
 * checking each file against the hub's SHA-256. Endpoint: MODEL_ENDPOINT, else
 * HF_ENDPOINT, else https://huggingface.co/. Cache: LLAMA_CACHE, HF_HUB_CACHE,
 * HUGGINGFACE_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME/huggingface/hub, then
 * ~/.cache/huggingface/hub. */
#ifndef BL_HUB_H
#define BL_HUB_H

#include <stdint.h>
#include <stdio.h>

#include "args.h"
#include "err.h"

/* Called during a download, at most a few times a second and once at its end: file
 * is the path in the repository, total 0 when the size is unknown. */
typedef void (*bl_hub_progress_fn)(void *ud, const char *file, uint64_t done, uint64_t total);

typedef struct bl_hub_opts {
    const char *spec;  /* "user/model[:quant]"; NULL: no hub model */
    const char *url;   /* -mu: a GGUF's URL (the first part of a split one), or NULL */
    const char *file;  /* a path in the repository instead of a quant tag, or NULL */
    const char *token; /* bearer token (--hf-token, HF_TOKEN), or NULL */
    int offline;       /* 1: only what the cache holds, no network */
    bl_hub_progress_fn progress;
    void *ud;
} bl_hub_opts_t;

/* The flags of bl_hub_opts_t with llama.cpp's spellings, as bl_arg_t initializers for
 * a program's table: -hf/--hf-repo, -hff/--hf-file, -hft/--hf-token, --offline. */
#define BL_HUB_ARGS(o)                                                                             \
    {"-hf,-hfr,--hf-repo", "LLAMA_ARG_HF_REPO", BL_ARG_STR, &(o)->spec,                             \
     .metavar = "USER/MODEL[:QUANT]",                                                              \
     .help = "download the model from this Hugging Face repository into the hub's cache (quant: "  \
             "a tag such as Q4_K_M, the default, else Q8_0, else the first GGUF)"},                  \
    {"-hff,--hf-file", "LLAMA_ARG_HF_FILE", BL_ARG_STR, &(o)->file, .metavar = "FILE",               \
     .help = "with -hf, this file of the repository instead of a quant tag"},                       \
    {"-hft,--hf-token", "HF_TOKEN", BL_ARG_STR, &(o)->token, .metavar = "TOKEN",                     \
     .help = "Hugging Face access token for gated or private repositories"},                        \
    {"--offline", "LLAMA_OFFLINE", BL_ARG_FLAG, &(o)->offline,                                       \
     .help = "with -hf or -mu, use only the cache: no network"},                                 \
    {"-mu,--model-url", "LLAMA_ARG_MODEL_URL", BL_ARG_STR, &(o)->url, .metavar = "URL",              \
     .help = "download the model from this URL (with -m: to that path; else into LLAMA_CACHE or "  \
             "~/.cache/llama.cpp), every part of a split model, once"}

/* The model file a program opens: model (from -m) when o names no hub model and no
 * URL; else the hub's file, downloaded when the cache lacks it; else the URL's file,
 * downloaded to model (when given) or to LLAMA_CACHE, else XDG_CACHE_HOME/llama.cpp,
 * else ~/.cache/llama.cpp, under the URL's file name, when it is not there yet.
 * Refuses -m with -hf, -hf with -mu, and --hf-file without -hf. *path_out: caller
 * frees with free(); NULL when nothing is given. */
int bl_hub_model_path(const bl_hub_opts_t *o, const char *model, char **path_out,
                      bl_err_t *err) BL_WUR;

/* Prints the GGUF files the cache holds (-cl, --cache-list): a count, then one
 * "user/model file.gguf" line each, sorted. An absent cache holds none. */
int bl_hub_list(FILE *f, bl_err_t *err) BL_WUR;

/* Resolves o->spec as above; *path_out is the first part's path in the snapshot
 * folder (caller frees with free()). */
int bl_hub_resolve(const bl_hub_opts_t *o, char **path_out, bl_err_t *err) BL_WUR;

#endif
