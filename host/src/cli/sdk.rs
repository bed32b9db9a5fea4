//! The handler SDKs this binary was built with, embedded, and how a handler project vendors
//! them: `carteiro plugin new` writes them under `NAME/vendor/`, `carteiro plugin sdk`
//! compares a project's copy with them and `--update` rewrites it. A project therefore
//! builds anywhere, never pointing at the machine Carteiro was built on.
//!
//! What each language's project gets (paths relative to the project):
//! - Rust: `vendor/carteiro-sdk/` (the crate, its manifest made standalone, and `wit/`);
//! - Python: `vendor/carteiro-py/` (the `carteiro` package) and `vendor/wit/`;
//! - JavaScript: `vendor/carteiro-sdk/` (the npm package) and `vendor/wit/`;
//! - all: `vendor/README.md`, saying which carteiro wrote it and how to refresh it.

use anyhow::{Context, bail};
use include_dir::{Dir, DirEntry, include_dir};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::Lang;

static RUST_SRC: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/../plugin-sdk/src");
static WIT: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/../plugin-sdk/wit");
static PY_PACKAGE: Dir<'static> =
    include_dir!("$CARGO_MANIFEST_DIR/../plugin-sdk/python/src/carteiro");
static JS_SRC: Dir<'static> = include_dir!("$CARGO_MANIFEST_DIR/../plugin-sdk/js/src");
/// `plugin-sdk/template/<lang>/`: the files of a new project (`*.tmpl` are filled in).
pub(super) static TEMPLATES: Dir<'static> =
    include_dir!("$CARGO_MANIFEST_DIR/../plugin-sdk/template");

const RUST_MANIFEST: &str = include_str!("../../../plugin-sdk/Cargo.toml");
const RUST_README: &str = include_str!("../../../plugin-sdk/README.md");
/// The workspace manifest the SDK's `*.workspace = true` fields inherit from.
const WORKSPACE_MANIFEST: &str = include_str!("../../../Cargo.toml");
const PY_PYPROJECT: &str = include_str!("../../../plugin-sdk/python/pyproject.toml");
const PY_README: &str = include_str!("../../../plugin-sdk/python/README.md");
const JS_PACKAGE: &str = include_str!("../../../plugin-sdk/js/package.json");
const JS_README: &str = include_str!("../../../plugin-sdk/js/README.md");
const JS_INDEX_DTS: &str = include_str!("../../../plugin-sdk/js/index.d.ts");
const JS_TESTING_DTS: &str = include_str!("../../../plugin-sdk/js/testing.d.ts");

/// The folders under `vendor/` that carteiro owns for a language (rewritten by `--update`).
pub fn vendored_dirs(lang: Lang) -> &'static [&'static str] {
    match lang {
        Lang::Rust => &["vendor/carteiro-sdk"],
        Lang::Python => &["vendor/carteiro-py", "vendor/wit"],
        Lang::Js => &["vendor/carteiro-sdk", "vendor/wit"],
    }
}

/// Every vendored file of `lang`: path relative to the project → contents.
pub fn vendored_files(lang: Lang) -> anyhow::Result<BTreeMap<PathBuf, Vec<u8>>> {
    let mut files = BTreeMap::new();
    let mut text = |path: &str, contents: &str| {
        files.insert(PathBuf::from(path), contents.as_bytes().to_vec());
    };
    match lang {
        Lang::Rust => {
            text(
                "vendor/carteiro-sdk/Cargo.toml",
                &standalone_manifest(RUST_MANIFEST, WORKSPACE_MANIFEST)?,
            );
            text("vendor/carteiro-sdk/README.md", RUST_README);
            add_dir(&mut files, &RUST_SRC, "vendor/carteiro-sdk/src");
            add_dir(&mut files, &WIT, "vendor/carteiro-sdk/wit");
        }
        Lang::Python => {
            text("vendor/carteiro-py/pyproject.toml", PY_PYPROJECT);
            text("vendor/carteiro-py/README.md", PY_README);
            add_dir(&mut files, &PY_PACKAGE, "vendor/carteiro-py/src/carteiro");
            add_dir(&mut files, &WIT, "vendor/wit");
        }
        Lang::Js => {
            text("vendor/carteiro-sdk/package.json", JS_PACKAGE);
            text("vendor/carteiro-sdk/README.md", JS_README);
            text("vendor/carteiro-sdk/index.d.ts", JS_INDEX_DTS);
            text("vendor/carteiro-sdk/testing.d.ts", JS_TESTING_DTS);
            add_dir(&mut files, &JS_SRC, "vendor/carteiro-sdk/src");
            add_dir(&mut files, &WIT, "vendor/wit");
        }
    }
    files.insert(
        PathBuf::from("vendor/README.md"),
        vendor_readme(lang).into_bytes(),
    );
    Ok(files)
}

