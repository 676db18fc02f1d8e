/* The hostfile (hostfile.h): each line checked and parsed into an entry, then the
 * rules over the whole file, in one pass in file order so that the error reported
 * is the one on the earliest line. */
#include "hostfile.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file.h"

typedef struct ctx {
    const char *name; /* the text's name in messages */
    bl_err_t *err;
} ctx_t;

/* One field of a line: not NUL-terminated, never empty. */
typedef struct tok {
    const char *p;
    size_t n;
} tok_t;

/* --- messages ------------------------------------------------------------------- */

/* "NAME:LINE: message" (line 0: "NAME: message"), BL_EINVAL. */
BL_PRINTF(3, 4)
static int refuse(const ctx_t *c, int line, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line > 0)
        return bl_err_set(c->err, BL_EINVAL, "%.100s:%d: %s", c->name, line, msg);
    return bl_err_set(c->err, BL_EINVAL, "%.100s: %s", c->name, msg);
}

/* A field for a message: at most 48 bytes, cut on a character boundary (the line
 * is valid UTF-8 by then) and marked "..." where cut, so a long field cannot push
 * the line number's context out of the message. */
static const char *clip(char buf[56], tok_t t)
{
    size_t n = t.n;
    if (n > 48) {
        n = 48;
        while (n > 0 && ((unsigned char)t.p[n] & 0xc0) == 0x80)
            n--;
    }
    memcpy(buf, t.p, n);
    if (n < t.n)
        memcpy(buf + n, "...", 4);
    else
        buf[n] = '\0';
    return buf;
}

/* HOST:PORT for messages, an IPv6 address in brackets as it is written. */
static const char *hostport(char *buf, size_t cap, const bl_host_entry_t *e)
{
    if (strchr(e->host, ':'))
        snprintf(buf, cap, "[%s]:%u", e->host, (unsigned)e->port);
    else
        snprintf(buf, cap, "%s:%u", e->host, (unsigned)e->port);
    return buf;
}

static int tok_is(tok_t t, const char *s) { return strlen(s) == t.n && memcmp(t.p, s, t.n) == 0; }

static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }

/* A decimal number of n >= 1 digits into *out; -1 if it is not one or exceeds max
 * (stopping there, so that no length of digits overflows). Leading zeros are read as
 * decimal, like the flags' numbers. */
static int dec(const char *p, size_t n, int64_t max, int64_t *out)
{
    if (n == 0)
        return -1;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!is_digit(p[i]))
            return -1;
        v = v * 10 + (p[i] - '0');
        if (v > max)
            return -1;
    }
    *out = v;
    return 0;
}

/* --- bytes of a line ------------------------------------------------------------ */

/* The length of the UTF-8 character at p (n bytes left), or 0 if malformed:
 * overlong forms, surrogates and code points past U+10FFFF included. */
