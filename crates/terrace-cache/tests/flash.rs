//! The flash tier: items demoted from DRAM into flash segments are read back with their
//! values; overwrites and deletes of flash items hold across a drop (an unclean stop:
//! write buffers lost, the kill log kept) and a clean shutdown brings every flash item
//! back; bad flash files are clear errors.

use std::collections::HashMap;
use std::path::Path;

use terrace_cache::flash::flash_path;
use terrace_cache::{Cache, CacheConfig, CacheError, TierConfig, TierSize};

mod common;
use common::{config, flash_dir, MIB};

fn dram_and_flash(dir: &Path) -> CacheConfig {
    CacheConfig {
        expected_items: Some(200_000),
        ..config(vec![
            TierConfig::dram(TierSize::Bytes(2 * MIB)),
            TierConfig::flash(dir, TierSize::Bytes(16 * MIB)),
        ])
    }
}

fn value(k: u32, version: u32) -> Vec<u8> {
    let mut v = format!("{k}:{version}:").into_bytes();
    v.resize(100 + (k as usize * 37) % 1500, b'a' + (version % 26) as u8);
    v
}

/// Writes `keys` keys, each read once soon after (so that DRAM probation passes it on
/// to flash); returns the latest version of each.
fn fill(c: &Cache, keys: u32, version: u32) -> HashMap<u32, u32> {
    let mut latest = HashMap::new();
    for k in 0..keys {
        c.set(format!("key{k}").as_bytes(), &value(k, version), 0, 0)
            .unwrap();
        latest.insert(k, version);
        if k >= 10 {
            let _ = c.get(format!("key{}", k - 10).as_bytes()).unwrap();
        }
    }
    latest
}

/// Every hit has the latest value; returns (hits, hits on flash).
fn check(c: &Cache, latest: &HashMap<u32, u32>, deleted: &[u32]) -> (usize, usize) {
    let (mut hits, mut flash) = (0, 0);
    for (&k, &v) in latest {
        if let Some(g) = c.get(format!("key{k}").as_bytes()).unwrap() {
            assert_eq!(g.value(), &value(k, v)[..], "key{k}");
            hits += 1;
            flash += usize::from(g.tier() == 1);
        }
    }
    for k in deleted {
        assert!(
            c.get(format!("key{k}").as_bytes()).unwrap().is_none(),
            "deleted key{k}"
        );
    }
    (hits, flash)
}

#[test]
fn demoted_items_are_read_back_from_flash() {
    let dir = flash_dir();
    let (c, _) = Cache::open(dram_and_flash(dir.path())).unwrap();
    let latest = fill(&c, 12_000, 0);
    let (hits, flash) = check(&c, &latest, &[]);
    let s = c.stats();
    let f = &s.tiers[1];
    eprintln!("{hits} hits, {flash} on flash; {f:?}");
    assert!(flash > 1000, "{hits} hits, {flash} from flash: {s:?}");
    let fs = f.flash.as_ref().unwrap();
    assert!(fs.bytes_written > 0 && fs.reads > 0, "{fs:?}");
    assert!(f.demotions_in > 0 && f.hits > 0, "{f:?}");
    // On a disk, flushed at a clean stop (a page-cache tier's durability); on tmpfs,
    // a process crash only.
    use terrace_media::Durability;
    let expected = if fs.emulated {
        Durability::Process
    } else {
        Durability::Power
    };
    assert_eq!(f.durability, Some(expected));
    assert_eq!(f.flushed_at_shutdown, !fs.emulated);
    // Flash holds about 1 KiB per item it indexes.
    let per_item = f.live_bytes as f64 / f.items as f64;
    assert!(
        (300.0..3000.0).contains(&per_item),
        "{per_item} live bytes per item: {f:?}"
    );
}

