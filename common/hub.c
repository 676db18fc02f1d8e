/* Models from the Hugging Face hub (see hub.h): the repository's file list from the
 * hub's API, the choice of a GGUF by quant tag, and downloads into the hub's cache
 * layout, resumed with Range requests and checked against the listed size and
 * SHA-256. Everything the hub sends (JSON, paths, ids, headers) is validated before
 * it names a file on disk. */
#include "hub.h"
#include "file.h"

#include <ctype.h>
#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bl_config.h"
#include "buf.h"
#include "gguf.h"
#include "log.h"
#include "progress.h"

#define HUB_API_MAX_BYTES (64u << 20) /* one API reply */
#define HUB_MAX_PAGES 1000            /* of a paginated file list */
#define HUB_MAX_FILES 200000
#define HUB_ATTEMPTS 4                /* per request, on transient failures */
#define HUB_REPO_MAX 256
#define HUB_TAG_MAX 64
#define HUB_RELPATH_MAX 1024

typedef struct hub_file {
    char *path;    /* in the repository; validated relative, no "." or ".." */
    char oid[65];  /* the LFS SHA-256 (64 hex) or the git blob id (40 hex); "" if none */
    int sha256;    /* oid is the content's SHA-256 */
    uint64_t size; /* 0: not listed */
    char *local;   /* a cached file found without the network; else NULL */
} hub_file_t;

typedef struct hub_list {
    hub_file_t *v;
    size_t n, cap;
} hub_list_t;

typedef struct hub {
    const bl_hub_opts_t *o;
    char repo[HUB_REPO_MAX + 1], tag[HUB_TAG_MAX + 1];
    char endpoint[1024]; /* ends with '/' */
    char cache[PATH_MAX];
    char repo_dir[PATH_MAX]; /* cache/models--user--model */
    char commit[41];
    struct curl_slist *headers;
} hub_t;

/* --- names and paths ------------------------------------------------------------- */

static int is_hex(const char *s, size_t n)
{
    if (strlen(s) != n)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isxdigit((unsigned char)s[i]))
            return 0;
    return 1;
}

/* The hub's repository ids: [A-Za-z0-9_] runs joined by single '/', '.' or '-', with
 * exactly one '/'. */
static int valid_repo_id(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > HUB_REPO_MAX)
        return 0;
    int slashes = 0, after_special = 1;
    for (const char *p = s; *p; p++) {
        if (isalnum((unsigned char)*p) || *p == '_') {
            after_special = 0;
        } else if (*p == '/' || *p == '.' || *p == '-') {
            if (after_special)
                return 0;
            slashes += *p == '/';
            after_special = 1;
        } else {
            return 0;
        }
    }
    return !after_special && slashes == 1;
}

static int valid_tag(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > HUB_TAG_MAX)
        return 0;
    for (const char *p = s; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '_' && *p != '-' && *p != '.')
            return 0;
    return 1;
}

/* "user/model[:tag]" into repo and tag ("" when none). */
static int parse_spec(const char *spec, char *repo, char *tag, bl_err_t *err)
{
    const char *colon = strchr(spec, ':');
    size_t n = colon ? (size_t)(colon - spec) : strlen(spec);
    if (n > HUB_REPO_MAX)
        return bl_err_set(err, BL_EINVAL, "-hf: the repository name is longer than %d bytes",
                          HUB_REPO_MAX);
    memcpy(repo, spec, n);
    repo[n] = '\0';
    tag[0] = '\0';
    if (!valid_repo_id(repo))
        return bl_err_set(err, BL_EINVAL,
                          "-hf '%.300s': expected USER/MODEL[:QUANT], letters, digits and _ . - "
                          "with one '/'",
                          spec);
    if (colon) {
        if (strlen(colon + 1) > HUB_TAG_MAX || !valid_tag(colon + 1))
            return bl_err_set(err, BL_EINVAL,
                              "-hf '%.300s': the quant after ':' must be letters, digits and _ . - "
                              "(at most %d)",
                              spec, HUB_TAG_MAX);
        strcpy(tag, colon + 1);
    }
    return 0;
}

/* A path inside a repository that is safe to join under a folder: relative, no empty,
 * "." or ".." segment, no control character or backslash. */
static int valid_relpath(const char *p)
{
    size_t n = strlen(p);
    if (n == 0 || n > HUB_RELPATH_MAX || p[0] == '/')
        return 0;
    const char *seg = p;
    for (const char *c = p;; c++) {
        if (*c == '/' || *c == '\0') {
            size_t len = (size_t)(c - seg);
            if (len == 0 || (len == 1 && seg[0] == '.') ||
                (len == 2 && seg[0] == '.' && seg[1] == '.'))
                return 0;
            if (*c == '\0')
                return 1;
            seg = c + 1;
        } else if ((unsigned char)*c < 0x20 || *c == 0x7f || *c == '\\') {
            return 0;
        }
    }
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static int ends_with_ci(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcasecmp(s + n - m, suffix) == 0;
}

/* A split model's part: NAME-00001-of-00003.gguf gives index 1, count 3 and the
 * length of NAME; any other .gguf is part 1 of 1. 0 for a file that is no GGUF. */
static int split_info(const char *path, size_t *prefix_len, int *index, int *count)
{
    size_t n = strlen(path);
    char low[HUB_RELPATH_MAX + 1];
    if (!ends_with_ci(path, ".gguf") || n >= sizeof low)
        return 0;
    memcpy(low, path, n + 1);
    memcpy(low + n - 5, ".gguf", 5); /* the part names are read as the loader reads them */
    uint32_t no, cnt;
    size_t stem = bl_gguf_split_name(low, &no, &cnt);
    *index = *count = 1;
    *prefix_len = n - 5;
    if (!stem)
        return 1;
    if (no < 1 || no > cnt) {
        *index = *count = 0; /* a malformed part number: never chosen */
        return 1;
    }
    *index = (int)no;
    *count = (int)cnt;
    *prefix_len = stem;
    return 1;
}

/* A GGUF that is a model, not a projector, an importance matrix or a draft head. */
static int is_model_gguf(const char *path)
{
    size_t pl;
    int index, count;
    if (!split_info(path, &pl, &index, &count) || index == 0)
        return 0;
    static const char *const not_models[] = {"mmproj", "imatrix", "mtp-", "eagle3-", "dflash-",
                                             "dspark-"};
    const char *b = base_name(path);
    for (size_t i = 0; i < sizeof not_models / sizeof *not_models; i++)
        if (strcasestr(b, not_models[i]))
            return 0;
    return 1;
}

/* The tag names the quant in the file name: it follows a start, '-', '.', '_' or '/'
 * and is followed by '-' or '.' (Q4_K_M matches model-Q4_K_M.gguf, not IQ4_K_M). */
static int tag_matches(const char *path, const char *tag)
{
    size_t m = strlen(tag);
    for (const char *p = path; (p = strcasestr(p, tag)) != NULL; p++) {
        int start = p == path || strchr("-._/", p[-1]) != NULL;
        if (start && (p[m] == '-' || p[m] == '.'))
            return 1;
    }
    return 0;
}

/* Lists up to cap bytes of the repository's GGUF files for an error message. */
static void list_ggufs(const hub_list_t *l, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < l->n && len + 1 < cap; i++) {
        if (!ends_with_ci(l->v[i].path, ".gguf"))
            continue;
        int k = snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", l->v[i].path);
        if (k < 0 || (size_t)k >= cap - len) {
            if (cap > 4)
                strcpy(buf + cap - 4, "...");
            return;
        }
        len += (size_t)k;
    }
    if (!len)
        snprintf(buf, cap, "none");
}