static size_t utf8_len(const unsigned char *p, size_t n)
{
    const unsigned b = p[0];
    size_t k;
    uint32_t cp, min;
    if (b < 0x80)
        return 1;
    if (b >= 0xc2 && b <= 0xdf) {
        k = 2, cp = b & 0x1f, min = 0x80;
    } else if ((b & 0xf0) == 0xe0) {
        k = 3, cp = b & 0x0f, min = 0x800;
    } else if (b >= 0xf0 && b <= 0xf4) {
        k = 4, cp = b & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if (k > n)
        return 0;
    for (size_t i = 1; i < k; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return k;
}

/* The whole line, comment included, is UTF-8 without control bytes (a tab aside):
 * a NUL or a stray CR most often means a file that is not the text it seems, and
 * saying so beats a confusing error about a field. */
static int check_bytes(const ctx_t *c, int line, const char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        const unsigned char b = (unsigned char)s[i];
        if (b == 0)
            return refuse(c, line, "a NUL byte at column %zu: not a text file", i + 1);
        if ((b < 0x20 && b != '\t') || b == 0x7f)
            return refuse(c, line, "a control byte 0x%02x at column %zu", b, i + 1);
        const size_t k = utf8_len((const unsigned char *)s + i, n - i);
        if (k == 0)
            return refuse(c, line, "not UTF-8 (byte 0x%02x at column %zu)", b, i + 1);
        i += k;
    }
    return 0;
}

/* --- fields --------------------------------------------------------------------- */

/* A dotted quad, strict: inet_aton would read "010" as octal and "10.1" as 10.0.0.1,
 * so anything but four plain decimal parts is refused rather than guessed. */
static int ipv4_ok(tok_t t)
{
    size_t i = 0;
    for (int part = 0; part < 4; part++) {
        if (part > 0) {
            if (i >= t.n || t.p[i] != '.')
                return 0;
            i++;
        }
        size_t j = i;
        while (j < t.n && is_digit(t.p[j]))
            j++;
        int64_t v;
        if (j == i || j - i > 3 || (t.p[i] == '0' && j - i > 1) || dec(t.p + i, j - i, 255, &v) < 0)
            return 0;
        i = j;
    }
    return i == t.n;
}

static int parse_host(const ctx_t *c, int line, tok_t t, char out[256])
{
    char cb[56];
    if (t.p[0] == '[') {
        char a[INET6_ADDRSTRLEN];
        struct in6_addr x;
        if (t.n < 3 || t.p[t.n - 1] != ']' || t.n - 2 >= sizeof a)
            return refuse(c, line, "host '%s' is not an IPv6 address in brackets", clip(cb, t));
        memcpy(a, t.p + 1, t.n - 2);
        a[t.n - 2] = '\0';
        if (inet_pton(AF_INET6, a, &x) != 1 || !inet_ntop(AF_INET6, &x, out, 256))
            return refuse(c, line, "host '%s' is not an IPv6 address", clip(cb, t));
        return 0;
    }
    if (memchr(t.p, ':', t.n))
        return refuse(c, line, "host '%s': an IPv6 address is written in brackets ([::1])", clip(cb, t));
    size_t digits = 0;
    for (size_t i = 0; i < t.n; i++)
        digits += is_digit(t.p[i]) || t.p[i] == '.';
    if (digits == t.n) {
        if (!ipv4_ok(t))
            return refuse(c, line, "host '%s' is not an IPv4 address (four parts 0..255, no leading zeros)",
                          clip(cb, t));
    } else {
        if (t.n > 253)
            return refuse(c, line, "host '%s' is not a DNS name: longer than 253 bytes", clip(cb, t));
        size_t lab = 0; /* the current label's start */
        for (size_t i = 0; i <= t.n; i++) {
            if (i < t.n && t.p[i] != '.') {
                const char ch = t.p[i];
                if (!(is_digit(ch) || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '-')) {
                    char cc[8];
                    const size_t k = utf8_len((const unsigned char *)t.p + i, t.n - i);
                    memcpy(cc, t.p + i, k ? k : 1);
                    cc[k ? k : 1] = '\0';
                    return refuse(c, line, "host '%s' is not a DNS name: '%s' is not a letter, digit, '-' or '.'",
                                  clip(cb, t), cc);
                }
                continue;
            }
            /* a label ends at i */
            if (i == lab)
                return refuse(c, line, "host '%s' is not a DNS name: an empty label (it begins or ends with '.', "
                              "or has '..')", clip(cb, t));
            if (i - lab > 63)
                return refuse(c, line, "host '%s' is not a DNS name: a label longer than 63 bytes", clip(cb, t));
            if (t.p[lab] == '-' || t.p[i - 1] == '-')
                return refuse(c, line, "host '%s' is not a DNS name: a label begins or ends with '-'", clip(cb, t));
            lab = i + 1;
        }
    }
    memcpy(out, t.p, t.n);
    out[t.n] = '\0';
    /* The resolver takes what inet_aton reads as an address ("0x7f.1", a bare
     * number) for that address; such a name would not mean what it seems. */
    struct in_addr a4;
    if (digits != t.n && inet_aton(out, &a4))
        return refuse(c, line, "host '%s' reads as a numeric address: write it as a dotted quad", clip(cb, t));
    return 0;
}

static int parse_gpus(const ctx_t *c, int line, tok_t t, bl_host_entry_t *e)
{
    char cb[56];
    if (tok_is(t, "cpu"))
        return 0;
    if (tok_is(t, "all")) {
        e->all_gpus = 1;
        return 0;
    }
    uint64_t seen = 0;
    for (size_t i = 0; i <= t.n;) {
        size_t j = i;
        while (j < t.n && t.p[j] != ',')
            j++;
        int64_t g;
        if (dec(t.p + i, j - i, BL_HOSTFILE_MAX_GPUS - 1, &g) < 0)
            return refuse(c, line, "GPUS '%s' is not cpu, all or a comma list of CUDA ordinals 0..%d",
                          clip(cb, t), BL_HOSTFILE_MAX_GPUS - 1);
        if (seen >> g & 1)
            return refuse(c, line, "GPUS '%s' lists GPU %d twice", clip(cb, t), (int)g);
        seen |= 1ull << g;
        e->gpus[e->n_gpus++] = (int)g;
        i = j + 1; /* past the comma; past the end ends the loop */
    }
    return 0;
}

static int parse_option(const ctx_t *c, int line, tok_t t, bl_host_entry_t *e, unsigned *seen)
{
    char cb[56];
    const char *eq = memchr(t.p, '=', t.n);
    const tok_t key = {t.p, (size_t)(eq - t.p)};
    const tok_t val = {eq + 1, t.n - key.n - 1};
    unsigned bit;
    if (tok_is(key, "threads")) {
        bit = 1;
        int64_t v;
        if (dec(val.p, val.n, BL_HOSTFILE_MAX_THREADS, &v) < 0 || v < 1)
            return refuse(c, line, "threads '%s' is not 1..%d", clip(cb, val), BL_HOSTFILE_MAX_THREADS);
        e->threads = (int)v;
    } else if (tok_is(key, "layers")) {
        bit = 2;
        if (e->role != BL_HOST_WORKER)
            return refuse(c, line, "layers= is a worker's option, not a %s's", bl_host_role_name(e->role));
        const char *dash = memchr(val.p, '-', val.n);
        int64_t a, b;
        if (!dash || dec(val.p, (size_t)(dash - val.p), BL_HOSTFILE_MAX_LAYERS, &a) < 0 ||
            dec(dash + 1, val.n - (size_t)(dash - val.p) - 1, BL_HOSTFILE_MAX_LAYERS, &b) < 0 || a >= b)
            return refuse(c, line, "layers '%s' is not A-B with 0 <= A < B <= %d (B exclusive)", clip(cb, val),
                          BL_HOSTFILE_MAX_LAYERS);
        e->layer_begin = a;
        e->layer_end = b;
    } else if (tok_is(key, "name")) {
        bit = 4;
        int ok = val.n >= 1 && val.n <= BL_HOSTFILE_MAX_NAME;
        for (size_t i = 0; ok && i < val.n; i++) {
            const char ch = val.p[i];
            ok = is_digit(ch) || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' || ch == '.' ||
                 ch == '-';
        }
        if (!ok)
            return refuse(c, line, "name '%s' is not 1..%d of A-Z a-z 0-9 _ . -", clip(cb, val),
                          BL_HOSTFILE_MAX_NAME);
        memcpy(e->name, val.p, val.n);
        e->name[val.n] = '\0';
    } else {
        return refuse(c, line, "unknown option '%s' (threads=, layers=, name=)", clip(cb, key.n ? key : t));
    }
    if (*seen & bit)
        return refuse(c, line, "option '%s' given twice", clip(cb, key));
    *seen |= bit;
    return 0;
}

/* HOST PORT ROLE [GPUS] [KEY=VALUE ...] into e. */
static int parse_entry(const ctx_t *c, int line, const tok_t *t, int nt, bl_host_entry_t *e)
{
    char cb[56];
    int rc;
    memset(e, 0, sizeof *e);
    e->line = line;
    e->layer_begin = e->layer_end = -1;
    if (nt < 3)
        return refuse(c, line, "'%s' is not HOST PORT ROLE: no %s", clip(cb, t[0]), nt == 1 ? "PORT" : "ROLE");
    if ((rc = parse_host(c, line, t[0], e->host)) < 0)
        return rc;
    int64_t port;
    if (dec(t[1].p, t[1].n, 65535, &port) < 0 || port < 1)
        return refuse(c, line, "port '%s' is not 1..65535", clip(cb, t[1]));
    e->port = (uint16_t)port;
    if (tok_is(t[2], "router"))
        e->role = BL_HOST_ROUTER;
    else if (tok_is(t[2], "worker"))
        e->role = BL_HOST_WORKER;
    else if (tok_is(t[2], "hosttier"))
        e->role = BL_HOST_HOSTTIER;
    else
        return refuse(c, line, "role '%s' is not router, worker or hosttier", clip(cb, t[2]));
    int i = 3;
    if (i < nt && !memchr(t[i].p, '=', t[i].n)) {
        if (e->role != BL_HOST_WORKER)
            return refuse(c, line, "a %s takes no GPUS field ('%s'): GPUS is a worker's",
                          bl_host_role_name(e->role), clip(cb, t[i]));
        if ((rc = parse_gpus(c, line, t[i], e)) < 0)
            return rc;
        i++;
    }
    unsigned seen = 0;
    for (; i < nt; i++) {
        if (!memchr(t[i].p, '=', t[i].n))
            return refuse(c, line, "unexpected field '%s': after ROLE come %sKEY=VALUE options", clip(cb, t[i]),
                          e->role == BL_HOST_WORKER ? "one GPUS field (a comma list: 0,1) and " : "");
        if ((rc = parse_option(c, line, t[i], e, &seen)) < 0)
            return rc;
    }
    return 0;
}

/* One line without its end: 0 and *is_entry 0 for a blank or comment line. */
static int parse_line(const ctx_t *c, int line, const char *s, size_t n, bl_host_entry_t *e, int *is_entry)
{
    *is_entry = 0;
    if (n > BL_HOSTFILE_MAX_LINE)
        return refuse(c, line, "the line is %zu bytes long, more than the %d a line may have", n,
                      BL_HOSTFILE_MAX_LINE);
    int rc = check_bytes(c, line, s, n);
    if (rc < 0)
        return rc;
    const char *hash = memchr(s, '#', n);
    if (hash)
        n = (size_t)(hash - s);
    /* at most one field per two bytes of a line */
    tok_t t[BL_HOSTFILE_MAX_LINE / 2 + 1];
    int nt = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] == ' ' || s[i] == '\t') {
            i++;
            continue;
        }
        size_t j = i;
        while (j < n && s[j] != ' ' && s[j] != '\t')
            j++;
        t[nt++] = (tok_t){s + i, j - i};
        i = j;
    }
    if (nt == 0)
        return 0;
    if ((rc = parse_entry(c, line, t, nt, e)) < 0)
        return rc;
    *is_entry = 1;
    return 0;
}

