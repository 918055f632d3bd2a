/*
 * memkind_api.c — the memkind-compatible C API of libterrace.so (include/memkind.h), as a
 * memkind program sees it. Run by tests/c_abi.rs with a scratch directory on /dev/shm as
 * argv[1]. Exits 0 when every CHECK holds; otherwise prints the failed check and exits 1.
 */
#include <memkind.h>
#include "check.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static const char *dir;

/* Every byte of [p, p+n) equals b. */
static int all_bytes(const void *p, size_t n, unsigned char b) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        if (c[i] != b)
            return 0;
    return 1;
}

static size_t allocated(memkind_t kind) {
    size_t v = 0;
    CHECK(memkind_update_cached_stats() == MEMKIND_SUCCESS);
    CHECK(memkind_get_stat(kind, MEMKIND_STAT_TYPE_ALLOCATED, &v) == MEMKIND_SUCCESS);
    return v;
}

/* malloc, calloc, realloc, posix_memalign, usable size, detect and free on a PMem kind
 * and on MEMKIND_DEFAULT. */
static void heap_functions(memkind_t pm) {
    /* malloc: usable, owned by the kind, usable size at least what was asked. */
    size_t sizes[] = {1, 8, 100, 4096, 40000, 3 * MiB};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        void *p = memkind_malloc(pm, sizes[i]);
        CHECK(p != NULL);
        memset(p, 0x5a, sizes[i]);
        CHECK(memkind_detect_kind(p) == pm);
        CHECK(memkind_malloc_usable_size(pm, p) >= sizes[i]);
        CHECK(memkind_malloc_usable_size(NULL, p) >= sizes[i]); /* kind is not needed */
        memkind_free(NULL, p);                                   /* NULL kind: owner found */
    }

    /* calloc zeroes, even memory that was just dirtied and freed. */
    void *dirty = memkind_malloc(pm, 64 * 1024);
    CHECK(dirty != NULL);
    memset(dirty, 0xab, 64 * 1024);
    memkind_free(pm, dirty);
    unsigned char *z = memkind_calloc(pm, 1024, 64);
    CHECK(z != NULL);
    CHECK(all_bytes(z, 64 * 1024, 0));
    CHECK(memkind_detect_kind(z) == pm);
    memkind_free(NULL, z);
    z = memkind_calloc(pm, 3, 7); /* small, odd sizes too */
    CHECK(z != NULL && all_bytes(z, 21, 0));
    memkind_free(NULL, z);

    /* realloc keeps the contents when growing (small -> large: the object moves) and when
     * shrinking; realloc(NULL) allocates; a NULL kind resizes within the owner. */
    unsigned char *r = memkind_realloc(pm, NULL, 64);
    CHECK(r != NULL && memkind_detect_kind(r) == pm);
    fill_pattern(r, 64, 1);
    r = memkind_realloc(pm, r, 200000);
    CHECK(r != NULL && memkind_detect_kind(r) == pm);
    CHECK(has_pattern(r, 64, 1));
    fill_pattern(r, 200000, 2);
    r = memkind_realloc(NULL, r, 300000);
    CHECK(r != NULL && memkind_detect_kind(r) == pm);
    CHECK(has_pattern(r, 200000, 2));
    r = memkind_realloc(pm, r, 32);
    CHECK(r != NULL && memkind_detect_kind(r) == pm);
    CHECK(has_pattern(r, 32, 2));
    CHECK(memkind_malloc_usable_size(pm, r) >= 32);
    memkind_free(pm, r);

    /* posix_memalign honours every power-of-two alignment from the pointer size up. */
    size_t aligns[] = {sizeof(void *), 16, 64, 4096, 65536, 2 * MiB};
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
        void *p = NULL;
        CHECK(memkind_posix_memalign(pm, &p, aligns[i], 1000) == 0);
        CHECK(p != NULL);
        CHECK((uintptr_t)p % aligns[i] == 0);
        CHECK(memkind_detect_kind(p) == pm);
        CHECK(memkind_malloc_usable_size(pm, p) >= 1000);
        memset(p, 1, 1000);
        memkind_free(NULL, p);
    }

    /* The default kind: its pointers are detected as MEMKIND_DEFAULT. */
    CHECK(memkind_check_available(MEMKIND_DEFAULT) == 0);
    void *d = memkind_malloc(MEMKIND_DEFAULT, 777);
    CHECK(d != NULL);
    CHECK(memkind_detect_kind(d) == MEMKIND_DEFAULT);
    CHECK(memkind_malloc_usable_size(MEMKIND_DEFAULT, d) >= 777);
    void *da = NULL;
    CHECK(memkind_posix_memalign(MEMKIND_DEFAULT, &da, 256, 10) == 0);
    CHECK(da != NULL && (uintptr_t)da % 256 == 0);
    CHECK(memkind_detect_kind(da) == MEMKIND_DEFAULT);
    memkind_free(MEMKIND_DEFAULT, da);
    memkind_free(NULL, d);

    /* Memory no kind owns: a stack address and a libc malloc pointer are not detected,
     * have usable size 0, and freeing them does nothing (the libc block stays usable). */
    int on_stack = 42;
    CHECK(memkind_detect_kind(&on_stack) == NULL);
    CHECK(memkind_malloc_usable_size(NULL, &on_stack) == 0);
    char *libc_block = malloc(100);
    CHECK(libc_block != NULL);
    CHECK(memkind_detect_kind(libc_block) == NULL);
    CHECK(memkind_malloc_usable_size(NULL, libc_block) == 0);
    memkind_free(NULL, &on_stack);
    memkind_free(pm, &on_stack);
    memkind_free(NULL, libc_block);
    memkind_free(NULL, NULL);
    memkind_free(pm, NULL);
    memset(libc_block, 7, 100);
    free(libc_block);
    CHECK(on_stack == 42);
    CHECK(memkind_detect_kind(NULL) == NULL);
    CHECK(memkind_malloc_usable_size(NULL, NULL) == 0);

    /* Defragmentation never moves anything here. */
    void *f = memkind_malloc(pm, 48);
    CHECK(f != NULL);
    CHECK(memkind_defrag_reallocate(pm, f) == NULL);
    memkind_free(NULL, f);
}

