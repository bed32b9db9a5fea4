//! The layering rule, checked: the crate's top-level modules import each other without a
//! circle (wiring on top, services below; `shared/STYLE.md`, "Layers that point one way").
//! Read from the source: every `crate::NAME` outside comments and test code is an arrow
//! from the module it appears in to `NAME`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The source of `text` without its comments and its trailing `#[cfg(test)]` module.
fn production_code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

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

fn graph_of(src: &Path) -> Graph {
    let mut graph = Graph::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src").flatten() {
            let path = entry.path();
            let rel = path.strip_prefix(src).expect("under src");
            let is_test = rel
                .components()
                .any(|c| c.as_os_str() == "tests" || c.as_os_str() == "tests.rs");
            if path.is_dir() {
                if !is_test {
                    stack.push(path);
                }
                continue;
            }
            if is_test || path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let first = rel.components().next().expect("a component");
            let module = first
                .as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_owned();
            if ["lib", "main", "module_graph"].contains(&module.as_str()) {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read a source file");
            arrows(&module, &production_code(&text), &mut graph);
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

#[test]
fn the_top_level_modules_import_each_other_without_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = graph_of(&src);
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
}
