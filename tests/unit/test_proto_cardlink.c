/* Tests of proto/cardlink.c, the card-to-card protocol between two stages, with
 * plain shared memory standing in for the card buffers: a fake card whose get only
 * notes the copy and whose settle makes it (a card's copy is asynchronous), and
 * which counts every put into a buffer a get still reads. Two processes run 300
 * pipelined steps with random row counts, error messages between them and a
 * receiver that falls behind; then, in one process, the sender waits for the
 * release of the buffer it reuses and not for the other, a release settles first
 * and keeps the message when settling fails, a failed put leaves the buffer free,
 * and the refusals. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cardlink.h"
#include "test_seed.h"

enum { N_BATCH = 16, N_EMBD = 8, BUF_FLOATS = N_BATCH * N_EMBD, STEPS = 300 };

static const bp_step_limits_t g_lim = {
    .n_slots = 4, .n_batch = N_BATCH, .n_ctx = 4096, .n_out_max = 4, .n_embd = N_EMBD, .n_vocab = 100,
    .n_layer = 3, .card_bufs = BP_CARD_BUFS,
};

/* The fake card: BP_CARD_BUFS buffers in memory both processes map. reading[k] is
 * set by a get and cleared once its copy is made (settle); a put into a buffer
 * being read is counted in overwrites. */
typedef struct fake_card {
    float buf[BP_CARD_BUFS][BUF_FLOATS];
    _Atomic int reading[BP_CARD_BUFS];
    _Atomic int overwrites;
} fake_card_t;

/* One side's view: the shared card, its own rows (the stage's input or output), the
 * get waiting for its copy, and failures to inject. */
typedef struct side {
    fake_card_t *card;
    float x[BUF_FLOATS];
    int pending_k;          /* -1: none */
    size_t pending_bytes;
    int settles;
    int fail_put, fail_settle;
} side_t;

static int fake_put(void *ctx, int k, size_t nbytes, bl_err_t *err)
{
    side_t *s = ctx;
    if (s->fail_put)
        return bl_err_set(err, BL_EIO, "fake put failed");
    if (atomic_load(&s->card->reading[k]))
        atomic_fetch_add(&s->card->overwrites, 1);
    memcpy(s->card->buf[k], s->x, nbytes);
    return 0;
}

static int fake_get(void *ctx, int k, size_t nbytes, bl_err_t *err)
{
    (void)err;
    side_t *s = ctx;
    atomic_store(&s->card->reading[k], 1);
    s->pending_k = k;
    s->pending_bytes = nbytes;
    return 0;
}

static int fake_settle(void *ctx, bl_err_t *err)
{
    side_t *s = ctx;
    s->settles++;
    if (s->fail_settle)
        return bl_err_set(err, BL_EIO, "fake settle failed");
    if (s->pending_k >= 0) {
        memcpy(s->x, s->card->buf[s->pending_k], s->pending_bytes);
        atomic_store(&s->card->reading[s->pending_k], 0);
        s->pending_k = -1;
    }
    return 0;
}

static const bp_cardlink_ops_t g_send_ops = {.put = fake_put};
static const bp_cardlink_ops_t g_recv_ops = {.get = fake_get, .settle = fake_settle};