/* Requests that must fail cleanly: NULL with errno, or EINVAL. */
static void bad_requests(memkind_t pm) {
    memkind_t kinds[] = {pm, MEMKIND_DEFAULT};
    for (size_t k = 0; k < 2; k++) {
        /* memkind returns NULL for 0 bytes. */
        CHECK(memkind_malloc(kinds[k], 0) == NULL);

        /* Sizes no kind can hold: NULL with ENOMEM (SIZE_MAX wraps every rounding,
         * SIZE_MAX/2 is the largest "valid" size). calloc's count*size overflow too. */
        errno = 0;
        CHECK(memkind_malloc(kinds[k], SIZE_MAX) == NULL);
        CHECK(errno == ENOMEM);
        errno = 0;
        CHECK(memkind_malloc(kinds[k], SIZE_MAX / 2) == NULL);
        CHECK(errno == ENOMEM);
        errno = 0;
        CHECK(memkind_calloc(kinds[k], SIZE_MAX / 2, 4) == NULL);
        CHECK(errno == ENOMEM);
        errno = 0;
        void *p = memkind_malloc(kinds[k], 16);
        CHECK(p != NULL);
        CHECK(memkind_realloc(kinds[k], p, SIZE_MAX / 2) == NULL); /* p untouched */
        CHECK(errno == ENOMEM);
        CHECK(memkind_detect_kind(p) == kinds[k]);
        memkind_free(NULL, p);

        /* posix_memalign: alignment not a power of two (3), zero, or below the pointer
         * size (4) -> EINVAL, as POSIX requires. */
        size_t bad[] = {3, 0, 4};
        for (size_t i = 0; i < 3; i++) {
            void *q = NULL;
            CHECK(memkind_posix_memalign(kinds[k], &q, bad[i], 64) == EINVAL);
        }
    }

    /* A PMem kind below MEMKIND_PMEM_MIN_SIZE is refused. */
    memkind_t small = NULL;
    CHECK(memkind_create_pmem(dir, MEMKIND_PMEM_MIN_SIZE - 1, &small) == MEMKIND_ERROR_INVALID);
    CHECK(memkind_create_pmem(dir, 4096, &small) == MEMKIND_ERROR_INVALID);

    /* A directory that does not exist: a non-zero error code whose message is non-empty
     * text, NUL-terminated within the buffer, truncated (and still terminated) for tiny
     * buffers, and never written past the given size. */
    char missing[4096];
    snprintf(missing, sizeof missing, "%s/does/not/exist", dir);
    memkind_t none = NULL;
    int err = memkind_create_pmem(missing, 64 * MiB, &none);
    CHECK(err != 0);
    char msg[MEMKIND_ERROR_MESSAGE_SIZE + 16];
    memset(msg, 'X', sizeof msg);
    memkind_error_message(err, msg, MEMKIND_ERROR_MESSAGE_SIZE);
    CHECK(memchr(msg, '\0', MEMKIND_ERROR_MESSAGE_SIZE) != NULL);
    CHECK(strlen(msg) > 0);
    CHECK(msg[MEMKIND_ERROR_MESSAGE_SIZE] == 'X'); /* nothing written past size */
    fprintf(stderr, "message for a missing directory: %s\n", msg);

    char tiny[16];
    memset(tiny, 'X', sizeof tiny);
    memkind_error_message(err, tiny, 8);
    CHECK(tiny[7] == '\0');
    CHECK(strlen(tiny) == 7); /* truncated to size - 1 characters */
    CHECK(tiny[8] == 'X');
    memset(tiny, 'X', sizeof tiny);
    memkind_error_message(err, tiny, 1);
    CHECK(tiny[0] == '\0' && tiny[1] == 'X');
    memkind_error_message(err, tiny, 0); /* size 0 writes nothing */
    CHECK(tiny[0] == '\0' && tiny[1] == 'X');

    /* The detail belongs to the failure that produced it: the directory's path is named in
     * the message for that failure's code, and not appended to an unrelated code. */
    memset(msg, 0, sizeof msg);
    memkind_error_message(err, msg, MEMKIND_ERROR_MESSAGE_SIZE);
    CHECK(strstr(msg, "does/not/exist") != NULL);
    int unrelated = err == MEMKIND_ERROR_TOOMANY ? MEMKIND_ERROR_MBIND : MEMKIND_ERROR_TOOMANY;
    memkind_error_message(unrelated, msg, MEMKIND_ERROR_MESSAGE_SIZE);
    CHECK(strstr(msg, "does/not/exist") == NULL);

    /* Every code has a message (also codes without a failure behind them). */
    int codes[] = {MEMKIND_SUCCESS, MEMKIND_ERROR_UNAVAILABLE, MEMKIND_ERROR_INVALID,
                   MEMKIND_ERROR_TOOMANY, MEMKIND_ERROR_MMAP, -12345};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        memset(msg, 'X', sizeof msg);
        memkind_error_message(codes[i], msg, MEMKIND_ERROR_MESSAGE_SIZE);
        CHECK(memchr(msg, '\0', MEMKIND_ERROR_MESSAGE_SIZE) != NULL && strlen(msg) > 0);
    }

    /* tmpfs is not DAX. */
    CHECK(memkind_check_dax_path("/dev/shm") != 0);
    CHECK(memkind_check_dax_path(missing) != 0);
}

