//! ARCHITECTURE.md stays true to the tree: every file it names in backticks exists (named from
//! the repository root, or by its tail, as `cluster/work.rs` names
//! `crates/mpsfleet-server/src/cluster/work.rs`), and every relative link points at a file.

use std::collections::{BTreeMap, BTreeSet};
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

/// The source of every non-test Rust file under `crates/`: up to its inline test module
/// (`#[cfg(test)] mod tests {`, at the end of a file), leaving out `tests/` folders and the
/// test modules in files of their own (`tests.rs`, `*_tests.rs`). A `#[cfg(test)]` before a
/// module declaration (`#[cfg(test)] mod recovery_tests;`) does not end the code.
fn production_sources(root: &Path) -> Vec<(String, String)> {
    files(root)
        .into_iter()
        .filter(|f| f.starts_with("crates/") && f.ends_with(".rs"))
        .filter(|f| !f.contains("/tests/") && !f.ends_with("/tests.rs") && !f.ends_with("_tests.rs"))
        .filter(|f| !f.contains("/benches/"))
        .map(|f| {
            let text = std::fs::read_to_string(root.join(&f)).unwrap();
            (f, without_test_module(&text).to_string())
        })
        .collect()
}

/// `text` up to its inline test module, if it has one.
fn without_test_module(text: &str) -> &str {
    let start = text.lines().scan(0, |at, line| {
        let here = *at;
        *at += line.len() + 1;
        Some((here, line))
    });
    let mut previous_was_cfg_test = false;
    for (at, line) in start {
        if previous_was_cfg_test && line.trim_start().starts_with("mod tests {") {
            // Back to the `#[cfg(test)]` line.
            let cfg = text[..at].trim_end().rfind('\n').map_or(0, |i| i + 1);
            return &text[..cfg];
        }
        previous_was_cfg_test = line.trim() == "#[cfg(test)]";
    }
    text
}

/// Assignments (`x.FIELD = …`, not `==`) of the named fields, as `file:line: text`.
fn assignments(file: &str, code: &str, fields: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for field in fields {
            let needle = format!(".{field}");
            let mut rest = code;
            while let Some(at) = rest.find(&needle) {
                let after = &rest[at + needle.len()..];
                let next_is_ident = after.chars().next().is_some_and(|c| c.is_alphanumeric() || c == '_');
                let value = after.trim_start();
                if !next_is_ident
                    && value.starts_with('=')
                    && !value.starts_with("==")
                    && !value.starts_with("=>")
                {
                    out.push(format!("{file}:{}: {}", n + 1, line.trim()));
                }
                rest = after;
            }
        }
    }
    out
}

/// The control plane's task and host records change status only through
/// `lifecycle::{task,host}` (`apply`, which runs `step`), drills through `lifecycle::drill`,
/// services, deployments (status and rollout state) and task attachments through
/// `lifecycle::service`, and an incident's state only through
/// `remediation` (`record`, `resolve`): no other file of the server, the core or the simulator
/// assigns them. (The agent's own record of a process is what it reports; the server feeds
/// each report through the task lifecycle.)
#[test]
fn statuses_are_written_only_by_the_lifecycles() {
    let root = root();
    let sources: Vec<_> = production_sources(&root)
        .into_iter()
        .filter(|(f, _)| {
            ["mpsfleet-server", "mpsfleet-core", "mpsfleet-sim"]
                .iter()
                .any(|c| f.starts_with(&format!("crates/{c}/")))
        })
        .collect();
    assert!(sources.len() > 50, "found only {} source files", sources.len());
    let mut found = Vec::new();
    for (file, code) in &sources {
        if !file.contains("/lifecycle/") {
            found.extend(assignments(
                file,
                code,
                &["last_status", "desired_status", "health_status", "rollout_state"],
            ));
            found.extend(assignments(file, code, &["status"]).into_iter().filter(|l| {
                [
                    "HostStatus::",
                    "TaskStatus::",
                    "DrillStatus::",
                    "ServiceStatus::",
                    "DeploymentStatus::",
                    "\"DELETED\"",
                    "\"ATTACHED\"",
                    "\"PRECREATED\"",
                ]
                .iter()
                .any(|s| l.contains(s))
            }));
        }
        if !file.ends_with("mpsfleet-core/src/remediation.rs") {
            found.extend(
                assignments(file, code, &["state"]).into_iter().filter(|l| l.contains("IncidentState::")),
            );
        }
    }
    assert!(found.is_empty(), "status fields assigned outside the lifecycles:\n{}", found.join("\n"));
}

