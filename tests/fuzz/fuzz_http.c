/* libFuzzer target for the request path as bloomery-serve sees it, in one process:
 * raw bytes go over a loopback TCP connection into h2o (router/http.c, included here
 * so that its bookkeeping can be checked after every input), through the real route
 * table to the real handlers of router/api_*.c and the real engine (router/engine.c)
 * over the fake cluster of fuzz_app.c, and the answer is read back and checked.
 * Generation routes parse their bodies, tokenize, render Qwen3's template, generate
 * one of the fake model's short replies (at most 16 tokens) and answer, streamed or
 * not.
 *
 * Input: one byte that picks the server (bit 0 clear: no API key, no prefix, bodies
 * up to 1 MiB; set: API key "fuzz-key", routes under "/v2", bodies up to 2 KiB), then
 * the bytes a client sends on one connection (request line, headers, body; several
 * requests if it pipelines them). The client then half-closes once the server has
 * read everything and holds no request, and reads until the server closes.
 *
 * Invariants beside the sanitizers' (leaks included):
 *   - what comes back is a sequence of whole, well-formed HTTP/1.x responses: status
 *     line, header lines, a body framed by Content-Length or chunked encoding (or by
 *     the close, last), nothing after the last; only a reset connection may cut the
 *     last one short;
 *   - no more final responses than the input has request heads, and exactly one when
 *     the input is one complete, plain request;
 *   - a JSON body parses, and an error status carries llama-server's or Anthropic's
 *     error object with that status; every data line of an event stream is JSON or
 *     [DONE];
 *   - afterwards the server holds no request (open or unfreed) and no connection, and
 *     the engine no task;
 *   - no hang: every wait is bounded in loop turns and in time (an answer within 5 s).
 * Seeds: tests/fuzz/corpus/fuzz_http/. */
#include "http.c"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "engine.h"
#include "fuzz_app.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_TURNS 200000      /* loop turns one input may take */
#define ANSWER_MS 5000        /* the longest one input may wait for the server */
#define MAX_RESPONSE (8u << 20)

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_http: %s\n", what);
        abort();
    }
}

// --- the server ---------------------------------------------------------------------------

typedef struct server {
    rt_http_t *http;
} server_t;

static uv_loop_t g_loop;
static rt_app_t g_app;
static server_t g_servers[2];
static uv_timer_t g_tick, g_watchdog;
static int g_timed_out;

static void on_tick(uv_timer_t *t) { (void)t; }

static void on_watchdog(uv_timer_t *t)
{
    (void)t;
    g_timed_out = 1;
}

static void start(void)
{
    signal(SIGPIPE, SIG_IGN);
    bl_log_init("fuzz_http", BL_LOG_OFF);
    check(uv_loop_init(&g_loop) == 0, "uv_loop_init");
    uv_timer_init(&g_loop, &g_tick);
    uv_timer_init(&g_loop, &g_watchdog);

    rt_app_t *app = &g_app;
    rt_app_defaults(app);
    app->tok = fz_tokenizer();
    app->tpl = fz_template();
    app->tpl_source = fz_template_source();
    app->cluster = fz_cluster();
    app->model_path = "/models/fuzz.gguf";
    app->model_alias = "fuzz";
    app->n_ctx_train = FZ_N_CTX;
    app->n_ctx_slot = FZ_N_CTX;
    app->n_ctx_total = (int64_t)FZ_N_CTX * FZ_N_SLOTS;
    app->n_batch = FZ_N_BATCH;
    app->n_slots = FZ_N_SLOTS;
    app->n_vocab = rt_tokenizer_n_vocab(app->tok);
    app->n_predict_default = -1;
    app->started = time(NULL);
    rt_engine_opts_t eo = {.n_slots = FZ_N_SLOTS, .n_ctx_slot = FZ_N_CTX, .n_batch = FZ_N_BATCH,
                           .n_predict_max = 16, .cache_ram = 64 * 1024}; /* the prompt cache too */
    bl_err_t err = {0};
    if (rt_engine_create(&app->engine, &eo, app->cluster, app->tok, &g_loop, &err)) {
        fprintf(stderr, "engine: %s\n", err.msg);
        abort();
    }

    static const char *const keys[] = {"fuzz-key"};
    const rt_http_opts_t opts[2] = {
        {.host = "127.0.0.1", .max_body_bytes = 1u << 20, .timeout_s = 30},
        {.host = "127.0.0.1", .max_body_bytes = 2048, .timeout_s = 30, .api_keys = keys,
         .n_api_keys = 1, .api_prefix = "/v2"},
    };
    for (int i = 0; i < 2; i++) {
        if (rt_http_create(&g_servers[i].http, &g_loop, &opts[i], app, &err)) {
            fprintf(stderr, "http: %s\n", err.msg);
            abort();
        }
        rt_api_info_register(g_servers[i].http);
        rt_api_gen_register(g_servers[i].http);
    }
}

