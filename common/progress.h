/* Progress of long work (loading weights, downloading a model, the disk tier's first
 * fill) as people and log collectors want it: on a terminal a bar on the log's status
 * line (common/log.h: log lines scroll above it), elsewhere an event line every
 * BL_PROGRESS_PERIOD_S seconds, with the first and the last always written:
 *   event=download file=model.gguf done=1048576 total=4194304 rate_mib_s=12.5 eta_s=0.2
 * The caller gives the event and its fixed fields; done, total, the rate (bytes since
 * the start over the time since the start, resumed bytes not counted), the time left
 * at that rate and resumed_from (when the work resumed past 0) are appended. One
 * bl_progress_t is used by one thread at a time. */
#ifndef BL_PROGRESS_H
#define BL_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

/* Bytes done of total; total 0 where not known. Called by long work at most a few
 * times a second, always once at its end. */
typedef void (*bl_progress_fn)(void *ud, uint64_t done, uint64_t total);

#define BL_PROGRESS_PERIOD_S 2.0

typedef enum bl_progress_mode {
    BL_PROGRESS_AUTO = 0,  /* the bar on a terminal, else event lines */
    BL_PROGRESS_LINES = 1, /* event lines only (several at once: a bar shows their sum) */
    BL_PROGRESS_BAR = 2,   /* the bar on a terminal, else nothing */
    BL_PROGRESS_QUIET = 3, /* neither: the caller writes what it wants with the formats below */
} bl_progress_mode_t;

typedef struct bl_progress {
    char fields[192];   /* "event=download file=model.gguf": escaped by the caller */
    char label[64];     /* the bar's words: "loading", "downloading model.gguf" */
    uint64_t total, done, from;
    int64_t t0_us, last_us;
    int bar, lines;     /* what this one writes */
    int started, ended;
    uint64_t base, phase_total, phase_done; /* bl_progress_phases */
} bl_progress_t;

/* Starts p: from is where resumed work starts (0: from the beginning); draws the bar
 * or writes the first line. */
void bl_progress_begin(bl_progress_t *p, bl_progress_mode_t mode, const char *label, const char *fields,
                       uint64_t total, uint64_t from);

/* Records done of total (a total of 0 keeps the one known); redraws the bar at most
 * ten times a second, writes a line at most every BL_PROGRESS_PERIOD_S seconds. */
void bl_progress_update(bl_progress_t *p, uint64_t done, uint64_t total);

/* Ends p: the last line (or the bar's final state, left on the screen) and ok 0
 * says the work failed. */
void bl_progress_end(bl_progress_t *p, int ok);

/* A bl_progress_fn over ud, a started bl_progress_t, for work in phases that each
 * count from 0 to their own total (a store's copy, then a model's): each phase's
 * bytes add to the phases before, so done never goes back. */
void bl_progress_phases(void *ud, uint64_t done, uint64_t total);

/* The text of the bar as it would be drawn at now_us, width columns at most: label,
 * a bar where total is known, percent, bytes, rate, time left (or the time taken once
 * ended). For tests and for other status lines. */
size_t bl_progress_format_bar(const bl_progress_t *p, int64_t now_us, int width, char *out, size_t cap);

/* The event line's fields after p->fields: "done=.. total=.. rate_mib_s=.. eta_s=.."
 * (eta_s=? while the rate or the total is unknown) and " resumed_from=.." where from
 * is past 0. */
size_t bl_progress_format_fields(const bl_progress_t *p, int64_t now_us, char *out, size_t cap);

/* The clock of t0_us and the formats' now_us (CLOCK_MONOTONIC, microseconds). */
int64_t bl_progress_now_us(void);

/* bytes as "812 B", "1.5 KiB", ..., "18.4 GiB". */
const char *bl_progress_bytes(uint64_t bytes, char *out, size_t cap);

#endif
