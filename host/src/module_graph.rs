//! The layering rule, checked: no circle of imports (wiring on top, services below;
//! docs/architecture.md, "The map"). Read from the source, outside comments
//! and test code (`tests/`, `tests.rs`, anything under `#[cfg(test)]`). Two checks:
//! - the host's top-level modules: every `crate::NAME` is an arrow to the module `NAME`;
//! - the files of each Rust crate of the workspace (this one, `chaos`, `carteiro-sdk`), which
//!   covers the files inside each module: a file `a/b.rs` or `a/b/mod.rs` is the node `a::b`,
//!   and every `crate::`, `super::` or `self::` path is an arrow to the deepest file it names
//!   (a name a module file re-exports, `pub use child::Name`, names that child).
//!
//! A module's own files are not arrows from it (it declares and re-exports them: that is
//! ownership, not an import), and the crate root (`lib.rs`, `main.rs`) is left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;
/// A crate's production code by file node; the root is `""`.
type Files = BTreeMap<String, String>;
/// What each module file re-exports from its own files: module -> name -> file.
type Exports = BTreeMap<String, BTreeMap<String, String>>;

/// The source of `text` without its comments and its test code: the trailing
/// `#[cfg(test)] mod tests { .. }` and every other item under `#[cfg(test)]` (`mod tests;`,
/// a test-only `use`, function or module).
fn production_code(text: &str) -> String {
    let mut kept = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let trimmed = line.trim();
        if trimmed.starts_with("//") {
            continue;
        }
        if trimmed != "#[cfg(test)]" {
            kept.push(line);
            continue;
        }
        // Skip the item under the attribute: to its `;` or `,`, or to its closing brace.
        let mut depth = 0usize;
        for line in lines.by_ref() {
            if line == "mod tests {" {
                // The unit tests, last in the file.
                return kept.join("\n");
            }
            let trimmed = line.trim();
            if trimmed.starts_with("#[") || trimmed.starts_with("//") {
                continue;
            }
            depth = (depth + line.matches('{').count()).saturating_sub(line.matches('}').count());
            if depth == 0
                && (trimmed.ends_with(';') || trimmed.ends_with(',') || trimmed.ends_with('}'))
            {
                break;
            }
        }
    }
    kept.join("\n")
}

/// Every `crate::NAME` in `code` as an arrow from `module` to `NAME`.
fn arrows(module: &str, code: &str, into: &mut Graph) {
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit())
            .collect();
        if !name.is_empty() && name != module {
            into.entry(module.to_owned()).or_default().insert(name);
        }
    }
}

/// The production code of every file of the crate whose sources are in `src`, by node.
/// Test files (`tests/`, `tests.rs`, `*_tests.rs`) and this check are left out.
fn read_crate(src: &Path) -> Files {
    let mut files = Files::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "tests" {
                    stack.push(path);
                }
                continue;
            }
            let Some(stem) = name.strip_suffix(".rs") else {
                continue;
            };
            if stem == "tests" || stem.ends_with("_tests") || stem == "module_graph" {
                continue;
            }
            let folder = dir.strip_prefix(src).expect("under src");
            let mut parts: Vec<String> = folder
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let root = parts.is_empty() && (stem == "lib" || stem == "main");
            if stem != "mod" && !root {
                parts.push(stem.to_owned());
            }
            let text = std::fs::read_to_string(&path).expect("read a source file");
            let code = files.entry(parts.join("::")).or_default();
            code.push_str(&production_code(&text));
            code.push('\n');
        }
    }
    files
}

/// The host's top-level modules and the `crate::NAME` arrows between them.
fn top_level_graph(files: &Files) -> Graph {
    let mut graph = Graph::new();
    for (node, code) in files {
        let module = node.split("::").next().unwrap_or_default();
        if !module.is_empty() {
            arrows(module, code, &mut graph);
        }
    }
    graph
}

fn parent(node: &str) -> &str {
    node.rsplit_once("::").map_or("", |(parent, _)| parent)
}

fn child(node: &str, name: &str) -> String {
    if node.is_empty() {
        name.to_owned()
    } else {
        format!("{node}::{name}")
    }
}

fn skip_blank(s: &[u8], i: &mut usize) {
    while s.get(*i).is_some_and(u8::is_ascii_whitespace) {
        *i += 1;
    }
}

fn ident(s: &[u8], i: &mut usize) -> String {
    let start = *i;
    while s
        .get(*i)
        .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
    {
        *i += 1;
    }
    String::from_utf8_lossy(&s[start..*i]).into_owned()
}

