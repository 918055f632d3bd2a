//! The panic boundary of every function C calls: the C ABI's entry points
//! (`terrace-capi`) and jemalloc's extent hooks (`terrace-kinds`).
//!
//! Invariants:
//! - a panic never unwinds out of [`boundary`] or [`boundary_with`]: unwinding into C frames is undefined
//!   behaviour, and out of an `extern "C"` function Rust aborts the process instead; the
//!   caller gets the error value its contract documents (NULL, -1, an errno), so a bug
//!   becomes one failed call, not a dead process;
//! - the panic's payload is dropped under the boundary too (a payload's `Drop` may itself
//!   panic), and a panic while the error value is built aborts the process, as a panic
//!   during a panic does in Rust;
//! - what the body left half done is the body's business: code run under a boundary keeps
//!   its state valid at every point a panic can occur, or rolls back on drop (a pool
//!   transaction does).

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `body`; if it panics, returns `on_panic` instead.
pub fn boundary<T>(on_panic: T, body: impl FnOnce() -> T) -> T {
    boundary_with(|_| on_panic, body)
}

/// Runs `body`; if it panics, returns `on_panic(message)` instead, `message` being the
/// panic's text (or `"panic"` when its payload is not text), for the caller to report.
pub fn boundary_with<T>(on_panic: impl FnOnce(&str) -> T, body: impl FnOnce() -> T) -> T {
    // AssertUnwindSafe: see the module's third invariant.
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            let message = message_of(&*payload);
            drop_quietly(payload);
            catch_unwind(AssertUnwindSafe(|| on_panic(&message)))
                .unwrap_or_else(|_| std::process::abort())
        }
    }
}

/// The text of a panic payload (`panic!` with a literal or a format string).
fn message_of(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".to_string()
    }
}

/// Drops a panic payload; a panic from its `Drop` is caught and its own payload leaked.
fn drop_quietly(payload: Box<dyn Any + Send>) {
    if let Err(again) = catch_unwind(AssertUnwindSafe(|| drop(payload))) {
        std::mem::forget(again);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_passes_through() {
        assert_eq!(boundary(-1, || 7), 7);
        assert_eq!(boundary(-1, || -> i32 { panic!("bad") }), -1);
    }

    #[test]
    fn a_panic_becomes_the_error_value_with_its_message() {
        let mut seen = String::new();
        let got = boundary_with(
            |message| {
                seen = message.to_string();
                -1
            },
            || -> i32 { panic!("bad {}", 42) },
        );
        assert_eq!(got, -1);
        assert_eq!(seen, "bad 42");
    }

    #[test]
    fn a_payload_that_is_not_text_is_named_panic() {
        let got = boundary_with(|m| m.to_string(), || std::panic::panic_any(5u8));
        assert_eq!(got, "panic");
    }
}