// --- the client -------------------------------------------------------------------------

typedef struct client {
    int fd;
    uv_poll_t poll;
    char *buf;
    size_t len, cap;
    int eof, reset;
} client_t;

static void on_readable(uv_poll_t *p, int status, int events)
{
    (void)events;
    client_t *c = p->data;
    if (status < 0) {
        c->eof = c->reset = 1;
        uv_poll_stop(p);
        return;
    }
    for (;;) {
        if (c->cap - c->len < 65536) {
            check(c->cap < MAX_RESPONSE, "a response of more than 8 MiB");
            c->cap = c->cap ? c->cap * 2 : 65536;
            c->buf = realloc(c->buf, c->cap);
            check(c->buf != NULL, "out of memory");
        }
        ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len - 1, 0);
        if (n > 0) {
            c->len += (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        c->eof = 1;
        c->reset = n < 0;
        uv_poll_stop(p);
        return;
    }
}

/* The server has read every byte sent and holds no request: what it does next
 * depends only on what else the client sends. */
static int server_waits(const server_t *s)
{
    const rt_http_t *h = s->http;
    if (!h->conns || h->n_open)
        return 0;
    for (const conn_t *c = h->conns; c; c = c->next) {
        uv_os_fd_t fd;
        int n = 0;
        if (uv_fileno((const uv_handle_t *)&c->tcp, &fd) == 0 && ioctl(fd, FIONREAD, &n) == 0 &&
            n > 0)
            return 0;
    }
    return 1;
}

/* One loop turn; a tick wakes a turn that has nothing else to do. */
static void turn(int *turns)
{
    check(++*turns < MAX_TURNS, "no end after the loop-turn bound");
    check(!g_timed_out, "no answer within 5 s");
    uv_run(&g_loop, UV_RUN_ONCE);
}

/* A non-blocking connect in progress: waits for its outcome (libFuzzer's timeout
 * timer interrupts waits once a second, so EINTR only means "again") and returns 0
 * or its errno. */
static int connect_wait(int fd)
{
    for (;;) {
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        int n = poll(&pf, 1, ANSWER_MS);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n == 0 ? ETIMEDOUT : errno;
        int so = 0;
        socklen_t len = sizeof so;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &len) != 0)
            return errno;
        return so;
    }
}

/* A connection to s from the next address of 127/8. The client closes first, so
 * each connection it made stays in TIME_WAIT for a minute; from one address the ports
 * would run out at thousands of runs a second. A pair still waiting from an earlier
 * process (which walked the same addresses) refuses the bind or the connect: the
 * next address is tried. Each process starts its walk elsewhere. */
static int connect_client(const server_t *s)
{
    static uint32_t next_local;
    if (!next_local)
        next_local = (uint32_t)getpid() * 2654435761u | 1u;
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)rt_http_port(s->http))};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int e = 0;
    for (int tries = 0; tries < 64; tries++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        check(fd >= 0, "socket");
        struct sockaddr_in local = {.sin_family = AF_INET};
        local.sin_addr.s_addr = htonl(0x7f000000u | (1u + next_local++ % 0xfffffeu));
        if (bind(fd, (struct sockaddr *)&local, sizeof local) == 0 &&
            ((e = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 ? 0 : errno) == 0 ||
             ((e == EINPROGRESS || e == EINTR) && (e = connect_wait(fd)) == 0)))
            return fd;
        e = e ? e : errno;
        close(fd);
        if (e != EADDRINUSE && e != EADDRNOTAVAIL)
            break;
    }
    fprintf(stderr, "fuzz_http: connect: %s\n", strerror(e));
    abort();
}

// --- the response checker ------------------------------------------------------------------

