/* libFuzzer target for hostfiles (common/hostfile.c): the input is the file's text.
 * An accepted file must keep the rules the parser promises (exactly one router, a
 * worker, ports and roles in range, distinct GPUs in range on each host, one hosttier
 * a host, no HOST:PORT twice, layer ranges on every worker or none and tiling, each
 * entry's line inside the text), parse again to the same entries, and, written back
 * out as a hostfile, parse to the same entries once more. A refusal must say why, as
 * "fuzz.txt:...", and say it the same way twice.
 * Seeds: tests/fuzz/corpus/fuzz_hostfile/. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "hostfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_hostfile: %s\n", what);
        abort();
    }
}

/* The same entry; lines compared only when asked (a rewritten file numbers anew). */
static int same_entry(const bl_host_entry_t *a, const bl_host_entry_t *b, int lines)
{
    if (strcmp(a->host, b->host) != 0 || a->port != b->port || a->role != b->role || a->all_gpus != b->all_gpus ||
        a->n_gpus != b->n_gpus || a->threads != b->threads || a->layer_begin != b->layer_begin ||
        a->layer_end != b->layer_end || strcmp(a->name, b->name) != 0 || (lines && a->line != b->line))
        return 0;
    for (int g = 0; g < a->n_gpus; g++)
        if (a->gpus[g] != b->gpus[g])
            return 0;
    return 1;
}

static void check_entries(const bl_hostfile_t *h, size_t size, const uint8_t *data)
{
    int lines = 1; /* a last line without its '\n' counts */
    for (size_t i = 0; i < size; i++)
        lines += data[i] == '\n';
    check(h->n >= 2 && h->n <= BL_HOSTFILE_MAX_ENTRIES, "an accepted file with too few or too many entries");
    int routers = 0, workers = 0, with_layers = 0;
    for (int i = 0; i < h->n; i++) {
        const bl_host_entry_t *e = &h->e[i];
        check(e->line >= 1 && e->line <= lines, "an entry's line is outside the text");
        check(i == 0 || e->line > h->e[i - 1].line, "entries out of file order");
        check(e->port >= 1, "port 0 accepted");
        check(memchr(e->host, 0, sizeof e->host) && e->host[0], "an empty or unterminated host");
        check(memchr(e->name, 0, sizeof e->name) != NULL, "an unterminated name");
        check(e->threads >= 0 && e->threads <= BL_HOSTFILE_MAX_THREADS, "threads out of range");
        check(e->n_gpus >= 0 && e->n_gpus <= BL_HOSTFILE_MAX_GPUS, "a GPU count out of range");
        check(!e->all_gpus || e->n_gpus == 0, "GPUS all with a list");
        check(e->layer_begin == -1 ? e->layer_end == -1
                                   : e->layer_begin >= 0 && e->layer_begin < e->layer_end &&
                                         e->layer_end <= BL_HOSTFILE_MAX_LAYERS,
              "a layer range out of order or range");
        uint64_t seen = 0;
        for (int g = 0; g < e->n_gpus; g++) {
            check(e->gpus[g] >= 0 && e->gpus[g] < BL_HOSTFILE_MAX_GPUS, "a GPU ordinal out of range");
            check(!(seen >> e->gpus[g] & 1), "a GPU listed twice");
            seen |= 1ull << e->gpus[g];
        }
        switch (e->role) {
        case BL_HOST_ROUTER:
            routers++;
            break;
        case BL_HOST_WORKER:
            workers++;
            with_layers += e->layer_begin >= 0;
            break;
        case BL_HOST_HOSTTIER:
            break;
        default:
            check(0, "an unknown role");
        }
        if (e->role != BL_HOST_WORKER)
            check(!e->all_gpus && e->n_gpus == 0 && e->layer_begin == -1, "GPUs or layers on a non-worker");
        /* the rules between entries, pairwise (the inputs here are small) */
        for (int j = 0; j < i; j++) {
            const bl_host_entry_t *o = &h->e[j];
            if (strcasecmp(o->host, e->host) != 0)
                continue;
            check(o->port != e->port, "HOST:PORT twice");
            check(!(o->role == BL_HOST_HOSTTIER && e->role == BL_HOST_HOSTTIER), "two hosttiers on a host");
            if (o->role != BL_HOST_WORKER || e->role != BL_HOST_WORKER)
                continue;
            const int og = o->all_gpus || o->n_gpus, eg = e->all_gpus || e->n_gpus;
            check(!(og && eg && (o->all_gpus || e->all_gpus)), "GPUS all beside another GPU worker");
            for (int a = 0; a < o->n_gpus; a++)
                for (int b = 0; b < e->n_gpus; b++)
                    check(o->gpus[a] != e->gpus[b], "a GPU on two workers of a host");
        }
    }
    check(routers == 1 && workers >= 1, "not one router and a worker");
    check(bl_hostfile_router(h) && bl_hostfile_router(h)->role == BL_HOST_ROUTER, "the router not found");
    check(with_layers == 0 || with_layers == workers, "layers= on some workers only");
    if (with_layers) {
        int64_t end = 0;
        for (int i = 0; i < h->n; i++)
            if (h->e[i].role == BL_HOST_WORKER) {
                check(h->e[i].layer_begin == end, "layer ranges that do not tile");
                end = h->e[i].layer_end;
            }
    }
    int walked = 0;
    for (const bl_host_entry_t *p = NULL; (p = bl_hostfile_next(h, p, NULL, 0));)
        walked++;
    check(walked == h->n, "bl_hostfile_next does not walk every entry");
    for (int i = 0; i < h->n; i++)
        check(bl_hostfile_next(h, i ? &h->e[i - 1] : NULL, h->e[i].host, h->e[i].role) == &h->e[i],
              "bl_hostfile_next skips an entry of its host");
}