/* The file -hf names: --hf-file's path (case-insensitive), else the first model GGUF
 * (first part of a split one) whose name carries the tag, else with no tag Q4_K_M,
 * then Q8_0, then any model GGUF. Returns its index, or a negative code. */
static long pick_file(const hub_list_t *l, const char *repo, const char *tag, const char *file,
                      bl_err_t *err)
{
    char avail[300];
    if (file) {
        for (size_t i = 0; i < l->n; i++)
            if (strcasecmp(l->v[i].path, file) == 0)
                return (long)i;
        list_ggufs(l, avail, sizeof avail);
        return bl_err_set(err, BL_ENOENT, "--hf-file %.100s: no such file in %s (GGUF files: %s)",
                          file, repo, avail);
    }
    const char *defaults[] = {"Q4_K_M", "Q8_0", NULL};
    const char *one[] = {tag, NULL};
    const char *const *tags = tag[0] ? one : defaults;
    for (; *tags; tags++)
        for (size_t i = 0; i < l->n; i++) {
            size_t pl;
            int index, count;
            if (is_model_gguf(l->v[i].path) && split_info(l->v[i].path, &pl, &index, &count) &&
                index == 1 && tag_matches(l->v[i].path, *tags))
                return (long)i;
        }
    if (!tag[0])
        for (size_t i = 0; i < l->n; i++) {
            size_t pl;
            int index, count;
            if (is_model_gguf(l->v[i].path) && split_info(l->v[i].path, &pl, &index, &count) &&
                index == 1)
                return (long)i;
        }
    list_ggufs(l, avail, sizeof avail);
    if (tag[0])
        return bl_err_set(err, BL_ENOENT, "%s has no GGUF model file for the quant '%s' (GGUF files: %s)",
                          repo, tag, avail);
    return bl_err_set(err, BL_ENOENT, "%s has no GGUF model file (GGUF files: %s)", repo, avail);
}

/* Every part of the split model whose first part is l->v[first], in order, into
 * parts[0..*n_parts); refuses a set with a part missing. parts has room for count. */
static int gather_parts(const hub_list_t *l, size_t first, size_t **parts, int *n_parts,
                        bl_err_t *err)
{
    const char *p0 = l->v[first].path;
    size_t pl0;
    int index0, count;
    (void)split_info(p0, &pl0, &index0, &count); /* pick_file chose a GGUF */
    size_t *v = calloc((size_t)count, sizeof *v);
    char *have = calloc((size_t)count, 1);
    if (!v || !have) {
        free(v);
        free(have);
        return bl_err_set(err, BL_ENOMEM, "out of memory for %d model parts", count);
    }
    for (size_t i = 0; i < l->n; i++) {
        size_t pl;
        int index, c;
        const char *p = l->v[i].path;
        if (split_info(p, &pl, &index, &c) && index > 0 && c == count && pl == pl0 &&
            strncmp(p, p0, pl0) == 0 && !have[index - 1]) {
            v[index - 1] = i;
            have[index - 1] = 1;
        }
    }
    for (int k = 0; k < count; k++)
        if (!have[k]) {
            free(v);
            free(have);
            return bl_err_set(err, BL_ENOENT, "%s: part %d of %d of the split model is missing",
                              p0, k + 1, count);
        }
    free(have);
    *parts = v;
    *n_parts = count;
    return 0;
}

static int list_push(hub_list_t *l, const char *path, const char *oid, int sha256, uint64_t size,
                     const char *local, bl_err_t *err)
{
    if (l->n >= HUB_MAX_FILES)
        return bl_err_set(err, BL_ERANGE, "the repository lists more than %d files", HUB_MAX_FILES);
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        hub_file_t *v = realloc(l->v, cap * sizeof *v);
        if (!v)
            return bl_err_set(err, BL_ENOMEM, "out of memory for the repository's file list");
        l->v = v;
        l->cap = cap;
    }
    hub_file_t *f = &l->v[l->n];
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    f->local = local ? strdup(local) : NULL;
    if (!f->path || (local && !f->local)) {
        free(f->path);
        free(f->local);
        return bl_err_set(err, BL_ENOMEM, "out of memory for the repository's file list");
    }
    snprintf(f->oid, sizeof f->oid, "%s", oid ? oid : "");
    f->sha256 = sha256;
    f->size = size;
    l->n++;
    return 0;
}

static void list_free(hub_list_t *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->v[i].path);
        free(l->v[i].local);
    }
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* --- the cache folder ------------------------------------------------------------ */

static int cache_root(char *buf, size_t cap, bl_err_t *err)
{
    static const struct {
        const char *var, *sub;
    } order[] = {{"LLAMA_CACHE", ""},
                 {"HF_HUB_CACHE", ""},
                 {"HUGGINGFACE_HUB_CACHE", ""},
                 {"HF_HOME", "/hub"},
                 {"XDG_CACHE_HOME", "/huggingface/hub"},
                 {"HOME", "/.cache/huggingface/hub"}};
    for (size_t i = 0; i < sizeof order / sizeof *order; i++) {
        const char *v = getenv(order[i].var);
        if (!v || !*v)
            continue;
        if ((size_t)snprintf(buf, cap, "%s%s", v, order[i].sub) >= cap)
            return bl_err_set(err, BL_ERANGE, "%s is too long for a cache folder", order[i].var);
        return 0;
    }
    return bl_err_set(err, BL_ENOENT,
                      "no folder for the model cache: set LLAMA_CACHE, HF_HUB_CACHE or HOME");
}

/* Writes text to path through a temporary file and a rename. */
static int write_small(const char *path, const char *text, bl_err_t *err)
{
    char tmp[PATH_MAX];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= sizeof tmp)
        return bl_err_set(err, BL_ERANGE, "path too long: %.200s", path);
    int rc = bl_make_dirs(path, 0, err);
    if (rc)
        return rc;
    FILE *f = fopen(tmp, "w");
    if (!f)
        return bl_err_set(err, BL_EIO, "cannot write %.300s: %s", tmp, strerror(errno));
    int bad = fputs(text, f) < 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return bl_err_set(err, BL_EIO, "cannot write %.300s: %s", path, strerror(e));
    }
    return 0;
}

