/* bloomery-bench --disk: what the disk gives the pager (bench_disk.h). The pager's
 * rate is only a number beside these: a read rate of its own is a ratio to the random
 * whole-expert rate at its depth. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "arch.h"
#include "bench_disk.h"
#include "gguf.h"
#include "xread.h"

#define SEQ_BLOCK ((size_t)1 << 20)
#define SEQ_MAX ((uint64_t)2 << 30) /* bytes a sequential pass reads at most */
#define RAND_BYTES ((uint64_t)1 << 30) /* bytes a random pass reads at least (16 experts) */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

typedef struct slice3 {
    uint32_t part[3];
    uint64_t off[3];
    size_t len[3];
} slice3_t;

static void row(int md, const char *test, size_t block, int depth, double bytes, double secs, int64_t reads,
                const char *backend, int direct)
{
    const double mbs = bytes / secs / 1e6, iops = (double)reads / secs;
    if (md)
        printf("| %s | %.2f MiB | %d | %.1f | %.0f | %s%s |\n", test, (double)block / (1 << 20), depth, mbs, iops,
               backend, direct ? ", O_DIRECT" : ", page cache");
    else
        printf("{\"test\":\"%s\",\"block\":%zu,\"depth\":%d,\"mb_per_s\":%.3f,\"reads_per_s\":%.3f,"
               "\"backend\":\"%s\",\"direct\":%d}\n", test, block, depth, mbs, iops, backend, direct);
}

