//! Issue 39: the README stays a front page (250 lines at most, with its guarantee table and
//! reading order), and every relative link in the project's Markdown resolves: the file
//! exists and an anchor names one of its headings, as GitHub makes them. Links to other
//! sites are not fetched (CI has no network).

use crate::support::repo;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const README_MAX_LINES: usize = 250;

/// Folders that hold no documentation of ours: build output, dependencies, caches.
const SKIPPED: &[&str] = &["node_modules", "target", "vendor", "build", "__pycache__"];

fn markdown_files(dir: &Path, into: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !name.starts_with('.') && !SKIPPED.contains(&name.as_str()) {
                markdown_files(&path, into);
            }
        } else if name.ends_with(".md") {
            into.push(path);
        }
    }
}

/// The lines of `text` outside fenced code blocks, with their numbers and inline code
/// spans removed (a link shown as code is not a link).
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut prose = String::new();
        for (n, part) in line.split('`').enumerate() {
            if n % 2 == 0 {
                prose.push_str(part);
            }
        }
        out.push((i + 1, prose));
    }
    out
}

/// GitHub's anchor for a heading: lower case, only letters, digits, `-`, `_` and spaces
/// kept, spaces made `-`.
fn slug(heading: &str) -> String {
    heading
        .replace('`', "")
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor of a Markdown file; a repeated heading gets `-1`, `-2`, ... as on GitHub.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for (_, line) in prose_lines(&text.replace('`', "")) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let base = slug(heading.trim_start_matches('#').trim());
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// The targets of the `[text](target)` and `![alt](target)` links on a line.
fn link_targets(line: &str) -> Vec<String> {
    line.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &line[at + 2..];
            let end = rest.find(')')?;
            let target = rest[..end].split_whitespace().next()?;
            Some(target.to_owned())
        })
        .collect()
}

/// Why a link of `file` is broken, or `None`.
fn broken(file: &Path, target: &str) -> Option<String> {
    let scheme = target.split_once(':').is_some_and(|(s, _)| {
        !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '+')
    });
    if scheme {
        return None;
    }
    let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
    let resolved = if path.is_empty() {
        file.to_path_buf()
    } else {
        file.parent().expect("a folder").join(path)
    };
    if !resolved.exists() {
        return Some(format!("{target}: no such file"));
    }
    if anchor.is_empty() || resolved.extension().is_none_or(|e| e != "md") {
        return None;
    }
    let text = std::fs::read_to_string(&resolved).expect("a Markdown file");
    (!anchors(&text).contains(anchor)).then(|| format!("{target}: no heading makes #{anchor}"))
}

fn broken_links(files: &[PathBuf]) -> Vec<String> {
    let mut problems = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).expect("a Markdown file");
        for (number, line) in prose_lines(&text) {
            for target in link_targets(&line) {
                if let Some(why) = broken(file, &target) {
                    problems.push(format!("{}:{number}: {why}", file.display()));
                }
            }
        }
    }
    problems
}

#[test]
fn every_relative_link_in_the_markdown_resolves() {
    let mut files = Vec::new();
    markdown_files(&repo(), &mut files);
    assert!(files.len() > 20, "{files:?}");
    let problems = broken_links(&files);
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

/// The checker itself: a missing file, a missing anchor and a link to another site.
#[test]
fn the_link_checker_finds_a_missing_file_and_a_missing_anchor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let page = dir.path().join("page.md");
    std::fs::write(
        &page,
        "# A page\n\n## Step 2: `run` it (twice)\n\n[ok](#step-2-run-it-twice) \
         [gone](other.md) [bad](#nowhere) [web](https://example.org/x#y)\n\n\
         ```\n[in code](nothing.md)\n```\n",
    )
    .expect("page");
    let problems = broken_links(&[page]);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].ends_with("other.md: no such file"),
        "{problems:?}"
    );
    assert!(
        problems[1].ends_with("no heading makes #nowhere"),
        "{problems:?}"
    );
}

#[test]
fn the_readme_is_a_front_page() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines; keep it to {README_MAX_LINES}: move reference to docs/"
    );
    for section in ["## What Carteiro guarantees", "## Reading order"] {
        assert!(readme.contains(section), "README.md lost `{section}`");
    }
    for row in ["| G1 |", "| G2 |", "| G3 |", "| G4 |", "| G5 |"] {
        assert!(
            readme.contains(row),
            "README.md's guarantee table lost `{row}`"
        );
    }
}
