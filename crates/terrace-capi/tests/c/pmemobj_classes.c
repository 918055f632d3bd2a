/*
 * pmemobj_classes.c — custom allocation classes through the libpmemobj-compatible API
 * (include/libpmemobj.h): pmemobj_ctl_set of "heap.alloc_class.new.desc" and
 * "heap.alloc_class.<id>.desc", pmemobj_ctl_get, pmemobj_xalloc and pmemobj_tx_xalloc
 * with POBJ_CLASS_ID, the errors of bad descriptions, ids, sizes, flags and ctl names,
 * and then what libpmemobj does not do: after pmemobj_close and pmemobj_open the classes
 * are still registered, their objects still valid, and allocating in them works without
 * registering them again (libpmemobj forgets its classes at close, so the same program
 * would get EINVAL from that pmemobj_xalloc). Run by tests/c_abi.rs with a scratch
 * directory on /dev/shm as argv[1].
 */
#include <libpmemobj.h>
#include "check.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

#define LAYOUT "pmemobj_classes"
#define SMALL 8

struct root {
    PMEMoid small[SMALL]; /* objects of the 48-byte class */
    PMEMoid page;         /* an object of the 4 KiB class */
    PMEMoid tx_obj;       /* allocated by a transaction in the 48-byte class */
    uint64_t small_id;
};

static int count_objects(PMEMobjpool *pop) {
    int n = 0;
    PMEMoid oid;
    POBJ_FOREACH(pop, oid) n++;
    return n;
}

static int construct(PMEMobjpool *pop, void *ptr, void *arg) {
    unsigned seed = *(unsigned *)arg;
    fill_pattern(ptr, 48, seed);
    pmemobj_persist(pop, ptr, 48);
    return 0;
}

/* Whether setting `d` under `name` fails with `err`, registering nothing. */
static int set_fails(PMEMobjpool *pop, const char *name, struct pobj_alloc_class_desc d,
                     int err) {
    errno = 0;
    return pmemobj_ctl_set(pop, name, &d) == -1 && errno == err;
}

