/*
 * libpmemobj.h — the libpmemobj-compatible subset of Terrace's persistent pool
 * (libterrace.so). Programs written for PMDK's libpmemobj that use the calls below
 * recompile unchanged:
 *     cc prog.c -Iinclude -Ltarget/release -lterrace
 *
 * Covered: pool create/open/close/check, the root object, PMEMoid and pmemobj_direct,
 * atomic alloc/zalloc/realloc/free (publishing into a PMEMoid in the pool crash-atomically),
 * type numbers and iteration (pmemobj_first/next, POBJ_FOREACH), persist/flush/drain and the
 * memcpy/memset helpers, the function-level transaction API (pmemobj_tx_begin with a
 * NULL jmp_buf, add_range, tx alloc/zalloc/xalloc/free, commit, end, abort, stage, errno),
 * and custom allocation classes: pmemobj_ctl_set/get of "heap.alloc_class.new.desc" and
 * "heap.alloc_class.<id>.desc", pmemobj_xalloc and pmemobj_tx_xalloc with POBJ_CLASS_ID.
 *
 * Differences from libpmemobj worth knowing:
 * - objects carry no header: pmemobj_alloc_usable_size is the size class's unit;
 * - the setjmp-based TX_BEGIN/TX_END macros are not provided (pmemobj_tx_begin with a
 *   non-NULL jmp_buf fails with EINVAL), nor are transaction parameters other than
 *   TX_PARAM_NONE, persistent locks, or pmemobj_tx_process;
 * - a transaction's undo log holds up to 56 KiB of snapshots and its commit up to 508 word
 *   updates; beyond that the transaction aborts with ENOMEM (libpmemobj grows its logs);
 * - on tmpfs (emulated persistent memory) a persisted write survives a process crash, not
 *   a power loss; on DAX it survives a power loss; on other file systems msync is used.
 * - pmemobj_tx_begin's trailing parameters must be exactly TX_PARAM_NONE; Terrace reads
 *   it as a fixed int argument, which is how x86-64 and AArch64 Linux pass it.
 * - custom allocation classes are recorded in the pool: after pmemobj_close and
 *   pmemobj_open the class is still registered under its id (libpmemobj forgets it and
 *   must be told again before any allocation names it). Ids are 1..254.
 * - an object of a custom class is always one unit, whatever the header type (objects
 *   have no header): pmemobj_xalloc with a size above the unit fails with EINVAL.
 * - a class's unit_size must be a multiple of 8 from 16 to 131072 bytes, and its
 *   alignment 0 or a power of two up to 4096 dividing the unit (EINVAL otherwise); a run
 *   tracks at most 64 units per 4 KiB page, so units below 64 bytes leave part of each
 *   page unused. units_per_block is a minimum: ctl set and get report the actual count.
 * - the only ctl entry points are the two above (pmemobj_ctl_exec has none): any other
 *   name fails with EINVAL.
 * - an internal error (a bug in Terrace) is a failure, never an abort: the call's error
 *   value (NULL, OID_NULL, -1, or an error number) with errno EIO; inside a transaction it
 *   also aborts the transaction.
 */
#ifndef LIBPMEMOBJ_H
#define LIBPMEMOBJ_H 1

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pmemobjpool PMEMobjpool;

typedef struct pmemoid {
    uint64_t pool_uuid_lo;
    uint64_t off;
} PMEMoid;

#ifdef __cplusplus
#define OID_NULL (PMEMoid{0, 0})
#else
#define OID_NULL ((PMEMoid){0, 0})
#endif
#define OID_IS_NULL(o) ((o).off == 0)
#define OID_EQUALS(lhs, rhs) ((lhs).off == (rhs).off && (lhs).pool_uuid_lo == (rhs).pool_uuid_lo)

#define PMEMOBJ_MIN_POOL ((size_t)(1024 * 1024 * 8))
#define PMEMOBJ_MAX_LAYOUT ((size_t)64)

typedef int (*pmemobj_constr)(PMEMobjpool *pop, void *ptr, void *arg);

enum pobj_tx_stage {
    TX_STAGE_NONE,
    TX_STAGE_WORK,
    TX_STAGE_ONCOMMIT,
    TX_STAGE_ONABORT,
    TX_STAGE_FINALLY,
    MAX_TX_STAGE
};

enum pobj_tx_param { TX_PARAM_NONE, TX_PARAM_MUTEX, TX_PARAM_RWLOCK, TX_PARAM_CB };

/* Flags of pmemobj_xalloc and pmemobj_tx_xalloc. */
#define POBJ_FLAG_ZERO (((uint64_t)1) << 0)
#define POBJ_FLAG_NO_FLUSH (((uint64_t)1) << 1)
#define POBJ_FLAG_TX_NO_ABORT (((uint64_t)1) << 4)
/* Allocate in custom class `id` (0: the built-in size classes). */
#define POBJ_CLASS_ID(id) (((uint64_t)(id)) << 48)
/* Accepted by pmemobj_tx_xalloc and ignored: Terrace has no arenas. */
#define POBJ_ARENA_ID(id) (((uint64_t)(id)) << 32)
#define POBJ_XALLOC_CLASS_MASK ((((uint64_t)1 << 16) - 1) << 48)
#define POBJ_XALLOC_ARENA_MASK ((((uint64_t)1 << 16) - 1) << 32)
#define POBJ_XALLOC_ZERO POBJ_FLAG_ZERO
#define POBJ_XALLOC_NO_FLUSH POBJ_FLAG_NO_FLUSH
#define POBJ_XALLOC_NO_ABORT POBJ_FLAG_TX_NO_ABORT
#define POBJ_XALLOC_VALID_FLAGS (POBJ_XALLOC_ZERO | POBJ_XALLOC_CLASS_MASK)
#define POBJ_TX_XALLOC_VALID_FLAGS                                                   \
    (POBJ_XALLOC_ZERO | POBJ_XALLOC_NO_FLUSH | POBJ_XALLOC_ARENA_MASK |              \
     POBJ_XALLOC_CLASS_MASK | POBJ_XALLOC_NO_ABORT)

