/*
 * terrace_pool_api.c — the native pool API (terrace_pool.h): create, root, allocation
 * published into destinations in and out of the pool, transactions that abort and commit,
 * iteration by type, realloc, custom classes, statistics, close and reopen (everything
 * survived), check, and error paths. Argument: a scratch directory.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "terrace.h"
#include "terrace_pool.h"

#define LAYOUT "terrace-pool-api"

struct root {
    uint64_t a;       /* type 1, 100 bytes of pattern 1 */
    uint64_t b;       /* type 2, realloc'd 5000 -> 10000 bytes, pattern 2 on the first 5000 */
    uint64_t counter; /* set by the committed transaction */
    uint64_t tx_obj;  /* type 3, allocated by the committed transaction */
    uint64_t klass;   /* type 5, custom class object */
    uint8_t class_id;
};

static int count_cb(terrace_pool *pool, uint64_t off, void *arg) {
    (void)pool;
    CHECK(off != 0);
    ++*(int *)arg;
    return 0;
}

static int stop_cb(terrace_pool *pool, uint64_t off, void *arg) {
    (void)pool;
    (void)off;
    (void)arg;
    return 77;
}

static int count_type(terrace_pool *p, uint64_t type) {
    int n = 0;
    for (uint64_t o = terrace_pool_first(p, type); o != 0; o = terrace_pool_next(p, o)) {
        if (type != TERRACE_POOL_ANY_TYPE)
            CHECK(terrace_pool_type_num(p, o) == type);
        n++;
    }
    int m = 0;
    CHECK(terrace_pool_foreach(p, type, count_cb, &m) == 0);
    CHECK(m == n);
    return n;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    char path[4096], missing[4096];
    snprintf(path, sizeof path, "%s/native.pool", argv[1]);
    snprintf(missing, sizeof missing, "%s/missing.pool", argv[1]);

    terrace_pool *p = terrace_pool_create(path, 32 * MiB, LAYOUT);
    CHECK(p != NULL);
    CHECK(terrace_pool_create(path, 32 * MiB, LAYOUT) == NULL && errno == EEXIST);
    CHECK(strlen(terrace_last_error()) > 0);

    /* Root. */
    CHECK(terrace_pool_root(p, 0) == 0);
    uint64_t root = terrace_pool_root(p, sizeof(struct root));
    CHECK(root != 0);
    CHECK(terrace_pool_root(p, 0) == root);
    CHECK(terrace_pool_root_size(p) == sizeof(struct root));
    struct root *r = terrace_pool_direct(p, root);
    CHECK(r != NULL && r->a == 0 && r->counter == 0);
    CHECK(terrace_pool_offset(p, r) == root);
    CHECK(terrace_pool_direct(p, 0) == NULL);

    /* Allocation published into destinations inside the pool. */
    uint64_t a = terrace_pool_alloc(p, 100, 1, &r->a);
    CHECK(a != 0 && r->a == a);
    CHECK(terrace_pool_usable_size(p, a) >= 100 && terrace_pool_type_num(p, a) == 1);
    fill_pattern(terrace_pool_direct(p, a), 100, 1);
    CHECK(terrace_pool_persist(p, terrace_pool_direct(p, a), 100) == 0);
    uint64_t b = terrace_pool_zalloc(p, 5000, 2, &r->b);
    CHECK(b != 0 && r->b == b);
    unsigned char *bp = terrace_pool_direct(p, b);
    for (size_t i = 0; i < 5000; i++)
        CHECK(bp[i] == 0);
    fill_pattern(bp, 5000, 2);
    CHECK(terrace_pool_persist(p, bp, 5000) == 0);

    /* Volatile destination, and none. */
    uint64_t v = 0;
    uint64_t voff = terrace_pool_zalloc(p, 64, 1, &v);
    CHECK(voff != 0 && v == voff);
    uint64_t kept = terrace_pool_alloc(p, 48, 1, NULL);
    CHECK(kept != 0);

    /* A transaction that aborts: everything rolls back. */
    CHECK(terrace_pool_tx_begin(p) == 0);
    CHECK(terrace_pool_tx_add_range(p, root, sizeof(struct root)) == 0);
    r->counter = 42;
    uint64_t t = terrace_pool_tx_alloc(p, 32, 3);
    CHECK(t != 0);
    r->tx_obj = t;
    CHECK(terrace_pool_tx_free(p, a) == 0);
    CHECK(terrace_pool_close(p) == EBUSY); /* refused while the transaction runs */
    CHECK(terrace_pool_tx_abort(p) == 0);
    CHECK(r->counter == 0 && r->tx_obj == 0);
    CHECK(terrace_pool_usable_size(p, a) >= 100);
    CHECK(has_pattern(terrace_pool_direct(p, a), 100, 1));
    CHECK(count_type(p, 3) == 0);

    /* A transaction that commits, with a nested level. */
    CHECK(terrace_pool_tx_begin(p) == 0);
    CHECK(terrace_pool_tx_add_range(p, root, sizeof(struct root)) == 0);
    r->counter = 7;
    CHECK(terrace_pool_tx_begin(p) == 0);
    r->tx_obj = terrace_pool_tx_zalloc(p, 256, 3);
    CHECK(r->tx_obj != 0);
    CHECK(terrace_pool_tx_free(p, kept) == 0);
    CHECK(terrace_pool_tx_commit(p) == 0); /* inner */
    CHECK(terrace_pool_tx_commit(p) == 0); /* outer: durable */
    CHECK(r->counter == 7 && r->tx_obj != 0);
    CHECK(terrace_pool_type_num(p, r->tx_obj) == 3);
    CHECK(terrace_pool_type_num(p, kept) == UINT64_MAX); /* freed by the commit */

    /* A transaction whose operation fails is aborted; its commit reports it. */
    CHECK(terrace_pool_tx_begin(p) == 0);
    CHECK(terrace_pool_tx_add_range(p, root, sizeof(struct root)) == 0);
    r->counter = 1000;
    CHECK(terrace_pool_tx_alloc(p, 0, 3) == 0);
    CHECK(terrace_pool_tx_commit(p) != 0);
    CHECK(r->counter == 7);

    /* Iteration by type. */
    CHECK(count_type(p, 1) == 2); /* a, v */
    CHECK(count_type(p, 2) == 1);
    CHECK(count_type(p, 3) == 1);
    CHECK(count_type(p, 9) == 0);
    CHECK(count_type(p, TERRACE_POOL_ANY_TYPE) == 4); /* the root is not listed */
    CHECK(terrace_pool_first(p, 3) == r->tx_obj);
    CHECK(terrace_pool_foreach(p, 1, stop_cb, NULL) == 77);

    /* Realloc in the pool keeps the contents. */
    CHECK(terrace_pool_realloc(p, &r->b, 10000, 2) == 0);
    CHECK(r->b != 0 && terrace_pool_usable_size(p, r->b) >= 10000);
    CHECK(has_pattern(terrace_pool_direct(p, r->b), 5000, 2));

    /* Custom class. */
    uint8_t id = 0;
    CHECK(terrace_pool_register_class(p, 128, 64, &id) == 0 && id != 0);
    r->class_id = id;
    CHECK(terrace_pool_persist(p, &r->class_id, 1) == 0);
    CHECK(terrace_pool_alloc_in_class(p, id, 100, 5, &r->klass) != 0);
    CHECK(terrace_pool_usable_size(p, r->klass) == 128);
    fill_pattern(terrace_pool_direct(p, r->klass), 128, 5);
    CHECK(terrace_pool_persist(p, terrace_pool_direct(p, r->klass), 128) == 0);
    uint64_t none = 0;
    CHECK(terrace_pool_alloc_in_class(p, 200, 16, 5, &none) == 0 && none == 0);
    CHECK(terrace_pool_alloc_in_class(p, id, 4096, 5, NULL) == 0); /* larger than the unit */
    CHECK(terrace_pool_register_class(p, 0, 0, &id) != 0);

    /* Statistics. */
    struct terrace_pool_stats st;
    CHECK(terrace_pool_stats(p, &st) == 0);
    CHECK(st.pool_size == 32 * MiB && st.allocated_bytes > 0 && st.heap_bytes > st.free_bytes);
    CHECK(terrace_pool_stats(p, NULL) == EINVAL);

    /* Error paths on an open pool. */
    CHECK(terrace_pool_tx_commit(p) == EINVAL); /* no transaction */
    CHECK(terrace_pool_tx_abort(p) == EINVAL);
    CHECK(terrace_pool_tx_add_range(p, root, 8) == EINVAL);
    CHECK(terrace_pool_tx_alloc(p, 8, 1) == 0 && errno == EINVAL);
    CHECK(terrace_pool_alloc(p, 0, 1, NULL) == 0 && errno == EINVAL);
    CHECK(terrace_pool_alloc(NULL, 8, 1, NULL) == 0 && errno == EINVAL);
    CHECK(terrace_pool_persist(p, &st, sizeof st) == EINVAL); /* not in the pool */
    CHECK(terrace_pool_free(p, &v) == 0 && v == 0);
    CHECK(terrace_pool_free(p, &v) == 0); /* null: nothing */
    CHECK(terrace_pool_free_off(p, voff) != 0); /* double free: an error, not a crash */
    CHECK(strlen(terrace_last_error()) > 0);
    CHECK(terrace_pool_free_off(p, 12345) != 0);
    CHECK(terrace_pool_usable_size(p, voff) == 0);

    CHECK(terrace_pool_close(p) == 0);
    CHECK(terrace_pool_close(NULL) == 0);

    /* Opening: missing file, wrong layout. */
    CHECK(terrace_pool_open(missing, NULL) == NULL && errno == ENOENT);
    CHECK(terrace_pool_open(path, "another-layout") == NULL && errno != 0);
    CHECK(strlen(terrace_last_error()) > 0);
    CHECK(terrace_pool_check(missing, NULL) == ENOENT);
    CHECK(terrace_pool_check(path, "another-layout") != 0);
    CHECK(terrace_pool_check(path, LAYOUT) == 0);
    CHECK(terrace_pool_check(path, NULL) == 0);

    /* Reopen: the root and the objects survived. */
    p = terrace_pool_open(path, LAYOUT);
    CHECK(p != NULL);
    CHECK(terrace_pool_root(p, 0) == root && terrace_pool_root_size(p) == sizeof(struct root));
    r = terrace_pool_direct(p, root);
    CHECK(r->a == a && r->counter == 7 && r->tx_obj != 0);
    CHECK(has_pattern(terrace_pool_direct(p, r->a), 100, 1));
    CHECK(has_pattern(terrace_pool_direct(p, r->b), 5000, 2));
    CHECK(terrace_pool_type_num(p, r->tx_obj) == 3 && terrace_pool_usable_size(p, r->tx_obj) >= 256);
    CHECK(terrace_pool_usable_size(p, r->klass) == 128);
    CHECK(has_pattern(terrace_pool_direct(p, r->klass), 128, 5));
    CHECK(terrace_pool_alloc_in_class(p, r->class_id, 64, 5, NULL) != 0); /* class survived */
    CHECK(count_type(p, 1) == 1 && count_type(p, 2) == 1 && count_type(p, 3) == 1);
    CHECK(count_type(p, 5) == 2);

    /* Free into the pool destination clears it atomically. */
    CHECK(terrace_pool_free(p, &r->a) == 0 && r->a == 0);
    CHECK(terrace_pool_free_off(p, a) != 0); /* double free */
    CHECK(count_type(p, 1) == 0);
    CHECK(terrace_pool_close(p) == 0);
    CHECK(terrace_pool_check(path, LAYOUT) == 0);

    printf("terrace_pool_api: ok\n");
    return 0;
}