int main(int argc, char **argv) {
    CHECK(argc > 1);
    char path[4096];
    snprintf(path, sizeof path, "%s/classes.pool", argv[1]);

    PMEMobjpool *pop = pmemobj_create(path, LAYOUT, 32 * MiB, 0600);
    CHECK(pop != NULL);
    struct root *root = pmemobj_direct(pmemobj_root(pop, sizeof(struct root)));
    CHECK(root != NULL);

    /* Register: the next free id, and a chosen one. */
    struct pobj_alloc_class_desc small = {
        .unit_size = 48,
        .alignment = 0,
        .units_per_block = 1000,
        .header_type = POBJ_HEADER_NONE,
        .class_id = 0,
    };
    CHECK(pmemobj_ctl_set(pop, "heap.alloc_class.new.desc", &small) == 0);
    CHECK(small.class_id >= 1 && small.class_id <= 254);
    CHECK(small.units_per_block >= 1000); /* the actual count, at least what was asked */
    struct pobj_alloc_class_desc page = {
        .unit_size = 4096,
        .alignment = 4096,
        .units_per_block = 8,
        .header_type = POBJ_HEADER_COMPACT,
        .class_id = 0,
    };
    CHECK(pmemobj_ctl_set(pop, "heap.alloc_class.128.desc", &page) == 0);
    CHECK(page.class_id == 128 && page.units_per_block == 8);
    struct pobj_alloc_class_desc got;
    memset(&got, 0xAB, sizeof got);
    CHECK(pmemobj_ctl_get(pop, "heap.alloc_class.128.desc", &got) == 0);
    CHECK(got.unit_size == 4096 && got.alignment == 4096 && got.units_per_block == 8 &&
          got.header_type == POBJ_HEADER_COMPACT && got.class_id == 128);

    /* Bad descriptions, ids and names. */
    struct pobj_alloc_class_desc bad = small;
    bad.unit_size = 0;
    CHECK(set_fails(pop, "heap.alloc_class.new.desc", bad, EINVAL));
    bad = small;
    bad.unit_size = 20; /* not a multiple of 8 */
    CHECK(set_fails(pop, "heap.alloc_class.new.desc", bad, EINVAL));
    bad = small;
    bad.units_per_block = 0;
    CHECK(set_fails(pop, "heap.alloc_class.new.desc", bad, EINVAL));
    bad = small;
    bad.alignment = 32; /* does not divide 48 */
    CHECK(set_fails(pop, "heap.alloc_class.new.desc", bad, EINVAL));
    bad = small;
    bad.header_type = MAX_POBJ_HEADER_TYPES;
    CHECK(set_fails(pop, "heap.alloc_class.new.desc", bad, EINVAL));
    CHECK(set_fails(pop, "heap.alloc_class.128.desc", page, EEXIST));
    CHECK(set_fails(pop, "heap.alloc_class.0.desc", page, EEXIST));
    CHECK(set_fails(pop, "heap.alloc_class.255.desc", page, ERANGE));
    CHECK(set_fails(pop, "heap.alloc_class.x1.desc", page, EINVAL));
    CHECK(set_fails(pop, "heap.narenas.max", page, EINVAL));
    errno = 0;
    CHECK(pmemobj_ctl_get(pop, "heap.alloc_class.77.desc", &got) == -1 && errno == ENOENT);
    errno = 0;
    CHECK(pmemobj_ctl_get(pop, "heap.alloc_class.new.desc", &got) == -1 && errno == EINVAL);
    errno = 0;
    CHECK(pmemobj_ctl_get(pop, "no.such.entry", &got) == -1 && errno == EINVAL);
    errno = 0;
    CHECK(pmemobj_ctl_get(pop, "heap.alloc_class.128.desc", NULL) == -1 && errno == EINVAL);
    errno = 0;
    CHECK(pmemobj_ctl_exec(pop, "heap.arena.create", &got) == -1 && errno == EINVAL);
    CHECK(strlen(pmemobj_errormsg()) > 0);

    /* Atomic allocation in the classes, published into the pool. */
    for (unsigned i = 0; i < SMALL; i++) {
        unsigned seed = i + 1;
        CHECK(pmemobj_xalloc(pop, &root->small[i], 40, 3, POBJ_CLASS_ID(small.class_id),
                             construct, &seed) == 0);
        CHECK(!OID_IS_NULL(root->small[i]));
        CHECK(pmemobj_alloc_usable_size(root->small[i]) == 48);
        CHECK(pmemobj_type_num(root->small[i]) == 3);
    }
    CHECK(pmemobj_xalloc(pop, &root->page, 4096, 4, POBJ_CLASS_ID(128) | POBJ_XALLOC_ZERO,
                         NULL, NULL) == 0);
    const unsigned char *p = pmemobj_direct(root->page);
    CHECK(p != NULL && (uintptr_t)p % 4096 == 0);
    for (size_t i = 0; i < 4096; i++)
        CHECK(p[i] == 0);
    CHECK(count_objects(pop) == SMALL + 1);

    /* Refused allocations leave nothing behind. */
    PMEMoid none = OID_NULL;
    errno = 0;
    CHECK(pmemobj_xalloc(pop, &none, 49, 3, POBJ_CLASS_ID(small.class_id), NULL, NULL) == -1 &&
          errno == EINVAL); /* above the unit */
    errno = 0;
    CHECK(pmemobj_xalloc(pop, &none, 8, 3, POBJ_CLASS_ID(77), NULL, NULL) == -1 &&
          errno == EINVAL); /* not registered */
    errno = 0;
    CHECK(pmemobj_xalloc(pop, &none, 8, 3, POBJ_CLASS_ID(small.class_id) | POBJ_XALLOC_NO_FLUSH,
                         NULL, NULL) == -1 &&
          errno == EINVAL); /* not a flag of pmemobj_xalloc */
    CHECK(OID_IS_NULL(none) && count_objects(pop) == SMALL + 1);
    /* Class 0 is the built-in size classes. */
    CHECK(pmemobj_xalloc(pop, &none, 100, 3, POBJ_CLASS_ID(0) | POBJ_XALLOC_ZERO, NULL, NULL) == 0);
    CHECK(pmemobj_alloc_usable_size(none) == 112);
    pmemobj_free(&none);

    /* Transactional allocation in a class; a refused one with NO_ABORT keeps the
     * transaction going, without it aborts the transaction. */
    CHECK(pmemobj_tx_begin(pop, NULL, TX_PARAM_NONE) == 0);
    CHECK(pmemobj_tx_add_range_direct(&root->tx_obj, sizeof(PMEMoid)) == 0);
    root->tx_obj = pmemobj_tx_xalloc(48, 5, POBJ_CLASS_ID(small.class_id) | POBJ_XALLOC_ZERO);
    CHECK(!OID_IS_NULL(root->tx_obj) && pmemobj_alloc_usable_size(root->tx_obj) == 48);
    errno = 0;
    PMEMoid refused = pmemobj_tx_xalloc(100, 5, POBJ_CLASS_ID(small.class_id) |
                                                    POBJ_XALLOC_NO_ABORT);
    CHECK(OID_IS_NULL(refused) && errno == EINVAL);
    CHECK(pmemobj_tx_stage() == TX_STAGE_WORK);
    pmemobj_tx_commit();
    CHECK(pmemobj_tx_end() == 0);
    CHECK(count_objects(pop) == SMALL + 2);
    CHECK(pmemobj_tx_begin(pop, NULL, TX_PARAM_NONE) == 0);
    CHECK(OID_IS_NULL(pmemobj_tx_xalloc(48, 5, POBJ_CLASS_ID(77))));
    CHECK(pmemobj_tx_stage() == TX_STAGE_ONABORT);
    CHECK(pmemobj_tx_end() == EINVAL);
    CHECK(count_objects(pop) == SMALL + 2);

    root->small_id = small.class_id;
    pmemobj_persist(pop, &root->small_id, sizeof root->small_id);
    pmemobj_close(pop);
    CHECK(pmemobj_check(path, LAYOUT) == 1);

    /* Reopened: the classes are still there (libpmemobj would have forgotten both). */
    pop = pmemobj_open(path, NULL);
    CHECK(pop != NULL);
    root = pmemobj_direct(pmemobj_root(pop, 0));
    CHECK(root != NULL && root->small_id == small.class_id);
    char name[64];
    snprintf(name, sizeof name, "heap.alloc_class.%u.desc", small.class_id);
    memset(&got, 0, sizeof got);
    CHECK(pmemobj_ctl_get(pop, name, &got) == 0);
    CHECK(got.unit_size == 48 && got.alignment == 0 &&
          got.units_per_block == small.units_per_block &&
          got.header_type == POBJ_HEADER_NONE && got.class_id == small.class_id);
    CHECK(pmemobj_ctl_get(pop, "heap.alloc_class.128.desc", &got) == 0);
    CHECK(got.unit_size == 4096 && got.alignment == 4096 && got.class_id == 128 &&
          got.header_type == POBJ_HEADER_COMPACT);
    /* Their objects are intact. */
    for (unsigned i = 0; i < SMALL; i++) {
        CHECK(has_pattern(pmemobj_direct(root->small[i]), 48, i + 1));
        CHECK(pmemobj_alloc_usable_size(root->small[i]) == 48);
    }
    CHECK(pmemobj_alloc_usable_size(root->page) == 4096);
    CHECK(count_objects(pop) == SMALL + 2);
    /* Allocating in them needs no registration; re-registering the id is refused. */
    PMEMoid again = OID_NULL;
    CHECK(pmemobj_xalloc(pop, &again, 48, 6, POBJ_CLASS_ID(small.class_id), NULL, NULL) == 0);
    CHECK(pmemobj_alloc_usable_size(again) == 48);
    CHECK(set_fails(pop, name, small, EEXIST));
    struct pobj_alloc_class_desc third = small;
    CHECK(pmemobj_ctl_set(pop, "heap.alloc_class.new.desc", &third) == 0);
    CHECK(third.class_id != small.class_id && third.class_id != 128);
    /* Frees work on objects of every class. */
    pmemobj_free(&again);
    for (unsigned i = 0; i < SMALL; i++)
        pmemobj_free(&root->small[i]);
    pmemobj_free(&root->page);
    pmemobj_free(&root->tx_obj);
    CHECK(count_objects(pop) == 0);
    pmemobj_close(pop);
    CHECK(pmemobj_check(path, LAYOUT) == 1);

    printf("pmemobj_classes: ok\n");
    return 0;
}
