//! `carteiro plugin build [DIR]`: builds a handler project into a WebAssembly component and
//! prints the component's path (alone on stdout; the tools' own output goes to stderr).
//!
//! The language comes from the project's files: `Cargo.toml` (Rust: cargo for
//! wasm32-wasip2), `pyproject.toml` or `app.py` (Python: componentize-py on `app` with the
//! vendored WIT and SDK), `package.json` (JavaScript: rolldown and ComponentizeJS, run by a
//! Node script this binary carries). A missing tool is an error naming it and the command
//! that installs it; the result must start like a component.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};

use super::Lang;
use super::toolchain::{COMPONENTIZE_JS, JS_PACKAGES, Pins, Tool, check_component};

/// The Rust target whose output is a component.
pub const RUST_TARGET: &str = "wasm32-wasip2";
/// Names a `node_modules` folder holding the JS toolchain, instead of the project's own.
pub const JS_TOOLCHAIN_VAR: &str = "CARTEIRO_JS_TOOLCHAIN";

/// Arguments of `carteiro plugin build`.
#[derive(Debug, clap::Args)]
pub struct BuildArgs {
    /// The handler project.
    #[arg(default_value = ".")]
    pub dir: PathBuf,
    /// The project's language, when its files do not tell it alone.
    #[arg(long, value_enum)]
    pub lang: Option<Lang>,
    /// Where to write the component (Python and JS default: DIR/build/<folder name>.wasm;
    /// Rust: cargo's output, copied here when given).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

/// The language of the project in `dir`, from its files.
pub fn detect(dir: &Path) -> anyhow::Result<Lang> {
    let mut found = Vec::new();
    if dir.join("Cargo.toml").is_file() {
        found.push(Lang::Rust);
    }
    if dir.join("pyproject.toml").is_file() || dir.join("app.py").is_file() {
        found.push(Lang::Python);
    }
    if dir.join("package.json").is_file() {
        found.push(Lang::Js);
    }
    match found.as_slice() {
        [lang] => Ok(*lang),
        [] => bail!(
            "{} has no Cargo.toml, pyproject.toml, app.py or package.json: is it a handler \
             project? (`carteiro plugin new NAME --lang rust|python|js` makes one)",
            dir.display()
        ),
        many => bail!(
            "{} looks like a {} project: say which with --lang",
            dir.display(),
            many.iter()
                .map(|l| l.to_string())
                .collect::<Vec<_>>()
                .join(" and a ")
        ),
    }
}

/// Builds the project and prints the component's path.
pub fn run(args: BuildArgs) -> anyhow::Result<i32> {
    let dir = std::path::absolute(&args.dir)
        .with_context(|| format!("cannot resolve {}", args.dir.display()))?;
    if !dir.is_dir() {
        bail!("{} is not a folder", dir.display());
    }
    let lang = match args.lang {
        Some(lang) => lang,
        None => detect(&dir)?,
    };
    let output = args
        .output
        .as_deref()
        .map(std::path::absolute)
        .transpose()
        .context("cannot resolve --output")?;
    let pins = Pins::embedded()?;
    let component = match lang {
        Lang::Rust => {
            let built = build_rust(&dir)?;
            check_component(&built)?;
            match output {
                Some(out) => {
                    create_parent(&out)?;
                    std::fs::copy(&built, &out).with_context(|| {
                        format!("cannot copy {} to {}", built.display(), out.display())
                    })?;
                    out
                }
                None => built,
            }
        }
        Lang::Python | Lang::Js => {
            let out = match output {
                Some(out) => out,
                None => default_output(&dir)?,
            };
            create_parent(&out)?;
            let tmp = out.with_extension("wasm.tmp");
            let _ = std::fs::remove_file(&tmp);
            if lang == Lang::Python {
                build_python(&dir, &tmp, &pins)?;
            } else {
                build_js(&dir, &tmp, &pins)?;
            }
            check_component(&tmp)?;
            std::fs::rename(&tmp, &out)
                .with_context(|| format!("cannot move the component to {}", out.display()))?;
            out
        }
    };
    println!("{}", component.display());
    Ok(0)
}

fn default_output(dir: &Path) -> anyhow::Result<PathBuf> {
    let name = dir
        .file_name()
        .with_context(|| format!("{} has no folder name: pass --output", dir.display()))?;
    let mut file = name.to_os_string();
    file.push(".wasm");
    Ok(dir.join("build").join(file))
}

fn create_parent(path: &Path) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    Ok(())
}