/* Memory from a static kind is reported as that kind, as memkind does, so programs can
 * compare memkind_detect_kind's result with MEMKIND_REGULAR and friends. */
static void static_kinds(void) {
    memkind_t statics[] = {MEMKIND_REGULAR, MEMKIND_LOWEST_LATENCY_LOCAL, MEMKIND_HIGHEST_CAPACITY};
    for (size_t i = 0; i < sizeof statics / sizeof statics[0]; i++) {
        CHECK(memkind_check_available(statics[i]) == 0);
        void *p = memkind_malloc(statics[i], 100);
        CHECK(p != NULL);
        CHECK(memkind_detect_kind(p) == statics[i]);
        memkind_free(NULL, p);
    }
}

/* memkind_realloc(kind, p, 0) frees p and returns NULL; the ALLOCATED statistic follows
 * allocations of 10 MiB up and back down. */
static void statistics(memkind_t pm) {
    size_t before = allocated(pm);
    void *blocks[10];
    for (int i = 0; i < 10; i++) {
        blocks[i] = memkind_malloc(pm, MiB);
        CHECK(blocks[i] != NULL);
    }
    size_t during = allocated(pm);
    CHECK(during >= before + 10 * MiB);
    size_t v = 0;
    CHECK(memkind_get_stat(pm, MEMKIND_STAT_TYPE_ACTIVE, &v) == 0 && v >= 10 * MiB);
    CHECK(memkind_get_stat(pm, MEMKIND_STAT_TYPE_RESIDENT, &v) == 0);
    CHECK(memkind_get_stat(pm, MEMKIND_STAT_TYPE_MAX_VALUE, &v) != 0);
    CHECK(memkind_get_stat(pm, MEMKIND_STAT_TYPE_ALLOCATED, NULL) != 0);

    /* realloc to 0 frees: the statistic drops by the block. */
    CHECK(memkind_realloc(pm, blocks[0], 0) == NULL);
    CHECK(allocated(pm) <= during - MiB);
    for (int i = 1; i < 10; i++)
        memkind_free(NULL, blocks[i]);
    CHECK(allocated(pm) <= before);
}