/// A write budget caps the bytes admitted to flash by the time the run took (an upper
/// bound, so a slow machine only loosens it); what it refuses is counted, and what it
/// admits reads back.
#[test]
fn the_write_budget_caps_what_reaches_flash_and_counts_the_rest() {
    let dir = flash_dir();
    let rate = 256 << 10;
    let start = std::time::Instant::now();
    let (c, _) = Cache::open(CacheConfig {
        flash_write_rate: Some(rate),
        ..dram_and_flash(dir.path())
    })
    .unwrap();
    let latest = fill(&c, 12_000, 0);
    c.flush_flash();
    let seconds = start.elapsed().as_secs_f64();
    let (hits, flash) = check(&c, &latest, &[]);
    let s = c.stats();
    let f = &s.tiers[1];
    let fs = f.flash.as_ref().unwrap();
    eprintln!("{seconds:.2} s, {hits} hits, {flash} on flash; {fs:?}");
    assert_eq!(fs.write_rate, Some(rate));
    assert!(fs.refused_budget > 0 && flash > 0, "{fs:?}");
    // Admitted: at most rate·t plus the bucket (a quarter second, or one segment);
    // written: whole 32 KiB segments, each at most a largest item short of full.
    let segment = 32 << 10;
    let admitted = rate as f64 * seconds + (rate as f64 / 4.0).max(segment as f64);
    let bound = admitted * 1.1 + 2.0 * segment as f64;
    assert!(
        (fs.bytes_written as f64) <= bound,
        "{} bytes written in {seconds:.2} s at {rate} B/s: {fs:?}",
        fs.bytes_written
    );
}

/// A fetch run on another thread stages a flash item in DRAM: the get after it reads no
/// block, and an item overwritten after its fetch is never served from the stage.
#[test]
fn a_fetch_stages_flash_items_for_the_next_get() {
    let dir = flash_dir();
    let (c, _) = Cache::open(dram_and_flash(dir.path())).unwrap();
    let latest = fill(&c, 12_000, 0);
    c.flush_flash();
    let on_flash: Vec<u32> = (0..12_000)
        .filter(|k| c.flash_fetch(format!("key{k}").as_bytes()).is_some())
        .take(200)
        .collect();
    assert!(on_flash.len() == 200, "{} keys on flash", on_flash.len());
    let reads = |c: &Cache| c.stats().tiers[1].flash.as_ref().unwrap().reads;
    for &k in &on_flash[..100] {
        let key = format!("key{k}");
        let fetch = c.flash_fetch(key.as_bytes()).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| c.run_flash_fetch(&fetch));
        });
        assert!(c.flash_fetch(key.as_bytes()).is_none(), "{key} staged");
        let before = reads(&c);
        let g = c.get(key.as_bytes()).unwrap().expect("a hit");
        assert_eq!(g.value(), &value(k, latest[&k])[..]);
        assert_eq!(reads(&c), before, "{key}: the get read the device");
    }
    // Fetched, then overwritten: the new value, from DRAM.
    for &k in &on_flash[100..] {
        let key = format!("key{k}");
        let fetch = c.flash_fetch(key.as_bytes()).unwrap();
        c.run_flash_fetch(&fetch);
        c.set(key.as_bytes(), &value(k, 1), 0, 0).unwrap();
        assert!(c.flash_fetch(key.as_bytes()).is_none());
        let g = c.get(key.as_bytes()).unwrap().expect("a hit");
        assert_eq!(g.value(), &value(k, 1)[..]);
        assert_eq!(g.tier(), 0);
    }
    let fs = c.stats().tiers[1].flash.clone().unwrap();
    assert!(fs.staged >= 200 && fs.staged_used >= 100, "{fs:?}");
}

