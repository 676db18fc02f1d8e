/* bloomery-bench --kernels (bench_kernels.c). */
#ifndef BENCH_KERNELS_H
#define BENCH_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* For each thread count, format (q4_K, q5_K, q6_K, q8_0, mxfp4), kernel set the CPU has
 * and rows per expert: the best of reps passes over buf_bytes of random expert
 * weights, printed as a table row (md) or a JSON line, beside read_bw(threads)
 * (NULL: not measured). Returns 0, or 1 after printing why it could not run. */
int bench_kernels(const int64_t *threads, int n_threads, const int64_t *rows, int n_rows, int64_t reps,
                  size_t buf_bytes, double (*read_bw)(int), int md);

#endif
