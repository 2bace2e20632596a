/*
 * test_sequence_table.c - unit tests of the live-sequence table
 * (src/sched/sequence_table.c) on a virtual clock: a sequence starts from
 * its initial state, its steps run one at a time in arrival order, it is
 * freed on sequence_end or after its idle timeout, a step on a sequence that
 * is not live is refused with the id and the reason in the message, a
 * sequence_start on a live sequence starts it over, and the limit on live
 * sequences holds: a new sequence in a full table evicts the least recently
 * used one idle longer than the floor (whose next step is told so, with how
 * long it was idle), and is refused while every sequence is fresher. Per
 * client: live sequences are counted to the client that started them; a
 * client at its cap evicts its own least recently used idle sequence,
 * never another's, and is refused RESOURCE_EXHAUSTED naming the cap while
 * its own are all fresher than the floor; other clients start sequences
 * meanwhile; the counts follow ends, expiry and evictions.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "sched/sequence_table.h"

#define MS 1000000u

static pjs_sequence_id int_id(uint64_t n)
{
    pjs_sequence_id id = {.is_string = false, .number = n};
    return id;
}

static pjs_sequence_id str_id(const char *s)
{
    pjs_sequence_id id = {.is_string = true};
    snprintf(id.string, sizeof id.string, "%s", s);
    return id;
}

static pjs_sequence_step step_of(pjs_sequence_id id, bool start, bool end)
{
    pjs_sequence_step st = {.id = id, .start = start, .end = end};
    return st;
}

/* An accumulator's step: state += x, as the model would. */
static float run_step(pjs_sequence_step *st, float x)
{
    float *state = pjs_sequence_state(st);
    *state += x;
    return *state;
}

/* Idle timeout 100 ms, eviction floor 20 ms, one client may take every slot. */
static pjs_sequence_table *capped_table(size_t max_sequences, size_t max_per_client)
{
    float initial = 0.0f;
    pjs_sequence_table *t = pjs_sequence_table_create("acc", sizeof(float), &initial, 100 * MS,
                                                      max_sequences, max_per_client, 20 * MS);
    assert_non_null(t);
    return t;
}

static pjs_sequence_table *accumulator_table(size_t max_sequences)
{
    return capped_table(max_sequences, max_sequences);
}

/* Admits st, which must evict nothing. */
static void admit_ok(pjs_sequence_table *t, pjs_sequence_step *st, uint64_t now, bool run_now)
{
    pjs_error err = {0};
    bool runs = false;
    pjs_sequence_eviction evicted = {.happened = true};
    assert_int_equal(pjs_sequence_admit(t, st, now, &runs, &evicted, &err), 0);
    assert_int_equal(runs, run_now);
    assert_false(evicted.happened);
}

/* Admits st (which runs at once), evicting `victim` idle for idle_ns. */
static void admit_evicts(pjs_sequence_table *t, pjs_sequence_step *st, uint64_t now,
                         pjs_sequence_id victim, uint64_t idle_ns)
{
    pjs_error err = {0};
    bool runs = false;
    pjs_sequence_eviction evicted = {0};
    assert_int_equal(pjs_sequence_admit(t, st, now, &runs, &evicted, &err), 0);
    assert_true(runs);
    assert_true(evicted.happened);
    assert_true(pjs_sequence_id_equal(&evicted.id, &victim));
    assert_int_equal(evicted.idle_ns, idle_ns);
}

/* Starts id at start_ns and finishes its step at finish_ns. */
static void one_step(pjs_sequence_table *t, pjs_sequence_id id, bool start, uint64_t start_ns,
                     uint64_t finish_ns)
{
    pjs_sequence_step st = step_of(id, start, false);
    admit_ok(t, &st, start_ns, true);
    run_step(&st, 1.0f);
    assert_null(pjs_sequence_finish(t, &st, finish_ns));
}

