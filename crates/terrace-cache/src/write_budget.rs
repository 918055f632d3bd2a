//! The flash tier's write budget: a cap, in bytes per second, on what is admitted to
//! flash (demotions and reinsertions alike), so that a cache holds a device's endurance
//! budget (CacheLib's "flash write rate").
//!
//! A token bucket over bytes: it fills at `rate` bytes per second up to `burst` bytes, and
//! an item is admitted only if the bucket holds its length, which it then spends. Over any
//! window of `t` seconds it admits at most `rate·t + burst` bytes; under a steady demand
//! above the rate, at least `rate·t − burst`. `burst` is a quarter second of the rate (at
//! least the largest item, so every item can pass), which keeps a 10-second window within
//! ±2.5% of `10·rate` — within ±10% on flash too, where admitted bytes reach the device a
//! whole segment at a time (one segment early or late is 10% of a window of ten).
//!
//! Exact in bytes (an `f64` bucket) rather than cells: a cell-based limiter (`governor`)
//! would charge a 64-byte item a whole cell, or need nanosecond periods at GB/s rates.
//! Time is passed in, so tests drive it.

use std::time::Instant;

use parking_lot::Mutex;

/// The share of a second of the rate that the bucket holds at most.
const BURST_SECONDS: f64 = 0.25;

#[derive(Debug)]
pub(crate) struct WriteBudget {
    rate: f64,
    burst: f64,
    bucket: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl WriteBudget {
    /// A budget of `rate` bytes per second (at least 1) that admits items of up to
    /// `max_item` bytes; it starts full.
    pub fn new(rate: u64, max_item: usize, now: Instant) -> WriteBudget {
        let rate = rate.max(1) as f64;
        let burst = (rate * BURST_SECONDS).max(max_item as f64);
        WriteBudget {
            rate,
            burst,
            bucket: Mutex::new(Bucket {
                tokens: burst,
                at: now,
            }),
        }
    }

    /// Spends `bytes` if the bucket holds them at `now`; whether it did.
    pub fn try_spend(&self, bytes: usize, now: Instant) -> bool {
        let mut b = self.bucket.lock();
        // Time never runs back for the bucket (callers' clocks may be read before the
        // lock in another order).
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        if now > b.at {
            b.at = now;
        }
        b.tokens = (b.tokens + elapsed * self.rate).min(self.burst);
        let cost = bytes as f64;
        if b.tokens >= cost {
            b.tokens -= cost;
            true
        } else {
            false
        }
    }

    /// The rate, bytes per second.
    pub fn rate(&self) -> u64 {
        self.rate as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Offers items of 64..4096 bytes at `demand` times the rate, 1 ms apart, for 60
    /// simulated seconds; returns the bytes admitted in each 10-second window.
    fn windows(rate: u64, demand: f64) -> Vec<u64> {
        let start = Instant::now();
        let budget = WriteBudget::new(rate, 4096, start);
        let per_ms = rate as f64 * demand / 1000.0;
        let mut offered = 0.0f64;
        let mut out = vec![0u64; 6];
        let mut size = 64usize;
        for ms in 0..60_000u64 {
            let now = start + Duration::from_millis(ms);
            offered += per_ms;
            while offered >= size as f64 {
                offered -= size as f64;
                if budget.try_spend(size, now) {
                    out[(ms / 10_000) as usize] += size as u64;
                }
                size = 64 + (size * 7919 + 13) % 4033;
            }
        }
        out
    }

    #[test]
    fn a_demand_above_the_rate_is_held_within_ten_percent_per_ten_seconds() {
        for rate in [1 << 20, 64 << 20] {
            for demand in [1.5, 4.0] {
                for (i, w) in windows(rate, demand).into_iter().enumerate() {
                    let r = w as f64 / (10.0 * rate as f64);
                    assert!(
                        (0.9..=1.1).contains(&r),
                        "rate {rate} ×{demand} window {i}: {r}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_demand_below_the_rate_passes_whole() {
        let rate = 10 << 20;
        let offered = 0.5 * 10.0 * rate as f64;
        for (i, w) in windows(rate, 0.5).into_iter().enumerate() {
            let r = w as f64 / offered;
            assert!(r > 0.99, "window {i}: {r}");
        }
    }

    #[test]
    fn the_largest_item_can_pass_at_a_tiny_rate() {
        let start = Instant::now();
        let b = WriteBudget::new(100, 1 << 20, start);
        assert!(b.try_spend(1 << 20, start));
        assert!(!b.try_spend(1, start));
        // 1 MiB at 100 B/s refills in about 3 hours.
        assert!(!b.try_spend(1 << 20, start + Duration::from_secs(3600)));
        assert!(b.try_spend(1 << 20, start + Duration::from_secs(10_486)));
    }
}
