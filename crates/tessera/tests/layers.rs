//! The library's layers, checked: no source file of `crates/tessera-core/src` or
//! `crates/tessera/src` names a file above it in its crate, and no code path goes through a
//! crate root (`crate::Store`), which would hide where a name comes from.
//!
//! The crate boundary is the first layer line, and the compiler keeps it: `tessera-core`
//! (limits, errors, the model, the clock, wake-ups, the seams, the rate engine, the shared
//! store parts and the SQL step) depends on no store and no façade, so it cannot name them.
//! Inside each crate, [`CORE_LAYERS`] and [`FACADE_LAYERS`] give the order, bottom first; the
//! module comments of both `lib.rs` files explain it. A file may use what is in its own
//! layer's folder or below, and anything of `tessera_core`. Doc comments may link through the
//! crate root (rustdoc shows the public path), and unit-test modules (`#[cfg(test)]` to the
//! end of a file, and files named `tests.rs` or `*_tests.rs`) are exempt: a test may use
//! anything.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The core crate's layers: the module paths each holds (a path names that module's file
/// and, for a folder, every file below it unless a longer path is listed). Bottom first.
const CORE_LAYERS: &[&[&str]] = &[
    &["limits"],
    &["error"],
    &["model"],
    &["clock"],
    &["wake"],
    &["rate::spec"],
    &["rate::seam"],
    &["admission::seam"],
    &["seam"],
    &["rate::engine"],
    &["stores::batch", "stores::expiries", "stores::url"],
    &["stores::sql"],
    &[""],
];

/// The library's layers above the core, bottom first.
const FACADE_LAYERS: &[&[&str]] = &[
    // The stores: each imports the core and its own folder, never another store.
    &[
        "stores::memory",
        "stores::sqlite",
        "stores::redis",
        "stores::postgres",
        "stores::mysql",
        "stores::etcd",
    ],
    // The registry that picks a store by URL scheme.
    &["stores"],
    // The façade: the connection engine, clean-ups, lease keeping, then the handles users
    // hold.
    &["telemetry", "arrivals"],
    &["conn"],
    &["cleanup"],
    &["lease"],
    &["store"],
    &["semaphore", "rate::limiter"],
    &["lock", "rate", "admission"],
    &["fuzzing", ""],
];

struct Module {
    path: String,
    file: PathBuf,
}

fn modules(src: &Path) -> Vec<Module> {
    let mut out = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let rel = p.strip_prefix(src).unwrap().with_extension("");
                let mut parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
                    parts.pop();
                }
                out.push(Module {
                    path: parts.join("::"),
                    file: p,
                });
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// The layer of module `path` in `layers` and the entry it falls under (the longest
/// listed prefix).
fn layer_of(layers: &[&[&'static str]], path: &str) -> Option<(usize, &'static str)> {
    let mut best: Option<(usize, &'static str)> = None;
    for (i, layer) in layers.iter().enumerate() {
        for &entry in *layer {
            let covers = entry == path
                || (!entry.is_empty()
                    && path.starts_with(entry)
                    && path[entry.len()..].starts_with("::"))
                || (entry.is_empty() && path.is_empty());
            if covers && best.is_none_or(|(_, e)| entry.len() > e.len()) {
                best = Some((i, entry));
            }
        }
    }
    best
}

/// The code of a file without comments, string contents and its unit-test module.
fn code_lines(text: &str) -> Vec<(usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        // `#[cfg(test)] mod tests` runs to the end of the file in this code base.
        if t.starts_with("#[cfg(test)]")
            && lines
                .get(n + 1)
                .is_some_and(|l| l.trim_start().starts_with("mod tests"))
        {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        let code = match line.find("//") {
            // A `//` inside a string (a URL) is not a comment; these lines keep their text.
            Some(i) if !line[..i].contains('"') => &line[..i],
            _ => line,
        };
        out.push((n + 1, code.to_string()));
    }
    out
}

/// Every `crate::a::b…` path in `code`, up to the first segment that is not a module, and
/// whether its first segment is a module at all (else it goes through the crate root).
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `tessera_crate::`, not ours
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        let mut path = rest[..end].trim_end_matches(':').to_string();
        if rest[end..].starts_with('{') {
            // `crate::a::{b, c}`: each member.
            let close = rest[end..].find('}').map_or(rest.len(), |j| end + j);
            for member in rest[end + 1..close].split(',') {
                let m = member.trim().split([' ', ':']).next().unwrap_or("");
                if !m.is_empty() {
                    out.push(format!("{path}::{m}"));
                }
            }
            path.clear();
        }
        if !path.is_empty() {
            out.push(path);
        }
    }
    out
}

/// The module a path names: its longest prefix that is a module.
fn target<'a>(path: &str, known: &'a BTreeMap<String, usize>) -> Option<&'a str> {
    let segs: Vec<&str> = path.split("::").collect();
    (1..=segs.len())
        .rev()
        .map(|n| segs[..n].join("::"))
        .find_map(|p| known.get_key_value(&p).map(|(k, _)| k.as_str()))
        .or_else(|| known.get_key_value("").map(|(k, _)| k.as_str()))
}