/* one_step from `client`. */
static void client_step(pjs_sequence_table *t, const char *client, pjs_sequence_id id, bool start,
                        bool end, uint64_t start_ns, uint64_t finish_ns)
{
    pjs_sequence_step st = step_of(id, start, end);
    st.client = client;
    admit_ok(t, &st, start_ns, true);
    run_step(&st, 1.0f);
    assert_null(pjs_sequence_finish(t, &st, finish_ns));
}

static void admit_fails(pjs_sequence_table *t, pjs_sequence_step *st, uint64_t now,
                        pjs_status code, const char *words)
{
    pjs_error err = {0};
    bool runs = true;
    assert_int_not_equal(pjs_sequence_admit(t, st, now, &runs, NULL, &err), 0);
    assert_false(runs);
    assert_int_equal(err.code, code);
    if (strstr(err.msg, words) == NULL)
        fail_msg("message \"%s\" lacks \"%s\"", err.msg, words);
}

static void test_interleaved_sequences_keep_their_own_state(void **unused)
{
    (void)unused;
    pjs_sequence_table *t = accumulator_table(8);
    pjs_sequence_step a1 = step_of(int_id(7), true, false);
    pjs_sequence_step b1 = step_of(str_id("abc"), true, false);
    admit_ok(t, &a1, 0, true);
    admit_ok(t, &b1, 0, true);
    assert_true(run_step(&a1, 1.0f) == 1.0f);
    assert_true(run_step(&b1, 10.0f) == 10.0f);
    assert_null(pjs_sequence_finish(t, &a1, 1));
    assert_null(pjs_sequence_finish(t, &b1, 1));
    pjs_sequence_step a2 = step_of(int_id(7), false, false);
    pjs_sequence_step b2 = step_of(str_id("abc"), false, true);
    admit_ok(t, &a2, 2, true);
    admit_ok(t, &b2, 2, true);
    assert_true(run_step(&a2, 2.0f) == 3.0f);
    assert_true(run_step(&b2, 5.0f) == 15.0f);
    assert_int_equal(pjs_sequence_count(t), 2);
    assert_null(pjs_sequence_finish(t, &b2, 3));
    assert_int_equal(pjs_sequence_count(t), 1); /* "abc" ended */
    assert_null(pjs_sequence_finish(t, &a2, 3));
    pjs_sequence_table_destroy(t);
}

static void test_integer_and_string_ids_differ(void **unused)
{
    (void)unused;
    pjs_sequence_table *t = accumulator_table(8);
    pjs_sequence_step n = step_of(int_id(42), true, false);
    admit_ok(t, &n, 0, true);
    pjs_sequence_finish(t, &n, 0);
    pjs_sequence_step s = step_of(str_id("42"), false, false);
    admit_fails(t, &s, 0, PJS_ERR_INVALID_ARGUMENT, "sequence \"42\" is not active");
    pjs_sequence_table_destroy(t);
}

static void test_steps_of_one_sequence_run_in_order(void **unused)
{
    (void)unused;
    pjs_sequence_table *t = accumulator_table(8);
    pjs_sequence_step s1 = step_of(int_id(1), true, false);
    pjs_sequence_step s2 = step_of(int_id(1), false, false);
    pjs_sequence_step s3 = step_of(int_id(1), false, true);
    admit_ok(t, &s1, 0, true);
    admit_ok(t, &s2, 0, false); /* s1 still runs */
    admit_ok(t, &s3, 0, false);
    assert_true(run_step(&s1, 1.0f) == 1.0f);
    assert_ptr_equal(pjs_sequence_finish(t, &s1, 1), &s2);
    assert_true(run_step(&s2, 2.0f) == 3.0f);
    assert_ptr_equal(pjs_sequence_finish(t, &s2, 2), &s3);
    assert_true(run_step(&s3, 3.0f) == 6.0f);
    assert_null(pjs_sequence_finish(t, &s3, 3));
    assert_int_equal(pjs_sequence_count(t), 0);
    pjs_sequence_table_destroy(t);
}

