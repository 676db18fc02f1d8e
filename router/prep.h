/* The prompt preparer: one thread that does the slow, pure part of a request off the
 * router's loop, so that a huge body (megabytes of prompt to template and tokenize)
 * stalls neither /health nor the streams of other slots. It owns a tokenizer of its
 * own (a tokenizer's scratch is single-threaded; the loop keeps app->tok). Jobs run
 * one at a time, in the order they came; each job's done callback runs on the loop
 * thread afterwards.
 *
 * Threads: create, submit and destroy on the loop thread; work functions on the
 * preparer's thread, where they may read what the loop does not change while a job
 * is out (the request's JSON, the app's template and settings) and use the tokenizer
 * they are given. */
#ifndef RT_PREP_H
#define RT_PREP_H

#include <uv.h>

#include "err.h"
#include "tokenizer.h"

typedef struct rt_prep rt_prep_t;

/* The preparer's thread: the job's work, with the preparer's tokenizer. */
typedef void (*rt_prep_work_fn)(void *ud, rt_tokenizer_t *tok);
/* The loop thread, once per job: after its work (cancelled 0), or without it when
 * the preparer is destroyed first (cancelled 1). */
typedef void (*rt_prep_done_fn)(void *ud, int cancelled);

/* Starts the thread. tok becomes the preparer's (destroyed with it, also on
 * failure). BL_ENOMEM, BL_EIO (no thread). */
int rt_prep_create(rt_prep_t **out, uv_loop_t *loop, rt_tokenizer_t *tok, bl_err_t *err) BL_WUR;
/* Queues a job. BL_ENOMEM (nothing queued: the caller answers). */
int rt_prep_submit(rt_prep_t *p, rt_prep_work_fn work, rt_prep_done_fn done, void *ud) BL_WUR;
/* Jobs queued or running. */
size_t rt_prep_pending(const rt_prep_t *p);
/* Finishes the running job, stops the thread, calls done for every job (cancelled for
 * those whose work never ran) and frees p. */
void rt_prep_destroy(rt_prep_t *p);

#endif