int bench_disk(const char *model, int64_t reps, int md)
{
    bl_gguf_t *g = NULL;
    bl_arch_t a;
    bl_err_t err = {0};
    if (bl_gguf_open(&g, model, &err) || bl_arch_read(&a, g, model, &err)) {
        fprintf(stderr, "bloomery-bench: %s\n", err.msg);
        bl_gguf_close(g);
        return 1;
    }
    const uint32_t np = bl_gguf_n_parts(g);
    const char *paths[256];
    for (uint32_t i = 0; i < np && i < 256; i++)
        paths[i] = bl_gguf_part_path(g, i);
    /* every routed expert's three slices, to read whole experts at random */
    int64_t n_x = 0;
    slice3_t *xs = a.moe ? calloc((size_t)(a.n_layer * a.n_expert), sizeof *xs) : NULL;
    size_t expert_bytes = 0;
    static const char *const names[3] = {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"};
    for (int64_t l = 0; xs && l < a.n_layer; l++) {
        const bl_gguf_tensor_t *t[3];
        int ok = 1;
        for (int i = 0; i < 3; i++) {
            char name[96];
            snprintf(name, sizeof name, "blk.%lld.%s.weight", (long long)l, names[i]);
            t[i] = bl_gguf_find_tensor(g, name);
            ok &= t[i] != NULL;
        }
        for (int64_t x = 0; ok && x < a.n_expert; x++, n_x++) {
            size_t eb = 0;
            for (int i = 0; i < 3; i++) {
                xs[n_x].len[i] = (size_t)(t[i]->nbytes / (uint64_t)a.n_expert);
                xs[n_x].part[i] = t[i]->part;
                xs[n_x].off[i] = t[i]->file_offset + (uint64_t)x * xs[n_x].len[i];
                eb += xs[n_x].len[i];
            }
            expert_bytes = eb > expert_bytes ? eb : expert_bytes;
        }
    }
    int rc = 1;
    bl_xr_t *xr = NULL;
    const bl_xr_opts_t xo = {.kind = BL_XR_AUTO, .direct = 1, .depth = 16};
    uint8_t *buf = NULL;
    size_t buf_len = 0;
    bl_xr_req_t *reqs = NULL;
    if (bl_xr_open(&xr, paths, (int)np, &xo, &err)) {
        fprintf(stderr, "bloomery-bench: %s\n", err.msg);
        goto done;
    }
    /* buffers: 16 whole experts (their aligned supersets) or 16 sequential blocks */
    const size_t al = bl_xr_mem_align(xr) > 4096 ? bl_xr_mem_align(xr) : 4096;
    const size_t piece = ((expert_bytes > SEQ_BLOCK ? expert_bytes : SEQ_BLOCK) / al + 3) * al;
    buf_len = 16 * 3 * piece;
    buf = mmap(NULL, buf_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    reqs = calloc(16 * 3, sizeof *reqs);
    if (buf == MAP_FAILED || !reqs) {
        buf = NULL;
        fprintf(stderr, "bloomery-bench: out of memory for the disk test's buffers\n");
        goto done;
    }
    if (bl_xr_register(xr, buf, buf_len, &err)) /* unregistered reads still run */
        fprintf(stderr, "bloomery-bench: %s\n", err.msg);
    const char *backend = bl_xr_backend(xr);
    const int direct = bl_xr_direct(xr, 0);
    if (md) {
        printf("| disk test | block | depth | MB/s | reads/s | reader |\n");
        printf("| --- | ---: | ---: | ---: | ---: | --- |\n");
    }
    /* sequential: the first part from its start, 16 blocks in flight */
    const uint64_t size0 = bl_xr_file_size(xr, 0);
    const uint64_t seq_end = size0 < SEQ_MAX ? size0 - size0 % SEQ_BLOCK : SEQ_MAX;
    double best = 1e30;
    for (int64_t r = 0; seq_end >= SEQ_BLOCK && r < reps; r++) {
        const double t0 = now_s();
        for (uint64_t at = 0; at < seq_end;) {
            int n = 0;
            for (; n < 16 && at < seq_end; n++, at += SEQ_BLOCK)
                reqs[n] = (bl_xr_req_t){.file = 0, .off = at, .len = SEQ_BLOCK, .buf = buf + (size_t)n * piece,
                                        .cap = piece};
            if (bl_xr_read(xr, reqs, n, &err)) {
                fprintf(stderr, "bloomery-bench: %s\n", err.msg);
                goto done;
            }
        }
        const double dt = now_s() - t0;
        best = dt < best ? dt : best;
    }
    if (seq_end >= SEQ_BLOCK)
        row(md, "sequential", SEQ_BLOCK, 16, (double)seq_end, best, (int64_t)(seq_end / SEQ_BLOCK), backend, direct);
    /* random whole experts at depths 1, 4, 16 */
    static const int depths[3] = {1, 4, 16};
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    for (int di = 0; n_x > 0 && di < 3; di++) {
        const int d = depths[di];
        int64_t count = (int64_t)(RAND_BYTES / (expert_bytes ? expert_bytes : 1));
        count = count < 64 ? 64 : count > 4096 ? 4096 : count;
        count = (count + d - 1) / d * d;
        best = 1e30;
        double bytes = 0;
        for (int64_t r = 0; r < reps; r++) {
            bytes = 0;
            const double t0 = now_s();
            for (int64_t k = 0; k < count; k += d) {
                for (int j = 0; j < d; j++) {
                    const slice3_t *s = &xs[rnd(&seed) % (uint64_t)n_x];
                    for (int i = 0; i < 3; i++) {
                        reqs[3 * j + i] = (bl_xr_req_t){.file = (int)s->part[i], .off = s->off[i], .len = s->len[i],
                                                        .buf = buf + (size_t)(3 * j + i) * piece, .cap = piece};
                        bytes += (double)s->len[i];
                    }
                }
                if (bl_xr_read(xr, reqs, 3 * d, &err)) {
                    fprintf(stderr, "bloomery-bench: %s\n", err.msg);
                    goto done;
                }
            }
            const double dt = now_s() - t0;
            best = dt < best ? dt : best;
        }
        row(md, "random experts", expert_bytes, d, bytes, best, count, backend, direct);
    }
    if (n_x == 0)
        fprintf(stderr, "bloomery-bench: %s has no routed experts: the sequential rate only\n", model);
    if (!direct)
        fprintf(stderr, "bloomery-bench: the file system refused O_DIRECT: these rates include the page cache\n");
    rc = 0;
done:
    if (buf)
        munmap(buf, buf_len);
    free(reqs);
    bl_xr_close(xr);
    free(xs);
    bl_gguf_close(g);
    return rc;
}