/// Fails naming the first of `paths` (relative to `dir`) that is missing.
fn require_vendored(dir: &Path, paths: &[&str]) -> anyhow::Result<()> {
    for path in paths {
        if !dir.join(path).exists() {
            bail!(
                "{} is missing: write the vendored SDK with `carteiro plugin sdk --update {}`",
                dir.join(path).display(),
                dir.display()
            );
        }
    }
    Ok(())
}

fn build_rust(dir: &Path) -> anyhow::Result<PathBuf> {
    let install = format!("rustup toolchain install stable && rustup target add {RUST_TARGET}");
    let rustc = Tool::new(Some("RUSTC"), "rustc", "rustc", install.clone());
    let cargo = Tool::new(Some("CARGO"), "cargo", "cargo", install);
    build_rust_with(dir, &rustc, &cargo)
}

fn build_rust_with(dir: &Path, rustc: &Tool, cargo: &Tool) -> anyhow::Result<PathBuf> {
    let add_target = format!("rustup target add {RUST_TARGET}");
    let libdir = rustc.output(
        rustc
            .command()
            .args(["--print", "target-libdir", "--target", RUST_TARGET])
            .current_dir(dir),
    )?;
    let libdir = String::from_utf8_lossy(&libdir.stdout).trim().to_owned();
    if libdir.is_empty() || !Path::new(&libdir).is_dir() {
        bail!("the Rust target {RUST_TARGET} is not installed: run `{add_target}`");
    }
    let manifest = dir.join("Cargo.toml");
    let out = cargo.output(
        cargo
            .command()
            .args(["build", "--release", "--target", RUST_TARGET])
            .arg("--message-format=json-render-diagnostics")
            .arg("--manifest-path")
            .arg(&manifest)
            .current_dir(dir),
    )?;
    if !out.status.success() {
        bail!("cargo build failed ({}); its errors are above", out.status);
    }
    cargo_artifact(&out.stdout, &manifest)
}

/// The `.wasm` of the cdylib cargo built for `manifest`, from its JSON messages.
fn cargo_artifact(messages: &[u8], manifest: &Path) -> anyhow::Result<PathBuf> {
    let manifest = manifest
        .canonicalize()
        .unwrap_or_else(|_| manifest.to_path_buf());
    let mut found = None;
    for line in messages.split(|b| *b == b'\n') {
        let Ok(msg) = serde_json::from_slice::<serde_json::Value>(line) else {
            continue;
        };
        let cdylib = msg["target"]["crate_types"]
            .as_array()
            .is_some_and(|types| types.iter().any(|t| t == "cdylib"));
        let ours = msg["manifest_path"]
            .as_str()
            .is_some_and(|p| Path::new(p) == manifest);
        if msg["reason"] != "compiler-artifact" || !cdylib || !ours {
            continue;
        }
        let files = msg["filenames"].as_array().into_iter().flatten();
        if let Some(wasm) = files
            .filter_map(|f| f.as_str())
            .find(|f| f.ends_with(".wasm"))
        {
            found = Some(PathBuf::from(wasm));
        }
    }
    found.with_context(|| {
        format!(
            "cargo built no .wasm for {}: does its [lib] say crate-type = [\"cdylib\"]?",
            manifest.display()
        )
    })
}

fn build_python(dir: &Path, out: &Path, pins: &Pins) -> anyhow::Result<()> {
    if !dir.join("app.py").is_file() {
        bail!(
            "{} has no app.py, the module holding the @carteiro.handler function",
            dir.display()
        );
    }
    require_vendored(dir, &["vendor/wit", "vendor/carteiro-py/src"])?;
    // The project's own virtual environment first (its README makes one), then PATH.
    let venv = dir.join(".venv/bin/componentize-py");
    let program = if venv.is_file() {
        venv.display().to_string()
    } else {
        "componentize-py".into()
    };
    let tool = Tool::new(None, &program, "componentize-py", pins.pip_install());
    let version = tool.output(tool.command().arg("--version").current_dir(dir))?;
    let version = String::from_utf8_lossy(&version.stdout).trim().to_owned();
    if !version.contains(&pins.componentize_py) {
        eprintln!(
            "warning: {version} is not the componentize-py {} this carteiro was tested with \
             (`{}`)",
            pins.componentize_py,
            pins.pip_install()
        );
    }
    tool.run(
        tool.command()
            // An active virtual environment's site-packages would be added to the
            // component's import path; the build imports only the project and the SDK.
            .env_remove("VIRTUAL_ENV")
            .current_dir(dir)
            .args(["-d", "vendor/wit", "-w", "handler"])
            .args(["--world-module", "_carteiro_wit", "componentize", "app"])
            .args(["-p", ".", "-p", "vendor/carteiro-py/src", "-o"])
            .arg(out),
    )
}