/* The commit a cached repository's refs/main names, else any of its refs. */
static int cached_commit(hub_t *h, bl_err_t *err)
{
    char dir[PATH_MAX + 8], path[PATH_MAX + 300];
    snprintf(dir, sizeof dir, "%s/refs", h->repo_dir);
    DIR *d = opendir(dir);
    if (!d)
        return bl_err_set(err, BL_ENOENT, "%s is not in the cache (%s)", h->repo, h->repo_dir);
    int found = 0;
    struct dirent *e;
    /* main first, then whatever else is there */
    for (int pass = 0; pass < 2 && !found; pass++) {
        rewinddir(d);
        while (!found && (e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.' || (pass == 0) != (strcmp(e->d_name, "main") == 0))
                continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            FILE *f = fopen(path, "r");
            char line[128] = "";
            if (!f)
                continue;
            if (fgets(line, sizeof line, f)) {
                line[strcspn(line, "\r\n")] = '\0';
                if (is_hex(line, 40)) {
                    memcpy(h->commit, line, 41);
                    found = 1;
                }
            }
            fclose(f);
        }
    }
    closedir(d);
    if (!found)
        return bl_err_set(err, BL_ENOENT, "%s: the cache has no valid ref under %s", h->repo, dir);
    return 0;
}

/* nftw passes no user pointer to its callback: the walk's state, per thread. */
static __thread hub_list_t *walk_list;
static __thread size_t walk_root_len;
static __thread bl_err_t *walk_err;
static __thread int walk_rc;

static int walk_one(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)ftw;
    struct stat real;
    if (type != FTW_F && type != FTW_SL)
        return 0;
    if (stat(path, &real) != 0 || !S_ISREG(real.st_mode)) /* a dangling link: not there */
        return 0;
    (void)st;
    const char *rel = path + walk_root_len + 1;
    if (!valid_relpath(rel))
        return 0;
    walk_rc = list_push(walk_list, rel, NULL, 0, (uint64_t)real.st_size, path, walk_err);
    return walk_rc ? 1 : 0;
}

/* The files of the cached snapshot h->commit. */
static int list_snapshot(hub_t *h, hub_list_t *l, bl_err_t *err)
{
    char root[PATH_MAX];
    if ((size_t)snprintf(root, sizeof root, "%s/snapshots/%s", h->repo_dir, h->commit) >=
        sizeof root)
        return bl_err_set(err, BL_ERANGE, "cache path too long: %.200s", h->repo_dir);
    walk_list = l;
    walk_root_len = strlen(root);
    walk_err = err;
    walk_rc = 0;
    int r = nftw(root, walk_one, 16, FTW_PHYS);
    if (walk_rc)
        return walk_rc;
    if (r != 0)
        return bl_err_set(err, BL_ENOENT, "%s: the cached snapshot %s cannot be read: %s", h->repo,
                          root, strerror(errno));
    return 0;
}

/* --- HTTP ------------------------------------------------------------------------- */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

typedef struct reply {
    bl_buf_t body;
    size_t max;
    int too_big;       /* the body passed max */
    char next[2048];   /* Link: <...>; rel="next" of the last response */
    int64_t range_start; /* Content-Range's first byte, -1 if none */
} reply_t;

static size_t on_header(char *data, size_t size, size_t nmemb, void *ud)
{
    reply_t *r = ud;
    size_t n = size * nmemb;
    if (n >= 5 && strncmp(data, "HTTP/", 5) == 0) { /* a new response (after a redirect) */
        r->next[0] = '\0';
        r->range_start = -1;
    } else if (n > 14 && strncasecmp(data, "content-range:", 14) == 0) {
        const char *p = data + 14;
        while (p < data + n && (*p == ' ' || *p == '\t'))
            p++;
        if (data + n - p > 6 && strncasecmp(p, "bytes ", 6) == 0) {
            char *end;
            long long v = strtoll(p + 6, &end, 10);
            if (end != p + 6 && *end == '-' && v >= 0)
                r->range_start = v;
        }
    } else if (n > 5 && strncasecmp(data, "link:", 5) == 0) {
        /* <URL>; rel="next" among comma-separated links */
        char line[4096];
        size_t m = n < sizeof line - 1 ? n : sizeof line - 1;
        memcpy(line, data, m);
        line[m] = '\0';
        for (char *lt = strchr(line, '<'); lt; lt = strchr(lt + 1, '<')) {
            char *gt = strchr(lt, '>');
            if (!gt)
                break;
            char *comma = strchr(gt, ',');
            char *rel = strstr(gt, "rel=\"next\"");
            if (rel && (!comma || rel < comma) && (size_t)(gt - lt - 1) < sizeof r->next) {
                memcpy(r->next, lt + 1, (size_t)(gt - lt - 1));
                r->next[gt - lt - 1] = '\0';
                break;
            }
        }
    }
    return n;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *ud)
{
    reply_t *r = ud;
    size_t n = size * nmemb;
    int rc = bl_buf_add(&r->body, data, n, r->max);
    r->too_big |= rc == BL_ERANGE; /* larger than any list should be */
    return rc ? 0 : n;             /* 0 aborts the transfer */
}

/* A handle with the settings every request shares: redirects followed within http(s)
 * (curl drops the Authorization header when a redirect leaves the host), a connect
 * timeout and an abort when nothing arrives for a minute. */
static CURL *easy_new(hub_t *h, const char *url, char *errbuf)
{
    CURL *c = curl_easy_init();
    if (!c)
        return NULL;
    errbuf[0] = '\0';
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "bloomery/" BL_VERSION);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h->headers);
    return c;
}

static int transient_status(long status)
{
    return status == 408 || status == 429 || status >= 500;
}

static int transient_curl(CURLcode rc)
{
    return rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
           rc == CURLE_OPERATION_TIMEDOUT || rc == CURLE_PARTIAL_FILE || rc == CURLE_RECV_ERROR ||
           rc == CURLE_SEND_ERROR || rc == CURLE_GOT_NOTHING || rc == CURLE_HTTP2 ||
           rc == CURLE_HTTP2_STREAM || rc == CURLE_SSL_CONNECT_ERROR;
}

static void backoff(int attempt)
{
    struct timespec ts = {.tv_sec = 1 << attempt, .tv_nsec = 0}; /* 1, 2, 4 s */
    nanosleep(&ts, NULL);
}

/* What an HTTP error means to a user of -hf. */
static int status_error(bl_err_t *err, long status, const char *what, const char *repo,
                        const char *body)
{
    char msg[160] = "";
    if (body) { /* the hub's {"error": "..."} */
        json_t *j = json_loads(body, 0, NULL);
        const char *e = json_string_value(json_object_get(j, "error"));
        if (e)
            bl_log_escape(msg, sizeof msg, e, strlen(e));
        json_decref(j);
    }
    const char *sep = msg[0] ? ": " : "";
    if (status == 401 || status == 403)
        return bl_err_set(err, BL_EINVAL,
                          "%s of %s: access denied (HTTP %ld%s%s); a gated or private repository "
                          "needs --hf-token or HF_TOKEN",
                          what, repo, status, sep, msg);
    if (status == 404)
        return bl_err_set(err, BL_ENOENT, "%s of %s: not found (HTTP 404%s%s)", what, repo, sep,
                          msg);
    return bl_err_set(err, BL_EIO, "%s of %s: HTTP %ld%s%s", what, repo, status, sep, msg);
}

