/* Tests of router/api_info.c's /metrics text for the children's counters
 * (child_metrics): plain counters as they are, per-layer counters as one metric with
 * a layer label under one HELP and TYPE, and the card hit ratio derived from them.
 * api_info.c is included so that its static renderer is reached without a server. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_info.c"

static void add(rt_child_stats_t *k, const char *name, uint64_t value)
{
    assert_true(k->n < RT_CLUSTER_MAX_COUNTERS);
    snprintf(k->c[k->n].name, sizeof k->c[k->n].name, "%s", name);
    k->c[k->n].value = value;
    k->n++;
}

/* The text child_metrics writes for kids[0..n); the caller frees it. */
static char *render(const rt_child_stats_t *kids, int n)
{
    textbuf_t b = {0};
    child_metrics(&b, kids, n);
    assert_false(b.oom);
    return b.p ? b.p : strdup("");
}

static int count(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

static void test_metrics_layer_suffix_splits_only_digits_after_l(void **state)
{
    (void)state;
    assert_int_equal(layer_split("expert_selections_l3"), strlen("expert_selections"));
    assert_int_equal(layer_split("a_b_l4095"), 3);
    assert_int_equal(layer_split("steps"), 0);
    assert_int_equal(layer_split("step_errors"), 0);
    assert_int_equal(layer_split("x_l"), 0);
    assert_int_equal(layer_split("_l5"), 0);
    assert_int_equal(layer_split("x_l5y"), 0);
    assert_int_equal(layer_split("x_m5"), 0);
    assert_int_equal(layer_split("x_l-1"), 0);
}

/* Two workers with residency and a hosttier without: every plain counter as before,
 * each per-layer family once with all its samples after its TYPE line, the ratio per
 * layer. */
static void test_metrics_per_layer_counters_get_a_layer_label(void **state)
{
    (void)state;
    static rt_child_stats_t kids[3];
    memset(kids, 0, sizeof kids);
    snprintf(kids[0].process, sizeof kids[0].process, "worker0");
    add(&kids[0], "steps", 5);
    add(&kids[0], "expert_slots", 96);
    add(&kids[0], "expert_selections_l3", 100);
    add(&kids[0], "expert_card_hits_l3", 25);
    add(&kids[0], "expert_selections_l7", 10);
    add(&kids[0], "expert_card_hits_l7", 0);
    snprintf(kids[1].process, sizeof kids[1].process, "worker1");
    add(&kids[1], "expert_card_hits_l12", 8); /* hits before selections: still paired */
    add(&kids[1], "expert_selections_l12", 8);
    snprintf(kids[2].process, sizeof kids[2].process, "hosttier");
    kids[2].uptime_us = 1500000;
    add(&kids[2], "expert_rows", 42);
    char *t = render(kids, 3);

    assert_non_null(strstr(t, "bloomery:child_steps{process=\"worker0\"} 5\n"));
    assert_non_null(strstr(t, "bloomery:child_expert_slots{process=\"worker0\"} 96\n"));
    assert_non_null(strstr(t, "bloomery:child_expert_rows{process=\"hosttier\"} 42\n"));
    assert_non_null(strstr(t, "bloomery:child_uptime_seconds{process=\"hosttier\"} 1.500\n"));
    assert_null(strstr(t, "_l3"));
    assert_null(strstr(t, "_l12"));

    assert_int_equal(count(t, "# TYPE bloomery:child_expert_selections counter\n"), 1);
    assert_int_equal(count(t, "# HELP bloomery:child_expert_selections "), 1);
    assert_int_equal(count(t, "# TYPE bloomery:child_expert_card_hits counter\n"), 1);
    /* a family's samples follow its TYPE line, together */
    const char *sel = strstr(t, "# TYPE bloomery:child_expert_selections counter\n");
    const char *s3 = strstr(t, "bloomery:child_expert_selections{process=\"worker0\",layer=\"3\"} 100\n");
    const char *s7 = strstr(t, "bloomery:child_expert_selections{process=\"worker0\",layer=\"7\"} 10\n");
    const char *s12 = strstr(t, "bloomery:child_expert_selections{process=\"worker1\",layer=\"12\"} 8\n");
    const char *hits = strstr(t, "# HELP bloomery:child_expert_card_hits ");
    assert_true(sel && s3 && s7 && s12 && hits);
    assert_true(sel < s3 && s3 < s7 && s7 < s12 && s12 < hits);
    assert_non_null(strstr(t, "bloomery:child_expert_card_hits{process=\"worker0\",layer=\"7\"} 0\n"));

    assert_int_equal(count(t, "# TYPE bloomery:expert_card_hit_ratio gauge\n"), 1);
    assert_non_null(strstr(t, "bloomery:expert_card_hit_ratio{process=\"worker0\",layer=\"3\"} 0.25\n"));
    assert_non_null(strstr(t, "bloomery:expert_card_hit_ratio{process=\"worker0\",layer=\"7\"} 0\n"));
    assert_non_null(strstr(t, "bloomery:expert_card_hit_ratio{process=\"worker1\",layer=\"12\"} 1\n"));
    free(t);
}

/* No per-layer counters: the text is as it always was, with no HELP or TYPE lines
 * and no ratio; a layer without selections, or without its hits, has no ratio. */
static void test_metrics_without_layers_and_unpaired_layers(void **state)
{
    (void)state;
    static rt_child_stats_t kids[2];
    memset(kids, 0, sizeof kids);
    snprintf(kids[0].process, sizeof kids[0].process, "worker0");
    add(&kids[0], "steps", 1);
    add(&kids[0], "rows", 2);
    char *t = render(kids, 1);
    assert_string_equal(t, "bloomery:child_uptime_seconds{process=\"worker0\"} 0.000\n"
                           "bloomery:child_steps{process=\"worker0\"} 1\n"
                           "bloomery:child_rows{process=\"worker0\"} 2\n");
    free(t);

    add(&kids[0], "expert_selections_l0", 0);
    add(&kids[0], "expert_card_hits_l0", 0);
    add(&kids[0], "expert_selections_l1", 4); /* its hits never came */
    t = render(kids, 1);
    assert_non_null(strstr(t, "bloomery:child_expert_selections{process=\"worker0\",layer=\"1\"} 4\n"));
    assert_null(strstr(t, "expert_card_hit_ratio"));
    free(t);
}

/* A worker's full set for a 94-layer model fits, and so do 65 children of it. */
static void test_metrics_94_layers_of_every_child(void **state)
{
    (void)state;
    const int n = MAX_CHILDREN;
    rt_child_stats_t *kids = calloc((size_t)n, sizeof *kids);
    assert_non_null(kids);
    for (int i = 0; i < n; i++) {
        snprintf(kids[i].process, sizeof kids[i].process, "worker%d", i);
        add(&kids[i], "steps", 1);
        for (int l = 0; l < 94; l++) {
            char name[32];
            snprintf(name, sizeof name, "expert_selections_l%d", l);
            add(&kids[i], name, 4);
            snprintf(name, sizeof name, "expert_card_hits_l%d", l);
            add(&kids[i], name, 1);
        }
    }
    char *t = render(kids, n);
    assert_int_equal(count(t, "bloomery:expert_card_hit_ratio{"), 94 * n);
    assert_non_null(strstr(t, "bloomery:expert_card_hit_ratio{process=\"worker64\",layer=\"93\"} 0.25\n"));
    assert_int_equal(count(t, "# TYPE "), 3);
    free(t);
    free(kids);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metrics_layer_suffix_splits_only_digits_after_l),
        cmocka_unit_test(test_metrics_per_layer_counters_get_a_layer_label),
        cmocka_unit_test(test_metrics_without_layers_and_unpaired_layers),
        cmocka_unit_test(test_metrics_94_layers_of_every_child),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
