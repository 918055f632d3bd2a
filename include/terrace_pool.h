/*
 * terrace_pool.h — the native C API of Terrace's persistent pool (crash-consistent
 * objects in a file, addressed by offsets so they survive remapping).
 *
 * Link with -lterrace. Objects are named by 64-bit pool offsets (0 is the null object);
 * terrace_pool_direct turns one into an address valid while the pool is open.
 *
 * Destinations: the allocation functions take a `uint64_t *dest`. When dest points into
 * the pool, the new object's offset is stored there crash-atomically with the allocation
 * (after a crash, the object is allocated and published, or neither); the free functions
 * clear it the same way. A dest in volatile memory is simply written after the call; NULL
 * means the caller keeps the returned offset (it leaks if the process crashes first).
 *
 * Conventions (as terrace.h): functions returning int give 0 or a positive errno value
 * (also stored in errno); functions returning an offset give 0, and functions returning a
 * pointer NULL, with errno set. terrace_last_error() (terrace.h) describes the last
 * failure on the calling thread. An internal error (a bug in Terrace) is a failure with
 * errno EIO and, inside a transaction, aborts it.
 *
 * Transactions: at most one per thread (terrace_pool_tx_begin inside one nests, flattened:
 * the outermost commit makes the work durable, any abort aborts the whole). A failing
 * operation inside a transaction aborts it; its commit then returns that error.
 */
#ifndef TERRACE_POOL_H
#define TERRACE_POOL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque open pool. */
typedef struct terrace_pool terrace_pool;

/* terrace_pool_first/foreach: objects of every type (the root excluded). */
#define TERRACE_POOL_ANY_TYPE UINT64_MAX

struct terrace_pool_stats {
    uint64_t pool_size;       /* bytes of the pool file */
    uint64_t heap_bytes;      /* bytes of heap pages */
    uint64_t free_bytes;      /* bytes in free pages */
    uint64_t allocated_bytes; /* bytes handed out to objects */
    uint64_t run_slack_bytes; /* bytes of runs not holding objects */
    uint64_t runs;            /* runs (pages of small objects) */
    uint64_t extents;         /* extents (large objects) */
};

/* ---- pools ---- */

/* Creates a pool file of size bytes (layout NULL: ""). NULL on error (EEXIST, EINVAL, ...). */
terrace_pool *terrace_pool_create(const char *path, size_t size, const char *layout);
/* Opens (recovering if needed) a pool; layout NULL accepts any. NULL on error
 * (ENOENT missing file, EINVAL wrong layout or not a pool, ...). */
terrace_pool *terrace_pool_open(const char *path, const char *layout);
/* Closes pool (NULL: nothing). EBUSY (pool stays open) while a transaction is active on it. */
int terrace_pool_close(terrace_pool *pool);
/* Opens and verifies a closed pool file: 0 if consistent, else an errno value with the
 * reason in terrace_last_error(). */
int terrace_pool_check(const char *path, const char *layout);

/* The root object, at least size bytes: allocated zeroed on first request, grown (contents
 * kept) for a larger size. size 0: the existing root or 0. 0 on error. */
uint64_t terrace_pool_root(terrace_pool *pool, size_t size);
/* The root's requested size (0 if none). */
size_t terrace_pool_root_size(terrace_pool *pool);
/* The address of offset off (NULL for 0; NULL with EINVAL outside the pool). */
void *terrace_pool_direct(terrace_pool *pool, uint64_t off);
/* The offset of an address inside the pool; 0 with EINVAL outside it. */
uint64_t terrace_pool_offset(terrace_pool *pool, const void *addr);

/* ---- atomic allocation ---- */

/* Allocates size bytes of type type_num, publishing the offset to dest (see above).
 * Returns the offset, 0 on error (ENOMEM, EINVAL). Contents are not initialised. */
uint64_t terrace_pool_alloc(terrace_pool *pool, size_t size, uint64_t type_num, uint64_t *dest);
/* As terrace_pool_alloc, zero-filled. */
uint64_t terrace_pool_zalloc(terrace_pool *pool, size_t size, uint64_t type_num, uint64_t *dest);
/* As terrace_pool_alloc, one unit of custom class class_id (size at most its unit).
 * 0 on error (EINVAL: no such class or size too large). */
uint64_t terrace_pool_alloc_in_class(terrace_pool *pool, uint8_t class_id, size_t size,
                                     uint64_t type_num, uint64_t *dest);
/* Resizes the object at *dest (0: allocates) keeping its contents up to the smaller size;
 * the new offset replaces the old in *dest, atomically when dest is in the pool. */
int terrace_pool_realloc(terrace_pool *pool, uint64_t *dest, size_t size, uint64_t type_num);
/* Frees the object at *dest and sets *dest to 0 (atomically when dest is in the pool).
 * *dest == 0 or dest NULL: nothing, 0. EINVAL if *dest is not a live object. */
int terrace_pool_free(terrace_pool *pool, uint64_t *dest);
/* Frees the object at off (0: nothing). EINVAL if off is not a live object (double free). */
int terrace_pool_free_off(terrace_pool *pool, uint64_t off);
/* Usable bytes of the object at off; 0 on error. */
size_t terrace_pool_usable_size(terrace_pool *pool, uint64_t off);
/* Type number of the object at off; UINT64_MAX on error. */
uint64_t terrace_pool_type_num(terrace_pool *pool, uint64_t off);

/* ---- iteration (in offset order) ---- */

/* The first object of type type_num (TERRACE_POOL_ANY_TYPE: any); 0 if none or on error.
 * Takes a snapshot of the pool's objects that terrace_pool_next walks. */