/* GET url as JSON, retried on transient failures; *next: the next page's URL or "". */
static int api_get(hub_t *h, const char *url, const char *what, json_t **out, char *next,
                   size_t next_cap, bl_err_t *err)
{
    char errbuf[CURL_ERROR_SIZE];
    for (int attempt = 0;; attempt++) {
        reply_t r = {.max = HUB_API_MAX_BYTES, .range_start = -1};
        CURL *c = easy_new(h, url, errbuf);
        if (!c)
            return bl_err_set(err, BL_ENOMEM, "cannot start an HTTP request");
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, &r);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
        CURLcode rc = curl_easy_perform(c);
        long status = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        curl_easy_cleanup(c);
        if (rc == CURLE_OK && status == 200) {
            json_error_t je;
            *out = r.body.p ? json_loadb(r.body.p, r.body.n, 0, &je) : NULL;
            bl_buf_free(&r.body);
            if (!*out)
                return bl_err_set(err, BL_EPROTO, "%s of %s: the reply is not JSON", what, h->repo);
            snprintf(next, next_cap, "%s", r.next);
            return 0;
        }
        /* a hub that cannot be reached at all is not retried: the cache answers */
        int again = attempt + 1 < HUB_ATTEMPTS &&
                    (rc == CURLE_OK ? transient_status(status)
                                    : transient_curl(rc) && rc != CURLE_COULDNT_CONNECT &&
                                          rc != CURLE_COULDNT_RESOLVE_HOST);
        if (!again) {
            int ret;
            if (r.too_big)
                ret = bl_err_set(err, BL_ERANGE, "%s of %s: the reply is larger than %u MiB", what,
                                 h->repo, HUB_API_MAX_BYTES >> 20);
            else if (rc != CURLE_OK)
                ret = bl_err_set(err, BL_EIO, "%s of %s from %s: %s", what, h->repo, h->endpoint,
                                 errbuf[0] ? errbuf : curl_easy_strerror(rc));
            else
                ret = status_error(err, status, what, h->repo, r.body.p);
            bl_buf_free(&r.body);
            return ret;
        }
        bl_buf_free(&r.body);
        BL_LOG(BL_LOG_WARN, "event=hub_retry what=%s status=%ld error=%s", what, status,
               rc == CURLE_OK ? "http" : curl_easy_strerror(rc));
        backoff(attempt);
    }
}

/* The commit of the repository's main branch (or its first branch), recorded in
 * refs/ as the hub's cache does. */
static int fetch_commit(hub_t *h, bl_err_t *err)
{
    char url[2048], next[8];
    json_t *j = NULL;
    snprintf(url, sizeof url, "%sapi/models/%s/refs", h->endpoint, h->repo);
    int rc = api_get(h, url, "the branch list", &j, next, sizeof next, err);
    if (rc)
        return rc;
    json_t *branches = json_object_get(j, "branches");
    const char *name = NULL, *commit = NULL;
    size_t i;
    json_t *b;
    json_array_foreach(branches, i, b) {
        const char *n = json_string_value(json_object_get(b, "name"));
        const char *c = json_string_value(json_object_get(b, "targetCommit"));
        if (!n || !c || !is_hex(c, 40) || !valid_relpath(n) || strchr(n, '/'))
            continue;
        if (strcmp(n, "main") == 0 || !name) {
            name = n;
            commit = c;
            if (strcmp(n, "main") == 0)
                break;
        }
    }
    if (!commit) {
        json_decref(j);
        return bl_err_set(err, BL_EPROTO, "%s: the hub lists no branch with a valid commit",
                          h->repo);
    }
    memcpy(h->commit, commit, 41);
    char path[PATH_MAX + 300];
    snprintf(path, sizeof path, "%s/refs/%s", h->repo_dir, name);
    json_decref(j);
    return write_small(path, h->commit, err);
}

/* The files of h->commit, over every page of the hub's tree listing. */
static int fetch_tree(hub_t *h, hub_list_t *l, bl_err_t *err)
{
    char url[2048];
    snprintf(url, sizeof url, "%sapi/models/%s/tree/%s?recursive=true", h->endpoint, h->repo,
             h->commit);
    /* a next page must stay on the endpoint's host */
    size_t origin = 0;
    for (int slashes = 0; h->endpoint[origin] && slashes < 3; origin++)
        slashes += h->endpoint[origin] == '/';
    for (int page = 0; url[0]; page++) {
        if (page == HUB_MAX_PAGES)
            return bl_err_set(err, BL_ERANGE, "%s: the file list has more than %d pages", h->repo,
                              HUB_MAX_PAGES);
        json_t *j = NULL;
        char next[2048];
        int rc = api_get(h, url, "the file list", &j, next, sizeof next, err);
        if (rc)
            return rc;
        if (!json_is_array(j)) {
            json_decref(j);
            return bl_err_set(err, BL_EPROTO, "%s: the file list is not a JSON array", h->repo);
        }
        size_t i;
        json_t *it;
        json_array_foreach(j, i, it) {
            const char *type = json_string_value(json_object_get(it, "type"));
            const char *path = json_string_value(json_object_get(it, "path"));
            if (!type || strcmp(type, "file") != 0 || !path)
                continue;
            if (!valid_relpath(path)) {
                char esc[120];
                BL_LOG(BL_LOG_WARN, "event=hub_skip reason=unsafe_path path=%s",
                       bl_log_escape(esc, sizeof esc, path, strlen(path)));
                continue;
            }
            json_t *lfs = json_object_get(it, "lfs");
            const char *oid = json_string_value(json_object_get(lfs ? lfs : it, "oid"));
            json_int_t size = json_integer_value(json_object_get(lfs ? lfs : it, "size"));
            int sha = oid && is_hex(oid, 64);
            if (oid && !sha && !is_hex(oid, 40)) {
                char esc[120];
                BL_LOG(BL_LOG_WARN, "event=hub_skip reason=bad_oid path=%s",
                       bl_log_escape(esc, sizeof esc, path, strlen(path)));
                continue;
            }
            if ((rc = list_push(l, path, oid, sha, size > 0 ? (uint64_t)size : 0, NULL, err))) {
                json_decref(j);
                return rc;
            }
        }
        json_decref(j);
        if (next[0] && strncmp(next, h->endpoint, origin) != 0)
            return bl_err_set(err, BL_EPROTO, "%s: the file list's next page is on another host",
                              h->repo);
        snprintf(url, sizeof url, "%s", next);
    }
    return 0;
}

/* --- downloads -------------------------------------------------------------------- */

typedef struct sink {
    int fd;
    EVP_MD_CTX *md;
    uint64_t have;       /* bytes in the file */
    int64_t *range_start; /* the reply's Content-Range start */
    CURL *c;
    int checked;         /* the reply's status was looked at */
    int write_errno;
    long bad_status;
    const hub_t *h;
    const char *name;
    uint64_t total;      /* the file's size; 0 while not known */
    uint64_t start;      /* bytes in the file when this request began */
    int64_t last_us; /* the last call of the caller's progress function */
    bl_progress_t *pg;   /* the bar or the event lines (common/progress.h) */
} sink_t;

