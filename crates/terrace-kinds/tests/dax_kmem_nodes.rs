//! `MEMKIND_DAX_KMEM_NODES` names the nodes of the CPU-less-memory selection
//! (`MEMKIND_DAX_KMEM`), as in memkind. The selection is made once per process, so each
//! case runs in a child process of this test binary with its own environment.

use std::process::Command;

use terrace_kinds::{detect_kind, Kind, KindMedium, DAX_KMEM_NODES_ENV};

const CASE_ENV: &str = "TERRACE_DAX_KMEM_CASE";

/// Run by `the_variable_names_the_nodes_or_is_an_error` in a child process: allocates
/// through the selection and prints the node the memory's kind lives on, or the error.
#[test]
#[ignore = "run by the_variable_names_the_nodes_or_is_an_error as a child process"]
fn child_allocates_from_the_selection() {
    if std::env::var_os(CASE_ENV).is_none() {
        return;
    }
    match Kind::cpu_less_memory() {
        Ok(kind) => {
            let ptr = kind.malloc(1 << 20).expect("malloc");
            let owner = detect_kind(ptr.as_ptr()).expect("an owner");
            println!("placed: {:?}", owner.medium());
            // SAFETY: allocated above, freed once.
            unsafe { terrace_kinds::free(ptr.as_ptr()) };
        }
        Err(e) => println!("error: {e}"),
    }
}

fn run_case(nodes: Option<&str>) -> String {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args([
        "--exact",
        "child_allocates_from_the_selection",
        "--ignored",
        "--nocapture",
    ])
    .env(CASE_ENV, "1")
    .env_remove(DAX_KMEM_NODES_ENV);
    if let Some(nodes) = nodes {
        cmd.env(DAX_KMEM_NODES_ENV, nodes);
    }
    let out = cmd.output().expect("child");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "child failed: {text}");
    text
}

#[test]
fn the_variable_names_the_nodes_or_is_an_error() {
    // Node 0 exists on every machine: named, it serves the selection.
    let named = run_case(Some("0"));
    assert!(
        named.contains(&format!("placed: {:?}", Some(KindMedium::Numa(0)))),
        "{named}"
    );
    for bad in ["", "zero", "0,", "5-2"] {
        let out = run_case(Some(bad));
        assert!(
            out.contains("error:") && out.contains(DAX_KMEM_NODES_ENV),
            "{bad:?}: {out}"
        );
    }
    let missing = run_case(Some("4095"));
    assert!(missing.contains("error:"), "{missing}");
    // Unset: the CPU-less nodes, which a machine without them does not have.
    let detected = run_case(None);
    let has_cpu_less = !terrace_media::numa::Topology::discover()
        .cpu_less()
        .is_empty();
    assert_eq!(detected.contains("error:"), !has_cpu_less, "{detected}");
}
