/* Tests of common/hostfile.c: good hostfiles (one host, two hosts, IPv6, comments,
 * tabs and CRLF, options, the limits reached exactly), then every kind of bad line and
 * broken rule, each refused with BL_EINVAL at the right line, and failing allocations.
 * hostfile.c is included (not linked) so that its allocations can be made to fail. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

/* --- allocation failure injection ------------------------------------------------ */

/* Allocations hostfile.c may still make before they fail; negative is unlimited. */
static long alloc_budget = -1;

static int take_budget(void)
{
    if (alloc_budget == 0)
        return 0;
    if (alloc_budget > 0)
        alloc_budget--;
    return 1;
}
static void *failing_malloc(size_t n) { return take_budget() ? malloc(n) : NULL; }
static void *failing_calloc(size_t n, size_t m) { return take_budget() ? calloc(n, m) : NULL; }
static void *failing_realloc(void *p, size_t n) { return take_budget() ? realloc(p, n) : NULL; }

#define malloc(n) failing_malloc(n)
#define calloc(n, m) failing_calloc(n, m)
#define realloc(p, n) failing_realloc(p, n)
#include "../../common/hostfile.c"
#undef malloc
#undef calloc
#undef realloc

/* --- helpers --------------------------------------------------------------------- */

static void parse_ok(const char *text, bl_hostfile_t *h)
{
    bl_err_t err = {0};
    const int rc = bl_hostfile_parse(text, strlen(text), "good.txt", h, &err);
    if (rc != 0)
        fail_msg("refused (%d): %s\n--- text ---\n%s", rc, err.msg, text);
}

/* Parses n bytes and expects BL_EINVAL, a message beginning "bad.txt:LINE: " (line 0:
 * "bad.txt: ") that holds word, and nothing left in *out. */
static void expect_bad_n(const char *text, size_t n, int line, const char *word)
{
    bl_hostfile_t h = {(bl_host_entry_t *)1, 7};
    bl_err_t err = {0};
    const int rc = bl_hostfile_parse(text, n, "bad.txt", &h, &err);
    char prefix[64];
    if (line > 0)
        snprintf(prefix, sizeof prefix, "bad.txt:%d: ", line);
    else
        snprintf(prefix, sizeof prefix, "bad.txt: ");
    if (rc != BL_EINVAL || strncmp(err.msg, prefix, strlen(prefix)) != 0 || !strstr(err.msg, word))
        fail_msg("want BL_EINVAL, '%s...' with '%s'; got %d: %s\n--- text ---\n%.300s", prefix, word, rc, err.msg,
                 text);
    assert_null(h.e);
    assert_int_equal(h.n, 0);
}

static void expect_bad(const char *text, int line, const char *word) { expect_bad_n(text, strlen(text), line, word); }

/* A growing text buffer for the large inputs. */
typedef struct text {
    char *p;
    size_t n, cap;
} text_t;

static void add(text_t *t, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        const int k = vsnprintf(t->p ? t->p + t->n : NULL, t->p ? t->cap - t->n : 0, fmt, ap);
        va_end(ap);
        assert_true(k >= 0);
        if (t->p && (size_t)k < t->cap - t->n) {
            t->n += (size_t)k;
            return;
        }
        t->cap = (t->cap + (size_t)k + 1) * 2;
        t->p = realloc(t->p, t->cap);
        assert_non_null(t->p);
    }
}

/* --- good files ------------------------------------------------------------------ */

static void test_hostfile_one_host_two_gpus(void **state)
{
    (void)state;
    bl_hostfile_t h;
    parse_ok("127.0.0.1 8090 router\n"
             "127.0.0.1 9000 worker 0\n"
             "127.0.0.1 9001 worker 1\n"
             "127.0.0.1 9100 hosttier\n",
             &h);
    assert_int_equal(h.n, 4);
    const bl_host_entry_t *r = bl_hostfile_router(&h);
    assert_ptr_equal(r, &h.e[0]);
    assert_string_equal(r->host, "127.0.0.1");
    assert_int_equal(r->port, 8090);
    assert_int_equal(r->n_gpus, 0);
    assert_int_equal(r->line, 1);
    assert_int_equal(h.e[1].role, BL_HOST_WORKER);
    assert_int_equal(h.e[1].n_gpus, 1);
    assert_int_equal(h.e[1].gpus[0], 0);
    assert_int_equal(h.e[2].gpus[0], 1);
    assert_int_equal(h.e[2].port, 9001);
    assert_int_equal(h.e[3].role, BL_HOST_HOSTTIER);
    assert_int_equal(h.e[3].line, 4);
    for (int i = 0; i < h.n; i++) {
        assert_int_equal(h.e[i].threads, 0);
        assert_int_equal(h.e[i].layer_begin, -1);
        assert_int_equal(h.e[i].layer_end, -1);
        assert_string_equal(h.e[i].name, "");
        assert_int_equal(h.e[i].all_gpus, 0);
    }
    bl_hostfile_free(&h);
    assert_null(h.e);
    assert_int_equal(h.n, 0);
}

