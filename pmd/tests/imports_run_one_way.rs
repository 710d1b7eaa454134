//! The modules of each directory listed here import each other one way only (issue 13 item 3):
//! a circle (`action` uses `message`, `message` uses `action`) means two modules are one job
//! split in two, or share a word that belongs in a leaf module of its own. The test reads the
//! top-level `use` items of every file in a directory and the paths written inline in its code
//! (outside comments and its `#[cfg(test)]` module), keeps the ones that name a sibling
//! (`super::x`, or `crate::<dir's module path>::x`), and fails naming the first circle found.
//! `docs/architecture.md` has the resulting module maps.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A directory of sibling modules and the module path that names it from its crate's root
/// (empty for the root's own directory).
struct ModuleDir {
    dir: &'static str,
    module_path: &'static [&'static str],
}

/// The directories whose modules import one way (issue 13 broke the circles of the first
/// five; the others already ran one way).
const CHECKED: &[ModuleDir] = &[
    ModuleDir {
        dir: "pmd/src/failover",
        module_path: &["failover"],
    },
    ModuleDir {
        dir: "apps/src",
        module_path: &[],
    },
    ModuleDir {
        dir: "hw-defs/src/roce",
        module_path: &["roce"],
    },
    ModuleDir {
        dir: "pmd/src/resilient",
        module_path: &["resilient"],
    },
    ModuleDir {
        dir: "softnic/src",
        module_path: &[],
    },
    // Already one way; kept so.
    ModuleDir {
        dir: "pmd/src",
        module_path: &[],
    },
    ModuleDir {
        dir: "pmd/src/datapath",
        module_path: &["datapath"],
    },
    ModuleDir {
        dir: "hw-defs/src",
        module_path: &[],
    },
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("pmd sits in the workspace")
        .to_path_buf()
}

