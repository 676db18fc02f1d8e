/* Levelled one-line logging to stderr (common/log.h). */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

static _Atomic int g_level = BL_LOG_INFO;
static char g_name[32] = "bloomery";

static const char *const level_names[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};
static const char *const level_colored[] = {"\033[2mDEBUG\033[0m", "\033[32mINFO \033[0m",
                                            "\033[33mWARN \033[0m", "\033[31mERROR\033[0m"};
static int g_colors, g_no_time, g_no_prefix, g_json;

/* The status line (a progress bar) of a terminal: every line on a terminal starts by
 * erasing the line the cursor is on (another process's bar, or this one's) and this
 * process's status is drawn again after it. */
static pthread_mutex_t g_status_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_status[256];
static size_t g_status_len;
static _Atomic int g_tty = -1; /* stderr is a terminal that takes escapes; -1: not asked yet */

#define ERASE "\r\033[K"

static int env_off(const char *name)
{
    const char *v = getenv(name);
    return v && (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "off"));
}

static int stderr_tty(void)
{
    int t = atomic_load_explicit(&g_tty, memory_order_relaxed);
    if (t < 0) {
        const char *term = getenv("TERM");
        t = isatty(STDERR_FILENO) && term && *term && strcmp(term, "dumb") != 0;
        atomic_store_explicit(&g_tty, t, memory_order_relaxed);
    }
    return t;
}

int bl_log_terminal(void)
{
    return stderr_tty() && !g_json && bl_log_level() <= BL_LOG_INFO;
}

int bl_log_status_width(void)
{
    struct winsize ws;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) != 0 || ws.ws_col < 20)
        return 80;
    return ws.ws_col > 250 ? 250 : ws.ws_col;
}

/* Writes "erase, text (n), newline when nl, the status" as one write. */
static void term_write(const char *text, size_t n, int nl)
{
    char buf[2600];
    pthread_mutex_lock(&g_status_mu);
    size_t o = sizeof ERASE - 1;
    memcpy(buf, ERASE, o);
    n = n < sizeof buf - o - g_status_len - 1 ? n : sizeof buf - o - g_status_len - 1;
    memcpy(buf + o, text, n);
    o += n;
    if (nl)
        buf[o++] = '\n';
    memcpy(buf + o, g_status, g_status_len);
    o += g_status_len;
    ssize_t w = write(STDERR_FILENO, buf, o);
    (void)w;
    pthread_mutex_unlock(&g_status_mu);
}

void bl_log_status(const char *text)
{
    if (!bl_log_terminal())
        return;
    pthread_mutex_lock(&g_status_mu);
    g_status_len = 0;
    if (text) {
        /* printable ASCII only: a status line is never a control sequence */
        for (const char *c = text; *c && g_status_len < sizeof g_status - 1; c++)
            g_status[g_status_len++] = (*c >= 0x20 && *c < 0x7f) ? *c : '?';
    }
    pthread_mutex_unlock(&g_status_mu);
    term_write("", 0, 0);
}

void bl_log_plain(const char *text)
{
    if (bl_log_terminal())
        term_write(text, strlen(text), 1);
}

void bl_log_init(const char *name, bl_log_level_t level)
{
    if (name)
        snprintf(g_name, sizeof g_name, "%s", name);
    atomic_store_explicit(&g_level, (int)level, memory_order_relaxed);
    g_no_time = env_off("LLAMA_ARG_LOG_TIMESTAMPS");
    g_no_prefix = env_off("LLAMA_ARG_LOG_PREFIX");
    const char *f = getenv("BLOOMERY_LOG_FORMAT");
    if (f && *f)
        (void)bl_log_set_format(f);
}

int bl_log_set_format(const char *name)
{
    if (!strcmp(name, "text"))
        g_json = 0;
    else if (!strcmp(name, "json"))
        g_json = 1;
    else
        return BL_EINVAL;
    return 0;
}

/* Room a JSON line keeps while a string is written: the closing quotes, a member's
 * punctuation and the line's end always fit, so a cut line is still an object. */
#define JSON_ROOM 32

/* s (len) as a JSON string's content into out at *o (cap): quotes, backslashes and
 * control bytes escaped, bytes outside ASCII as \u00XX (so that any input gives
 * valid JSON); cut where less than JSON_ROOM would remain. */
static void json_str(char *out, size_t cap, size_t *o, const char *s, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < len && *o + JSON_ROOM < cap; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            out[(*o)++] = '\\';
            out[(*o)++] = (char)c;
        } else if (c < 0x20 || c >= 0x7f) {
            memcpy(out + *o, "\\u00", 4);
            *o += 4;
            out[(*o)++] = hex[c >> 4];
            out[(*o)++] = hex[c & 15];
        } else {
            out[(*o)++] = (char)c;
        }
    }
}

/* Punctuation (a few bytes: JSON_ROOM keeps room for it). */
static void json_lit(char *out, size_t cap, size_t *o, const char *lit)
{
    const size_t n = strlen(lit);
    if (*o + n + 2 < cap) {
        memcpy(out + *o, lit, n);
        *o += n;
    }
}

/* A key of an event's k=v: [a-z0-9_.]+ */
static size_t key_len(const char *s, size_t n)
{
    size_t k = 0;
    while (k < n && ((s[k] >= 'a' && s[k] <= 'z') || (s[k] >= '0' && s[k] <= '9') || s[k] == '_' || s[k] == '.'))
        k++;
    return k > 0 && k < n && s[k] == '=' ? k : 0;
}