/* --- rules over the file -------------------------------------------------------- */

/* What one host holds so far, for the per-host rules. */
typedef struct host_state {
    int first;                           /* index of its first entry: the host's name */
    int hosttier_line;                   /* 0: none yet */
    int all_line;                        /* a worker with GPUS all; 0: none */
    int gpu_line[BL_HOSTFILE_MAX_GPUS];  /* the worker holding each GPU; 0: free */
} host_state_t;

/* Hosts compare without regard to ASCII case (DNS names; the IPv6 form is already
 * one per address). Hosts are ASCII, so no locale is involved. */
static int host_eq(const char *a, const char *b)
{
    for (;; a++, b++) {
        const char x = (*a >= 'A' && *a <= 'Z') ? (char)(*a + 32) : *a;
        const char y = (*b >= 'A' && *b <= 'Z') ? (char)(*b + 32) : *b;
        if (x != y)
            return 0;
        if (!x)
            return 1;
    }
}

static uint32_t host_hash(const char *s)
{
    uint32_t h = 2166136261u; /* FNV-1a over the lower-cased bytes */
    for (; *s; s++)
        h = (h ^ (uint8_t)((*s >= 'A' && *s <= 'Z') ? *s + 32 : *s)) * 16777619u;
    return h;
}

/* The rules need a lookup by host, by HOST:PORT and by name= per entry; hash tables keep a file
 * of 4096 entries linear rather than 8 million string comparisons. */
