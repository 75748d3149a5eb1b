//! ARCHITECTURE.md stays true to the tree: every file it names in backticks exists (named from
//! the repository root, or by its tail, as `cluster/work.rs` names
//! `crates/mpsfleet-server/src/cluster/work.rs`), and every relative link points at a file.

use std::path::{Path, PathBuf};

const NAMED: &[&str] =
    &[".rs", ".md", ".sh", ".toml", ".js", ".html", ".css", ".py", ".json", ".yml", ".yaml"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Every file of the tree, as paths from the root with `/`, without build output.
fn files(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().to_string_lossy().into_owned();
            if matches!(name.as_str(), "target" | ".git" | "node_modules") {
                continue;
            }
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                dirs.push(path);
            } else {
                out.push(path.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out
}

/// The backticked spans that name a file: one token of path characters with a known ending.
fn named_files(text: &str) -> Vec<&str> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| t.chars().all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c)))
        .filter(|t| NAMED.iter().any(|ext| t.ends_with(ext)) && t.len() > 3)
        .collect()
}

/// The targets of `[text](target)` links that are not web addresses, without their anchor.
fn relative_links(text: &str) -> Vec<&str> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .map(|t| t.split('#').next().unwrap_or(""))
        .filter(|t| !t.is_empty() && !t.contains("://"))
        .collect()
}

#[test]
fn every_file_architecture_names_exists() {
    let root = root();
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let tree = files(&root);
    let named = named_files(&text);
    assert!(named.len() > 40, "found only {} file names: is the parser still right?", named.len());
    let missing: Vec<&str> = named
        .iter()
        .copied()
        .filter(|n| !tree.iter().any(|f| f == n || f.ends_with(&format!("/{n}"))))
        .collect();
    assert!(missing.is_empty(), "ARCHITECTURE.md names files that do not exist: {missing:?}");
    let links = relative_links(&text);
    let broken: Vec<&str> = links.iter().copied().filter(|l| !root.join(l).exists()).collect();
    assert!(broken.is_empty(), "ARCHITECTURE.md links to files that do not exist: {broken:?}");
}

/// The checks above would pass on a parser that finds nothing; this one shows they catch a
/// stale name and a broken link.
#[test]
fn a_stale_name_and_a_broken_link_are_caught() {
    let text = "the loop (`cluster/work.rs`, `no/such/file.rs`), see [sim](docs/sim.md) and \
                [gone](docs/gone.md#x), not [web](https://example.org/a.md) or `cargo test`";
    assert_eq!(named_files(text), vec!["cluster/work.rs", "no/such/file.rs"]);
    assert_eq!(relative_links(text), vec!["docs/sim.md", "docs/gone.md"]);
    let root = root();
    let tree = files(&root);
    assert!(tree.iter().any(|f| f.ends_with("/cluster/work.rs")));
    assert!(!tree.iter().any(|f| f.ends_with("/no/such/file.rs")));
    assert!(!root.join("docs/gone.md").exists());
}
