/*
 * terrace_cache.h — the C API of Terrace's tiered cache: key/value items with memcached's
 * semantics (flags, TTLs, CAS, incr/decr) over DRAM, file (PMem/CXL/disk) and NUMA tiers,
 * with a warm restart from a file tier's directory.
 *
 * Link with -lterrace. Keys and values are byte strings (key: 1 to 250 bytes, value: at
 * most 1 MiB). All functions are thread-safe on one cache, except terrace_cache_close,
 * which no other call on the same cache may overlap.
 *
 * TTLs are relative seconds; 0 never expires. CAS values are the cache's own (they are
 * kept when an item moves between tiers or is touched).
 *
 * Conventions (as terrace.h): functions returning int give 0 or a positive errno value
 * (also stored in errno); functions returning a pointer give NULL with errno set.
 * terrace_last_error() (terrace.h) describes the last failure on the calling thread; a
 * miss or an unmet condition (ENOENT, EEXIST) sets errno but records no message. NULL or
 * invalid arguments (a NULL cache, a NULL or empty key, a key longer than 250 bytes) are
 * EINVAL; a value over the limit is E2BIG; no free segment (every one pinned) ENOSPC. An
 * internal error (a bug in Terrace) is EIO.
 */
#ifndef TERRACE_CACHE_H
#define TERRACE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque open cache. */
typedef struct terrace_cache terrace_cache;
/* Opaque pinned hit: its value stays valid, unchanged, until terrace_cache_release. */
typedef struct terrace_cache_guard terrace_cache_guard;

/* The tiers terrace_cache_stats reports one by one. */
#define TERRACE_CACHE_MAX_TIERS 8

struct terrace_cache_tier_stats {
    uint64_t items;         /* indexed items in the tier */
    uint64_t live_bytes;    /* bytes of items written and not dead */
    uint64_t dead_bytes;    /* bytes of overwritten or deleted items not yet reclaimed */
    uint64_t segments;      /* segments of the tier */
    uint64_t free_segments; /* of them, free */
    uint64_t hits;          /* gets that found their item in the tier */
    uint64_t items_evicted; /* items dropped from the tier by eviction */
};

struct terrace_cache_stats {
    uint64_t items;      /* indexed items, all tiers */
    uint64_t bytes;      /* live bytes, all tiers */
    uint64_t hits;       /* gets and pins that hit */
    uint64_t misses;     /* gets and pins that missed */
    uint64_t sets;       /* items stored */
    uint64_t deletes;    /* deletes of a live item */
    uint64_t expired;    /* reads that found an expired item */
    uint64_t evictions;  /* items evicted (as memcached's `evictions` of terrace serve) */
    uint64_t demotions;  /* items moved down a tier on eviction */
    uint64_t promotions; /* items copied up to tier 0 */
    uint32_t tier_count; /* tiers of the cache (only the first TERRACE_CACHE_MAX_TIERS below) */
    struct terrace_cache_tier_stats tiers[TERRACE_CACHE_MAX_TIERS];
};

/* ---- open, close ---- */

/* Opens a cache. tiers: as `terrace serve --tiers`, fastest first, e.g.
 * "dram:64MiB,file:256MiB", "dram:1,file:3" (ratios of capacity, which must then be
 * non-zero) or "dram:4GiB,numa:2:64GiB"; each tier needs at least 16 MiB. dir: where file
 * tiers live (created if missing; NULL allowed without a file tier). Opening the dir of a
 * closed cache with the same tiers is a warm restart: its items are back. NULL on error
 * (EINVAL bad spec or sizes, ENOENT/EACCES dir, ENOSPC/ENOMEM room). */
terrace_cache *terrace_cache_open(const char *tiers, const char *dir, uint64_t capacity);
/* Closes c (NULL: nothing, 0), saving the index and DRAM tiers beside the first file tier
 * for a warm restart (as terrace serve on SIGTERM). EBUSY (c stays open) while pinned
 * guards are not released; another errno if saving failed (c is closed anyway). */
