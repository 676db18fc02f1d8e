/* The HTTP front of bloomery-serve (see http.h): the listener, h2o's configuration and
 * context on the router's libuv loop, the route table, API keys, CORS preflight,
 * request bodies parsed as JSON, llama-server's error JSON, and the life of a request
 * from h2o's handler call to h2o's disposal of it, streamed or not.
 *
 * Lifetimes. h2o owns its h2o_req_t and frees it when the response is written or the
 * connection dies, sometimes in the middle of a call into h2o. Each request therefore
 * gets a malloc'd rt_req_t that h2o's request points to through a small object in
 * its pool whose dispose callback tells us the h2o side is gone; the rt_req_t is
 * freed only when neither side can still use it.
 *
 * Thread: the loop thread only. */
#include "http.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <netdb.h>
#include <arpa/inet.h>

#include <h2o.h>

#include "log.h"

/* A client that reads slower than a stream is written may hold this much text
 * before it is treated as gone (its slot is worth more than its backlog). */
#define STREAM_BACKLOG_MAX ((size_t)64 << 20)
/* How often requests that wait (deferred answers, streams between tokens) are
 * checked for a client that closed its end; h2o reads nothing while a request is
 * being handled, so it would only notice at the next write. */
#define WATCH_INTERVAL_MS 100

typedef struct route {
    char *method;
    char *path;
    rt_route_fn fn;
    unsigned flags;
} route_t;

/* One accepted connection's libuv handle; h2o closes it and calls conn_closed. */
typedef struct conn {
    uv_tcp_t tcp; /* first: the close callback gets its address */
    rt_http_t *http;
    struct conn *prev, *next;
} conn_t;

struct rt_http {
    uv_loop_t *loop;
    void *app;
    uv_tcp_t listener;
    int listener_open;   /* uv handle initialised and not yet closed */
    int accepting;
    uv_timer_t watch;
    int watch_open;
    h2o_globalconf_t config;
    h2o_context_t ctx;
    int ctx_inited;
    h2o_accept_ctx_t accept_ctx;
    char **api_keys;
    size_t n_api_keys;
    size_t max_body_bytes;
    char *api_prefix;    /* NULL: routes at the root */
    size_t api_prefix_len;
    char *cors_origins, *cors_methods, *cors_headers; /* rt_http_opts_t's, with the defaults */
    int cors_credentials;
    int port;
    route_t *routes;
    size_t n_routes, cap_routes;
    rt_route_fn fallback;      /* GET of a path no route knows (rt_http_set_fallback) */
    conn_t *conns;
    rt_req_t *reqs;      /* every rt_req_t not yet freed */
    size_t n_open;       /* of which h2o still holds the request */
    struct body_job *parse_head, *parse_tail; /* large bodies waiting for the budget */
    size_t parse_bytes;  /* bytes of the bodies copied and being parsed off the loop */
};

typedef struct handler {
    h2o_handler_t super;
    rt_http_t *http;
} handler_t;

typedef struct req_link {
    rt_req_t *r;
} req_link_t;

struct rt_req {
    rt_http_t *http;
    h2o_req_t *req;      /* NULL once h2o disposed of it */
    req_link_t *link;    /* in req's pool; NULL with req */
    rt_req_t *prev, *next;
    char *path;          /* NUL-terminated, without the query */
    json_t *json;
    h2o_generator_t gen;
    rt_req_gone_fn gone_fn;
    void *gone_ud;
    int busy;            /* depth of calls into h2o or the route on this request */
    unsigned answered : 1;   /* the handler gave its complete answer (or ended its stream) */
    unsigned streaming : 1;
    unsigned gone : 1;       /* the gone callback ran (or must never run) */
    unsigned stopped : 1;    /* h2o stopped the generator: no more h2o_send */
    unsigned inflight : 1;   /* h2o_send called, proceed not yet */
    unsigned final_sent : 1;
    unsigned overflow : 1;   /* backlog past STREAM_BACKLOG_MAX */
    unsigned kill : 1;       /* client found gone by the watch: finish it ourselves */
    unsigned anthropic : 1;  /* a RT_ROUTE_ANTHROPIC path: errors in Anthropic's shape */
    char *pend;          /* bytes written, not yet handed to h2o */
    size_t pend_len, pend_cap;
    char *fly;           /* bytes handed to h2o, valid until proceed */
    size_t fly_cap;
};

static void req_maybe_free(rt_req_t *r);
static void stream_flush(rt_req_t *r);

/* --- small helpers ----------------------------------------------------------------- */

static const char *reason_of(int status)
{
    switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return status < 400 ? "OK" : status < 500 ? "Bad Request" : "Internal Server Error";
    }
}

static const char *error_type_of(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 501: return "not_supported_error";
    case 503: return "unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

/* {"error":{"code":status,"message":msg,"type":type}} as compact text; NULL on OOM. */
/* The Anthropic error type of an HTTP status (Anthropic's documented set). */
static const char *anthropic_error_type(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

json_t *rt_http_error_json(int status, const char *type, const char *msg, int anthropic)
{
    if (anthropic)
        return json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "type",
                         anthropic_error_type(status), "message", msg);
    return json_pack("{s:{s:i,s:s,s:s}}", "error", "code", status, "message", msg, "type",
                     type ? type : error_type_of(status));
}

static char *error_body(int status, const char *type, const char *msg, size_t *len, int anthropic)
{
    json_t *j = rt_http_error_json(status, type, msg ? msg : "", anthropic);
    /* msg may be invalid UTF-8 (jansson refuses it): say so rather than fail */
    if (!j && !(j = rt_http_error_json(status, type, "(error message was not valid UTF-8)",
                                       anthropic)))
        return NULL;
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (s && len)
        *len = strlen(s);
    return s;
}

static void list_add(rt_http_t *h, rt_req_t *r)
{
    r->prev = NULL;
    r->next = h->reqs;
    if (h->reqs)
        h->reqs->prev = r;
    h->reqs = r;
}

static void list_del(rt_http_t *h, rt_req_t *r)
{
    if (r->prev)
        r->prev->next = r->next;
    else if (h->reqs == r)
        h->reqs = r->next;
    if (r->next)
        r->next->prev = r->prev;
    r->prev = r->next = NULL;
}

/* Copies s into req's pool (NUL-terminated). */
static const char *pool_str(h2o_req_t *req, const char *s, size_t len)
{
    char *p = h2o_mem_alloc_pool(&req->pool, len + 1);
    memcpy(p, s, len);
    p[len] = 0;
    return p;
}

static void add_header(h2o_req_t *req, const h2o_token_t *token, const char *name, const char *value)
{
    size_t len = strlen(value);
    const char *v = pool_str(req, value, len);
    if (token) {
        h2o_add_header(&req->pool, &req->res.headers, token, NULL, v, len);
    } else {
        const char *n = pool_str(req, name, strlen(name));
        h2o_add_header_by_str(&req->pool, &req->res.headers, n, strlen(n), 0, NULL, v, len);
    }
}

/* Is the host of an Origin ("http://localhost:3000") localhost, 127.0.0.1 or [::1]? */
static int origin_is_local(h2o_iovec_t o)
{
    const char *p = memchr(o.base, ':', o.len);
    if (!p || (size_t)(p - o.base) + 3 > o.len || p[1] != '/' || p[2] != '/')
        return 0;
    const char *host = p + 3, *end = o.base + o.len;
    size_t n;
    if (host < end && *host == '[') { /* [::1]:port */
        const char *close = memchr(host, ']', (size_t)(end - host));
        if (!close)
            return 0;
        n = (size_t)(close - host) + 1;
    } else {
        const char *colon = memchr(host, ':', (size_t)(end - host));
        const char *slash = memchr(host, '/', (size_t)(end - host));
        const char *stop = colon && (!slash || colon < slash) ? colon : slash ? slash : end;
        n = (size_t)(stop - host);
    }
    return (n == 9 && !strncasecmp(host, "localhost", 9)) || (n == 9 && !memcmp(host, "127.0.0.1", 9)) ||
           (n == 5 && !memcmp(host, "[::1]", 5));
}

/* Access-Control-Allow-Origin as llama-server sends it (rt_http_opts_t.cors_*). */
static void add_cors(h2o_req_t *req)
{
    const rt_http_t *h = (const rt_http_t *)((const char *)req->conn->ctx - offsetof(rt_http_t, ctx));
    const ssize_t i = h2o_find_header_by_str(&req->headers, H2O_STRLIT("origin"), -1);
    const h2o_iovec_t origin = i >= 0 ? req->headers.entries[i].value : h2o_iovec_init(H2O_STRLIT(""));
    if (!strcmp(h->cors_origins, "*") && h->cors_credentials) {
        if (i >= 0)
            h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_ACCESS_CONTROL_ALLOW_ORIGIN, NULL, origin.base,
                           origin.len);
        else /* no Origin: not a browser; "*" says the same as llama-server's empty echo */
            add_header(req, H2O_TOKEN_ACCESS_CONTROL_ALLOW_ORIGIN, NULL, "*");
    } else if (!strcmp(h->cors_origins, "localhost")) {
        if (origin_is_local(origin))
            h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_ACCESS_CONTROL_ALLOW_ORIGIN, NULL, origin.base,
                           origin.len);
    } else {
        add_header(req, H2O_TOKEN_ACCESS_CONTROL_ALLOW_ORIGIN, NULL, h->cors_origins);
    }
}

