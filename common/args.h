/* Command-line flags, table-driven, with llama.cpp's spellings: short and long names
 * ("-t", "--threads"; a long name may be written with '_' for '-', "--top_k"),
 * "--flag value" and "--flag=value", and an environment variable per flag
 * (LLAMA_ARG_*) that the command line overrides. Every program shares this
 * parser, so a flag is spelled, checked and reported the same way everywhere. */
#ifndef BL_ARGS_H
#define BL_ARGS_H

#include <stdint.h>
#include <stdio.h>

#include "err.h"

typedef enum bl_arg_kind {
    BL_ARG_FLAG, /* no value; sets *(int *)dst = 1 */
    BL_ARG_STR,  /* *(const char **)dst = the value (borrowed from argv or environ) */
    BL_ARG_I64,  /* *(int64_t *)dst, checked against [min, max] */
    BL_ARG_F32,  /* *(float *)dst, finite, checked against [fmin, fmax] */
    BL_ARG_F64,  /* *(double *)dst, finite, checked against [fmin, fmax] */
    BL_ARG_FN,   /* fn(ud, value, err) parses the value itself */
} bl_arg_kind_t;

typedef struct bl_arg {
    const char *names;   /* comma-separated spellings: "-t,--threads" */
    const char *env;     /* environment variable, or NULL */
    bl_arg_kind_t kind;
    void *dst;
    int64_t min, max;    /* BL_ARG_I64 */
    double fmin, fmax;   /* BL_ARG_F32, BL_ARG_F64 */
    int (*fn)(void *ud, const char *value, bl_err_t *err); /* BL_ARG_FN */
    void *ud;
    const char *metavar; /* "N", "FILE", ...; NULL for flags */
    const char *help;
    int seen;            /* set by bl_args_parse: 1 from the command line, 2 from env */
} bl_arg_t;

#define BL_ARGS_VERSION 2 /* *help after --version: the version line is printed */

/* Applies the environment variables of args, then argv[1..argc). Positional
 * arguments (and everything after "--") are moved, in order, to the front of argv
 * after argv[0]; *n_positional counts them (NULL: positionals are an error).
 * "-h"/"--help" sets *help to 1, "--version" prints "PROG VERSION" and sets it to
 * BL_ARGS_VERSION (help NULL: both are unknown flags). Returns 0, or BL_EINVAL with
 * err naming the flag or variable: unknown flag, missing value, a value that does
 * not parse or is out of range. */
int bl_args_parse(bl_arg_t *args, int n_args, int argc, char **argv, int *n_positional,
                  int *help, bl_err_t *err) BL_WUR;

/* Prints "usage: prog synopsis" and one line per flag with its variable and help. */
void bl_args_usage(FILE *f, const char *prog, const char *synopsis, const bl_arg_t *args,
                   int n_args);

/* Prints a bash completion script for prog's flags (llama.cpp's --completion-bash):
 * source it, or put it in bash-completion's folder. */
void bl_args_completion_bash(FILE *f, const char *prog, const bl_arg_t *args, int n_args);

/* Parsers for BL_ARG_FN flags several programs share, with llama.cpp's spellings
 * (the placement flags are common/plan.h's bl_plan_args).
 * bl_arg_flash_attn: -fa on|off|auto (also 1|0|true|false) into *(int *)ud as
 * BL_FLASH_*. */
#define BL_FLASH_AUTO 0
#define BL_FLASH_ON 1
#define BL_FLASH_OFF 2
int bl_arg_flash_attn(void *ud, const char *value, bl_err_t *err) BL_WUR;

/* bl_arg_experts_vram: --experts-vram auto|SIZE (bl_parse_size_mib) into *(int64_t *)ud
 * as bytes, BL_EXPERTS_VRAM_AUTO for auto. */
#define BL_EXPERTS_VRAM_AUTO (-1)
#define BL_EXPERTS_RAM_AUTO (-1) /* --experts-ram auto, parsed by bl_arg_experts_vram too */
int bl_arg_experts_vram(void *ud, const char *value, bl_err_t *err) BL_WUR;

/* Number parsing as the flags use it, for callers with their own formats: the whole
 * string must be the number; integers are decimal ("010" is ten, "0x10" refused), as
 * llama.cpp reads its flags. */
int bl_parse_i64(const char *s, int64_t *out) BL_WUR;
int bl_parse_f32(const char *s, float *out) BL_WUR;
int bl_parse_f64(const char *s, double *out) BL_WUR;

/* A memory size as the size flags take it, into bytes: a decimal count of MiB ("512"),
 * or one with a K, M or G suffix for KiB, MiB or GiB ("2G", "1536M"; either case).
 * BL_EINVAL for anything else (a sign, a fraction, another suffix), BL_ERANGE for a
 * size past INT64_MAX bytes. */
int bl_parse_size_mib(const char *s, int64_t *bytes) BL_WUR;

#endif
