/* Levelled one-line logs for the daemons (bloomery-serve, -worker, -hosttier):
 *   2026-11-30T12:00:00.123Z INFO  serve event=listening addr=127.0.0.1:8080
 * to stderr, one write(2) per line so that lines of several processes sharing a
 * terminal never interleave. The level is checked before the arguments are
 * formatted (BL_LOG is a macro), so a DEBUG line costs a compare when it is off.
 * Untrusted text goes through bl_log_escape first. Thread-safe. */
#ifndef BL_LOG_H
#define BL_LOG_H

#include <stddef.h>

#include "err.h"

typedef enum bl_log_level {
    BL_LOG_DEBUG = 0,
    BL_LOG_INFO = 1,
    BL_LOG_WARN = 2,
    BL_LOG_ERROR = 3,
    BL_LOG_OFF = 4,
} bl_log_level_t;

/* Process-wide settings: the lowest level written (default INFO) and the name put
 * on every line ("serve", "worker0", "hosttier"; default "bloomery"). The line's
 * time and its level-and-name prefix are left out where LLAMA_ARG_LOG_TIMESTAMPS or
 * LLAMA_ARG_LOG_PREFIX is 0, false or off (read here, so that the processes a server
 * starts follow its --no-log-timestamps and --no-log-prefix). Call before other
 * threads log. */
void bl_log_init(const char *name, bl_log_level_t level);

/* The line format, also from BLOOMERY_LOG_FORMAT (read by bl_log_init, so that the
 * processes a server starts follow its --log-format): text (the default, above) or
 * json, one object a line for log collectors:
 *   {"ts":"2026-11-30T12:00:00.123Z","level":"info","proc":"serve","event":"listening",
 *    "addr":"127.0.0.1:8080"}
 * An "event=NAME k=v ..." message gives "event" and one member a key (a quoted value
 * unescaped; words after a value without '=' belong to it); any other message goes
 * in "msg". Values are strings; no colours. Returns BL_EINVAL for another name. */
int bl_log_set_format(const char *name);
bl_log_level_t bl_log_level(void);

/* llama.cpp's verbosity threshold (-lv N: 0 generic output, 1 error, 2 warning, 3 info,
 * 4 debug; lines above N are dropped) as a level: N <= 0 OFF, 1 ERROR, 2 WARN, 3 INFO,
 * N >= 4 DEBUG. */
bl_log_level_t bl_log_level_of_verbosity(long long n);

/* Level names in ANSI colours (ERROR red, WARN yellow, DEBUG dim) when on is 1;
 * default off. Call before other threads log. */
void bl_log_set_colors(int on);

void bl_log_write(bl_log_level_t level, const char *fmt, ...) BL_PRINTF(2, 3);

/* Whether stderr is a terminal that takes escapes (TERM set and not "dumb"), the
 * format is text and INFO lines are written: where a progress bar is drawn. On a
 * terminal every line starts by erasing the line under the cursor, so that a line
 * of any process sharing it replaces a bar instead of running into it. */
int bl_log_terminal(void);

/* The terminal's width in columns (80 where not known). */
int bl_log_status_width(void);

/* The status line under the log on a terminal (common/progress.h's bar): text
 * (printable ASCII; NULL or "" clears it) is drawn now and again after every line
 * this process writes. Nothing where bl_log_terminal() is 0. */
void bl_log_status(const char *text);

/* text as a line of its own, no time or level (a bar's final state), on a terminal
 * only. */
void bl_log_plain(const char *text);

#define BL_LOG(level, ...)                                                                         \
    do {                                                                                           \
        if ((level) >= bl_log_level())                                                             \
            bl_log_write((level), __VA_ARGS__);                                                    \
    } while (0)

/* Copies at most max_in bytes of untrusted text into buf (cap bytes, NUL-terminated)
 * with quotes, backslashes and bytes outside printable ASCII written as \xNN, and
 * "..." when cut. Returns buf. */
const char *bl_log_escape(char *buf, size_t cap, const char *s, size_t len);

#endif
