/*
 * terrace_pool_txn.c — transactions by handle (terrace_pool_txn_* of terrace_pool.h):
 * commit and abort of stores, allocations and frees; a failed operation aborting the
 * transaction with its errno; TERRACE_POOL_TXN_NOWAIT refusing with EAGAIN while every
 * lane is held; close refused with EBUSY while one is live; one transaction begun on one
 * thread and committed on another; NULL and bad arguments; reopening (work durable).
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "terrace.h"
#include "terrace_pool.h"

struct root {
    uint64_t counter;
    uint64_t obj;
};

struct handoff {
    terrace_pool *pool;
    terrace_pool_txn *txn;
    uint64_t root;
    int result;
};

/* Runs on another thread: finishes the transaction begun by main. */
static void *finish_elsewhere(void *arg) {
    struct handoff *h = arg;
    struct root *r = terrace_pool_direct(h->pool, h->root);
    if (terrace_pool_txn_add_range(h->txn, h->root, sizeof *r) != 0) {
        h->result = -1;
        return NULL;
    }
    r->counter += 100;
    h->result = terrace_pool_txn_commit(h->txn);
    return NULL;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    char path[4096];
    snprintf(path, sizeof path, "%s/txn.pool", argv[1]);
    unlink(path);
    terrace_pool *p = terrace_pool_create(path, 16 * MiB, "txn");
    CHECK(p != NULL);
    uint64_t root = terrace_pool_root(p, sizeof(struct root));
    CHECK(root != 0);
    struct root *r = terrace_pool_direct(p, root);
    int mode = terrace_pool_persist_mode(p);
    CHECK(mode == TERRACE_POOL_PERSIST_FENCE || mode == TERRACE_POOL_PERSIST_FLUSH ||
          mode == TERRACE_POOL_PERSIST_MSYNC);
    CHECK(terrace_pool_persist_mode(NULL) == -1 && errno == EINVAL);

    /* Abort restores the snapshot and frees the allocation. */
    struct terrace_pool_stats before, after;
    CHECK(terrace_pool_stats(p, &before) == 0);
    terrace_pool_txn *t = terrace_pool_txn_begin(p, 0);
    CHECK(t != NULL);
    CHECK(terrace_pool_txn_add_range(t, root, sizeof *r) == 0);
    r->counter = 41;
    r->obj = terrace_pool_txn_alloc(t, 100, 5, TERRACE_POOL_TXN_ZERO);
    CHECK(r->obj != 0);
    char *bytes = terrace_pool_direct(p, r->obj);
    for (int i = 0; i < 100; i++)
        CHECK(bytes[i] == 0);
    CHECK(terrace_pool_txn_abort(t) == 0);
    CHECK(r->counter == 0 && r->obj == 0);
    CHECK(terrace_pool_stats(p, &after) == 0);
    CHECK(after.allocated_bytes == before.allocated_bytes);

    /* Commit keeps stores and allocations; a free in a later one takes effect. */
    t = terrace_pool_txn_begin(p, TERRACE_POOL_TXN_NOWAIT);
    CHECK(t != NULL);
    CHECK(terrace_pool_txn_add_range(t, root, sizeof *r) == 0);
    r->counter = 7;
    r->obj = terrace_pool_txn_alloc(t, 64, 5, 0);
    CHECK(r->obj != 0);
    fill_pattern(terrace_pool_direct(p, r->obj), 64, 3);
    uint64_t scratch = terrace_pool_txn_alloc(t, 32, 6, 0);
    CHECK(scratch != 0);
    CHECK(terrace_pool_txn_free(t, scratch) == 0); /* its own allocation: freed at once */
    CHECK(terrace_pool_txn_free(t, 0) == 0);
    CHECK(terrace_pool_txn_commit(t) == 0);
    CHECK(terrace_pool_type_num(p, r->obj) == 5);
    CHECK(terrace_pool_first(p, 6) == 0);
    uint64_t obj = r->obj;

    /* A failed operation aborts: later ones fail with ECANCELED, commit returns its errno. */
    t = terrace_pool_txn_begin(p, 0);
    CHECK(t != NULL);
    CHECK(terrace_pool_txn_add_range(t, root, sizeof *r) == 0);
    r->counter = 1000;
    CHECK(terrace_pool_txn_alloc(t, 0, 1, 0) == 0 && errno == EINVAL);
    CHECK(terrace_pool_txn_alloc(t, 8, 1, 0) == 0 && errno == ECANCELED);
    CHECK(terrace_pool_txn_add_range(t, root, 8) == ECANCELED);
    CHECK(terrace_pool_txn_commit(t) == EINVAL);
    CHECK(r->counter == 7);
    t = terrace_pool_txn_begin(p, 0);
    CHECK(terrace_pool_txn_add_range(t, 1, 8) == EINVAL); /* outside the heap */
    CHECK(terrace_pool_txn_commit(t) == EINVAL);
    t = terrace_pool_txn_begin(p, 0);
    CHECK(terrace_pool_txn_alloc(t, 64 * MiB, 1, 0) == 0 && errno == ENOMEM);
    CHECK(terrace_pool_txn_commit(t) == ENOMEM);
    t = terrace_pool_txn_begin(p, 0);
    CHECK(terrace_pool_txn_alloc_in_class(t, 200, 16, 1, 0) == 0 && errno == EINVAL);
    CHECK(terrace_pool_txn_abort(t) == 0);
    t = terrace_pool_txn_begin(p, 0);
    CHECK(terrace_pool_txn_alloc(t, 16, 1, 2) == 0 && errno == EINVAL); /* unknown flag */
    CHECK(terrace_pool_txn_commit(t) == EINVAL);

    /* A custom class inside a transaction. */
    uint8_t cls;
    CHECK(terrace_pool_register_class(p, 48, 0, &cls) == 0);
    t = terrace_pool_txn_begin(p, 0);
    uint64_t unit = terrace_pool_txn_alloc_in_class(t, cls, 40, 9, TERRACE_POOL_TXN_ZERO);
    CHECK(unit != 0);
    CHECK(terrace_pool_txn_commit(t) == 0);
    CHECK(terrace_pool_usable_size(p, unit) == 48);

    /* Every lane held: NOWAIT refuses with EAGAIN; close refuses with EBUSY. */
    terrace_pool_txn *held[64];
    int n = 0;
    while (n < 64 && (held[n] = terrace_pool_txn_begin(p, TERRACE_POOL_TXN_NOWAIT)) != NULL)
        n++;
    CHECK(n > 0 && n < 64 && errno == EAGAIN);
    CHECK(terrace_pool_close(p) == EBUSY);
    for (int i = 0; i < n; i++)
        CHECK(terrace_pool_txn_commit(held[i]) == 0);

    /* Begun on this thread, finished on another. */
    struct handoff h = {p, terrace_pool_txn_begin(p, 0), root, -2};
    CHECK(h.txn != NULL);
    pthread_t other;
    CHECK(pthread_create(&other, NULL, finish_elsewhere, &h) == 0);
    CHECK(pthread_join(other, NULL) == 0);
    CHECK(h.result == 0 && r->counter == 107);

    /* NULL arguments. */
    CHECK(terrace_pool_txn_begin(NULL, 0) == NULL && errno == EINVAL);
    CHECK(terrace_pool_txn_begin(p, 4) == NULL && errno == EINVAL);
    CHECK(terrace_pool_txn_add_range(NULL, root, 8) == EINVAL);
    CHECK(terrace_pool_txn_alloc(NULL, 8, 1, 0) == 0 && errno == EINVAL);
    CHECK(terrace_pool_txn_free(NULL, obj) == EINVAL);
    CHECK(terrace_pool_txn_commit(NULL) == EINVAL);
    CHECK(terrace_pool_txn_abort(NULL) == EINVAL);
    CHECK(strlen(terrace_last_error()) > 0);

    /* Reopened: the committed work is there. */
    CHECK(terrace_pool_close(p) == 0);
    p = terrace_pool_open(path, "txn");
    CHECK(p != NULL);
    r = terrace_pool_direct(p, terrace_pool_root(p, sizeof(struct root)));
    CHECK(r->counter == 107 && r->obj == obj);
    CHECK(has_pattern(terrace_pool_direct(p, obj), 64, 3));
    CHECK(terrace_pool_close(p) == 0);
    CHECK(terrace_pool_check(path, "txn") == 0);
    unlink(path);
    printf("terrace_pool_txn: ok\n");
    return 0;
}
