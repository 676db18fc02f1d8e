/* Tests of router/prep.c: jobs run off the loop thread, in order, one at a time;
 * done runs on the loop thread once per job; destroy cancels what never ran. */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "prep.h"

#define N_JOBS 64

typedef struct rec {
    pthread_t loop_thread;
    int order[N_JOBS], n_worked;  /* written by the preparer's thread */
    int done[N_JOBS], cancelled[N_JOBS], n_done;
    int off_loop[N_JOBS];
    pthread_mutex_t gate;         /* job 0 holds here while the gate is locked */
    _Atomic int started;          /* job 0 is running */
} rec_t;

typedef struct job {
    rec_t *rec;
    int id;
} job_t;

static void work(void *ud, rt_tokenizer_t *tok)
{
    (void)tok;
    job_t *j = ud;
    if (j->id == 0) {
        j->rec->started = 1;
        pthread_mutex_lock(&j->rec->gate);
        pthread_mutex_unlock(&j->rec->gate);
    }
    j->rec->off_loop[j->id] = !pthread_equal(pthread_self(), j->rec->loop_thread);
    j->rec->order[j->rec->n_worked++] = j->id;
}

static void done(void *ud, int cancelled)
{
    job_t *j = ud;
    assert_true(pthread_equal(pthread_self(), j->rec->loop_thread));
    j->rec->done[j->id]++;
    j->rec->cancelled[j->id] = cancelled;
    j->rec->n_done++;
}

static void setup(rec_t *rec, job_t *jobs)
{
    *rec = (rec_t){.loop_thread = pthread_self()};
    pthread_mutex_init(&rec->gate, NULL);
    for (int i = 0; i < N_JOBS; i++)
        jobs[i] = (job_t){rec, i};
}

static void test_prep_runs_jobs_in_order_off_the_loop(void **state)
{
    (void)state;
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    rt_prep_t *p = NULL;
    bl_err_t err = {0};
    assert_int_equal(rt_prep_create(&p, &loop, NULL, &err), 0);
    rec_t rec;
    job_t jobs[N_JOBS];
    setup(&rec, jobs);
    for (int i = 0; i < N_JOBS; i++)
        assert_int_equal(rt_prep_submit(p, work, done, &jobs[i]), 0);
    assert_int_equal(rt_prep_pending(p), N_JOBS);
    while (rec.n_done < N_JOBS)
        uv_run(&loop, UV_RUN_ONCE);
    assert_int_equal(rt_prep_pending(p), 0);
    for (int i = 0; i < N_JOBS; i++) {
        assert_int_equal(rec.order[i], i);
        assert_int_equal(rec.done[i], 1);
        assert_int_equal(rec.cancelled[i], 0);
        assert_true(rec.off_loop[i]);
    }
    rt_prep_destroy(p);
    uv_run(&loop, UV_RUN_DEFAULT); /* closes the wake-up handle */
    assert_int_equal(uv_loop_close(&loop), 0);
}

static void test_prep_destroy_cancels_what_never_ran(void **state)
{
    (void)state;
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    rt_prep_t *p = NULL;
    bl_err_t err = {0};
    assert_int_equal(rt_prep_create(&p, &loop, NULL, &err), 0);
    rec_t rec;
    job_t jobs[N_JOBS];
    setup(&rec, jobs);
    pthread_mutex_lock(&rec.gate); /* job 0 waits: the rest stay queued */
    for (int i = 0; i < 8; i++)
        assert_int_equal(rt_prep_submit(p, work, done, &jobs[i]), 0);
    while (!rec.started)
        sched_yield();
    pthread_mutex_unlock(&rec.gate);
    /* no loop turn: destroy finishes the running job 0 (maybe more), then cancels the
     * rest; each job's done runs once, in order */
    rt_prep_destroy(p);
    assert_int_equal(rec.n_done, 8);
    for (int i = 0; i < 8; i++) {
        assert_int_equal(rec.done[i], 1);
        assert_int_equal(rec.cancelled[i], i >= rec.n_worked);
    }
    assert_true(rec.n_worked >= 1);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prep_runs_jobs_in_order_off_the_loop),
        cmocka_unit_test(test_prep_destroy_cancels_what_never_ran),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
