/* Tests of common/args.c: spellings, values, environment variables and the errors
 * that name the flag. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "args.h"

typedef struct opts {
    const char *model;
    int64_t threads;
    float temp;
    int chat;
    int calls;
} opts_t;

static int count_call(void *ud, const char *value, bl_err_t *err)
{
    opts_t *o = ud;
    if (!strcmp(value, "bad"))
        return bl_err_set(err, BL_EINVAL, "'bad' is refused");
    o->calls++;
    return 0;
}

static int parse(opts_t *o, int argc, char **argv, int *n_pos, bl_err_t *err)
{
    memset(o, 0, sizeof *o);
    o->threads = 4;
    bl_arg_t args[] = {
        {"-m,--model", "BLTEST_MODEL", BL_ARG_STR, &o->model, .metavar = "FILE", .help = "model"},
        {"-t,--threads", "BLTEST_THREADS", BL_ARG_I64, &o->threads, 1, 64, .metavar = "N"},
        {"--temp", NULL, BL_ARG_F32, &o->temp, .fmin = 0, .fmax = 2, .metavar = "T"},
        {"-cnv,--chat", "BLTEST_CHAT", BL_ARG_FLAG, &o->chat},
        {"-x", NULL, BL_ARG_FN, NULL, .fn = count_call, .ud = o, .metavar = "V"},
    };
    int help = 0;
    return bl_args_parse(args, 5, argc, argv, n_pos, &help, err);
}

static void test_args_short_long_and_equals(void **state)
{
    (void)state;
    char *argv[] = {"prog", "-m", "a.gguf", "--threads=8", "--temp", "0.5", "-cnv", NULL};
    opts_t o;
    bl_err_t err = {0};
    assert_int_equal(parse(&o, 7, argv, NULL, &err), 0);
    assert_string_equal(o.model, "a.gguf");
    assert_int_equal(o.threads, 8);
    assert_float_equal(o.temp, 0.5f, 0);
    assert_int_equal(o.chat, 1);
}

static void test_args_unknown_flag_is_named(void **state)
{
    (void)state;
    char *argv[] = {"prog", "--nope", NULL};
    opts_t o;
    bl_err_t err = {0};
    assert_int_equal(parse(&o, 2, argv, NULL, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "--nope"));
}

static void test_args_missing_value_is_named(void **state)
{
    (void)state;
    char *argv[] = {"prog", "-m", NULL};
    opts_t o;
    bl_err_t err = {0};
    assert_int_equal(parse(&o, 2, argv, NULL, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "-m"));
}

static void test_args_rejects_out_of_range_and_garbage(void **state)
{
    (void)state;
    const char *bad[][2] = {{"-t", "0"}, {"-t", "65"}, {"-t", "8x"}, {"-t", ""},
                            {"--temp", "3"}, {"--temp", "nan"}, {"--temp", "inf"}, {"-x", "bad"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *argv[] = {"prog", (char *)bad[i][0], (char *)bad[i][1], NULL};
        opts_t o;
        bl_err_t err = {0};
        assert_int_equal(parse(&o, 3, argv, NULL, &err), BL_EINVAL);
        /* the message names the flag by its long spelling when it has one */
        const char *want = !strcmp(bad[i][0], "-t") ? "--threads" : bad[i][0];
        if (!strstr(err.msg, want))
            fail_msg("'%s %s': message does not name %s: %s", bad[i][0], bad[i][1], want, err.msg);
    }
}

static void test_args_flag_takes_no_value(void **state)
{
    (void)state;
    char *argv[] = {"prog", "--chat=1", NULL};
    opts_t o;
    bl_err_t err = {0};
    assert_int_equal(parse(&o, 2, argv, NULL, &err), BL_EINVAL);
}

static void test_args_environment_then_command_line(void **state)
{
    (void)state;
    setenv("BLTEST_THREADS", "16", 1);
    setenv("BLTEST_MODEL", "env.gguf", 1);
    setenv("BLTEST_CHAT", "true", 1);
    char *argv[] = {"prog", "-t", "2", NULL};
    opts_t o;
    bl_err_t err = {0};
    assert_int_equal(parse(&o, 3, argv, NULL, &err), 0);
    assert_int_equal(o.threads, 2);        /* the command line wins */
    assert_string_equal(o.model, "env.gguf");
    assert_int_equal(o.chat, 1);
    setenv("BLTEST_THREADS", "many", 1);
    char *argv2[] = {"prog", NULL};
    assert_int_equal(parse(&o, 1, argv2, NULL, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "BLTEST_THREADS"));
    setenv("BLTEST_THREADS", "3", 1);
    setenv("BLTEST_CHAT", "perhaps", 1);
    assert_int_equal(parse(&o, 1, argv2, NULL, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "BLTEST_CHAT"));
    unsetenv("BLTEST_THREADS");
    unsetenv("BLTEST_MODEL");
    unsetenv("BLTEST_CHAT");
}

