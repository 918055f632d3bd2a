//! The last error of each thread, as text for `terrace_last_error`, plus `errno`.

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, CString};

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
