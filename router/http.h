/* The HTTP front of bloomery-serve: h2o 2.2.5 on the router's libuv loop. It owns the
 * listener, the route table, the request-body limit, API-key checks, llama-server's
 * error JSON, and streamed (chunked) responses such as SSE. Handlers get a rt_req_t,
 * answer it exactly once (at once or later, from another loop callback), and never
 * see h2o types.
 *
 * Thread: everything here runs on the loop thread. */
#ifndef RT_HTTP_H
#define RT_HTTP_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "err.h"

typedef struct rt_http rt_http_t;
typedef struct rt_req rt_req_t;

typedef struct rt_http_opts {
    const char *host;          /* "127.0.0.1" */
    int port;                  /* 8080; 0: any free port (rt_http_port says which) */
    const char *const *api_keys; /* accepted keys (NULL or n_api_keys 0: no auth) */
    size_t n_api_keys;
    size_t max_body_bytes;     /* larger bodies get 413 */
    int timeout_s;             /* idle connection timeout (--timeout) */
    const char *api_prefix;    /* every route under this path ("/v2"); NULL or "": none */
    /* CORS, as llama-server's --cors-* flags (NULL: its defaults). Origins "*" with
     * credentials echoes the request's Origin; "localhost" echoes an Origin whose host
     * is localhost, 127.0.0.1 or [::1] and sends none for others; anything else is
     * sent as given. A preflight (OPTIONS) gets the origin, credentials, methods and
     * headers; other answers get the origin only. */
    const char *cors_origins;  /* "*" */
    const char *cors_methods;  /* "GET, POST, DELETE, OPTIONS" */
    const char *cors_headers;  /* "*" */
    int no_cors_credentials;   /* Access-Control-Allow-Credentials: false */
    int reuse_port;            /* SO_REUSEPORT on the listening socket */
} rt_http_opts_t;

/* Binds host:port and starts accepting on loop. app is handed to handlers
 * (rt_req_app). BL_EIO naming the address (in use, cannot resolve), BL_ENOMEM. */
int rt_http_create(rt_http_t **out, uv_loop_t *loop, const rt_http_opts_t *o, void *app,
                   bl_err_t *err) BL_WUR;
int rt_http_port(const rt_http_t *h);
/* Closes the listener: new connections are refused; open requests go on. */
void rt_http_stop_accepting(rt_http_t *h);
/* Number of requests not yet fully answered. */
size_t rt_http_open_requests(const rt_http_t *h);
/* Closes every connection and frees h. After the loop has no more work for it. */
void rt_http_destroy(rt_http_t *h);

typedef void (*rt_route_fn)(rt_req_t *r);

enum {
    RT_ROUTE_PUBLIC = 1u << 0, /* no API key needed (/health, /v1/models, /models) */
    RT_ROUTE_ANY_JSON = 1u << 1, /* a POST body may be any JSON value, not only an object */
    RT_ROUTE_PREFIX = 1u << 2,   /* path ends with '/' and takes every longer path that
                                  * starts with it ("/slots/" takes "/slots/0") */
    RT_ROUTE_NO_BODY = 1u << 3,  /* a POST whose body is not read (rt_req_json: NULL) */
    RT_ROUTE_ANTHROPIC = 1u << 4, /* errors in Anthropic's shape, {"type":"error","error":
                                   * {"type","message"}}: rt_req_send_error's and those
                                   * answered before the handler (401, 405, the body's) */
    RT_ROUTE_OPTIONAL_BODY = 1u << 5, /* a POST may come without a body (rt_req_json:
                                       * NULL); one that comes must be JSON */
};

/* An error object: llama-server's {"error":{"code","message","type"}} (type NULL: the
 * status's), or Anthropic's {"type":"error","error":{"type","message"}}. A new
 * reference; NULL when msg is not UTF-8 or memory is out. */
json_t *rt_http_error_json(int status, const char *type, const char *msg, int anthropic);

/* The handler of a GET (or HEAD) whose path no route knows, in place of the 404
 * (--path's static files); public: no API key is asked. NULL: none. */
void rt_http_set_fallback(rt_http_t *h, rt_route_fn fn);

/* Adds a route: method "GET" or "POST", an exact path. A known path with another
 * method gets 405; an unknown path 404. For POST the body must be JSON (400
 * otherwise, before the handler runs); rt_req_json gives it. BL_ENOMEM, BL_EINVAL. */
int rt_http_route(rt_http_t *h, const char *method, const char *path, rt_route_fn fn,
                  unsigned flags) BL_WUR;

void *rt_req_app(const rt_req_t *r);
const char *rt_req_path(const rt_req_t *r);
/* The value of query parameter name ("?a=1&b" gives "1" for a, "" for b), as given
 * (not %-decoded), with its length; NULL when absent. */
const char *rt_req_query(const rt_req_t *r, const char *name, size_t *len);
/* The parsed JSON body of a POST (borrowed, valid until the request ends); NULL for
 * a GET. */
json_t *rt_req_json(const rt_req_t *r);
/* Replaces the request's JSON with j (stolen; the old one is released): a route that
 * answers through another's handler with a translated body (/v1/responses). */
void rt_req_set_json(rt_req_t *r, json_t *j);
/* A request header (case-insensitive name), or NULL; *len its length. */
const char *rt_req_header(const rt_req_t *r, const char *name, size_t *len);

/* Complete answers. rt_req_send_json steals j. */
void rt_req_send_json(rt_req_t *r, int status, json_t *j);
void rt_req_send_text(rt_req_t *r, int status, const char *content_type, const char *body,
                      size_t len);

/* llama-server's error JSON: {"error":{"code":status,"message":...,"type":type}}
 * (Anthropic's on a RT_ROUTE_ANTHROPIC path, with the type of the status).
 * type NULL picks it from the status: 400 invalid_request_error, 401
 * authentication_error, 404 not_found_error, 413 invalid_request_error, 500
 * server_error, 501 not_supported_error, 503 unavailable_error. */
void rt_req_send_error(rt_req_t *r, int status, const char *type, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Streamed answers (SSE and the like): start with the status and content type, then
 * write any number of pieces (copied and buffered while the client is slow), then
 * end. gone runs once if the client disconnects before the end: the handler cancels
 * its work there and must not touch r afterwards. */
typedef void (*rt_req_gone_fn)(void *ud);
void rt_req_stream_start(rt_req_t *r, int status, const char *content_type,
                         rt_req_gone_fn gone, void *ud);
void rt_req_stream_write(rt_req_t *r, const char *data, size_t len);
void rt_req_stream_end(rt_req_t *r);

/* For a request answered later (not streamed): gone runs if the client leaves
 * before the answer; afterwards r must not be touched. Optional. */
void rt_req_on_gone(rt_req_t *r, rt_req_gone_fn gone, void *ud);

#endif
