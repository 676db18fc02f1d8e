/* bloomery-bench --disk (bench_disk.c). */
#ifndef BENCH_DISK_H
#define BENCH_DISK_H

#include <stdint.h>

/* The model file's read rates through the pager's reader (common/xread.c, O_DIRECT
 * where the file system takes it): sequential 1 MiB reads, and random whole routed
 * experts (each expert's gate, up and down slices, as the pager reads them) at depths
 * 1, 4 and 16; the best of reps runs, as table rows (md) or JSON lines. Returns 0, or
 * 1 after printing why it could not run. */
int bench_disk(const char *model, int64_t reps, int md);

#endif