typedef struct file_check {
    int cap;            /* slots of each table: a power of two >= 2n */
    int *host_slot;     /* index into st, -1: empty */
    int *port_slot;     /* index of the entry, -1: empty */
    int *name_slot;     /* index of an entry with a name=, -1: empty */
    host_state_t *st;   /* one per distinct host */
    int n_st;
    int *host_at;       /* (n) each entry's index into st */
} file_check_t;

static int host_of(file_check_t *f, const bl_host_entry_t *v, int i)
{
    const uint32_t mask = (uint32_t)f->cap - 1;
    for (uint32_t s = host_hash(v[i].host) & mask;; s = (s + 1) & mask) {
        const int k = f->host_slot[s];
        if (k < 0) {
            f->host_slot[s] = f->n_st;
            f->st[f->n_st].first = i;
            return f->n_st++;
        }
        if (host_eq(v[f->st[k].first].host, v[i].host))
            return k;
    }
}

/* The earlier entry with i's HOST:PORT (recording i when none), or -1. */
static int port_dup(file_check_t *f, const bl_host_entry_t *v, int i, int host)
{
    const uint32_t mask = (uint32_t)f->cap - 1;
    for (uint32_t s = (uint32_t)(host * 65537 + v[i].port) * 2654435761u & mask;; s = (s + 1) & mask) {
        const int k = f->port_slot[s];
        if (k < 0) {
            f->port_slot[s] = i;
            return -1;
        }
        if (v[k].port == v[i].port && host_eq(v[k].host, v[i].host))
            return k;
    }
}

