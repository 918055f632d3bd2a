//! What the integration tests of this crate share: where the workspace is, and where the
//! `libterrace.so` this `cargo test` run built lies (see `c_abi.rs`'s module docs).

use std::path::{Path, PathBuf};

/// The workspace root (holds `include/`).
pub fn workspace() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize()
        .unwrap_or_else(|e| panic!("cannot resolve workspace root {}: {e}", root.display()))
}

/// The directory holding the `libterrace.so` built by this `cargo test` run: the
/// directory of this test binary (see `c_abi.rs`'s module docs). A copy in `<target>/<profile>/`
/// is deliberately not used as a fallback: it is left over from some `cargo build` and
/// may be stale.
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("cannot find the path of the test binary");
    let deps = exe
        .parent()
        .unwrap_or_else(|| panic!("test binary {} has no parent directory", exe.display()));
    assert!(
        deps.join("libterrace.so").is_file(),
        "libterrace.so not found in {} (cargo test builds the cdylib next to the test \
         binary {}; has the crate-type of terrace-capi changed?)",
        deps.display(),
        exe.display()
    );
    deps.to_path_buf()
}
