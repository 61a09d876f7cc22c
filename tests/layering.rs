//! The house's layering (docs/architecture.md §8), checked on the source itself: imports run
//! one way, from the front down to the engine, and no two files of a folder import each other.
//! A folder's place is in [`LAYERS`]; a module may name (in code, not in comments) only
//! modules of its own folder or of a lower layer.
//!
//! The rooms also follow the processes: what runs confined (`interpreter/`, and what it
//! imports) is apart from the front, which never imports it; only `main.rs` starts it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The top-level modules of `src/`, from the top layer down. Modules on one line are peers,
/// which may not import each other either.
const LAYERS: &[&[&str]] = &[
    &["main"],
    &["modes"],
    &["cli"],
    &["server"],
    &["code_mode", "sandbox"],
    &["worker", "interpreter"],
    &["assets"],
    &["protocol"],
    &["packages", "engine", "wasi"],
    &["metrics", "traces", "atomic_file"],
];

/// Pairs of files that may import each other, and why: a tool is an `impl` on the handler's
/// state as rmcp's `#[tool_router]` makes it, and the handler dispatches through the tool
/// table.
const MUTUAL_ALLOWED: &[(&str, &str)] = &[("server/handler.rs", "server/tools/mod.rs")];

/// What the confined interpreter is made of: its own room and what it may import. A security
/// review of the code that runs under seccomp reads these folders and nothing else
/// (docs/architecture.md §3.2).
const CONFINED: &[&str] = &["interpreter", "protocol", "assets", "engine", "wasi"];

/// The only file outside [`CONFINED`] that names `interpreter`: the entry, which hands the
/// hidden worker command to it.
const STARTS_THE_INTERPRETER: &str = "main.rs";

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|peers| peers.contains(&module))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source without comments (`//` to the end of the line), so that a doc link to a higher
/// layer does not count as an import.
fn code_of(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) if !line[..at].contains('"') => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `crate::a::b…` path in `code`, as its segments.
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let preceded = code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        if preceded {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        let path: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        paths.push(
            path.split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
        );
    }
    paths
}

/// `src/`-relative path of a file (`server/tools/mod.rs`).
fn relative(src: &Path, file: &Path) -> String {
    file.strip_prefix(src)
        .expect("under src/")
        .to_string_lossy()
        .replace('\\', "/")
}

/// The file a module path names, if it is one of `files` (`["server", "tools", "reach"]` →
/// `server/tools/reach.rs`, or the longest prefix that is a file).
fn file_of(path: &[String], files: &BTreeSet<String>) -> Option<String> {
    (1..=path.len()).rev().find_map(|n| {
        let stem = path[..n].join("/");
        [format!("{stem}.rs"), format!("{stem}/mod.rs")]
            .into_iter()
            .find(|f| files.contains(f))
    })
}

#[test]
fn imports_run_from_the_front_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    for file in &files {
        let rel = relative(&src, file);
        let own = rel.split(['/', '.']).next().unwrap_or_default().to_owned();
        let own_layer = layer_of(&own).unwrap_or_else(|| panic!("{rel}: {own} is in no layer"));
        let code = code_of(&std::fs::read_to_string(file).expect("readable"));
        for path in crate_paths(&code) {
            let Some(target) = path.first() else { continue };
            if *target == own {
                continue;
            }
            let target_layer =
                layer_of(target).unwrap_or_else(|| panic!("{rel}: {target} is in no layer"));
            if target_layer <= own_layer {
                wrong.push(format!("{rel} imports crate::{}", path.join("::")));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layering:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_two_files_import_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let names: BTreeSet<String> = files.iter().map(|f| relative(&src, f)).collect();
    let mut imports: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let rel = relative(&src, file);
        let code = code_of(&std::fs::read_to_string(file).expect("readable"));
        let dir = rel.rsplit_once('/').map_or("", |(d, _)| d).to_owned();
        let mut targets: BTreeSet<String> = crate_paths(&code)
            .iter()
            .filter_map(|p| file_of(p, &names))
            .collect();
        // `super::x` from a file of folder `d` (or from `d/mod.rs`, its parent's sibling).
        for (at, _) in code.match_indices("super::") {
            let name: String = code[at + "super::".len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let base = if rel.ends_with("/mod.rs") {
                dir.rsplit_once('/').map_or("", |(d, _)| d).to_owned()
            } else {
                dir.clone()
            };
            let mut path: Vec<String> = base
                .split('/')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            path.push(name);
            targets.extend(file_of(&path, &names));
        }
        targets.remove(&rel);
        imports.insert(rel, targets);
    }
    let mut circles = Vec::new();
    for (a, targets) in &imports {
        for b in targets {
            let back = imports.get(b).is_some_and(|t| t.contains(a));
            let allowed = MUTUAL_ALLOWED
                .iter()
                .any(|&(x, y)| (x == a && y == b) || (x == b && y == a));
            if back && a < b && !allowed {
                circles.push(format!("{a} <-> {b}"));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "files that import each other:\n{}",
        circles.join("\n")
    );
}

/// Every `crate::…` module a file of `src/` names in code, with the file's `src/`-relative path
/// and its top-level module.
fn imports_by_file() -> Vec<(String, String, Vec<String>)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files
        .iter()
        .map(|file| {
            let rel = relative(&src, file);
            let own = rel.split(['/', '.']).next().unwrap_or_default().to_owned();
            let code = code_of(&std::fs::read_to_string(file).expect("readable"));
            let targets = crate_paths(&code)
                .into_iter()
                .filter_map(|p| p.first().cloned())
                .collect();
            (rel, own, targets)
        })
        .collect()
}

#[test]
fn the_interpreter_imports_only_what_runs_confined() {
    let wrong: Vec<String> = imports_by_file()
        .into_iter()
        .filter(|(_, own, _)| CONFINED.contains(&own.as_str()))
        .flat_map(|(rel, _, targets)| {
            targets
                .into_iter()
                .filter(|t| !CONFINED.contains(&t.as_str()))
                .map(move |t| format!("{rel} imports crate::{t}"))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "confined code that imports the front:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_front_never_imports_the_interpreter() {
    let wrong: Vec<String> = imports_by_file()
        .into_iter()
        .filter(|(rel, own, _)| own != "interpreter" && rel != STARTS_THE_INTERPRETER)
        .filter(|(_, _, targets)| targets.iter().any(|t| t == "interpreter"))
        .map(|(rel, _, _)| rel)
        .collect();
    assert!(
        wrong.is_empty(),
        "front files that import the interpreter (only {STARTS_THE_INTERPRETER} may):\n{}",
        wrong.join("\n")
    );
}