fn build_js(dir: &Path, out: &Path, pins: &Pins) -> anyhow::Result<()> {
    require_vendored(dir, &["vendor/wit", "vendor/carteiro-sdk/package.json"])?;
    let node = Tool::new(
        None,
        "node",
        "node (Node.js 20 or newer)",
        "apt-get install nodejs npm".into(),
    );
    let version = node.output(node.command().arg("--version"))?;
    let version = String::from_utf8_lossy(&version.stdout).trim().to_owned();
    let major = version
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok());
    if major.is_some_and(|m| m < 20) {
        bail!("node {version} is too old: ComponentizeJS needs Node.js 20 or newer");
    }
    // Where Node itself would look: DIR/node_modules, then each parent's (npm workspaces).
    let holding = |package: &str| {
        dir.ancestors()
            .map(|d| d.join("node_modules"))
            .find(|m| m.join(package).join("package.json").is_file())
    };
    let toolchain = match std::env::var_os(JS_TOOLCHAIN_VAR).filter(|v| !v.is_empty()) {
        Some(path) => std::path::absolute(PathBuf::from(path))?,
        None => holding(JS_PACKAGES[0]).unwrap_or_else(|| dir.join("node_modules")),
    };
    for package in JS_PACKAGES {
        if !toolchain.join(package).join("package.json").is_file() {
            bail!(
                "{package} is not installed in {}: run `{}` in {} (a scaffold's package.json \
                 lists them, so `npm install` there is enough)",
                toolchain.display(),
                pins.npm_install(),
                dir.display()
            );
        }
    }
    if holding("carteiro-sdk").is_none() {
        bail!(
            "carteiro-sdk is not in {}: run `npm install` there (package.json depends on \
             \"carteiro-sdk\": \"file:vendor/carteiro-sdk\")",
            dir.join("node_modules").display()
        );
    }
    let entry = js_entry(dir)?;
    // The script runs from a folder of its own whose node_modules is the toolchain, so
    // Node resolves ComponentizeJS and rolldown there whichever folder holds them.
    let work = tempfile::Builder::new()
        .prefix("carteiro-build-js-")
        .tempdir()
        .context("cannot create a temporary folder")?;
    let script = work.path().join("componentize-js.mjs");
    std::fs::write(&script, COMPONENTIZE_JS)
        .with_context(|| format!("cannot write {}", script.display()))?;
    link_dir(&toolchain, &work.path().join("node_modules"))?;
    node.run(
        node.command()
            .arg(&script)
            .arg(&entry)
            .arg(out)
            .arg(dir.join("vendor/wit"))
            .current_dir(dir),
    )
}

/// The handler module: package.json's `main`, by default `src/handler.js`.
fn js_entry(dir: &Path) -> anyhow::Result<PathBuf> {
    let manifest = dir.join("package.json");
    let text = std::fs::read_to_string(&manifest)
        .with_context(|| format!("cannot read {}", manifest.display()))?;
    let package: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not JSON", manifest.display()))?;
    let entry = dir.join(package["main"].as_str().unwrap_or("src/handler.js"));
    if !entry.is_file() {
        bail!(
            "{} (package.json's \"main\") does not exist",
            entry.display()
        );
    }
    Ok(entry)
}

#[cfg(unix)]
fn link_dir(target: &Path, link: &Path) -> anyhow::Result<()> {
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("cannot link {} to {}", link.display(), target.display()))
}

