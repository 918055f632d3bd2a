/*
 * pmemobj_api.c — the libpmemobj-compatible C API of libterrace.so (include/libpmemobj.h)
 * as a PMDK program sees it: pools, the root object, atomic allocation publishing into
 * the pool, volatile destinations, iteration, persistence helpers, function-level
 * transactions (commit, abort, nesting, tx alloc/free) and bad input. Run by
 * tests/c_abi.rs with a scratch directory on /dev/shm as argv[1].
 */
#include <libpmemobj.h>
#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define LAYOUT "pmemobj_api"

struct root {
    PMEMoid list[4]; /* published object handles */
    uint64_t counter;
};

static int count_objects(PMEMobjpool *pop) {
    int n = 0;
    PMEMoid oid;
    POBJ_FOREACH(pop, oid) n++;
    return n;
}

static int construct(PMEMobjpool *pop, void *ptr, void *arg) {
    size_t n = *(size_t *)arg;
    fill_pattern(ptr, n, 5);
    pmemobj_persist(pop, ptr, n);
    return 0;
}

static int refuse(PMEMobjpool *pop, void *ptr, void *arg) {
    (void)pop;
    (void)ptr;
    (void)arg;
    return 1;
}

int main(int argc, char **argv) {
    CHECK(argc > 1);
    char path[4096];
    snprintf(path, sizeof path, "%s/api.pool", argv[1]);

    PMEMobjpool *pop = pmemobj_create(path, LAYOUT, 32 * MiB, 0600);
    CHECK(pop != NULL);
    /* An existing file is not overwritten. */
    CHECK(pmemobj_create(path, LAYOUT, 32 * MiB, 0600) == NULL && errno == EEXIST);
    CHECK(strlen(pmemobj_errormsg()) > 0);

    /* The root object: zeroed, stable, its size remembered. */
    PMEMoid root_oid = pmemobj_root(pop, sizeof(struct root));
    CHECK(!OID_IS_NULL(root_oid));
    CHECK(pmemobj_root_size(pop) == sizeof(struct root));
    struct root *root = pmemobj_direct(root_oid);
    CHECK(root != NULL && OID_IS_NULL(root->list[0]) && root->counter == 0);
    CHECK(OID_EQUALS(pmemobj_root(pop, sizeof(struct root)), root_oid));
    CHECK(pmemobj_pool_by_oid(root_oid) == pop);
    CHECK(pmemobj_pool_by_ptr(root) == pop);
    CHECK(OID_EQUALS(pmemobj_oid(root), root_oid));

    /* Atomic allocation publishing into the pool, with a constructor. */
    size_t n = 3000;
    CHECK(pmemobj_alloc(pop, &root->list[0], n, 7, construct, &n) == 0);
    CHECK(!OID_IS_NULL(root->list[0]));
    CHECK(has_pattern(pmemobj_direct(root->list[0]), n, 5));
    CHECK(pmemobj_alloc_usable_size(root->list[0]) >= n);
    CHECK(pmemobj_type_num(root->list[0]) == 7);
    /* zalloc zeroes; a volatile destination is written after the call. */
    PMEMoid local = OID_NULL;
    CHECK(pmemobj_zalloc(pop, &local, 100000, 8) == 0 && !OID_IS_NULL(local));
    const unsigned char *z = pmemobj_direct(local);
    for (size_t i = 0; i < 100000; i++)
        CHECK(z[i] == 0);
    CHECK(count_objects(pop) == 2); /* the root is not listed */

    /* A refusing constructor cancels the allocation and leaks nothing. */
    CHECK(pmemobj_alloc(pop, &root->list[1], 64, 1, refuse, NULL) == -1 && errno == ECANCELED);
    CHECK(OID_IS_NULL(root->list[1]));
    CHECK(count_objects(pop) == 2);
    CHECK(pmemobj_alloc(pop, &root->list[1], 0, 1, NULL, NULL) == -1 && errno == EINVAL);
    /* Out of space is ENOMEM, not a crash. */
    CHECK(pmemobj_alloc(pop, &root->list[1], 64 * MiB, 1, NULL, NULL) == -1 && errno == ENOMEM);

    /* realloc keeps the contents; free clears the published handle. */
    CHECK(pmemobj_realloc(pop, &root->list[0], 9000, 7) == 0);
    CHECK(has_pattern(pmemobj_direct(root->list[0]), n, 5));
    pmemobj_free(&local);
    CHECK(OID_IS_NULL(local));
    CHECK(count_objects(pop) == 1);

    /* Persistence helpers. */
    char *target = pmemobj_direct(root->list[0]);
    pmemobj_memcpy_persist(pop, target, "hello", 6);
    pmemobj_memset_persist(pop, target + 6, 'x', 10);
    pmemobj_persist(pop, target, 16);
    pmemobj_drain(pop);
    CHECK(memcmp(target, "hello\0xxxxxxxxxx", 16) == 0);

    /* A committed transaction: snapshot, write, allocate, publish. */
    CHECK(pmemobj_tx_stage() == TX_STAGE_NONE);
    CHECK(pmemobj_tx_begin(pop, NULL, TX_PARAM_NONE) == 0);
    CHECK(pmemobj_tx_stage() == TX_STAGE_WORK);
    CHECK(pmemobj_tx_add_range(root_oid, 0, sizeof(struct root)) == 0);
    root->counter = 41;
    root->list[2] = pmemobj_tx_zalloc(256, 9);
    CHECK(!OID_IS_NULL(root->list[2]));
    pmemobj_tx_commit();
    CHECK(pmemobj_tx_stage() == TX_STAGE_ONCOMMIT);
    CHECK(pmemobj_tx_end() == 0);
    CHECK(pmemobj_tx_stage() == TX_STAGE_NONE);
    CHECK(root->counter == 41 && count_objects(pop) == 2);

    /* An aborted transaction rolls back its writes and its allocations. */
    CHECK(pmemobj_tx_begin(pop, NULL, TX_PARAM_NONE) == 0);
    CHECK(pmemobj_tx_add_range_direct(&root->counter, sizeof root->counter) == 0);
    root->counter = 1000;
    PMEMoid doomed = pmemobj_tx_alloc(512, 9);
    CHECK(!OID_IS_NULL(doomed));
    pmemobj_tx_abort(EINVAL);
    CHECK(pmemobj_tx_stage() == TX_STAGE_ONABORT);
    CHECK(pmemobj_tx_end() == EINVAL);
    CHECK(root->counter == 41);
    CHECK(count_objects(pop) == 2);

    /* Nesting is flattened: an inner abort aborts the outer transaction. */
    CHECK(pmemobj_tx_begin(pop, NULL, TX_PARAM_NONE) == 0);
    CHECK(pmemobj_tx_add_range_direct(&root->counter, 8) == 0);
    root->counter = 7;
    CHECK(pmemobj_tx_begin(pop, NULL, TX_PARAM_NONE) == 0);
    CHECK(pmemobj_tx_free(root->list[2]) == 0);
    pmemobj_tx_abort(0);
    CHECK(pmemobj_tx_end() == ECANCELED);
    CHECK(pmemobj_tx_stage() == TX_STAGE_ONABORT);
    CHECK(pmemobj_tx_end() == ECANCELED);
    CHECK(root->counter == 41 && count_objects(pop) == 2);

    /* A transactional free becomes durable at commit. */
    CHECK(pmemobj_tx_begin(pop, NULL, TX_PARAM_NONE) == 0);
    CHECK(pmemobj_tx_add_range(root_oid, offsetof(struct root, list[2]), sizeof(PMEMoid)) == 0);
    CHECK(pmemobj_tx_free(root->list[2]) == 0);
    root->list[2] = OID_NULL;
    pmemobj_tx_commit();
    CHECK(pmemobj_tx_end() == 0);
    CHECK(count_objects(pop) == 1);

    /* Bad transaction use fails cleanly. */
    CHECK(pmemobj_tx_add_range(root_oid, 0, 8) == EINVAL);
    CHECK(pmemobj_tx_end() == EINVAL);
    jmp_buf env;
    CHECK(pmemobj_tx_begin(pop, env, TX_PARAM_NONE) == EINVAL);
    CHECK(pmemobj_tx_begin(pop, NULL, TX_PARAM_NONE) == 0);
    CHECK(pmemobj_tx_add_range(root_oid, 1 << 20, 8) != 0); /* far past the object */
    CHECK(pmemobj_tx_stage() == TX_STAGE_ONABORT);
    CHECK(pmemobj_tx_end() != 0);

    /* Everything survives close and reopen (with the layout, or with NULL). */
    PMEMoid kept = root->list[0];
    pmemobj_close(pop);
    CHECK(pmemobj_check(path, LAYOUT) == 1);
    CHECK(pmemobj_open(path, "another layout") == NULL);
    pop = pmemobj_open(path, NULL);
    CHECK(pop != NULL);
    root = pmemobj_direct(pmemobj_root(pop, 0));
    CHECK(root != NULL && root->counter == 41 && OID_EQUALS(root->list[0], kept));
    CHECK(memcmp(pmemobj_direct(root->list[0]), "hello", 6) == 0);
    pmemobj_free(&root->list[0]);
    CHECK(OID_IS_NULL(root->list[0]) && count_objects(pop) == 0);
    pmemobj_close(pop);

    /* A damaged header: open fails with a message, check says not consistent or error. */
    int fd = open(path, O_WRONLY);
    CHECK(fd >= 0);
    CHECK(pwrite(fd, "garbage!", 8, 0) == 8);
    close(fd);
    CHECK(pmemobj_open(path, LAYOUT) == NULL);
    CHECK(strlen(pmemobj_errormsg()) > 0);
    CHECK(pmemobj_check(path, LAYOUT) != 1);
    CHECK(pmemobj_open("/nonexistent/pool", LAYOUT) == NULL && errno == ENOENT);

    printf("pmemobj_api: ok\n");
    return 0;
}