/* --- request lifetime ---------------------------------------------------------------- */

static void req_free(rt_req_t *r)
{
    list_del(r->http, r);
    json_decref(r->json);
    free(r->pend);
    free(r->fly);
    free(r);
}

/* Frees r once nothing can use it: h2o is done with it and either the handler
 * answered or it promised (by registering a gone callback that has run) never to
 * touch it again. A deferred request without a gone callback stays until the
 * handler answers it, so that late answer lands on a live object. */
static void req_maybe_free(rt_req_t *r)
{
    if (r->busy || r->req)
        return;
    if (r->answered || r->gone)
        req_free(r);
}

/* Tells r's handler the client is gone (once), and logs it: whatever noticed, the
 * watch (reason closed or backlog) or h2o (stopped: a write failed mid-stream, or
 * disposed: the connection died). */
static void run_gone(rt_req_t *r, const char *reason)
{
    if (r->gone || r->answered || !r->gone_fn)
        return;
    BL_LOG(BL_LOG_INFO, "event=client_gone path=%s reason=%s streaming=%d",
           r->path ? r->path : "?", reason, r->streaming);
    r->gone = 1;
    r->busy++;
    r->gone_fn(r->gone_ud);
    r->busy--;
}

/* h2o clears the request's pool: the h2o request dies now. */
static void on_pool_dispose(void *p)
{
    req_link_t *link = p;
    rt_req_t *r = link->r;
    if (!r)
        return;
    link->r = NULL;
    r->link = NULL;
    r->req = NULL;
    r->stopped = 1;
    r->http->n_open--;
    run_gone(r, "disposed");
    req_maybe_free(r);
}

/* The client left during a stream (or h2o gave up on the connection). */
static void gen_stop(h2o_generator_t *gen, h2o_req_t *req)
{
    (void)req;
    rt_req_t *r = H2O_STRUCT_FROM_MEMBER(rt_req_t, gen, gen);
    r->stopped = 1;
    r->inflight = 0;
    run_gone(r, "stopped");
    /* the dispose callback follows and frees r */
}

static void gen_proceed(h2o_generator_t *gen, h2o_req_t *req)
{
    (void)req;
    rt_req_t *r = H2O_STRUCT_FROM_MEMBER(rt_req_t, gen, gen);
    r->inflight = 0;
    if (r->busy) /* inside our own h2o_send: the caller flushes again */
        return;
    r->busy++;
    stream_flush(r);
    r->busy--;
    req_maybe_free(r);
}

/* Hands the pending bytes to h2o when it is ready for them. The caller holds busy. */
static void stream_flush(rt_req_t *r)
{
    while (r->req && !r->stopped && !r->inflight && !r->final_sent) {
        int final = r->answered || r->kill;
        if (!final && r->pend_len == 0)
            return;
        /* swap the buffers: what is pending now flies, the old flying one is free */
        char *b = r->fly;
        size_t cap = r->fly_cap;
        r->fly = r->pend;
        r->fly_cap = r->pend_cap;
        size_t len = r->pend_len;
        r->pend = b;
        r->pend_cap = cap;
        r->pend_len = 0;
        h2o_iovec_t iov = h2o_iovec_init(r->fly, len);
        if (final)
            r->final_sent = 1;
        else
            r->inflight = 1;
        h2o_send(r->req, &iov, len ? 1 : 0,
                 final ? H2O_SEND_STATE_FINAL : H2O_SEND_STATE_IN_PROGRESS);
    }
}

/* The watch: finds waiting requests whose client closed the connection. */
static int client_closed(h2o_req_t *req)
{
    if (!req->conn || !req->conn->callbacks || !req->conn->callbacks->get_socket)
        return 0;
    h2o_socket_t *sock = req->conn->callbacks->get_socket(req->conn);
    if (!sock)
        return 1;
    int fd = h2o_socket_get_fd(sock);
    if (fd < 0)
        return 0;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0)
        return 1; /* orderly close */
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        return 1; /* reset */
    return 0;
}

/* Ends r's h2o request after its handler was told the client is gone. */
static void finish_abandoned(rt_req_t *r)
{
    if (!r->req || r->stopped)
        return;
    r->req->http1_is_persistent = 0;
    r->kill = 1;
    r->busy++;
    if (r->streaming) {
        r->pend_len = 0;
        stream_flush(r);
    } else if (!r->final_sent) {
        /* nobody reads it; it lets h2o write, fail and close */
        static const char body[] = "{\"error\":{\"code\":499,\"message\":\"client closed the "
                                   "connection\",\"type\":\"invalid_request_error\"}}";
        r->final_sent = 1;
        r->req->res.status = 499;
        r->req->res.reason = "Client Closed Request";
        r->req->res.content_length = sizeof body - 1;
        h2o_send_inline(r->req, body, sizeof body - 1);
    }
    r->busy--;
}