#[cfg(not(unix))]
fn link_dir(_target: &Path, _link: &Path) -> anyhow::Result<()> {
    bail!("building JavaScript handlers needs a Unix-like system")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn project(files: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        for file in files {
            std::fs::write(dir.path().join(file), "").expect("write");
        }
        dir
    }

    #[test]
    fn the_language_comes_from_the_project_files() {
        for (files, lang) in [
            (&["Cargo.toml"][..], Lang::Rust),
            (&["pyproject.toml"][..], Lang::Python),
            (&["app.py"][..], Lang::Python),
            (
                &["app.py", "pyproject.toml", "message.json"][..],
                Lang::Python,
            ),
            (&["package.json", "message.json"][..], Lang::Js),
        ] {
            let dir = project(files);
            assert_eq!(detect(dir.path()).expect("detected"), lang, "{files:?}");
        }
        let err = detect(project(&["message.json"]).path()).expect_err("nothing");
        assert!(err.to_string().contains("plugin new"), "{err}");
        let err = detect(project(&["Cargo.toml", "package.json"]).path()).expect_err("two");
        assert!(err.to_string().contains("rust and a js project"), "{err}");
        assert!(err.to_string().contains("--lang"), "{err}");
    }

    #[test]
    fn the_cdylib_of_the_project_is_the_artifact() {
        let dir = project(&["Cargo.toml"]);
        let manifest = dir.path().join("Cargo.toml");
        let real = manifest.canonicalize().expect("canonical");
        let line = |manifest: &Path, types: &str, file: &str| {
            serde_json::json!({
                "reason": "compiler-artifact",
                "manifest_path": manifest,
                "target": { "crate_types": [types] },
                "filenames": [file],
            })
            .to_string()
        };
        let messages = [
            line(&real, "lib", "/t/libcarteiro_sdk.rlib"),
            "not json".into(),
            line(
                Path::new("/elsewhere/Cargo.toml"),
                "cdylib",
                "/t/other.wasm",
            ),
            line(&real, "cdylib", "/t/wasm32-wasip2/release/greeter.wasm"),
            r#"{"reason":"build-finished","success":true}"#.into(),
        ]
        .join("\n");
        assert_eq!(
            cargo_artifact(messages.as_bytes(), &manifest).expect("found"),
            PathBuf::from("/t/wasm32-wasip2/release/greeter.wasm")
        );
        let err = cargo_artifact(b"", &manifest).expect_err("none");
        assert!(err.to_string().contains("cdylib"), "{err}");
    }

    #[test]
    fn python_and_js_builds_need_their_vendored_sdk() {
        let dir = project(&["app.py"]);
        let pins = Pins::embedded().expect("pins");
        let err = build_python(dir.path(), &dir.path().join("x.wasm"), &pins).expect_err("no wit");
        assert!(
            err.to_string().contains("carteiro plugin sdk --update"),
            "{err}"
        );
        let err = build_js(dir.path(), &dir.path().join("x.wasm"), &pins).expect_err("no sdk");
        assert!(
            err.to_string().contains("carteiro plugin sdk --update"),
            "{err}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_missing_wasm_target_or_rust_toolchain_says_how_to_install_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = project(&["Cargo.toml"]);
        // A rustc whose wasm32-wasip2 libraries are not installed.
        let fake = dir.path().join("fake-rustc");
        std::fs::write(
            &fake,
            "#!/bin/sh\necho /nonexistent/lib/rustlib/wasm32-wasip2/lib\n",
        )
        .expect("write");
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let tool = |program: &Path| Tool {
            program: program.into(),
            name: "rustc",
            install: "rustup toolchain install stable".into(),
        };
        let err = build_rust_with(dir.path(), &tool(&fake), &tool(&fake)).expect_err("no target");
        assert!(
            err.to_string()
                .contains("run `rustup target add wasm32-wasip2`"),
            "{err}"
        );
        let missing = dir.path().join("no-rustc");
        let err = build_rust_with(dir.path(), &tool(&missing), &tool(&fake)).expect_err("none");
        assert!(
            err.to_string()
                .contains("install it with `rustup toolchain install stable`"),
            "{err}"
        );
    }

    #[test]
    fn python_and_js_components_default_to_the_build_folder() {
        let out = default_output(Path::new("/work/greeter")).expect("output");
        assert_eq!(out, PathBuf::from("/work/greeter/build/greeter.wasm"));
    }
}
