/* The prompt preparer (prep.h): a job queue, one thread that runs the work, and a
 * uv_async that hands finished jobs back to the loop.
 *
 * Threads: `queue`, `done` and `stop` are shared and guarded by `mu`; the thread
 * waits on `cv` for work. Everything else belongs to the loop thread. */
#include "prep.h"

#include <pthread.h>
#include <stdlib.h>

#include "log.h"

typedef struct job {
    rt_prep_work_fn work;
    rt_prep_done_fn done;
    void *ud;
    int ran;
    struct job *next;
} job_t;

struct rt_prep {
    uv_loop_t *loop;
    uv_async_t async;
    int async_open;
    rt_tokenizer_t *tok;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    job_t *queue, **queue_tail; /* waiting for the thread (guarded by mu) */
    job_t *done, **done_tail;   /* worked, waiting for the loop (guarded by mu) */
    int stop;                   /* guarded by mu */
    size_t pending;             /* loop thread: submitted and not yet handed back */
};

static void *prep_main(void *arg)
{
    rt_prep_t *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->queue && !p->stop)
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop)
            break;
        job_t *j = p->queue;
        p->queue = j->next;
        if (!p->queue)
            p->queue_tail = &p->queue;
        pthread_mutex_unlock(&p->mu);
        j->work(j->ud, p->tok);
        j->ran = 1;
        j->next = NULL;
        pthread_mutex_lock(&p->mu);
        *p->done_tail = j;
        p->done_tail = &j->next;
        uv_async_send(&p->async); /* safe from any thread */
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Hands the finished jobs to their done callbacks (loop thread). */
static void on_async(uv_async_t *a)
{
    rt_prep_t *p = a->data;
    pthread_mutex_lock(&p->mu);
    job_t *list = p->done;
    p->done = NULL;
    p->done_tail = &p->done;
    pthread_mutex_unlock(&p->mu);
    while (list) {
        job_t *j = list;
        list = j->next;
        p->pending--;
        j->done(j->ud, 0);
        free(j);
    }
}

int rt_prep_create(rt_prep_t **out, uv_loop_t *loop, rt_tokenizer_t *tok, bl_err_t *err)
{
    *out = NULL;
    rt_prep_t *p = calloc(1, sizeof *p);
    if (!p) {
        rt_tokenizer_destroy(tok);
        return bl_err_set(err, BL_ENOMEM, "prep: out of memory");
    }
    p->loop = loop;
    p->tok = tok;
    p->queue_tail = &p->queue;
    p->done_tail = &p->done;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    if (uv_async_init(loop, &p->async, on_async) != 0) {
        rt_prep_destroy(p);
        return bl_err_set(err, BL_EIO, "prep: cannot create the loop's wake-up handle");
    }
    p->async.data = p;
    p->async_open = 1;
    if (pthread_create(&p->thread, NULL, prep_main, p) != 0) {
        rt_prep_destroy(p);
        return bl_err_set(err, BL_EIO, "prep: cannot start the thread");
    }
    p->thread_started = 1;
    *out = p;
    return 0;
}

int rt_prep_submit(rt_prep_t *p, rt_prep_work_fn work, rt_prep_done_fn done, void *ud)
{
    job_t *j = calloc(1, sizeof *j);
    if (!j)
        return BL_ENOMEM;
    j->work = work;
    j->done = done;
    j->ud = ud;
    p->pending++;
    pthread_mutex_lock(&p->mu);
    *p->queue_tail = j;
    p->queue_tail = &j->next;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

size_t rt_prep_pending(const rt_prep_t *p)
{
    return p->pending;
}

static void async_closed(uv_handle_t *h)
{
    free(h->data);
}

void rt_prep_destroy(rt_prep_t *p)
{
    if (!p)
        return;
    if (p->thread_started) {
        pthread_mutex_lock(&p->mu);
        p->stop = 1;
        pthread_cond_signal(&p->cv);
        pthread_mutex_unlock(&p->mu);
        pthread_join(p->thread, NULL);
    }
    /* what worked first, in order, then what never ran */
    job_t *lists[2] = {p->done, p->queue};
    p->done = p->queue = NULL;
    for (int k = 0; k < 2; k++) {
        while (lists[k]) {
            job_t *j = lists[k];
            lists[k] = j->next;
            p->pending--;
            j->done(j->ud, !j->ran);
            free(j);
        }
    }
    rt_tokenizer_destroy(p->tok);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    if (p->async_open) /* the handle lives in p: freed once the loop has closed it */
        uv_close((uv_handle_t *)&p->async, async_closed);
    else
        free(p);
}
