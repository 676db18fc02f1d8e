/* Tests of router/http.c over real sockets: the loop runs on the test's thread and
 * a client thread speaks raw HTTP/1.1 to it, so the tests see exactly the bytes a
 * client would (status line, headers, chunked bodies) and the server sees real
 * disconnects. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_tryjoin_np */
#endif
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "../../router/http.c"

/* --- harness --------------------------------------------------------------------- */

typedef struct client {
    int port;
    const char *request; /* raw bytes to send */
    size_t request_len;
    size_t close_after;  /* > 0: close once this many response bytes arrived;
                          * SIZE_MAX: close right after sending */
    char response[1 << 16];
    size_t len;
} client_t;

typedef struct fixture {
    uv_loop_t loop;
    uv_async_t done;
    rt_http_t *http;
    client_t client;
    int gone_calls;
    int stream_step;
    uv_timer_t timer;
    rt_req_t *held;
} fixture_t;

static fixture_t *g_fx;

static void *client_main(void *arg)
{
    fixture_t *fx = arg;
    client_t *c = &fx->client;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)c->port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
        size_t off = 0;
        while (off < c->request_len) {
            ssize_t n = send(fd, c->request + off, c->request_len - off, MSG_NOSIGNAL);
            if (n <= 0)
                break;
            off += (size_t)n;
        }
        for (; c->close_after != SIZE_MAX;) {
            ssize_t n = recv(fd, c->response + c->len, sizeof c->response - 1 - c->len, 0);
            if (n <= 0)
                break;
            c->len += (size_t)n;
            if (c->close_after && c->len >= c->close_after)
                break;
            /* a complete answer with a length, or the last chunk, ends the read */
            c->response[c->len] = 0;
            char *hdr_end = strstr(c->response, "\r\n\r\n");
            const char *cl = strstr(c->response, "Content-Length: ");
            if (hdr_end && cl && cl < hdr_end &&
                c->len >= (size_t)(hdr_end + 4 - c->response) + strtoul(cl + 16, NULL, 10))
                break;
            if (hdr_end && strstr(hdr_end, "\r\n0\r\n\r\n"))
                break;
        }
    }
    c->response[c->len] = 0;
    close(fd);
    uv_async_send(&fx->done);
    return NULL;
}

static void on_done(uv_async_t *a)
{
    (void)a;
}

/* Runs the loop until the client thread finished, then a little longer so that
 * the server notices a disconnect (the watch runs every 100 ms). */
static void run_client(fixture_t *fx, const char *req, size_t close_after, int linger_ms)
{
    memset(&fx->client, 0, sizeof fx->client);
    fx->client.port = rt_http_port(fx->http);
    fx->client.request = req;
    fx->client.request_len = strlen(req);
    fx->client.close_after = close_after;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, client_main, fx), 0);
    /* the client signals through the async handle; run until it is joined */
    for (;;) {
        uv_run(&fx->loop, UV_RUN_ONCE);
        if (pthread_tryjoin_np(t, NULL) == 0)
            break;
    }
    uint64_t end = uv_now(&fx->loop) + (uint64_t)linger_ms;
    while (uv_now(&fx->loop) < end) {
        uv_run(&fx->loop, UV_RUN_NOWAIT);
        uv_sleep(5);
        uv_update_time(&fx->loop);
    }
}

static void fx_setup(fixture_t *fx, size_t max_body, const char *const *keys, size_t n_keys);

static void route_hello(rt_req_t *r)
{
    rt_req_send_json(r, 200, json_pack("{s:s}", "hello", rt_req_path(r)));
}

static void route_echo(rt_req_t *r)
{
    rt_req_send_json(r, 200, json_incref(rt_req_json(r)));
}

static void route_len(rt_req_t *r)
{
    json_t *a = json_object_get(rt_req_json(r), "a");
    rt_req_send_json(r, 200, json_pack("{s:I}", "n", (json_int_t)json_string_length(a)));
}

static void on_gone(void *ud)
{
    fixture_t *fx = ud;
    fx->gone_calls++;
    fx->held = NULL;
    uv_timer_stop(&fx->timer);
}