int terrace_cache_close(terrace_cache *c);

/* ---- reads ---- */

/* Copies key's value into buf (cap bytes; NULL if cap is 0) and sets *value_len, *flags,
 * *cas (each may be NULL). 0 on a hit, ENOENT on a miss, ENOSPC when cap is too small
 * (*value_len, *flags, *cas are set: retry with a larger buffer). */
int terrace_cache_get(terrace_cache *c, const void *key, size_t klen, void *buf, size_t cap,
                      size_t *value_len, uint32_t *flags, uint64_t *cas);
/* Pins key's item and stores a guard in *out (NULL on a miss or error): 0, ENOENT. Read the
 * value in place, then release the guard soon (a guard keeps its segment from reuse). */
int terrace_cache_pin(terrace_cache *c, const void *key, size_t klen, terrace_cache_guard **out);
/* The pinned value and its length in *len (len may be NULL); NULL with EINVAL for NULL g. */
const void *terrace_cache_guard_value(const terrace_cache_guard *g, size_t *len);
/* The pinned item's client flags (0 with EINVAL for NULL g). */
uint32_t terrace_cache_guard_flags(const terrace_cache_guard *g);
/* The pinned item's CAS (0 with EINVAL for NULL g). */
uint64_t terrace_cache_guard_cas(const terrace_cache_guard *g);
/* Releases a guard (NULL: nothing); its value pointer is invalid afterwards. */
void terrace_cache_release(terrace_cache_guard *g);

/* ---- writes (cas_out: the new item's CAS, may be NULL) ---- */

/* Stores key -> value (value may be NULL when vlen is 0). 0, or E2BIG, ENOSPC, EINVAL. */
int terrace_cache_set(terrace_cache *c, const void *key, size_t klen, const void *value,
                      size_t vlen, uint32_t flags, uint32_t ttl, uint64_t *cas_out);
/* Stores only if key is absent: 0, EEXIST if present. */
int terrace_cache_add(terrace_cache *c, const void *key, size_t klen, const void *value,
                      size_t vlen, uint32_t flags, uint32_t ttl, uint64_t *cas_out);
/* Stores only if key is present: 0, ENOENT if absent. */
int terrace_cache_replace(terrace_cache *c, const void *key, size_t klen, const void *value,
                          size_t vlen, uint32_t flags, uint32_t ttl, uint64_t *cas_out);
/* Stores only if key's CAS is cas: 0, EEXIST if it is another, ENOENT if key is absent. */
int terrace_cache_cas(terrace_cache *c, const void *key, size_t klen, const void *value,
                      size_t vlen, uint32_t flags, uint32_t ttl, uint64_t cas, uint64_t *cas_out);
/* Deletes key: 0, ENOENT if absent. */
int terrace_cache_delete(terrace_cache *c, const void *key, size_t klen);
/* Gives key a new TTL (its CAS kept): 0, ENOENT if absent. */
int terrace_cache_touch(terrace_cache *c, const void *key, size_t klen, uint32_t ttl);
/* Adds delta to a decimal value (wrapping at 2^64) and stores the result in *out (may be
 * NULL): 0, ENOENT if absent, EINVAL if the value is not a decimal number below 2^64. */
int terrace_cache_incr(terrace_cache *c, const void *key, size_t klen, uint64_t delta,
                       uint64_t *out);
/* As terrace_cache_incr, subtracting and stopping at 0. */
int terrace_cache_decr(terrace_cache *c, const void *key, size_t klen, uint64_t delta,
                       uint64_t *out);
/* Removes every item: 0 (EINVAL for NULL c). */
int terrace_cache_flush_all(terrace_cache *c);

/* ---- statistics ---- */

/* Fills *out with the cache's counters (it walks the index: not for every request).
 * 0, EINVAL for NULL arguments. */
int terrace_cache_stats(terrace_cache *c, struct terrace_cache_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* TERRACE_CACHE_H */