static void on_watch(uv_timer_t *t)
{
    rt_http_t *h = t->data;
    rt_req_t *next;
    for (rt_req_t *r = h->reqs; r; r = next) {
        next = r->next;
        if (r->answered || r->gone || !r->gone_fn || r->busy)
            continue;
        int lost = !r->req || r->stopped || r->overflow || client_closed(r->req);
        if (!lost)
            continue;
        r->busy++;
        run_gone(r, r->overflow ? "backlog" : "closed");
        finish_abandoned(r);
        r->busy--;
        /* the gone callback may have answered or freed other requests */
        next = r->next;
        req_maybe_free(r);
    }
}

/* --- replies ------------------------------------------------------------------------- */

void *rt_req_app(const rt_req_t *r)
{
    return r->http->app;
}

const char *rt_req_query(const rt_req_t *r, const char *name, size_t *len)
{
    *len = 0;
    if (!r->req || r->req->query_at == SIZE_MAX || r->req->query_at >= r->req->path.len)
        return NULL;
    const char *p = r->req->path.base + r->req->query_at + 1, *end = r->req->path.base + r->req->path.len;
    const size_t nl = strlen(name);
    while (p < end) {
        const char *amp = memchr(p, '&', (size_t)(end - p)), *stop = amp ? amp : end;
        const char *eq = memchr(p, '=', (size_t)(stop - p));
        const char *key_end = eq ? eq : stop;
        if ((size_t)(key_end - p) == nl && !memcmp(p, name, nl)) {
            const char *v = eq ? eq + 1 : stop;
            *len = (size_t)(stop - v);
            return v;
        }
        p = stop + 1;
    }
    return NULL;
}

const char *rt_req_path(const rt_req_t *r)
{
    return r->path ? r->path : "";
}

json_t *rt_req_json(const rt_req_t *r)
{
    return r->json;
}

void rt_req_set_json(rt_req_t *r, json_t *j)
{
    json_decref(r->json);
    r->json = j;
}

const char *rt_req_header(const rt_req_t *r, const char *name, size_t *len)
{
    if (len)
        *len = 0;
    if (!r->req || !name)
        return NULL;
    char low[128];
    size_t n = strlen(name);
    if (n == 0 || n >= sizeof low)
        return NULL;
    for (size_t i = 0; i < n; i++)
        low[i] = (name[i] >= 'A' && name[i] <= 'Z') ? (char)(name[i] + 32) : name[i];
    low[n] = 0;
    ssize_t i = h2o_find_header_by_str(&r->req->headers, low, n, -1);
    if (i < 0)
        return NULL;
    h2o_iovec_t v = r->req->headers.entries[i].value;
    if (len)
        *len = v.len;
    return v.base;
}

void rt_req_send_text(rt_req_t *r, int status, const char *content_type, const char *body,
                      size_t len)
{
    if (r->answered || r->streaming) {
        BL_LOG(BL_LOG_ERROR, "event=bug what=answered_twice path=%s", rt_req_path(r));
        return;
    }
    r->answered = 1;
    if (!r->req || r->stopped) {
        req_maybe_free(r);
        return;
    }
    h2o_req_t *req = r->req;
    req->res.status = status;
    req->res.reason = reason_of(status);
    req->res.content_length = len;
    add_header(req, H2O_TOKEN_CONTENT_TYPE, NULL, content_type ? content_type : "text/plain");
    add_cors(req);
    r->final_sent = 1;
    r->busy++;
    h2o_send_inline(req, body ? body : "", len);
    r->busy--;
    req_maybe_free(r);
}

void rt_req_send_json(rt_req_t *r, int status, json_t *j)
{
    if (!j) {
        rt_req_send_error(r, 500, NULL, "out of memory building the response");
        return;
    }
    /* 16 digits print float-born values (all of this API's reals) the way
     * llama-server's JSON does (0.800000011920929, not ...92896) and 0.8 as 0.8 */
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(16));
    json_decref(j);
    if (!s) {
        rt_req_send_error(r, 500, NULL, "the response could not be serialised");
        return;
    }
    rt_req_send_text(r, status, "application/json; charset=utf-8", s, strlen(s));
    free(s);
}

void rt_req_send_error(rt_req_t *r, int status, const char *type, const char *fmt, ...)
{
    char stackbuf[512];
    char *msg = stackbuf;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(stackbuf, sizeof stackbuf, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof stackbuf) {
        char *big = malloc((size_t)n + 1);
        if (big) {
            va_start(ap, fmt);
            vsnprintf(big, (size_t)n + 1, fmt, ap);
            va_end(ap);
            msg = big;
        }
    } else if (n < 0) {
        snprintf(stackbuf, sizeof stackbuf, "error");
    }
    size_t len = 0;
    char *body = error_body(status, type, msg, &len, r->anthropic);
    if (msg != stackbuf)
        free(msg);
    if (!body) {
        static const char oom[] =
            "{\"error\":{\"code\":500,\"message\":\"out of memory\",\"type\":\"server_error\"}}";
        rt_req_send_text(r, 500, "application/json; charset=utf-8", oom, sizeof oom - 1);
        return;
    }
    rt_req_send_text(r, status, "application/json; charset=utf-8", body, len);
    free(body);
}

void rt_req_stream_start(rt_req_t *r, int status, const char *content_type, rt_req_gone_fn gone,
                         void *ud)
{
    if (r->answered || r->streaming) {
        BL_LOG(BL_LOG_ERROR, "event=bug what=stream_after_answer path=%s", rt_req_path(r));
        return;
    }
    r->streaming = 1;
    r->gone_fn = gone;
    r->gone_ud = ud;
    if (!r->req || r->stopped)
        return; /* the watch reports the departed client on its next turn */
    h2o_req_t *req = r->req;
    req->res.status = status;
    req->res.reason = reason_of(status);
    req->res.content_length = SIZE_MAX;
    add_header(req, H2O_TOKEN_CONTENT_TYPE, NULL,
               content_type ? content_type : "text/event-stream");
    add_header(req, H2O_TOKEN_CACHE_CONTROL, NULL, "no-cache");
    add_cors(req);
    r->gen.proceed = gen_proceed;
    r->gen.stop = gen_stop;
    r->busy++;
    h2o_start_response(req, &r->gen);
    /* an empty send puts the status line and headers on the wire at once, which
     * SDKs wait for before they read events */
    r->inflight = 1;
    h2o_send(req, NULL, 0, H2O_SEND_STATE_IN_PROGRESS);
    r->busy--;
    if (!r->inflight)
        stream_flush(r);
    req_maybe_free(r);
}

void rt_req_stream_write(rt_req_t *r, const char *data, size_t len)
{
    if (!r->streaming || r->answered || r->gone || len == 0)
        return;
    if (r->overflow || !r->req || r->stopped)
        return;
    if (r->pend_len + len > STREAM_BACKLOG_MAX) {
        /* the watch tells the handler on its next turn; the text is dropped */
        r->overflow = 1;
        return;
    }
    if (r->pend_len + len > r->pend_cap) {
        size_t cap = r->pend_cap ? r->pend_cap : 4096;
        while (cap < r->pend_len + len)
            cap *= 2;
        char *p = realloc(r->pend, cap);
        if (!p) {
            r->overflow = 1;
            return;
        }
        r->pend = p;
        r->pend_cap = cap;
    }
    memcpy(r->pend + r->pend_len, data, len);
    r->pend_len += len;
    if (!r->inflight) {
        r->busy++;
        stream_flush(r);
        r->busy--;
    }
}

