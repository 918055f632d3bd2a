/*
 * threads.c — libterrace.so under concurrency: NTHREADS threads share one file kind and
 * the default kind. Each allocates OBJECTS objects of random sizes (16 B .. 64 KiB),
 * alternately from the two kinds, fills each with a pattern derived from (thread, index),
 * and hands every other object to the next thread through a mutex-protected queue. Every
 * thread verifies the pattern, owner kind and usable size of what it receives and frees it
 * (so objects are freed by threads other than their allocator), and verifies and frees
 * its own kept objects at the end. After all threads have exited, the file kind's
 * allocated bytes must be back near zero (below 1 MiB: slack for thread caches).
 *
 * Run by tests/c_abi.rs with a scratch directory on /dev/shm as argv[1].
 */
#include <terrace.h>
#include "check.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NTHREADS 4
#define OBJECTS 4000
#define MIN_SIZE 16
#define MAX_SIZE (64 * 1024)

typedef struct object {
    struct object *next; /* queue link (libc memory, not the object itself) */
    unsigned char *ptr;
    size_t size;
    unsigned thread, index;
    terrace_kind_t kind;
} object_t;

typedef struct queue {
    pthread_mutex_t lock;
    pthread_cond_t ready;
    object_t *head, *tail;
    int closed; /* the producer has handed over everything */
} queue_t;

static terrace_kind_t file_kind;
static queue_t queues[NTHREADS]; /* queues[t] is consumed by thread t */
static unsigned long handed[NTHREADS], received[NTHREADS];

static unsigned char pattern(unsigned thread, unsigned index, size_t i) {
    return (unsigned char)(thread * 73u + index * 151u + i * 7u + (i >> 8));
}

static void fill(const object_t *o) {
    for (size_t i = 0; i < o->size; i++)
        o->ptr[i] = pattern(o->thread, o->index, i);
}

/* Checks and frees an object allocated by any thread. */
static void verify_and_free(object_t *o) {
    CHECK(terrace_detect_kind(o->ptr) == o->kind);
    CHECK(terrace_usable_size(o->ptr) >= o->size);
    for (size_t i = 0; i < o->size; i++) {
        if (o->ptr[i] != pattern(o->thread, o->index, i)) {
            fprintf(stderr, "object %u/%u (%zu bytes) corrupted at byte %zu\n", o->thread,
                    o->index, o->size, i);
            CHECK(0);
        }
    }
    terrace_free(o->ptr);
    free(o);
}

static void push(queue_t *q, object_t *o) {
    o->next = NULL;
    pthread_mutex_lock(&q->lock);
    if (q->tail)
        q->tail->next = o;
    else
        q->head = o;
    q->tail = o;
    pthread_cond_signal(&q->ready);
    pthread_mutex_unlock(&q->lock);
}

static void close_queue(queue_t *q) {
    pthread_mutex_lock(&q->lock);
    q->closed = 1;
    pthread_cond_signal(&q->ready);
    pthread_mutex_unlock(&q->lock);
}

/* Takes everything queued; with wait, blocks until something is queued or the queue is
 * closed. Returns NULL when nothing was queued. */
static object_t *take_all(queue_t *q, int wait, int *closed) {
    pthread_mutex_lock(&q->lock);
    while (wait && q->head == NULL && !q->closed)
        pthread_cond_wait(&q->ready, &q->lock);
    object_t *all = q->head;
    q->head = q->tail = NULL;
    *closed = q->closed;
    pthread_mutex_unlock(&q->lock);
    return all;
}

static unsigned long drain(object_t *list) {
    unsigned long n = 0;
    while (list) {
        object_t *next = list->next;
        verify_and_free(list);
        list = next;
        n++;
    }
    return n;
}

/* xorshift32: a per-thread random sequence without shared state. */
static uint32_t next_random(uint32_t *s) {
    uint32_t x = *s;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *s = x;
}

static void *worker(void *arg) {
    unsigned t = (unsigned)(uintptr_t)arg;
    uint32_t seed = 0x9e3779b9u * (t + 1);
    queue_t *mine = &queues[t], *next = &queues[(t + 1) % NTHREADS];
    object_t *kept = NULL;
    int closed = 0;

    for (unsigned i = 0; i < OBJECTS; i++) {
        object_t *o = malloc(sizeof *o);
        CHECK(o != NULL);
        o->thread = t;
        o->index = i;
        o->size = MIN_SIZE + next_random(&seed) % (MAX_SIZE - MIN_SIZE + 1);
        o->kind = (i / 2) % 2 ? terrace_kind_default() : file_kind;
        o->ptr = terrace_malloc(o->kind, o->size);
        if (o->ptr == NULL)
            fprintf(stderr, "thread %u object %u: %s\n", t, i, terrace_last_error());
        CHECK(o->ptr != NULL);
        fill(o);
        if (i % 2 == 0) {
            push(next, o); /* freed by the next thread */
            handed[t]++;
        } else {
            o->next = kept;
            kept = o;
        }
        if (i % 16 == 15) /* free what arrived meanwhile, without waiting */
            received[t] += drain(take_all(mine, 0, &closed));
    }
    close_queue(next);

    /* Free what the previous thread still hands over, until it is done. */
    while (!closed)
        received[t] += drain(take_all(mine, 1, &closed));
    received[t] += drain(take_all(mine, 0, &closed));
    drain(kept);
    return NULL;
}

int main(int argc, char **argv) {
    CHECK(argc > 1);
    int rc = terrace_kind_create_file(argv[1], 256 * MiB, 0, &file_kind);
    if (rc != 0)
        fprintf(stderr, "terrace_kind_create_file: %s\n", terrace_last_error());
    CHECK(rc == 0);
    terrace_kind_stats_t st;
    CHECK(terrace_kind_stats(file_kind, &st) == 0);
    uint64_t start = st.allocated;

    for (int t = 0; t < NTHREADS; t++) {
        CHECK(pthread_mutex_init(&queues[t].lock, NULL) == 0);
        CHECK(pthread_cond_init(&queues[t].ready, NULL) == 0);
    }
    pthread_t threads[NTHREADS];
    for (int t = 0; t < NTHREADS; t++)
        CHECK(pthread_create(&threads[t], NULL, worker, (void *)(uintptr_t)t) == 0);
    for (int t = 0; t < NTHREADS; t++)
        CHECK(pthread_join(threads[t], NULL) == 0);

    /* Every handed-over object reached the next thread and was freed there. */
    for (int t = 0; t < NTHREADS; t++) {
        CHECK(handed[t] == OBJECTS / 2);
        CHECK(received[(t + 1) % NTHREADS] == handed[t]);
        CHECK(queues[t].head == NULL && queues[t].closed);
    }

    /* Everything was freed and the threads are gone: only thread-cache slack remains. */
    CHECK(terrace_kind_stats(file_kind, &st) == 0);
    fprintf(stderr, "file kind after the threads: allocated %llu (at start %llu), active %llu\n",
            (unsigned long long)st.allocated, (unsigned long long)start,
            (unsigned long long)st.active);
    CHECK(st.allocated < MiB);
    CHECK(terrace_kind_destroy(file_kind) == 0);
    printf("threads: ok\n");
    return 0;
}