static void test_unknown_and_ended_sequences_are_refused(void **unused)
{
    (void)unused;
    pjs_sequence_table *t = accumulator_table(8);
    pjs_sequence_step never = step_of(int_id(99), false, false);
    admit_fails(t, &never, 0, PJS_ERR_INVALID_ARGUMENT,
                "model acc: sequence 99 is not active (no sequence with this id is live)");
    pjs_sequence_step only = step_of(int_id(5), true, true);
    admit_ok(t, &only, 0, true);
    /* Admitted behind a step that ends the sequence: refused at once. */
    pjs_sequence_step behind = step_of(int_id(5), false, false);
    admit_fails(t, &behind, 0, PJS_ERR_INVALID_ARGUMENT, "ended by an earlier request");
    assert_null(pjs_sequence_finish(t, &only, 1));
    pjs_sequence_step late = step_of(int_id(5), false, false);
    admit_fails(t, &late, 2, PJS_ERR_INVALID_ARGUMENT,
                "sequence 5 is not active (it was ended by an earlier request with "
                "sequence_end); start a sequence with sequence_start");
    pjs_sequence_table_destroy(t);
}

static void test_idle_sequences_expire(void **unused)
{
    (void)unused;
    pjs_sequence_table *t = accumulator_table(8);
    pjs_sequence_step a = step_of(str_id("idle"), true, false);
    pjs_sequence_step b = step_of(int_id(2), true, false);
    admit_ok(t, &a, 0, true);
    run_step(&a, 4.0f);
    pjs_sequence_finish(t, &a, 10 * MS);
    admit_ok(t, &b, 50 * MS, true); /* still running at expiry time: kept */
    pjs_sequence_id expired[4];
    assert_int_equal(pjs_sequence_expire(t, 110 * MS, expired, 4), 0); /* exactly 100 ms */
    assert_int_equal(pjs_sequence_expire(t, 111 * MS, expired, 4), 1);
    assert_true(pjs_sequence_id_equal(&expired[0], &a.id));
    assert_int_equal(pjs_sequence_count(t), 1);
    pjs_sequence_step again = step_of(str_id("idle"), false, false);
    admit_fails(t, &again, 112 * MS, PJS_ERR_INVALID_ARGUMENT,
                "sequence \"idle\" is not active (it was freed after being idle longer than "
                "the model's idle_timeout_ms)");
    /* A new start of the same id begins from the initial state. */
    pjs_sequence_step restart = step_of(str_id("idle"), true, false);
    admit_ok(t, &restart, 113 * MS, true);
    assert_true(run_step(&restart, 1.0f) == 1.0f);
    pjs_sequence_finish(t, &restart, 113 * MS);
    pjs_sequence_finish(t, &b, 1000 * MS);
    assert_int_equal(pjs_sequence_expire(t, 1000 * MS, expired, 4), 1); /* only "idle" */
    assert_int_equal(pjs_sequence_expire(t, 1101 * MS, expired, 0), 1); /* 2, not listed */
    assert_int_equal(pjs_sequence_count(t), 0);
    pjs_sequence_table_destroy(t);
}

static void test_start_on_a_live_sequence_starts_it_over(void **unused)
{
    (void)unused;
    pjs_sequence_table *t = accumulator_table(8);
    pjs_sequence_step s1 = step_of(int_id(3), true, false);
    admit_ok(t, &s1, 0, true);
    run_step(&s1, 5.0f);
    pjs_sequence_step again = step_of(int_id(3), true, false);
    admit_ok(t, &again, 0, false); /* waits for s1 */
    assert_ptr_equal(pjs_sequence_finish(t, &s1, 1), &again);
    assert_true(run_step(&again, 2.0f) == 2.0f);
    pjs_sequence_finish(t, &again, 2);
    /* After an end, a start revives the id while the ending step runs. */
    pjs_sequence_step end = step_of(int_id(3), false, true);
    pjs_sequence_step revive = step_of(int_id(3), true, false);
    admit_ok(t, &end, 3, true);
    admit_ok(t, &revive, 3, false);
    assert_true(run_step(&end, 1.0f) == 3.0f);
    assert_ptr_equal(pjs_sequence_finish(t, &end, 4), &revive);
    assert_true(run_step(&revive, 1.0f) == 1.0f);
    pjs_sequence_finish(t, &revive, 5);
    assert_int_equal(pjs_sequence_count(t), 1);
    pjs_sequence_table_destroy(t);
}