/* The members of an "event=..." message: key, then its value (quoted: unescaped
 * from bl_log_escape's \" \\ \xNN; else up to the next " key=", words between
 * joining the value). */
static void json_fields(char *out, size_t cap, size_t *o, const char *m, size_t n)
{
    size_t i = 0;
    while (i < n) {
        while (i < n && m[i] == ' ')
            i++;
        const size_t k = key_len(m + i, n - i);
        if (!k || *o + 2 * JSON_ROOM >= cap) /* no room for another member: the line is cut */
            break;
        json_lit(out, cap, o, ",\"");
        json_str(out, cap, o, m + i, k);
        json_lit(out, cap, o, "\":\"");
        i += k + 1;
        if (i < n && m[i] == '"') { /* a quoted value */
            char v[1024];
            size_t vn = 0;
            for (i++; i < n && m[i] != '"' && vn < sizeof v - 1; i++) {
                if (m[i] == '\\' && i + 1 < n && m[i + 1] == 'x' && i + 3 < n) {
                    const char h[3] = {m[i + 2], m[i + 3], 0};
                    v[vn++] = (char)strtol(h, NULL, 16);
                    i += 3;
                } else if (m[i] == '\\' && i + 1 < n) {
                    v[vn++] = m[++i];
                } else {
                    v[vn++] = m[i];
                }
            }
            i++; /* the closing quote */
            json_str(out, cap, o, v, vn);
        } else if (k == 5 && !strncmp(m + i - 6, "event", 5)) { /* the event's name: one word */
            size_t j = i;
            while (j < n && m[j] != ' ')
                j++;
            json_str(out, cap, o, m + i, j - i);
            i = j;
            while (i < n && m[i] == ' ')
                i++;
            if (i < n && !key_len(m + i, n - i)) { /* words before the first key: "msg" */
                size_t e = i;
                while (e < n && !(m[e] == ' ' && key_len(m + e + 1, n - e - 1)))
                    e++;
                json_lit(out, cap, o, "\",\"msg\":\"");
                json_str(out, cap, o, m + i, e - i);
                i = e;
            }
        } else { /* to the next key=, or the end */
            size_t j = i;
            while (j < n && !(m[j] == ' ' && key_len(m + j + 1, n - j - 1)))
                j++;
            json_str(out, cap, o, m + i, j - i);
            i = j;
        }
        json_lit(out, cap, o, "\"");
    }
}

bl_log_level_t bl_log_level(void)
{
    return (bl_log_level_t)atomic_load_explicit(&g_level, memory_order_relaxed);
}

bl_log_level_t bl_log_level_of_verbosity(long long n)
{
    return n <= 0 ? BL_LOG_OFF : n == 1 ? BL_LOG_ERROR : n == 2 ? BL_LOG_WARN : n == 3 ? BL_LOG_INFO
                                                                                     : BL_LOG_DEBUG;
}

void bl_log_set_colors(int on)
{
    g_colors = on != 0;
}

void bl_log_write(bl_log_level_t level, const char *fmt, ...)
{
    if (level < BL_LOG_DEBUG || level > BL_LOG_ERROR)
        return;
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    if (g_json) {
        char msg[1536];
        va_list ap;
        va_start(ap, fmt);
        int m = vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        const size_t mn = m < 0 ? 0 : (size_t)m < sizeof msg ? (size_t)m : sizeof msg - 1;
        static const char *const lv[] = {"debug", "info", "warn", "error"};
        size_t o = (size_t)snprintf(line, sizeof line, "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"level\":\"%s\","
                                    "\"proc\":\"", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                                    tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, lv[level]);
        json_str(line, sizeof line, &o, g_name, strlen(g_name));
        json_lit(line, sizeof line, &o, "\"");
        if (mn > 6 && !strncmp(msg, "event=", 6)) {
            json_fields(line, sizeof line, &o, msg, mn);
        } else {
            json_lit(line, sizeof line, &o, ",\"msg\":\"");
            json_str(line, sizeof line, &o, msg, mn);
            json_lit(line, sizeof line, &o, "\"");
        }
        line[o++] = '}';
        line[o++] = '\n';
        ssize_t w = write(STDERR_FILENO, line, o);
        (void)w;
        return;
    }
    int n = 0;
    if (!g_no_time)
        n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ ", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
    if (n >= 0 && !g_no_prefix)
        n += snprintf(line + n, sizeof line - (size_t)n, "%s %s ", (g_colors ? level_colored : level_names)[level],
                      g_name);
    if (n < 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2; /* cut: the line still ends with its newline */
    if (stderr_tty()) {
        term_write(line, len, 1);
        return;
    }
    line[len++] = '\n';
    /* One write per line; a short write to a pipe of < PIPE_BUF bytes cannot happen. */
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w; /* nowhere to report a failed log write */
}

const char *bl_log_escape(char *buf, size_t cap, const char *s, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;
    if (cap == 0)
        return buf;
    for (size_t i = 0; i < len; i++) {
        const unsigned char c = (unsigned char)s[i];
        const size_t need = (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') ? 1 : (c == '"' || c == '\\') ? 2 : 4;
        if (o + need + 4 > cap) {
            if (o + 4 <= cap) {
                memcpy(buf + o, "...", 3);
                o += 3;
            }
            break;
        }
        if (need == 1) {
            buf[o++] = (char)c;
        } else if (need == 2) {
            buf[o++] = '\\';
            buf[o++] = (char)c;
        } else {
            buf[o++] = '\\';
            buf[o++] = 'x';
            buf[o++] = hex[c >> 4];
            buf[o++] = hex[c & 15];
        }
    }
    buf[o] = '\0';
    return buf;
}