static void test_hostfile_two_hosts(void **state)
{
    (void)state;
    bl_hostfile_t h;
    parse_ok("spark-a 8090 router\n"
             "spark-a 9000 worker all layers=0-24\n"
             "spark-b 9000 worker 0,1 layers=24-48\n" /* the same port on another host */
             "spark-a 9100 hosttier\n"
             "spark-b 9100 hosttier\n"
             "10.0.0.3 9000 worker cpu layers=48-60\n",
             &h);
    assert_int_equal(h.n, 6);
    assert_int_equal(h.e[1].all_gpus, 1);
    assert_int_equal(h.e[1].n_gpus, 0);
    assert_int_equal(h.e[2].n_gpus, 2);
    assert_int_equal(h.e[2].gpus[0], 0);
    assert_int_equal(h.e[2].gpus[1], 1);
    assert_int_equal(h.e[2].layer_begin, 24);
    assert_int_equal(h.e[2].layer_end, 48);
    assert_int_equal(h.e[5].n_gpus, 0);
    assert_int_equal(h.e[5].all_gpus, 0);
    assert_int_equal(h.e[5].layer_end, 60);
    bl_hostfile_free(&h);
}

/* The same GPU ordinal on two hosts, and CPU workers beside a worker with all GPUs,
 * share nothing. */
static void test_hostfile_gpus_are_per_host(void **state)
{
    (void)state;
    bl_hostfile_t h;
    parse_ok("a 1 router\n"
             "a 2 worker 0\n"
             "b 2 worker 0\n"
             "c 2 worker all\n"
             "c 5 worker\n"
             "c 8 worker cpu\n",
             &h);
    assert_int_equal(h.n, 6);
    bl_hostfile_free(&h);
}

static void test_hostfile_ipv6(void **state)
{
    (void)state;
    bl_hostfile_t h;
    parse_ok("[::1] 8090 router\n"
             "[0:0::1] 9000 worker 0\n" /* the same address, another port */
             "[FE80::1] 9000 worker\n"
             "[::ffff:10.0.0.1] 9000 hosttier\n",
             &h);
    assert_string_equal(h.e[0].host, "::1");
    assert_string_equal(h.e[1].host, "::1");
    assert_string_equal(h.e[2].host, "fe80::1");
    assert_string_equal(h.e[3].host, "::ffff:10.0.0.1");
    /* a host's workers, however its address is written */
    const bl_host_entry_t *p = bl_hostfile_next(&h, NULL, "[0::1]", BL_HOST_WORKER);
    assert_ptr_equal(p, &h.e[1]);
    assert_null(bl_hostfile_next(&h, p, "::1", BL_HOST_WORKER));
    assert_ptr_equal(bl_hostfile_next(&h, NULL, "fe80:0::1", 0), &h.e[2]);
    assert_null(bl_hostfile_next(&h, NULL, "[nonsense:]", 0));
    bl_hostfile_free(&h);
}

static void test_hostfile_comments_tabs_crlf(void **state)
{
    (void)state;
    bl_hostfile_t h;
    parse_ok("\xef\xbb\xbf# the cluster: caf\xc3\xa9 \xe2\x9c\x93\r\n"
             "\r\n"
             "   \t \r\n"
             "node1\t8090\trouter   # the front\r\n"
             "\t node1 9000 \t worker\t0#no space before the comment\r\n"
             "#node1 9001 worker 1\r\n"
             "node1 9002 worker 1", /* no line end at the end */
             &h);
    assert_int_equal(h.n, 3);
    assert_int_equal(h.e[0].line, 4);
    assert_string_equal(h.e[0].host, "node1");
    assert_int_equal(h.e[0].role, BL_HOST_ROUTER);
    assert_int_equal(h.e[1].line, 5);
    assert_int_equal(h.e[1].gpus[0], 0);
    assert_int_equal(h.e[2].line, 7);
    assert_int_equal(h.e[2].port, 9002);
    bl_hostfile_free(&h);
}