#[test]
fn overwrites_and_deletes_of_flash_items_hold_across_an_unclean_stop() {
    let dir = flash_dir();
    let (c, _) = Cache::open(dram_and_flash(dir.path())).unwrap();
    let mut latest = fill(&c, 12_000, 0);
    c.flush_flash();
    // Overwrite a third, delete a tenth: their flash copies must never come back.
    let mut deleted = Vec::new();
    for k in (0..12_000).step_by(3) {
        c.set(format!("key{k}").as_bytes(), &value(k, 1), 0, 0)
            .unwrap();
        latest.insert(k, 1);
    }
    for k in (1..12_000).step_by(10) {
        c.delete(format!("key{k}").as_bytes()).unwrap();
        latest.remove(&k);
        deleted.push(k);
    }
    let logged = c.stats().tiers[1].flash.as_ref().unwrap().kills_logged;
    assert!(logged > 0);
    drop(c);
    let (c, report) = Cache::open(dram_and_flash(dir.path())).unwrap();
    let (hits, flash) = check(&c, &latest, &deleted);
    eprintln!("after an unclean stop: {hits} hits, {flash} on flash; {report:?}");
    assert!(flash > 500, "{report:?}");
}

#[test]
fn a_clean_shutdown_brings_every_flash_item_back() {
    let dir = flash_dir();
    let (c, _) = Cache::open(dram_and_flash(dir.path())).unwrap();
    let latest = fill(&c, 12_000, 0);
    let before: Vec<(u32, usize)> = latest
        .keys()
        .filter_map(|&k| Some((k, c.peek(format!("key{k}").as_bytes()).unwrap()?.tier())))
        .collect();
    let on_flash = before.iter().filter(|(_, t)| *t == 1).count();
    c.shutdown().unwrap();
    let (c, report) = Cache::open(dram_and_flash(dir.path())).unwrap();
    assert!(report.from_saved_index > 0, "{report:?}");
    let back = before
        .iter()
        .filter(|(k, _)| c.peek(format!("key{k}").as_bytes()).unwrap().is_some())
        .count();
    check(&c, &latest, &[]);
    assert!(on_flash > 1000);
    assert_eq!(back, before.len(), "{report:?}");
}

#[test]
fn a_flash_file_of_another_size_is_refused() {
    let dir = flash_dir();
    drop(Cache::open(dram_and_flash(dir.path())).unwrap());
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(flash_path(dir.path(), 1))
        .unwrap();
    f.set_len(8 * MIB).unwrap();
    let e = Cache::open(dram_and_flash(dir.path())).unwrap_err();
    assert!(matches!(e, CacheError::TierFileSize { .. }), "{e}");
}

#[test]
fn a_corrupt_flash_segment_is_dropped_with_a_reason() {
    let dir = flash_dir();
    let (c, _) = Cache::open(dram_and_flash(dir.path())).unwrap();
    let latest = fill(&c, 12_000, 0);
    c.flush_flash();
    drop(c);
    // Damage an item byte of every stored segment's second block.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(flash_path(dir.path(), 1))
        .unwrap();
    use std::os::unix::fs::FileExt;
    for seg in 0..((16 * MIB) >> 15) {
        let at = (seg << 15) + 5000;
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0x55], at).unwrap();
    }
    let (c, report) = Cache::open(dram_and_flash(dir.path())).unwrap();
    assert!(!report.dropped.is_empty(), "{report:?}");
    check(&c, &latest, &[]);
}

#[test]
fn flash_must_be_the_last_tier_below_a_memory_tier() {
    let dir = flash_dir();
    let e = Cache::open(config(vec![TierConfig::flash(
        dir.path(),
        TierSize::Bytes(MIB),
    )]))
    .unwrap_err();
    assert!(matches!(e, CacheError::Config { .. }), "{e}");
    let e = Cache::open(config(vec![
        TierConfig::flash(dir.path(), TierSize::Bytes(16 * MIB)),
        TierConfig::dram(TierSize::Bytes(2 * MIB)),
    ]))
    .unwrap_err();
    assert!(matches!(e, CacheError::Config { .. }), "{e}");
}