fn vendor_readme(lang: Lang) -> String {
    let dirs = vendored_dirs(lang)
        .iter()
        .map(|d| format!("`{}/`", d.trim_start_matches("vendor/")))
        .collect::<Vec<_>>()
        .join(" and ");
    format!(
        "# Vendored Carteiro SDK\n\n\
         {dirs} were written by carteiro {version} (`carteiro plugin new`), from the SDK \
         that binary was built with. Do not edit them.\n\n\
         ```sh\n\
         carteiro plugin sdk .            # compares vendor/ with the installed carteiro's SDK\n\
         carteiro plugin sdk --update .   # rewrites vendor/ from it\n\
         ```\n",
        version = env!("CARGO_PKG_VERSION"),
    )
}

/// Adds `dir`'s files under `prefix` (an embedded file's path is relative to the folder
/// named in its `include_dir!`), leaving out byproducts: Python's bytecode caches may sit
/// in the source tree carteiro was built from.
fn add_dir(files: &mut BTreeMap<PathBuf, Vec<u8>>, dir: &Dir<'static>, prefix: &str) {
    for entry in dir.entries() {
        match entry {
            DirEntry::Dir(sub) if !is_byproduct(sub.path()) => add_dir(files, sub, prefix),
            DirEntry::File(file) if !is_byproduct(file.path()) => {
                files.insert(
                    Path::new(prefix).join(file.path()),
                    file.contents().to_vec(),
                );
            }
            _ => {}
        }
    }
}

/// What tools leave in an SDK's folder, never part of it: bytecode caches, and what
/// `pip install ./vendor/carteiro-py` builds in place (`build/`, `*.egg-info/`).
pub fn is_byproduct(path: &Path) -> bool {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    name == "__pycache__"
        || name == "build"
        || name.ends_with(".egg-info")
        || path.extension().is_some_and(|e| e == "pyc")
}

/// The SDK's manifest with its workspace inheritance resolved (as `cargo package` does), so
/// the vendored crate builds outside this repository's workspace.
pub fn standalone_manifest(sdk: &str, workspace: &str) -> anyhow::Result<String> {
    let workspace: toml::Table = workspace.parse().context("workspace Cargo.toml")?;
    let inherited = |table: &str| {
        workspace
            .get("workspace")
            .and_then(|w| w.get(table))
            .and_then(toml::Value::as_table)
    };
    let mut out = format!(
        "# carteiro-sdk as vendored by carteiro {}; refresh with `carteiro plugin sdk --update`.\n",
        env!("CARGO_PKG_VERSION")
    );
    let mut section = String::new();
    for line in sdk.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            section = trimmed.trim_matches(['[', ']']).to_owned();
            if section == "lints" {
                continue; // written with its tables below
            }
        }
        if section == "lints" && trimmed == "workspace = true" {
            let lints = inherited("lints").context("[workspace.lints] is missing")?;
            let mut table = toml::Table::new();
            table.insert("lints".into(), toml::Value::Table(lints.clone()));
            out.push_str(&toml::to_string(&table)?);
            continue;
        }
        if let Some(key) = trimmed.strip_suffix(".workspace = true") {
            if section != "package" {
                bail!("cannot vendor `{trimmed}` in [{section}] of the SDK's Cargo.toml");
            }
            let value = inherited("package")
                .and_then(|p| p.get(key))
                .with_context(|| format!("[workspace.package] has no `{key}`"))?;
            out.push_str(&format!("{key} = {value}\n"));
            continue;
        }
        if section == "lints" && !trimmed.is_empty() {
            bail!("cannot vendor `{trimmed}` in [lints] of the SDK's Cargo.toml");
        }
        out.push_str(line);
        out.push('\n');
    }
    let parsed: toml::Table = out.parse().context("the vendored Cargo.toml")?;
    if mentions_workspace(&toml::Value::Table(parsed)) {
        bail!("the vendored Cargo.toml still inherits from a workspace");
    }
    Ok(out)
}