/* A stream of three pieces, one per timer tick, then the end. */
static void stream_tick(uv_timer_t *t)
{
    fixture_t *fx = t->data;
    if (!fx->held)
        return;
    char piece[32];
    snprintf(piece, sizeof piece, "data: %d\n\n", fx->stream_step);
    rt_req_stream_write(fx->held, piece, strlen(piece));
    if (++fx->stream_step == 3) {
        rt_req_stream_end(fx->held);
        fx->held = NULL;
        uv_timer_stop(t);
    }
}

static void route_stream(rt_req_t *r)
{
    g_fx->held = r;
    g_fx->stream_step = 0;
    rt_req_stream_start(r, 200, "text/event-stream", on_gone, g_fx);
    uv_timer_start(&g_fx->timer, stream_tick, 20, 20);
}

/* A stream that never ends on its own: only the client's departure stops it. */
static void endless_tick(uv_timer_t *t)
{
    fixture_t *fx = t->data;
    if (fx->held)
        rt_req_stream_write(fx->held, "data: x\n\n", 9);
}

static void route_endless(rt_req_t *r)
{
    g_fx->held = r;
    rt_req_stream_start(r, 200, "text/event-stream", on_gone, g_fx);
    uv_timer_start(&g_fx->timer, endless_tick, 10, 10);
}

/* An answer that never comes unless the client stays. */
static void route_deferred(rt_req_t *r)
{
    g_fx->held = r;
    rt_req_on_gone(r, on_gone, g_fx);
}

static void late_answer(uv_timer_t *t)
{
    fixture_t *fx = t->data;
    if (fx->held)
        rt_req_send_error(fx->held, 503, NULL, "late %d", 7);
    fx->held = NULL;
}

static void route_late(rt_req_t *r)
{
    g_fx->held = r;
    rt_req_on_gone(r, on_gone, g_fx);
    uv_timer_start(&g_fx->timer, late_answer, 50, 0);
}

static void fx_setup(fixture_t *fx, size_t max_body, const char *const *keys, size_t n_keys)
{
    memset(fx, 0, sizeof *fx);
    g_fx = fx;
    assert_int_equal(uv_loop_init(&fx->loop), 0);
    uv_async_init(&fx->loop, &fx->done, on_done);
    uv_timer_init(&fx->loop, &fx->timer);
    fx->timer.data = fx;
    rt_http_opts_t o = {.host = "127.0.0.1", .port = 0, .api_keys = keys, .n_api_keys = n_keys,
                        .max_body_bytes = max_body, .timeout_s = 10};
    bl_err_t err = {0};
    assert_int_equal(rt_http_create(&fx->http, &fx->loop, &o, fx, &err), 0);
    assert_true(rt_http_port(fx->http) > 0);
    assert_int_equal(rt_http_route(fx->http, "GET", "/hello", route_hello, RT_ROUTE_PUBLIC), 0);
    assert_int_equal(rt_http_route(fx->http, "GET", "/secret", route_hello, 0), 0);
    assert_int_equal(rt_http_route(fx->http, "POST", "/echo", route_echo, 0), 0);
    assert_int_equal(rt_http_route(fx->http, "POST", "/stream", route_stream, 0), 0);
    assert_int_equal(rt_http_route(fx->http, "POST", "/endless", route_endless, 0), 0);
    assert_int_equal(rt_http_route(fx->http, "POST", "/deferred", route_deferred, 0), 0);
    assert_int_equal(rt_http_route(fx->http, "POST", "/late", route_late, 0), 0);
    assert_int_equal(rt_http_route(fx->http, "POST", "/len", route_len, 0), 0);
    assert_int_equal(rt_http_route(fx->http, "POST", "/echo", route_echo, 0), BL_EINVAL);
}

static void fx_teardown(fixture_t *fx)
{
    rt_http_stop_accepting(fx->http);
    rt_http_destroy(fx->http);
    uv_close((uv_handle_t *)&fx->done, NULL);
    uv_close((uv_handle_t *)&fx->timer, NULL);
    for (int i = 0; i < 100 && uv_loop_alive(&fx->loop); i++)
        uv_run(&fx->loop, UV_RUN_NOWAIT);
    assert_int_equal(uv_loop_close(&fx->loop), 0);
}

static const char *body_of(const client_t *c)
{
    const char *b = strstr(c->response, "\r\n\r\n");
    return b ? b + 4 : "";
}

