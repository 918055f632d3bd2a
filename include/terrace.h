/*
 * terrace.h — the native C API of Terrace's volatile heterogeneous heaps (kinds).
 *
 * Link with -lterrace. A kind is a heap on one medium (DRAM, a file on a DAX/tmpfs/disk
 * file system, a NUMA node) or a unified heap over several kinds that overflows from one
 * to the next before failing. Any thread may allocate from and free into any kind.
 *
 * Conventions: functions returning int give 0 or a positive errno value (also stored in
 * errno); functions returning pointers give NULL with errno set. terrace_last_error()
 * describes the last failure on the calling thread. Freeing a pointer that no kind owns
 * (NULL, foreign memory, memory of a destroyed kind) does nothing. An internal error (a
 * bug in Terrace) is a failure like any other, with errno EIO: no call aborts the process.
 */
#ifndef TERRACE_H
#define TERRACE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque kind handle; never dereference it. NULL is never a valid kind. */
typedef struct terrace_kind *terrace_kind_t;

/* Flags of terrace_kind_create_file. */
#define TERRACE_FILE_KEEP 1u              /* path is a file to create and keep, not a directory */
#define TERRACE_FILE_HOLE_PUNCH 2u        /* give freed memory back to the file system */
#define TERRACE_FILE_NO_RESERVE_AHEAD 4u  /* reserve file blocks only on demand */

/* Smallest max_size of a file kind. */
#define TERRACE_FILE_KIND_MIN_SIZE ((size_t)16 << 20)

/* Strategies of unified kinds. */
#define TERRACE_UNIFIED_ROUND_ROBIN 0
#define TERRACE_UNIFIED_ORDERED 1
#define TERRACE_UNIFIED_NUMA_LOCAL 2

typedef struct terrace_kind_stats {
    uint64_t allocated; /* bytes in live allocations (size-class rounded) */
    uint64_t active;    /* bytes of pages holding live allocations */
    uint64_t resident;  /* bytes physically resident (upper bound) */
    uint64_t capacity;  /* the most the kind can hold */
    uint64_t reserved;  /* file blocks reserved so far (0 for anonymous media) */
} terrace_kind_stats_t;

terrace_kind_t terrace_kind_default(void);
int terrace_kind_create_file(const char *path, size_t max_size, unsigned flags, terrace_kind_t *out);
int terrace_kind_create_dram(int huge_pages, terrace_kind_t *out);
int terrace_kind_create_numa(unsigned node, terrace_kind_t *out);
int terrace_kind_create_unified(const terrace_kind_t *members, size_t count, int strategy,
                                terrace_kind_t *out);
int terrace_kind_destroy(terrace_kind_t kind);
int terrace_kind_stats(terrace_kind_t kind, terrace_kind_stats_t *out);

void *terrace_malloc(terrace_kind_t kind, size_t size);
void *terrace_calloc(terrace_kind_t kind, size_t count, size_t size);
/* kind NULL: resize within the kind owning ptr. ptr NULL: allocate. size 0: free, NULL. */
void *terrace_realloc(terrace_kind_t kind, void *ptr, size_t size);
int terrace_posix_memalign(terrace_kind_t kind, void **out, size_t alignment, size_t size);
void terrace_free(void *ptr);
size_t terrace_usable_size(const void *ptr);
terrace_kind_t terrace_detect_kind(const void *ptr);

const char *terrace_last_error(void);

#ifdef __cplusplus
}
#endif
#endif /* TERRACE_H */