/* The earlier entry with i's name= (recording i when none), or -1. */
static int name_dup(file_check_t *f, const bl_host_entry_t *v, int i)
{
    const uint32_t mask = (uint32_t)f->cap - 1;
    /* host_hash folds case; names compare exactly, and equal names still share a slot run */
    for (uint32_t s = host_hash(v[i].name) & mask;; s = (s + 1) & mask) {
        const int k = f->name_slot[s];
        if (k < 0) {
            f->name_slot[s] = i;
            return -1;
        }
        if (strcmp(v[k].name, v[i].name) == 0)
            return k;
    }
}

/* GPUS of entry i against what its host's earlier workers hold. */
static int check_gpus(const ctx_t *c, const bl_host_entry_t *v, int i, host_state_t *h)
{
    const bl_host_entry_t *e = &v[i];
    if (!e->all_gpus && e->n_gpus == 0)
        return 0; /* a CPU worker holds no GPU */
    if (h->all_line)
        return refuse(c, e->line, "the worker at line %d takes all GPUs of %s: no other GPU worker may share "
                      "the host", h->all_line, e->host);
    if (e->all_gpus) {
        for (int g = 0; g < BL_HOSTFILE_MAX_GPUS; g++)
            if (h->gpu_line[g])
                return refuse(c, e->line, "GPUS all on %s, but the worker at line %d has GPU %d", e->host,
                              h->gpu_line[g], g);
        h->all_line = e->line;
        return 0;
    }
    for (int k = 0; k < e->n_gpus; k++) {
        const int g = e->gpus[k];
        if (h->gpu_line[g])
            return refuse(c, e->line, "GPU %d of %s is also the worker's at line %d", g, e->host, h->gpu_line[g]);
        h->gpu_line[g] = e->line;
    }
    return 0;
}

/* A worker line of another host than the router's is served by a node listening on
 * PORT, PORT + 1 and PORT + 2: two such lines of one host whose ranges meet would have
 * the second node fail to bind. key: (host, port) of those lines, sorted. */