void rt_req_stream_end(rt_req_t *r)
{
    if (!r->streaming || r->answered)
        return;
    r->answered = 1;
    r->busy++;
    stream_flush(r);
    r->busy--;
    req_maybe_free(r);
}

void rt_req_on_gone(rt_req_t *r, rt_req_gone_fn gone, void *ud)
{
    if (r->answered || r->streaming)
        return;
    r->gone_fn = gone;
    r->gone_ud = ud;
}

/* --- the handler --------------------------------------------------------------------- */

/* Compares without an early exit, so that the time taken says nothing about how
 * much of a key matched. */
static int key_equal(const char *a, size_t alen, const char *b)
{
    size_t blen = strlen(b);
    unsigned diff = (unsigned)(alen ^ blen);
    for (size_t i = 0; i < alen; i++)
        diff |= (unsigned)(unsigned char)a[i] ^ (unsigned)(unsigned char)b[i < blen ? i : 0];
    return diff == 0 && blen > 0;
}

static int authorized(rt_http_t *h, rt_req_t *r)
{
    size_t len;
    const char *v = rt_req_header(r, "authorization", &len);
    static const char bearer[] = "Bearer ";
    if (v && len > sizeof bearer - 1 && memcmp(v, bearer, sizeof bearer - 1) == 0) {
        for (size_t k = 0; k < h->n_api_keys; k++)
            if (key_equal(v + sizeof bearer - 1, len - (sizeof bearer - 1), h->api_keys[k]))
                return 1;
    }
    v = rt_req_header(r, "x-api-key", &len);
    if (v) {
        for (size_t k = 0; k < h->n_api_keys; k++)
            if (key_equal(v, len, h->api_keys[k]))
                return 1;
    }
    return 0;
}

static void answer_options(rt_req_t *r)
{
    h2o_req_t *req = r->req;
    const rt_http_t *h = r->http;
    add_header(req, NULL, "access-control-allow-credentials", h->cors_credentials ? "true" : "false");
    add_header(req, NULL, "access-control-allow-methods", h->cors_methods);
    add_header(req, NULL, "access-control-allow-headers", h->cors_headers);
    rt_req_send_text(r, 200, "text/html", "", 0);
}

/* The member path ("messages[1].content", "n_predict") of the value that ends at
 * byte pos of a JSON text that is valid up to there, for errors that jansson reports
 * only by offset. Keys are shown as written (escapes and all), cut at 48 bytes. */
static void json_path_at(const char *s, size_t n, size_t pos, char *out, size_t cap)
{
    enum { MAX_DEPTH = 16 };
    struct {
        int array;
        size_t index;
        const char *key;
        size_t key_len;
    } lv[MAX_DEPTH];
    int depth = 0, deeper = 0, want_key = 0;
    if (pos > n)
        pos = n;
    for (size_t i = 0; i < pos; i++) {
        char c = s[i];
        if (c == '"') {
            size_t j = i + 1;
            while (j < pos && s[j] != '"')
                j += s[j] == '\\' ? 2 : 1;
            if (want_key && depth > 0 && !deeper) {
                lv[depth - 1].key = s + i + 1;
                lv[depth - 1].key_len = (j < pos ? j : pos) - (i + 1);
                want_key = 0;
            }
            i = j;
        } else if (c == '{' || c == '[') {
            if (depth < MAX_DEPTH) {
                lv[depth].array = c == '[';
                lv[depth].index = 0;
                lv[depth].key = NULL;
                lv[depth].key_len = 0;
                depth++;
            } else {
                deeper++;
            }
            want_key = c == '{';
        } else if (c == '}' || c == ']') {
            if (deeper)
                deeper--;
            else if (depth)
                depth--;
            want_key = 0;
        } else if (c == ',' && depth && !deeper) {
            if (lv[depth - 1].array)
                lv[depth - 1].index++;
            else
                want_key = 1;
        }
    }
    size_t o = 0;
    out[0] = 0;
    for (int d = 0; d < depth && o + 1 < cap; d++) {
        int w;
        if (lv[d].array)
            w = snprintf(out + o, cap - o, "[%zu]", lv[d].index);
        else if (lv[d].key)
            w = snprintf(out + o, cap - o, "%s%.*s", o ? "." : "",
                         (int)(lv[d].key_len > 48 ? 48 : lv[d].key_len), lv[d].key);
        else
            w = 0;
        if (w < 0)
            break;
        o += (size_t)w < cap - o ? (size_t)w : cap - o - 1;
    }
    if (deeper && o + 5 < cap)
        snprintf(out + o, cap - o, "...");
    for (size_t i = 0; out[i]; i++)
        if ((unsigned char)out[i] < 0x20 || out[i] == 0x7f)
            out[i] = '?';
}

/* Members whose strings may hold U+0000: the texts that are tokenized, which are
 * carried with their lengths. Every other string is read as a C string (names,
 * grammars, stop words, ...), where a NUL would cut it short without a word. */
static int nul_allowed_in(const char *key)
{
    static const char *const keys[] = {"content", "prompt", "text", "system", "input_prefix",
                                       "input_suffix", "input_extra", "suffix"};
    for (size_t i = 0; key && i < sizeof keys / sizeof *keys; i++)
        if (!strcmp(key, keys[i]))
            return 1;
    return 0;
}

/* Finds a string with a NUL where none may be; 1 and its path in out, else 0. */
static int find_bad_nul(const json_t *v, const char *key, char *path, size_t at, size_t cap)
{
    if (at + 1 >= cap)
        return 0;
    if (json_is_string(v))
        return !nul_allowed_in(key) && memchr(json_string_value(v), 0, json_string_length(v));
    if (json_is_array(v)) {
        size_t i;
        const json_t *e;
        json_array_foreach(v, i, e) {
            int w = snprintf(path + at, cap - at, "[%zu]", i);
            size_t next = w < 0 ? at : at + (size_t)w >= cap ? cap - 1 : at + (size_t)w;
            if (find_bad_nul(e, key, path, next, cap))
                return 1;
        }
        path[at] = 0;
        return 0;
    }
    if (json_is_object(v)) {
        const char *k;
        const json_t *e;
        json_object_foreach((json_t *)v, k, e) {
            int w = snprintf(path + at, cap - at, "%s%.48s", at ? "." : "", k);
            size_t next = w < 0 ? at : at + (size_t)w >= cap ? cap - 1 : at + (size_t)w;
            if (find_bad_nul(e, k, path, next, cap))
                return 1;
        }
        path[at] = 0;
    }
    return 0;
}

/* A body as the routes take it: *out its JSON (an object unless any_json), or an
 * error message in msg (the answer is a 400). Pure: runs on any thread. */
