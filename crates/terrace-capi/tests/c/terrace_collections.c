/*
 * terrace_collections.c — terrace_collections.h: an ordered map's put, get (with
 * truncation), replace, remove and length; cursors in both directions with every bound
 * flag against a sorted model; long values out of line; reopen with the map intact;
 * EBUSY for a second open, for closing a map with an open cursor and a pool with an open
 * map; named objects (bind, lookup, unbind); destroy; bad arguments; readers on two
 * threads while one thread writes; a hash map's calls, iteration and EBUSY rules.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "terrace.h"
#include "terrace_pool.h"
#include "terrace_collections.h"

#define KEYS 3000

static void key_of(unsigned i, char out[16]) { snprintf(out, 16, "key%06u", i); }

/* Values of varying length, up to 600 bytes (past the 16-byte inline area). */
static size_t value_of(unsigned i, unsigned gen, unsigned char *out) {
    size_t len = (i * 7u + gen) % 5 == 0 ? 100 + (i % 500) : (i + gen) % 17;
    fill_pattern(out, len, i * 31u + gen);
    return len;
}

/* Walks a cursor and checks it yields exactly keys lo..hi-1 (step +1 or -1) that are
 * present (even keys only, after the removals below). */
static void expect_range(terrace_omap *m, unsigned lo, unsigned hi, int flags, int reverse) {
    char klo[16], khi[16];
    key_of(lo, klo);
    key_of(hi, khi);
    terrace_omap_cursor *c = terrace_omap_cursor_open(m, klo, strlen(klo), khi, strlen(khi),
                                                      flags | (reverse ? TERRACE_OMAP_REVERSE : 0));
    CHECK(c != NULL);
    unsigned first = lo + ((flags & TERRACE_OMAP_LO_EXCLUSIVE) ? 1 : 0);
    unsigned last = (flags & TERRACE_OMAP_HI_INCLUSIVE) ? hi : hi - 1;
    unsigned expect = reverse ? last : first;
    char key[32];
    unsigned char value[1024];
    size_t klen, vlen;
    int got;
    unsigned seen = 0;
    while ((got = terrace_omap_cursor_next(c, key, sizeof key, &klen, value, sizeof value, &vlen)) == 1) {
        while (expect % 2 == 1) expect = reverse ? expect - 1 : expect + 1;
        char want[16];
        key_of(expect, want);
        CHECK(klen == strlen(want) && memcmp(key, want, klen) == 0);
        unsigned char model[1024];
        CHECK(vlen == value_of(expect, 1, model) && memcmp(value, model, vlen) == 0);
        seen++;
        expect = reverse ? expect - 1 : expect + 1;
    }
    CHECK(got == 0);
    unsigned want_count = 0;
    for (unsigned i = first; i <= last && last != UINT32_MAX; i++) want_count += i % 2 == 0;
    CHECK(seen == want_count);
    terrace_omap_cursor_close(c);
}

struct reader {
    terrace_omap *map;
    atomic_int *stop;
    atomic_long checked;
    int failed;
};

/* Values written during the threaded phase are the key repeated, so any torn or foreign
 * value is visible. */