/* memkind_config_*: a conservative-policy kind created from a configuration. */
static void configuration(void) {
    struct memkind_config *cfg = memkind_config_new();
    CHECK(cfg != NULL);
    memkind_t k = NULL;
    CHECK(memkind_create_pmem_with_config(cfg, &k) != 0); /* no path set yet */
    memkind_config_set_path(cfg, dir);
    memkind_config_set_size(cfg, 32 * MiB);
    memkind_config_set_memory_usage_policy(cfg, MEMKIND_MEM_USAGE_POLICY_CONSERVATIVE);
    CHECK(memkind_create_pmem_with_config(cfg, &k) == MEMKIND_SUCCESS);
    CHECK(k != NULL && memkind_check_available(k) == 0);
    void *p = memkind_malloc(k, 2 * MiB);
    CHECK(p != NULL);
    memset(p, 3, 2 * MiB);
    CHECK(memkind_detect_kind(p) == k);
    memkind_free(NULL, p);
    CHECK(memkind_destroy_kind(k) == MEMKIND_SUCCESS);

    /* The same configuration with a size below the minimum is refused. */
    memkind_config_set_size(cfg, MEMKIND_PMEM_MIN_SIZE / 2);
    CHECK(memkind_create_pmem_with_config(cfg, &k) == MEMKIND_ERROR_INVALID);
    memkind_config_set_size(cfg, 16 * MiB);
    memkind_config_set_memory_usage_policy(cfg, MEMKIND_MEM_USAGE_POLICY_DEFAULT);
    CHECK(memkind_create_pmem_with_config(cfg, &k) == MEMKIND_SUCCESS);
    CHECK(memkind_destroy_kind(k) == MEMKIND_SUCCESS);
    memkind_config_delete(cfg);
    memkind_config_delete(NULL);
}

/* A destroyed kind's handle is refused, not followed. */
static void destroyed_kind(void) {
    memkind_t k = NULL;
    CHECK(memkind_create_pmem(dir, 16 * MiB, &k) == MEMKIND_SUCCESS);
    void *p = memkind_malloc(k, 1000);
    CHECK(p != NULL && memkind_detect_kind(p) == k);
    CHECK(memkind_destroy_kind(k) == MEMKIND_SUCCESS);

    CHECK(memkind_check_available(k) != 0);
    errno = 0;
    CHECK(memkind_malloc(k, 64) == NULL);
    CHECK(errno != 0);
    CHECK(memkind_calloc(k, 1, 64) == NULL);
    void *q = (void *)1;
    CHECK(memkind_posix_memalign(k, &q, 64, 64) != 0);
    CHECK(memkind_realloc(k, NULL, 64) == NULL);
    size_t v;
    CHECK(memkind_get_stat(k, MEMKIND_STAT_TYPE_ALLOCATED, &v) != 0);
    CHECK(memkind_destroy_kind(k) != 0); /* destroying twice is an error, not a crash */

    /* The default kind cannot be destroyed and stays usable. */
    CHECK(memkind_destroy_kind(MEMKIND_DEFAULT) != 0);
    void *d = memkind_malloc(MEMKIND_DEFAULT, 10);
    CHECK(d != NULL);
    memkind_free(NULL, d);
    CHECK(memkind_check_available(MEMKIND_DEFAULT) == 0);

    /* The destroyed kind's memory is gone with it (memkind.h: "freeing a pointer no kind
     * owns (foreign memory, a destroyed kind's memory) does nothing"): not detected, usable
     * size 0, and freeing it does nothing. Last in this test because a failure here is a
     * crash; the line below tells which step crashed. */
    CHECK(memkind_detect_kind(p) == NULL);
    fprintf(stderr, "usable size and free of a destroyed kind's pointer...\n");
    CHECK(memkind_malloc_usable_size(NULL, p) == 0);
    memkind_free(NULL, p);
    fprintf(stderr, "... did nothing, as documented\n");
}

int main(int argc, char **argv) {
    CHECK(argc > 1);
    dir = argv[1];

    CHECK(memkind_get_version() >= 1014000);
    memkind_t pm = NULL;
    CHECK(memkind_create_pmem(dir, 64 * MiB, &pm) == MEMKIND_SUCCESS);
    CHECK(pm != NULL);
    CHECK(pm != MEMKIND_DEFAULT);
    CHECK(memkind_check_available(pm) == 0);

    heap_functions(pm);
    static_kinds();
    bad_requests(pm);
    statistics(pm);
    configuration();
    destroyed_kind();

    CHECK(memkind_destroy_kind(pm) == MEMKIND_SUCCESS);
    printf("memkind_api: ok\n");
    return 0;
}