static void test_args_positionals(void **state)
{
    (void)state;
    char *argv[] = {"prog", "info", "-t", "3", "file.gguf", "--", "-m", NULL};
    opts_t o;
    bl_err_t err = {0};
    int n = -1;
    assert_int_equal(parse(&o, 7, argv, &n, &err), 0);
    assert_int_equal(n, 3);
    assert_string_equal(argv[1], "info");
    assert_string_equal(argv[2], "file.gguf");
    assert_string_equal(argv[3], "-m");
    char *argv2[] = {"prog", "stray", NULL};
    assert_int_equal(parse(&o, 2, argv2, NULL, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "stray"));
}

static void test_args_fn_is_called_per_use(void **state)
{
    (void)state;
    char *argv[] = {"prog", "-x", "a", "-x", "b", NULL};
    opts_t o;
    bl_err_t err = {0};
    assert_int_equal(parse(&o, 5, argv, NULL, &err), 0);
    assert_int_equal(o.calls, 2);
}

static void test_args_number_parsers(void **state)
{
    (void)state;
    int64_t i;
    float f;
    assert_int_equal(bl_parse_i64("010", &i), 0); /* base 10, as llama.cpp */
    assert_int_equal(i, 10);
    assert_int_not_equal(bl_parse_i64("0x10", &i), 0);
    assert_int_equal(bl_parse_i64("-5", &i), 0);
    assert_int_equal(i, -5);
    assert_int_not_equal(bl_parse_i64("99999999999999999999", &i), 0);
    assert_int_not_equal(bl_parse_i64("1 ", &i), 0);
    assert_int_equal(bl_parse_f32("1e-3", &f), 0);
    assert_float_equal(f, 1e-3f, 0);
    assert_int_not_equal(bl_parse_f32("1e99", &f), 0);
    assert_int_not_equal(bl_parse_f32("", &f), 0);
    double d;
    assert_int_equal(bl_parse_f64("1e12", &d), 0);
    assert_true(d == 1e12);
    assert_int_not_equal(bl_parse_f64("1e999", &d), 0);
    assert_int_not_equal(bl_parse_f64("2x", &d), 0);
}

static void test_args_double_values_and_range(void **state)
{
    (void)state;
    double base = 0;
    bl_arg_t args[] = {{"--rope-base", NULL, BL_ARG_F64, &base, .fmin = 1e-3, .fmax = 1e12}};
    char *ok[] = {"prog", "--rope-base", "1e7", NULL};
    bl_err_t err = {0};
    assert_int_equal(bl_args_parse(args, 1, 3, ok, NULL, NULL, &err), 0);
    assert_true(base == 1e7);
    char *bad[] = {"prog", "--rope-base=1e13", NULL};
    assert_int_equal(bl_args_parse(args, 1, 2, bad, NULL, NULL, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "--rope-base"));
}

static void test_args_shared_parsers(void **state)
{
    (void)state;
    bl_err_t err = {0};
    int fa = -1;
    static const struct {
        const char *v;
        int want;
    } ok[] = {{"on", BL_FLASH_ON},   {"1", BL_FLASH_ON},    {"true", BL_FLASH_ON},
              {"off", BL_FLASH_OFF}, {"0", BL_FLASH_OFF},   {"false", BL_FLASH_OFF},
              {"auto", BL_FLASH_AUTO}};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        assert_int_equal(bl_arg_flash_attn(&fa, ok[i].v, &err), 0);
        assert_int_equal(fa, ok[i].want);
    }
    assert_int_equal(bl_arg_flash_attn(&fa, "yes", &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "yes"));
    assert_int_equal(bl_arg_flash_attn(&fa, "", &err), BL_EINVAL);
}