fn mentions_workspace(value: &toml::Value) -> bool {
    match value {
        toml::Value::Table(t) => t
            .iter()
            .any(|(k, v)| k == "workspace" || mentions_workspace(v)),
        toml::Value::Array(a) => a.iter().any(mentions_workspace),
        _ => false,
    }
}

/// Writes `lang`'s vendored SDK into `root`, first removing the folders carteiro owns (so a
/// file the SDK dropped does not linger).
pub fn write_vendor(root: &Path, lang: Lang) -> anyhow::Result<()> {
    let files = vendored_files(lang)?;
    for dir in vendored_dirs(lang) {
        let dir = root.join(dir);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("cannot remove {}", dir.display()))?;
        }
    }
    for (path, contents) in &files {
        write_file(&root.join(path), contents)?;
    }
    Ok(())
}

/// Writes `contents` to `path`, creating its folders first.
pub(crate) fn write_file(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    std::fs::write(path, contents).with_context(|| format!("cannot write {}", path.display()))
}

/// How a project's vendored SDK differs from this binary's (empty: identical). The note
/// `vendor/README.md` is not compared.
pub fn differences(root: &Path, lang: Lang) -> anyhow::Result<Vec<String>> {
    let mut want = vendored_files(lang)?;
    want.remove(Path::new("vendor/README.md"));
    let mut found = BTreeMap::new();
    for dir in vendored_dirs(lang) {
        collect(root, &root.join(dir), &mut found)?;
    }
    let mut out = Vec::new();
    for (path, contents) in &want {
        match found.get(path) {
            None => out.push(format!("missing  {}", path.display())),
            Some(have) if have != contents => out.push(format!("differs  {}", path.display())),
            Some(_) => {}
        }
    }
    for path in found.keys().filter(|p| !want.contains_key(*p)) {
        out.push(format!("extra    {}", path.display()));
    }
    Ok(out)
}

/// Files under `dir` (byproducts left out), keyed by their path relative to `root`.
fn collect(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) -> anyhow::Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(()); // a missing folder shows as missing files
    };
    for entry in entries {
        let path = entry?.path();
        if is_byproduct(&path) {
            continue;
        }
        if path.is_dir() {
            collect(root, &path, out)?;
        } else {
            let contents =
                std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
            let relative = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
            out.insert(relative, contents);
        }
    }
    Ok(())
}

/// Arguments of `carteiro plugin sdk`.
#[derive(Debug, clap::Args)]
pub struct SdkArgs {
    /// The handler project.
    #[arg(default_value = ".")]
    pub dir: PathBuf,
    /// Rewrite the project's vendored SDK from this binary's.
    #[arg(long)]
    pub update: bool,
    /// The project's language, when its files do not tell it alone.
    #[arg(long, value_enum)]
    pub lang: Option<Lang>,
}

/// Compares (exit 1 when they differ) or, with `--update`, rewrites a project's vendored SDK.
pub fn run(args: SdkArgs) -> anyhow::Result<i32> {
    let dir = &args.dir;
    let lang = match args.lang {
        Some(lang) => lang,
        None => super::plugin_build::detect(dir)?,
    };
    let version = env!("CARGO_PKG_VERSION");
    if lang == Lang::Rust
        && !std::fs::read_to_string(dir.join("Cargo.toml"))
            .is_ok_and(|m| m.contains("\"vendor/carteiro-sdk\""))
    {
        eprintln!(
            "note: {} does not depend on vendor/carteiro-sdk (made with --sdk-path?)",
            dir.join("Cargo.toml").display()
        );
    }
    let diffs = differences(dir, lang)?;
    if args.update {
        write_vendor(dir, lang)?;
        for diff in &diffs {
            println!("{diff}");
        }
        println!(
            "{}: vendor/ now holds the {lang} SDK of carteiro {version} ({} file(s) changed)",
            dir.display(),
            diffs.len()
        );
        return Ok(0);
    }
    if diffs.is_empty() {
        println!(
            "{}: vendor/ holds the {lang} SDK of carteiro {version}",
            dir.display()
        );
        return Ok(0);
    }
    for diff in &diffs {
        println!("{diff}");
    }
    println!(
        "{}: vendor/ differs from the {lang} SDK of carteiro {version}; take it with \
         `carteiro plugin sdk --update {}`",
        dir.display(),
        dir.display()
    );
    Ok(1)
}
