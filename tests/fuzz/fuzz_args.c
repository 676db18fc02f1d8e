/* libFuzzer target for the command line every program parses (common/args.c and the
 * CPU flags of common/cpuset.c): the input is split at NUL and newline bytes into at
 * most 48 arguments and parsed against a table of each kind of flag the programs
 * take (-C/-Cr masks, --cpu-strict, --prio, --numa, -fa, --experts-vram, integers,
 * floats, strings, booleans). Invariants beside the sanitizers': a refusal says why;
 * an accepted line leaves every value in its flag's range; the CPU mask and range,
 * when given, either select CPUs of this process or are refused with a reason
 * (the process's own affinity is never changed). Seeds: tests/fuzz/corpus/fuzz_args/. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "cpuset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_args: %s\n", what);
        abort();
    }
}

enum { MAX_ARGS = 48 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0;
    char *text = malloc(size + 1);
    check(text != NULL, "out of memory");
    memcpy(text, data, size);
    text[size] = 0;
    char *argv[MAX_ARGS + 1];
    int argc = 0;
    argv[argc++] = (char *)"prog";
    for (size_t i = 0, start = 0; i <= size && argc < MAX_ARGS; i++)
        if (i == size || text[i] == 0 || text[i] == '\n') {
            text[i] = 0;
            if (i > start)
                argv[argc++] = text + start;
            start = i + 1;
        }
    argv[argc] = NULL;

    bl_cpu_flags_t cpu = {0};
    int64_t threads = 0, vram = BL_EXPERTS_VRAM_AUTO;
    double temp = 0.8;
    int fa = BL_FLASH_AUTO, flag = 0;
    const char *model = NULL;
    bl_arg_t a[16] = {
        {"-t,--threads", NULL, BL_ARG_I64, &threads, -1, 256, .metavar = "N", .help = "threads"},
        {"--temp", NULL, BL_ARG_F64, &temp, .fmin = 0, .fmax = 100, .metavar = "T", .help = "temperature"},
        {"-m,--model", NULL, BL_ARG_STR, &model, .metavar = "FILE", .help = "model"},
        {"--flag", NULL, BL_ARG_FLAG, &flag, .help = "a boolean"},
        {"-fa,--flash-attn", NULL, BL_ARG_FN, NULL, .fn = bl_arg_flash_attn, .ud = &fa, .metavar = "M",
         .help = "flash attention"},
        {"--experts-vram", NULL, BL_ARG_FN, NULL, .fn = bl_arg_experts_vram, .ud = &vram, .metavar = "SIZE",
         .help = "slots"},
    };
    int n = 6;
    check(bl_cpu_args(a, &n, 16, &cpu) == 0, "the CPU flags do not fit the table");
    int n_pos = 0;
    bl_err_t err = {0};
    const int rc = bl_args_parse(a, n, argc, argv, &n_pos, NULL, &err); /* no --version: it prints */
    check(rc == 0 || err.msg[0], "a refusal without a message");
    if (rc == 0) {
        check(threads >= -1 && threads <= 256, "threads out of range");
        check(temp >= 0 && temp <= 100, "temperature out of range");
        check(fa == BL_FLASH_AUTO || fa == BL_FLASH_ON || fa == BL_FLASH_OFF, "-fa out of range");
        check(vram >= BL_EXPERTS_VRAM_AUTO, "--experts-vram below auto");
        check(cpu.strict >= 0 && cpu.strict <= 1 && cpu.prio >= -1 && cpu.prio <= 3, "a CPU flag out of range");
        check(cpu.numa >= BL_NUMA_NONE && cpu.numa <= BL_NUMA_NUMACTL, "--numa out of range");
        check(n_pos >= 0 && n_pos < argc, "more positionals than arguments");
        cpu_set_t s;
        CPU_ZERO(&s);
        const int set = bl_cpu_flags_set(&cpu, &s, &err);
        check(set >= 0 || err.msg[0], "a CPU set refused without a message");
        check(set <= 0 || CPU_COUNT(&s) > 0, "an accepted CPU set without a CPU");
    }
    free(text);
    return 0;
}
