/*
 * terrace_collections.h — crash-safe persistent collections inside a Terrace pool:
 * ordered maps (bytes -> bytes, with range cursors), hash maps, arrays of fixed-size
 * elements, and named roots (a directory, name -> map, array or object, in the pool).
 * Link with -lterrace; include after terrace_pool.h.
 *
 * Conventions (as terrace_pool.h): functions returning int give 0 or a positive errno
 * value (also stored in errno); functions returning a pointer give NULL, and those
 * returning an offset 0, with errno set; terrace_last_error() (terrace.h) describes the
 * last failure on the calling thread. A panic inside Terrace is a failure with errno EIO.
 *
 * Every update of a map is crash-atomic: after a crash the map holds the old or the new
 * entry, and a put or remove that returned is durable. Any number of threads may use one
 * map handle at once (readers take no lock; writers of one map take turns). A map or array
 * is open at most once per process (EBUSY); terrace_pool_close refuses (EBUSY) while a
 * map or array of the pool is open, and terrace_omap_close while a cursor over the map is open.
 *
 * Pool type numbers 0x5452434f00000000..0x5452434f0000ffff are the collections'; a
 * program must not allocate objects of those types. `terrace pool check POOL` validates
 * every map and reports objects no name reaches; `--sweep` frees them.
 */
#ifndef TERRACE_COLLECTIONS_H
#define TERRACE_COLLECTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "terrace_pool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque open ordered map, and a cursor over one. */
typedef struct terrace_omap terrace_omap;
typedef struct terrace_omap_cursor terrace_omap_cursor;

/* terrace_omap_open: create (and name) the map when the name is unbound. */
#define TERRACE_OMAP_CREATE 1

/* Opens the ordered map bound to name (1..=64 bytes of UTF-8) in pool's directory; with
 * TERRACE_OMAP_CREATE, creates and binds it in one transaction if the name is unbound.
 * max_key: longest key in bytes (1..=255); inline_value: values up to this many bytes
 * (0..=254, raised to 8) are kept in the entry, longer ones in an object of their own.
 * Both are fixed at creation; opening an existing map takes 0 or the same values.
 * NULL with errno: ENOENT (unbound, no CREATE), EEXIST (bound to something else),
 * EINVAL (bad arguments, or sizes other than the map's), EBUSY (already open in this
 * process), ENOMEM (pool full). */
terrace_omap *terrace_omap_open(terrace_pool *pool, const char *name, uint32_t max_key,
                                uint32_t inline_value, int flags);
/* Closes the handle (NULL: nothing). EBUSY while a cursor over it is open. */
int terrace_omap_close(terrace_omap *map);
/* Inserts or replaces key's value. EINVAL for a key longer than max_key; ENOMEM when the
 * pool is full. A NULL pointer is allowed with length 0. */
int terrace_omap_put(terrace_omap *map, const void *key, size_t key_len, const void *value,
                     size_t value_len);
/* Copies up to cap bytes of key's value into buf and returns the value's full length
 * (compare with cap to detect truncation); -1 with errno ENOENT when absent. */
int64_t terrace_omap_get(terrace_omap *map, const void *key, size_t key_len, void *buf,
                         size_t cap);
/* As terrace_omap_get, but a failure is returned as a negative errno value (-ENOENT when
 * absent) and errno is not the channel: for bindings that would otherwise capture errno
 * after every call. A miss records no message. */
int64_t terrace_omap_find(terrace_omap *map, const void *key, size_t key_len, void *buf,
                          size_t cap);
/* 0 when removed, ENOENT when absent. */
int terrace_omap_remove(terrace_omap *map, const void *key, size_t key_len);
/* Entries in the map; UINT64_MAX with errno on error. The first call on a handle counts
 * the map's leaves; later calls read a counter. */
uint64_t terrace_omap_len(terrace_omap *map);

/* terrace_omap_cursor_open flags. Bounds default to [lo, hi). */
#define TERRACE_OMAP_REVERSE 1      /* from the high end down */
#define TERRACE_OMAP_LO_EXCLUSIVE 2 /* (lo, ... */
#define TERRACE_OMAP_HI_INCLUSIVE 4 /* ..., hi] */

/* A cursor over the keys between lo and hi (NULL: unbounded on that side). It reads one
 * leaf at a time, each consistent; entries changed while it runs may or may not be seen.
 * One thread at a time per cursor. NULL with errno EINVAL on bad arguments. */
terrace_omap_cursor *terrace_omap_cursor_open(terrace_omap *map, const void *lo, size_t lo_len,
                                              const void *hi, size_t hi_len, int flags);
/* The next entry: 1 with the key and value copied (up to the capacities; their full
 * lengths in *key_len and *value_len when those are not NULL), 0 at the end, -1 with
 * errno on error. */
int terrace_omap_cursor_next(terrace_omap_cursor *cursor, void *key, size_t key_cap,
                             size_t *key_len, void *value, size_t value_cap, size_t *value_len);