static char *post(const char *path, const char *extra_headers, const char *body)
{
    static char buf[1 << 15];
    snprintf(buf, sizeof buf, "POST %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\n%sContent-Length: %zu\r\n\r\n%s",
             path, extra_headers, strlen(body), body);
    return buf;
}

/* --- tests ----------------------------------------------------------------------- */

static void test_http_route_answers_json_with_cors(void **state)
{
    (void)state;
    fixture_t fx;
    fx_setup(&fx, 0, NULL, 0);
    run_client(&fx, "GET /hello?x=1 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", 0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 200"));
    assert_non_null(strstr(fx.client.response, "content-type: application/json; charset=utf-8"));
    assert_non_null(strstr(fx.client.response, "access-control-allow-origin: *"));
    assert_string_equal(body_of(&fx.client), "{\"hello\":\"/hello\"}");
    fx_teardown(&fx);
}

static void test_http_unknown_path_is_404_and_wrong_method_405(void **state)
{
    (void)state;
    fixture_t fx;
    fx_setup(&fx, 0, NULL, 0);
    run_client(&fx, "GET /nope HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", 0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 404"));
    assert_string_equal(body_of(&fx.client),
                        "{\"error\":{\"code\":404,\"message\":\"File Not Found\",\"type\":\"not_found_error\"}}");
    run_client(&fx, "GET /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", 0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 405"));
    assert_non_null(strstr(fx.client.response, "allow: POST"));
    fx_teardown(&fx);
}

static void test_http_options_answers_cors_preflight(void **state)
{
    (void)state;
    fixture_t fx;
    fx_setup(&fx, 0, (const char *const[]){"k"}, 1);
    run_client(&fx, "OPTIONS /secret HTTP/1.1\r\nHost: t\r\nOrigin: http://a.b\r\nConnection: close\r\n\r\n",
               0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 200"));
    assert_non_null(strstr(fx.client.response, "access-control-allow-origin: http://a.b"));
    assert_non_null(strstr(fx.client.response, "access-control-allow-methods: GET, POST"));
    fx_teardown(&fx);
}

static void test_http_api_keys_guard_all_but_public_routes(void **state)
{
    (void)state;
    fixture_t fx;
    fx_setup(&fx, 0, (const char *const[]){"k1", "k2"}, 2);
    run_client(&fx, "GET /secret HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", 0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 401"));
    assert_non_null(strstr(body_of(&fx.client), "\"message\":\"Invalid API Key\""));
    assert_non_null(strstr(body_of(&fx.client), "\"type\":\"authentication_error\""));
    run_client(&fx, "GET /secret HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer k3\r\nConnection: close\r\n\r\n", 0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 401"));
    run_client(&fx, "GET /secret HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer k2\r\nConnection: close\r\n\r\n", 0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 200"));
    run_client(&fx, "GET /secret HTTP/1.1\r\nHost: t\r\nX-Api-Key: k1\r\nConnection: close\r\n\r\n", 0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 200"));
    run_client(&fx, "GET /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", 0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 200"));
    fx_teardown(&fx);
}

static void test_http_bad_bodies_are_400_naming_the_problem(void **state)
{
    (void)state;
    fixture_t fx;
    fx_setup(&fx, 0, NULL, 0);
    run_client(&fx, post("/echo", "", "{\"a\": 1"), 0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 400"));
    assert_non_null(strstr(body_of(&fx.client), "line 1, column 7"));
    run_client(&fx, post("/echo", "", "{\"a\": \"\xff\"}"), 0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 400"));
    assert_non_null(strstr(body_of(&fx.client), "not valid UTF-8"));
    run_client(&fx, post("/echo", "", "[1]"), 0, 0);
    assert_non_null(strstr(body_of(&fx.client), "must be a JSON object"));
    run_client(&fx, post("/echo", "", ""), 0, 0);
    assert_non_null(strstr(body_of(&fx.client), "empty"));
    run_client(&fx, post("/echo", "", "{\"a\":[1,2]}"), 0, 0);
    assert_string_equal(body_of(&fx.client), "{\"a\":[1,2]}");
    fx_teardown(&fx);
}

static void test_http_head_is_get_without_a_body(void **state)
{
    (void)state;
    fixture_t fx;
    fx_setup(&fx, 0, NULL, 0);
    run_client(&fx, "HEAD /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", 0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 200"));
    assert_non_null(strstr(fx.client.response, "Content-Length: 18"));
    assert_string_equal(body_of(&fx.client), "");
    run_client(&fx, "HEAD /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", 0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 405"));
    run_client(&fx, "DELETE /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", 0, 0);
    assert_non_null(strstr(fx.client.response, "allow: GET, HEAD"));
    fx_teardown(&fx);
}

static void test_http_conflicting_content_lengths_are_400(void **state)
{
    (void)state;
    fixture_t fx;
    fx_setup(&fx, 0, NULL, 0);
    /* RFC 9112 6.3: the framing cannot be trusted; the connection closes after it */
    run_client(&fx, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 19\r\nContent-Length: 5\r\n\r\n"
               "{\"a\":\"0123456789\"}", 0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 400"));
    assert_non_null(strstr(fx.client.response, "onnection: close"));
    assert_null(strstr(body_of(&fx.client), "0123456789"));
    /* the same value twice is one length */
    run_client(&fx, "POST /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 2\r\n"
               "Content-Length: 2\r\n\r\n{}", 0, 0);
    assert_string_equal(body_of(&fx.client), "{}");
    fx_teardown(&fx);
}

static void test_http_valid_json_edges_are_accepted_or_named(void **state)
{
    (void)state;
    fixture_t fx;
    fx_setup(&fx, 0, NULL, 0);
    /* U+0000 is valid JSON: kept in a text, refused by name where a C string is read */
    run_client(&fx, post("/echo", "", "{\"content\":\"a\\u0000b\"}"), 0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 200"));
    assert_string_equal(body_of(&fx.client), "{\"content\":\"a\\u0000b\"}");
    run_client(&fx, post("/echo", "", "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                                      "\"text\":\"\\u0000\"}]}]}"), 0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 200"));
    run_client(&fx, post("/echo", "", "{\"stop\":[\"x\",\"a\\u0000\"]}"), 0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 400"));
    assert_non_null(strstr(body_of(&fx.client), "'stop[1]'"));
    /* an integer past 64 bits is a range error naming its member */
    run_client(&fx, post("/echo", "", "{\"a\":{\"b\":[1,2]},\"n_predict\":9223372036854775808}"), 0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 400"));
    assert_non_null(strstr(body_of(&fx.client), "'n_predict'"));
    assert_non_null(strstr(body_of(&fx.client), "out of range"));
    run_client(&fx, post("/echo", "", "{\"x\":\"}\",\"logit_bias\":[[1,2],[3,-99999999999999999999]]}"), 0, 0);
    assert_non_null(strstr(body_of(&fx.client), "'logit_bias[1][1]'"));
    run_client(&fx, post("/echo", "", "{\"n\":9223372036854775807}"), 0, 0);
    assert_string_equal(body_of(&fx.client), "{\"n\":9223372036854775807}");
    fx_teardown(&fx);
}

/* A body past BODY_OFF_LOOP_BYTES is parsed on the thread pool: the route sees the
 * same JSON, a bad one gets the same 400, and a client that leaves meanwhile costs
 * nothing (the sanitizers watch the copy and the request). */
static void test_http_large_bodies_parse_off_the_loop(void **state)
{
    (void)state;
    fixture_t fx;
    fx_setup(&fx, 0, NULL, 0);
    size_t n = BODY_OFF_LOOP_BYTES + 1000;
    char *body = malloc(n + 64), *req = malloc(n + 512);
    snprintf(body, 16, "{\"a\":\"");
    memset(body + 6, 'x', n);
    snprintf(body + 6 + n, 8, "\"}");
    snprintf(req, n + 512, "POST /len HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s",
             strlen(body), body);
    run_client(&fx, req, 0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 200"));
    char want[64];
    snprintf(want, sizeof want, "{\"n\":%zu}", n);
    assert_string_equal(body_of(&fx.client), want);
    /* broken at its end */
    body[6 + n] = '\0';
    snprintf(req, n + 512, "POST /len HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s",
             strlen(body), body);
    run_client(&fx, req, 0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 400"));
    assert_non_null(strstr(body_of(&fx.client), "invalid JSON"));
    /* the client closes as soon as it has sent it */
    body[6 + n] = '"';
    snprintf(req, n + 512, "POST /len HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s",
             strlen(body), body);
    run_client(&fx, req, SIZE_MAX, 300);
    run_client(&fx, post("/echo", "", "{}"), 0, 0);
    assert_string_equal(body_of(&fx.client), "{}");
    free(body);
    free(req);
    fx_teardown(&fx);
}

static void test_http_body_over_limit_is_413_json(void **state)
{
    (void)state;
    fixture_t fx;
    fx_setup(&fx, 64, NULL, 0);
    run_client(&fx, post("/echo", "", "{\"a\":\"0123456789012345678901234567890123456789012345678901234567890123456789\"}"), 0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 413"));
    assert_non_null(strstr(fx.client.response, "application/json"));
    assert_non_null(strstr(body_of(&fx.client), "\"code\":413"));
    assert_non_null(strstr(body_of(&fx.client), "limit of 64 bytes"));
    /* the server goes on */
    run_client(&fx, post("/echo", "", "{}"), 0, 0);
    assert_string_equal(body_of(&fx.client), "{}");
    fx_teardown(&fx);
}

static void test_http_stream_delivers_every_piece_then_ends(void **state)
{
    (void)state;
    fixture_t fx;
    fx_setup(&fx, 0, NULL, 0);
    run_client(&fx, post("/stream", "", "{}"), 0, 50);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 200"));
    assert_non_null(strstr(fx.client.response, "text/event-stream"));
    const char *b = body_of(&fx.client);
    const char *p0 = strstr(b, "data: 0"), *p1 = strstr(b, "data: 1"), *p2 = strstr(b, "data: 2");
    assert_true(p0 && p1 && p2 && p0 < p1 && p1 < p2);
    assert_int_equal(fx.gone_calls, 0);
    assert_int_equal(rt_http_open_requests(fx.http), 0);
    fx_teardown(&fx);
}

static void test_http_client_leaving_a_stream_calls_gone_once(void **state)
{
    (void)state;
    fixture_t fx;
    fx_setup(&fx, 0, NULL, 0);
    run_client(&fx, post("/endless", "", "{}"), 200, 400);
    assert_int_equal(fx.gone_calls, 1);
    assert_null(fx.held);
    assert_int_equal(rt_http_open_requests(fx.http), 0);
    fx_teardown(&fx);
}

static void test_http_client_leaving_a_deferred_answer_calls_gone(void **state)
{
    (void)state;
    fixture_t fx;
    fx_setup(&fx, 0, NULL, 0);
    /* the client sends and closes without reading: the watch must notice */
    run_client(&fx, post("/deferred", "", "{}"), SIZE_MAX, 400);
    assert_int_equal(fx.gone_calls, 1);
    assert_int_equal(rt_http_open_requests(fx.http), 0);
    fx_teardown(&fx);
}

static void test_http_deferred_answer_arrives(void **state)
{
    (void)state;
    fixture_t fx;
    fx_setup(&fx, 0, NULL, 0);
    run_client(&fx, post("/late", "", "{}"), 0, 0);
    assert_non_null(strstr(fx.client.response, "HTTP/1.1 503"));
    assert_string_equal(body_of(&fx.client),
                        "{\"error\":{\"code\":503,\"message\":\"late 7\",\"type\":\"unavailable_error\"}}");
    assert_int_equal(fx.gone_calls, 0);
    fx_teardown(&fx);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    bl_log_init("test", BL_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_http_route_answers_json_with_cors),
        cmocka_unit_test(test_http_unknown_path_is_404_and_wrong_method_405),
        cmocka_unit_test(test_http_options_answers_cors_preflight),
        cmocka_unit_test(test_http_api_keys_guard_all_but_public_routes),
        cmocka_unit_test(test_http_bad_bodies_are_400_naming_the_problem),
        cmocka_unit_test(test_http_head_is_get_without_a_body),
        cmocka_unit_test(test_http_conflicting_content_lengths_are_400),
        cmocka_unit_test(test_http_valid_json_edges_are_accepted_or_named),
        cmocka_unit_test(test_http_large_bodies_parse_off_the_loop),
        cmocka_unit_test(test_http_body_over_limit_is_413_json),
        cmocka_unit_test(test_http_stream_delivers_every_piece_then_ends),
        cmocka_unit_test(test_http_client_leaving_a_stream_calls_gone_once),
        cmocka_unit_test(test_http_client_leaving_a_deferred_answer_calls_gone),
        cmocka_unit_test(test_http_deferred_answer_arrives),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
