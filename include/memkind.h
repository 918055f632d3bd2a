/*
 * memkind.h — the memkind-compatible subset of Terrace (libterrace.so).
 *
 * Programs written for memkind 1.14 that use the functions below recompile unchanged:
 *     cc prog.c -Iinclude -Ltarget/release -lterrace
 *
 * Differences from memkind worth knowing:
 * - memkind_free(kind, ptr) ignores kind and finds the owner; freeing a pointer no kind
 *   owns (foreign memory, a destroyed kind's memory) does nothing;
 * - up to 4,095 kinds of any mix exist at once (memkind runs out after a few dozen PMem
 *   kinds);
 * - a full file system makes an allocation return NULL, never SIGBUS; file systems without
 *   hole punching work;
 * - MEMKIND_LOWEST_LATENCY_LOCAL and MEMKIND_DAX_KMEM overflow to farther nodes instead of
 *   failing when the nearest node is full; MEMKIND_DAX_KMEM uses the CPU-less nodes, or
 *   the nodes MEMKIND_DAX_KMEM_NODES lists (as in memkind; a bad list makes it unavailable);
 * - memkind_defrag_reallocate always returns NULL (nothing to move);
 * - an internal error (a bug in Terrace) is a failure, never an abort: NULL or
 *   MEMKIND_ERROR_RUNTIME (MEMKIND_ERROR_UNAVAILABLE from memkind_check_available), errno EIO.
 */
#ifndef MEMKIND_H
#define MEMKIND_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct memkind *memkind_t;
struct memkind_config;

extern memkind_t MEMKIND_DEFAULT;
extern memkind_t MEMKIND_REGULAR;
extern memkind_t MEMKIND_HIGHEST_CAPACITY;
extern memkind_t MEMKIND_HIGHEST_CAPACITY_LOCAL;
extern memkind_t MEMKIND_LOWEST_LATENCY_LOCAL;
extern memkind_t MEMKIND_DAX_KMEM;
extern memkind_t MEMKIND_DAX_KMEM_ALL;

#define MEMKIND_PMEM_MIN_SIZE (1024 * 1024 * 16)

enum memkind_const {
    MEMKIND_MAX_KIND = 4095,
    MEMKIND_ERROR_MESSAGE_SIZE = 128,
    MEMKIND_NAME_LENGTH = 64
};

enum {
    MEMKIND_SUCCESS = 0,
    MEMKIND_ERROR_UNAVAILABLE = -1,
    MEMKIND_ERROR_MBIND = -2,
    MEMKIND_ERROR_MMAP = -3,
    MEMKIND_ERROR_MALLOC = -6,
    MEMKIND_ERROR_INVALID = -13,
    MEMKIND_ERROR_TOOMANY = -15,
    MEMKIND_ERROR_MEMTYPE_NOT_AVAILABLE = -20,
    MEMKIND_ERROR_OPERATION_FAILED = -21,
    MEMKIND_ERROR_ARENAS_CREATE = -22,
    MEMKIND_ERROR_RUNTIME = -255
};

typedef enum memkind_mem_usage_policy {
    MEMKIND_MEM_USAGE_POLICY_DEFAULT = 0,
    MEMKIND_MEM_USAGE_POLICY_CONSERVATIVE = 1,
    MEMKIND_MEM_USAGE_POLICY_MAX_VALUE
} memkind_mem_usage_policy;

typedef enum memkind_stat_type {
    MEMKIND_STAT_TYPE_RESIDENT = 0,
    MEMKIND_STAT_TYPE_ACTIVE = 1,
    MEMKIND_STAT_TYPE_ALLOCATED = 2,
    MEMKIND_STAT_TYPE_MAX_VALUE
} memkind_stat_type;

/* Kind management. */
int memkind_create_pmem(const char *dir, size_t max_size, memkind_t *kind);
int memkind_create_pmem_with_config(struct memkind_config *cfg, memkind_t *kind);
struct memkind_config *memkind_config_new(void);
void memkind_config_delete(struct memkind_config *cfg);
void memkind_config_set_path(struct memkind_config *cfg, const char *pmem_dir);
void memkind_config_set_size(struct memkind_config *cfg, size_t pmem_size);
void memkind_config_set_memory_usage_policy(struct memkind_config *cfg,
                                            memkind_mem_usage_policy policy);
int memkind_check_dax_path(const char *pmem_dir);
int memkind_destroy_kind(memkind_t kind);
int memkind_check_available(memkind_t kind);
void memkind_error_message(int err, char *msg, size_t size);
int memkind_get_version(void);

/* Heap management. */
void *memkind_malloc(memkind_t kind, size_t size);
void *memkind_calloc(memkind_t kind, size_t num, size_t size);
int memkind_posix_memalign(memkind_t kind, void **memptr, size_t alignment, size_t size);
void *memkind_realloc(memkind_t kind, void *ptr, size_t size);
void memkind_free(memkind_t kind, void *ptr);
size_t memkind_malloc_usable_size(memkind_t kind, void *ptr);
memkind_t memkind_detect_kind(void *ptr);
void *memkind_defrag_reallocate(memkind_t kind, void *ptr);

/* Statistics. */
int memkind_update_cached_stats(void);
int memkind_get_stat(memkind_t kind, memkind_stat_type stat, size_t *value);

#ifdef __cplusplus
}
#endif
#endif /* MEMKIND_H */