static void test_live_sequences_are_limited(void **unused)
{
    (void)unused;
    pjs_sequence_table *t = accumulator_table(2);
    pjs_sequence_step a = step_of(int_id(1), true, false);
    pjs_sequence_step b = step_of(int_id(2), true, true);
    pjs_sequence_step c = step_of(int_id(3), true, false);
    admit_ok(t, &a, 0, true);
    admit_ok(t, &b, 0, true);
    /* Both running: nothing to evict, however long they take. */
    admit_fails(t, &c, 500 * MS, PJS_ERR_UNAVAILABLE,
                "model acc: all 2 sequence slots are taken and every sequence ran a step within "
                "the last 20 ms (sequence.evict_after_idle_ms), so none can be evicted");
    pjs_sequence_finish(t, &b, 1); /* ends 2 */
    admit_ok(t, &c, 1, true);
    pjs_sequence_table_destroy(t);
}

static void test_full_table_evicts_the_least_recently_used_idle_sequence(void **unused)
{
    (void)unused;
    pjs_sequence_table *t = accumulator_table(3);
    one_step(t, int_id(1), true, 0, 1 * MS);
    one_step(t, int_id(2), true, 2 * MS, 3 * MS);
    one_step(t, int_id(3), true, 4 * MS, 5 * MS);
    one_step(t, int_id(1), false, 6 * MS, 7 * MS); /* 1 used again: 2 is now the oldest */
    /* At 30 ms, 2 has been idle 27 ms (> the 20 ms floor): evicted first. */
    pjs_sequence_step n1 = step_of(int_id(10), true, false);
    admit_evicts(t, &n1, 30 * MS, int_id(2), 27 * MS);
    assert_int_equal(pjs_sequence_count(t), 3);
    /* 2's next step is told what happened and what to do about it. */
    pjs_sequence_step late = step_of(int_id(2), false, false);
    admit_fails(t, &late, 31 * MS, PJS_ERR_INVALID_ARGUMENT,
                "model acc: sequence 2 is not active (it was evicted after 27 ms idle to make "
                "room for a new sequence: the model's 3-slot sequence table was full); send a "
                "sequence's steps less than 20 ms apart (sequence.evict_after_idle_ms) or raise "
                "the model's sequence.max_sequences, and start it again with sequence_start set");
    /* Next oldest: 3 (finished at 5 ms), then 1 (7 ms); 10 is still running. */
    pjs_sequence_step n2 = step_of(int_id(11), true, false);
    admit_evicts(t, &n2, 31 * MS, int_id(3), 26 * MS);
    pjs_sequence_step n3 = step_of(int_id(12), true, false);
    admit_evicts(t, &n3, 32 * MS, int_id(1), 25 * MS);
    /* The survivors kept their state. */
    assert_true(run_step(&n1, 2.0f) == 2.0f);
    pjs_sequence_finish(t, &n1, 33 * MS);
    pjs_sequence_finish(t, &n2, 33 * MS);
    pjs_sequence_finish(t, &n3, 33 * MS);
    /* A restart of an evicted id is a new sequence like any other. */
    pjs_sequence_step again = step_of(int_id(2), true, false);
    admit_evicts(t, &again, 54 * MS, int_id(10), 21 * MS);
    assert_true(run_step(&again, 1.0f) == 1.0f);
    pjs_sequence_finish(t, &again, 54 * MS);
    pjs_sequence_table_destroy(t);
}