/* Header types a class can be registered with; recorded and reported, no effect. */
enum pobj_header_type {
    POBJ_HEADER_LEGACY,
    POBJ_HEADER_COMPACT,
    POBJ_HEADER_NONE,
    MAX_POBJ_HEADER_TYPES
};

/* A custom allocation class, for "heap.alloc_class.new.desc" (set) and
 * "heap.alloc_class.<id>.desc" (set, get). Setting fills in class_id and the actual
 * units_per_block. */
struct pobj_alloc_class_desc {
    size_t unit_size;
    size_t alignment;
    unsigned units_per_block;
    enum pobj_header_type header_type;
    unsigned class_id;
};

/* Pools. */
PMEMobjpool *pmemobj_create(const char *path, const char *layout, size_t poolsize, mode_t mode);
PMEMobjpool *pmemobj_open(const char *path, const char *layout);
void pmemobj_close(PMEMobjpool *pop);
int pmemobj_check(const char *path, const char *layout);
const char *pmemobj_errormsg(void);

/* Objects. */
PMEMoid pmemobj_root(PMEMobjpool *pop, size_t size);
size_t pmemobj_root_size(PMEMobjpool *pop);
void *pmemobj_direct(PMEMoid oid);
PMEMoid pmemobj_oid(const void *addr);
PMEMobjpool *pmemobj_pool_by_oid(PMEMoid oid);
PMEMobjpool *pmemobj_pool_by_ptr(const void *addr);
int pmemobj_alloc(PMEMobjpool *pop, PMEMoid *oidp, size_t size, uint64_t type_num,
                  pmemobj_constr constructor, void *arg);
int pmemobj_zalloc(PMEMobjpool *pop, PMEMoid *oidp, size_t size, uint64_t type_num);
int pmemobj_xalloc(PMEMobjpool *pop, PMEMoid *oidp, size_t size, uint64_t type_num,
                   uint64_t flags, pmemobj_constr constructor, void *arg);
int pmemobj_realloc(PMEMobjpool *pop, PMEMoid *oidp, size_t size, uint64_t type_num);
void pmemobj_free(PMEMoid *oidp);
size_t pmemobj_alloc_usable_size(PMEMoid oid);
uint64_t pmemobj_type_num(PMEMoid oid);
PMEMoid pmemobj_first(PMEMobjpool *pop);
PMEMoid pmemobj_next(PMEMoid oid);

#define POBJ_FOREACH(pop, varoid) \
    for ((varoid) = pmemobj_first(pop); (varoid).off != 0; (varoid) = pmemobj_next(varoid))
#define POBJ_FOREACH_SAFE(pop, varoid, nvaroid)                                  \
    for ((varoid) = pmemobj_first(pop);                                          \
         (varoid).off != 0 && ((nvaroid) = pmemobj_next(varoid), 1); (varoid) = (nvaroid))

/* Persistence of directly written memory. */
void pmemobj_persist(PMEMobjpool *pop, const void *addr, size_t len);
void pmemobj_flush(PMEMobjpool *pop, const void *addr, size_t len);
void pmemobj_drain(PMEMobjpool *pop);
void *pmemobj_memcpy_persist(PMEMobjpool *pop, void *dest, const void *src, size_t len);
void *pmemobj_memset_persist(PMEMobjpool *pop, void *dest, int c, size_t len);

/* Transactions (function-level API; call pmemobj_tx_begin(pop, NULL, TX_PARAM_NONE)). */
int pmemobj_tx_begin(PMEMobjpool *pop, jmp_buf env, ...);
enum pobj_tx_stage pmemobj_tx_stage(void);
int pmemobj_tx_add_range(PMEMoid oid, uint64_t off, size_t size);
int pmemobj_tx_add_range_direct(const void *ptr, size_t size);
PMEMoid pmemobj_tx_alloc(size_t size, uint64_t type_num);
PMEMoid pmemobj_tx_zalloc(size_t size, uint64_t type_num);
PMEMoid pmemobj_tx_xalloc(size_t size, uint64_t type_num, uint64_t flags);
int pmemobj_tx_free(PMEMoid oid);
void pmemobj_tx_commit(void);
int pmemobj_tx_end(void);
void pmemobj_tx_abort(int errnum);
int pmemobj_tx_errno(void);

/* Control: allocation classes (see struct pobj_alloc_class_desc). 0, or -1 with errno. */
int pmemobj_ctl_get(PMEMobjpool *pop, const char *name, void *arg);
int pmemobj_ctl_set(PMEMobjpool *pop, const char *name, void *arg);
int pmemobj_ctl_exec(PMEMobjpool *pop, const char *name, void *arg);

#ifdef __cplusplus
}
#endif
#endif /* LIBPMEMOBJ_H */
