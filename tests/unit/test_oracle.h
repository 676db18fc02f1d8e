/* The oracle files of ../shared/oracle/logits (README there) and the distance of
 * a run's logits from them: the gates test_worker_qwen3moe (CPU) and tests/gpu's
 * test_worker_cuda (the card) both apply. Header-only, for tests; needs jansson.
 * ORACLE_SAY(fmt, ...) prints a diagnostic (default: stderr). */
#ifndef TEST_ORACLE_H
#define TEST_ORACLE_H

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef ORACLE_SAY
#define ORACLE_SAY(...) fprintf(stderr, __VA_ARGS__)
#endif

typedef struct oracle {
    json_t *root;
    int32_t *ids;      /* prompt_ids */
    int64_t n;
    json_t *positions; /* array of {lse, ids, logits} */
} oracle_t;

static int oracle_load(oracle_t *o, const char *shared, const char *model, const char *prompt, int exact)
{
    char path[1400];
    snprintf(path, sizeof path, "%s/oracle/logits/%s.%s%s.json", shared, model, prompt,
             exact ? ".exact" : "");
    json_error_t je;
    memset(o, 0, sizeof *o);
    o->root = json_load_file(path, 0, &je);
    if (!o->root) {
        ORACLE_SAY("cannot read %s: %s\n", path, je.text);
        return -1;
    }
    json_t *pi = json_object_get(o->root, "prompt_ids");
    o->positions = json_object_get(o->root, "positions");
    if (!json_is_array(pi) || !json_is_array(o->positions))
        return -1;
    o->n = (int64_t)json_array_size(pi);
    o->ids = malloc(sizeof(int32_t) * (size_t)o->n);
    for (int64_t i = 0; i < o->n; i++)
        o->ids[i] = (int32_t)json_integer_value(json_array_get(pi, (size_t)i));
    return (int64_t)json_array_size(o->positions) == o->n ? 0 : -1;
}

static void oracle_free(oracle_t *o)
{
    json_decref(o->root);
    free(o->ids);
}

typedef struct stats {
    int64_t n;      /* positions */
    int64_t top1;   /* positions whose best id matches the exact file's */
    double mean;    /* mean |dlogit| over the exact top-32 ids found */
    double max;
    double lse_max; /* largest |dlse| */
    double lse_mean;
} stats_t;

/* Our full logits (n, n_vocab) against the exact file. */
static stats_t compare_ours(const oracle_t *ex, const float *logits, int64_t n_vocab)
{
    stats_t s = {0};
    double sum = 0.0, lsum = 0.0;
    int64_t cnt = 0;
    for (int64_t p = 0; p < ex->n; p++) {
        const float *l = logits + p * n_vocab;
        json_t *pos = json_array_get(ex->positions, (size_t)p);
        json_t *ids = json_object_get(pos, "ids"), *lg = json_object_get(pos, "logits");
        int64_t best = 0;
        double mx = l[0];
        for (int64_t v = 1; v < n_vocab; v++)
            if (l[v] > mx) {
                mx = l[v];
                best = v;
            }
        double se = 0.0;
        for (int64_t v = 0; v < n_vocab; v++)
            se += exp((double)l[v] - mx);
        const double lse = mx + log(se);
        const double dl = fabs(lse - json_number_value(json_object_get(pos, "lse")));
        lsum += dl;
        s.lse_max = dl > s.lse_max ? dl : s.lse_max;
        if (best == json_integer_value(json_array_get(ids, 0)))
            s.top1++;
        for (size_t j = 0; j < json_array_size(ids); j++) {
            const int64_t id = json_integer_value(json_array_get(ids, j));
            const double d = fabs((double)l[id] - json_number_value(json_array_get(lg, j)));
            sum += d;
            s.max = d > s.max ? d : s.max;
            cnt++;
        }
    }
    s.n = ex->n;
    s.mean = cnt ? sum / (double)cnt : 0.0;
    s.lse_mean = ex->n ? lsum / (double)ex->n : 0.0;
    return s;
}

/* llama.cpp's file against the exact file: the exact top-32 ids found in its top-32. */
static stats_t compare_files(const oracle_t *ex, const oracle_t *ll)
{
    stats_t s = {0};
    double sum = 0.0, lsum = 0.0;
    int64_t cnt = 0;
    for (int64_t p = 0; p < ex->n; p++) {
        json_t *pe = json_array_get(ex->positions, (size_t)p), *pl = json_array_get(ll->positions, (size_t)p);
        json_t *ie = json_object_get(pe, "ids"), *le = json_object_get(pe, "logits");
        json_t *il = json_object_get(pl, "ids"), *ll_ = json_object_get(pl, "logits");
        if (json_integer_value(json_array_get(ie, 0)) == json_integer_value(json_array_get(il, 0)))
            s.top1++;
        const double dl = fabs(json_number_value(json_object_get(pe, "lse")) -
                               json_number_value(json_object_get(pl, "lse")));
        lsum += dl;
        s.lse_max = dl > s.lse_max ? dl : s.lse_max;
        for (size_t j = 0; j < json_array_size(ie); j++) {
            const json_int_t id = json_integer_value(json_array_get(ie, j));
            for (size_t k = 0; k < json_array_size(il); k++)
                if (json_integer_value(json_array_get(il, k)) == id) {
                    const double d = fabs(json_number_value(json_array_get(le, j)) -
                                          json_number_value(json_array_get(ll_, k)));
                    sum += d;
                    s.max = d > s.max ? d : s.max;
                    cnt++;
                    break;
                }
        }
    }
    s.n = ex->n;
    s.mean = cnt ? sum / (double)cnt : 0.0;
    s.lse_mean = ex->n ? lsum / (double)ex->n : 0.0;
    return s;
}

#endif