static size_t on_file_body(char *data, size_t size, size_t nmemb, void *ud)
{
    sink_t *s = ud;
    size_t n = size * nmemb;
    if (!s->checked) {
        long status = 0;
        curl_easy_getinfo(s->c, CURLINFO_RESPONSE_CODE, &status);
        s->checked = 1;
        if (status == 200 && s->have > 0) { /* the server ignored the range */
            if (ftruncate(s->fd, 0) != 0 || lseek(s->fd, 0, SEEK_SET) != 0 ||
                EVP_DigestInit_ex(s->md, EVP_sha256(), NULL) != 1) {
                s->write_errno = errno ? errno : EIO;
                return 0;
            }
            s->have = 0;
        } else if (status == 206) {
            if (*s->range_start != (int64_t)s->have) {
                s->bad_status = 206;
                return 0;
            }
        } else if (status != 200) {
            s->bad_status = status;
            return 0;
        }
    }
    for (size_t off = 0; off < n;) {
        ssize_t w = write(s->fd, data + off, n - off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            s->write_errno = errno;
            return 0;
        }
        off += (size_t)w;
    }
    if (EVP_DigestUpdate(s->md, data, n) != 1) {
        s->write_errno = EIO;
        return 0;
    }
    s->have += n;
    return n;
}

/* The caller's progress function (at most four calls a second) and the bar or event
 * lines of the download. */
static void report(sink_t *s, int last)
{
    bl_progress_update(s->pg, s->have, s->total);
    if (!s->h->o->progress)
        return;
    const int64_t now = bl_progress_now_us();
    if (!last && now - s->last_us < 250000)
        return;
    s->last_us = now;
    s->h->o->progress(s->h->o->ud, s->name, s->have, s->total);
}

static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    (void)dlnow, (void)ultotal, (void)ulnow;
    sink_t *s = ud;
    if (!s->total && dltotal > 0) /* a size the listing did not give: the reply's */
        s->total = s->start + (uint64_t)dltotal;
    report(s, 0);
    return 0;
}

/* Feeds the first `have` bytes of fd (a partial download) to the digest. */
static int hash_existing(int fd, EVP_MD_CTX *md, uint64_t have)
{
    enum { CHUNK = 1 << 20 };
    if (!have)
        return 0;
    char *buf = malloc(CHUNK);
    if (!buf)
        return -1;
    int rc = 0;
    for (uint64_t off = 0; off < have;) {
        size_t want = have - off < CHUNK ? (size_t)(have - off) : CHUNK;
        ssize_t r = pread(fd, buf, want, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0 || EVP_DigestUpdate(md, buf, (size_t)r) != 1) {
            rc = -1;
            break;
        }
        off += (uint64_t)r;
    }
    free(buf);
    return rc;
}

/* Downloads url into tmp, resuming what tmp holds, until it has f's size and SHA-256
 * (when the hub lists them). The caller renames tmp. */
static int download(hub_t *h, const char *url, const char *tmp, const hub_file_t *f, bl_err_t *err)
{
    char errbuf[CURL_ERROR_SIZE];
    int fd = open(tmp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return bl_err_set(err, BL_EIO, "cannot write %.300s: %s", tmp, strerror(errno));
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (!md) {
        close(fd);
        return bl_err_set(err, BL_ENOMEM, "cannot start a SHA-256");
    }
    int rc = 0;
    bl_progress_t pg = {0};
    for (int attempt = 0;; attempt++) {
        struct stat st;
        if (fstat(fd, &st) != 0) {
            rc = bl_err_set(err, BL_EIO, "cannot stat %.300s: %s", tmp, strerror(errno));
            break;
        }
        uint64_t have = (uint64_t)st.st_size;
        if (f->size && have > f->size) { /* not this file: start again */
            if (ftruncate(fd, 0) != 0) {
                rc = bl_err_set(err, BL_EIO, "cannot truncate %.300s: %s", tmp, strerror(errno));
                break;
            }
            have = 0;
        }
        if (EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1 || hash_existing(fd, md, have) != 0 ||
            lseek(fd, (off_t)have, SEEK_SET) < 0) {
            rc = bl_err_set(err, BL_EIO, "cannot read back %.300s: %s", tmp, strerror(errno));
            break;
        }
        if (!pg.started) {
            char esc[200], fields[240], label[64];
            const char *base = strrchr(f->path, '/');
            base = base ? base + 1 : f->path;
            snprintf(fields, sizeof fields, "event=download file=%s", bl_log_escape(esc, sizeof esc, f->path,
                                                                                    strlen(f->path)));
            snprintf(label, sizeof label, "downloading %s", bl_log_escape(esc, 48, base, strlen(base)));
            bl_progress_begin(&pg, BL_PROGRESS_AUTO, label, fields, f->size, have);
        }
        int64_t no_range = -1;
        sink_t s = {.fd = fd, .md = md, .have = have, .range_start = &no_range,
                    .h = h, .name = f->path, .total = f->size, .start = have, .pg = &pg};
        s.last_us = bl_progress_now_us();
        CURLcode cc = CURLE_OK;
        long status = 200;
        if (!(f->size && have == f->size)) { /* else only the check is left */
            reply_t hdr = {.range_start = -1};
            CURL *c = easy_new(h, url, errbuf);
            if (!c) {
                rc = bl_err_set(err, BL_ENOMEM, "cannot start an HTTP request");
                break;
            }
            char range[64];
            snprintf(range, sizeof range, "%llu-", (unsigned long long)have);
            if (have)
                curl_easy_setopt(c, CURLOPT_RANGE, range);
            s.c = c;
            s.range_start = &hdr.range_start;
            curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
            curl_easy_setopt(c, CURLOPT_HEADERDATA, &hdr);
            curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_file_body);
            curl_easy_setopt(c, CURLOPT_WRITEDATA, &s);
            curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
            curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
            curl_easy_setopt(c, CURLOPT_XFERINFODATA, &s);
            cc = curl_easy_perform(c);
            curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
            curl_easy_cleanup(c);
            if (s.write_errno) {
                rc = bl_err_set(err, BL_EIO, "cannot write %.300s: %s", tmp, strerror(s.write_errno));
                break;
            }
            if (cc == CURLE_OK && !s.checked && status == 200 && have > 0 && !f->size) {
                /* an empty 200 to a Range request of a file of unknown size: start again */
                if (ftruncate(fd, 0) != 0) {
                    rc = bl_err_set(err, BL_EIO, "cannot truncate %.300s: %s", tmp, strerror(errno));
                    break;
                }
                continue;
            }
            if (s.bad_status)
                status = s.bad_status, cc = CURLE_OK;
            if (s.bad_status == 206 && ftruncate(fd, 0) != 0) { /* resume failed: from 0 */
                rc = bl_err_set(err, BL_EIO, "cannot truncate %.300s: %s", tmp, strerror(errno));
                break;
            }
            if (status == 416 && have > 0) { /* the range lies past the end: start again */
                if (ftruncate(fd, 0) != 0) {
                    rc = bl_err_set(err, BL_EIO, "cannot truncate %.300s: %s", tmp, strerror(errno));
                    break;
                }
                if (attempt + 1 < HUB_ATTEMPTS)
                    continue;
            }
            if (cc != CURLE_OK || (status != 200 && status != 206) ||
                (s.bad_status == 206)) {
                int again = attempt + 1 < HUB_ATTEMPTS &&
                            (cc == CURLE_OK ? transient_status(status) || s.bad_status == 206
                                            : transient_curl(cc));
                if (!again) {
                    if (cc != CURLE_OK)
                        rc = bl_err_set(err, BL_EIO, "download of %s from %s: %s", f->path, h->repo,
                                        errbuf[0] ? errbuf : curl_easy_strerror(cc));
                    else if (s.bad_status == 206)
                        rc = bl_err_set(err, BL_EPROTO,
                                        "download of %s: the server resumed at another byte than "
                                        "asked",
                                        f->path);
                    else
                        rc = status_error(err, status, "download", h->repo, NULL);
                    break;
                }
                BL_LOG(BL_LOG_WARN, "event=hub_retry what=download file=%s status=%ld have=%llu "
                                    "error=%s",
                       f->path, status, (unsigned long long)s.have,
                       cc == CURLE_OK ? "http" : curl_easy_strerror(cc));
                backoff(attempt);
                continue;
            }
            report(&s, 1);
        }
        /* the whole file is here: check it */
        unsigned char digest[32];
        unsigned int dlen = 0;
        char hex[65];
        if (EVP_DigestFinal_ex(md, digest, &dlen) != 1 || dlen != 32) {
            rc = bl_err_set(err, BL_EIO, "cannot finish the SHA-256 of %s", f->path);
            break;
        }
        for (int i = 0; i < 32; i++)
            snprintf(hex + 2 * i, 3, "%02x", digest[i]);
        const char *why = NULL;
        if (f->size && s.have != f->size)
            why = "size";
        else if (f->sha256 && strcasecmp(hex, f->oid) != 0)
            why = "SHA-256";
        if (!why) {
            if (fdatasync(fd) != 0) {
                rc = bl_err_set(err, BL_EIO, "cannot write %.300s: %s", tmp, strerror(errno));
                break;
            }
            rc = 0;
            break;
        }
        /* a corrupt copy: throw it away, and try once more from the start */
        BL_LOG(BL_LOG_WARN, "event=hub_bad_copy file=%s check=%s bytes=%llu", f->path, why,
               (unsigned long long)s.have);
        if (ftruncate(fd, 0) != 0 || attempt + 1 >= HUB_ATTEMPTS) {
            rc = bl_err_set(err, BL_EPROTO,
                            "download of %s from %s: the file's %s does not match the hub's "
                            "(%llu bytes, SHA-256 %s; listed %llu bytes, %s)",
                            f->path, h->repo, why, (unsigned long long)s.have, hex,
                            (unsigned long long)f->size, f->sha256 ? f->oid : "no SHA-256");
            break;
        }
    }
    bl_progress_end(&pg, rc == 0);
    EVP_MD_CTX_free(md);
    close(fd);
    if (rc && rc != BL_EIO)
        unlink(tmp); /* a refusal or a bad copy; an I/O failure keeps what came, to resume */
    return rc;
}