typedef struct node_port {
    int host, port, i;
} node_port_t;

static int node_port_cmp(const void *x, const void *y)
{
    const node_port_t *a = x, *b = y;
    return a->host != b->host ? (a->host > b->host) - (a->host < b->host) : (a->port > b->port) - (a->port < b->port);
}

/* The node lines' port ranges (router the router's entry), the overlap whose later
 * line comes first in the file reported there. */
static int check_node_ports(const ctx_t *c, const bl_host_entry_t *v, int n, const file_check_t *f, int router)
{
    node_port_t *k = malloc((size_t)n * sizeof *k);
    if (!k)
        return bl_err_set(c->err, BL_ENOMEM, "%.100s: out of memory", c->name);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (v[i].role == BL_HOST_WORKER && f->host_at[i] != f->host_at[router])
            k[m++] = (node_port_t){f->host_at[i], v[i].port, i};
    qsort(k, (size_t)m, sizeof *k, node_port_cmp);
    int first = -1, other = -1; /* the entry to report, and the line it meets */
    for (int a = 0; a < m; a++)
        for (int b = a + 1; b < m && k[b].host == k[a].host && k[b].port - k[a].port < 3; b++) {
            const int later = v[k[a].i].line > v[k[b].i].line ? k[a].i : k[b].i;
            if (first < 0 || v[later].line < v[first].line) {
                first = later;
                other = later == k[a].i ? k[b].i : k[a].i;
            }
        }
    free(k);
    if (first < 0)
        return 0;
    char hp[300];
    return refuse(c, v[first].line, "%s: the node of line %d takes ports %u-%u of %s (a worker of another host "
                  "than the router's is served by a node on PORT, PORT+1 and PORT+2): keep their PORTs 3 apart",
                  hostport(hp, sizeof hp, &v[first]), v[other].line, (unsigned)v[other].port,
                  (unsigned)v[other].port + 2u, v[other].host);
}