void terrace_omap_cursor_close(terrace_omap_cursor *cursor);

/* Unbinds the map name (ordered or hash) and frees its nodes and values (EBUSY while it
 * is open in this process, ENOENT when unbound, EEXIST when name is not a map: an array
 * or an object). A crash
 * midway leaves objects no name reaches, which `terrace pool check --sweep` frees. */
int terrace_omap_destroy(terrace_pool *pool, const char *name);

/* ---- hash maps ----
 *
 * Bytes -> bytes for point lookups: linear hashing over chains of the same pages, grown
 * one bucket split at a time (no operation rehashes the whole map). Every call is as its
 * terrace_omap_* namesake, with the same errors and crash atomicity; iteration is in no
 * order, one bucket at a time. */
typedef struct terrace_hmap terrace_hmap;
typedef struct terrace_hmap_iter terrace_hmap_iter;

terrace_hmap *terrace_hmap_open(terrace_pool *pool, const char *name, uint32_t max_key,
                                uint32_t inline_value, int flags);
int terrace_hmap_close(terrace_hmap *map);
int terrace_hmap_put(terrace_hmap *map, const void *key, size_t key_len, const void *value,
                     size_t value_len);
int64_t terrace_hmap_get(terrace_hmap *map, const void *key, size_t key_len, void *buf,
                         size_t cap);
int64_t terrace_hmap_find(terrace_hmap *map, const void *key, size_t key_len, void *buf,
                          size_t cap);
int terrace_hmap_remove(terrace_hmap *map, const void *key, size_t key_len);
uint64_t terrace_hmap_len(terrace_hmap *map);
/* Every entry, bucket by bucket; entries changed meanwhile may or may not be seen, and a
 * bucket split during the walk may show one twice. */
terrace_hmap_iter *terrace_hmap_iter_open(terrace_hmap *map);
int terrace_hmap_iter_next(terrace_hmap_iter *iter, void *key, size_t key_cap, size_t *key_len,
                           void *value, size_t value_cap, size_t *value_len);
void terrace_hmap_iter_close(terrace_hmap_iter *iter);
/* As terrace_omap_destroy. */
int terrace_hmap_destroy(terrace_pool *pool, const char *name);

/* ---- arrays ---- */

/* Opaque open array: a fixed number of fixed-size elements in one pool object, bound by
 * name (PCJ's PersistentArray). Created zeroed; its size never changes. */
typedef struct terrace_array terrace_array;

/* terrace_array_open: create (and name) the array when the name is unbound. */
#define TERRACE_ARRAY_CREATE 1

/* Opens the array bound to name; with TERRACE_ARRAY_CREATE, creates it (length elements
 * of element_size bytes, 1..=4096, zeroed) and binds it in one transaction if the name is
 * unbound. Opening an existing array takes 0 or its own sizes. NULL with errno: ENOENT,
 * EEXIST (bound to something else), EINVAL (bad or other sizes), EBUSY (already open in
 * this process), ENOMEM (pool full). */
terrace_array *terrace_array_open(terrace_pool *pool, const char *name, uint64_t length,
                                  uint32_t element_size, int flags);
/* Closes the handle (NULL: nothing); no other call on it may overlap. */
int terrace_array_close(terrace_array *array);
/* Elements, and bytes per element; 0 with errno EINVAL for NULL. */
uint64_t terrace_array_len(const terrace_array *array);
uint32_t terrace_array_element_size(const terrace_array *array);
/* Copies len bytes, whole elements, from element index on into buf. Consistent with
 * every write of more than 8 bytes (it holds such a write whole or not at all). EINVAL
 * for a range past the end or a length that is not whole elements. */
int terrace_array_get(const terrace_array *array, uint64_t index, void *buf, size_t len);
/* Writes len bytes, whole elements (at most 16 KiB), from element index on; crash-atomic:
 * after a crash all of them hold the new bytes or none does. One 8-byte element is one
 * atomic store and a persist; anything else is one transaction. EINVAL as for get. */
int terrace_array_set(const terrace_array *array, uint64_t index, const void *data, size_t len);
/* Unbinds and frees the array bound to name. ENOENT (unbound), EEXIST (not an array),
 * EBUSY (open in this process). */
int terrace_array_destroy(terrace_pool *pool, const char *name);

/* ---- named objects ---- */

/* Binds name to the live object at off (crash-atomic). EEXIST when name is bound,
 * EINVAL for a dead object or a collection's node. */
int terrace_pool_bind(terrace_pool *pool, const char *name, uint64_t off);
/* The offset name is bound to (a map's header for a map); 0 with errno ENOENT. */
uint64_t terrace_pool_lookup(terrace_pool *pool, const char *name);
/* Removes an object's binding and returns the object (the program owns it again); 0 with
 * errno ENOENT (unbound) or EEXIST (a map: see terrace_omap_destroy). */
uint64_t terrace_pool_unbind(terrace_pool *pool, const char *name);

#ifdef __cplusplus
}
#endif

#endif /* TERRACE_COLLECTIONS_H */