static void test_sequences_used_within_the_floor_are_not_evicted(void **unused)
{
    (void)unused;
    pjs_sequence_table *t = accumulator_table(2);
    one_step(t, int_id(1), true, 0, 10 * MS);
    one_step(t, int_id(2), true, 0, 15 * MS);
    pjs_sequence_step fresh = step_of(int_id(3), true, false);
    /* 1 has been idle exactly the floor (20 ms): not longer, so kept. */
    admit_fails(t, &fresh, 30 * MS, PJS_ERR_UNAVAILABLE, "none can be evicted for a new one");
    /* Touching 1 makes 2 the older; one nanosecond past the floor it goes. */
    one_step(t, int_id(1), false, 30 * MS, 31 * MS);
    admit_fails(t, &fresh, 35 * MS, PJS_ERR_UNAVAILABLE, "retry later");
    admit_evicts(t, &fresh, 35 * MS + 1, int_id(2), 20 * MS + 1);
    /* A step that starts a live sequence over takes no slot and evicts nothing. */
    pjs_sequence_step restart = step_of(int_id(1), true, false);
    admit_ok(t, &restart, 200 * MS, true);
    pjs_sequence_finish(t, &restart, 200 * MS);
    pjs_sequence_finish(t, &fresh, 200 * MS);
    assert_int_equal(pjs_sequence_count(t), 2);
    pjs_sequence_table_destroy(t);
}

static void test_waiting_steps_keep_a_sequence_from_eviction(void **unused)
{
    (void)unused;
    pjs_sequence_table *t = accumulator_table(2);
    pjs_sequence_step a1 = step_of(int_id(1), true, false);
    pjs_sequence_step a2 = step_of(int_id(1), false, false);
    admit_ok(t, &a1, 0, true);
    admit_ok(t, &a2, 0, false);
    one_step(t, int_id(2), true, 1 * MS, 2 * MS);
    /* 1 is busy for long, 2 idle past the floor: 2 goes, never 1. */
    pjs_sequence_step n = step_of(int_id(3), true, false);
    admit_evicts(t, &n, 100 * MS, int_id(2), 98 * MS);
    pjs_sequence_step m = step_of(int_id(4), true, false);
    admit_fails(t, &m, 100 * MS, PJS_ERR_UNAVAILABLE, "all 2 sequence slots are taken");
    assert_ptr_equal(pjs_sequence_finish(t, &a1, 101 * MS), &a2);
    assert_true(run_step(&a2, 1.0f) == 1.0f);
    pjs_sequence_finish(t, &a2, 101 * MS);
    pjs_sequence_finish(t, &n, 101 * MS);
    pjs_sequence_table_destroy(t);
}