/* snapshots/<commit>/<path> -> ../../blobs/<oid>, or the blob itself where the file
 * system has no symbolic links. */
static int link_blob(const char *blob, const char *final, const char *relpath, const char *oid,
                     bl_err_t *err)
{
    char target[PATH_MAX];
    size_t len = 0;
    int depth = 2; /* snapshots/<commit>/ */
    for (const char *p = relpath; *p; p++)
        depth += *p == '/';
    for (int i = 0; i < depth; i++)
        len += (size_t)snprintf(target + len, sizeof target - len, "../");
    if ((size_t)snprintf(target + len, sizeof target - len, "blobs/%s", oid) >= sizeof target - len)
        return bl_err_set(err, BL_ERANGE, "path too long for %s", relpath);
    int rc = bl_make_dirs(final, 0, err);
    if (rc)
        return rc;
    unlink(final); /* a dangling link of an earlier copy */
    if (symlink(target, final) == 0 || link(blob, final) == 0)
        return 0;
    return bl_err_set(err, BL_EIO, "cannot link %.300s to its blob: %s", final, strerror(errno));
}

static void url_path(char *out, size_t cap, const char *path)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)path; *p && n + 4 < cap; p++) {
        if (isalnum(*p) || strchr("-._~/", *p))
            out[n++] = (char)*p;
        else
            n += (size_t)snprintf(out + n, cap - n, "%%%02X", *p);
    }
    out[n] = '\0';
}

/* The snapshot path of f, downloaded (under a lock shared with other processes) when
 * it is not there yet. *final_out: caller frees. */
static int fetch_file(hub_t *h, const hub_file_t *f, char **final_out, bl_err_t *err)
{
    char final[PATH_MAX], blob[PATH_MAX], tmp[PATH_MAX + 16], lock[PATH_MAX + 512], url[4608],
        enc[3200];
    if ((size_t)snprintf(final, sizeof final, "%s/snapshots/%s/%s", h->repo_dir, h->commit,
                         f->path) >= sizeof final)
        return bl_err_set(err, BL_ERANGE, "cache path too long for %.200s", f->path);
    struct stat st;
    if (stat(final, &st) == 0 && S_ISREG(st.st_mode) &&
        (!f->size || (uint64_t)st.st_size == f->size)) {
        *final_out = strdup(final);
        return *final_out ? 0 : bl_err_set(err, BL_ENOMEM, "out of memory");
    }
    int too_long = 0;
    if (f->oid[0])
        too_long |= (size_t)snprintf(blob, sizeof blob, "%s/blobs/%s", h->repo_dir, f->oid) >=
                    sizeof blob;
    else
        snprintf(blob, sizeof blob, "%s", final);
    snprintf(tmp, sizeof tmp, "%s.incomplete", blob);
    too_long |= (size_t)snprintf(lock, sizeof lock, "%s/.locks/%s/%s.lock", h->cache,
                                 base_name(h->repo_dir), f->oid[0] ? f->oid : "nooid") >=
                sizeof lock;
    if (too_long)
        return bl_err_set(err, BL_ERANGE, "cache path too long for %.200s", f->path);
    int rc = bl_make_dirs(blob, 0, err);
    if (!rc)
        rc = bl_make_dirs(lock, 0, err);
    if (rc)
        return rc;
    int lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lfd < 0)
        return bl_err_set(err, BL_EIO, "cannot open the lock %.300s: %s", lock, strerror(errno));
    if (flock(lfd, LOCK_EX | LOCK_NB) != 0) {
        BL_LOG(BL_LOG_INFO, "event=hub_wait file=%s reason=another process downloads it", f->path);
        if (flock(lfd, LOCK_EX) != 0) {
            close(lfd);
            return bl_err_set(err, BL_EIO, "cannot lock %.300s: %s", lock, strerror(errno));
        }
    }
    if (!(stat(blob, &st) == 0 && S_ISREG(st.st_mode) &&
          (!f->size || (uint64_t)st.st_size == f->size))) {
        url_path(enc, sizeof enc, f->path);
        snprintf(url, sizeof url, "%s%s/resolve/%s/%s", h->endpoint, h->repo, h->commit, enc);
        BL_LOG(BL_LOG_INFO, "event=hub_download repo=%s file=%s bytes=%llu", h->repo, f->path,
               (unsigned long long)f->size);
        rc = download(h, url, tmp, f, err);
        if (!rc && rename(tmp, blob) != 0)
            rc = bl_err_set(err, BL_EIO, "cannot rename %.300s: %s", tmp, strerror(errno));
    }
    if (!rc && f->oid[0])
        rc = link_blob(blob, final, f->path, f->oid, err);
    close(lfd); /* releases the lock */
    if (rc)
        return rc;
    *final_out = strdup(final);
    return *final_out ? 0 : bl_err_set(err, BL_ENOMEM, "out of memory");
}

