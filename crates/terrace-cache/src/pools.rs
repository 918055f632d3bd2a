//! Pools: named namespaces with quotas of their own, as CacheLib's pools are (memcached
//! has none). A pool is a whole [`Cache`] of its own, opened beside the others from one
//! [`CacheConfig`]: every tier is split between the pools in proportion to their
//! quotas, each named pool's file tiers live in a subdirectory of the tier's directory
//! (`pool-<name>`), and each pool has its own index, movers and restart. So:
//!
//! - a key names different items in different pools;
//! - a pool never evicts another pool's items and never holds more than its quota (space
//!   is not lent between pools: there is no rebalancing);
//! - a pool restarts, warm or after a crash, from its own segments only.
//!
//! The default pool gets what the named pools leave, in the tier directories themselves.
//! Changing the pools (adding one, changing a quota) changes how the tiers are split, and
//! a tier file of another size than its pool's share is refused at open, with a message
//! saying so: the files must be moved or deleted to start with the new split.
//!
//! Invariants: pool names are unique, 1..=[`MAX_POOL_NAME`] characters of
//! `[A-Za-z0-9_-]`, never [`DEFAULT_POOL`]; every pool has at least [`MIN_POOL_SEGMENTS`]
//! segments of every tier, named pools a whole number of granules (2 MiB, the unit tiers
//! are mapped in) and segments, so the pools together are exactly as large as the
//! configured tiers; index 0 of [`Pools::iter`] is the default pool.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::cache::{Cache, CacheConfig, Movers, RestartReport, Stats};
use crate::error::CacheError;
use crate::tier::{resolve_sizes, Medium, TierSize, TierStats};
use terrace_media::registry::GRANULE;

/// The name of the pool that takes every tier's remaining space.
pub const DEFAULT_POOL: &str = "default";
/// Longest pool name.
pub const MAX_POOL_NAME: usize = 64;
/// Fewest segments a pool has in each tier: each writer thread and TTL bucket keeps a
/// segment open, and the movers keep some free (2 MiB segments: 16 MiB a tier).
pub const MIN_POOL_SEGMENTS: u64 = crate::cache::MIN_TIER_SEGMENTS as u64;

/// A named pool's quota.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PoolQuota {
    /// Bytes of the whole cache, taken from every tier in proportion to its size.
    Bytes(u64),
    /// A share of the whole cache, in percent (0 < p < 100).
    Percent(f64),
}

/// One named pool.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolConfig {
    pub name: String,
    pub quota: PoolQuota,
}

/// The pools of one cache: the default pool first, then the named pools in the order
/// they were configured.
pub struct Pools {
    pools: Vec<(String, Arc<Cache>)>,
}

impl std::fmt::Debug for Pools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.pools.iter().map(|(name, _)| name))
            .finish()
    }
}

/// Checks a pool name: the module's invariant.
pub fn check_pool_name(name: &str) -> Result<(), CacheError> {
    let bad = |why: &str| {
        Err(CacheError::Pool {
            pool: name.to_string(),
            why: why.to_string(),
        })
    };
    if name.is_empty() || name.len() > MAX_POOL_NAME {
        return bad("a pool name is 1 to 64 characters long");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return bad("a pool name is made of letters, digits, '_' and '-'");
    }
    if name == DEFAULT_POOL {
        return bad("\"default\" names the pool that takes the space the others leave");
    }
    Ok(())
}

/// The subdirectory of a tier directory that holds pool `name`'s tier file.
pub fn pool_dir(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("pool-{name}"))
}