static int body_decode(const char *buf, size_t len, int any_json, json_t **out, char *msg,
                       size_t cap)
{
    *out = NULL;
    json_error_t e;
    /* "\u0000" is valid JSON: allowed, then refused only where it cannot be held */
    json_t *j = json_loadb(buf, len, JSON_ALLOW_NUL, &e);
    if (!j) {
        char path[160];
        if (json_error_code(&e) == json_error_invalid_utf8) {
            snprintf(msg, cap, "request body is not valid UTF-8 (byte %d): %s", e.position,
                     e.text);
        } else if (json_error_code(&e) == json_error_numeric_overflow) {
            /* valid JSON, but past what a 64-bit integer holds: a range error */
            json_path_at(buf, len, (size_t)e.position, path, sizeof path);
            snprintf(msg, cap,
                     "'%s': the integer at byte %d is out of range (from "
                     "-9223372036854775808 to 9223372036854775807)",
                     path[0] ? path : "(body)", e.position);
        } else {
            snprintf(msg, cap, "invalid JSON in request body at line %d, column %d (byte %d): %s",
                     e.line, e.column, e.position, e.text);
        }
        return -1;
    }
    if (!any_json && !json_is_object(j)) {
        json_decref(j);
        snprintf(msg, cap, "request body must be a JSON object");
        return -1;
    }
    char path[256] = "";
    if (find_bad_nul(j, NULL, path, 0, sizeof path)) {
        json_decref(j);
        snprintf(msg, cap,
                 "'%s': a NUL character (\\u0000) is allowed only in texts (content, prompt, "
                 "text, system, input_prefix, input_suffix, input_extra, suffix)",
                 path[0] ? path : "(body)");
        return -1;
    }
    *out = j;
    return 0;
}

/* The size and emptiness checks of a POST body; on failure answers r, returns -1. */
static int body_fits(rt_http_t *h, rt_req_t *r)
{
    h2o_iovec_t body = r->req->entity;
    if (body.len > h->max_body_bytes) {
        rt_req_send_error(r, 413, NULL, "request body of %zu bytes is over the limit of %zu bytes",
                          body.len, h->max_body_bytes);
        return -1;
    }
    if (body.base == NULL || body.len == 0) {
        rt_req_send_error(r, 400, NULL, "request body is empty: expected a JSON object");
        return -1;
    }
    return 0;
}

/* Parses the POST body into r->json here, on the loop; on failure answers r and
 * returns -1. */
static int parse_body(rt_http_t *h, rt_req_t *r, int any_json)
{
    if (body_fits(h, r))
        return -1;
    char msg[512];
    if (body_decode(r->req->entity.base, r->req->entity.len, any_json, &r->json, msg,
                    sizeof msg)) {
        rt_req_send_error(r, 400, NULL, "%s", msg);
        return -1;
    }
    return 0;
}

/* A body past this many bytes is parsed on libuv's thread pool, so that megabytes of
 * JSON (about 15 ms a megabyte) do not stall the loop; smaller ones take longer to
 * hand over than to parse. */
#define BODY_OFF_LOOP_BYTES ((size_t)256 << 10)

/* At most this many body bytes are copied and parsed off the loop at once (a body
 * larger than the budget goes alone); the others wait, not yet copied, in arrival
 * order. A body being parsed costs about three times its size (the copy, jansson's
 * growing token buffer, the string), so the budget bounds that part of the peak. */
#define BODY_PARSE_BUDGET ((size_t)64 << 20)

typedef struct body_job {
    uv_work_t work;
    struct body_job *next; /* in the waiting list */
    rt_req_t *r;
    const route_t *route;
    char *buf;           /* a copy: h2o frees the request's own if the client leaves */
    size_t len;
    int any_json;
    json_t *json;
    char msg[512];
} body_job_t;

static void body_job_run(uv_work_t *w)
{
    body_job_t *j = w->data;
    (void)body_decode(j->buf, j->len, j->any_json, &j->json, j->msg, sizeof j->msg);
}

static void parse_start(rt_http_t *h);

static void body_job_done(uv_work_t *w, int status)
{
    body_job_t *j = w->data;
    rt_req_t *r = j->r;
    rt_http_t *h = r->http;
    h->parse_bytes -= j->len;
    free(j->buf);
    if (!r->req || r->stopped || status != 0) {
        /* the client left while its body was parsed (or the loop is closing) */
        json_decref(j->json);
        if (r->req && !r->answered)
            rt_req_send_error(r, 503, NULL, "server is shutting down");
        else
            r->gone = 1; /* nobody will answer it: free it now, not at exit */
    } else if (!j->json) {
        rt_req_send_error(r, 400, NULL, "%s", j->msg);
    } else {
        r->json = j->json;
        j->route->fn(r);
    }
    free(j);
    r->busy--;
    req_maybe_free(r);
    parse_start(h);
}

/* Copies and queues the waiting bodies that fit the budget. */
static void parse_start(rt_http_t *h)
{
    while (h->parse_head && (h->parse_bytes == 0 || h->parse_bytes + h->parse_head->len <=
                                                           BODY_PARSE_BUDGET)) {
        body_job_t *j = h->parse_head;
        h->parse_head = j->next;
        if (!h->parse_head)
            h->parse_tail = NULL;
        rt_req_t *r = j->r;
        if (!r->req || r->stopped) { /* the client left while its body waited */
            r->gone = 1;
            free(j);
            r->busy--;
            req_maybe_free(r);
            continue;
        }
        j->buf = malloc(j->len);
        if (!j->buf) {
            free(j);
            rt_req_send_error(r, 500, NULL, "out of memory for a body of %zu bytes",
                              r->req->entity.len);
            r->busy--;
            req_maybe_free(r);
            continue;
        }
        memcpy(j->buf, r->req->entity.base, j->len);
        h->parse_bytes += j->len;
        if (uv_queue_work(h->loop, &j->work, body_job_run, body_job_done) != 0) {
            h->parse_bytes -= j->len;
            free(j->buf);
            free(j);
            rt_req_send_error(r, 500, NULL, "cannot queue the body's parse");
            r->busy--;
            req_maybe_free(r);
        }
    }
}

/* Starts parsing r's large body off the loop; route's handler runs once it is done.
 * 0, or -1 when r was answered (no memory). */
static int parse_body_off_loop(rt_http_t *h, rt_req_t *r, const route_t *route, int any_json)
{
    body_job_t *j = calloc(1, sizeof *j);
    if (!j) {
        rt_req_send_error(r, 500, NULL, "out of memory for a body of %zu bytes",
                          r->req->entity.len);
        return -1;
    }
    *j = (body_job_t){.r = r, .route = route, .len = r->req->entity.len, .any_json = any_json};
    j->work.data = j;
    r->busy++; /* r outlives h2o's request until the job is back */
    if (h->parse_tail)
        h->parse_tail->next = j;
    else
        h->parse_head = j;
    h->parse_tail = j;
    parse_start(h);
    return 0;
}

/* --- the request head, before h2o reads it ------------------------------------------ */

/* RFC 9112 section 6.3: a message whose Content-Length fields disagree has no
 * trustworthy framing and must be refused. h2o 2.2 frames the body by the first one
 * and keeps none of them, so the check sits where the head is parsed: libh2o calls
 * picohttpparser's phr_parse_request through its PLT, and this definition, in the
 * program, comes first. It calls libh2o's own and reports a head with conflicting
 * lengths as malformed; h2o then answers its plain 400 ("Bad Request", as for any
 * head it cannot parse) and closes the connection, so bytes
 * another reading would frame are never taken for a request. Repeats of one value
 * are one length. picohttpparser's header struct, whose layout is its ABI: */