static void test_a_client_at_its_cap_is_refused_while_others_start(void **unused)
{
    (void)unused;
    pjs_sequence_table *t = capped_table(8, 2);
    client_step(t, "192.0.2.1", int_id(1), true, false, 0, 1 * MS);
    client_step(t, "192.0.2.1", int_id(2), true, false, 1 * MS, 2 * MS);
    assert_int_equal(pjs_sequence_client_count(t, "192.0.2.1"), 2);
    /* Both stepped within the floor: a third is refused, naming the cap. */
    pjs_sequence_step third = step_of(int_id(3), true, false);
    third.client = "192.0.2.1";
    admit_fails(t, &third, 10 * MS, PJS_ERR_RESOURCE_EXHAUSTED,
                "model acc: client 192.0.2.1 holds 2 live sequences, the most one client may "
                "(sequence.max_sequences_per_client), and each ran a step within the last 20 ms "
                "(sequence.evict_after_idle_ms), so none of them can be evicted for a new one; "
                "end sequences with sequence_end before starting more, or raise the model's "
                "sequence.max_sequences_per_client");
    /* Another client, and the anonymous one, start theirs meanwhile. */
    client_step(t, "192.0.2.2", int_id(4), true, false, 11 * MS, 12 * MS);
    client_step(t, "::1", str_id("v6"), true, false, 12 * MS, 12 * MS);
    client_step(t, NULL, int_id(5), true, false, 12 * MS, 12 * MS);
    assert_int_equal(pjs_sequence_client_count(t, "192.0.2.2"), 1);
    assert_int_equal(pjs_sequence_client_count(t, "::1"), 1);
    assert_int_equal(pjs_sequence_client_count(t, ""), 1);
    assert_int_equal(pjs_sequence_count(t), 5);
    /* Stepping a live sequence, or starting one over, is not a new one. */
    client_step(t, "192.0.2.1", int_id(1), false, false, 13 * MS, 14 * MS);
    client_step(t, "192.0.2.1", int_id(2), true, false, 14 * MS, 14 * MS);
    /* Whoever starts a live sequence over, it stays its first client's. */
    client_step(t, "192.0.2.2", int_id(1), true, false, 15 * MS, 16 * MS);
    assert_int_equal(pjs_sequence_client_count(t, "192.0.2.1"), 2);
    assert_int_equal(pjs_sequence_client_count(t, "192.0.2.2"), 1);
    /* An end gives the slot back to its client. */
    client_step(t, "192.0.2.1", int_id(2), false, true, 17 * MS, 18 * MS);
    assert_int_equal(pjs_sequence_client_count(t, "192.0.2.1"), 1);
    admit_ok(t, &third, 19 * MS, true);
    pjs_sequence_finish(t, &third, 19 * MS);
    assert_int_equal(pjs_sequence_client_count(t, "192.0.2.1"), 2);
    pjs_sequence_table_destroy(t);
}

static void test_a_client_at_its_cap_evicts_its_own_idle_sequence(void **unused)
{
    (void)unused;
    pjs_sequence_table *t = capped_table(8, 2);
    client_step(t, "other", int_id(10), true, false, 0, 0); /* older than all of hog's */
    client_step(t, "hog", int_id(1), true, false, 0, 1 * MS);
    client_step(t, "hog", int_id(2), true, false, 2 * MS, 3 * MS);
    client_step(t, "hog", int_id(1), false, false, 4 * MS, 5 * MS); /* 2 is now hog's oldest */
    /* Past the floor, hog's new sequence evicts hog's 2, not other's 10,
     * though 10 has been idle longest and the table has room. */
    pjs_sequence_step n = step_of(int_id(3), true, false);
    n.client = "hog";
    pjs_error err = {0};
    bool runs = false;
    pjs_sequence_eviction evicted = {0};
    assert_int_equal(pjs_sequence_admit(t, &n, 30 * MS, &runs, &evicted, &err), 0);
    assert_true(runs && evicted.happened && evicted.own);
    assert_true(pjs_sequence_id_equal(&evicted.id, &(pjs_sequence_id){.number = 2}));
    assert_int_equal(evicted.idle_ns, 27 * MS);
    pjs_sequence_finish(t, &n, 31 * MS);
    assert_int_equal(pjs_sequence_client_count(t, "hog"), 2);
    assert_int_equal(pjs_sequence_client_count(t, "other"), 1);
    pjs_sequence_step late = step_of(int_id(2), false, false);
    admit_fails(t, &late, 32 * MS, PJS_ERR_INVALID_ARGUMENT,
                "model acc: sequence 2 is not active (it was evicted after 27 ms idle to make "
                "room for a new sequence of the same client, which held 2, the most one client "
                "may (sequence.max_sequences_per_client)); end sequences with sequence_end when "
                "done, send a sequence's steps less than 20 ms apart");
    /* A running sequence of hog's is never evicted: 1 is hog's oldest idle one. */
    pjs_sequence_step busy = step_of(int_id(3), false, false);
    busy.client = "hog";
    admit_ok(t, &busy, 60 * MS, true);
    pjs_sequence_step m = step_of(int_id(4), true, false);
    m.client = "hog";
    admit_evicts(t, &m, 61 * MS, int_id(1), 56 * MS);
    pjs_sequence_step m2 = step_of(int_id(5), true, false);
    m2.client = "hog";
    admit_fails(t, &m2, 200 * MS, PJS_ERR_RESOURCE_EXHAUSTED, "client hog holds 2 live");
    pjs_sequence_finish(t, &busy, 201 * MS);
    pjs_sequence_finish(t, &m, 201 * MS);
    /* Expiry frees the client's count with its sequences. */
    pjs_sequence_id expired[4];
    assert_int_equal(pjs_sequence_expire(t, 400 * MS, expired, 4), 3);
    assert_int_equal(pjs_sequence_client_count(t, "hog"), 0);
    assert_int_equal(pjs_sequence_client_count(t, "other"), 0);
    assert_int_equal(pjs_sequence_count(t), 0);
    pjs_sequence_table_destroy(t);
}

