/* Levelled one-line logging to stderr (common/log.h). */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static _Atomic int g_level = BL_LOG_INFO;
static char g_name[32] = "bloomery";

static const char *const level_names[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};
static const char *const level_colored[] = {"\033[2mDEBUG\033[0m", "\033[32mINFO \033[0m",
                                            "\033[33mWARN \033[0m", "\033[31mERROR\033[0m"};
static int g_colors, g_no_time, g_no_prefix;

static int env_off(const char *name)
{
    const char *v = getenv(name);
    return v && (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "off"));
}

void bl_log_init(const char *name, bl_log_level_t level)
{
    if (name)
        snprintf(g_name, sizeof g_name, "%s", name);
    atomic_store_explicit(&g_level, (int)level, memory_order_relaxed);
    g_no_time = env_off("LLAMA_ARG_LOG_TIMESTAMPS");
    g_no_prefix = env_off("LLAMA_ARG_LOG_PREFIX");
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