static int check_file(const ctx_t *c, const bl_host_entry_t *v, int n)
{
    char hp[300];
    int router = -1, worker = -1, rc = 0;
    /* layers= on one worker asks for them on all: the first worker with them (to
     * name) and the first without */
    int with_layers = -1, without_layers = -1;
    for (int i = 0; i < n; i++)
        if (v[i].role == BL_HOST_WORKER) {
            if (v[i].layer_begin >= 0 && with_layers < 0)
                with_layers = i;
            if (v[i].layer_begin < 0 && without_layers < 0)
                without_layers = i;
        }
    file_check_t f = {0};
    if (n > 0) {
        f.cap = 16;
        while (f.cap < 2 * n)
            f.cap *= 2;
        f.host_slot = malloc((size_t)f.cap * sizeof *f.host_slot);
        f.port_slot = malloc((size_t)f.cap * sizeof *f.port_slot);
        f.name_slot = malloc((size_t)f.cap * sizeof *f.name_slot);
        f.st = calloc((size_t)n, sizeof *f.st);
        f.host_at = malloc((size_t)n * sizeof *f.host_at);
        if (!f.host_slot || !f.port_slot || !f.name_slot || !f.st || !f.host_at) {
            rc = bl_err_set(c->err, BL_ENOMEM, "%.100s: out of memory", c->name);
            goto done;
        }
        memset(f.host_slot, 0xff, (size_t)f.cap * sizeof *f.host_slot);
        memset(f.port_slot, 0xff, (size_t)f.cap * sizeof *f.port_slot);
        memset(f.name_slot, 0xff, (size_t)f.cap * sizeof *f.name_slot);
    }
    int64_t prev_end = -1;
    int prev_line = 0;
    for (int i = 0; i < n; i++) {
        const bl_host_entry_t *e = &v[i];
        const int h = host_of(&f, v, i);
        f.host_at[i] = h;
        const int d = port_dup(&f, v, i, h);
        if (d >= 0) {
            rc = refuse(c, e->line, "%s is also at line %d", hostport(hp, sizeof hp, e), v[d].line);
            goto done;
        }
        const int dn = e->name[0] ? name_dup(&f, v, i) : -1;
        if (dn >= 0) {
            rc = refuse(c, e->line, "name=%s is also line %d's: a name labels one line", e->name, v[dn].line);
            goto done;
        }
        if (e->role == BL_HOST_ROUTER) {
            if (router >= 0) {
                rc = refuse(c, e->line, "a second router (the first is at line %d): a cluster has one",
                            v[router].line);
                goto done;
            }
            router = i;
        } else if (e->role == BL_HOST_HOSTTIER) {
            host_state_t *st = &f.st[h];
            if (st->hosttier_line) {
                rc = refuse(c, e->line, "a second hosttier on %s (the first is at line %d): one per host", e->host,
                            st->hosttier_line);
                goto done;
            }
            st->hosttier_line = e->line;
        } else {
            if (worker < 0)
                worker = i;
            if ((rc = check_gpus(c, v, i, &f.st[h])) < 0)
                goto done;
            if (with_layers >= 0 && without_layers >= 0) {
                /* reported at the first worker without, so an earlier line's error wins */
                if (e->layer_begin < 0) {
                    rc = refuse(c, e->line, "layers= on every worker or on none: line %d has layers=%lld-%lld, "
                                "this worker has none", v[with_layers].line, (long long)v[with_layers].layer_begin,
                                (long long)v[with_layers].layer_end);
                    goto done;
                }
                continue;
            }
            if (with_layers >= 0) {
                /* the stages run in file order, so their ranges follow one another */
                if (prev_end < 0 && e->layer_begin != 0) {
                    rc = refuse(c, e->line, "layers=%lld-%lld leaves a gap: layers 0-%lld are on no worker "
                                "(the first worker's range begins at 0)", (long long)e->layer_begin,
                                (long long)e->layer_end, (long long)e->layer_begin);
                    goto done;
                }
                if (prev_end >= 0 && e->layer_begin > prev_end) {
                    rc = refuse(c, e->line, "layers=%lld-%lld leaves a gap: layers %lld-%lld, after line %d's, "
                                "are on no worker", (long long)e->layer_begin, (long long)e->layer_end,
                                (long long)prev_end, (long long)e->layer_begin, prev_line);
                    goto done;
                }
                if (prev_end >= 0 && e->layer_begin < prev_end) {
                    rc = refuse(c, e->line, "layers=%lld-%lld overlaps line %d's range, which ends at %lld",
                                (long long)e->layer_begin, (long long)e->layer_end, prev_line, (long long)prev_end);
                    goto done;
                }
                prev_end = e->layer_end;
                prev_line = e->line;
            }
        }
    }
    if (router < 0)
        rc = refuse(c, 0, "no router: a cluster needs one line 'HOST PORT router'");
    else if (worker < 0)
        rc = refuse(c, 0, "no worker: a cluster needs at least one line 'HOST PORT worker [GPUS]'");
    else
        rc = check_node_ports(c, v, n, &f, router);
done:
    free(f.host_slot);
    free(f.host_at);
    free(f.port_slot);
    free(f.name_slot);
    free(f.st);
    return rc;
}

/* --- entry points --------------------------------------------------------------- */