static int is_tchar(int c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* The line at *p ending in CRLF: its length, or -1 when the buffer ends first. */
static ssize_t line_at(const char *p, const char *end)
{
    for (const char *q = p; q + 1 < end; q++)
        if (q[0] == '\r' && q[1] == '\n')
            return q - p;
    return -1;
}

static int header_is(const char *name, size_t n, const char *want)
{
    return n == strlen(want) && !strncasecmp(name, want, n);
}

/* Checks the JSON of an error reply (llama-server's, or Anthropic's shape). */
static void check_error_json(const json_t *j, int status)
{
    const json_t *e = json_object_get(j, "error");
    if (json_is_string(json_object_get(j, "type"))) { /* Anthropic */
        check(!strcmp(json_string_value(json_object_get(j, "type")), "error") &&
                  json_is_string(json_object_get(e, "type")) &&
                  json_is_string(json_object_get(e, "message")),
              "an Anthropic error reply without error.type and error.message");
        return;
    }
    check(json_is_object(e) && json_is_string(json_object_get(e, "message")) &&
              json_is_string(json_object_get(e, "type")) &&
              json_integer_value(json_object_get(e, "code")) == status,
          "an error reply without {\"error\": {\"code\": status, \"message\", \"type\"}}");
}

static void check_sse(const char *b, size_t n)
{
    size_t i = 0;
    while (i < n) {
        const char *nl = memchr(b + i, '\n', n - i);
        size_t e = nl ? (size_t)(nl - b) : n;
        if (e - i >= 6 && !memcmp(b + i, "data: ", 6)) {
            const char *d = b + i + 6;
            size_t dn = e - i - 6;
            if (!(dn == 6 && !memcmp(d, "[DONE]", 6))) {
                json_t *j = json_loadb(d, dn, JSON_ALLOW_NUL, NULL);
                check(j != NULL, "an event's data line is not JSON");
                json_decref(j);
            }
        }
        i = e + 1;
    }
}

/* Parses the responses in c's bytes; returns how many final (non-1xx) ones. head_ok:
 * the input asked for HEAD somewhere, so a response may lack its framed body. */
static int check_responses(const client_t *c, int head_ok)
{
    const char *p = c->buf ? c->buf : "", *end = p + c->len;
    int finals = 0;
    char *dechunked = NULL;
    while (p < end) {
        /* status line */
        ssize_t ll = line_at(p, end);
        if (ll < 0) {
            check(c->reset, "a response's status line is cut short");
            break;
        }
        check(ll >= 12 && (!memcmp(p, "HTTP/1.1 ", 9) || !memcmp(p, "HTTP/1.0 ", 9)) &&
                  p[9] >= '1' && p[9] <= '5' && p[10] >= '0' && p[10] <= '9' && p[11] >= '0' &&
                  p[11] <= '9' && (ll == 12 || p[12] == ' '),
              "a malformed status line");
        int status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
        p += ll + 2;
        /* headers */
        long long clen = -1;
        int chunked = 0, json = 0, sse = 0, cut = 0;
        for (;;) {
            ll = line_at(p, end);
            if (ll < 0) {
                cut = 1;
                break;
            }
            if (ll == 0) {
                p += 2;
                break;
            }
            const char *colon = memchr(p, ':', (size_t)ll);
            check(colon && colon > p, "a header line without a name");
            for (const char *q = p; q < colon; q++)
                check(is_tchar((unsigned char)*q), "a header name with a character outside tchar");
            for (const char *q = colon + 1; q < p + ll; q++)
                check((unsigned char)*q >= 0x20 || *q == '\t', "a control character in a header");
            size_t nn = (size_t)(colon - p);
            const char *v = colon + 1;
            while (v < p + ll && *v == ' ')
                v++;
            size_t vn = (size_t)(p + ll - v);
            if (header_is(p, nn, "content-length")) {
                check(clen < 0, "two Content-Length headers");
                char tmp[32];
                check(vn > 0 && vn < sizeof tmp, "a bad Content-Length");
                memcpy(tmp, v, vn);
                tmp[vn] = 0;
                char *e;
                clen = strtoll(tmp, &e, 10);
                check(*e == 0 && clen >= 0, "a bad Content-Length");
            } else if (header_is(p, nn, "transfer-encoding")) {
                check(vn == 7 && !strncasecmp(v, "chunked", 7), "a transfer coding not chunked");
                chunked = 1;
            } else if (header_is(p, nn, "content-type")) {
                json = vn >= 16 && !strncasecmp(v, "application/json", 16);
                sse = vn >= 17 && !strncasecmp(v, "text/event-stream", 17);
            }
            p += ll + 2;
        }
        if (cut) {
            check(c->reset, "a response's headers are cut short");
            break;
        }
        check(!(chunked && clen >= 0), "both Content-Length and chunked");
        if (status < 200) {
            check(clen <= 0 && !chunked, "an interim response with a body");
            continue;
        }
        finals++;
        const char *body = p;
        size_t body_len = 0;
        if (status == 204 || status == 304) {
            check(clen <= 0 && !chunked, "a 204 or 304 with a body");
        } else if (clen > 0 && head_ok &&
                   (p == end || ((size_t)(end - p) >= 7 && !memcmp(p, "HTTP/1.", 7)))) {
            /* HEAD's answer has the length of the GET's body and no body (a JSON or
             * HTML body never starts like a status line) */
            continue;
        } else if (clen >= 0) {
            if ((size_t)(end - p) < (size_t)clen) {
                check(c->reset, "a body shorter than its Content-Length");
                break;
            }
            body_len = (size_t)clen;
            p += clen;
        } else if (chunked) {
            free(dechunked);
            dechunked = malloc((size_t)(end - p) + 1);
            check(dechunked != NULL, "out of memory");
            size_t dn = 0;
            int done = 0;
            while (!done) {
                ll = line_at(p, end);
                if (ll < 0)
                    break;
                char *e;
                unsigned long long k = strtoull(p, &e, 16);
                check(e > p && (e == p + ll || *e == ';'), "a malformed chunk size");
                p += ll + 2;
                if (k == 0) {
                    ll = line_at(p, end); /* no trailers are sent */
                    if (ll != 0)
                        break;
                    p += 2;
                    done = 1;
                    break;
                }
                if ((size_t)(end - p) < k + 2)
                    break;
                check(p[k] == '\r' && p[k + 1] == '\n', "a chunk not followed by CRLF");
                memcpy(dechunked + dn, p, k);
                dn += k;
                p += k + 2;
            }
            if (!done) {
                check(c->reset, "a chunked body without its last chunk");
                break;
            }
            body = dechunked;
            body_len = dn;
        } else {
            /* framed by the close: only the last response may be so */
            body_len = (size_t)(end - p);
            p = end;
        }
        if (json) {
            json_t *j = json_loadb(body, body_len, JSON_ALLOW_NUL | JSON_DECODE_ANY, NULL);
            check(j != NULL, "an application/json body that is not JSON");
            if (status >= 400)
                check_error_json(j, status);
            json_decref(j);
        }
        if (sse)
            check_sse(body, body_len);
    }
    free(dechunked);
    return finals;
}

// --- what the input asks for --------------------------------------------------------------

/* Header terminators in the input: no request without one, so no more answers. */
static int count_heads(const char *s, size_t n)
{
    int k = 0;
    for (size_t i = 0; i + 1 < n; i++)
        if (s[i] == '\n' && (s[i + 1] == '\n' || (s[i + 1] == '\r' && i + 2 < n && s[i + 2] == '\n')))
            k++;
    return k;
}

/* One plain request, all of it and nothing more: a method h2o knows, an origin-form
 * target, HTTP/1.0 or 1.1, token: value header lines, no transfer coding, no
 * expectation, no upgrade, at most one Content-Length whose body is all there. */
static int one_plain_request(const char *s, size_t n)
{
    static const char *const methods[] = {"GET ", "POST ", "HEAD ", "OPTIONS "};
    const char *p = s, *end = s + n;
    size_t m = 0;
    for (size_t i = 0; i < sizeof methods / sizeof *methods && !m; i++)
        if (n > strlen(methods[i]) && !memcmp(s, methods[i], strlen(methods[i])))
            m = strlen(methods[i]);
    if (!m)
        return 0;
    ssize_t ll = line_at(p, end);
    if (ll < (ssize_t)(m + 10) || p[m] != '/' ||
        (memcmp(p + ll - 9, " HTTP/1.1", 9) && memcmp(p + ll - 9, " HTTP/1.0", 9)))
        return 0;
    for (const char *q = p + m; q < p + ll - 9; q++)
        if ((unsigned char)*q <= 0x20 || (unsigned char)*q >= 0x7f)
            return 0;
    p += ll + 2;
    long long clen = 0;
    int n_len = 0;
    for (int headers = 0;; headers++) {
        ll = line_at(p, end);
        if (ll < 0 || headers > 50)
            return 0;
        if (ll == 0) {
            p += 2;
            break;
        }
        const char *colon = memchr(p, ':', (size_t)ll);
        if (!colon || colon == p)
            return 0;
        for (const char *q = p; q < colon; q++)
            if (!is_tchar((unsigned char)*q))
                return 0;
        for (const char *q = colon + 1; q < p + ll; q++)
            if (((unsigned char)*q < 0x20 && *q != '\t') || (unsigned char)*q >= 0x7f)
                return 0;
        size_t nn = (size_t)(colon - p);
        const char *v = colon + 1;
        while (v < p + ll && (*v == ' ' || *v == '\t'))
            v++;
        size_t vn = (size_t)(p + ll - v);
        while (vn && (v[vn - 1] == ' ' || v[vn - 1] == '\t'))
            vn--;
        if (header_is(p, nn, "transfer-encoding") || header_is(p, nn, "expect") ||
            header_is(p, nn, "upgrade") || header_is(p, nn, "http2-settings"))
            return 0;
        if (header_is(p, nn, "content-length")) {
            if (n_len++ || vn == 0 || vn > 6)
                return 0;
            clen = 0;
            for (size_t i = 0; i < vn; i++) {
                if (v[i] < '0' || v[i] > '9')
                    return 0;
                clen = clen * 10 + (v[i] - '0');
            }
        }
        p += ll + 2;
    }
    return end - p == clen;
}

// --- one input ----------------------------------------------------------------------------

static void settle(int *turns)
{
    /* the server closes its end; h2o's close callbacks and the engine's cancels finish */
    for (int i = 0; i < 2; i++)
        while (g_servers[i].http->conns || g_servers[i].http->n_open)
            turn(turns);
    for (;;) {
        rt_engine_stats_t st;
        rt_engine_get_stats(g_app.engine, &st);
        if (!st.requests_processing && !st.requests_deferred)
            break;
        turn(turns);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_app.engine)
        start();
    if (size < 1)
        return 0;
    server_t *s = &g_servers[data[0] & 1];
    const char *req = (const char *)data + 1;
    const size_t n = size - 1;

    client_t c = {0};
    c.fd = connect_client(s);
    uv_poll_init(&g_loop, &c.poll, c.fd);
    c.poll.data = &c;
    uv_poll_start(&c.poll, UV_READABLE, on_readable);

    g_timed_out = 0;
    uv_timer_start(&g_watchdog, on_watchdog, ANSWER_MS, 0);
    uv_timer_start(&g_tick, on_tick, 2, 2);
    int turns = 0;
    size_t off = 0;
    while (off < n && !c.eof) {
        ssize_t k = send(c.fd, req + off, n - off, MSG_NOSIGNAL);
        if (k > 0)
            off += (size_t)k;
        else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            break; /* the server closed already (a head it refused) */
        else
            turn(&turns);
    }
    /* half-close once the server waits on the client, then read to the end */
    while (!c.eof && !server_waits(s))
        turn(&turns);
    shutdown(c.fd, SHUT_WR);
    while (!c.eof)
        turn(&turns);
    settle(&turns);
    uv_timer_stop(&g_tick);
    uv_timer_stop(&g_watchdog);

    int finals = check_responses(&c, memmem(req, n, "HEAD", 4) != NULL);
    check(finals <= count_heads(req, n) + 1, "more answers than requests");
    if (one_plain_request(req, n) && !c.reset)
        check(finals == 1, "one plain request without exactly one answer");
    for (int i = 0; i < 2; i++)
        check(!g_servers[i].http->reqs && !g_servers[i].http->n_open,
              "a request is still held after its connection closed");

    uv_poll_stop(&c.poll);
    uv_close((uv_handle_t *)&c.poll, NULL);
    uv_run(&g_loop, UV_RUN_NOWAIT);
    /* a reset, not a close: the client would keep every port it used in TIME_WAIT,
     * and at thousands of runs a second the ephemeral ports run out */
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    (void)setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(c.fd);
    free(c.buf);
    return 0;
}