static void test_a_full_table_evicts_for_a_client_under_its_cap(void **unused)
{
    (void)unused;
    /* 4 slots, 2 per client: a and b fill the table; c, under its cap,
     * evicts the table's least recently used idle sequence (a's), and the
     * counts follow the eviction. */
    pjs_sequence_table *t = capped_table(4, 2);
    client_step(t, "a", int_id(1), true, false, 0, 1 * MS);
    client_step(t, "b", int_id(2), true, false, 1 * MS, 2 * MS);
    client_step(t, "a", int_id(3), true, false, 2 * MS, 3 * MS);
    client_step(t, "b", int_id(4), true, false, 3 * MS, 4 * MS);
    pjs_sequence_step c1 = step_of(int_id(5), true, false);
    c1.client = "c";
    admit_fails(t, &c1, 10 * MS, PJS_ERR_UNAVAILABLE, "all 4 sequence slots are taken");
    admit_evicts(t, &c1, 30 * MS, int_id(1), 29 * MS);
    pjs_sequence_finish(t, &c1, 30 * MS);
    assert_int_equal(pjs_sequence_client_count(t, "a"), 1);
    assert_int_equal(pjs_sequence_client_count(t, "c"), 1);
    assert_int_equal(pjs_sequence_count(t), 4);
    pjs_sequence_table_destroy(t);
}

static void test_many_sequences_in_one_table(void **unused)
{
    (void)unused;
    enum { N = 1000 };
    pjs_sequence_table *t = accumulator_table(N);
    static pjs_sequence_step steps[N];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) {
            steps[i] = step_of(int_id((uint64_t)i + 1), round == 0, round == 2);
            admit_ok(t, &steps[i], (uint64_t)round, true);
            float sum = run_step(&steps[i], (float)i);
            assert_true(sum == (float)i * (float)(round + 1));
        }
        for (int i = 0; i < N; i++)
            assert_null(pjs_sequence_finish(t, &steps[i], (uint64_t)round));
    }
    assert_int_equal(pjs_sequence_count(t), 0);
    pjs_sequence_table_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_interleaved_sequences_keep_their_own_state),
        cmocka_unit_test(test_integer_and_string_ids_differ),
        cmocka_unit_test(test_steps_of_one_sequence_run_in_order),
        cmocka_unit_test(test_unknown_and_ended_sequences_are_refused),
        cmocka_unit_test(test_idle_sequences_expire),
        cmocka_unit_test(test_start_on_a_live_sequence_starts_it_over),
        cmocka_unit_test(test_live_sequences_are_limited),
        cmocka_unit_test(test_full_table_evicts_the_least_recently_used_idle_sequence),
        cmocka_unit_test(test_sequences_used_within_the_floor_are_not_evicted),
        cmocka_unit_test(test_waiting_steps_keep_a_sequence_from_eviction),
        cmocka_unit_test(test_a_client_at_its_cap_is_refused_while_others_start),
        cmocka_unit_test(test_a_client_at_its_cap_evicts_its_own_idle_sequence),
        cmocka_unit_test(test_a_full_table_evicts_for_a_client_under_its_cap),
        cmocka_unit_test(test_many_sequences_in_one_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
