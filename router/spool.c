/* The engine's row pool (spool.h). A run publishes its work under the lock and
 * bumps the generation; helpers and the caller take rows from an atomic counter;
 * the last row done wakes the caller. */
#include "spool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#define SPOOL_MAX_HELPERS 64

struct rt_spool {
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;       /* bumped by each run that wakes the helpers */
    int stop;
    rt_spool_fn fn;     /* the current run's, under mu */
    void *ctx;
    int n;
    atomic_int next;    /* the next row to take */
    atomic_int left;    /* rows not yet finished */
    int active;         /* helpers between taking a run's work and giving it back, under
                         * mu: a run starts and ends with none, so no helper takes a row
                         * of one run with another's fn */
    int n_helpers;
    pthread_t th[SPOOL_MAX_HELPERS];
};

/* Takes rows of the current run until none is left; returns how many it finished. */
static int take_rows(rt_spool_t *p, rt_spool_fn fn, void *ctx, int n)
{
    int done = 0, i;
    while ((i = atomic_fetch_add(&p->next, 1)) < n) {
        fn(ctx, i);
        done++;
    }
    return done;
}

static void *helper_main(void *arg)
{
    rt_spool_t *p = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->gen == seen)
            pthread_cond_wait(&p->go, &p->mu);
        if (p->stop)
            break;
        seen = p->gen;
        rt_spool_fn fn = p->fn;
        void *ctx = p->ctx;
        const int n = p->n;
        p->active++;
        pthread_mutex_unlock(&p->mu);
        const int done = take_rows(p, fn, ctx, n);
        pthread_mutex_lock(&p->mu);
        atomic_fetch_sub(&p->left, done);
        p->active--;
        pthread_cond_signal(&p->done); /* the caller waits on left and active */
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int rt_spool_create(rt_spool_t **out, int n_helpers, bl_err_t *err)
{
    *out = NULL;
    if (n_helpers < 0 || n_helpers > SPOOL_MAX_HELPERS)
        return bl_err_set(err, BL_EINVAL, "row pool: %d helper threads (0..%d)", n_helpers, SPOOL_MAX_HELPERS);
    rt_spool_t *p = calloc(1, sizeof *p);
    if (!p)
        return bl_err_set(err, BL_ENOMEM, "row pool: out of memory");
    if (pthread_mutex_init(&p->mu, NULL)) {
        free(p);
        return bl_err_set(err, BL_ENOMEM, "row pool: no mutex");
    }
    if (pthread_cond_init(&p->go, NULL) || pthread_cond_init(&p->done, NULL)) {
        pthread_mutex_destroy(&p->mu);
        free(p);
        return bl_err_set(err, BL_ENOMEM, "row pool: no condition variable");
    }
    for (int i = 0; i < n_helpers; i++) {
        if (pthread_create(&p->th[i], NULL, helper_main, p)) {
            rt_spool_destroy(p);
            return bl_err_set(err, BL_ENOMEM, "row pool: cannot start helper thread %d", i);
        }
        p->n_helpers++;
    }
    *out = p;
    return 0;
}

void rt_spool_destroy(rt_spool_t *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_helpers; i++)
        pthread_join(p->th[i], NULL);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int rt_spool_helpers(const rt_spool_t *p) { return p ? p->n_helpers : 0; }

void rt_spool_run(rt_spool_t *p, int n, rt_spool_fn fn, void *ctx)
{
    if (n < 2 || !p || p->n_helpers == 0) {
        for (int i = 0; i < n; i++)
            fn(ctx, i);
        return;
    }
    pthread_mutex_lock(&p->mu);
    while (p->active > 0) /* a helper that woke late for the last run */
        pthread_cond_wait(&p->done, &p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n = n;
    atomic_store(&p->next, 0);
    atomic_store(&p->left, n);
    p->gen++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    const int done = take_rows(p, fn, ctx, n);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_sub(&p->left, done);
    while (atomic_load(&p->left) > 0 || p->active > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

int rt_spool_default_helpers(int n_slots, int n_cpus)
{
    int h = n_cpus / 2 - 1;
    if (h > n_slots - 1)
        h = n_slots - 1;
    if (h > 7)
        h = 7;
    return h > 0 ? h : 0;
}