static void test_hostfile_options(void **state)
{
    (void)state;
    bl_hostfile_t h;
    parse_ok("r.example.com 8090 router threads=4 name=front\n"
             "w1.example.com 9000 worker 0,3 name=stage-0 threads=8 layers=0-10\n"
             "w1.example.com 9003 worker layers=10-12 threads=1\n"
             "w1.example.com 9100 hosttier name=ht_1.a threads=1024\n",
             &h);
    assert_int_equal(h.e[0].threads, 4);
    assert_string_equal(h.e[0].name, "front");
    assert_int_equal(h.e[1].threads, 8);
    assert_string_equal(h.e[1].name, "stage-0");
    assert_int_equal(h.e[1].layer_begin, 0);
    assert_int_equal(h.e[1].layer_end, 10);
    assert_int_equal(h.e[1].gpus[1], 3);
    assert_int_equal(h.e[2].n_gpus, 0); /* options right after ROLE: a CPU worker */
    assert_int_equal(h.e[2].layer_begin, 10);
    assert_int_equal(h.e[2].threads, 1);
    assert_int_equal(h.e[3].threads, 1024);
    assert_string_equal(h.e[3].name, "ht_1.a");
    bl_hostfile_free(&h);
}

/* Worker lines of another host than the router's are nodes on PORT..PORT+2: three
 * apart is enough; the router's own host's workers are not nodes. */
static void test_hostfile_node_ports(void **state)
{
    (void)state;
    bl_hostfile_t h;
    parse_ok("r 1 router\nh 9000 worker 0\nh 9003 worker 1\nr 2 worker\nr 3 worker\ng 9001 worker\n", &h);
    assert_int_equal(h.n, 6);
    bl_hostfile_free(&h);
}

/* Every bound reached exactly is still accepted. */
static void test_hostfile_accepts_the_limits(void **state)
{
    (void)state;
    char label63[64], name20[BL_HOSTFILE_MAX_NAME + 1], host253[254];
    memset(label63, 'a', 63);
    label63[63] = '\0';
    memset(name20, 'n', BL_HOSTFILE_MAX_NAME);
    name20[BL_HOSTFILE_MAX_NAME] = '\0';
    /* four labels of 63 and one of 61, dots between: 253 bytes */
    snprintf(host253, sizeof host253, "%s.%s.%s.%.61s", label63, label63, label63, label63);
    assert_int_equal(strlen(host253), 253);
    text_t t = {0};
    add(&t, "%s 65535 router name=%s\n", host253, name20);
    add(&t, "0.0.0.0 1 worker 63,0,62 layers=0-4095\n");
    add(&t, "255.255.255.255 1 worker layers=4095-4096 threads=1024\n");
    /* a line of exactly 1024 bytes (its comment pads it), then CRLF */
    char line[1100];
    int k = snprintf(line, sizeof line, "x 1 hosttier #");
    memset(line + k, '.', 1024 - (size_t)k);
    memcpy(line + 1024, "\r\n", 3);
    add(&t, "%s", line);
    bl_hostfile_t h;
    parse_ok(t.p, &h);
    assert_int_equal(h.n, 4);
    assert_string_equal(h.e[0].host, host253);
    assert_int_equal(h.e[0].port, 65535);
    assert_string_equal(h.e[0].name, name20);
    assert_int_equal(h.e[1].n_gpus, 3);
    assert_int_equal(h.e[1].gpus[0], 63);
    assert_int_equal(h.e[2].layer_end, 4096);
    bl_hostfile_free(&h);
    free(t.p);

    /* 4096 entries */
    text_t m = {0};
    add(&m, "r 1 router\n");
    for (int i = 0; i < 4095; i++)
        add(&m, "w%d 2 worker\n", i);
    parse_ok(m.p, &h);
    assert_int_equal(h.n, 4096);
    assert_int_equal(h.e[4095].line, 4096);
    assert_string_equal(h.e[4095].host, "w4094");
    bl_hostfile_free(&h);
    free(m.p);
}