/* --- entry points ----------------------------------------------------------------- */

/* The bearer token's header, checked, into h->headers (none without a token). */
static int auth_header(hub_t *h, const char *token, bl_err_t *err)
{
    if (!token)
        return 0;
    size_t tn = strlen(token);
    for (size_t i = 0; i < tn; i++)
        if (token[i] <= ' ' || token[i] == 0x7f)
            return bl_err_set(err, BL_EINVAL,
                              "--hf-token: a token is printable characters without spaces");
    if (tn == 0 || tn > 1024)
        return bl_err_set(err, BL_EINVAL, "--hf-token: the token must be 1-1024 characters");
    char hdr[1100];
    snprintf(hdr, sizeof hdr, "Authorization: Bearer %s", token);
    h->headers = curl_slist_append(NULL, hdr);
    if (!h->headers)
        return bl_err_set(err, BL_ENOMEM, "out of memory");
    return 0;
}

static int hub_init(hub_t *h, const bl_hub_opts_t *o, bl_err_t *err)
{
    memset(h, 0, sizeof *h);
    h->o = o;
    int rc = parse_spec(o->spec, h->repo, h->tag, err);
    if (rc)
        return rc;
    const char *ep = getenv("MODEL_ENDPOINT");
    if (!ep || !*ep)
        ep = getenv("HF_ENDPOINT");
    if (!ep || !*ep)
        ep = "https://huggingface.co/";
    size_t n = strlen(ep);
    if (n + 2 > sizeof h->endpoint)
        return bl_err_set(err, BL_ERANGE, "the model endpoint is longer than %zu bytes",
                          sizeof h->endpoint - 2);
    if (strncmp(ep, "http://", 7) != 0 && strncmp(ep, "https://", 8) != 0)
        return bl_err_set(err, BL_EINVAL, "the model endpoint '%.200s' is not an http(s) URL", ep);
    snprintf(h->endpoint, sizeof h->endpoint, "%s%s", ep, ep[n - 1] == '/' ? "" : "/");
    if ((rc = cache_root(h->cache, sizeof h->cache, err)))
        return rc;
    char folder[HUB_REPO_MAX + 16];
    snprintf(folder, sizeof folder, "models--%s", h->repo);
    for (char *p = strchr(folder, '/'); p; p = strchr(p, '/')) { /* user/model -> user--model */
        memmove(p + 2, p + 1, strlen(p + 1) + 1);
        p[0] = p[1] = '-';
    }
    if ((size_t)snprintf(h->repo_dir, sizeof h->repo_dir, "%s/%s", h->cache, folder) >=
        sizeof h->repo_dir)
        return bl_err_set(err, BL_ERANGE, "the cache folder path is too long");
    return auth_header(h, o->token, err);
}

int bl_hub_resolve(const bl_hub_opts_t *o, char **path_out, bl_err_t *err)
{
    hub_t h;
    hub_list_t l = {0};
    size_t *parts = NULL;
    char *first = NULL;
    int n_parts = 0;
    *path_out = NULL;
    int rc = hub_init(&h, o, err);
    if (rc)
        goto out;
    int online = 0;
    bl_err_t net = {0};
    if (!o->offline) {
        pthread_once(&curl_once, curl_init);
        if (curl_init_rc != CURLE_OK) {
            rc = bl_err_set(err, BL_EIO, "cannot start libcurl: %s", curl_easy_strerror(curl_init_rc));
            goto out;
        }
        rc = fetch_commit(&h, &net);
        if (!rc)
            rc = fetch_tree(&h, &l, &net);
        online = rc == 0;
        if (!online) {
            list_free(&l);
            BL_LOG(BL_LOG_WARN, "event=hub_offline repo=%s reason=%s", h.repo, net.msg);
        }
    }
    if (!online) {
        bl_err_t why = {0};
        rc = cached_commit(&h, &why);
        if (!rc)
            rc = list_snapshot(&h, &l, &why);
        if (rc) {
            rc = o->offline ? bl_err_set(err, rc, "--offline: %s", why.msg)
                            : bl_err_set(err, net.code, "%.300s (and no cached copy: %.180s)",
                                         net.msg, why.msg);
            goto out;
        }
    }
    long pick = pick_file(&l, h.repo, h.tag, o->file, err);
    if (pick < 0) {
        rc = (int)pick;
        if (!online && !o->offline) {
            bl_err_t cached = *err;
            rc = bl_err_set(err, rc, "the cache: %.250s; the hub: %.200s", cached.msg, net.msg);
        }
        goto out;
    }
    if ((rc = gather_parts(&l, (size_t)pick, &parts, &n_parts, err)))
        goto out;
    for (int k = 0; k < n_parts; k++) {
        const hub_file_t *f = &l.v[parts[k]];
        char *path = NULL;
        if (f->local) {
            path = strdup(f->local);
            if (!path) {
                rc = bl_err_set(err, BL_ENOMEM, "out of memory");
                goto out;
            }
        } else if ((rc = fetch_file(&h, f, &path, err))) {
            goto out;
        }
        if (k == 0)
            first = path;
        else
            free(path);
    }
    BL_LOG(BL_LOG_INFO, "event=hub_model repo=%s commit=%s file=%s parts=%d source=%s", h.repo,
           h.commit, l.v[parts[0]].path, n_parts, online ? "hub" : "cache");
    *path_out = first;
    first = NULL;
out:
    free(first);
    free(parts);
    list_free(&l);
    curl_slist_free_all(h.headers);
    return rc;
}

/* llama.cpp's cache folder for -mu: LLAMA_CACHE, XDG_CACHE_HOME/llama.cpp,
 * ~/.cache/llama.cpp. */
static int url_cache_root(char *buf, size_t cap, bl_err_t *err)
{
    const char *v;
    int n;
    if ((v = getenv("LLAMA_CACHE")) && *v)
        n = snprintf(buf, cap, "%s", v);
    else if ((v = getenv("XDG_CACHE_HOME")) && *v)
        n = snprintf(buf, cap, "%s/llama.cpp", v);
    else if ((v = getenv("HOME")) && *v)
        n = snprintf(buf, cap, "%s/.cache/llama.cpp", v);
    else
        return bl_err_set(err, BL_ENOENT, "no folder for the model cache: set LLAMA_CACHE or HOME");
    if (n < 0 || (size_t)n >= cap)
        return bl_err_set(err, BL_ERANGE, "the cache folder path is too long");
    return 0;
}

/* -mu: the URL's file (every part of a split one) at dest, or beside it in the cache,
 * downloaded unless there. */