/// The domain speaks no HTTP: nothing under the server's `cluster/` (nor `auth.rs`, `tls.rs`)
/// names the API layer or its error type.
#[test]
fn the_domain_does_not_import_the_api_layer() {
    let root = root();
    let mut found = Vec::new();
    for (file, code) in production_sources(&root) {
        let domain = file.starts_with("crates/mpsfleet-server/src/cluster/")
            || file.ends_with("mpsfleet-server/src/auth.rs")
            || file.ends_with("mpsfleet-server/src/tls.rs");
        if !domain {
            continue;
        }
        for (n, line) in code.lines().enumerate() {
            for name in ["ApiError", "crate::api", "crate::http", "crate::error", "axum", "StatusCode"] {
                if line.contains(name) {
                    found.push(format!("{file}:{}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    assert!(found.is_empty(), "the domain names the API layer:\n{}", found.join("\n"));
}

/// Where a file's code names one of `names` as a word (not inside a longer identifier), as
/// `file:line: text`; comment lines are left out.
fn naming(file: &str, code: &str, names: &[&str]) -> Vec<String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let code_part = line.split("//").next().unwrap_or("");
        let named = names.iter().any(|name| {
            code_part.match_indices(name).any(|(at, _)| {
                let before = code_part[..at].chars().next_back();
                let after = code_part[at + name.len()..].chars().next();
                !before.is_some_and(word) && !after.is_some_and(word)
            })
        });
        if named {
            out.push(format!("{file}:{}: {}", n + 1, line.trim()));
        }
    }
    out
}

/// Controllers are rooms of their own: nothing under `cluster/controllers/` names `Cluster`;
/// what a controller needs is in its context (`Ctx`) or its arguments.
#[test]
fn no_controller_names_cluster() {
    let root = root();
    let mut found = Vec::new();
    let mut controllers = 0;
    for (file, code) in production_sources(&root) {
        if file.starts_with("crates/mpsfleet-server/src/cluster/controllers/") {
            controllers += 1;
            found.extend(naming(&file, &code, &["Cluster"]));
        }
    }
    assert!(controllers >= 2, "no controller module found");
    assert!(found.is_empty(), "a controller names Cluster:\n{}", found.join("\n"));
}

/// The cluster's bottom layer: the records and the one way to read and write them. These
/// files name no `Cluster` and no controller, and import nothing wholesale (`use super::*`).
const CLUSTER_BOTTOM: [&str; 13] = [
    "state.rs",
    "read.rs",
    "write.rs",
    "write_tasks.rs",
    "place.rs",
    "traffic.rs",
    "deleted.rs",
    "kinds.rs",
    "work.rs",
    "intervals.rs",
    "error.rs",
    "tasks.rs",
    "incident_table.rs",
];

/// What breaks the layering in `file` (a path under `crates/mpsfleet-server/src/cluster/`):
/// a bottom file reaching up, or a controller importing a room above the bottom layer.
fn layering_violations(file: &str, code: &str) -> Vec<String> {
    let Some(rel) = file.strip_prefix("crates/mpsfleet-server/src/cluster/") else { return Vec::new() };
    let mut out = Vec::new();
    if CLUSTER_BOTTOM.contains(&rel) {
        out.extend(naming(file, code, &["Cluster", "controllers"]));
        out.extend(
            code.lines()
                .enumerate()
                .filter(|(_, l)| l.trim() == "use super::*;")
                .map(|(n, l)| format!("{file}:{}: {}", n + 1, l.trim())),
        );
    }
    if rel.starts_with("controllers/") {
        for (n, line) in code.lines().enumerate() {
            let code_part = line.split("//").next().unwrap_or("");
            for (at, _) in code_part.match_indices("crate::cluster::") {
                let rest = &code_part[at + "crate::cluster::".len()..];
                let module: String =
                    rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if !CLUSTER_BOTTOM.contains(&format!("{module}.rs").as_str()) {
                    out.push(format!("{file}:{}: {} (crate::cluster::{module})", n + 1, line.trim()));
                }
            }
        }
    }
    out
}

/// The cluster is layered, so no two of its files depend on each other in a circle: the
/// records and the one way to read and write them at the bottom (`CLUSTER_BOTTOM`), the
/// controllers above them (importing only the bottom and each other), the `Cluster` facade
/// and its request rooms on top.
#[test]
fn the_cluster_is_layered() {
    let root = root();
    let mut found = Vec::new();
    let mut bottom = 0;
    for (file, code) in production_sources(&root) {
        let rel = file.strip_prefix("crates/mpsfleet-server/src/cluster/").unwrap_or("");
        bottom += usize::from(CLUSTER_BOTTOM.contains(&rel));
        found.extend(layering_violations(&file, &code));
    }
    assert_eq!(bottom, CLUSTER_BOTTOM.len(), "a bottom file is missing");
    assert!(found.is_empty(), "the layering is broken:\n{}", found.join("\n"));
}

/// The layering check catches a bottom file reaching up and a controller importing a room
/// above the bottom layer, and passes what is allowed.
#[test]
fn a_broken_layering_is_caught() {
    let up = layering_violations(
        "crates/mpsfleet-server/src/cluster/write.rs",
        "use super::*;\nfn f(c: &Cluster) {}\n",
    );
    assert_eq!(up.len(), 2, "{up:?}");
    let into_room = layering_violations(
        "crates/mpsfleet-server/src/cluster/controllers/x.rs",
        "use crate::cluster::hosts::LAUNCH;\nuse crate::cluster::write::Writer;\n",
    );
    assert_eq!(into_room.len(), 1, "{into_room:?}");
    assert!(into_room[0].contains("crate::cluster::hosts"), "{into_room:?}");
    let room = layering_violations("crates/mpsfleet-server/src/cluster/hosts.rs", "use super::*;\n");
    assert!(room.is_empty(), "a room on top may import anything: {room:?}");
}

/// Provider calls are the controllers' effects (`loops.rs`), never the HTTP layer's: nothing
/// in `api.rs`, `api/` or `ecs/` names a provider job or calls a provider.
#[test]
fn the_http_layer_makes_no_provider_call() {
    let root = root();
    let effects =
        ["ProviderJob", "run_provider_jobs", "launch_with_retries", "terminate_confirmed", "provider_for"];
    let mut found = Vec::new();
    for (file, code) in production_sources(&root) {
        let http = file == "crates/mpsfleet-server/src/api.rs"
            || file.starts_with("crates/mpsfleet-server/src/api/")
            || file.starts_with("crates/mpsfleet-server/src/ecs/");
        if http {
            found.extend(naming(&file, &code, &effects));
        }
    }
    assert!(found.is_empty(), "the HTTP layer runs provider calls:\n{}", found.join("\n"));
}

/// The two checks above find a name as a word in code, and only there.
#[test]
fn a_name_is_found_in_code_not_in_comments_or_longer_words() {
    let code = "use super::Cluster;\n// never names Cluster\nlet c: ClusterView = x; // Cluster\nfn f(c: &Cluster) {}";
    assert_eq!(
        naming("f.rs", code, &["Cluster"]),
        vec!["f.rs:1: use super::Cluster;", "f.rs:4: fn f(c: &Cluster) {}"]
    );
    assert!(naming("f.rs", "let j = ProviderJobs::new();", &["ProviderJob"]).is_empty());
}

#[test]
fn only_the_inline_test_module_is_left_out() {
    let text = "mod a;\n#[cfg(test)]\nmod recovery_tests;\nfn code() {}\n#[cfg(test)]\nmod tests {\n    fn t() {}\n}\n";
    let code = without_test_module(text);
    assert!(code.contains("fn code()") && !code.contains("fn t()"), "{code:?}");
    assert_eq!(without_test_module("fn only() {}\n"), "fn only() {}\n");
}

#[test]
fn an_assignment_is_told_from_a_comparison() {
    let code = "t.last_status = TaskStatus::Stopped;\nif t.last_status == x {}\nt.last_status_at = 1;\nmatch a { s.last_status => 1 }\n// t.last_status = y";
    assert_eq!(
        assignments("f.rs", code, &["last_status"]),
        vec!["f.rs:1: t.last_status = TaskStatus::Stopped;"]
    );
}

/// ARCHITECTURE.md is read in ten minutes (at most 300 lines), and every path and type it names
/// in backticks exists. A path (a token with a `/`, or ending in `.rs`, `.md`, `.sh`, `.py` or
/// `.toml`; routes such as `/v1/events` left aside) is looked for from the root, each crate's
/// folder, each crate's `src/`, the server's `src/` and each crate's `tests/`. A type
/// (`Name`, CamelCase) must be declared as a `struct`, `enum`, `trait` or `type` in a source
/// file under `crates/`; in `Type::member`, the member must also appear as `fn member` or at
/// the start of a line (an enum's variant).
#[test]
fn architecture_md_names_only_what_exists_and_stays_short() {
    const MAX_LINES: usize = 300;
    const ENDINGS: &[&str] = &[".rs", ".md", ".sh", ".py", ".toml"];

    fn is_ident(c: char) -> bool {
        c.is_ascii_alphanumeric() || c == '_'
    }
    /// `Name`: starts with a capital, has a small letter (`IMPAIRED` is a word, not a type).
    fn is_type_name(t: &str) -> bool {
        t.starts_with(|c: char| c.is_ascii_uppercase())
            && t.len() > 1
            && t.chars().all(|c| c.is_ascii_alphanumeric())
            && t.chars().any(|c| c.is_ascii_lowercase())
    }
    /// Whether `needle` occurs in `hay` not followed by an identifier character.
    fn has_word(hay: &str, needle: &str) -> bool {
        hay.match_indices(needle)
            .any(|(at, _)| !hay[at + needle.len()..].chars().next().is_some_and(is_ident))
    }
    /// What a backticked token names, if it names a path or a type.
    enum Named<'a> {
        Path(&'a str),
        Type(&'a str, Option<&'a str>),
    }
    fn classify(token: &str) -> Option<Named<'_>> {
        let token = token.trim();
        let head = token.split("::").next().unwrap_or("");
        let head = head.split(char::is_whitespace).next().unwrap_or("");
        let path_chars = |t: &str| t.chars().all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c));
        if !head.is_empty()
            && !head.starts_with('/')
            && path_chars(head)
            && (head.contains('/') || ENDINGS.iter().any(|e| head.ends_with(e) && head.len() > e.len()))
        {
            return Some(Named::Path(head.trim_end_matches('/')));
        }
        // `Type`, `Type::member`, `Type::Variant(..)`: what comes before a `(`.
        let name = token.split('(').next().unwrap_or("");
        let parts: Vec<&str> = name.split("::").collect();
        match parts.as_slice() {
            [ty] if is_type_name(ty) => Some(Named::Type(ty, None)),
            [ty, member]
                if is_type_name(ty)
                    && !member.is_empty()
                    && member.chars().all(is_ident)
                    && !member.starts_with(|c: char| c.is_ascii_digit()) =>
            {
                Some(Named::Type(ty, Some(member)))
            }
            _ => None,
        }
    }

    let root = root();
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let lines = text.lines().count();

    // Fenced blocks (the diagram) are pictures, not names.
    let mut fenced = false;
    let prose: String = text
        .lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .map(|l| format!("{l}\n"))
        .collect();

    let mut crate_dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    crate_dirs.sort();
    let mut bases = vec![root.clone()];
    bases.extend(crate_dirs.iter().cloned());
    bases.extend(crate_dirs.iter().map(|c| c.join("src")));
    bases.push(root.join("crates/mpsfleet-server/src"));
    bases.extend(crate_dirs.iter().map(|c| c.join("tests")));

    let sources: Vec<String> = files(&root)
        .into_iter()
        .filter(|f| f.starts_with("crates/") && f.ends_with(".rs"))
        .map(|f| std::fs::read_to_string(root.join(f)).unwrap())
        .collect();
    let declared = |ty: &str| {
        ["struct", "enum", "trait", "type"].iter().any(|kw| {
            let needle = format!("{kw} {ty}");
            sources.iter().any(|s| has_word(s, &needle))
        })
    };
    let has_member = |member: &str| {
        let func = format!("fn {member}");
        sources.iter().any(|s| {
            has_word(s, &func)
                || s.lines().any(|l| {
                    let l = l.trim_start();
                    l.starts_with(member) && !l[member.len()..].chars().next().is_some_and(is_ident)
                })
        })
    };

    let (mut paths, mut types) = (0, 0);
    let mut missing = Vec::new();
    for token in prose.split('`').skip(1).step_by(2) {
        match classify(token) {
            Some(Named::Path(path)) => {
                paths += 1;
                if !bases.iter().any(|b| b.join(path).exists()) {
                    missing.push(format!("no file or folder `{path}` (from `{token}`)"));
                }
            }
            Some(Named::Type(ty, member)) => {
                types += 1;
                if !declared(ty) {
                    missing.push(format!("no struct, enum, trait or type `{ty}` (from `{token}`)"));
                } else if let Some(m) = member.filter(|m| !has_member(m)) {
                    missing.push(format!("no `fn {m}` nor variant `{m}` (from `{token}`)"));
                }
            }
            None => {}
        }
    }
    // A parser that finds nothing would pass: the page names dozens of each.
    assert!(
        paths > 40 && types > 20,
        "found only {paths} paths and {types} types: is the parser still right?"
    );
    assert!(
        lines <= MAX_LINES && missing.is_empty(),
        "ARCHITECTURE.md: {lines} lines (at most {MAX_LINES}); names that do not exist:\n{}",
        missing.join("\n")
    );
}

/// The most methods `Cluster` may have, and the most files its `impl` blocks may span: it is
/// the facade of the operations the API and the agents call, each validating and committing;
/// what they share is in the rooms beside them (`State`, `Reader`, `Writer`, the controllers).
const CLUSTER_MAX_METHODS: usize = 130;
const CLUSTER_MAX_FILES: usize = 8;

/// The methods of each file's `impl Cluster` blocks, by file.
fn cluster_methods(sources: &[(String, String)]) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for (file, code) in sources {
        let mut inside = false;
        let mut names = Vec::new();
        for line in code.lines() {
            if ["impl Cluster {", "impl super::Cluster {", "impl crate::cluster::Cluster {"].contains(&line) {
                inside = true;
            } else if line == "}" {
                inside = false;
            } else if let Some(rest) = line.strip_prefix("    ").filter(|_| inside) {
                let rest = rest.trim_start_matches("pub(crate) ").trim_start_matches("pub(super) ");
                let rest = rest.trim_start_matches("pub ").trim_start_matches("async ");
                if let Some(name) = rest.strip_prefix("fn ") {
                    names.push(name.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect());
                }
            }
        }
        if !names.is_empty() {
            out.insert(file.clone(), names);
        }
    }
    out
}

