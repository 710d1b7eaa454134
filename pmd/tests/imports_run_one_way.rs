//! The modules of each directory listed here import each other one way only:
//! a circle (`action` uses `message`, `message` uses `action`) means two modules are one job
//! split in two, or share a word that belongs in a leaf module of its own. The test reads the
//! top-level `use` items of every file in a directory and the paths written inline in its code
//! (outside comments and its `#[cfg(test)]` module), keeps the ones that name a sibling
//! (`super::x`, or `crate::<dir's module path>::x`), and fails naming the first circle found.
//! Where a directory's folders are modules of its map too, a folder is one module, importing
//! what any of its files imports from outside it.
//! `docs/architecture.md` has the resulting module maps.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A directory of sibling modules and the module path that names it from its crate's root
/// (empty for the root's own directory).
struct ModuleDir {
    dir: &'static str,
    module_path: &'static [&'static str],
    /// Whether the directory's folders (`qp/`) are modules of the graph too, each one node
    /// with the imports of all its files; otherwise a folder is checked only as a directory of
    /// its own, if listed.
    folders: bool,
}

/// The directories whose modules import one way.
const CHECKED: &[ModuleDir] = &[
    ModuleDir {
        dir: "pmd/src/failover",
        module_path: &["failover"],
        folders: true,
    },
    ModuleDir {
        dir: "pmd/src/failover/machine",
        module_path: &["failover", "machine"],
        folders: false,
    },
    ModuleDir {
        dir: "apps/src",
        module_path: &[],
        folders: true,
    },
    ModuleDir {
        dir: "apps/src/bw",
        module_path: &["bw"],
        folders: false,
    },
    ModuleDir {
        dir: "hw-defs/src/roce",
        module_path: &["roce"],
        folders: false,
    },
    ModuleDir {
        dir: "pmd/src/resilient",
        module_path: &["resilient"],
        folders: true,
    },
    ModuleDir {
        dir: "pmd/src/resilient/qp",
        module_path: &["resilient", "qp"],
        folders: false,
    },
    ModuleDir {
        dir: "pmd/src/resilient/service",
        module_path: &["resilient", "service"],
        folders: false,
    },
    ModuleDir {
        dir: "pmd/src/resilient/rendezvous",
        module_path: &["resilient", "rendezvous"],
        folders: false,
    },
    ModuleDir {
        dir: "softnic/src",
        module_path: &[],
        folders: false,
    },
    // Already one way; kept so.
    ModuleDir {
        dir: "pmd/src",
        module_path: &[],
        folders: false,
    },
    ModuleDir {
        dir: "pmd/src/datapath",
        module_path: &["datapath"],
        folders: false,
    },
    ModuleDir {
        dir: "hw-defs/src",
        module_path: &[],
        folders: false,
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

/// The module path `path` names, written in a file whose module path is `file_module`:
/// `super::` and `self::` resolved against it, `crate::` from the root. `None` for paths that
/// start elsewhere (another crate, or a child named without `self::`, which is the file's
/// own and never a sibling).
fn resolve(path: &str, file_module: &[String]) -> Option<Vec<String>> {
    let mut segments = path.split("::").map(|s| s.trim_start_matches("r#"));
    let mut resolved: Vec<String> = match segments.next()? {
        "crate" => Vec::new(),
        "self" => file_module.to_vec(),
        "super" => file_module[..file_module.len().checked_sub(1)?].to_vec(),
        _ => return None,
    };
    for segment in segments {
        if segment == "super" {
            resolved.pop()?;
        } else {
            resolved.push(segment.to_string());
        }
    }
    Some(resolved)
}

/// The sibling module a resolved path names, if it names one of `siblings`.
fn sibling_of(
    resolved: &[String],
    module_path: &[&str],
    siblings: &BTreeSet<String>,
) -> Option<String> {
    let inside =
        resolved.len() > module_path.len() && resolved.iter().zip(module_path).all(|(a, b)| a == b);
    let name = resolved.get(module_path.len()).filter(|_| inside)?;
    siblings.contains(name).then(|| name.clone())
}

/// The `.rs` files of `dir` and of the folders below it, each with its module path from the
/// crate's root (`failover/machine.rs` is `failover::machine`, `qp/mod.rs` is `...::qp`).
/// Inside a folder, a test module kept in a file of its own (`tests.rs`) is left out: it is
/// not part of the folder's code, as `#[cfg(test)]` modules are not.
fn source_files(
    dir: &Path,
    folders: bool,
    module: &[String],
    depth: usize,
    out: &mut Vec<(PathBuf, Vec<String>)>,
) {
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !folders {
                continue;
            }
            let mut sub = module.to_vec();
            sub.push(name);
            source_files(&path, folders, &sub, depth + 1, out);
        } else if path.extension().is_some_and(|x| x == "rs") && !(depth > 0 && name == "tests") {
            let mut own = module.to_vec();
            if !["mod", "lib", "main"].contains(&name.as_str()) {
                own.push(name);
            }
            out.push((path, own));
        }
    }
}

/// Each module of `dir` and the siblings it imports. A folder (`qp/`) is one module, whose
/// imports are those of all its files that lead out of it.
fn import_graph(dir: &ModuleDir) -> BTreeMap<String, BTreeSet<String>> {
    let path = workspace_root().join(dir.dir);
    let module: Vec<String> = dir.module_path.iter().map(|s| s.to_string()).collect();
    let mut files = Vec::new();
    source_files(&path, dir.folders, &module, 0, &mut files);
    let siblings: BTreeSet<String> = files
        .iter()
        .filter_map(|(_, own)| own.get(module.len()).cloned())
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (file, own) in &files {
        // The directory's own `mod.rs` (or the crate's root) is the parent, not a sibling.
        let Some(name) = own.get(module.len()) else {
            continue;
        };
        let source = std::fs::read_to_string(file).expect("a readable source file");
        let imports: BTreeSet<String> = top_level_uses(&source)
            .iter()
            .flat_map(|tree| expand(tree))
            .chain(inline_paths(&source))
            .filter_map(|p| resolve(&p, own))
            .filter_map(|p| sibling_of(&p, dir.module_path, &siblings))
            .filter(|s| s != name)
            .collect();
        graph.entry(name.clone()).or_default().extend(imports);
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
        .filter_map(|p| resolve(&p, &["failover".into(), "event".into()]))
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
fn a_folder_is_one_module_of_its_parent() {
    let siblings: BTreeSet<String> = ["clock", "qp"].map(String::from).into();
    let driver: Vec<String> = ["resilient", "qp", "driver"].map(String::from).into();
    let named =
        |path: &str| resolve(path, &driver).and_then(|p| sibling_of(&p, &["resilient"], &siblings));
    // From a file inside `qp/`, its own folder's files are `qp` itself, and the paths out of
    // the folder name the parent's modules however they are written.
    assert_eq!(named("super::plan::Plan"), Some("qp".into()));
    assert_eq!(named("super::super::clock::Clock"), Some("clock".into()));
    assert_eq!(
        named("crate::resilient::clock::Clock"),
        Some("clock".into())
    );
    assert_eq!(named("crate::failover::Event"), None);
    assert_eq!(named("hw_defs::mlx5::SendOpcode"), None);
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
