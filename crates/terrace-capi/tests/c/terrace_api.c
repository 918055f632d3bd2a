/*
 * terrace_api.c — the native C API of libterrace.so (include/terrace.h). Run by
 * tests/c_abi.rs with a scratch directory on /dev/shm as argv[1]. Exits 0 when every CHECK
 * holds; otherwise prints the failed check and exits 1.
 *
 * Not covered here: a full file system (it needs a small mount, which this test cannot
 * make); the Rust tests of terrace-kinds cover it.
 */
#include <terrace.h>
#include "check.h"

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


static const char *dir;

/* Number of entries in a directory other than "." and "..". */
static int entries(const char *path) {
    DIR *d = opendir(path);
    CHECK(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(d);
    return n;
}

static terrace_kind_t file_kind(const char *path, size_t max_size, unsigned flags) {
    terrace_kind_t k = NULL;
    int rc = terrace_kind_create_file(path, max_size, flags, &k);
    if (rc != 0)
        fprintf(stderr, "terrace_kind_create_file(%s): %d: %s\n", path, rc, terrace_last_error());
    CHECK(rc == 0);
    CHECK(k != NULL);
    return k;
}

/* TERRACE_FILE_KEEP: the named file outlives the kind; without it the kind's file is
 * unlinked and its directory stays empty, during the kind's life and after. */
static void file_locations(void) {
    char kept[4096];
    snprintf(kept, sizeof kept, "%s/kept", dir);
    terrace_kind_t k = file_kind(kept, 16 * MiB, TERRACE_FILE_KEEP);
    char *p = terrace_malloc(k, 4096);
    CHECK(p != NULL && terrace_detect_kind(p) == k);
    memset(p, 0x11, 4096);
    terrace_free(p);
    CHECK(terrace_kind_destroy(k) == 0);
    struct stat st;
    CHECK(stat(kept, &st) == 0);
    CHECK(S_ISREG(st.st_mode));
    CHECK((size_t)st.st_size >= 16 * MiB);
    CHECK(unlink(kept) == 0);

    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s/temp", dir);
    CHECK(mkdir(tmp, 0700) == 0);
    k = file_kind(tmp, 16 * MiB, 0);
    p = terrace_malloc(k, 100000);
    CHECK(p != NULL);
    memset(p, 0x22, 100000);
    CHECK(entries(tmp) == 0); /* unlinked while in use */
    terrace_free(p);
    CHECK(terrace_kind_destroy(k) == 0);
    CHECK(entries(tmp) == 0);
    CHECK(rmdir(tmp) == 0);

    /* The other flags are accepted. */
    k = file_kind(dir, 16 * MiB, TERRACE_FILE_HOLE_PUNCH | TERRACE_FILE_NO_RESERVE_AHEAD);
    p = terrace_malloc(k, 3 * MiB);
    CHECK(p != NULL);
    memset(p, 0x33, 3 * MiB);
    terrace_free(p);
    CHECK(terrace_kind_destroy(k) == 0);
}

/* An ordered unified kind over two 16 MiB file kinds serves from the first member until it
 * is full, then overflows into the second, and fails (NULL, ENOMEM) only when both are
 * full; a round-robin unified kind alternates members. */
static void unified_kinds(void) {
    terrace_kind_t a = file_kind(dir, 16 * MiB, 0);
    terrace_kind_t b = file_kind(dir, 16 * MiB, 0);
    terrace_kind_t members[2] = {a, b};
    terrace_kind_t u = NULL;
    CHECK(terrace_kind_create_unified(members, 2, TERRACE_UNIFIED_ORDERED, &u) == 0);
    CHECK(u != NULL && u != a && u != b);

    terrace_kind_stats_t st;
    CHECK(terrace_kind_stats(u, &st) == 0);
    CHECK(st.capacity == 32 * MiB); /* the members' sum */

    enum { MAX_BLOCKS = 64 };
    void *blocks[MAX_BLOCKS];
    int n = 0, first_b = -1;
    for (;;) {
        CHECK(n < MAX_BLOCKS); /* two 16 MiB kinds cannot hold 64 MiB */
        errno = 0;
        void *p = terrace_malloc(u, MiB);
        if (p == NULL) {
            CHECK(errno == ENOMEM);
            CHECK(strlen(terrace_last_error()) > 0);
            break;
        }
        memset(p, n, MiB); /* the memory is really there */
        terrace_kind_t owner = terrace_detect_kind(p);
        CHECK(owner == a || owner == b); /* objects belong to members, never to u */
        if (owner == b && first_b < 0)
            first_b = n;
        if (first_b >= 0)
            CHECK(owner == b); /* once overflowing, never back: a stays full */
        blocks[n++] = p;
    }
    fprintf(stderr, "ordered unified: %d MiB blocks, %d from the first member\n", n, first_b);
    CHECK(first_b > 0);      /* the first blocks come from the first member */
    CHECK(first_b < n);      /* the later ones from the second */
    CHECK(n >= 21);          /* roughly 2 x 16 MiB minus metadata: more than 20 MiB */
    CHECK(n - first_b >= 8); /* the second member holds its share too */
    CHECK(terrace_kind_stats(u, &st) == 0);
    CHECK(st.allocated >= (uint64_t)n * MiB);

    /* A failed unified request does not break the members: small objects may still fit,
     * and after freeing, the first member serves again. */
    for (int i = 0; i < n; i++) {
        CHECK(((unsigned char *)blocks[i])[MiB - 1] == (unsigned char)i);
        terrace_free(blocks[i]);
    }
    void *again = terrace_malloc(u, MiB);
    CHECK(again != NULL && terrace_detect_kind(again) == a);
    terrace_free(again);
    CHECK(terrace_kind_destroy(u) == 0);
    /* Destroying a unified kind leaves its members alive. */
    void *still = terrace_malloc(a, 100);
    CHECK(still != NULL && terrace_detect_kind(still) == a);
    terrace_free(still);

    /* Round robin: successive allocations alternate between the members. */
    terrace_kind_t rr = NULL;
    CHECK(terrace_kind_create_unified(members, 2, TERRACE_UNIFIED_ROUND_ROBIN, &rr) == 0);
    terrace_kind_t owners[8];
    void *objs[8];
    for (int i = 0; i < 8; i++) {
        objs[i] = terrace_malloc(rr, 256);
        CHECK(objs[i] != NULL);
        owners[i] = terrace_detect_kind(objs[i]);
        CHECK(owners[i] == a || owners[i] == b);
        if (i > 0)
            CHECK(owners[i] != owners[i - 1]);
    }
    for (int i = 0; i < 8; i++)
        terrace_free(objs[i]);
    CHECK(terrace_kind_destroy(rr) == 0);

    /* Bad unified requests: no members, an unknown strategy, a unified member. */
    terrace_kind_t bad = NULL;
    CHECK(terrace_kind_create_unified(members, 0, TERRACE_UNIFIED_ORDERED, &bad) != 0);
    CHECK(terrace_kind_create_unified(NULL, 2, TERRACE_UNIFIED_ORDERED, &bad) != 0);
    CHECK(terrace_kind_create_unified(members, 2, 99, &bad) != 0);
    CHECK(terrace_kind_create_unified(members, 2, TERRACE_UNIFIED_ORDERED, &u) == 0);
    terrace_kind_t nested[2] = {u, a};
    CHECK(terrace_kind_create_unified(nested, 2, TERRACE_UNIFIED_ORDERED, &bad) != 0);
    CHECK(terrace_kind_destroy(u) == 0);

    CHECK(terrace_kind_destroy(a) == 0);
    CHECK(terrace_kind_destroy(b) == 0);
}

/* terrace_realloc into another kind moves the object and keeps its contents. */
static void realloc_across_kinds(void) {
    terrace_kind_t f = file_kind(dir, 16 * MiB, 0);
    terrace_kind_t dflt = terrace_kind_default();
    CHECK(dflt != NULL);

    char *p = terrace_malloc(f, 5000);
    CHECK(p != NULL && terrace_detect_kind(p) == f);
    fill_pattern(p, 5000, 7);
    char *q = terrace_realloc(dflt, p, 8000); /* file -> default, growing */
    CHECK(q != NULL);
    CHECK(terrace_detect_kind(q) == dflt);
    CHECK(has_pattern(q, 5000, 7));
    CHECK(terrace_usable_size(q) >= 8000);
    char *r = terrace_realloc(f, q, 3000); /* default -> file, shrinking */
    CHECK(r != NULL && terrace_detect_kind(r) == f);
    CHECK(has_pattern(r, 3000, 7));
    char *s = terrace_realloc(NULL, r, 1 * MiB); /* NULL kind: stays in the owner */
    CHECK(s != NULL && terrace_detect_kind(s) == f);
    CHECK(has_pattern(s, 3000, 7));
    CHECK(terrace_realloc(NULL, s, 0) == NULL); /* size 0 frees */

    /* NULL kind with a NULL or foreign pointer has no owner to allocate from. */
    int on_stack = 0;
    errno = 0;
    CHECK(terrace_realloc(NULL, NULL, 10) == NULL);
    CHECK(errno == EINVAL);
    CHECK(terrace_realloc(NULL, &on_stack, 10) == NULL);
    CHECK(terrace_kind_destroy(f) == 0);
}

/* NUMA node 0 exists on every Linux machine; node 4000 does not. */
static void numa_kinds(void) {
    terrace_kind_t n0 = NULL;
    int rc = terrace_kind_create_numa(0, &n0);
    if (rc != 0)
        fprintf(stderr, "terrace_kind_create_numa(0): %d: %s\n", rc, terrace_last_error());
    CHECK(rc == 0 && n0 != NULL);
    void *p = terrace_malloc(n0, 123456);
    CHECK(p != NULL && terrace_detect_kind(p) == n0);
    memset(p, 9, 123456);
    terrace_free(p);
    CHECK(terrace_kind_destroy(n0) == 0);

    terrace_kind_t n4000 = NULL;
    errno = 0;
    rc = terrace_kind_create_numa(4000, &n4000);
    CHECK(rc != 0);
    CHECK(rc > 0 && errno == rc); /* positive errno, also stored in errno */
    const char *why = terrace_last_error();
    CHECK(why != NULL && strlen(why) > 0);
    fprintf(stderr, "numa node 4000: %s\n", why);
}

/* Statistics of a file kind: capacity is the requested maximum size; allocated follows. */
static void statistics(void) {
    terrace_kind_t k = file_kind(dir, 48 * MiB, 0);
    terrace_kind_stats_t st;
    CHECK(terrace_kind_stats(k, &st) == 0);
    CHECK(st.capacity == 48 * MiB);
    uint64_t before = st.allocated;
    void *p = terrace_malloc(k, 4 * MiB);
    CHECK(p != NULL);
    CHECK(terrace_kind_stats(k, &st) == 0);
    CHECK(st.allocated >= before + 4 * MiB);
    CHECK(st.active >= 4 * MiB);
    CHECK(st.reserved <= st.capacity);
    terrace_free(p);
    CHECK(terrace_kind_stats(k, &st) == 0);
    CHECK(st.allocated <= before);
    CHECK(terrace_kind_stats(k, NULL) != 0);
    CHECK(terrace_kind_destroy(k) == 0);
    CHECK(terrace_kind_stats(k, &st) != 0); /* a destroyed kind has no statistics */
}

/* The conventions of terrace.h: int results are 0 or a positive errno (also in errno);
 * pointer results are NULL with errno; freeing what no kind owns does nothing. */
static void conventions(void) {
    terrace_kind_t k = NULL;
    errno = 0;
    int rc = terrace_kind_create_file(dir, TERRACE_FILE_KIND_MIN_SIZE - 1, 0, &k);
    CHECK(rc == EINVAL && errno == EINVAL);
    CHECK(strlen(terrace_last_error()) > 0);
    char missing[4096];
    snprintf(missing, sizeof missing, "%s/missing/dir", dir);
    rc = terrace_kind_create_file(missing, 16 * MiB, 0, &k);
    CHECK(rc > 0 && errno == rc);
    CHECK(terrace_kind_create_file(dir, 16 * MiB, 0, NULL) != 0);

    errno = 0;
    CHECK(terrace_malloc(NULL, 10) == NULL);
    CHECK(errno == EINVAL);
    errno = 0;
    CHECK(terrace_malloc(terrace_kind_default(), 0) == NULL);
    CHECK(errno != 0);
    errno = 0;
    CHECK(terrace_calloc(terrace_kind_default(), SIZE_MAX / 8, 16) == NULL);
    CHECK(errno == ENOMEM);

    void *p = (void *)1;
    CHECK(terrace_posix_memalign(terrace_kind_default(), &p, 64, 0) == 0);
    CHECK(p == NULL); /* size 0: NULL and success */
    CHECK(terrace_posix_memalign(terrace_kind_default(), &p, 24, 10) == EINVAL);
    CHECK(terrace_posix_memalign(terrace_kind_default(), &p, 64, 100) == 0);
    CHECK(p != NULL && (uintptr_t)p % 64 == 0);
    terrace_free(p);

    CHECK(terrace_kind_destroy(terrace_kind_default()) != 0); /* static */
    CHECK(terrace_kind_destroy(NULL) != 0);

    int on_stack = 5;
    char *libc_block = malloc(64);
    CHECK(libc_block != NULL);
    terrace_free(NULL);
    terrace_free(&on_stack);
    terrace_free(libc_block);
    CHECK(terrace_usable_size(NULL) == 0);
    CHECK(terrace_usable_size(libc_block) == 0);
    CHECK(terrace_detect_kind(libc_block) == NULL);
    CHECK(terrace_detect_kind(&on_stack) == NULL);
    free(libc_block);

    /* A DRAM kind of its own, and with huge pages. */
    for (int huge = 0; huge < 2; huge++) {
        terrace_kind_t d = NULL;
        CHECK(terrace_kind_create_dram(huge, &d) == 0);
        CHECK(d != terrace_kind_default());
        char *c = terrace_calloc(d, 1000, 1000);
        CHECK(c != NULL && terrace_detect_kind(c) == d);
        for (size_t i = 0; i < 1000 * 1000; i += 4096)
            CHECK(c[i] == 0);
        terrace_free(c);
        CHECK(terrace_kind_destroy(d) == 0);
        CHECK(terrace_malloc(d, 1) == NULL); /* destroyed handles are refused */
        CHECK(terrace_kind_destroy(d) != 0);
    }
}

int main(int argc, char **argv) {
    CHECK(argc > 1);
    dir = argv[1];

    file_locations();
    unified_kinds();
    realloc_across_kinds();
    numa_kinds();
    statistics();
    conventions();

    CHECK(entries(dir) == 0); /* nothing left behind */
    printf("terrace_api: ok\n");
    return 0;
}