static void test_hostfile_next_walks_a_hosts_entries(void **state)
{
    (void)state;
    bl_hostfile_t h;
    parse_ok("a 1 router\n"
             "a 2 worker 0\n"
             "b 2 worker 0\n"
             "A 3 worker 1\n"
             "a 4 hosttier\n",
             &h);
    const bl_host_entry_t *want[] = {&h.e[1], &h.e[3]};
    int k = 0;
    for (const bl_host_entry_t *p = NULL; (p = bl_hostfile_next(&h, p, "a", BL_HOST_WORKER));)
        assert_ptr_equal(p, want[k++]);
    assert_int_equal(k, 2);
    k = 0;
    for (const bl_host_entry_t *p = NULL; (p = bl_hostfile_next(&h, p, NULL, 0));)
        k++;
    assert_int_equal(k, 5);
    assert_ptr_equal(bl_hostfile_next(&h, NULL, "A", BL_HOST_HOSTTIER), &h.e[4]);
    assert_null(bl_hostfile_next(&h, NULL, "c", 0));
    bl_hostfile_free(&h);
    assert_null(bl_hostfile_router(&h));
    assert_null(bl_hostfile_next(&h, NULL, NULL, 0));
    bl_hostfile_free(NULL);
}

static void test_hostfile_role_names(void **state)
{
    (void)state;
    assert_string_equal(bl_host_role_name(BL_HOST_ROUTER), "router");
    assert_string_equal(bl_host_role_name(BL_HOST_WORKER), "worker");
    assert_string_equal(bl_host_role_name(BL_HOST_HOSTTIER), "hosttier");
    assert_string_equal(bl_host_role_name((bl_host_role_t)0), "?");
}

/* --- bad files ------------------------------------------------------------------- */

#define OK_HEAD "r 1 router\nw 2 worker\n" /* lines 1-2: a valid cluster */