/// What makes `Cluster` more than a facade: too many methods, or too many files.
fn facade_violations(methods: &BTreeMap<String, Vec<String>>) -> Vec<String> {
    let count: usize = methods.values().map(Vec::len).sum();
    let mut out = Vec::new();
    if count > CLUSTER_MAX_METHODS {
        out.push(format!("{count} methods (at most {CLUSTER_MAX_METHODS})"));
    }
    if methods.len() > CLUSTER_MAX_FILES {
        out.push(format!("{} files (at most {CLUSTER_MAX_FILES})", methods.len()));
    }
    out
}

fn server_sources() -> Vec<(String, String)> {
    let all = production_sources(&root());
    all.into_iter().filter(|(f, _)| f.starts_with("crates/mpsfleet-server/src/")).collect()
}

#[test]
fn cluster_is_a_facade_of_few_methods_in_few_files() {
    let methods = cluster_methods(&server_sources());
    let found = facade_violations(&methods);
    let by_file: Vec<String> = methods.iter().map(|(f, m)| format!("{f}: {}", m.len())).collect();
    assert!(found.is_empty(), "Cluster grew: {}\n{}", found.join("; "), by_file.join("\n"));
    // The count reads the real blocks: the rooms are where their operations are.
    assert!(methods.keys().any(|f| f.ends_with("cluster/hosts.rs")), "{by_file:?}");
}