/* Sizes are MiB unless a K, M or G suffix says otherwise; anything else is refused. */
static void test_args_size_mib_and_suffixes(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        int64_t bytes;
    } ok[] = {{"0", 0},
              {"512", (int64_t)512 << 20},
              {"2G", (int64_t)2 << 30},
              {"2g", (int64_t)2 << 30},
              {"1536M", (int64_t)1536 << 20},
              {"64K", 64 << 10},
              {"010", (int64_t)10 << 20},
              {"8589934591G", (int64_t)8589934591 << 30}};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        int64_t b = -7;
        assert_int_equal(bl_parse_size_mib(ok[i].s, &b), 0);
        assert_true(b == ok[i].bytes);
    }
    static const char *const bad[] = {"", "-5", "+5", " 5", "5 ", "12Q", "2GB", "2GiB", "1.5G", "G", "0x10", "auto"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int64_t b = -7;
        assert_int_equal(bl_parse_size_mib(bad[i], &b), BL_EINVAL);
        assert_true(b == -7);
    }
    int64_t b = 0;
    assert_int_equal(bl_parse_size_mib("8589934592G", &b), BL_ERANGE);      /* 2^63 bytes */
    assert_int_equal(bl_parse_size_mib("99999999999999999999", &b), BL_ERANGE);
    assert_int_equal(bl_parse_size_mib(NULL, &b), BL_EINVAL);
}

/* --experts-vram: auto, or a size; a bad value names itself, through the table the
 * flag's name too. */
static void test_args_experts_vram(void **state)
{
    (void)state;
    bl_err_t err = {0};
    int64_t v = 0;
    assert_int_equal(bl_arg_experts_vram(&v, "auto", &err), 0);
    assert_true(v == BL_EXPERTS_VRAM_AUTO);
    assert_int_equal(bl_arg_experts_vram(&v, "0", &err), 0);
    assert_true(v == 0);
    assert_int_equal(bl_arg_experts_vram(&v, "2G", &err), 0);
    assert_true(v == (int64_t)2 << 30);
    assert_int_equal(bl_arg_experts_vram(&v, "-5", &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "negative"));
    assert_int_equal(bl_arg_experts_vram(&v, "99999999999G", &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "64 bits"));
    assert_true(v == (int64_t)2 << 30);
    bl_arg_t args[] = {{"--experts-vram", NULL, BL_ARG_FN, NULL, .fn = bl_arg_experts_vram, .ud = &v}};
    char *argv[] = {"prog", "--experts-vram", "12Q", NULL};
    assert_int_equal(bl_args_parse(args, 1, 3, argv, NULL, NULL, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "--experts-vram"));
    assert_non_null(strstr(err.msg, "12Q"));
    char *eq[] = {"prog", "--experts-vram=512", NULL};
    assert_int_equal(bl_args_parse(args, 1, 2, eq, NULL, NULL, &err), 0);
    assert_true(v == (int64_t)512 << 20);
}

static void test_args_help_and_version(void **state)
{
    (void)state;
    int flag = 0, help = 0;
    bl_arg_t args[] = {{"-v", NULL, BL_ARG_FLAG, &flag}};
    bl_err_t err = {0};
    char *a1[] = {"/usr/bin/prog", "--version", NULL};
    assert_int_equal(bl_args_parse(args, 1, 2, a1, NULL, &help, &err), 0);
    assert_int_equal(help, BL_ARGS_VERSION);
    char *a2[] = {"prog", "-h", "-v", NULL};
    help = 0;
    assert_int_equal(bl_args_parse(args, 1, 3, a2, NULL, &help, &err), 0);
    assert_int_equal(help, 1);
    assert_int_equal(flag, 1);
    /* without a help pointer both are unknown flags */
    assert_int_equal(bl_args_parse(args, 1, 2, a1, NULL, NULL, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, "--version"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_args_short_long_and_equals),
        cmocka_unit_test(test_args_unknown_flag_is_named),
        cmocka_unit_test(test_args_missing_value_is_named),
        cmocka_unit_test(test_args_rejects_out_of_range_and_garbage),
        cmocka_unit_test(test_args_flag_takes_no_value),
        cmocka_unit_test(test_args_environment_then_command_line),
        cmocka_unit_test(test_args_positionals),
        cmocka_unit_test(test_args_fn_is_called_per_use),
        cmocka_unit_test(test_args_number_parsers),
        cmocka_unit_test(test_args_double_values_and_range),
        cmocka_unit_test(test_args_shared_parsers),
        cmocka_unit_test(test_args_size_mib_and_suffixes),
        cmocka_unit_test(test_args_experts_vram),
        cmocka_unit_test(test_args_help_and_version),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
