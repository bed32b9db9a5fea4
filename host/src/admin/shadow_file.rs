//! Which file a console shadow run may load: a `.wasm` under one of the configured plugin
//! folders (the folders of every `[plugins.NAME]` `path`, `shadow` and `canary.path`),
//! optionally pinned by its SHA-256. The file runs with a route plugin's variables and real
//! kv reads and its output is readable on `/api/jobs`, so an arbitrary path on the host
//! (`/etc/...`, `../`) is refused, and no refusal quotes a byte of the file.

use super::Refusal;
use crate::config::Config;
use axum::http::StatusCode;
use sha2::{Digest, Sha256};
#[cfg(test)]
use std::path::Path;
use std::path::PathBuf;

/// A checked shadow file: where it is and the digest its bytes had when checked (the job
/// loads it pinned to that digest, so a file swapped meanwhile is refused).
pub struct ShadowFile {
    pub path: PathBuf,
    pub sha256: String,
}

/// The folders plugin files are configured in (canonical, without repeats).
pub fn plugin_folders(config: &Config) -> Vec<PathBuf> {
    let mut folders: Vec<PathBuf> = config
        .plugins
        .values()
        .flat_map(|p| {
            [
                Some(p.path.clone()),
                p.shadow.clone(),
                p.canary.as_ref().map(|c| c.path.clone()),
            ]
        })
        .flatten()
        .filter_map(|file| {
            let file = if file.is_relative() {
                config.base_dir.join(file)
            } else {
                file
            };
            file.parent()?.canonicalize().ok()
        })
        .collect();
    folders.sort();
    folders.dedup();
    folders
}

fn bad(why: String) -> Refusal {
    Refusal::new(StatusCode::BAD_REQUEST, why)
}

/// Checks `given` (relative to the config file's folder) and the optional `sha256` pin.
pub fn check(config: &Config, given: &str, sha256: Option<&str>) -> Result<ShadowFile, Refusal> {
    let given = given.trim();
    if given.is_empty() {
        return Err(bad(
            "give the path of the new plugin file (a .wasm in a plugin folder of the config)"
                .into(),
        ));
    }
    let pin = match sha256.map(str::trim).filter(|s| !s.is_empty()) {
        Some(pin) if pin.len() == 64 && pin.chars().all(|c| c.is_ascii_hexdigit()) => {
            Some(pin.to_ascii_lowercase())
        }
        Some(_) => {
            return Err(bad(
                "sha256 must be 64 hex digits (the new file's SHA-256)".into()
            ));
        }
        None => None,
    };
    let mut path = PathBuf::from(given);
    if path.is_relative() {
        path = config.base_dir.join(path);
    }
    let not_found = || bad(format!("no plugin file at {given}"));
    let canonical = path.canonicalize().map_err(|_| not_found())?;
    let folders = plugin_folders(config);
    if !folders.iter().any(|f| canonical.starts_with(f)) {
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            format!(
                "{given} is not in a plugin folder of the config ({}): a shadow run loads only \
                 files beside the configured plugins; copy the new version there",
                folders
                    .iter()
                    .map(|f| f.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    if !canonical.is_file() {
        return Err(not_found());
    }
    let bytes =
        std::fs::read(&canonical).map_err(|e| bad(format!("cannot read {given}: {}", e.kind())))?;
    if !is_wasm(&bytes) {
        return Err(bad(format!(
            "{given} is not a WebAssembly component (it does not start with the wasm header)"
        )));
    }
    let digest = hex::encode(Sha256::digest(&bytes));
    if let Some(pin) = pin
        && pin != digest
    {
        return Err(bad(format!(
            "{given} has sha256 {digest}, not the {pin} asked for; nothing was run"
        )));
    }
    Ok(ShadowFile {
        path: canonical,
        sha256: digest,
    })
}

fn is_wasm(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\0asm")
}

/// Whether `path` is under `folder` (both canonical).
#[cfg(test)]
fn under(path: &Path, folder: &Path) -> bool {
    path.starts_with(folder)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_whole_components() {
        assert!(under(
            Path::new("/p/plugins/a.wasm"),
            Path::new("/p/plugins")
        ));
        assert!(!under(
            Path::new("/p/plugins-evil/a.wasm"),
            Path::new("/p/plugins")
        ));
        assert!(is_wasm(b"\0asm\x0d\0\x01\0"));
        assert!(!is_wasm(b"root:x:0:0"));
    }
}