#[test]
fn a_full_flash_tier_evicts_oldest_first_and_reinserts_what_is_read() {
    let dir = flash_dir();
    let (c, _) = Cache::open(dram_and_flash(dir.path())).unwrap();
    // About six laps of the flash tier; a few hot keys read all along.
    let mut latest = HashMap::new();
    for k in 0..70_000u32 {
        c.set(format!("key{k}").as_bytes(), &value(k, 0), 0, 0)
            .unwrap();
        latest.insert(k, 0);
        if k >= 10 {
            let _ = c.get(format!("key{}", k - 10).as_bytes()).unwrap();
        }
        if k % 500 == 0 {
            for h in 0..20 {
                let _ = c.get(format!("key{h}").as_bytes()).unwrap();
            }
        }
    }
    check(&c, &latest, &[]);
    let s = c.stats();
    let f = &s.tiers[1];
    assert!(f.segments_evicted > 0 && f.items_evicted > 0, "{f:?}");
    assert!(f.reinserted > 0, "{f:?}");
    for h in 0..20 {
        assert!(
            c.get(format!("key{h}").as_bytes()).unwrap().is_some(),
            "hot key{h}"
        );
    }
    // Evicted segments were given back to the file system.
    let fs = f.flash.as_ref().unwrap();
    assert_eq!(fs.punch_fallbacks, 0, "{fs:?}");
}

/// The flash buffers are counted in the DRAM budget: at 2 MiB segments the DRAM tier
/// above flash gives up three, and one too small for that and its minimum is refused.
#[test]
fn the_flash_buffers_come_out_of_the_dram_tier() {
    let dir = flash_dir();
    let with_dram = |dram: u64| CacheConfig {
        segment_shift: Some(21),
        ..config(vec![
            TierConfig::dram(TierSize::Bytes(dram)),
            TierConfig::flash(dir.path(), TierSize::Bytes(32 * MIB)),
        ])
    };
    let (c, _) = Cache::open(with_dram(32 * MIB)).unwrap();
    assert_eq!(c.stats().tiers[0].segments, 16 - 3);
    drop(c);
    let e = Cache::open(with_dram(16 * MIB)).unwrap_err();
    assert!(
        matches!(
            e,
            CacheError::TierTooSmall {
                tier: 0,
                segments: 8,
                min: 11,
                ..
            }
        ),
        "{e}"
    );
}

fn dram_and_flash_at(dir: &Path, path: &Path, bytes: u64) -> CacheConfig {
    CacheConfig {
        expected_items: Some(200_000),
        ..config(vec![
            TierConfig::dram(TierSize::Bytes(2 * MIB)),
            TierConfig::flash_at(dir, path, TierSize::Bytes(bytes)),
        ])
    }
}

/// Fills a cache whose flash tier is at `path`, deletes and overwrites some keys, stops
/// uncleanly and reopens (no deleted or old value back), then stops cleanly and reopens
/// (every item back).
fn holds_items_at(dir: &Path, path: &Path) {
    let (c, _) = Cache::open(dram_and_flash_at(dir, path, 16 * MIB)).unwrap();
    let mut latest = fill(&c, 12_000, 0);
    let deleted: Vec<u32> = (0..2_000).step_by(7).collect();
    for k in &deleted {
        c.delete(format!("key{k}").as_bytes()).unwrap();
        latest.remove(k);
    }
    let overwritten: Vec<u32> = (1..2_000)
        .step_by(5)
        .filter(|k| latest.contains_key(k))
        .collect();
    for k in overwritten {
        c.set(format!("key{k}").as_bytes(), &value(k, 1), 0, 0)
            .unwrap();
        latest.insert(k, 1);
    }
    let (_, flash) = check(&c, &latest, &deleted);
    assert!(flash > 1000, "{flash} hits on flash");
    c.flush_flash();
    drop(c);
    let (c, report) = Cache::open(dram_and_flash_at(dir, path, 16 * MIB)).unwrap();
    let (_, flash) = check(&c, &latest, &deleted);
    assert!(flash > 500, "{report:?}");
    let on_flash = in_tier(&c, latest.keys().copied(), 1);
    c.shutdown().unwrap();
    let (c, report) = Cache::open(dram_and_flash_at(dir, path, 16 * MIB)).unwrap();
    assert!(report.from_saved_index > 0, "{report:?}");
    for k in &on_flash {
        assert!(
            c.peek(format!("key{k}").as_bytes()).unwrap().is_some(),
            "key{k}"
        );
    }
    check(&c, &latest, &deleted);
    let f = c.stats().tiers[1].flash.clone().unwrap();
    assert!(!f.emulated, "{f:?}");
    assert!(
        !flash_path(dir, 1).exists(),
        "no flash file in the directory"
    );
    assert!(terrace_cache::flash::kills_path(dir, 1).exists());
}

