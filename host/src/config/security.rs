//! `[security]`: where the header-seal key comes from when it should not live in the store.

use super::{Secret, interpolate};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Fewest key bytes accepted (HMAC-SHA256's block of entropy).
const MIN_KEY_BYTES: usize = 32;

/// `[security]`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SecurityConfig {
    /// The key that seals Carteiro's headers, as hex of at least 32 bytes (`openssl rand
    /// -hex 32`), normally `"${CARTEIRO_SEAL_KEY}"` from the environment. Set, it replaces the
    /// key Carteiro otherwise keeps in the store's `carteiro_secrets` table, which is then
    /// neither read nor written. Every gateway and CLI on one store must use the same key.
    /// Never printed.
    pub seal_key: Option<Secret>,
    /// Instead of `seal_key`: a file holding it (hex; relative to the config file), e.g. a
    /// mounted secret. Should be readable by Carteiro's user only (a warning says otherwise).
    pub seal_key_file: Option<PathBuf>,
}

impl SecurityConfig {
    /// Interpolates and checks the key (or reads the file) so a bad one stops start-up.
    /// `Err((key, message))`, never quoting the key.
    pub(super) fn validate(&mut self, base_dir: &Path) -> Result<(), (&'static str, String)> {
        if let Some(key) = &mut self.seal_key {
            key.0 = interpolate(&key.0).map_err(|m| ("seal_key", m.to_string()))?;
        }
        if let Some(path) = &mut self.seal_key_file
            && path.is_relative()
        {
            *path = base_dir.join(&*path);
        }
        match (&self.seal_key, &self.seal_key_file) {
            (Some(_), Some(_)) => Err((
                "seal_key_file",
                "set either `seal_key` or `seal_key_file`, not both".into(),
            )),
            _ => self.seal_secret().map(|_| ()),
        }
    }

    /// The configured seal key's bytes; `None`: keep it in the store.
    pub fn seal_secret(&self) -> Result<Option<Vec<u8>>, (&'static str, String)> {
        let (key, text) = match (&self.seal_key, &self.seal_key_file) {
            (Some(secret), _) => ("seal_key", secret.0.clone()),
            (None, Some(path)) => (
                "seal_key_file",
                std::fs::read_to_string(path).map_err(|e| {
                    (
                        "seal_key_file",
                        format!("cannot read {}: {e}", path.display()),
                    )
                })?,
            ),
            (None, None) => return Ok(None),
        };
        let bytes = hex::decode(text.trim()).map_err(|_| {
            (
                key,
                "the seal key must be hex (e.g. the output of `openssl rand -hex 32`)".to_owned(),
            )
        })?;
        if bytes.len() < MIN_KEY_BYTES {
            return Err((
                key,
                format!(
                    "the seal key has {} bytes; use at least {MIN_KEY_BYTES} (`openssl rand -hex 32`)",
                    bytes.len()
                ),
            ));
        }
        Ok(Some(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::super::load_str;
    use std::path::Path;

    fn load(security: &str, dir: &Path) -> Result<super::super::Config, super::super::ConfigError> {
        load_str(
            &format!("version = 1\n[broker]\nurl = \"amqp://h/v\"\n[security]\n{security}\n"),
            Path::new("t.toml"),
            dir,
        )
    }

    #[test]
    fn the_seal_key_comes_from_the_config_or_a_file_and_is_checked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let hex64 = "ab".repeat(32);
        let config = load(&format!("seal_key = \"{hex64}\""), dir.path()).expect("valid");
        let secret = config.security.seal_secret().expect("ok").expect("set");
        assert_eq!(secret, vec![0xab; 32]);

        std::fs::write(dir.path().join("seal.key"), format!("{hex64}\n")).expect("write");
        let config = load("seal_key_file = \"seal.key\"", dir.path()).expect("valid");
        assert_eq!(
            config.security.seal_secret().expect("ok"),
            Some(vec![0xab; 32])
        );

        let err = load("seal_key = \"abcd\"", dir.path()).unwrap_err();
        assert_eq!(err.key, "security.seal_key");
        assert!(err.message.contains("at least 32"), "{err}");
        assert!(!err.message.contains("abcd"), "never quotes the key: {err}");

        let err = load(
            "seal_key = \"not hex at all, but long enough to be a key......\"",
            dir.path(),
        )
        .unwrap_err();
        assert!(err.message.contains("must be hex"), "{err}");
        assert!(
            !err.message.contains("long enough"),
            "never quotes the key: {err}"
        );

        let err = load("seal_key_file = \"missing.key\"", dir.path()).unwrap_err();
        assert_eq!(err.key, "security.seal_key_file");

        let both = format!("seal_key = \"{hex64}\"\nseal_key_file = \"seal.key\"");
        assert!(
            load(&both, dir.path())
                .unwrap_err()
                .message
                .contains("not both")
        );

        let none = load("", dir.path()).expect("valid");
        assert_eq!(none.security.seal_secret().expect("ok"), None);
    }
}
