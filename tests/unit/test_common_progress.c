/* Tests of common/progress.c: the bar's and the event line's text at given times
 * (rate from the bytes moved since the start, resumed bytes left out; time left;
 * widths kept), byte sizes, and that away from a terminal the bar draws nothing. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "progress.h"

#define MiB ((uint64_t)1 << 20)

static bl_progress_t at(const char *label, uint64_t from, uint64_t done, uint64_t total)
{
    bl_progress_t p;
    memset(&p, 0, sizeof p);
    snprintf(p.label, sizeof p.label, "%s", label);
    p.from = from;
    p.done = done;
    p.total = total;
    p.t0_us = 1000000;
    p.started = 1;
    return p;
}

static void test_bytes(void **state)
{
    (void)state;
    char b[32];
    assert_string_equal(bl_progress_bytes(0, b, sizeof b), "0 B");
    assert_string_equal(bl_progress_bytes(1023, b, sizeof b), "1023 B");
    assert_string_equal(bl_progress_bytes(1536, b, sizeof b), "1.50 KiB");
    assert_string_equal(bl_progress_bytes(20 * MiB, b, sizeof b), "20.0 MiB");
    assert_string_equal(bl_progress_bytes(300 * MiB, b, sizeof b), "300 MiB");
    assert_string_equal(bl_progress_bytes((uint64_t)18.44 * 1024 * MiB + 450 * MiB, b, sizeof b), "18.4 GiB");
    assert_string_equal(bl_progress_bytes(UINT64_MAX, b, sizeof b), "16384 PiB"); /* the largest unit */
}

static void test_fields(void **state)
{
    (void)state;
    char f[200];
    /* 2 MiB in 2 s of 10 MiB: 1 MiB/s, 8 s left */
    bl_progress_t p = at("x", 0, 2 * MiB, 10 * MiB);
    bl_progress_format_fields(&p, 3000000, f, sizeof f);
    assert_string_equal(f, "done=2097152 total=10485760 rate_mib_s=1.0 eta_s=8.0");
    /* resumed at 4 MiB: only the bytes since count for the rate */
    p = at("x", 4 * MiB, 6 * MiB, 10 * MiB);
    bl_progress_format_fields(&p, 3000000, f, sizeof f);
    assert_string_equal(f, "done=6291456 total=10485760 rate_mib_s=1.0 eta_s=4.0 resumed_from=4194304");
    /* nothing moved yet, or no total: the time left is not known */
    p = at("x", 0, 0, 10 * MiB);
    bl_progress_format_fields(&p, 3000000, f, sizeof f);
    assert_string_equal(f, "done=0 total=10485760 rate_mib_s=0.0 eta_s=?");
    p = at("x", 0, 3 * MiB, 0);
    bl_progress_format_fields(&p, 4000000, f, sizeof f);
    assert_string_equal(f, "done=3145728 total=0 rate_mib_s=1.0 eta_s=?");
    /* a clock that has not moved gives no rate, not a division by zero */
    p = at("x", 0, 3 * MiB, 9 * MiB);
    bl_progress_format_fields(&p, 1000000, f, sizeof f);
    assert_string_equal(f, "done=3145728 total=9437184 rate_mib_s=0.0 eta_s=?");
    /* a small buffer is cut, terminated */
    char small[12];
    assert_int_equal(bl_progress_format_fields(&p, 3000000, small, sizeof small), sizeof small - 1);
    assert_int_equal(strlen(small), sizeof small - 1);
}

static void test_bar(void **state)
{
    (void)state;
    char b[256];
    bl_progress_t p = at("loading", 0, 2 * MiB, 10 * MiB);
    bl_progress_format_bar(&p, 3000000, 120, b, sizeof b);
    assert_string_equal(b, "loading [######>                       ]  20%  2.00 MiB / 10.0 MiB  1.00 MiB/s  8.0 s left");
    /* the bar keeps its length as the numbers change */
    p = at("loading", 0, 9 * MiB, 10 * MiB);
    char c[256];
    bl_progress_format_bar(&p, 10000000, 120, c, sizeof c);
    assert_int_equal(strchr(b, ']') - b, strchr(c, ']') - c);
    assert_non_null(strstr(c, " 90%"));
    /* narrow: no bar, and never past the width (a wrapped line is not redrawn in place) */
    for (int w = 20; w <= 100; w++) {
        size_t n = bl_progress_format_bar(&p, 10000000, w, c, sizeof c);
        assert_true(n <= (size_t)w);
        assert_int_equal(strlen(c), n);
    }
    bl_progress_format_bar(&p, 10000000, 40, c, sizeof c);
    assert_null(strchr(c, '['));
    /* done past the total shows 100%, never more */
    p = at("loading", 0, 11 * MiB, 10 * MiB);
    bl_progress_format_bar(&p, 3000000, 120, c, sizeof c);
    assert_non_null(strstr(c, "100%"));
    /* before anything is known */
    p = at("loading", 0, 0, 0);
    bl_progress_format_bar(&p, 3000000, 120, c, sizeof c);
    assert_string_equal(c, "loading  ...");
    /* a size not known: bytes and rate */
    p = at("downloading a.gguf", 0, 4 * MiB, 0);
    bl_progress_format_bar(&p, 3000000, 120, c, sizeof c);
    assert_string_equal(c, "downloading a.gguf  4.00 MiB  2.00 MiB/s");
    /* ended: what was moved, in how long, at what rate */
    p = at("loading", 0, 10 * MiB, 10 * MiB);
    p.ended = 1;
    bl_progress_format_bar(&p, 6000000, 120, c, sizeof c);
    assert_non_null(strstr(c, "100%  10.0 MiB in 5.0 s (2.00 MiB/s)"));
    /* long runs: minutes and hours */
    p = at("loading", 0, 1 * MiB, 1000 * MiB);
    bl_progress_format_bar(&p, 61000000, 200, c, sizeof c);
    assert_non_null(strstr(c, "16:39:00 left"));
}

/* Away from a terminal (the test's stderr is a pipe or a file) the bar mode writes
 * nothing and the line mode writes its first and last lines. */
static void test_modes_off_terminal(void **state)
{
    (void)state;
    if (isatty(STDERR_FILENO))
        skip(); /* run by hand on a terminal: the bar would be drawn */
    assert_int_equal(bl_log_terminal(), 0);
    bl_progress_t p;
    bl_progress_begin(&p, BL_PROGRESS_BAR, "loading", "event=test", 100, 0);
    assert_int_equal(p.bar, 0);
    assert_int_equal(p.lines, 0);
    bl_progress_update(&p, 50, 0);
    assert_int_equal(p.done, 50);
    assert_int_equal(p.total, 100); /* a total of 0 keeps the one known */
    bl_progress_end(&p, 1);
    assert_int_equal(p.ended, 1);
    bl_progress_update(&p, 70, 0); /* after the end: nothing */
    assert_int_equal(p.done, 50);
    bl_progress_begin(&p, BL_PROGRESS_AUTO, "loading", "event=test", 100, 10);
    assert_int_equal(p.lines, 1);
    assert_int_equal(p.done, 10);
    bl_progress_end(&p, 0);
    bl_progress_begin(&p, BL_PROGRESS_QUIET, "", "", 0, 0);
    assert_int_equal(p.lines + p.bar, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytes),
        cmocka_unit_test(test_fields),
        cmocka_unit_test(test_bar),
        cmocka_unit_test(test_modes_off_terminal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