static int fetch_url(const bl_hub_opts_t *o, const char *model, char **path_out, bl_err_t *err)
{
    const char *url = o->url;
    size_t n = strlen(url);
    if ((strncmp(url, "http://", 7) && strncmp(url, "https://", 8)) || n > 2000)
        return bl_err_set(err, BL_EINVAL, "--model-url '%.200s' is not an http(s) URL", url);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)url[i] <= ' ' || url[i] == 0x7f)
            return bl_err_set(err, BL_EINVAL, "--model-url: a URL has no spaces or control bytes");
    /* the file name: the last path segment, before any query or fragment */
    size_t end = strcspn(url, "?#"), start = end;
    while (start > 0 && url[start - 1] != '/')
        start--;
    char name[256];
    if (end - start == 0 || end - start >= sizeof name)
        return bl_err_set(err, BL_EINVAL, "--model-url '%.200s' names no file", url);
    memcpy(name, url + start, end - start);
    name[end - start] = '\0';
    if (!valid_relpath(name) || name[0] == '.')
        return bl_err_set(err, BL_EINVAL, "--model-url: '%.100s' is not a file name", name);
    char dir[PATH_MAX], dest[PATH_MAX + 300];
    int rc;
    if (model) {
        const char *slash = strrchr(model, '/');
        if ((size_t)snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - model) : 1,
                             slash ? model : ".") >= sizeof dir)
            return bl_err_set(err, BL_ERANGE, "-m: the path is too long");
    } else if ((rc = url_cache_root(dir, sizeof dir, err))) {
        return rc;
    }
    size_t pl;
    int index, count;
    int split = split_info(name, &pl, &index, &count) && count > 1;
    if (split && index != 1)
        return bl_err_set(err, BL_EINVAL, "--model-url: give the first part of a split model, "
                                          "not part %d", index);
    hub_t h;
    memset(&h, 0, sizeof h);
    h.o = o;
    snprintf(h.repo, sizeof h.repo, "%.*s", (int)start, url); /* the URL's folder, for messages */
    if ((rc = auth_header(&h, o->token, err)))
        return rc;
    char *first = NULL;
    for (int k = 1; k <= (split ? count : 1) && !rc; k++) {
        char part[300], purl[2400];
        if (split)
            snprintf(part, sizeof part, "%.*s-%05d-of-%05d.gguf", (int)pl, name, k, count);
        else
            snprintf(part, sizeof part, "%s", name);
        snprintf(purl, sizeof purl, "%.*s%s%s", (int)start, url, part, url + end);
        if (model && k == 1 && !split)
            snprintf(dest, sizeof dest, "%s", model);
        else
            snprintf(dest, sizeof dest, "%s/%s", dir, part);
        struct stat st;
        if (stat(dest, &st) == 0 && S_ISREG(st.st_mode)) {
            BL_LOG(BL_LOG_INFO, "event=model_url file=%s source=cache", dest);
        } else if (o->offline) {
            rc = bl_err_set(err, BL_ENOENT, "--offline: %.300s is not there", dest);
        } else if (!(rc = bl_make_dirs(dest, 0, err))) {
            pthread_once(&curl_once, curl_init);
            char tmp[PATH_MAX + 320];
            snprintf(tmp, sizeof tmp, "%s.incomplete", dest);
            hub_file_t f = {.path = part};
            BL_LOG(BL_LOG_INFO, "event=model_url url=%s file=%s", purl, dest);
            if (curl_init_rc != CURLE_OK)
                rc = bl_err_set(err, BL_EIO, "cannot start libcurl");
            else if (!(rc = download(&h, purl, tmp, &f, err)) && rename(tmp, dest) != 0)
                rc = bl_err_set(err, BL_EIO, "cannot rename %.300s: %s", tmp, strerror(errno));
        }
        if (!rc && k == 1 && !(first = strdup(dest)))
            rc = bl_err_set(err, BL_ENOMEM, "out of memory");
    }
    curl_slist_free_all(h.headers);
    if (rc) {
        free(first);
        return rc;
    }
    *path_out = first;
    return 0;
}

int bl_hub_model_path(const bl_hub_opts_t *o, const char *model, char **path_out, bl_err_t *err)
{
    *path_out = NULL;
    if (o->spec && model)
        return bl_err_set(err, BL_EINVAL, "give -m FILE or -hf REPO, not both");
    if (o->spec && o->url)
        return bl_err_set(err, BL_EINVAL, "give -hf REPO or --model-url URL, not both");
    if (o->file && !o->spec)
        return bl_err_set(err, BL_EINVAL, "--hf-file needs -hf REPO");
    if (o->spec)
        return bl_hub_resolve(o, path_out, err);
    if (o->url)
        return fetch_url(o, model, path_out, err);
    if (!model)
        return 0;
    *path_out = strdup(model);
    return *path_out ? 0 : bl_err_set(err, BL_ENOMEM, "out of memory");
}

/* --- the cache's list (-cl) --------------------------------------------------------- */

static int by_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int bl_hub_list(FILE *f, bl_err_t *err)
{
    char root[PATH_MAX];
    int rc = cache_root(root, sizeof root, err);
    if (rc)
        return rc;
    DIR *d = opendir(root);
    char **rows = NULL;
    size_t n = 0, cap = 0;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (strncmp(e->d_name, "models--", 8) != 0)
                continue;
            char snaps[PATH_MAX];
            if ((size_t)snprintf(snaps, sizeof snaps, "%s/%s/snapshots", root, e->d_name) >= sizeof snaps)
                continue;
            /* "models--user--model" names user/model */
            char repo[256];
            snprintf(repo, sizeof repo, "%s", e->d_name + 8);
            char *sep = strstr(repo, "--");
            if (sep) {
                *sep = '/';
                memmove(sep + 1, sep + 2, strlen(sep + 2) + 1);
            }
            DIR *sd = opendir(snaps);
            struct dirent *se;
            while (sd && (se = readdir(sd))) {
                if (se->d_name[0] == '.')
                    continue;
                char snap[PATH_MAX];
                if ((size_t)snprintf(snap, sizeof snap, "%s/%s", snaps, se->d_name) >= sizeof snap)
                    continue;
                DIR *fd = opendir(snap);
                struct dirent *fe;
                while (fd && (fe = readdir(fd))) {
                    const size_t l = strlen(fe->d_name);
                    if (l < 6 || strcmp(fe->d_name + l - 5, ".gguf") != 0)
                        continue;
                    char row[PATH_MAX];
                    snprintf(row, sizeof row, "%s %s", repo, fe->d_name);
                    if (n == cap) {
                        char **r2 = realloc(rows, (cap = cap ? 2 * cap : 16) * sizeof *rows);
                        if (!r2)
                            break;
                        rows = r2;
                    }
                    if ((rows[n] = strdup(row)))
                        n++;
                }
                if (fd)
                    closedir(fd);
            }
            if (sd)
                closedir(sd);
        }
        closedir(d);
    }
    qsort(rows, n, sizeof *rows, by_str);
    fprintf(f, "models in the cache %s: %zu\n", root, n);
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "  %zu. %s\n", i + 1, rows[i]);
        free(rows[i]);
    }
    free(rows);
    return 0;
}