#[test]
fn a_flash_tier_at_a_path_of_its_own_keeps_its_items() {
    let dir = flash_dir();
    let elsewhere = flash_dir();
    let path = elsewhere.path().join("cache.flash");
    holds_items_at(dir.path(), &path);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 16 * MIB);
}

/// A loop device over a file, detached when dropped.
struct LoopDevice {
    path: std::path::PathBuf,
}

impl LoopDevice {
    /// `None` where loop devices cannot be attached here (not root, no loop driver).
    fn attach(backing: &Path) -> Option<LoopDevice> {
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(backing)
            .output()
            .ok()?;
        if !out.status.success() {
            eprintln!(
                "losetup refused: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return None;
        }
        let path = String::from_utf8(out.stdout).ok()?.trim().into();
        Some(LoopDevice { path })
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .arg("-d")
            .arg(&self.path)
            .status();
    }
}

/// A raw block device as the flash tier: used as it is (no file system, no
/// `fallocate`), its items kept across unclean and clean stops; a tier larger than the
/// device is a clear error. Runs where a loop device can be attached (root).
#[test]
fn a_block_device_serves_as_the_flash_tier() {
    let dir = flash_dir();
    let backing = dir.path().join("device.img");
    std::fs::File::create(&backing)
        .unwrap()
        .set_len(20 * MIB)
        .unwrap();
    let Some(device) = LoopDevice::attach(&backing) else {
        eprintln!("skipped: no loop device could be attached");
        return;
    };
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    holds_items_at(&state, &device.path);
    let e = Cache::open(dram_and_flash_at(&state, &device.path, 32 * MIB)).unwrap_err();
    assert!(e.to_string().contains("no space"), "{e}");
}

/// A flash segment whose items have all expired is freed by the movers as soon as they
/// have (a memory tier's TTL buckets, on flash): nothing in it is reinserted or written
/// again, its items count as expired, not evicted; segments holding an item without a
/// TTL stay.
#[test]
fn flash_segments_whose_items_all_expired_are_freed_without_a_rewrite() {
    let dir = flash_dir();
    let (c, _) = Cache::open(dram_and_flash(dir.path())).unwrap();
    for k in 0..12_000u32 {
        // The last keys never expire: the segments they reach must stay.
        let ttl = if k < 9_000 { 100 } else { 0 };
        c.set(format!("key{k}").as_bytes(), &value(k, 0), 0, ttl)
            .unwrap();
        if k >= 10 {
            let _ = c.get(format!("key{}", k - 10).as_bytes()).unwrap();
        }
    }
    c.flush_flash();
    let before = c.stats().tiers[1].clone();
    let written = before.flash.as_ref().unwrap().bytes_written;
    assert!(
        before.items > 1000 && before.sealed_segments > 2,
        "{before:?}"
    );
    c.advance_clock(50);
    c.maintain().unwrap();
    assert_eq!(c.stats().tiers[1].segments_evicted, before.segments_evicted);
    c.advance_clock(100);
    c.maintain().unwrap();
    let after = c.stats().tiers[1].clone();
    let freed = after.segments_evicted - before.segments_evicted;
    eprintln!("{freed} flash segments freed; before {before:?}; after {after:?}");
    assert!(freed > 0, "{after:?}");
    assert!(after.items_expired > 1000, "{after:?}");
    assert_eq!(after.items_evicted, before.items_evicted, "{after:?}");
    assert_eq!(after.reinserted, before.reinserted, "{after:?}");
    // Only what the DRAM tier's own maintenance demoted meanwhile was written (a
    // rewrite of the expired items would be about all of `written` again).
    let more = after.flash.as_ref().unwrap().bytes_written - written;
    assert!(more < written / 10, "{more} more bytes written");
    // Each freed segment was read back once (its keys drop their index entries).
    let read = after.flash.as_ref().unwrap().bytes_read - before.flash.as_ref().unwrap().bytes_read;
    assert!(
        read >= freed * 4096,
        "{read} bytes read for {freed} segments"
    );
    // The keys without a TTL that reached flash are all still there.
    assert!(after.sealed_segments > 0 && after.items > 0, "{after:?}");
    for k in 9_000..11_990u32 {
        if let Some(g) = c.peek(format!("key{k}").as_bytes()).unwrap() {
            assert_eq!(g.value(), &value(k, 0)[..]);
        }
    }
    for k in 0..9_000u32 {
        assert!(
            c.get(format!("key{k}").as_bytes()).unwrap().is_none(),
            "key{k}"
        );
    }
}

fn promoting(dir: &Path) -> CacheConfig {
    CacheConfig {
        promote: true,
        ..dram_and_flash(dir)
    }
}

/// Reads each of `keys` three times (its entry then asks for promotion) and runs the
/// movers' work; returns those now in tier 0.
fn promote(c: &Cache, keys: &[u32]) -> Vec<u32> {
    for k in keys {
        for _ in 0..3 {
            let _ = c.get(format!("key{k}").as_bytes()).unwrap();
        }
        c.maintain().unwrap();
    }
    in_tier(c, keys.iter().copied(), 0)
}

/// Those of `keys` whose items are in tier `tier` (1: flash), in order.
fn in_tier(c: &Cache, keys: impl IntoIterator<Item = u32>, tier: usize) -> Vec<u32> {
    let mut found: Vec<u32> = keys
        .into_iter()
        .filter(|k| {
            c.peek(format!("key{k}").as_bytes())
                .unwrap()
                .is_some_and(|g| g.tier() == tier)
        })
        .collect();
    found.sort_unstable();
    found
}

/// Keys of `latest` whose items are on flash, stored (not in a write buffer).
fn stored_on_flash(c: &Cache, latest: &HashMap<u32, u32>) -> Vec<u32> {
    c.flush_flash();
    in_tier(c, latest.keys().copied(), 1)
}

/// A cache with promotion on, 12k items written, and 300 of those stored on flash read
/// until promoted; returns it, the latest versions and the keys promoted (over 100).
fn with_promoted(dir: &Path) -> (Cache, HashMap<u32, u32>, Vec<u32>) {
    let (c, _) = Cache::open(promoting(dir)).unwrap();
    let latest = fill(&c, 12_000, 0);
    let on_flash = stored_on_flash(&c, &latest);
    let promoted = promote(&c, &on_flash[..300]);
    assert!(promoted.len() > 100, "{} promoted", promoted.len());
    (c, latest, promoted)
}

#[test]
fn a_promotion_out_of_flash_leaves_a_replica_that_demotion_returns_to() {
    let dir = flash_dir();
    let (c, mut latest, promoted) = with_promoted(dir.path());
    let f = c.stats().tiers[1].flash.clone().unwrap();
    assert_eq!(f.replicas as usize, promoted.len(), "{f:?}");
    // New keys push tier 0 out: the promoted items go back to their replicas.
    let written = f.bytes_written;
    for k in 20_000..26_000 {
        c.set(format!("key{k}").as_bytes(), &value(k, 0), 0, 0)
            .unwrap();
        latest.insert(k, 0);
    }
    c.maintain().unwrap();
    let f = c.stats().tiers[1].flash.clone().unwrap();
    eprintln!("{} promoted; {f:?}", promoted.len());
    assert!(f.replica_demotions > 50, "{f:?}");
    assert!(f.bytes_written > written);
    let back = in_tier(&c, promoted.iter().copied(), 1).len();
    assert!(
        back as u64 >= f.replica_demotions / 2,
        "{back} back on flash: {f:?}"
    );
    check(&c, &latest, &[]);
}

#[test]
fn writes_to_promoted_items_kill_their_replicas_across_an_unclean_stop() {
    let dir = flash_dir();
    let (c, mut latest, promoted) = with_promoted(dir.path());
    // Overwrite a third, touch a third (a new expiry is a new version too), delete the
    // rest: no replica may come back.
    let mut deleted = Vec::new();
    for (i, k) in promoted.iter().enumerate() {
        let key = format!("key{k}");
        match i % 3 {
            0 => {
                c.set(key.as_bytes(), &value(*k, 1), 0, 0).unwrap();
                latest.insert(*k, 1);
            }
            1 => assert!(c.touch(key.as_bytes(), 3).unwrap()),
            _ => {
                c.delete(key.as_bytes()).unwrap();
                latest.remove(k);
                deleted.push(*k);
            }
        }
    }
    assert_eq!(c.stats().tiers[1].flash.as_ref().unwrap().replicas, 0);
    drop(c);
    let (c, report) = Cache::open(promoting(dir.path())).unwrap();
    let touched: Vec<u32> = promoted.iter().copied().skip(1).step_by(3).collect();
    for k in &touched {
        // Lost with DRAM (a miss), or the touched version: never the untouched one.
        if let Some(g) = c.peek(format!("key{k}").as_bytes()).unwrap() {
            assert!(g.expires_at().is_some(), "key{k} came back untouched");
        }
        latest.remove(k);
    }
    let (hits, flash) = check(&c, &latest, &deleted);
    eprintln!("after an unclean stop: {hits} hits, {flash} on flash; {report:?}");
    assert!(flash > 500, "{report:?}");
}

#[test]
fn a_clean_shutdown_kills_replicas_so_a_later_crash_cannot_bring_one_back() {
    let dir = flash_dir();
    let (c, mut latest, promoted) = with_promoted(dir.path());
    c.shutdown().unwrap();
    // The promoted items come back in tier 0 (its snapshot); their flash copies must be
    // dead, since nothing remembers them now.
    let (c, _) = Cache::open(promoting(dir.path())).unwrap();
    for k in &promoted {
        c.set(format!("key{k}").as_bytes(), &value(*k, 2), 0, 0)
            .unwrap();
        latest.insert(*k, 2);
    }
    drop(c);
    let (c, report) = Cache::open(promoting(dir.path())).unwrap();
    let (hits, _) = check(&c, &latest, &[]);
    eprintln!("after a clean stop and a crash: {hits} hits; {report:?}");
}

#[test]
fn promotion_is_on_by_default_with_a_flash_tier_only() {
    let dir = flash_dir();
    let with_flash = CacheConfig::new(vec![
        TierConfig::dram(TierSize::Bytes(2 * MIB)),
        TierConfig::flash(dir.path(), TierSize::Bytes(16 * MIB)),
    ]);
    assert!(with_flash.promote);
    let memory_only = CacheConfig::new(vec![
        TierConfig::dram(TierSize::Bytes(2 * MIB)),
        TierConfig::file(dir.path(), TierSize::Bytes(8 * MIB)),
    ]);
    assert!(!memory_only.promote);
}