struct phr_header {
    const char *name;
    size_t name_len;
    const char *value;
    size_t value_len;
};
typedef int (*phr_parse_request_fn)(const char *buf, size_t len, const char **method,
                                    size_t *method_len, const char **path, size_t *path_len,
                                    int *minor_version, struct phr_header *headers,
                                    size_t *num_headers, size_t last_len);
int phr_parse_request(const char *buf, size_t len, const char **method, size_t *method_len,
                      const char **path, size_t *path_len, int *minor_version,
                      struct phr_header *headers, size_t *num_headers, size_t last_len);

static int content_lengths_conflict(const struct phr_header *h, size_t n)
{
    const struct phr_header *first = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!h[i].name || h[i].name_len != 14 || strncasecmp(h[i].name, "content-length", 14))
            continue;
        if (first && !h2o_memis(h[i].value, h[i].value_len, first->value, first->value_len))
            return 1;
        first = &h[i];
    }
    return 0;
}

static phr_parse_request_fn real_parse_request;

static void resolve_parse_request(void)
{
    real_parse_request = (phr_parse_request_fn)dlsym(RTLD_NEXT, "phr_parse_request");
}

int phr_parse_request(const char *buf, size_t len, const char **method, size_t *method_len,
                      const char **path, size_t *path_len, int *minor_version,
                      struct phr_header *headers, size_t *num_headers, size_t last_len)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    (void)pthread_once(&once, resolve_parse_request);
    if (!real_parse_request)
        return -1; /* not reached: libh2o is what calls this */
    size_t max_headers = *num_headers;
    int rc = real_parse_request(buf, len, method, method_len, path, path_len, minor_version,
                                headers, num_headers, last_len);
    if (rc > 0 && *num_headers <= max_headers && content_lengths_conflict(headers, *num_headers)) {
        return -1;
    }
    return rc;
}

void rt_http_set_fallback(rt_http_t *h, rt_route_fn fn) { h->fallback = fn; }

static int route_matches(const route_t *c, const char *path)
{
    if (!(c->flags & RT_ROUTE_PREFIX))
        return strcmp(c->path, path) == 0;
    size_t n = strlen(c->path);
    return strncmp(c->path, path, n) == 0 && path[n] != '\0';
}

static int on_req(h2o_handler_t *self, h2o_req_t *req)
{
    rt_http_t *h = ((handler_t *)self)->http;
    rt_req_t *r = calloc(1, sizeof *r);
    if (!r)
        return -1; /* h2o answers 404; nothing better is possible without memory */
    req_link_t *link = h2o_mem_alloc_shared(&req->pool, sizeof *link, on_pool_dispose);
    link->r = r;
    r->http = h;
    r->req = req;
    r->link = link;
    list_add(h, r);
    h->n_open++;

    /* the path without its query string, as llama-server routes on */
    size_t plen = req->path_normalized.len;
    r->path = (char *)pool_str(req, req->path_normalized.base, plen);
    char *q = memchr(r->path, '?', plen);
    if (q)
        *q = 0;
    /* --api-prefix: every route lives under it, and nothing outside */
    int outside_prefix = 0;
    if (h->api_prefix) {
        if (strncmp(r->path, h->api_prefix, h->api_prefix_len) == 0 &&
            r->path[h->api_prefix_len] == '/')
            r->path += h->api_prefix_len;
        else
            outside_prefix = 1;
    }

    r->busy++;
    h2o_iovec_t m = req->method;
    /* HEAD is GET without the body (h2o_send_inline leaves it out, the headers
     * and Content-Length stay), as load balancers and uptime checks use it */
    if (h2o_memis(m.base, m.len, H2O_STRLIT("HEAD")))
        m = h2o_iovec_init(H2O_STRLIT("GET"));
    if (h2o_memis(m.base, m.len, H2O_STRLIT("OPTIONS"))) {
        answer_options(r);
        goto done;
    }
    const route_t *rt = NULL;
    int path_known = 0;
    for (size_t i = 0; i < h->n_routes && !outside_prefix; i++) {
        if (!route_matches(&h->routes[i], r->path))
            continue;
        path_known = 1;
        if (h->routes[i].flags & RT_ROUTE_ANTHROPIC)
            r->anthropic = 1;
        if (m.len == strlen(h->routes[i].method) && memcmp(m.base, h->routes[i].method, m.len) == 0) {
            rt = &h->routes[i];
            break;
        }
    }
    if (!rt) {
        if (path_known) {
            char allow[64] = "";
            for (size_t i = 0; i < h->n_routes; i++)
                if (route_matches(&h->routes[i], r->path) && strlen(allow) + 16 < sizeof allow)
                    snprintf(allow + strlen(allow), sizeof allow - strlen(allow), "%s%s%s",
                             allow[0] ? ", " : "", h->routes[i].method,
                             strcmp(h->routes[i].method, "GET") ? "" : ", HEAD");
            add_header(req, H2O_TOKEN_ALLOW, NULL, allow);
            rt_req_send_error(r, 405, NULL, "method %.*s is not allowed on %s (allowed: %s)",
                              (int)(req->method.len > 16 ? 16 : req->method.len),
                              req->method.base, r->path, allow);
        } else if (h->fallback && !outside_prefix && h2o_memis(m.base, m.len, H2O_STRLIT("GET"))) {
            h->fallback(r);
        } else {
            rt_req_send_error(r, 404, NULL, "File Not Found");
        }
        goto done;
    }
    if (h->n_api_keys > 0 && !(rt->flags & RT_ROUTE_PUBLIC) && !authorized(h, r)) {
        BL_LOG(BL_LOG_WARN, "event=unauthorized path=%s", r->path);
        rt_req_send_error(r, 401, "authentication_error", "Invalid API Key");
        goto done;
    }
    if (strcmp(rt->method, "POST") == 0 && !(rt->flags & RT_ROUTE_NO_BODY) &&
        !((rt->flags & RT_ROUTE_OPTIONAL_BODY) && req->entity.len == 0)) {
        int any_json = (rt->flags & RT_ROUTE_ANY_JSON) != 0;
        if (body_fits(h, r) == 0 && req->entity.len > BODY_OFF_LOOP_BYTES) {
            (void)parse_body_off_loop(h, r, rt, any_json); /* answers r itself on failure */
            goto done;
        }
        if (r->answered || parse_body(h, r, any_json) != 0)
            goto done;
    }
    rt->fn(r);
done:
    r->busy--;
    req_maybe_free(r);
    return 0;
}

/* --- h2o's own errors as llama-server's JSON ------------------------------------------ */

/* h2o answers some requests itself before any handler runs (a body over the limit:
 * 413; a broken chunked body or Content-Length: 400; a request-target that is not a
 * path: 404). Those answers go through the host's fallback path, where this filter
 * swaps h2o's plain-text body for the error JSON every other answer uses. */
