package dev.terrace.cache;

import java.util.List;

/**
 * A snapshot of a cache's counters ({@code struct terrace_cache_stats}).
 *
 * @param items indexed items, all tiers
 * @param bytes live bytes, all tiers
 * @param hits gets and pins that hit
 * @param misses gets and pins that missed
 * @param sets items stored
 * @param deletes deletes of a live item
 * @param expired reads that found an expired item
 * @param evictions items evicted
 * @param demotions items moved down a tier on eviction
 * @param promotions items copied up to tier 0
 * @param tierCount tiers of the cache
 * @param tiers the first (at most 8) tiers, fastest first
 */
public record CacheStats(long items, long bytes, long hits, long misses, long sets,
        long deletes, long expired, long evictions, long demotions, long promotions,
        int tierCount, List<Tier> tiers) {

    /**
     * One tier's counters ({@code struct terrace_cache_tier_stats}).
     *
     * @param items indexed items in the tier
     * @param liveBytes bytes of items written and not dead
     * @param deadBytes bytes of overwritten or deleted items not yet reclaimed
     * @param segments segments of the tier
     * @param freeSegments of them, free
     * @param hits gets that found their item in the tier
     * @param itemsEvicted items dropped from the tier by eviction
     */
    public record Tier(long items, long liveBytes, long deadBytes, long segments,
            long freeSegments, long hits, long itemsEvicted) {}
}