/// The leaves of the path or use tree at `s[*i..]`, which starts with `::`, each as its
/// segments (`::{a::B, c}` gives `[a, B]` and `[c]`); `*i` ends after it.
fn use_tree(s: &[u8], i: &mut usize) -> Vec<Vec<String>> {
    let mut prefix = Vec::new();
    while s[*i..].starts_with(b"::") {
        *i += 2;
        if s.get(*i) != Some(&b'{') {
            let segment = ident(s, i);
            if segment.is_empty() {
                break; // `*`, or the `<` of a turbofish
            }
            prefix.push(segment);
            continue;
        }
        *i += 1;
        let mut leaves = Vec::new();
        loop {
            skip_blank(s, i);
            match s.get(*i) {
                None => break,
                Some(b'}') => {
                    *i += 1;
                    break;
                }
                Some(b',') => {
                    *i += 1;
                    continue;
                }
                Some(_) => {}
            }
            let segment = ident(s, i);
            if segment.is_empty() {
                *i += 1; // `*` and the like name nothing
                continue;
            }
            for tail in use_tree(s, i) {
                leaves.push(
                    [
                        prefix.as_slice(),
                        std::slice::from_ref(&segment),
                        tail.as_slice(),
                    ]
                    .concat(),
                );
            }
            skip_blank(s, i);
            if s[*i..].starts_with(b"as ") {
                *i += "as ".len();
                skip_blank(s, i);
                ident(s, i);
            }
        }
        return leaves;
    }
    vec![prefix]
}

/// Every path in `code` that starts with `crate::`, `super::` or `self::`: its start and the
/// segments of each leaf.
fn paths(code: &str) -> Vec<(&'static str, Vec<String>)> {
    let mut found = Vec::new();
    for start in ["crate", "super", "self"] {
        for (at, _) in code.match_indices(start) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                continue; // part of a longer name, or `super::super`
            }
            let mut i = at + start.len();
            if !code[i..].starts_with("::") {
                continue;
            }
            for leaf in use_tree(code.as_bytes(), &mut i) {
                found.push((start, leaf));
            }
        }
    }
    found
}

/// The names each module file re-exports from its own files (`pub use child::{A, B}`,
/// `pub(crate) use self::child::C`).
fn exports_of(files: &Files) -> Exports {
    let mut exports = Exports::new();
    for (module, code) in files {
        let mut rest = code.as_str();
        while let Some(at) = rest.find("pub") {
            rest = &rest[at + "pub".len()..];
            let after = match rest.strip_prefix('(') {
                Some(inner) => inner.split_once(')').map_or("", |(_, after)| after),
                None => rest,
            };
            let Some(tree) = after.strip_prefix(" use ") else {
                continue;
            };
            let tree = format!("::{}", &tree[..tree.find(';').unwrap_or(tree.len())]);
            for leaf in use_tree(tree.as_bytes(), &mut 0) {
                let Some((name, path)) = leaf.split_last() else {
                    continue;
                };
                let mut file = module.clone();
                for segment in path.iter().filter(|s| *s != "self") {
                    let next = child(&file, segment);
                    if !files.contains_key(&next) {
                        break;
                    }
                    file = next;
                }
                if file != *module {
                    exports
                        .entry(module.clone())
                        .or_default()
                        .insert(name.clone(), file);
                }
            }
        }
    }
    exports
}

/// The file a path names: from the module `at`, the deepest file along `segments`, following
/// the names module files re-export from their files.
fn resolve(files: &Files, exports: &Exports, mut at: String, segments: &[String]) -> String {
    for segment in segments {
        match segment.as_str() {
            "super" => {
                at = parent(&at).to_owned();
                continue;
            }
            "self" => break,
            _ => {}
        }
        let next = child(&at, segment);
        if files.contains_key(&next) {
            at = next;
            continue;
        }
        // Each step goes down into a file of `at`, so this ends.
        while let Some(file) = exports.get(&at).and_then(|names| names.get(segment)) {
            at = file.clone();
        }
        break;
    }
    at
}

/// The arrows between the files of a crate.
fn file_graph(files: &Files) -> Graph {
    let exports = exports_of(files);
    let mut graph = Graph::new();
    for (node, code) in files.iter().filter(|(node, _)| !node.is_empty()) {
        for (start, segments) in paths(code) {
            let from = match start {
                "crate" => String::new(),
                "self" => node.clone(),
                _ => parent(node).to_owned(),
            };
            let to = resolve(files, &exports, from, &segments);
            let own = to.starts_with(&format!("{node}::"));
            if !to.is_empty() && to != *node && !own {
                graph.entry(node.clone()).or_default().insert(to);
            }
        }
    }
    graph
}

/// One circle of `graph`, if it has any (depth-first search).
fn a_circle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut circle = path[at..].to_vec();
            circle.push(node.to_owned());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

fn source_of(dir: &str) -> Files {
    read_crate(&Path::new(env!("CARGO_MANIFEST_DIR")).join(dir))
}