/* The entries as a hostfile, one a line, every field written out. */
static char *write_back(const bl_hostfile_t *h, size_t *len)
{
    const size_t cap = (size_t)h->n * 600 + 1;
    char *p = malloc(cap);
    if (!p)
        return NULL;
    size_t n = 0;
    for (int i = 0; i < h->n; i++) {
        const bl_host_entry_t *e = &h->e[i];
        const int v6 = strchr(e->host, ':') != NULL;
        n += (size_t)snprintf(p + n, cap - n, "%s%s%s %u %s", v6 ? "[" : "", e->host, v6 ? "]" : "",
                              (unsigned)e->port, bl_host_role_name(e->role));
        if (e->role == BL_HOST_WORKER) {
            if (e->all_gpus)
                n += (size_t)snprintf(p + n, cap - n, " all");
            else if (e->n_gpus == 0)
                n += (size_t)snprintf(p + n, cap - n, " cpu");
            for (int g = 0; g < e->n_gpus; g++)
                n += (size_t)snprintf(p + n, cap - n, "%c%d", g ? ',' : ' ', e->gpus[g]);
        }
        if (e->threads)
            n += (size_t)snprintf(p + n, cap - n, " threads=%d", e->threads);
        if (e->layer_begin >= 0)
            n += (size_t)snprintf(p + n, cap - n, " layers=%lld-%lld", (long long)e->layer_begin,
                                  (long long)e->layer_end);
        if (e->name[0])
            n += (size_t)snprintf(p + n, cap - n, " name=%s", e->name);
        n += (size_t)snprintf(p + n, cap - n, "\n");
    }
    *len = n;
    return p;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bl_hostfile_t h, again;
    bl_err_t err = {0}, err2 = {0};
    const char *text = (const char *)data;
    const int rc = bl_hostfile_parse(text, size, "fuzz.txt", &h, &err);
    const int rc2 = bl_hostfile_parse(text, size, "fuzz.txt", &again, &err2);
    check(rc == rc2, "a second parse answers differently");
    if (rc != 0) {
        check(rc == BL_EINVAL || rc == BL_ENOMEM, "a refusal with an unexpected code");
        check(strncmp(err.msg, "fuzz.txt:", 9) == 0, "a refusal that does not name the text");
        check(strcmp(err.msg, err2.msg) == 0, "a second parse refuses differently");
        check(h.e == NULL && h.n == 0, "a refusal left entries");
        return 0;
    }
    check_entries(&h, size, data);
    check(again.n == h.n, "a second parse has another count");
    for (int i = 0; i < h.n; i++)
        check(same_entry(&h.e[i], &again.e[i], 1), "a second parse has another entry");
    bl_hostfile_free(&again);

    size_t n;
    char *back = write_back(&h, &n);
    if (back) {
        const int rc3 = bl_hostfile_parse(back, n, "fuzz.txt", &again, &err2);
        if (rc3 != 0)
            fprintf(stderr, "fuzz_hostfile: %s\n", err2.msg);
        check(rc3 == 0, "the entries written back are refused");
        check(again.n == h.n, "the entries written back parse to another count");
        for (int i = 0; i < h.n; i++) {
            check(same_entry(&h.e[i], &again.e[i], 0), "the entries written back parse to another entry");
            check(again.e[i].line == i + 1, "the entries written back are numbered wrong");
        }
        bl_hostfile_free(&again);
        free(back);
    }
    bl_hostfile_free(&h);
    return 0;
}