static void *read_loop(void *arg) {
    struct reader *r = arg;
    unsigned seed = 1;
    while (!atomic_load(r->stop)) {
        seed = seed * 1103515245u + 12345u;
        char key[16];
        key_of(seed % 400 + 100000, key);
        char value[64];
        int64_t n = terrace_omap_get(r->map, key, strlen(key), value, sizeof value);
        if (n >= 0) {
            if (n != 3 * (int64_t)strlen(key) || memcmp(value, key, strlen(key)) != 0 ||
                memcmp(value + 2 * strlen(key), key, strlen(key)) != 0)
                r->failed = 1;
            r->checked++;
        } else if (errno != ENOENT) {
            r->failed = 1;
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    char path[4096];
    snprintf(path, sizeof path, "%s/collections.pool", argv[1]);
    unlink(path);
    terrace_pool *p = terrace_pool_create(path, 64 * MiB, "coll");
    CHECK(p != NULL);

    /* Bad arguments. */
    CHECK(terrace_omap_open(p, "m", 16, 16, 0) == NULL && errno == ENOENT);
    CHECK(terrace_omap_open(NULL, "m", 16, 16, TERRACE_OMAP_CREATE) == NULL && errno == EINVAL);
    CHECK(terrace_omap_open(p, NULL, 16, 16, TERRACE_OMAP_CREATE) == NULL && errno == EINVAL);
    CHECK(terrace_omap_open(p, "", 16, 16, TERRACE_OMAP_CREATE) == NULL && errno == EINVAL);
    CHECK(terrace_omap_open(p, "m", 0, 16, TERRACE_OMAP_CREATE) == NULL && errno == EINVAL);
    CHECK(terrace_omap_open(p, "m", 256, 16, TERRACE_OMAP_CREATE) == NULL && errno == EINVAL);
    CHECK(terrace_omap_open(p, "m", 16, 16, 8) == NULL && errno == EINVAL);
    CHECK(strlen(terrace_last_error()) > 0);

    terrace_omap *m = terrace_omap_open(p, "m", 16, 16, TERRACE_OMAP_CREATE);
    CHECK(m != NULL);
    CHECK(terrace_omap_open(p, "m", 16, 16, 0) == NULL && errno == EBUSY);
    CHECK(terrace_omap_len(m) == 0);
    CHECK(terrace_omap_put(m, "0123456789abcdefX", 17, "v", 1) == EINVAL);
    CHECK(terrace_omap_put(m, NULL, 3, "v", 1) == EINVAL);
    CHECK(terrace_omap_put(NULL, "k", 1, "v", 1) == EINVAL);
    CHECK(terrace_omap_get(m, "nope", 4, NULL, 0) == -1 && errno == ENOENT);
    errno = 0;
    CHECK(terrace_omap_find(m, "nope", 4, NULL, 0) == -ENOENT);
    CHECK(terrace_omap_find(NULL, "nope", 4, NULL, 0) == -EINVAL);
    CHECK(terrace_omap_find(m, "0123456789abcdefX", 17, NULL, 0) == -EINVAL);
    CHECK(terrace_omap_remove(m, "nope", 4) == ENOENT);

    /* Puts, replaces (new generation), removes of the odd keys. */
    unsigned char value[1024], got[1024], got2[1024];
    for (unsigned gen = 0; gen < 2; gen++)
        for (unsigned i = 0; i < KEYS; i++) {
            char key[16];
            key_of(i, key);
            size_t len = value_of(i, gen, value);
            CHECK(terrace_omap_put(m, key, strlen(key), value, len) == 0);
        }
    CHECK(terrace_omap_len(m) == KEYS);
    for (unsigned i = 1; i < KEYS; i += 2) {
        char key[16];
        key_of(i, key);
        CHECK(terrace_omap_remove(m, key, strlen(key)) == 0);
    }
    CHECK(terrace_omap_len(m) == KEYS / 2);
    for (unsigned i = 0; i < KEYS; i++) {
        char key[16];
        key_of(i, key);
        int64_t n = terrace_omap_get(m, key, strlen(key), got, sizeof got);
        int64_t found = terrace_omap_find(m, key, strlen(key), got2, sizeof got2);
        if (i % 2) {
            CHECK(n == -1 && errno == ENOENT);
            CHECK(found == -ENOENT);
            continue;
        }
        size_t len = value_of(i, 1, value);
        CHECK(n == (int64_t)len && memcmp(got, value, len) == 0);
        CHECK(found == n && memcmp(got2, value, len) == 0);
        /* Truncation: the full length comes back, cap bytes are copied. */
        if (len > 4) {
            memset(got, 0, sizeof got);
            CHECK(terrace_omap_get(m, key, strlen(key), got, 4) == (int64_t)len);
            CHECK(memcmp(got, value, 4) == 0 && got[4] == 0);
        }
    }

    /* Cursors: every bound flag, both directions. */
    for (int flags = 0; flags < 8; flags += 2)
        for (int rev = 0; rev < 2; rev++) {
            expect_range(m, 10, 500, flags, rev);
            expect_range(m, 1001, 1002, flags, rev);
            expect_range(m, 2990, 2999, flags, rev);
        }
    {
        /* Unbounded: every key, ascending then descending. */
        for (int rev = 0; rev < 2; rev++) {
            terrace_omap_cursor *c = terrace_omap_cursor_open(m, NULL, 0, NULL, 0, rev ? TERRACE_OMAP_REVERSE : 0);
            CHECK(c != NULL);
            char key[32], prev[32] = "";
            size_t klen;
            unsigned n = 0;
            int r;
            while ((r = terrace_omap_cursor_next(c, key, sizeof key - 1, &klen, NULL, 0, NULL)) == 1) {
                key[klen] = 0;
                CHECK(n == 0 || (rev ? strcmp(key, prev) < 0 : strcmp(key, prev) > 0));
                strcpy(prev, key);
                n++;
            }
            CHECK(r == 0 && n == KEYS / 2);
            /* A map with an open cursor stays open. */
            CHECK(terrace_omap_close(m) == EBUSY);
            terrace_omap_cursor_close(c);
        }
    }
    CHECK(terrace_omap_cursor_open(m, NULL, 0, NULL, 0, 64) == NULL && errno == EINVAL);
    CHECK(terrace_omap_cursor_next(NULL, NULL, 0, NULL, NULL, 0, NULL) == -1 && errno == EINVAL);

    /* Named objects. */
    uint64_t obj = terrace_pool_alloc(p, 64, 7, NULL);
    CHECK(obj != 0);
    CHECK(terrace_pool_bind(p, "config", obj) == 0);
    CHECK(terrace_pool_bind(p, "config", obj) == EEXIST);
    CHECK(terrace_pool_bind(p, "other", 12345) != 0);
    CHECK(terrace_pool_lookup(p, "config") == obj);
    CHECK(terrace_pool_lookup(p, "missing") == 0 && errno == ENOENT);
    CHECK(terrace_pool_lookup(p, "m") != 0);
    CHECK(terrace_pool_unbind(p, "m") == 0 && errno == EEXIST);
    CHECK(terrace_omap_open(p, "config", 16, 16, 0) == NULL && errno == EEXIST);

    /* The pool refuses to close under an open map; reopen finds everything. */
    CHECK(terrace_pool_close(p) == EBUSY);
    CHECK(terrace_omap_close(m) == 0);
    CHECK(terrace_pool_close(p) == 0);
    p = terrace_pool_open(path, "coll");
    CHECK(p != NULL);
    CHECK(terrace_pool_lookup(p, "config") == obj);
    CHECK(terrace_omap_open(p, "m", 17, 16, 0) == NULL && errno == EINVAL);
    m = terrace_omap_open(p, "m", 0, 0, 0);
    CHECK(m != NULL);
    CHECK(terrace_omap_len(m) == KEYS / 2);
    expect_range(m, 0, 3000, 0, 1);

    /* Readers on two threads while this thread writes (splits, removes). */
    atomic_int stop = 0;
    struct reader readers[2] = {{m, &stop, 0, 0}, {m, &stop, 0, 0}};
    pthread_t threads[2];
    for (int t = 0; t < 2; t++) CHECK(pthread_create(&threads[t], NULL, read_loop, &readers[t]) == 0);
    /* Writes go on until both readers have read during them (bounded: 10 M rounds). */
    for (unsigned round = 0; round < 20000 || (round < 10000000 &&
                                                (atomic_load(&readers[0].checked) == 0 ||
                                                 atomic_load(&readers[1].checked) == 0));
         round++) {
        char key[16], val[48];
        key_of((round * 7919u) % 400 + 100000, key);
        size_t kl = strlen(key);
        memcpy(val, key, kl);
        memcpy(val + kl, key, kl);
        memcpy(val + 2 * kl, key, kl);
        if (round % 3 == 2)
            CHECK(terrace_omap_remove(m, key, kl) == 0 || errno == ENOENT);
        else
            CHECK(terrace_omap_put(m, key, kl, val, 3 * kl) == 0);
    }
    atomic_store(&stop, 1);
    for (int t = 0; t < 2; t++) {
        CHECK(pthread_join(threads[t], NULL) == 0);
        CHECK(!readers[t].failed);
    }
    CHECK(atomic_load(&readers[0].checked) > 0 && atomic_load(&readers[1].checked) > 0);
    fprintf(stderr, "readers checked %ld and %ld values during the writes\n",
            atomic_load(&readers[0].checked), atomic_load(&readers[1].checked));

    /* A hash map: puts, replaces, removes, iteration against a presence table. */
    terrace_hmap *h = terrace_hmap_open(p, "h", 16, 16, TERRACE_OMAP_CREATE);
    CHECK(h != NULL);
    CHECK(terrace_hmap_open(p, "h", 16, 16, 0) == NULL && errno == EBUSY);
    CHECK(terrace_hmap_open(p, "config", 16, 16, 0) == NULL && errno == EEXIST);
    static unsigned char present[KEYS];
    for (unsigned gen = 0; gen < 2; gen++)
        for (unsigned i = 0; i < KEYS; i++) {
            char key[16];
            key_of(i, key);
            size_t len = value_of(i, gen, value);
            CHECK(terrace_hmap_put(h, key, strlen(key), value, len) == 0);
            present[i] = 1;
        }
    for (unsigned i = 0; i < KEYS; i += 3) {
        char key[16];
        key_of(i, key);
        CHECK(terrace_hmap_remove(h, key, strlen(key)) == 0);
        CHECK(terrace_hmap_remove(h, key, strlen(key)) == ENOENT);
        present[i] = 0;
    }
    unsigned live = 0;
    for (unsigned i = 0; i < KEYS; i++) {
        char key[16];
        key_of(i, key);
        int64_t n = terrace_hmap_get(h, key, strlen(key), got, sizeof got);
        if (!present[i]) {
            CHECK(n == -1 && errno == ENOENT);
            continue;
        }
        live++;
        size_t len = value_of(i, 1, value);
        CHECK(n == (int64_t)len && memcmp(got, value, len) == 0);
    }
    CHECK(terrace_hmap_len(h) == live);
    for (unsigned i = 0; i < KEYS; i++) {
        char key[16];
        key_of(i, key);
        int64_t n = terrace_hmap_find(h, key, strlen(key), got, 4);
        if (!present[i]) {
            CHECK(n == -ENOENT);
            continue;
        }
        size_t len = value_of(i, 1, value);
        CHECK(n == (int64_t)len && memcmp(got, value, len < 4 ? len : 4) == 0);
    }
    /* A handle of the other kind is refused (the C types differ; a cast gets past them). */
    CHECK(terrace_omap_cursor_open((terrace_omap *)h, NULL, 0, NULL, 0, 0) == NULL && errno == EINVAL);
    CHECK(terrace_hmap_iter_open((terrace_hmap *)m) == NULL && errno == EINVAL);
    {
        terrace_hmap_iter *it = terrace_hmap_iter_open(h);
        CHECK(it != NULL);
        CHECK(terrace_hmap_close(h) == EBUSY);
        static unsigned char seen[KEYS];
        char key[32];
        size_t klen, vlen;
        unsigned n = 0;
        int r;
        while ((r = terrace_hmap_iter_next(it, key, sizeof key - 1, &klen, value, sizeof value, &vlen)) == 1) {
            key[klen] = 0;
            unsigned i = (unsigned)strtoul(key + 3, NULL, 10);
            CHECK(i < KEYS && present[i] && !seen[i]);
            seen[i] = 1;
            unsigned char model[1024];
            CHECK(vlen == value_of(i, 1, model) && memcmp(value, model, vlen) == 0);
            n++;
        }
        CHECK(r == 0 && n == live);
        terrace_hmap_iter_close(it);
    }
    CHECK(terrace_hmap_close(h) == 0);
    CHECK(terrace_hmap_destroy(p, "h") == 0);
    CHECK(terrace_hmap_open(p, "h", 16, 16, 0) == NULL && errno == ENOENT);

    /* Arrays: bad arguments, words and runs against a model, EBUSY rules, reopening by
     * name with the stored sizes, destroy only of an array. */
    CHECK(terrace_array_open(p, "a", 0, 8, TERRACE_ARRAY_CREATE) == NULL && errno == EINVAL);
    CHECK(terrace_array_open(p, "a", 10, 4097, TERRACE_ARRAY_CREATE) == NULL && errno == EINVAL);
    CHECK(terrace_array_open(p, "a", 10, 8, 0) == NULL && errno == ENOENT);
    CHECK(terrace_array_open(p, "m", 10, 8, TERRACE_ARRAY_CREATE) == NULL && errno == EEXIST);
    {
        enum { LEN = 100, ELEM = 12 };
        static unsigned char model[LEN * ELEM];
        unsigned char buf[LEN * ELEM];
        terrace_array *a = terrace_array_open(p, "a", LEN, ELEM, TERRACE_ARRAY_CREATE);
        CHECK(a != NULL);
        CHECK(terrace_array_open(p, "a", 0, 0, 0) == NULL && errno == EBUSY);
        CHECK(terrace_array_len(a) == LEN && terrace_array_element_size(a) == ELEM);
        CHECK(terrace_array_len(NULL) == 0 && errno == EINVAL);
        CHECK(terrace_array_get(a, 0, buf, sizeof buf) == 0);
        CHECK(memcmp(buf, model, sizeof buf) == 0);
        for (unsigned n = 0; n < 500; n++) {
            unsigned first = (n * 37) % LEN, count = 1 + n % 4;
            if (first + count > LEN)
                count = LEN - first;
            for (unsigned b = 0; b < count * ELEM; b++)
                buf[b] = (unsigned char)(n + b);
            CHECK(terrace_array_set(a, first, buf, count * ELEM) == 0);
            memcpy(model + first * ELEM, buf, count * ELEM);
        }
        CHECK(terrace_array_get(a, 0, buf, sizeof buf) == 0);
        CHECK(memcmp(buf, model, sizeof buf) == 0);
        CHECK(terrace_array_get(a, 7, buf, ELEM) == 0 && memcmp(buf, model + 7 * ELEM, ELEM) == 0);
        CHECK(terrace_array_get(a, LEN, buf, ELEM) == EINVAL);
        CHECK(terrace_array_get(a, LEN - 1, buf, 2 * ELEM) == EINVAL);
        CHECK(terrace_array_get(a, 0, buf, ELEM + 1) == EINVAL);
        CHECK(terrace_array_get(a, 0, NULL, ELEM) == EINVAL);
        CHECK(terrace_array_set(a, 0, buf, 0) == EINVAL);
        CHECK(terrace_array_set(a, LEN, buf, ELEM) == EINVAL);
        CHECK(terrace_array_destroy(p, "a") == EBUSY);
        CHECK(terrace_array_destroy(p, "m") == EEXIST);
        CHECK(terrace_omap_destroy(p, "a") == EEXIST && terrace_hmap_destroy(p, "a") == EEXIST);
        CHECK(terrace_pool_close(p) == EBUSY);
        CHECK(terrace_array_close(a) == 0);
        a = terrace_array_open(p, "a", LEN, 0, 0);
        CHECK(a != NULL && terrace_array_element_size(a) == ELEM);
        CHECK(terrace_array_get(a, 0, buf, sizeof buf) == 0 && memcmp(buf, model, sizeof buf) == 0);
        CHECK(terrace_array_close(a) == 0);
        CHECK(terrace_array_open(p, "a", LEN + 1, 0, 0) == NULL && errno == EINVAL);

        terrace_array *w = terrace_array_open(p, "w", 4, 8, TERRACE_ARRAY_CREATE);
        CHECK(w != NULL);
        uint64_t word = 0x0123456789abcdefULL, back = 0;
        CHECK(terrace_array_set(w, 3, &word, 8) == 0);
        CHECK(terrace_array_get(w, 3, &back, 8) == 0 && back == word);
        CHECK(terrace_array_close(w) == 0);
        CHECK(terrace_array_destroy(p, "w") == 0);
        CHECK(terrace_array_destroy(p, "w") == ENOENT);
        CHECK(terrace_pool_lookup(p, "a") != 0);
    }

    /* Destroy: refused while open, then the name is gone and the pool checks clean. */
    CHECK(terrace_omap_destroy(p, "m") == EBUSY);
    CHECK(terrace_omap_close(m) == 0);
    CHECK(terrace_omap_destroy(p, "m") == 0);
    CHECK(terrace_pool_lookup(p, "m") == 0 && errno == ENOENT);
    CHECK(terrace_omap_destroy(p, "m") == ENOENT);
    CHECK(terrace_pool_unbind(p, "config") == obj);
    CHECK(terrace_pool_close(p) == 0);
    /* The array stays bound (and the pool checks clean with it), and opens again. */
    p = terrace_pool_open(path, "coll");
    CHECK(p != NULL);
    {
        terrace_array *a = terrace_array_open(p, "a", 0, 0, 0);
        CHECK(a != NULL && terrace_array_len(a) == 100);
        CHECK(terrace_array_close(a) == 0);
    }
    CHECK(terrace_pool_close(p) == 0);
    CHECK(terrace_pool_check(path, "coll") == 0);
    unlink(path);
    printf("terrace_collections: ok\n");
    return 0;
}
