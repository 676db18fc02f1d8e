/* Progress of long work: a bar on a terminal, event lines elsewhere (common/progress.h). */
#include "progress.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "log.h"

#define BAR_PERIOD_US 100000 /* ten redraws a second at most */

int64_t bl_progress_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

const char *bl_progress_bytes(uint64_t bytes, char *out, size_t cap)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(out, cap, "%llu B", (unsigned long long)bytes);
    else
        snprintf(out, cap, v < 10.0 ? "%.2f %s" : v < 100.0 ? "%.1f %s" : "%.0f %s", v, unit[u]);
    return out;
}

/* Seconds since the start, and the rate of the bytes done since (the resumed bytes
 * were not moved now); 0 before a millisecond has passed. */
static double elapsed_s(const bl_progress_t *p, int64_t now_us)
{
    return now_us > p->t0_us ? (double)(now_us - p->t0_us) / 1e6 : 0.0;
}

static double rate_bps(const bl_progress_t *p, int64_t now_us)
{
    const double s = elapsed_s(p, now_us);
    const uint64_t moved = p->done > p->from ? p->done - p->from : 0;
    return s >= 0.001 && moved ? (double)moved / s : 0.0;
}

/* Seconds left at the rate so far; -1 when not known. */
static double eta_s(const bl_progress_t *p, int64_t now_us)
{
    const double r = rate_bps(p, now_us);
    if (p->total && p->done >= p->total)
        return 0.0;
    if (!p->total || r <= 0.0)
        return -1.0;
    return (double)(p->total - p->done) / r;
}

static const char *duration(double s, char *out, size_t cap)
{
    if (s < 0)
        snprintf(out, cap, "?");
    else if (s < 10)
        snprintf(out, cap, "%.1f s", s);
    else if (s < 3600)
        snprintf(out, cap, "%d:%02d", (int)s / 60, (int)s % 60);
    else
        snprintf(out, cap, "%d:%02d:%02d", (int)s / 3600, (int)s / 60 % 60, (int)s % 60);
    return out;
}

size_t bl_progress_format_bar(const bl_progress_t *p, int64_t now_us, int width, char *out, size_t cap)
{
    if (!cap)
        return 0;
    char d[24], t[24], r[24], e[24];
    const double rate = rate_bps(p, now_us);
    char tail[128];
    if (p->ended)
        snprintf(tail, sizeof tail, "%s in %s%s%s%s", bl_progress_bytes(p->done, d, sizeof d),
                 duration(elapsed_s(p, now_us), e, sizeof e), rate > 0 ? " (" : "",
                 rate > 0 ? bl_progress_bytes((uint64_t)rate, r, sizeof r) : "", rate > 0 ? "/s)" : "");
    else if (!p->total && !p->done)
        snprintf(tail, sizeof tail, "...");
    else if (p->total)
        snprintf(tail, sizeof tail, "%s / %s  %s/s  %s left", bl_progress_bytes(p->done, d, sizeof d),
                 bl_progress_bytes(p->total, t, sizeof t), bl_progress_bytes((uint64_t)rate, r, sizeof r),
                 duration(eta_s(p, now_us), e, sizeof e));
    else
        snprintf(tail, sizeof tail, "%s  %s/s", bl_progress_bytes(p->done, d, sizeof d),
                 bl_progress_bytes((uint64_t)rate, r, sizeof r));
    char bar[64] = "";
    int pct = -1;
    if (p->total) {
        const uint64_t done = p->done < p->total ? p->done : p->total;
        pct = (int)(100.0 * (double)done / (double)p->total);
        /* 30 cells, fewer where the label and a tail of about 50 columns leave less
         * (none under 10): the bar keeps its length while the numbers change */
        int cells = width - (int)strlen(p->label) - 58;
        cells = cells > 30 ? 30 : cells;
        if (cells >= 10) {
            const int full = (int)((double)cells * (double)done / (double)p->total);
            bar[0] = '[';
            for (int i = 0; i < cells; i++)
                bar[1 + i] = i < full ? '#' : i == full ? '>' : ' ';
            bar[1 + cells] = ']';
            bar[2 + cells] = 0;
        }
    }
    int n;
    if (pct >= 0)
        n = snprintf(out, cap, "%s %s%s%3d%%  %s", p->label, bar, bar[0] ? " " : "", pct, tail);
    else
        n = snprintf(out, cap, "%s  %s", p->label, tail);
    size_t len = n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
    if (width > 0 && len > (size_t)width) /* a line that wraps would not be redrawn in place */
        len = (size_t)width;
    out[len] = 0;
    return len;
}