impl Pools {
    /// Opens the default pool and every named pool (see the module docs for how the tiers
    /// are split). With no named pool this is one [`Cache::open`] of `config`. Returns
    /// each pool's recovery report, in the order of [`Pools::iter`].
    pub fn open(
        config: CacheConfig,
        named: &[PoolConfig],
    ) -> Result<(Pools, Vec<RestartReport>), CacheError> {
        if named.is_empty() {
            let (cache, report) = Cache::open(config)?;
            let pools = vec![(DEFAULT_POOL.to_string(), Arc::new(cache))];
            return Ok((Pools { pools }, vec![report]));
        }
        let tier_bytes = resolve_sizes(&config.tiers, config.total_bytes)?;
        let total: u64 = tier_bytes.iter().sum();
        let mut shares = Vec::with_capacity(named.len());
        for (i, pool) in named.iter().enumerate() {
            check_pool_name(&pool.name)?;
            if named[..i].iter().any(|p| p.name == pool.name) {
                return Err(CacheError::Pool {
                    pool: pool.name.clone(),
                    why: "configured twice".to_string(),
                });
            }
            // A share as an exact fraction, so that rounding never costs a granule.
            let share: (u128, u128) = match pool.quota {
                PoolQuota::Bytes(b) => (u128::from(b), u128::from(total.max(1))),
                PoolQuota::Percent(p) if p.is_finite() && p > 0.0 => {
                    ((p * 1e4).round() as u128, 1_000_000)
                }
                PoolQuota::Percent(_) => (0, 1),
            };
            if !(share.0 > 0 && share.0 < share.1) {
                return Err(CacheError::Pool {
                    pool: pool.name.clone(),
                    why: format!(
                        "its quota must be more than nothing and less than the whole cache \
                         ({total} bytes)"
                    ),
                });
            }
            shares.push(share);
        }
        let named_share: f64 = shares.iter().map(|&(n, d)| n as f64 / d as f64).sum();
        if named_share >= 1.0 {
            return Err(CacheError::Pool {
                pool: DEFAULT_POOL.to_string(),
                why: format!(
                    "the named pools' quotas add up to {:.1}% of the cache: the default pool \
                     needs some of it",
                    named_share * 100.0
                ),
            });
        }
        // Each named pool's bytes of each tier, in whole units of the larger of a granule
        // (tiers are mapped in granules: a share rounded up would make the cache larger
        // than its configuration) and a segment; the default pool gets the rest. Every
        // pool needs MIN_POOL_SEGMENTS of every tier.
        let segment = 1u64 << config.chosen_segment_shift().min(63);
        let unit = (GRANULE as u64).max(segment);
        let too_small = |pool: &str, t: usize, bytes: u64| CacheError::Pool {
            pool: pool.to_string(),
            why: format!(
                "it would get {} MiB of tier {t}, {} segments of {} KiB: a pool needs at \
                 least {MIN_POOL_SEGMENTS} in every tier",
                bytes >> 20,
                bytes / segment,
                segment >> 10
            ),
        };
        let mut split: Vec<Vec<u64>> = Vec::with_capacity(named.len());
        for (pool, &(num, den)) in named.iter().zip(&shares) {
            let mut bytes = Vec::with_capacity(tier_bytes.len());
            for (t, &b) in tier_bytes.iter().enumerate() {
                let cut = (u128::from(b) * num / den) as u64 / unit * unit;
                if cut / segment < MIN_POOL_SEGMENTS {
                    return Err(too_small(&pool.name, t, cut));
                }
                bytes.push(cut);
            }
            split.push(bytes);
        }
        let mut default_bytes = Vec::with_capacity(tier_bytes.len());
        for (t, &b) in tier_bytes.iter().enumerate() {
            let rest = b.saturating_sub(split.iter().map(|s| s[t]).sum::<u64>());
            if rest / segment < MIN_POOL_SEGMENTS {
                return Err(too_small(DEFAULT_POOL, t, rest));
            }
            default_bytes.push(rest);
        }
        let shares: Vec<f64> = shares.iter().map(|&(n, d)| n as f64 / d as f64).collect();
        let mut pools = Vec::with_capacity(named.len() + 1);
        let mut reports = Vec::with_capacity(named.len() + 1);
        let default_share = 1.0 - named_share;
        let layouts = std::iter::once((DEFAULT_POOL, default_share, &default_bytes)).chain(
            named
                .iter()
                .zip(&shares)
                .zip(&split)
                .map(|((p, &share), bytes)| (p.name.as_str(), share, bytes)),
        );
        for (name, share, bytes) in layouts {
            let pool_config = pool_config(&config, name, share, bytes)?;
            let (cache, report) = Cache::open(pool_config).map_err(|e| CacheError::Pool {
                pool: name.to_string(),
                why: match e {
                    CacheError::TierFileSize { .. } => format!(
                        "{e}: the pools' quotas changed how the tiers are split since this \
                         file was written; move or delete the pools' tier files to start \
                         with the new split"
                    ),
                    e => e.to_string(),
                },
            })?;
            pools.push((name.to_string(), Arc::new(cache)));
            reports.push(report);
        }
        Ok((Pools { pools }, reports))
    }

    /// The default pool.
    pub fn default_pool(&self) -> &Arc<Cache> {
        &self.pools[0].1
    }

    /// The pool called `name` (`"default"` is the default pool).
    pub fn get(&self, name: &str) -> Option<&Arc<Cache>> {
        self.pools.iter().find(|(n, _)| n == name).map(|(_, c)| c)
    }

    /// The position of pool `name` in [`Pools::iter`].
    pub fn position(&self, name: &str) -> Option<usize> {
        self.pools.iter().position(|(n, _)| n == name)
    }

    /// The pool at `position` in [`Pools::iter`].
    pub fn at(&self, position: usize) -> Option<&Arc<Cache>> {
        self.pools.get(position).map(|(_, c)| c)
    }

