//! The build tools `carteiro plugin build` runs, the versions this repository pins for them
//! (read from `scripts/lang/requirements.txt` and the root `package.json`, so a scaffold
//! and the repository's own plugins use the same ones), and the errors that name a missing
//! tool together with the command that installs it.

use anyhow::{Context, bail};
use std::ffi::OsString;
use std::path::Path;
use std::process::{Command, Output, Stdio};

const REQUIREMENTS: &str = include_str!("../../../scripts/lang/requirements.txt");
const ROOT_PACKAGE: &str = include_str!("../../../package.json");
/// Bundles a JS handler with the SDK and componentizes it (shared with
/// `scripts/build-lang-plugins.sh`).
pub const COMPONENTIZE_JS: &str = include_str!("../../../scripts/lang/componentize-js.mjs");

/// The toolchain versions this carteiro was built and tested with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pins {
    pub componentize_py: String,
    pub componentize_js: String,
    pub preview2_shim: String,
    pub rolldown: String,
}

/// The npm packages a JS build loads from `node_modules`.
pub const JS_PACKAGES: [&str; 3] = [
    "@bytecodealliance/componentize-js",
    "@bytecodealliance/preview2-shim",
    "rolldown",
];

impl Pins {
    /// The embedded pins; an error means the repository's pin files lost an entry.
    pub fn embedded() -> anyhow::Result<Self> {
        Self::parse(REQUIREMENTS, ROOT_PACKAGE)
    }

    fn parse(requirements: &str, package_json: &str) -> anyhow::Result<Self> {
        let componentize_py = requirements
            .lines()
            .find_map(|l| l.trim().strip_prefix("componentize-py=="))
            .context("scripts/lang/requirements.txt pins no componentize-py==VERSION")?
            .trim()
            .to_owned();
        let package: serde_json::Value =
            serde_json::from_str(package_json).context("the root package.json")?;
        let dev = |name: &str| {
            package["devDependencies"][name]
                .as_str()
                .map(str::to_owned)
                .with_context(|| format!("the root package.json pins no {name}"))
        };
        Ok(Self {
            componentize_py,
            componentize_js: dev(JS_PACKAGES[0])?,
            preview2_shim: dev(JS_PACKAGES[1])?,
            rolldown: dev(JS_PACKAGES[2])?,
        })
    }

    /// `pip install componentize-py==X`.
    pub fn pip_install(&self) -> String {
        format!("pip install componentize-py=={}", self.componentize_py)
    }

    /// `npm install --save-dev` of the pinned JS toolchain.
    pub fn npm_install(&self) -> String {
        format!(
            "npm install --save-dev {}@{} {}@{} {}@{}",
            JS_PACKAGES[0],
            self.componentize_js,
            JS_PACKAGES[1],
            self.preview2_shim,
            JS_PACKAGES[2],
            self.rolldown
        )
    }
}

/// A program `plugin build` runs, and how to get it when it is missing.
pub struct Tool {
    /// What to run (a name looked up on `PATH`, or a path).
    pub program: OsString,
    /// What to call it in messages.
    pub name: &'static str,
    /// The command that installs it.
    pub install: String,
}

impl Tool {
    /// `program`, or the program named by the environment variable `var` when it is set
    /// (as cargo honours `CARGO` and `RUSTC`).
    pub fn new(var: Option<&str>, program: &str, name: &'static str, install: String) -> Self {
        let program = var
            .and_then(std::env::var_os)
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| program.into());
        Self {
            program,
            name,
            install,
        }
    }

    /// A command running this tool.
    pub fn command(&self) -> Command {
        Command::new(&self.program)
    }

    /// Runs `cmd` (made by [`Tool::command`]) to completion, its stdout captured and its
    /// stderr shown; a missing program is an error that says how to install it.
    pub fn output(&self, cmd: &mut Command) -> anyhow::Result<Output> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        cmd.output().map_err(|e| self.spawn_error(e))
    }

    /// Runs `cmd` to completion with its output shown on stderr (stdout stays for the
    /// result of `plugin build`); fails when it exits non-zero.
    pub fn run(&self, cmd: &mut Command) -> anyhow::Result<()> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(std::io::stderr()))
            .stderr(Stdio::inherit());
        let status = cmd.status().map_err(|e| self.spawn_error(e))?;
        if !status.success() {
            bail!("{} failed ({status})", self.name);
        }
        Ok(())
    }

    fn spawn_error(&self, e: std::io::Error) -> anyhow::Error {
        if e.kind() == std::io::ErrorKind::NotFound {
            let program = Path::new(&self.program);
            let place = if program.components().count() > 1 {
                format!("at {}", program.display())
            } else {
                format!("on PATH (as `{}`)", program.display())
            };
            anyhow::anyhow!(
                "{} not found {place}: install it with `{}`",
                self.name,
                self.install
            )
        } else {
            anyhow::anyhow!("cannot run {}: {e}", self.name)
        }
    }
}