static void test_hostfile_rejects_bad_inputs(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int line;
        const char *word;
    } bad[] = {
        /* fields */
        {"r 1 router\nw 2 wrker\n", 2, "role 'wrker' is not router, worker or hosttier"},
        {"r 1 Router\nw 2 worker\n", 1, "role 'Router'"},
        {"r 0 router\n", 1, "port '0' is not 1..65535"},
        {"r 65536 router\n", 1, "port '65536'"},
        {"r 80x router\n", 1, "port '80x'"},
        {"r -1 router\n", 1, "port '-1'"},
        {"r 99999999999999999999999 router\n", 1, "port '9999"},
        {"r\n", 1, "no PORT"},
        {OK_HEAD "\n  h 3\n", 4, "no ROLE"},
        {"r 1 router 0\nw 2 worker\n", 1, "a router takes no GPUS field ('0')"},
        {OK_HEAD "h 3 hosttier all\n", 3, "a hosttier takes no GPUS field"},
        {OK_HEAD "w 3 worker 0 1\n", 3, "unexpected field '1'"},
        {OK_HEAD "w 3 worker threads=2 0\n", 3, "unexpected field '0'"},
        {OK_HEAD "w 3 worker 0,\n", 3, "GPUS '0,'"},
        {OK_HEAD "w 3 worker ,0\n", 3, "GPUS ',0'"},
        {OK_HEAD "w 3 worker 0,,1\n", 3, "GPUS '0,,1'"},
        {OK_HEAD "w 3 worker 64\n", 3, "GPUS '64'"},
        {OK_HEAD "w 3 worker -1\n", 3, "GPUS '-1'"},
        {OK_HEAD "w 3 worker gpu0\n", 3, "GPUS 'gpu0'"},
        {OK_HEAD "w 3 worker 1,0,1\n", 3, "lists GPU 1 twice"},
        /* options */
        {OK_HEAD "w 3 worker foo=1\n", 3, "unknown option 'foo'"},
        {OK_HEAD "w 3 worker =1\n", 3, "unknown option '=1'"},
        {OK_HEAD "w 3 worker threads=2 threads=3\n", 3, "'threads' given twice"},
        {OK_HEAD "w 3 worker threads=0\n", 3, "threads '0'"},
        {OK_HEAD "w 3 worker threads=1025\n", 3, "threads '1025'"},
        {OK_HEAD "w 3 worker threads=\n", 3, "threads ''"},
        {OK_HEAD "w 3 worker threads=4k\n", 3, "threads '4k'"},
        {OK_HEAD "w 3 worker name=a/b\n", 3, "name 'a/b'"},
        {OK_HEAD "w 3 worker name=\n", 3, "name ''"},
        {OK_HEAD "w 3 worker name=nnnnnnnnnnnnnnnnnnnnn\n" /* 21 bytes */, 3, "name 'nnnnnnnnnnnnnnnnnnnnn' is not 1..20"},
        {"r 1 router name=a\nw 2 worker name=b\nw 3 worker name=a\n", 3, "name=a is also line 1's"},
        {"r 1 router\nw 2 worker name=s.0\nw 3 worker 0 name=S.0\nw 4 worker 1 name=s.0\n", 4,
         "name=s.0 is also line 2's"},
        {"r 1 router layers=0-4\nw 2 worker\n", 1, "layers= is a worker's option, not a router's"},
        {OK_HEAD "h 3 hosttier layers=0-4\n", 3, "not a hosttier's"},
        {"r 1 router\nw 2 worker layers=4-4\n", 2, "layers '4-4'"},
        {"r 1 router\nw 2 worker layers=0-4097\n", 2, "layers '0-4097'"},
        {"r 1 router\nw 2 worker layers=4\n", 2, "layers '4'"},
        {"r 1 router\nw 2 worker layers=a-b\n", 2, "layers 'a-b'"},
        {"r 1 router\nw 2 worker layers=-4\n", 2, "layers '-4'"},
        {"r 1 router\nw 2 worker layers=0-4-8\n", 2, "layers '0-4-8'"},
        /* hosts */
        {"-a 1 router\n", 1, "a label begins or ends with '-'"},
        {"a- 1 router\n", 1, "begins or ends with '-'"},
        {"a.-b 1 router\n", 1, "begins or ends with '-'"},
        {"a..b 1 router\n", 1, "an empty label"},
        {".a 1 router\n", 1, "an empty label"},
        {"a. 1 router\n", 1, "an empty label"},
        {"a_b 1 router\n", 1, "'_' is not a letter"},
        {"h\xc3\xb3st 1 router\n", 1, "'\xc3\xb3' is not a letter"},
        {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.b 1 router\n", 1, "longer than 63"},
        {"256.1.1.1 1 router\n", 1, "not an IPv4 address"},
        {"1.2.3 1 router\n", 1, "not an IPv4 address"},
        {"1.2.3.4.5 1 router\n", 1, "not an IPv4 address"},
        {"01.2.3.4 1 router\n", 1, "not an IPv4 address"},
        {"1.2.3.4. 1 router\n", 1, "not an IPv4 address"},
        {"1234 1 router\n", 1, "not an IPv4 address"},
        {"0x7f.1 1 router\n", 1, "reads as a numeric address"},
        {"::1 1 router\n", 1, "written in brackets"},
        {"[::1 1 router\n", 1, "not an IPv6 address"},
        {"[] 1 router\n", 1, "not an IPv6 address"},
        {"[zz::1] 1 router\n", 1, "not an IPv6 address"},
        {"[1.2.3.4] 1 router\n", 1, "not an IPv6 address"},
        {"[fe80::1%eth0] 1 router\n", 1, "not an IPv6 address"},
        {"[0000:0000:0000:0000:0000:0000:0000:0000:1] 1 router\n", 1, "not an IPv6 address"},
        /* bytes */
        {OK_HEAD "w 3 worker\x01\n", 3, "a control byte 0x01 at column 11"},
        {"r 1\rrouter\n", 1, "control byte 0x0d"},
        {"r 1 router\nw 2 worker # \x7f\n", 2, "control byte 0x7f"},
        {"# caf\xe9\nr 1 router\n", 1, "not UTF-8 (byte 0xe9 at column 6)"},
        {"r 1 router # \xc0\xaf\n", 1, "not UTF-8"},
        {"r 1 router # \xed\xa0\x80\n", 1, "not UTF-8"},   /* a surrogate */
        {"r 1 router # \xf4\x90\x80\x80\n", 1, "not UTF-8"}, /* past U+10FFFF */
        {"r 1 router # \xe2\x9c\n", 1, "not UTF-8"},         /* cut short */
        /* rules over the file */
        {"a 1 router\nb 2 worker\na 1 worker\n", 3, "a:1 is also at line 1"},
        {"Node-A 9000 router\nnode-a 9000 worker\n", 2, "node-a:9000 is also at line 1"},
        {"[::1] 1 router\n[0:0::1] 1 worker\n", 2, "[::1]:1 is also at line 1"},
        {"a 1 router\nb 1 router\nc 1 worker\n", 2, "a second router (the first is at line 1)"},
        {"a 1 worker\n", 0, "no router"},
        {"a 1 router\nb 1 hosttier\n", 0, "no worker"},
        {"", 0, "no router"},
        {"# nothing\n\n   \n", 0, "no router"},
        {OK_HEAD "h 3 hosttier\nH 4 hosttier\n", 4, "a second hosttier on H (the first is at line 3)"},
        {"r 1 router\nh 2 worker 0,1\nh 3 worker 1\n", 3, "GPU 1 of h is also the worker's at line 2"},
        {"r 1 router\nh 2 worker all\nh 3 worker 0\n", 3, "the worker at line 2 takes all GPUs of h"},
        {"r 1 router\nh 2 worker all\nh 3 worker all\n", 3, "the worker at line 2 takes all GPUs"},
        {"r 1 router\nh 2 worker 3\nh 3 worker all\n", 3, "the worker at line 2 has GPU 3"},
        {"r 1 router\nw 2 worker layers=0-4\nw 3 worker layers=5-8\n", 3, "gap"},
        {"r 1 router\nw 2 worker layers=1-4\n", 2, "gap"},
        {"r 1 router\nw 2 worker layers=0-4\nw 3 worker layers=3-8\n", 3, "overlaps line 2's"},
        {"r 1 router\nw 2 worker layers=4-8\nw 3 worker layers=0-4\n", 2, "gap"}, /* file order */
        {"r 1 router\nw 2 worker layers=0-4\nw 3 worker\n", 3, "layers= on every worker or on none"},
        {"r 1 router\nw 2 worker\nw 3 worker layers=0-4\n", 2, "layers= on every worker or on none: line 3"},
        {"r 1 router\nh 9000 worker 0\nh 9002 worker 1\n", 3,
         "h:9002: the node of line 2 takes ports 9000-9002 of h"},
        {"r 1 router\nh 9004 worker\nH 9000 worker\nh 9002 worker\n", 4, "the node of line 3 takes ports 9000-9002"},
        {"h 9001 worker\nh 9000 worker\nr 1 router\n", 2, "h:9000: the node of line 1 takes ports 9001-9003"},
        /* the earliest line's error wins */
        {"r 1 router\nw 2 worker layers=0-4\nw 2 worker\n", 3, "is also at line 2"},
        {"r 1 router\nr 1 router\n", 2, "also at line 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_bad(bad[i].text, bad[i].line, bad[i].word);
}

static void test_hostfile_rejects_nul_byte(void **state)
{
    (void)state;
    static const char text[] = "r 1 router\nw 2 worker\nw 3 wor\0ker\n";
    expect_bad_n(text, sizeof text - 1, 3, "a NUL byte at column 8");
    /* in a comment as well: a NUL says the file is not text */
    static const char text2[] = "r 1 router # \0\nw 2 worker\n";
    expect_bad_n(text2, sizeof text2 - 1, 1, "NUL");
}

static void test_hostfile_rejects_too_long_line(void **state)
{
    (void)state;
    char line[1100];
    const int head = snprintf(line, sizeof line, "r 1 router\n");
    const int k = head + snprintf(line + head, sizeof line - (size_t)head, "w 2 worker #");
    memset(line + k, '.', (size_t)(1025 - (k - head)));
    line[head + 1025] = '\0'; /* line 2 is 1025 bytes */
    expect_bad(line, 2, "1025 bytes long, more than the 1024");
    /* a long host name is refused by length, without reading past the field */
    char host[400];
    memset(host, 'a', 300);
    memcpy(host + 300, " 1 router\n", 11);
    expect_bad(host, 1, "longer than 253");
}

static void test_hostfile_rejects_4097_entries(void **state)
{
    (void)state;
    text_t t = {0};
    add(&t, "# a comment line first\nr 1 router\n");
    for (int i = 0; i < 4096; i++)
        add(&t, "w%d 2 worker\n", i);
    expect_bad(t.p, 4098, "more than 4096 entries");
    free(t.p);
}

static void test_hostfile_rejects_text_over_1_mib(void **state)
{
    (void)state;
    const size_t n = BL_HOSTFILE_MAX_BYTES + 1;
    char *p = malloc(n);
    assert_non_null(p);
    memset(p, '\n', n);
    expect_bad_n(p, n, 0, "more than the 1048576");
    free(p);
}

/* --- files ----------------------------------------------------------------------- */

static void test_hostfile_load(void **state)
{
    (void)state;
    char dir[] = "/tmp/bl_hostfile_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/hosts", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("r 1 router\nw 2 worker 0\nw 2 hosttier\n", f);
    fclose(f);
    bl_hostfile_t h;
    bl_err_t err = {0};
    /* the path names the text in errors */
    assert_int_equal(bl_hostfile_load(path, &h, &err), BL_EINVAL);
    char want[300];
    snprintf(want, sizeof want, "%s:3: w:2 is also at line 2", path);
    assert_string_equal(err.msg, want);
    assert_null(h.e);

    f = fopen(path, "w");
    assert_non_null(f);
    fputs("r 1 router\nw 2 worker 0\n", f);
    fclose(f);
    assert_int_equal(bl_hostfile_load(path, &h, &err), 0);
    assert_int_equal(h.n, 2);
    bl_hostfile_free(&h);

    /* over the limit: refused as parse refuses it */
    f = fopen(path, "w");
    assert_non_null(f);
    for (unsigned i = 0; i <= BL_HOSTFILE_MAX_BYTES; i++)
        fputc('\n', f);
    fclose(f);
    assert_int_equal(bl_hostfile_load(path, &h, &err), BL_EINVAL);
    assert_non_null(strstr(err.msg, path));
    assert_non_null(strstr(err.msg, "more than"));
    assert_null(h.e);

    assert_int_equal(bl_hostfile_load(dir, &h, &err), BL_EIO);
    assert_non_null(strstr(err.msg, dir));
    assert_int_equal(unlink(path), 0);
    assert_int_equal(bl_hostfile_load(path, &h, &err), BL_ENOENT);
    assert_non_null(strstr(err.msg, path));
    assert_null(h.e);
    assert_int_equal(rmdir(dir), 0);
}

/* --- allocation failure ---------------------------------------------------------- */

/* Every allocation of a parse made to fail in turn (the entries' growth and the
 * rules' tables): each failure is BL_ENOMEM with nothing left (the sanitizer build
 * checks the leaks), and with enough allocations the parse succeeds. */
static void test_hostfile_allocation_failure_is_enomem(void **state)
{
    (void)state;
    text_t t = {0};
    add(&t, "r 1 router\n");
    for (int i = 0; i < 40; i++) /* past the first growths of the entries */
        add(&t, "w%d 2 worker 0\n", i);
    int ok = 0;
    long budget;
    for (budget = 0; budget < 64 && !ok; budget++) {
        bl_hostfile_t h;
        bl_err_t err = {0};
        alloc_budget = budget;
        const int rc = bl_hostfile_parse(t.p, t.n, "oom.txt", &h, &err);
        alloc_budget = -1;
        if (rc == 0) {
            assert_int_equal(h.n, 41);
            bl_hostfile_free(&h);
            ok = 1;
            continue;
        }
        if (rc != BL_ENOMEM)
            fail_msg("budget %ld: %d (%s)", budget, rc, err.msg);
        assert_string_equal(err.msg, "oom.txt: out of memory");
        assert_null(h.e);
    }
    assert_true(ok);
    assert_true(budget > 4); /* three growths and the tables did fail in turn */
    free(t.p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostfile_one_host_two_gpus),
        cmocka_unit_test(test_hostfile_two_hosts),
        cmocka_unit_test(test_hostfile_gpus_are_per_host),
        cmocka_unit_test(test_hostfile_node_ports),
        cmocka_unit_test(test_hostfile_ipv6),
        cmocka_unit_test(test_hostfile_comments_tabs_crlf),
        cmocka_unit_test(test_hostfile_options),
        cmocka_unit_test(test_hostfile_accepts_the_limits),
        cmocka_unit_test(test_hostfile_next_walks_a_hosts_entries),
        cmocka_unit_test(test_hostfile_role_names),
        cmocka_unit_test(test_hostfile_rejects_bad_inputs),
        cmocka_unit_test(test_hostfile_rejects_nul_byte),
        cmocka_unit_test(test_hostfile_rejects_too_long_line),
        cmocka_unit_test(test_hostfile_rejects_4097_entries),
        cmocka_unit_test(test_hostfile_rejects_text_over_1_mib),
        cmocka_unit_test(test_hostfile_load),
        cmocka_unit_test(test_hostfile_allocation_failure_is_enomem),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