static fake_card_t *card_map(void)
{
    void *p = mmap(NULL, sizeof(fake_card_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(p != MAP_FAILED);
    memset(p, 0, sizeof(fake_card_t));
    return p;
}

/* Row values of step `step`: a function of the step and the place, so a row of
 * another step (a buffer written too early) shows. */
static float value(uint64_t step, int i)
{
    return (float)(step * 1000u + (uint64_t)i);
}

static void ring_pair(bp_ring_t **prod, bp_ring_t **cons)
{
    bl_err_t err = {0};
    /* room for many small messages: the buffers, not the ring, hold the sender back */
    assert_int_equal(bp_ring_create(prod, "card", 1 << 16, BP_RING_PRODUCER, &err), 0);
    assert_int_equal(bp_ring_attach_fd(cons, bp_ring_fd(*prod), "card", BP_RING_CONSUMER, &err), 0);
}

/* Sends step `step` of n rows through the link (the stage "ran": x holds the rows). */
static int send_step(bp_cardlink_t *l, side_t *s, uint64_t step, int32_t n, int64_t timeout_us, bl_err_t *err)
{
    bp_step_hdr_t h = {.kind = BP_STEP_HIDDEN, .step = step, .n_seqs = 1, .n_rows = n, .width = N_EMBD};
    bp_step_out_t o;
    int rc = bp_cardlink_reserve(l, &h, &o, timeout_us, err);
    if (rc)
        return rc;
    assert_null(o.rows);
    o.seqs[0] = (bp_step_seq_t){.slot = (int32_t)(step % 4), .n = n, .pos = (int64_t)(step % 2048), .n_out = 1};
    for (int i = 0; i < n; i++)
        o.tokens[i] = (int32_t)((step + (uint64_t)i) % 7);
    for (int i = 0; i < n * N_EMBD; i++)
        s->x[i] = value(step, i);
    return bp_cardlink_commit(l, &o, err);
}

/* The receiver of the two-process test: reads STEPS messages, copies each card
 * message's rows through the fake card, sometimes late, and checks them; exits
 * with the number of failed checks. */
static int receiver(bp_ring_t *cons, fake_card_t *card)
{
    side_t s = {.card = card, .pending_k = -1};
    bp_cardlink_t *l = NULL;
    bl_err_t err = {0};
    if (bp_cardlink_create(&l, cons, BP_CARD_BUFS, sizeof s.x, &g_recv_ops, &s, &err) != 0)
        return 100;
    rng_t r = rng_for(2);
    static bp_step_seq_t seqs[4];
    static int32_t toks[N_BATCH];
    int bad = 0, expect_k = 0;
    for (uint64_t step = 1; step <= STEPS; step++) {
        const void *msg;
        size_t n;
        if (bp_ring_peek(cons, &msg, &n, 10 * 1000 * 1000, &err) != 0)
            return 101;
        bp_step_in_t in = {.seqs = seqs, .ids = toks};
        if (bp_step_parse(msg, n, &g_lim, BP_STEP_HIDDEN, step, &in, &err) != 0)
            return 102;
        if (in.hdr.kind == BP_STEP_HIDDEN) {
            bad += (int)in.hdr.card != expect_k + 1; /* round robin over the buffers */
            expect_k = (expect_k + 1) % BP_CARD_BUFS;
            if (bp_cardlink_get(l, &in, &err) != 0)
                return 103;
            /* falls behind now and then: the sender must wait, not overwrite */
            if (rng_next(&r) % 4 == 0)
                usleep((useconds_t)(rng_next(&r) % 2000));
        }
        if (bp_cardlink_release(l, &err) != 0)
            return 104;
        if (in.hdr.kind == BP_STEP_HIDDEN)
            for (int i = 0; i < in.hdr.n_rows * N_EMBD; i++)
                bad += s.x[i] != value(step, i);
    }
    bp_cardlink_destroy(l);
    return bad > 99 ? 99 : bad;
}

static void test_cardlink_pipelined_steps_two_processes(void **state)
{
    (void)state;
    bp_ring_t *prod, *cons;
    ring_pair(&prod, &cons);
    fake_card_t *card = card_map();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) /* the producer's handle stays untouched: destroying it would close the ring */
        _exit(receiver(cons, card));
    side_t s = {.card = card, .pending_k = -1};
    bp_cardlink_t *l = NULL;
    bl_err_t err = {0};
    assert_int_equal(bp_cardlink_create(&l, prod, BP_CARD_BUFS, sizeof s.x, &g_send_ops, &s, &err), 0);
    rng_t r = rng_for(1);
    int waits = 0;
    for (uint64_t step = 1; step <= STEPS; step++) {
        if (step % 10 == 0) { /* a stage that failed sends an error in the rows' place */
            assert_int_equal(bp_step_push_error(prod, step, BL_EIO, "stage failed", 1000000, &err), 0);
            continue;
        }
        const int32_t n = 1 + (int32_t)(rng_next(&r) % N_BATCH);
        int rc;
        /* a receiver that died would leave the sender waiting: 10 s is far past any lag */
        while ((rc = send_step(l, &s, step, n, 200, &err)) == BL_ETIMEDOUT && waits < 50000)
            waits++;
        if (rc)
            fail_msg("step %llu: %s", (unsigned long long)step, err.msg);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    print_message("# %d steps, the sender waited %d times for a buffer to come back\n", STEPS, waits);
    assert_int_equal(atomic_load(&card->overwrites), 0);
    bp_cardlink_destroy(l);
    bp_ring_destroy(prod);
    bp_ring_destroy(cons);
    munmap(card, sizeof *card);
}

/* Both ends of a link in this process: the ring, the fake card, each side's view,
 * and a sending and a receiving link of n_bufs buffers of N_BATCH rows. */
typedef struct ends {
    bp_ring_t *prod, *cons;
    fake_card_t *card;
    side_t snd, rcv;
    bp_cardlink_t *ls, *lr;
} ends_t;

static void ends_open(ends_t *e, int n_bufs)
{
    bl_err_t err = {0};
    ring_pair(&e->prod, &e->cons);
    e->card = card_map();
    e->snd = e->rcv = (side_t){.card = e->card, .pending_k = -1};
    assert_int_equal(bp_cardlink_create(&e->ls, e->prod, n_bufs, sizeof e->snd.x, &g_send_ops, &e->snd, &err), 0);
    assert_int_equal(bp_cardlink_create(&e->lr, e->cons, n_bufs, sizeof e->rcv.x, &g_recv_ops, &e->rcv, &err), 0);
}

static void ends_close(ends_t *e)
{
    assert_int_equal(atomic_load(&e->card->overwrites), 0);
    bp_cardlink_destroy(e->ls);
    bp_cardlink_destroy(e->lr);
    bp_ring_destroy(e->prod);
    bp_ring_destroy(e->cons);
    munmap(e->card, sizeof *e->card);
}

/* Peeks the next message at the receiver and parses it against lim: step `step`
 * naming card buffer `card` (0: none), into in. */
static void recv_next(ends_t *e, const bp_step_limits_t *lim, uint64_t step, uint32_t card, bp_step_in_t *in)
{
    static bp_step_seq_t seqs[4];
    static int32_t toks[N_BATCH];
    const void *msg;
    size_t n;
    bl_err_t err = {0};
    *in = (bp_step_in_t){.seqs = seqs, .ids = toks};
    assert_int_equal(bp_ring_peek(e->cons, &msg, &n, 0, &err), 0);
    assert_int_equal(bp_step_parse(msg, n, lim, BP_STEP_HIDDEN, step, in, &err), 0);
    assert_int_equal(in->hdr.card, card);
}

static void test_cardlink_sender_waits_for_the_buffer_it_reuses(void **state)
{
    (void)state;
    ends_t e;
    ends_open(&e, 2);
    bl_err_t err = {0};
    bp_step_in_t in;
    /* two steps in flight take both buffers; the third waits for the first's release */
    assert_int_equal(send_step(e.ls, &e.snd, 1, 3, 0, &err), 0);
    assert_int_equal(send_step(e.ls, &e.snd, 2, 5, 0, &err), 0);
    assert_int_equal(send_step(e.ls, &e.snd, 3, 2, 0, &err), BL_EAGAIN);
    recv_next(&e, &g_lim, 1, 1, &in);
    assert_int_equal(bp_cardlink_get(e.lr, &in, &err), 0);
    /* read but not released: still not back */
    assert_int_equal(send_step(e.ls, &e.snd, 3, 2, 0, &err), BL_EAGAIN);
    assert_int_equal(e.rcv.settles, 0);
    assert_int_equal(bp_cardlink_release(e.lr, &err), 0);
    assert_int_equal(e.rcv.settles, 1);
    assert_true(e.rcv.x[3 * N_EMBD - 1] == value(1, 3 * N_EMBD - 1));
    /* buffer 0 is back, buffer 1 (step 2) is not: step 3 takes 0, step 4 waits */
    assert_int_equal(send_step(e.ls, &e.snd, 3, 2, 0, &err), 0);
    assert_int_equal(send_step(e.ls, &e.snd, 4, 2, 0, &err), BL_EAGAIN);
    recv_next(&e, &g_lim, 2, 2, &in);
    assert_int_equal(bp_cardlink_get(e.lr, &in, &err), 0);
    assert_int_equal(bp_cardlink_release(e.lr, &err), 0);
    assert_true(e.rcv.x[5 * N_EMBD - 1] == value(2, 5 * N_EMBD - 1));
    assert_int_equal(send_step(e.ls, &e.snd, 4, 2, 0, &err), 0);
    recv_next(&e, &g_lim, 3, 1, &in);
    assert_int_equal(bp_cardlink_get(e.lr, &in, &err), 0);
    assert_int_equal(bp_cardlink_release(e.lr, &err), 0);
    assert_int_equal(bp_step_push_error(e.prod, 9, BL_EIO, "x", 0, &err), 0);
    recv_next(&e, &g_lim, 4, 2, &in);
    assert_int_equal(bp_cardlink_get(e.lr, &in, &err), 0);
    assert_int_equal(bp_cardlink_release(e.lr, &err), 0);
    /* a message without a card buffer is released without a settle */
    const int settled = e.rcv.settles;
    const void *msg;
    size_t n;
    assert_int_equal(bp_ring_peek(e.cons, &msg, &n, 0, &err), 0); /* the error */
    assert_int_equal(bp_cardlink_release(e.lr, &err), 0);
    assert_int_equal(e.rcv.settles, settled);
    ends_close(&e);
}

static void test_cardlink_failed_settle_keeps_the_message(void **state)
{
    (void)state;
    ends_t e;
    ends_open(&e, 1);
    e.rcv.fail_settle = 1;
    bl_err_t err = {0};
    bp_step_in_t in;
    const bp_step_limits_t one = {.n_slots = 4, .n_batch = N_BATCH, .n_ctx = 4096, .n_embd = N_EMBD,
                                  .n_vocab = 100, .n_layer = 3, .card_bufs = 1};
    assert_int_equal(send_step(e.ls, &e.snd, 1, 4, 0, &err), 0);
    recv_next(&e, &one, 1, 1, &in);
    assert_int_equal(bp_cardlink_get(e.lr, &in, &err), 0);
    assert_int_equal(bp_cardlink_release(e.lr, &err), BL_EIO);
    /* the copy may still read the buffer: the message stays, the sender waits */
    assert_int_equal(send_step(e.ls, &e.snd, 2, 4, 0, &err), BL_EAGAIN);
    e.rcv.fail_settle = 0;
    assert_int_equal(bp_cardlink_release(e.lr, &err), BL_EIO); /* broken for good */
    assert_non_null(strstr(err.msg, "card buffer"));
    assert_int_equal(send_step(e.ls, &e.snd, 2, 4, 0, &err), BL_EAGAIN);
    ends_close(&e);
}

static void test_cardlink_failed_put_leaves_the_buffer_free(void **state)
{
    (void)state;
    ends_t e;
    ends_open(&e, 2);
    e.snd.fail_put = 1;
    bl_err_t err = {0};
    bp_step_in_t in;
    assert_int_equal(send_step(e.ls, &e.snd, 1, 4, 0, &err), BL_EIO);
    assert_int_equal(bp_ring_produced(e.prod), 0); /* nothing committed */
    /* the error goes out in its place; the next step takes the same buffer */
    assert_int_equal(bp_step_push_error(e.prod, 1, BL_EIO, "put failed", 0, &err), 0);
    e.snd.fail_put = 0;
    assert_int_equal(send_step(e.ls, &e.snd, 2, 4, 0, &err), 0);
    const void *msg;
    size_t n;
    assert_int_equal(bp_ring_peek(e.cons, &msg, &n, 0, &err), 0);
    bp_ring_release(e.cons);
    recv_next(&e, &g_lim, 2, 1, &in);
    ends_close(&e);
}

static void test_cardlink_refusals(void **state)
{
    (void)state;
    ends_t e;
    ends_open(&e, 2);
    side_t *s = &e.snd;
    bp_cardlink_t *l = NULL;
    bl_err_t err = {0};
    assert_int_equal(bp_cardlink_create(&l, e.prod, 0, 64, &g_send_ops, s, &err), BL_EINVAL);
    assert_int_equal(bp_cardlink_create(&l, e.prod, BP_CARD_MAX_BUFS + 1, 64, &g_send_ops, s, &err), BL_EINVAL);
    assert_int_equal(bp_cardlink_create(&l, e.prod, 2, 0, &g_send_ops, s, &err), BL_EINVAL);
    assert_int_equal(bp_cardlink_create(&l, e.prod, 2, 64, &(bp_cardlink_ops_t){.get = fake_get}, s, &err),
                     BL_EINVAL);
    assert_null(l);
    /* a sender whose buffers hold 2 rows */
    assert_int_equal(bp_cardlink_create(&l, e.prod, 2, 2 * N_EMBD * sizeof(float), &g_send_ops, s, &err), 0);
    bp_step_out_t o;
    bp_step_hdr_t h = {.kind = BP_STEP_LOGITS, .n_rows = 1, .width = N_EMBD};
    assert_int_equal(bp_cardlink_reserve(l, &h, &o, 0, &err), BL_EINVAL);
    h = (bp_step_hdr_t){.kind = BP_STEP_HIDDEN, .n_seqs = 1, .n_rows = 3, .width = N_EMBD};
    assert_int_equal(bp_cardlink_reserve(l, &h, &o, 0, &err), BL_EINVAL);
    assert_int_equal(bp_cardlink_commit(l, &o, &err), BL_EINVAL); /* nothing reserved */
    assert_int_equal(bp_cardlink_get(l, &(bp_step_in_t){.hdr = {.kind = BP_STEP_HIDDEN, .card = 1}}, &err),
                     BL_EINVAL);
    bp_cardlink_destroy(l);
    /* a receiver whose buffers hold 2 rows: an index past its buffers, rows past a
     * buffer, no card named, a reserve */
    assert_int_equal(bp_cardlink_create(&l, e.cons, 2, 2 * N_EMBD * sizeof(float), &g_recv_ops, s, &err), 0);
    bp_step_in_t in = {.hdr = {.kind = BP_STEP_HIDDEN, .n_rows = 1, .width = N_EMBD, .card = 3}};
    assert_int_equal(bp_cardlink_get(l, &in, &err), BL_EINVAL);
    in.hdr.card = 0;
    assert_int_equal(bp_cardlink_get(l, &in, &err), BL_EINVAL);
    in.hdr.card = 2;
    in.hdr.n_rows = 3;
    assert_int_equal(bp_cardlink_get(l, &in, &err), BL_EPROTO);
    assert_int_equal(bp_cardlink_reserve(l, &h, &o, 0, &err), BL_EINVAL);
    bp_cardlink_destroy(l);
    bp_cardlink_destroy(NULL);
    ends_close(&e);
}

int main(void)
{
    test_seed_init("test_proto_cardlink");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cardlink_pipelined_steps_two_processes),
        cmocka_unit_test(test_cardlink_sender_waits_for_the_buffer_it_reuses),
        cmocka_unit_test(test_cardlink_failed_settle_keeps_the_message),
        cmocka_unit_test(test_cardlink_failed_put_leaves_the_buffer_free),
        cmocka_unit_test(test_cardlink_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