size_t bl_progress_format_fields(const bl_progress_t *p, int64_t now_us, char *out, size_t cap)
{
    if (!cap)
        return 0;
    const double rate = rate_bps(p, now_us), eta = eta_s(p, now_us);
    char e[32] = "?";
    if (eta >= 0)
        snprintf(e, sizeof e, "%.1f", eta);
    int n = snprintf(out, cap, "done=%llu total=%llu rate_mib_s=%.1f eta_s=%s", (unsigned long long)p->done,
                     (unsigned long long)p->total, rate / 1048576.0, e);
    if (n >= 0 && (size_t)n < cap && p->from)
        n += snprintf(out + n, cap - (size_t)n, " resumed_from=%llu", (unsigned long long)p->from);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

static void draw(bl_progress_t *p, int64_t now)
{
    char line[256];
    bl_progress_format_bar(p, now, bl_log_status_width(), line, sizeof line);
    bl_log_status(line);
}

static void write_line(const bl_progress_t *p, int64_t now, bl_log_level_t level)
{
    char f[160];
    bl_progress_format_fields(p, now, f, sizeof f);
    BL_LOG(level, "%s %s", p->fields, f);
}

void bl_progress_begin(bl_progress_t *p, bl_progress_mode_t mode, const char *label, const char *fields,
                       uint64_t total, uint64_t from)
{
    memset(p, 0, sizeof *p);
    snprintf(p->label, sizeof p->label, "%s", label ? label : "");
    snprintf(p->fields, sizeof p->fields, "%s", fields ? fields : "");
    const int term = bl_log_terminal();
    p->bar = (mode == BL_PROGRESS_AUTO || mode == BL_PROGRESS_BAR) && term;
    p->lines = mode == BL_PROGRESS_LINES || (mode == BL_PROGRESS_AUTO && !term);
    p->total = total;
    p->done = p->from = from;
    p->t0_us = p->last_us = bl_progress_now_us();
    p->started = 1;
    if (p->bar)
        draw(p, p->t0_us);
    if (p->lines)
        write_line(p, p->t0_us, BL_LOG_INFO);
}

void bl_progress_update(bl_progress_t *p, uint64_t done, uint64_t total)
{
    if (!p->started || p->ended)
        return;
    p->done = done;
    if (total)
        p->total = total;
    const int64_t now = bl_progress_now_us();
    if (p->bar && now - p->last_us >= BAR_PERIOD_US) {
        draw(p, now);
        p->last_us = now;
    } else if (p->lines && (double)(now - p->last_us) >= BL_PROGRESS_PERIOD_S * 1e6) {
        write_line(p, now, BL_LOG_INFO);
        p->last_us = now;
    }
}

void bl_progress_phases(void *ud, uint64_t done, uint64_t total)
{
    bl_progress_t *p = ud;
    if (total != p->phase_total || done < p->phase_done) { /* the next phase */
        p->base += p->phase_total;
        p->phase_total = total;
    }
    p->phase_done = done;
    bl_progress_update(p, p->base + done, p->base + total);
}

void bl_progress_end(bl_progress_t *p, int ok)
{
    if (!p->started || p->ended)
        return;
    p->ended = 1;
    const int64_t now = bl_progress_now_us();
    if (p->bar) {
        char line[256], d[24];
        if (ok)
            bl_progress_format_bar(p, now, bl_log_status_width(), line, sizeof line);
        else
            snprintf(line, sizeof line, "%s: failed after %s", p->label, bl_progress_bytes(p->done, d, sizeof d));
        bl_log_status(NULL);
        bl_log_plain(line);
    }
    if (p->lines)
        write_line(p, now, ok ? BL_LOG_INFO : BL_LOG_WARN);
}
