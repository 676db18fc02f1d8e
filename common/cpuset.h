/* The CPUs a program's threads run on, with llama.cpp's flags: -C/--cpu-mask (a hex
 * mask of any length, CPU 0 in the lowest bit, "0x" optional), -Cr/--cpu-range
 * (lo-hi), the two complementing each other, and --cpu-strict 0|1. The mask is the
 * process's affinity, set once at start and inherited by the processes it starts;
 * --cpu-strict reaches each process in its plan and pins every thread of a compute
 * pool to one CPU of that set, in order (kcpu_pool_pin_strict). */
#ifndef BL_CPUSET_H
#define BL_CPUSET_H

#include <sched.h>
#include <stdint.h>

#include "args.h"
#include "err.h"

/* The flags as given (NULL / 0: not given). */
typedef struct bl_cpu_flags {
    const char *mask, *range;
    int64_t strict;
    int64_t prio; /* --prio: -1 low, 0 normal, 1 medium, 2 high, 3 realtime */
    int numa;     /* --numa: BL_NUMA_* */
} bl_cpu_flags_t;

/* --numa, as llama.cpp's: none (not given); distribute: memory pages interleaved over
 * the NUMA nodes of the process's CPUs (threads on all of them); isolate: the process
 * (and the processes it starts) on the CPUs of the node it started on, its memory
 * preferred there; numactl: the CPUs and memory policy numactl (or any launcher)
 * gave, unchanged. */
enum { BL_NUMA_NONE, BL_NUMA_DISTRIBUTE, BL_NUMA_ISOLATE, BL_NUMA_NUMACTL };
#define BL_NUMA_MAX_NODES 64

/* The CPUs of each NUMA node from ROOT/nodeN/cpulist (ROOT: /sys/devices/system/node,
 * or another for tests) into nodes[0..cap); returns one more than the highest node
 * found (0: no topology, as on a kernel without NUMA), a missing node's set empty. */
int bl_numa_nodes(const char *root, cpu_set_t *nodes, int cap);

/* What --numa mode does to a process that may run on allowed and runs on CPU cur,
 * for nodes (n of them): *cpus the CPUs it keeps, *mem the nodes (a bit each) its
 * memory policy names. Returns the mempolicy mode for set_mempolicy (MPOL_*), or -1
 * for none (numactl, or no topology). */
int bl_numa_decide(int mode, const cpu_set_t *nodes, int n, const cpu_set_t *allowed, int cur, cpu_set_t *cpus,
                   uint64_t *mem);

/* Appends -C,--cpu-mask, -Cr,--cpu-range, --cpu-strict, --prio and --numa to
 * a[*n..cap), into f (f must outlive the parse). BL_ERANGE when cap is too small. */
int bl_cpu_args(bl_arg_t *a, int *n, int cap, bl_cpu_flags_t *f) BL_WUR;

/* ORs the CPUs of a hex mask / of "lo-hi" into s. BL_EINVAL naming the flag for a
 * value that does not parse, BL_ERANGE for a CPU past CPU_SETSIZE. */
int bl_cpu_mask_parse(cpu_set_t *s, const char *hex, bl_err_t *err) BL_WUR;
int bl_cpu_range_parse(cpu_set_t *s, const char *lohi, bl_err_t *err) BL_WUR;

/* The CPUs f selects into *s and whether any flag gave some (0: s is untouched).
 * BL_EINVAL for a value that does not parse or selects no CPU, BL_ENOTSUP for CPUs
 * this process may not run on (naming the first). */
int bl_cpu_flags_set(const bl_cpu_flags_t *f, cpu_set_t *s, bl_err_t *err) BL_WUR;

/* Applies f at start: the process's affinity to the CPUs it selects, its priority
 * and --numa's CPUs and memory policy (the threads and processes started later
 * inherit all of them). A memory policy the system refuses is logged. 0 when nothing
 * was given or it is set; the errors of bl_cpu_flags_set, or BL_EIO when the system
 * refuses the CPUs. A priority the system refuses (raising it needs the privilege)
 * is logged and the program goes on, as llama.cpp does. */
int bl_cpu_flags_apply(const bl_cpu_flags_t *f, bl_err_t *err) BL_WUR;

/* The default thread count, as llama.cpp's: one thread per physical core among the
 * CPUs this process may run on (hyperthread siblings count once), read from
 * ROOT/cpuN/topology/{physical_package_id,core_id} (ROOT: /sys/devices/system/cpu,
 * or another for tests); the CPU count where the topology cannot be read. At least 1. */
int bl_cpu_default_threads(void);
/* The CPUs this process may run on (its affinity: what its threads, and the processes
 * it starts, can use); the online CPUs where the affinity cannot be read. At least 1. */
int bl_cpu_count(void);
int bl_cpu_physical_cores(const char *root, const cpu_set_t *allowed);

/* s as a list ("0-3,8"), for logs; "" for an empty set. */
void bl_cpu_list(const cpu_set_t *s, char *buf, size_t cap);

#endif