    /// Every pool with its name, the default pool first.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arc<Cache>)> {
        self.pools.iter().map(|(n, c)| (n.as_str(), c))
    }

    /// Starts one mover thread per pool ([`Cache::start_movers`]).
    pub fn start_movers(&self, interval: Duration) -> Vec<Movers> {
        self.pools
            .iter()
            .map(|(_, c)| Cache::start_movers(c, interval))
            .collect()
    }

    /// Each pool's stats, in the order of [`Pools::iter`].
    pub fn stats(&self) -> Vec<(String, Stats)> {
        self.pools
            .iter()
            .map(|(n, c)| (n.clone(), c.stats()))
            .collect()
    }

    /// Moves every pool's clock forward (tests and simulations of TTL expiry).
    pub fn advance_clock(&self, secs: i64) {
        for (_, c) in &self.pools {
            c.advance_clock(secs);
        }
    }

    /// Empties every pool.
    pub fn flush_all(&self) {
        for (_, c) in &self.pools {
            c.flush_all();
        }
    }

    /// Clean shutdown of every pool ([`Cache::shutdown`]); all are tried, the first error
    /// is returned. A pool still shared (an `Arc` held elsewhere) is an error: it is not
    /// saved, so its next start scans its segments.
    pub fn shutdown(self) -> Result<(), CacheError> {
        let mut first = Ok(());
        for (name, cache) in self.pools {
            let result = match Arc::try_unwrap(cache) {
                Ok(cache) => cache.shutdown().map_err(|e| CacheError::Pool {
                    pool: name.clone(),
                    why: e.to_string(),
                }),
                Err(_) => Err(CacheError::Pool {
                    pool: name.clone(),
                    why: "still in use at shutdown".to_string(),
                }),
            };
            match result {
                Err(e) if first.is_ok() => first = Err(e),
                _ => {}
            }
        }
        first
    }
}

/// The configuration of one pool: `config` with its tiers cut to `bytes`, its expected
/// items and flash write budget scaled by `share` and, for a named pool, its file tiers
/// in their `pool-<name>` subdirectories (created when the tier directory exists; a
/// missing tier directory is reported by [`Cache::open`] as usual).
fn pool_config(
    config: &CacheConfig,
    name: &str,
    share: f64,
    bytes: &[u64],
) -> Result<CacheConfig, CacheError> {
    let mut c = config.clone();
    c.total_bytes = None;
    c.expected_items = config
        .expected_items
        .map(|n| ((n as f64 * share) as usize).max(1));
    c.flash_write_rate = config
        .flash_write_rate
        .map(|r| ((r as f64 * share) as u64).max(1));
    for (tier, &b) in c.tiers.iter_mut().zip(bytes) {
        tier.size = TierSize::Bytes(b);
        if name == DEFAULT_POOL {
            continue;
        }
        if let Medium::Flash {
            path: Some(path), ..
        } = &tier.medium
        {
            // One file or device cannot hold two pools' flash tiers.
            return Err(CacheError::Pool {
                pool: name.to_string(),
                why: format!(
                    "a flash tier at a path of its own ({}) serves one pool: with pools, \
                     leave the path out and each pool's flash file goes in its directory",
                    path.display()
                ),
            });
        }
        if let Medium::File { dir } | Medium::Flash { dir, .. } = &mut tier.medium {
            let sub = pool_dir(dir, name);
            if dir.is_dir() {
                std::fs::create_dir_all(&sub).map_err(|e| CacheError::Pool {
                    pool: name.to_string(),
                    why: format!("cannot create {}: {e}", sub.display()),
                })?;
            }
            *dir = sub;
        }
    }
    Ok(c)
}

impl Stats {
    /// The sum of several caches' stats (pools of one cache): counters and items added,
    /// tiers added position by position, the index memory per item weighted by items.
    pub fn combined<'a>(all: impl IntoIterator<Item = &'a Stats>) -> Stats {
        let mut out = Stats::default();
        let mut index_bytes = 0.0;
        for s in all {
            out.hits += s.hits;
            out.misses += s.misses;
            out.sets += s.sets;
            out.deletes += s.deletes;
            out.expired += s.expired;
            out.index_evictions += s.index_evictions;
            out.demotions += s.demotions;
            out.promotions += s.promotions;
            out.reinsertions += s.reinsertions;
            out.inline_evictions += s.inline_evictions;
            out.persist_errors += s.persist_errors;
            out.background_evictions += s.background_evictions;
            out.mover_errors += s.mover_errors;
            out.movers.add(&s.movers);
            out.items += s.items;
            // Per item, or the whole index of an empty cache: its memory either way.
            index_bytes += s.index_bytes_per_item * s.items.max(1) as f64;
            if out.tiers.len() < s.tiers.len() {
                out.tiers.resize(s.tiers.len(), TierStats::default());
            }
            for (sum, t) in out.tiers.iter_mut().zip(&s.tiers) {
                sum.add(t);
            }
        }
        out.index_bytes_per_item = index_bytes / out.items.max(1) as f64;
        out
    }
}