int bl_hostfile_parse(const char *text, size_t len, const char *name, bl_hostfile_t *out, bl_err_t *err)
{
    const ctx_t c = {name ? name : "hostfile", err};
    out->e = NULL;
    out->n = 0;
    if (!text && len > 0)
        return bl_err_set(err, BL_EINVAL, "%.100s: no text", c.name);
    if (len > BL_HOSTFILE_MAX_BYTES)
        return refuse(&c, 0, "%zu bytes, more than the %u a hostfile may have", len, BL_HOSTFILE_MAX_BYTES);
    size_t at = 0;
    if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0)
        at = 3; /* the byte-order mark some editors write first */
    bl_host_entry_t *v = NULL;
    int n = 0, cap = 0, rc = 0;
    for (int line = 1; at < len; line++) {
        const char *nl = memchr(text + at, '\n', len - at);
        const size_t end = nl ? (size_t)(nl - text) : len;
        size_t ln = end - at;
        if (ln > 0 && text[at + ln - 1] == '\r')
            ln--; /* CRLF line ends */
        bl_host_entry_t e;
        int is_entry;
        if ((rc = parse_line(&c, line, text + at, ln, &e, &is_entry)) < 0)
            goto fail;
        if (is_entry) {
            if (n == BL_HOSTFILE_MAX_ENTRIES) {
                rc = refuse(&c, line, "more than %d entries", BL_HOSTFILE_MAX_ENTRIES);
                goto fail;
            }
            if (n == cap) {
                const int ncap = cap ? (cap * 2 < BL_HOSTFILE_MAX_ENTRIES ? cap * 2 : BL_HOSTFILE_MAX_ENTRIES) : 16;
                bl_host_entry_t *nv = realloc(v, (size_t)ncap * sizeof *nv);
                if (!nv) {
                    rc = bl_err_set(err, BL_ENOMEM, "%.100s: out of memory", c.name);
                    goto fail;
                }
                v = nv;
                cap = ncap;
            }
            v[n++] = e;
        }
        at = end + 1; /* past the '\n'; past len when the text ends without one */
    }
    if ((rc = check_file(&c, v, n)) < 0)
        goto fail;
    out->e = v;
    out->n = n;
    return 0;
fail:
    free(v);
    return rc;
}

int bl_hostfile_load(const char *path, bl_hostfile_t *out, bl_err_t *err)
{
    out->e = NULL;
    out->n = 0;
    char *text;
    size_t len;
    int rc = bl_read_file(path, BL_HOSTFILE_MAX_BYTES, &text, &len, err);
    if (rc == BL_ERANGE) /* the size limit is the format's, refused as parse refuses it */
        return bl_err_set(err, BL_EINVAL, "%.100s: more than the %u bytes a hostfile may have", path,
                          BL_HOSTFILE_MAX_BYTES);
    if (rc < 0)
        return rc;
    rc = bl_hostfile_parse(text, len, path, out, err);
    free(text);
    return rc;
}

void bl_hostfile_free(bl_hostfile_t *h)
{
    if (!h)
        return;
    free(h->e);
    h->e = NULL;
    h->n = 0;
}

const char *bl_host_role_name(bl_host_role_t r)
{
    switch (r) {
    case BL_HOST_ROUTER: return "router";
    case BL_HOST_WORKER: return "worker";
    case BL_HOST_HOSTTIER: return "hosttier";
    }
    return "?";
}

const bl_host_entry_t *bl_hostfile_router(const bl_hostfile_t *h)
{
    for (int i = 0; h && i < h->n; i++)
        if (h->e[i].role == BL_HOST_ROUTER)
            return &h->e[i];
    return NULL;
}

const bl_host_entry_t *bl_hostfile_next(const bl_hostfile_t *h, const bl_host_entry_t *prev, const char *host,
                                        bl_host_role_t role)
{
    if (!h || h->n <= 0)
        return NULL;
    /* the query in the entries' form: an IPv6 address without brackets, as inet_ntop
     * writes it; an address that does not parse matches nothing */
    char want[256];
    if (host && strchr(host, ':')) {
        char a[INET6_ADDRSTRLEN];
        size_t n = strlen(host);
        if (n >= 2 && host[0] == '[' && host[n - 1] == ']')
            host++, n -= 2;
        struct in6_addr x;
        if (n >= sizeof a)
            return NULL;
        memcpy(a, host, n);
        a[n] = '\0';
        if (inet_pton(AF_INET6, a, &x) != 1 || !inet_ntop(AF_INET6, &x, want, sizeof want))
            return NULL;
        host = want;
    }
    int i = 0;
    if (prev) {
        if (prev < h->e || prev >= h->e + h->n)
            return NULL;
        i = (int)(prev - h->e) + 1;
    }
    for (; i < h->n; i++)
        if ((!role || h->e[i].role == role) && (!host || host_eq(h->e[i].host, host)))
            return &h->e[i];
    return NULL;
}