uint64_t terrace_pool_first(terrace_pool *pool, uint64_t type_num);
/* The object after off in the snapshot of the last terrace_pool_first on pool; 0 at the end. */
uint64_t terrace_pool_next(terrace_pool *pool, uint64_t off);
/* Calls cb(pool, off, arg) for each object of type type_num (snapshot taken first); stops
 * at the first non-zero return of cb and returns it. 0 when all were visited; errno value
 * on error. */
int terrace_pool_foreach(terrace_pool *pool, uint64_t type_num,
                         int (*cb)(terrace_pool *pool, uint64_t off, void *arg), void *arg);

/* ---- persistence, statistics, classes ---- */

/* Makes [addr, addr+len) durable (it must lie in the pool: else EINVAL). */
int terrace_pool_persist(terrace_pool *pool, const void *addr, size_t len);
/* Fills *out with the pool's statistics. EINVAL for NULL arguments. */
int terrace_pool_stats(terrace_pool *pool, struct terrace_pool_stats *out);
/* Registers a custom class of unit_size-byte objects in runs of at least units_per_run
 * units (0: default) under the next free id, stored in *id_out. Recorded in the pool: it
 * survives reopening. EINVAL on a bad description or a full class table. */
int terrace_pool_register_class(terrace_pool *pool, size_t unit_size, uint32_t units_per_run,
                                uint8_t *id_out);

/* ---- transactions ---- */

/* Begins a transaction on pool for the calling thread (nests if one is on pool already).
 * EINVAL if the thread's transaction is on another pool. */
int terrace_pool_tx_begin(terrace_pool *pool);
/* Snapshots [off, off+len) so an abort restores it; then write it directly. Errors abort. */
int terrace_pool_tx_add_range(terrace_pool *pool, uint64_t off, size_t len);
/* Allocates in the transaction (freed again by an abort); 0 on error (which aborts). */
uint64_t terrace_pool_tx_alloc(terrace_pool *pool, size_t size, uint64_t type_num);
/* As terrace_pool_tx_alloc, zero-filled. */
uint64_t terrace_pool_tx_zalloc(terrace_pool *pool, size_t size, uint64_t type_num);
/* Frees off when the transaction commits (0: nothing). Errors abort. */
int terrace_pool_tx_free(terrace_pool *pool, uint64_t off);
/* Commits and ends the (innermost) transaction: 0, or the errno of what aborted it
 * (ECANCELED for an abort). EINVAL if no transaction of this thread is on pool. */
int terrace_pool_tx_commit(terrace_pool *pool);
/* Aborts (rolls back) the whole transaction and ends the innermost level.
 * EINVAL if no transaction of this thread is on pool. */
int terrace_pool_tx_abort(terrace_pool *pool);

/* ---- transactions by handle ----
 *
 * A transaction the caller holds, not bound to the calling thread: it may begin on one
 * thread and commit on another (one thread at a time), as a JVM virtual thread moving
 * between carrier threads does, and each call skips the thread's transaction lookup. It
 * does not nest (a binding counts its own levels) and does not mix with the thread's
 * transaction above: the two are separate. The pool stays open while one is live
 * (terrace_pool_close fails with EBUSY). The first failing operation aborts it (later
 * operations fail with ECANCELED); terrace_pool_txn_commit then rolls it back and returns
 * that first error. Commit and abort end and free the transaction whatever they return. */

typedef struct terrace_pool_txn terrace_pool_txn;

/* terrace_pool_txn_begin: fail with EAGAIN instead of waiting while every lane is busy. */
#define TERRACE_POOL_TXN_NOWAIT 1
/* terrace_pool_txn_alloc: zero-fill the new object. */
#define TERRACE_POOL_TXN_ZERO 1

/* Begins a transaction on pool; NULL on error (EAGAIN with TERRACE_POOL_TXN_NOWAIT). */
terrace_pool_txn *terrace_pool_txn_begin(terrace_pool *pool, int flags);
/* Snapshots [off, off+len) so an abort restores it; then write it directly. Ranges of
 * objects this transaction allocated need none. */
int terrace_pool_txn_add_range(terrace_pool_txn *txn, uint64_t off, size_t len);
/* Allocates in the transaction (freed again by an abort); 0 on error. */
uint64_t terrace_pool_txn_alloc(terrace_pool_txn *txn, size_t size, uint64_t type_num,
                                int flags);
/* As terrace_pool_txn_alloc, one unit of custom class class_id. */
uint64_t terrace_pool_txn_alloc_in_class(terrace_pool_txn *txn, uint8_t class_id, size_t size,
                                         uint64_t type_num, int flags);
/* Frees off when the transaction commits (at once if it allocated off; 0: nothing). */
int terrace_pool_txn_free(terrace_pool_txn *txn, uint64_t off);
/* Commits, ends and frees txn: 0, or the errno of the failure that aborted it. */
int terrace_pool_txn_commit(terrace_pool_txn *txn);
/* Rolls back, ends and frees txn. */
int terrace_pool_txn_abort(terrace_pool_txn *txn);

/* terrace_pool_persist_mode: what a persist point costs on this pool. */
#define TERRACE_POOL_PERSIST_FENCE 0 /* a fence: tmpfs, survives a process crash only */
#define TERRACE_POOL_PERSIST_FLUSH 1 /* cache-line flushes and a fence: DAX */
#define TERRACE_POOL_PERSIST_MSYNC 2 /* msync, which waits for the file system */
/* The pool's persist mode, or -1 with errno EINVAL for NULL. A caller that must not block
 * (a JVM critical downcall) uses blocking paths under TERRACE_POOL_PERSIST_MSYNC. */
int terrace_pool_persist_mode(terrace_pool *pool);

#ifdef __cplusplus
}
#endif
#endif /* TERRACE_POOL_H */