/// Every layering problem of the crate whose sources are in `src`.
fn problems(src: &Path, layers: &[&[&'static str]]) -> Vec<String> {
    let mods = modules(src);
    let mut known = BTreeMap::new();
    let mut problems = Vec::new();
    for m in &mods {
        match layer_of(layers, &m.path) {
            Some((layer, _)) => {
                known.insert(m.path.clone(), layer);
            }
            None => problems.push(format!(
                "{}: module `{}` is in no layer; add it to its crate's layers in tests/layers.rs",
                m.file.display(),
                m.path
            )),
        }
    }
    for m in &mods {
        if m.file
            .file_name()
            .is_some_and(|f| f == "tests.rs" || f.to_string_lossy().ends_with("_tests.rs"))
        {
            continue;
        }
        let Some((layer, entry)) = layer_of(layers, &m.path) else {
            continue;
        };
        let text = std::fs::read_to_string(&m.file).unwrap();
        for (line, code) in code_lines(&text) {
            for path in crate_paths(&code) {
                let Some(t) = target(&path, &known) else {
                    continue;
                };
                let here = format!("{}:{line}", m.file.strip_prefix(src).unwrap().display());
                if t.is_empty() {
                    problems.push(format!(
                        "{here}: `crate::{path}` goes through the crate root; name the module"
                    ));
                    continue;
                }
                let (t_layer, t_entry) = layer_of(layers, t).unwrap();
                if t_layer > layer {
                    problems.push(format!(
                        "{here}: `crate::{path}` imports `{t}`, a layer above `{}`",
                        m.path
                    ));
                } else if t_layer == layer && t_entry != entry {
                    problems.push(format!(
                        "{here}: `crate::{path}` imports `{t}`, beside `{}` in its layer \
                         (one must go below the other)",
                        m.path
                    ));
                }
            }
        }
    }
    problems
}

fn crate_src(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name)
        .join("src")
}

fn assert_none(problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "{} layering problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn no_file_of_the_core_imports_a_file_above_it() {
    assert_none(problems(&crate_src("tessera-core"), CORE_LAYERS));
}

#[test]
fn no_file_of_the_library_imports_a_file_above_it() {
    assert_none(problems(&crate_src("tessera"), FACADE_LAYERS));
}

#[test]
fn the_checker_sees_an_upward_import_and_a_root_path() {
    let mut known = BTreeMap::new();
    for m in ["", "semaphore", "store", "stores", "stores::redis"] {
        known.insert(m.to_string(), layer_of(FACADE_LAYERS, m).unwrap().0);
    }
    let code = "use crate::store::Store; let x = crate::Store::connect(u); use crate::semaphore::{Semaphore, Permit};";
    let paths = crate_paths(code);
    assert_eq!(
        paths,
        [
            "store::Store",
            "Store::connect",
            "semaphore::Semaphore",
            "semaphore::Permit"
        ]
    );
    assert_eq!(target("store::Store", &known), Some("store"));
    assert_eq!(target("Store::connect", &known), Some(""));
    assert!(
        layer_of(FACADE_LAYERS, "semaphore").unwrap().0
            > layer_of(FACADE_LAYERS, "store").unwrap().0
    );
    assert_eq!(
        layer_of(FACADE_LAYERS, "stores::redis::ops").unwrap().1,
        "stores::redis"
    );
    assert_eq!(
        layer_of(CORE_LAYERS, "stores::sql::step").unwrap().1,
        "stores::sql"
    );
    assert!(layer_of(CORE_LAYERS, "seam").unwrap().0 > layer_of(CORE_LAYERS, "model").unwrap().0);
    // Comments and unit-test modules are not code.
    let lines =
        code_lines("use a; // crate::store\n#[cfg(test)]\nmod tests {\n use crate::store;\n}\n");
    assert_eq!(lines, [(1, "use a; ".to_string())]);
}