/// The first bytes of a WebAssembly component: `\0asm`, then the component-model layer
/// (`0d 00 01 00`; a core module would have version `01 00 00 00`).
pub const COMPONENT_MAGIC: [u8; 8] = [0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];

/// Fails unless `path` starts like a WebAssembly component.
pub fn check_component(path: &Path) -> anyhow::Result<()> {
    use std::io::Read;
    let mut header = [0u8; 8];
    let read = std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut header))
        .with_context(|| format!("cannot read {}", path.display()));
    if read.is_err() || header != COMPONENT_MAGIC {
        let found = if read.is_ok() {
            hex::encode(header)
        } else {
            "shorter than 8 bytes".into()
        };
        bail!(
            "{} is not a WebAssembly component (header {found}, expected {})",
            path.display(),
            hex::encode(COMPONENT_MAGIC)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_come_from_the_repository_pin_files() {
        let pins = Pins::embedded().expect("pins");
        assert!(REQUIREMENTS.contains(&format!("componentize-py=={}", pins.componentize_py)));
        assert!(ROOT_PACKAGE.contains(&format!("\"rolldown\": \"{}\"", pins.rolldown)));
        assert_eq!(
            pins.pip_install(),
            format!("pip install componentize-py=={}", pins.componentize_py)
        );
        let npm = pins.npm_install();
        for (package, version) in
            JS_PACKAGES
                .iter()
                .zip([&pins.componentize_js, &pins.preview2_shim, &pins.rolldown])
        {
            assert!(npm.contains(&format!("{package}@{version}")), "{npm}");
        }
        let missing = Pins::parse("pytest==1\n", ROOT_PACKAGE).expect_err("no pin");
        assert!(missing.to_string().contains("componentize-py"), "{missing}");
    }

    #[test]
    fn a_missing_tool_names_itself_and_its_install_command() {
        let tool = Tool::new(
            None,
            "carteiro-test-no-such-program",
            "componentize-py",
            "pip install componentize-py==0.25.1".into(),
        );
        let err = tool.run(&mut tool.command()).expect_err("missing");
        let text = err.to_string();
        assert!(text.contains("componentize-py not found"), "{text}");
        assert!(
            text.contains("`pip install componentize-py==0.25.1`"),
            "{text}"
        );
        let err = tool.output(&mut tool.command()).expect_err("missing");
        assert!(err.to_string().contains("install it with"), "{err}");
    }

    #[test]
    fn only_a_component_passes_the_header_check() {
        let dir = tempfile::tempdir().expect("tempdir");
        let component = dir.path().join("c.wasm");
        std::fs::write(&component, [&COMPONENT_MAGIC[..], b"rest"].concat()).expect("write");
        check_component(&component).expect("a component");

        let module = dir.path().join("m.wasm");
        std::fs::write(&module, b"\0asm\x01\0\0\0").expect("write");
        let err = check_component(&module).expect_err("a core module");
        assert!(err.to_string().contains("0061736d01000000"), "{err}");

        let short = dir.path().join("s.wasm");
        std::fs::write(&short, b"\0asm").expect("write");
        assert!(check_component(&short).is_err());
        assert!(check_component(&dir.path().join("none.wasm")).is_err());
    }
}