#[test]
fn the_top_level_modules_import_each_other_without_a_circle() {
    let graph = top_level_graph(&source_of("src"));
    assert!(
        graph.contains_key("gateway") && graph.contains_key("admin"),
        "{graph:?}"
    );
    if let Some(circle) = a_circle(&graph) {
        panic!(
            "module circle: {} — move what both need below them (services, common)",
            circle.join(" -> ")
        );
    }
}

#[test]
fn the_files_of_each_crate_import_each_other_without_a_circle() {
    // Each with an arrow that must be read, so an empty graph cannot pass.
    for (krate, dir, from, to) in [
        (
            "carteiro",
            "src",
            "store::commit::savepoints",
            "store::commit::request",
        ),
        ("chaos", "../chaos/src", "campaign", "checker"),
        ("carteiro-sdk", "../plugin-sdk/src", "host::mock", "error"),
    ] {
        let graph = file_graph(&source_of(dir));
        assert!(
            graph.get(from).is_some_and(|next| next.contains(to)),
            "{krate}: no arrow {from} -> {to} in {graph:?}"
        );
        if let Some(circle) = a_circle(&graph) {
            panic!(
                "file circle in {krate}: {} — move what both need into a file below them, or \
                 move an item to the side that owns it",
                circle.join(" -> ")
            );
        }
    }
}

#[test]
fn the_check_finds_a_circle_and_ignores_comments_and_tests() {
    let mut graph = Graph::new();
    arrows("admin", "use crate::gateway::GatewayHandle;", &mut graph);
    arrows(
        "gateway",
        &production_code("use crate::admin;\n// crate::store\n"),
        &mut graph,
    );
    assert_eq!(
        a_circle(&graph),
        Some(vec!["admin".into(), "gateway".into(), "admin".into()])
    );
    let mut graph = Graph::new();
    let with_tests = "use crate::admin;\n#[cfg(test)]\nmod tests {\n    use crate::gateway;\n}\n";
    arrows("gateway", &production_code(with_tests), &mut graph);
    arrows("admin", "use crate::store::Store;", &mut graph);
    assert_eq!(a_circle(&graph), None, "{graph:?}");
    // A test module declared (not inline) hides nothing after it.
    let declared =
        "#[cfg(test)]\nmod tests;\n#[cfg(test)]\nuse crate::gateway;\nuse crate::store::Store;\n";
    assert_eq!(production_code(declared), "use crate::store::Store;");
}

/// A crate from (node, source) pairs, as `read_crate` would read it.
fn crate_of(files: &[(&str, &str)]) -> Files {
    files
        .iter()
        .map(|(node, code)| ((*node).to_owned(), production_code(code)))
        .collect()
}

#[test]
fn the_file_check_finds_a_circle_inside_a_module() {
    let store = "mod commit;\n\
                 mod commit_set;\n\
                 pub use commit::{\n    CommitOutcome, CommitRequest,\n};\n";
    let circle = crate_of(&[
        ("", "mod store;\n"),
        ("store", store),
        (
            "store::commit",
            "use super::commit_set::{SetError, insert_outbox};\n\
             use super::{Store, StoreError};\n",
        ),
        (
            "store::commit_set",
            "use super::commit::{check, last_write_per_key};\n\
             use super::error::classify;\n",
        ),
        ("store::error", ""),
    ]);
    assert_eq!(
        a_circle(&file_graph(&circle)),
        Some(vec![
            "store::commit".into(),
            "store::commit_set".into(),
            "store::commit".into()
        ])
    );

    // Both import from a file below them; a re-exported name points at the file behind it;
    // comments and tests are no arrows.
    let store = store.replace("commit::{", "commit_request::{");
    let fixed = crate_of(&[
        ("", "mod store;\n"),
        ("store", store.as_str()),
        (
            "store::commit",
            "use super::commit_request::{check, insert_outbox};\n\
             use super::commit_set::SetError;\n",
        ),
        (
            "store::commit_request",
            "use super::{Store, error::classify};\n",
        ),
        (
            "store::commit_set",
            "use super::commit_request::check;\n\
             // use super::commit::apply;\n",
        ),
        (
            "store::committer",
            "use super::{CommitOutcome, Store};\n\
             #[cfg(test)]\n\
             mod tests {\n    use super::super::commit::key_groups;\n}\n",
        ),
        ("store::error", ""),
    ]);
    let graph = file_graph(&fixed);
    assert_eq!(a_circle(&graph), None, "{graph:?}");
    let committer: Vec<&str> = graph["store::committer"]
        .iter()
        .map(String::as_str)
        .collect();
    assert_eq!(committer, ["store", "store::commit_request"]);
    let request: Vec<&str> = graph["store::commit_request"]
        .iter()
        .map(String::as_str)
        .collect();
    assert_eq!(request, ["store", "store::error"]);
}
