/*
 * cache.c — terrace_cache.h: every function, its errors and bad input, a pinned guard
 * that blocks close (EBUSY), two threads getting and setting at once, and a warm restart
 * (close, reopen the same directory: every item back, from the DRAM and the file tier).
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "terrace.h"
#include "terrace_cache.h"

#define TIERS "dram:16MiB,file:32MiB"
#define K(s) (s), strlen(s)

static terrace_cache *cache;

/* Whether key holds exactly value (and flags, unless NULL). */
static int holds(terrace_cache *c, const char *key, const char *value, const uint32_t *flags) {
    char buf[256];
    size_t len = 0;
    uint32_t f = 0;
    if (terrace_cache_get(c, K(key), buf, sizeof buf, &len, &f, NULL) != 0)
        return 0;
    return len == strlen(value) && memcmp(buf, value, len) == 0 && (!flags || *flags == f);
}

struct worker {
    int id;
    int failures;
};

static void *work(void *arg) {
    struct worker *w = arg;
    char key[64], value[64], buf[64];
    for (int i = 0; i < 5000; i++) {
        snprintf(key, sizeof key, "t%d:%d", w->id, i % 300);
        snprintf(value, sizeof value, "value %d of %d", i, w->id);
        if (terrace_cache_set(cache, K(key), K(value), (uint32_t)w->id, 0, NULL) != 0)
            w->failures++;
        size_t len = 0;
        if (terrace_cache_get(cache, K(key), buf, sizeof buf, &len, NULL, NULL) != 0 ||
            len != strlen(value) || memcmp(buf, value, len) != 0)
            w->failures++;
        /* the other thread's keys: a hit of its own value or a miss, never garbage */
        snprintf(key, sizeof key, "t%d:%d", 1 - w->id, i % 300);
        int r = terrace_cache_get(cache, K(key), buf, sizeof buf, &len, NULL, NULL);
        if (r != 0 && r != ENOENT)
            w->failures++;
        if (r == 0 && (len < 8 || memcmp(buf, "value ", 6) != 0))
            w->failures++;
        terrace_cache_guard *g = NULL;
        if (terrace_cache_pin(cache, K("shared"), &g) != 0)
            w->failures++;
        size_t glen = 0;
        const char *v = terrace_cache_guard_value(g, &glen);
        if (v == NULL || glen != 6 || memcmp(v, "shared", 6) != 0)
            w->failures++;
        terrace_cache_release(g);
    }
    return NULL;
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/cache", argv[1]);

    /* Opening: bad input. */
    CHECK(terrace_cache_open(NULL, dir, 0) == NULL && errno == EINVAL);
    CHECK(terrace_cache_open("ssd:16MiB", dir, 0) == NULL && errno == EINVAL);
    CHECK(strlen(terrace_last_error()) > 0);
    CHECK(terrace_cache_open("dram:1,file:3", dir, 0) == NULL && errno == EINVAL); /* ratios, no capacity */
    CHECK(terrace_cache_open("file:32MiB", NULL, 0) == NULL && errno == EINVAL);
    CHECK(terrace_cache_open("dram:1MiB", NULL, 0) == NULL && errno == EINVAL); /* too small */
    CHECK(strstr(terrace_last_error(), "at least") != NULL);

    /* A DRAM-only cache opened by ratio. */
    terrace_cache *d = terrace_cache_open("dram:1", NULL, 16 * MiB);
    CHECK(d != NULL);
    CHECK(terrace_cache_set(d, K("a"), K("1"), 0, 0, NULL) == 0);
    CHECK(terrace_cache_close(d) == 0);
    CHECK(terrace_cache_close(NULL) == 0);

    cache = terrace_cache_open(TIERS, dir, 0);
    CHECK(cache != NULL);
    terrace_cache *c = cache;

    /* set, get, flags, CAS. */
    uint64_t cas1 = 0, cas2 = 0, cas = 0;
    uint32_t flags = 0;
    CHECK(terrace_cache_set(c, K("k"), K("hello"), 42, 0, &cas1) == 0 && cas1 != 0);
    char buf[64];
    size_t len = 0;
    CHECK(terrace_cache_get(c, K("k"), buf, sizeof buf, &len, &flags, &cas) == 0);
    CHECK(len == 5 && memcmp(buf, "hello", 5) == 0 && flags == 42 && cas == cas1);
    CHECK(terrace_cache_get(c, K("k"), buf, sizeof buf, NULL, NULL, NULL) == 0);
    /* a buffer too small: ENOSPC with the size needed, then a retry */
    len = 0;
    CHECK(terrace_cache_get(c, K("k"), buf, 2, &len, NULL, NULL) == ENOSPC && len == 5);
    CHECK(terrace_cache_get(c, K("k"), NULL, 0, &len, NULL, NULL) == ENOSPC && len == 5);
    CHECK(terrace_cache_get(c, K("k"), buf, len, &len, NULL, NULL) == 0);
    CHECK(terrace_cache_get(c, K("missing"), buf, sizeof buf, &len, NULL, NULL) == ENOENT);
    CHECK(errno == ENOENT);
    /* an empty value */
    CHECK(terrace_cache_set(c, K("empty"), NULL, 0, 7, 0, NULL) == 0);
    CHECK(terrace_cache_get(c, K("empty"), NULL, 0, &len, &flags, NULL) == 0 && len == 0 &&
          flags == 7);

    /* add, replace, cas. */
    CHECK(terrace_cache_add(c, K("k"), K("x"), 0, 0, NULL) == EEXIST);
    CHECK(terrace_cache_add(c, K("new"), K("n"), 1, 0, NULL) == 0);
    CHECK(holds(c, "new", "n", NULL));
    CHECK(terrace_cache_replace(c, K("absent"), K("x"), 0, 0, NULL) == ENOENT);
    CHECK(terrace_cache_replace(c, K("new"), K("n2"), 2, 0, NULL) == 0);
    flags = 2;
    CHECK(holds(c, "new", "n2", &flags));
    CHECK(terrace_cache_cas(c, K("k"), K("bye"), 0, 0, cas1 + 1, NULL) == EEXIST);
    CHECK(terrace_cache_cas(c, K("absent"), K("bye"), 0, 0, cas1, NULL) == ENOENT);
    CHECK(terrace_cache_cas(c, K("k"), K("bye"), 43, 0, cas1, &cas2) == 0 && cas2 != cas1);
    flags = 43;
    CHECK(holds(c, "k", "bye", &flags));
    CHECK(terrace_cache_cas(c, K("k"), K("again"), 0, 0, cas1, NULL) == EEXIST);

    /* delete, touch, TTLs. */
    CHECK(terrace_cache_delete(c, K("new")) == 0);
    CHECK(terrace_cache_delete(c, K("new")) == ENOENT);
    CHECK(!holds(c, "new", "n2", NULL));
    CHECK(terrace_cache_touch(c, K("absent"), 10) == ENOENT);
    CHECK(terrace_cache_set(c, K("short"), K("s"), 0, 1, NULL) == 0);
    CHECK(terrace_cache_set(c, K("touched"), K("t"), 0, 1, NULL) == 0);
    CHECK(terrace_cache_get(c, K("touched"), NULL, 0, NULL, NULL, &cas1) == ENOSPC);
    CHECK(terrace_cache_touch(c, K("touched"), 0) == 0); /* never expires now */
    CHECK(terrace_cache_get(c, K("touched"), buf, sizeof buf, NULL, NULL, &cas2) == 0);
    CHECK(cas2 == cas1); /* touch keeps the CAS */
    CHECK(holds(c, "short", "s", NULL));
    sleep(3);
    CHECK(!holds(c, "short", "s", NULL));
    CHECK(holds(c, "touched", "t", NULL));

    /* incr, decr. */
    uint64_t n = 0;
    CHECK(terrace_cache_set(c, K("n"), K("10"), 0, 0, NULL) == 0);
    CHECK(terrace_cache_incr(c, K("n"), 5, &n) == 0 && n == 15);
    CHECK(terrace_cache_decr(c, K("n"), 100, &n) == 0 && n == 0);
    CHECK(terrace_cache_incr(c, K("n"), UINT64_MAX, NULL) == 0);
    CHECK(terrace_cache_incr(c, K("n"), 1, &n) == 0 && n == 0); /* wraps */
    CHECK(terrace_cache_incr(c, K("absent"), 1, &n) == ENOENT);
    CHECK(terrace_cache_decr(c, K("k"), 1, &n) == EINVAL); /* "bye" is not a number */
    CHECK(strlen(terrace_last_error()) > 0);

    /* Bad input: never a crash. */
    char longkey[300];
    memset(longkey, 'x', sizeof longkey);
    CHECK(terrace_cache_set(c, longkey, 251, K("v"), 0, 0, NULL) == EINVAL);
    CHECK(strstr(terrace_last_error(), "longer") != NULL);
    CHECK(terrace_cache_set(c, longkey, 250, K("v"), 0, 0, NULL) == 0);
    CHECK(terrace_cache_get(c, longkey, 251, buf, sizeof buf, &len, NULL, NULL) == EINVAL);
    CHECK(terrace_cache_set(NULL, K("k"), K("v"), 0, 0, NULL) == EINVAL);
    CHECK(terrace_cache_set(c, NULL, 3, K("v"), 0, 0, NULL) == EINVAL);
    CHECK(terrace_cache_set(c, "k", 0, K("v"), 0, 0, NULL) == EINVAL);
    CHECK(terrace_cache_set(c, K("k"), NULL, 3, 0, 0, NULL) == EINVAL);
    CHECK(terrace_cache_get(NULL, K("k"), buf, sizeof buf, &len, NULL, NULL) == EINVAL);
    CHECK(terrace_cache_get(c, K("k"), NULL, 64, &len, NULL, NULL) == EINVAL);
    CHECK(terrace_cache_add(NULL, K("k"), K("v"), 0, 0, NULL) == EINVAL);
    CHECK(terrace_cache_replace(c, NULL, 1, K("v"), 0, 0, NULL) == EINVAL);
    CHECK(terrace_cache_cas(c, NULL, 1, K("v"), 0, 0, 1, NULL) == EINVAL);
    CHECK(terrace_cache_delete(NULL, K("k")) == EINVAL);
    CHECK(terrace_cache_delete(c, longkey, 251) == EINVAL);
    CHECK(terrace_cache_touch(c, NULL, 0, 0) == EINVAL);
    CHECK(terrace_cache_incr(NULL, K("n"), 1, &n) == EINVAL);
    CHECK(terrace_cache_decr(c, longkey, 251, 1, &n) == EINVAL);
    CHECK(terrace_cache_flush_all(NULL) == EINVAL);
    CHECK(terrace_cache_stats(NULL, NULL) == EINVAL);
    terrace_cache_guard *g = (terrace_cache_guard *)&n;
    CHECK(terrace_cache_pin(c, K("k"), NULL) == EINVAL);
    CHECK(terrace_cache_pin(NULL, K("k"), &g) == EINVAL && g == NULL);
    CHECK(terrace_cache_guard_value(NULL, &len) == NULL && errno == EINVAL && len == 0);
    CHECK(terrace_cache_guard_flags(NULL) == 0 && errno == EINVAL);
    CHECK(terrace_cache_guard_cas(NULL) == 0 && errno == EINVAL);
    terrace_cache_release(NULL);
    /* a value over the 1 MiB limit */
    char *big = calloc(1, 2 * MiB);
    CHECK(big != NULL);
    CHECK(terrace_cache_set(c, K("big"), big, 2 * MiB, 0, 0, NULL) == E2BIG);
    CHECK(terrace_cache_set(c, K("big"), big, MiB / 2, 0, 0, NULL) == 0);
    len = 0;
    CHECK(terrace_cache_get(c, K("big"), big, 2 * MiB, &len, NULL, NULL) == 0 && len == MiB / 2);
    free(big);

    /* Pinned guards: zero-copy, stable under overwrite, and they block close. */
    CHECK(terrace_cache_set(c, K("pinned"), K("before"), 9, 0, &cas1) == 0);
    CHECK(terrace_cache_pin(c, K("missing"), &g) == ENOENT && g == NULL);
    terrace_cache_guard *g1 = NULL, *g2 = NULL;
    CHECK(terrace_cache_pin(c, K("pinned"), &g1) == 0 && g1 != NULL);
    CHECK(terrace_cache_pin(c, K("k"), &g2) == 0 && g2 != NULL);
    const char *v = terrace_cache_guard_value(g1, &len);
    CHECK(len == 6 && memcmp(v, "before", 6) == 0);
    CHECK(terrace_cache_guard_flags(g1) == 9 && terrace_cache_guard_cas(g1) == cas1);
    CHECK(terrace_cache_guard_value(g2, NULL) != NULL);
    CHECK(terrace_cache_set(c, K("pinned"), K("after!"), 0, 0, NULL) == 0);
    CHECK(memcmp(v, "before", 6) == 0); /* the pinned copy is untouched */
    CHECK(holds(c, "pinned", "after!", NULL));
    CHECK(terrace_cache_close(c) == EBUSY);
    CHECK(strstr(terrace_last_error(), "2 pinned") != NULL);
    terrace_cache_release(g1);
    CHECK(terrace_cache_close(c) == EBUSY);
    terrace_cache_release(g2);
    CHECK(holds(c, "pinned", "after!", NULL)); /* still open after EBUSY */

    /* Two threads at once. */
    CHECK(terrace_cache_set(c, K("shared"), K("shared"), 0, 0, NULL) == 0);
    pthread_t threads[2];
    struct worker workers[2] = {{0, 0}, {1, 0}};
    for (int i = 0; i < 2; i++)
        CHECK(pthread_create(&threads[i], NULL, work, &workers[i]) == 0);
    for (int i = 0; i < 2; i++) {
        CHECK(pthread_join(threads[i], NULL) == 0);
        CHECK(workers[i].failures == 0);
    }

    /* Statistics. */
    struct terrace_cache_stats st;
    CHECK(terrace_cache_stats(c, &st) == 0);
    CHECK(st.tier_count == 2 && st.items >= 600 && st.bytes > 0);
    CHECK(st.hits > 20000 && st.misses >= 3 && st.sets > 10000 && st.deletes >= 1);
    CHECK(st.tiers[0].items + st.tiers[1].items == st.items);
    CHECK(st.tiers[0].segments == 8 && st.tiers[1].segments == 16);
    CHECK(terrace_cache_stats(c, NULL) == EINVAL);

    /* Warm restart: close, reopen the same directory, everything back. */
    uint64_t items = st.items;
    CHECK(terrace_cache_get(c, K("pinned"), NULL, 0, NULL, NULL, &cas1) == ENOSPC);
    CHECK(terrace_cache_close(c) == 0);
    CHECK(terrace_cache_open("dram:16MiB,file:64MiB", dir, 0) == NULL); /* another size */
    CHECK(strlen(terrace_last_error()) > 0);
    cache = c = terrace_cache_open(TIERS, dir, 0);
    CHECK(c != NULL);
    CHECK(terrace_cache_stats(c, &st) == 0 && st.items + 1 >= items); /* "short" may go */
    flags = 43;
    CHECK(holds(c, "k", "bye", &flags));
    CHECK(holds(c, "pinned", "after!", NULL));
    CHECK(holds(c, "touched", "t", NULL));
    CHECK(terrace_cache_get(c, K("pinned"), NULL, 0, NULL, NULL, &cas2) == ENOSPC && cas2 == cas1);
    CHECK(terrace_cache_get(c, longkey, 250, buf, sizeof buf, &len, NULL, NULL) == 0);
    CHECK(!holds(c, "new", "n2", NULL)); /* deleted stays deleted */
    char key[64], value[64];
    for (int i = 0; i < 300; i++) {
        snprintf(key, sizeof key, "t0:%d", i);
        snprintf(value, sizeof value, "value %d of 0", i < 200 ? 4800 + i : 4500 + i);
        CHECK(holds(c, key, value, NULL));
    }

    /* flush_all empties it. */
    CHECK(terrace_cache_flush_all(c) == 0);
    CHECK(!holds(c, "k", "bye", NULL));
    CHECK(terrace_cache_stats(c, &st) == 0 && st.items == 0);
    CHECK(terrace_cache_close(c) == 0);

    printf("cache: ok\n");
    return 0;
}