typedef struct json_error_ostream {
    h2o_ostream_t super;
    h2o_iovec_t body;
    int sent;
} json_error_ostream_t;

static void json_error_do_send(h2o_ostream_t *self, h2o_req_t *req, h2o_iovec_t *bufs,
                               size_t bufcnt, h2o_send_state_t state)
{
    (void)bufs;
    (void)bufcnt;
    json_error_ostream_t *o = (json_error_ostream_t *)self;
    if (!o->sent) {
        o->sent = 1;
        h2o_ostream_send_next(&o->super, req, &o->body, 1, state);
    } else {
        h2o_ostream_send_next(&o->super, req, NULL, 0, state);
    }
}

typedef struct json_error_filter {
    h2o_filter_t super;
    rt_http_t *http;
} json_error_filter_t;

static void json_error_setup(h2o_filter_t *self, h2o_req_t *req, h2o_ostream_t **slot)
{
    rt_http_t *h = ((json_error_filter_t *)self)->http;
    int status = req->res.status;
    if (status >= 400) {
        char msg[128];
        if (status == 413)
            snprintf(msg, sizeof msg, "request body is over the limit of %zu bytes",
                     h->max_body_bytes);
        else if (status == 404)
            snprintf(msg, sizeof msg, "File Not Found");

        else
            snprintf(msg, sizeof msg, "%s", req->res.reason ? req->res.reason : "bad request");
        size_t len = 0;
        char *s = error_body(status, NULL, msg, &len, 0);
        if (s) {
            json_error_ostream_t *o =
                (json_error_ostream_t *)h2o_add_ostream(req, sizeof *o, slot);
            o->body.base = (char *)pool_str(req, s, len);
            o->body.len = len;
            o->sent = 0;
            o->super.do_send = json_error_do_send;
            free(s);
            for (size_t i = 0; i < req->res.headers.size; i++)
                if (req->res.headers.entries[i].name == &H2O_TOKEN_CONTENT_TYPE->buf) {
                    h2o_delete_header(&req->res.headers, (ssize_t)i);
                    break;
                }
            add_header(req, H2O_TOKEN_CONTENT_TYPE, NULL, "application/json; charset=utf-8");
            add_cors(req);
            req->res.content_length = len;
            slot = &o->super.next;
        }
    }
    h2o_setup_next_ostream(req, slot);
}

/* --- listener ------------------------------------------------------------------------ */

static void conn_closed(uv_handle_t *handle)
{
    conn_t *c = (conn_t *)handle;
    rt_http_t *h = c->http;
    if (c->prev)
        c->prev->next = c->next;
    else if (h->conns == c)
        h->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    free(c);
}

static void conn_closed_early(uv_handle_t *handle)
{
    free(handle);
}

static void on_connection(uv_stream_t *listener, int status)
{
    rt_http_t *h = listener->data;
    if (status != 0) {
        BL_LOG(BL_LOG_WARN, "event=accept_failed error=%s", uv_strerror(status));
        return;
    }
    conn_t *c = calloc(1, sizeof *c);
    if (!c)
        return;
    if (uv_tcp_init(h->loop, &c->tcp) != 0) {
        free(c);
        return;
    }
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) != 0) {
        uv_close((uv_handle_t *)&c->tcp, conn_closed_early);
        return;
    }
    /* SSE events are small and must leave at once */
    (void)uv_tcp_nodelay(&c->tcp, 1); /* best effort: only latency depends on it */
    c->http = h;
    c->next = h->conns;
    if (h->conns)
        h->conns->prev = c;
    h->conns = c;
    h2o_socket_t *sock = h2o_uv_socket_create((uv_stream_t *)&c->tcp, conn_closed);
    h2o_accept(&h->accept_ctx, sock);
}