#[test]
fn a_grown_facade_is_caught() {
    let room = |n: usize| {
        let fns: String = (0..n).map(|i| format!("    pub fn op{i}(&self) {{}}\n")).collect();
        format!("impl Cluster {{\n{fns}}}\n")
    };
    let many: Vec<(String, String)> = (0..9).map(|i| (format!("r{i}.rs"), room(1))).collect();
    assert_eq!(facade_violations(&cluster_methods(&many)), vec!["9 files (at most 8)"]);
    let big = vec![("r.rs".to_string(), room(CLUSTER_MAX_METHODS + 1))];
    assert_eq!(facade_violations(&cluster_methods(&big)), vec!["131 methods (at most 130)"]);
    let by_path = vec![("r.rs".to_string(), room(2).replace("impl Cluster", "impl super::Cluster"))];
    assert_eq!(cluster_methods(&by_path)["r.rs"].len(), 2, "a block by path counts");
    let other = vec![("r.rs".to_string(), room(3).replace("impl Cluster", "impl Writer<'_>"))];
    assert!(cluster_methods(&other).is_empty(), "another type's methods are not Cluster's");
}

/// Which files each file with `Cluster` methods calls methods of (`self.op(`, `c.op(`, as a
/// chain split over lines too), by the file that defines them.
fn room_calls(sources: &[(String, String)]) -> BTreeMap<String, BTreeSet<String>> {
    let methods = cluster_methods(sources);
    let defined: BTreeMap<&str, &str> =
        methods.iter().flat_map(|(f, ms)| ms.iter().map(move |m| (m.as_str(), f.as_str()))).collect();
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, code) in sources.iter().filter(|(f, _)| methods.contains_key(f)) {
        let joined: String = code
            .lines()
            .map(|l| l.split("//").next().unwrap_or(""))
            .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
            .collect();
        for (name, home) in &defined {
            if home == file {
                continue;
            }
            let called = ["self.", "c."].iter().any(|recv| {
                let pattern = format!("{recv}{name}(");
                joined
                    .match_indices(&pattern)
                    .any(|(at, _)| !joined[..at].chars().next_back().is_some_and(word))
            });
            if called {
                out.entry(file.clone()).or_default().insert(home.to_string());
            }
        }
    }
    out
}

