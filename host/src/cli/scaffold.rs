//! `carteiro plugin new NAME`: a handler crate that builds for wasm32-wasip2 and passes its
//! own native test out of the box.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};

const CARGO_TOML: &str = include_str!("../../../plugin-sdk/template/Cargo.toml.tmpl");
const LIB_RS: &str = include_str!("../../../plugin-sdk/template/src/lib.rs.tmpl");
const README: &str = include_str!("../../../plugin-sdk/template/README.md.tmpl");
const MESSAGE: &str = include_str!("../../../plugin-sdk/template/message.json.tmpl");

/// Arguments of `carteiro plugin new`.
#[derive(Debug, clap::Args)]
pub struct NewArgs {
    /// Crate name (lowercase letters, digits, `-` and `_`).
    pub name: String,
    /// Parent folder of the new crate.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// Path to the carteiro-sdk crate (by default the SDK this binary was built from).
    #[arg(long)]
    pub sdk_path: Option<PathBuf>,
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

/// Writes the crate; refuses to overwrite anything.
pub fn run(args: NewArgs) -> anyhow::Result<i32> {
    if !valid_name(&args.name) {
        bail!(
            "`{}` is not a valid crate name: use lowercase letters, digits, `-` and `_`",
            args.name
        );
    }
    let root = args.dir.join(&args.name);
    if root.exists() {
        bail!(
            "{} already exists; choose another name or folder",
            root.display()
        );
    }
    let sdk = match args.sdk_path {
        Some(path) => path,
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugin-sdk"),
    };
    let sdk = sdk.canonicalize().unwrap_or(sdk);
    let sdk_dep = format!(
        "carteiro-sdk = {{ path = {:?} }}",
        sdk.display().to_string()
    );
    let fill = |t: &str| {
        t.replace("{{name}}", &args.name)
            .replace("{{crate_name}}", &args.name.replace('-', "_"))
            .replace("{{sdk_dep}}", &sdk_dep)
            .replace("{{sdk_path}}", &sdk.display().to_string())
    };
    std::fs::create_dir_all(root.join("src"))
        .with_context(|| format!("cannot create {}", root.display()))?;
    std::fs::write(root.join("Cargo.toml"), fill(CARGO_TOML))?;
    std::fs::write(root.join("src/lib.rs"), fill(LIB_RS))?;
    std::fs::write(root.join("README.md"), fill(README))?;
    std::fs::write(root.join("message.json"), fill(MESSAGE))?;
    println!("created {}", root.display());
    println!(
        "next:   cd {} && cargo test && cargo build --release --target wasm32-wasip2",
        root.display()
    );
    Ok(0)
}