/// The top-level `use` items of `source` (not those inside a nested `mod tests { ... }`),
/// with whitespace removed: `use super::{a::X, b::Y};` becomes `super::{a::X,b::Y}`.
fn top_level_uses(source: &str) -> Vec<String> {
    let mut uses = Vec::new();
    let mut lines = source.lines();
    while let Some(line) = lines.next() {
        let rest = ["use ", "pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .find_map(|prefix| line.strip_prefix(prefix));
        let Some(rest) = rest else { continue };
        let mut item = rest.to_string();
        while !item.contains(';') {
            match lines.next() {
                Some(more) => item.push_str(more),
                None => break,
            }
        }
        let item: String = item
            .split(';')
            .next()
            .unwrap_or_default()
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        uses.push(item);
    }
    uses
}

/// The `super::` and `crate::` paths written inline in `source`'s code (`crate::faults::X`
/// in a field's type), outside comments and outside the test module that starts at
/// `#[cfg(test)]`: they import a sibling as surely as a `use` item does.
fn inline_paths(source: &str) -> Vec<String> {
    let mut paths = Vec::new();
    for line in source.lines() {
        let code = line.trim_start();
        if code.starts_with("#[cfg(test)]") {
            break;
        }
        if code.starts_with("//") || code.starts_with("use ") || code.contains(" use ") {
            continue;
        }
        let code = code.split("//").next().unwrap_or_default();
        for root in ["crate::", "super::"] {
            let mut rest = code;
            while let Some(at) = rest.find(root) {
                let before = rest[..at].chars().next_back();
                let path: String = rest[at..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                // `foo_crate::x` is not a crate path: the root must start a word.
                if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    paths.push(path.trim_end_matches(':').to_string());
                }
                rest = &rest[at + root.len()..];
            }
        }
    }
    paths
}

/// Every full path a `use` tree names: `super::{a::X,b::{Y,Z}}` gives `super::a::X`,
/// `super::b::Y`, `super::b::Z`.
fn expand(tree: &str) -> Vec<String> {
    let Some(open) = tree.find('{') else {
        return vec![tree.to_string()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| expand(&format!("{prefix}{p}")))
        .collect()
}

/// The sibling module a path names, if it names one of `siblings`.
fn sibling_of(path: &str, module_path: &[&str], siblings: &BTreeSet<String>) -> Option<String> {
    let segments: Vec<&str> = path.split("::").collect();
    let first = match segments.first() {
        Some(&"super") => segments.get(1),
        Some(&"crate") if segments.get(1..=module_path.len()) == Some(module_path) => {
            segments.get(module_path.len() + 1)
        }
        // At a crate's root `super` does not exist, and `crate::x` is a sibling.
        _ => None,
    }?;
    let name = first.trim_start_matches("r#").to_string();
    siblings.contains(&name).then_some(name)
}

/// Each module of `dir` and the siblings it imports.
fn import_graph(dir: &ModuleDir) -> BTreeMap<String, BTreeSet<String>> {
    let path = workspace_root().join(dir.dir);
    let files: Vec<PathBuf> = std::fs::read_dir(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    let name_of = |p: &Path| p.file_stem().unwrap().to_string_lossy().into_owned();
    let parents = ["mod", "lib", "main"];
    let siblings: BTreeSet<String> = files
        .iter()
        .map(|p| name_of(p))
        .filter(|n| !parents.contains(&n.as_str()))
        .collect();
    let mut graph = BTreeMap::new();
    for file in &files {
        let name = name_of(file);
        if !siblings.contains(&name) {
            continue;
        }
        let source = std::fs::read_to_string(file).expect("a readable source file");
        let imports: BTreeSet<String> = top_level_uses(&source)
            .iter()
            .flat_map(|tree| expand(tree))
            .chain(inline_paths(&source))
            .filter_map(|p| sibling_of(&p, dir.module_path, &siblings))
            .filter(|s| *s != name)
            .collect();
        graph.insert(name, imports);
    }
    graph
}

/// The first import circle of `graph`, as the modules around it (`a -> b -> a`).
fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut circle = stack[at..].to_vec();
            circle.push(node.to_string());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, stack, done) {
                return Some(circle);
            }
        }
        stack.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|start| visit(start, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_parser_finds_siblings_in_nested_and_crate_paths() {
    let siblings: BTreeSet<String> = ["action", "message"].map(String::from).into();
    let uses = top_level_uses(
        "use super::{action::Action,\n    message::{A, B}};\npub use crate::failover::message::X;\nmod tests {\n    use super::action::Y;\n}\n",
    );
    let found: BTreeSet<String> = uses
        .iter()
        .flat_map(|u| expand(u))
        .filter_map(|p| sibling_of(&p, &["failover"], &siblings))
        .collect();
    assert_eq!(uses.len(), 2, "the nested `use` is not top-level: {uses:?}");
    assert_eq!(found, siblings);
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("action".to_string(), ["message".to_string()].into()),
        ("message".to_string(), ["action".to_string()].into()),
    ]
    .into();
    assert_eq!(
        find_circle(&graph),
        Some(vec!["action".into(), "message".into(), "action".into()])
    );
}

#[test]
fn the_parser_finds_inline_paths_outside_comments_and_tests() {
    let source = "/// See [`crate::report::X`].\npub struct A {\n    pub f: Option<crate::faults::FaultJson>, // super::gone\n    g: my_crate::x::Y,\n}\nfn h() { super::log::note(); }\n#[cfg(test)]\nmod tests {\n    fn t() { crate::report::Z; }\n}\n";
    assert_eq!(
        inline_paths(source),
        vec![
            "crate::faults::FaultJson".to_string(),
            "super::log::note".to_string()
        ]
    );
}

#[test]
fn sibling_modules_import_each_other_one_way_only() {
    for dir in CHECKED {
        let graph = import_graph(dir);
        assert!(graph.len() > 1, "{}: no modules found", dir.dir);
        if let Some(circle) = find_circle(&graph) {
            panic!(
                "{}: the modules import each other in a circle: {}",
                dir.dir,
                circle.join(" -> ")
            );
        }
    }
}