/// A circle of files calling each other's `Cluster` methods, if there is one.
fn call_circle(calls: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        at: &str,
        calls: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == at) {
            let mut circle = path[i..].to_vec();
            circle.push(at.to_string());
            return Some(circle);
        }
        if done.contains(at) {
            return None;
        }
        path.push(at.to_string());
        for next in calls.get(at).into_iter().flatten() {
            if let Some(c) = visit(next, calls, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(at.to_string());
        None
    }
    let mut done = BTreeSet::new();
    calls.keys().find_map(|start| visit(start, calls, &mut Vec::new(), &mut done))
}

/// No two of the server's files call each other's `Cluster` methods in a circle (imports are
/// `the_cluster_is_layered`'s; calls of one object's methods are no imports, so they are
/// counted here): `mod.rs` holds the one way to write and to ask, the
/// rooms call it and each other one way, `dispatch.rs` (loading, the controllers' pass) calls
/// the rooms.
#[test]
fn no_two_rooms_call_each_other_in_a_circle() {
    let calls = room_calls(&server_sources());
    assert!(calls.len() >= 6, "the rooms were not found: {calls:?}");
    assert_eq!(call_circle(&calls), None, "{calls:#?}");
}

#[test]
fn a_method_call_circle_is_caught() {
    let src = |name: &str, calls: &str| {
        let code = format!("impl Cluster {{\n    pub fn {name}(&self) {{\n        self\n            .{calls}();\n    }}\n}}\n");
        (format!("{name}.rs"), code)
    };
    let circle = vec![src("a", "b"), src("b", "c"), src("c", "a")];
    assert_eq!(call_circle(&room_calls(&circle)).map(|c| c.len()), Some(4), "{:?}", room_calls(&circle));
    let line = vec![src("a", "b"), src("b", "c"), src("c", "read")];
    assert_eq!(call_circle(&room_calls(&line)), None);
    // A call on another object of the same name is not a call on the cluster.
    let other =
        vec![src("a", "b"), ("b.rs".to_string(), "impl Cluster {\n    fn b(&self) { w.a(); }\n}\n".into())];
    assert_eq!(call_circle(&room_calls(&other)), None);
}
