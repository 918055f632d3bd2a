//! Multi-threaded stress: threads allocate from shared kinds, hand objects to each other
//! and free what other threads allocated, while another thread keeps creating and
//! destroying kinds of its own. Every object's contents are verified by the thread that
//! frees it, and the kinds' accounting returns to (near) empty at the end.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use terrace_kinds::{detect_kind, free, FileKindOptions, Kind, Strategy};

struct Sent(NonNull<u8>, usize, u64);
// SAFETY: the pointer is an owned allocation handed from one thread to another.
unsafe impl Send for Sent {}

fn pattern(p: NonNull<u8>, len: usize, tag: u64) {
    // SAFETY: live allocation of len bytes.
    let bytes = unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), len) };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (tag as u8).wrapping_add(i as u8);
    }
}

fn verify(p: NonNull<u8>, len: usize, tag: u64) {
    // SAFETY: live allocation of len bytes.
    let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), len) };
    assert!(
        bytes
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (tag as u8).wrapping_add(i as u8)),
        "tag {tag}"
    );
}

#[test]
fn threads_share_kinds_and_free_each_others_objects() {
    const THREADS: usize = 4;
    const OPS: usize = 10_000;
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let file = Kind::create_file(&FileKindOptions::in_dir(dir.path(), 512 << 20)).unwrap();
    let small = Kind::create_file(&FileKindOptions::in_dir(dir.path(), 16 << 20)).unwrap();
    let unified = Kind::create_unified(&[small, Kind::DEFAULT], Strategy::RoundRobin).unwrap();
    let kinds = [Kind::DEFAULT, file, unified];

    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let stop = stop.clone();
        let path = dir.path().to_path_buf();
        std::thread::spawn(move || {
            let mut rounds = 0;
            while !stop.load(Ordering::Relaxed) {
                let k = Kind::create_file(&FileKindOptions::in_dir(&path, 16 << 20)).unwrap();
                let p = k.malloc(1000).unwrap();
                pattern(p, 1000, 9);
                verify(p, 1000, 9);
                k.destroy().unwrap();
                rounds += 1;
            }
            rounds
        })
    };

    let (senders, receivers): (Vec<_>, Vec<_>) =
        (0..THREADS).map(|_| mpsc::channel::<Sent>()).unzip();
    let workers: Vec<_> = receivers
        .into_iter()
        .enumerate()
        .map(|(t, inbox)| {
            let next = senders[(t + 1) % THREADS].clone();
            std::thread::spawn(move || {
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ t as u64;
                let mut mine: Vec<Sent> = Vec::new();
                for i in 0..OPS {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let kind = kinds[(rng % 3) as usize];
                    let len = match rng % 10 {
                        0 => 16_384 + (rng >> 8) as usize % 100_000,
                        1..=3 => 512 + (rng >> 8) as usize % 8000,
                        _ => 1 + (rng >> 8) as usize % 512,
                    };
                    let tag = (t * OPS + i) as u64;
                    let p = kind.malloc(len).unwrap();
                    assert!(detect_kind(p.as_ptr()).is_some());
                    pattern(p, len, tag);
                    let sent = Sent(p, len, tag);
                    if rng.is_multiple_of(2) {
                        let _ = next.send(sent);
                    } else {
                        mine.push(sent);
                    }
                    while let Ok(Sent(p, len, tag)) = inbox.try_recv() {
                        verify(p, len, tag);
                        // SAFETY: ownership came through the channel.
                        unsafe { free(p.as_ptr()) };
                    }
                    if mine.len() > 500 {
                        for Sent(p, len, tag) in mine.drain(..250) {
                            verify(p, len, tag);
                            // SAFETY: owned by this thread.
                            unsafe { free(p.as_ptr()) };
                        }
                    }
                }
                for Sent(p, len, tag) in mine {
                    verify(p, len, tag);
                    // SAFETY: owned by this thread.
                    unsafe { free(p.as_ptr()) };
                }
                inbox
            })
        })
        .collect();
    drop(senders);
    let inboxes: Vec<_> = workers
        .into_iter()
        .map(|w| w.join().expect("worker"))
        .collect();
    for inbox in inboxes {
        while let Ok(Sent(p, len, tag)) = inbox.try_recv() {
            verify(p, len, tag);
            // SAFETY: the sender no longer uses it.
            unsafe { free(p.as_ptr()) };
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = churn.join().expect("churn thread");
    assert!(rounds > 0);
    // Worker threads have exited, so their caches were flushed; flush this thread's too:
    // then everything allocated has been freed.
    terrace_kinds::flush_thread_caches();
    let left = file.stats().unwrap().allocated;
    assert_eq!(left, 0, "{left} bytes still allocated in the file kind");
    for k in [unified, small, file] {
        k.destroy().unwrap();
    }
}
