//! The last error of each thread, as text for `terrace_last_error`, plus `errno`; and
//! [`boundary`], which every `extern "C"` entry point of this crate runs under; and the
//! small argument and failure helpers every entry point shares.

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, c_int, CStr, CString};

use terrace_kinds::KindError;

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
    /// The memkind error code the last message was recorded for (0: none).
    static LAST_CODE: Cell<i32> = const { Cell::new(0) };
}

/// Marks the last recorded message as describing memkind error `code`.
pub fn tag_memkind_code(code: i32) {
    let _ = LAST_CODE.try_with(|c| c.set(code));
}

/// The memkind error code the last message describes (0 if none).
pub fn last_memkind_code() -> i32 {
    LAST_CODE.try_with(Cell::get).unwrap_or(0)
}

/// Records `err` as this thread's last error, sets `errno`, and returns the errno value.
pub fn record(err: &KindError) -> i32 {
    let code = err.errno();
    record_message(&err.to_string());
    set_errno(code);
    code
}

/// Records a message without an underlying kind error.
pub fn record_message(message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    let _ = LAST.try_with(|last| *last.borrow_mut() = text);
    tag_memkind_code(0);
}

/// Sets the calling thread's `errno`.
pub fn set_errno(code: i32) {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = code };
}

/// Pointer to this thread's last error message (valid until the next error on the thread).
pub fn last_message() -> *const c_char {
    LAST.try_with(|last| last.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// The `errno` of a panic caught at the boundary: an internal error, not the caller's.
pub const PANIC_ERRNO: i32 = libc::EIO;

/// Runs the body of entry point `what` under [`terrace_media::ffi::boundary_with`]: a panic
/// records `"{what}: internal error (panic: …)"` as the thread's last error, sets `errno`
/// to [`PANIC_ERRNO`] and returns `on_panic`, the error value `what`'s header documents.
pub fn boundary<T>(what: &str, on_panic: T, body: impl FnOnce() -> T) -> T {
    boundary_then(what, on_panic, || {}, body)
}

/// [`boundary`], running `then` after a panic is recorded (a transaction's entry points
/// abort the thread's transaction there, as any failure of theirs does).
pub fn boundary_then<T>(
    what: &str,
    on_panic: T,
    then: impl FnOnce(),
    body: impl FnOnce() -> T,
) -> T {
    terrace_media::ffi::boundary_with(
        |message| {
            record_message(&format!("{what}: internal error (panic: {message})"));
            then();
            set_errno(PANIC_ERRNO);
            on_panic
        },
        || {
            #[cfg(test)]
            inject::panic_if_armed(what);
            body()
        },
    )
}

/// Records `message` as the thread's last error and sets `errno` to `code`; returns `code`.
pub(crate) fn fail_with(code: c_int, message: &str) -> c_int {
    record_message(message);
    set_errno(code);
    code
}

/// The UTF-8 string at `s`; `None` for NULL or for bytes that are not UTF-8.
///
/// # Safety
/// `s` must be null or NUL-terminated.
pub(crate) unsafe fn str_arg<'a>(s: *const c_char) -> Option<&'a str> {
    if s.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated (contract).
    unsafe { CStr::from_ptr(s) }.to_str().ok()
}

/// Test-only panic injection: the next entry point the armed thread enters panics at the
/// top of its boundary, so a test can see the boundary turn that into the error value.
#[cfg(test)]
pub(crate) mod inject {
    use std::cell::Cell;

    thread_local! {
        static ARMED: Cell<bool> = const { Cell::new(false) };
        static FIRED: Cell<bool> = const { Cell::new(false) };
    }

    /// Arms the calling thread's next boundary to panic.
    pub fn arm() {
        ARMED.with(|a| a.set(true));
        FIRED.with(|f| f.set(false));
    }

    /// Whether a boundary fired the armed panic since [`arm`] (and disarms).
    pub fn fired() -> bool {
        ARMED.with(|a| a.set(false));
        FIRED.with(Cell::get)
    }

    pub(super) fn panic_if_armed(what: &str) {
        if ARMED.with(|a| a.replace(false)) {
            FIRED.with(|f| f.set(true));
            panic!("injected panic in {what}");
        }
    }
}
