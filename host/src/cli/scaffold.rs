//! `carteiro plugin new NAME [--lang rust|python|js]`: a handler project that passes its own
//! native test and builds into a component out of the box, with a ten-line handler, a
//! `message.json` for `carteiro plugin test` and a README. The files come from
//! `plugin-sdk/template/<lang>/` (`*.tmpl` filled in), the SDK from [`super::sdk`]: the
//! project depends on its `vendor/` copy by a relative path, never on this machine's.

use anyhow::{Context, bail};
use include_dir::{Dir, DirEntry};
use std::path::{Path, PathBuf};

use super::Lang;
use super::sdk::{self, TEMPLATES};
use super::toolchain::Pins;

/// Arguments of `carteiro plugin new`.
#[derive(Debug, clap::Args)]
pub struct NewArgs {
    /// Project name (lowercase letters, digits, `-` and `_`); also its folder's name.
    pub name: String,
    /// The handler's language.
    #[arg(long, value_enum, default_value_t = Lang::Rust)]
    pub lang: Lang,
    /// Parent folder of the new project.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Rust only: depend on this carteiro-sdk crate instead of a vendored copy of the SDK
    /// this binary was built with.
    #[arg(long)]
    pub sdk_path: Option<PathBuf>,
}

fn valid_name(name: &str) -> bool {
    name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

/// Writes the project; refuses to overwrite anything.
pub fn run(args: NewArgs) -> anyhow::Result<i32> {
    let root = create(&args)?;
    println!("created {} ({} handler)", root.display(), args.lang);
    let steps = match args.lang {
        Lang::Rust => "cargo test && carteiro plugin build",
        Lang::Python => {
            "python3 -m venv .venv && .venv/bin/pip install -r requirements.txt \
             && .venv/bin/pytest && carteiro plugin build"
        }
        Lang::Js => "npm install && npm test && carteiro plugin build",
    };
    println!("next:    cd {} && {steps}", root.display());
    println!(
        "then:    carteiro plugin test <the .wasm it prints> --message message.json --expect ack"
    );
    Ok(0)
}

/// Writes the project and returns its folder.
pub fn create(args: &NewArgs) -> anyhow::Result<PathBuf> {
    if !valid_name(&args.name) {
        bail!(
            "`{}` is not a valid project name: start with a lowercase letter, then use \
             lowercase letters, digits, `-` and `_`",
            args.name
        );
    }
    if args.sdk_path.is_some() && args.lang != Lang::Rust {
        bail!("--sdk-path applies to Rust projects only (the others always vendor their SDK)");
    }
    let root = args.dir.join(&args.name);
    if root.exists() {
        bail!(
            "{} already exists; choose another name or folder",
            root.display()
        );
    }
    let sdk_dep = match &args.sdk_path {
        Some(path) => {
            let path = path
                .canonicalize()
                .with_context(|| format!("--sdk-path {}: no such folder", path.display()))?;
            format!(
                "carteiro-sdk = {{ path = {} }}",
                toml::Value::String(path.display().to_string())
            )
        }
        None => "carteiro-sdk = { path = \"vendor/carteiro-sdk\" }".to_owned(),
    };
    let pins = Pins::embedded()?;
    let vars = [
        ("name", args.name.clone()),
        ("crate_name", args.name.replace('-', "_")),
        ("sdk_dep", sdk_dep),
        ("carteiro_version", env!("CARGO_PKG_VERSION").to_owned()),
        ("componentize_py_version", pins.componentize_py),
        ("componentize_js_version", pins.componentize_js),
        ("preview2_shim_version", pins.preview2_shim),
        ("rolldown_version", pins.rolldown),
    ];
    let template = TEMPLATES
        .get_dir(args.lang.to_string())
        .with_context(|| format!("this carteiro carries no {} template", args.lang))?;
    let mut files = Vec::new();
    template_files(template, template.path(), &mut files);

    std::fs::create_dir_all(&root).with_context(|| format!("cannot create {}", root.display()))?;
    for (path, contents) in files {
        let (path, contents) = match path.to_str().and_then(|p| p.strip_suffix(".tmpl")) {
            Some(stripped) => {
                let text = String::from_utf8_lossy(contents);
                (PathBuf::from(stripped), fill(&text, &vars)?.into_bytes())
            }
            None => (path, contents.to_vec()),
        };
        sdk::write_file(&root.join(path), &contents)?;
    }
    if args.sdk_path.is_none() || args.lang != Lang::Rust {
        sdk::write_vendor(&root, args.lang)?;
    }
    Ok(root)
}

/// The template's files, by path relative to the template's folder.
fn template_files<'a>(dir: &'a Dir<'a>, root: &Path, out: &mut Vec<(PathBuf, &'a [u8])>) {
    for entry in dir.entries() {
        match entry {
            DirEntry::Dir(sub) => template_files(sub, root, out),
            DirEntry::File(file) => {
                let path = file.path().strip_prefix(root).unwrap_or(file.path());
                out.push((path.to_path_buf(), file.contents()));
            }
        }
    }
}

/// Replaces every `{{var}}`; an unknown one is an error (a template and this code disagree).
fn fill(text: &str, vars: &[(&str, String)]) -> anyhow::Result<String> {
    let mut out = text.to_owned();
    for (name, value) in vars {
        out = out.replace(&format!("{{{{{name}}}}}"), value);
    }
    if let Some(start) = out.find("{{") {
        let rest = &out[start..];
        let end = rest.find("}}").map_or(rest.len(), |e| e + 2);
        bail!("template placeholder {} has no value", &rest[..end]);
    }
    Ok(out)
}

#[cfg(test)]
#[path = "scaffold_tests.rs"]
mod tests;
