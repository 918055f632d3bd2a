package dev.terrace.kinds;

/**
 * A snapshot of one kind's statistics ({@code terrace_kind_stats_t}), all in bytes.
 *
 * @param allocated bytes in live allocations (size-class rounded)
 * @param active bytes of pages holding live allocations
 * @param resident bytes physically resident (an upper bound)
 * @param capacity the most the kind can hold
 * @param reserved file blocks reserved so far (0 for anonymous media)
 */
public record KindStats(long allocated, long active, long resident, long capacity,
        long reserved) {}
