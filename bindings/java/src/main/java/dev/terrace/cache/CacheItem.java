package dev.terrace.cache;

/**
 * A copied hit: the value with its client flags and CAS (for {@link TerraceCache#cas}).
 *
 * @param value the value's bytes (a copy the caller owns)
 * @param flags the client flags stored with it
 * @param cas the item's CAS
 */
public record CacheItem(byte[] value, int flags, long cas) {}