static int resolve(const char *host, int port, struct sockaddr_storage *ss, bl_err_t *err)
{
    memset(ss, 0, sizeof *ss);
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)ss) == 0)
        return 0;
    if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)ss) == 0)
        return 0;
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0 || !res)
        return bl_err_set(err, BL_EIO, "cannot resolve host '%.200s': %s", host, gai_strerror(rc));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    if (ss->ss_family == AF_INET)
        ((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
    else if (ss->ss_family == AF_INET6)
        ((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
    freeaddrinfo(res);
    return 0;
}

int rt_http_create(rt_http_t **out, uv_loop_t *loop, const rt_http_opts_t *o, void *app,
                   bl_err_t *err)
{
    *out = NULL;
    if (!loop || !o || !o->host || o->port < 0 || o->port > 65535)
        return bl_err_set(err, BL_EINVAL, "http: bad options (host, port 0..65535)");
    rt_http_t *h = calloc(1, sizeof *h);
    if (!h)
        return bl_err_set(err, BL_ENOMEM, "http: out of memory");
    h->loop = loop;
    h->app = app;
    h->max_body_bytes = o->max_body_bytes ? o->max_body_bytes : ((size_t)32 << 20);
    if (o->api_prefix && o->api_prefix[0]) {
        if (o->api_prefix[0] != '/') {
            free(h);
            return bl_err_set(err, BL_EINVAL, "http: the API prefix must start with '/'");
        }
        h->api_prefix = strdup(o->api_prefix);
        if (!h->api_prefix)
            goto oom;
        h->api_prefix_len = strlen(h->api_prefix);
    }
    h->cors_origins = strdup(o->cors_origins ? o->cors_origins : "*");
    h->cors_methods = strdup(o->cors_methods ? o->cors_methods : "GET, POST, DELETE, OPTIONS");
    h->cors_headers = strdup(o->cors_headers ? o->cors_headers : "*");
    h->cors_credentials = !o->no_cors_credentials;
    if (!h->cors_origins || !h->cors_methods || !h->cors_headers)
        goto oom;
    if (o->n_api_keys) {
        h->api_keys = calloc(o->n_api_keys, sizeof *h->api_keys);
        if (!h->api_keys)
            goto oom;
        for (size_t i = 0; i < o->n_api_keys; i++) {
            h->api_keys[i] = strdup(o->api_keys[i] ? o->api_keys[i] : "");
            if (!h->api_keys[i])
                goto oom;
            h->n_api_keys = i + 1;
        }
    }

    h2o_config_init(&h->config);
    h->config.server_name = h2o_iovec_init(H2O_STRLIT("bloomery"));
    /* h2o refuses a body over its limit as soon as it sees it and closes the
     * connection, which a client still sending takes as a reset, not as the 413.
     * So h2o reads bodies up to twice our limit, and parse_body answers those with
     * a 413 on a connection that stays usable; only beyond that does h2o cut. */
    h->config.max_request_entity_size =
        h->max_body_bytes <= SIZE_MAX / 2 ? 2 * h->max_body_bytes : h->max_body_bytes;
    h->config.http1.upgrade_to_http2 = 0;
    if (o->timeout_s > 0) {
        h->config.http1.req_timeout = (uint64_t)o->timeout_s * 1000;
        h->config.http2.idle_timeout = (uint64_t)o->timeout_s * 1000;
    }
    h2o_hostconf_t *host = h2o_config_register_host(&h->config, h2o_iovec_init(H2O_STRLIT("default")),
                                                    65535);
    h2o_pathconf_t *root = h2o_config_register_path(host, "/", 0);
    handler_t *hd = (handler_t *)h2o_create_handler(root, sizeof *hd);
    hd->http = h;
    hd->super.on_req = on_req;
    json_error_filter_t *f =
        (json_error_filter_t *)h2o_create_filter(&host->fallback_path, sizeof *f);
    f->http = h;
    f->super.on_setup_ostream = json_error_setup;

    h2o_context_init(&h->ctx, loop, &h->config);
    h->ctx_inited = 1;
    h->accept_ctx.ctx = &h->ctx;
    h->accept_ctx.hosts = h->config.hosts;

    struct sockaddr_storage ss;
    int rc = resolve(o->host, o->port, &ss, err);
    if (rc)
        goto fail;
    uv_tcp_init_ex(loop, &h->listener, ss.ss_family);
    h->listener.data = h;
    h->listener_open = 1;
    int uerr = 0;
    if (o->reuse_port) { /* before the bind: several servers may then share the port */
        uv_os_fd_t fd;
        const int one = 1;
        uerr = uv_fileno((uv_handle_t *)&h->listener, &fd);
        if (uerr == 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0)
            uerr = uv_translate_sys_error(errno);
    }
    if (uerr == 0)
        uerr = uv_tcp_bind(&h->listener, (const struct sockaddr *)&ss, 0);
    if (uerr == 0)
        uerr = uv_listen((uv_stream_t *)&h->listener, 128, on_connection);
    if (uerr != 0) {
        rc = bl_err_set(err, BL_EIO, "cannot listen on %s:%d: %s", o->host, o->port,
                        uv_strerror(uerr));
        goto fail;
    }
    h->accepting = 1;
    struct sockaddr_storage bound;
    int blen = sizeof bound;
    if (uv_tcp_getsockname(&h->listener, (struct sockaddr *)&bound, &blen) == 0)
        h->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                    : ((struct sockaddr_in *)&bound)->sin_port);
    else
        h->port = o->port;

    uv_timer_init(loop, &h->watch);
    h->watch.data = h;
    h->watch_open = 1;
    uv_timer_start(&h->watch, on_watch, WATCH_INTERVAL_MS, WATCH_INTERVAL_MS);
    uv_unref((uv_handle_t *)&h->watch); /* never the reason the loop keeps running */

    *out = h;
    return 0;
oom:
    rc = bl_err_set(err, BL_ENOMEM, "http: out of memory");
fail:
    rt_http_destroy(h);
    return rc;
}

int rt_http_port(const rt_http_t *h)
{
    return h ? h->port : 0;
}

static void listener_closed(uv_handle_t *handle)
{
    rt_http_t *h = handle->data;
    h->listener_open = 0;
}

static void watch_closed(uv_handle_t *handle)
{
    rt_http_t *h = handle->data;
    h->watch_open = 0;
}

void rt_http_stop_accepting(rt_http_t *h)
{
    if (!h || !h->accepting)
        return;
    h->accepting = 0;
    uv_close((uv_handle_t *)&h->listener, listener_closed);
    /* answers from now on close their connection instead of keeping it alive. The
     * flag is set directly: h2o_context_request_shutdown would also arm HTTP/2's
     * graceful-shutdown timer, which h2o_context_dispose then finds still linked
     * (HTTP/1 only is served here) */
    h->ctx.shutdown_requested = 1;
}

size_t rt_http_open_requests(const rt_http_t *h)
{
    return h ? h->n_open : 0;
}

int rt_http_route(rt_http_t *h, const char *method, const char *path, rt_route_fn fn,
                  unsigned flags)
{
    if (!h || !method || !path || !fn || path[0] != '/' ||
        (strcmp(method, "GET") != 0 && strcmp(method, "POST") != 0))
        return BL_EINVAL;
    for (size_t i = 0; i < h->n_routes; i++)
        if (!strcmp(h->routes[i].path, path) && !strcmp(h->routes[i].method, method))
            return BL_EINVAL;
    if (h->n_routes == h->cap_routes) {
        size_t cap = h->cap_routes ? h->cap_routes * 2 : 16;
        route_t *p = realloc(h->routes, cap * sizeof *p);
        if (!p)
            return BL_ENOMEM;
        h->routes = p;
        h->cap_routes = cap;
    }
    route_t *rt = &h->routes[h->n_routes];
    rt->method = strdup(method);
    rt->path = strdup(path);
    if (!rt->method || !rt->path) {
        free(rt->method);
        free(rt->path);
        return BL_ENOMEM;
    }
    rt->fn = fn;
    rt->flags = flags;
    h->n_routes++;
    return 0;
}

void rt_http_destroy(rt_http_t *h)
{
    if (!h)
        return;
    if (h->accepting) {
        h->accepting = 0;
        uv_close((uv_handle_t *)&h->listener, listener_closed);
    } else if (h->listener_open && !uv_is_closing((uv_handle_t *)&h->listener)) {
        uv_close((uv_handle_t *)&h->listener, listener_closed);
    }
    if (h->watch_open && !uv_is_closing((uv_handle_t *)&h->watch))
        uv_close((uv_handle_t *)&h->watch, watch_closed);
    /* Shutting a socket down makes h2o read an end of stream (idle keep-alive
     * connections) or fail its next write (answers in flight), and close the
     * connection itself, which keeps its bookkeeping straight. */
    for (conn_t *c = h->conns; c; c = c->next) {
        uv_os_fd_t fd;
        if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
            shutdown(fd, SHUT_RDWR);
    }
    for (int i = 0; i < 400 && (h->conns || h->listener_open || h->watch_open); i++) {
        uv_run(h->loop, UV_RUN_NOWAIT);
        if (h->conns)
            uv_sleep(5);
    }
    if (h->conns || h->listener_open || h->watch_open) {
        /* h2o still holds connections that point at h: leaking it is the safe end */
        BL_LOG(BL_LOG_WARN, "event=http_destroy what=connections_left_open");
        return;
    }
    if (h->ctx_inited) {
        if (h2o_timeout_is_linked(&h->ctx.http2._graceful_shutdown_timeout))
            h2o_timeout_unlink(&h->ctx.http2._graceful_shutdown_timeout);
        h2o_context_dispose(&h->ctx);
    }
    h2o_config_dispose(&h->config);
    /* requests whose handler never answered (a bug elsewhere) */
    while (h->parse_head) { /* bodies that never got their turn */
        body_job_t *j = h->parse_head;
        h->parse_head = j->next;
        j->r->busy--;
        free(j);
    }
    while (h->reqs) {
        rt_req_t *r = h->reqs;
        if (r->link)
            r->link->r = NULL;
        req_free(r);
    }
    uv_run(h->loop, UV_RUN_NOWAIT); /* close callbacks of h2o's timers */
    for (size_t i = 0; i < h->n_routes; i++) {
        free(h->routes[i].method);
        free(h->routes[i].path);
    }
    free(h->routes);
    for (size_t i = 0; i < h->n_api_keys; i++)
        free(h->api_keys[i]);
    free(h->api_keys);
    free(h->api_prefix);
    free(h->cors_origins);
    free(h->cors_methods);
    free(h->cors_headers);
    free(h);
}
