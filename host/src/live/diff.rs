//! What a new config changes against the running one, as a reload sees it: whether a
//! route must restart (`route_fingerprint`), whether a plugin must be compiled again
//! (`plugin_settings`, `file_digest`), which changed sections only a restart applies,
//! which `[admin]` keys apply now, and which credential changes refuse the reload.

use super::ReloadError;
use crate::config::{AdminConfig, Config};
use crate::pipeline::RouteConfig;
use crate::runtime::PluginConfig;
use sha2::{Digest, Sha256};

/// A route's settings apart from its plugin (a plugin change alone is a swap, not a
/// restart).
pub(super) fn route_fingerprint(route: &RouteConfig) -> String {
    let mut route = route.clone();
    route.plugin = toml::Spanned::new(0..0, String::new());
    // The alert is read by the alerts task, not by the running route: no restart for it.
    route.dead_letter_alert = None;
    format!("{route:?}")
}

/// A plugin's `[plugins.NAME]` table, to compare (never printed: variables may hold
/// secrets).
pub(super) fn plugin_settings(p: &PluginConfig) -> String {
    format!("{p:?}")
}

/// The SHA-256 of the file at `path` (hex), if it can be read.
pub(super) fn file_digest(path: &std::path::Path) -> Option<String> {
    std::fs::read(path)
        .ok()
        .map(|bytes| hex::encode(Sha256::digest(bytes)))
}

/// Sections of `new` that differ from `running` and only a restart applies.
pub(super) fn restart_only_changes(running: &Config, new: &Config) -> Vec<String> {
    let sections = |c: &Config| {
        [
            ("broker", format!("{:?}", c.broker)),
            ("store", format!("{:?}", c.store)),
            ("runtime", format!("{:?}", c.runtime)),
            ("relay", format!("{:?}", c.relay)),
            ("outbox", format!("{:?}", c.outbox)),
            ("dead_letters", format!("{:?}", c.dead_letters)),
            ("telemetry", format!("{:?}", c.telemetry)),
            (
                "[dead_letter_queues]",
                format!("{:?}", c.dead_letter_queues),
            ),
        ]
    };
    let mut out: Vec<String> = sections(running)
        .into_iter()
        .zip(sections(new))
        .filter(|((_, a), (_, b))| a != b)
        .map(|((name, _), _)| format!("[{name}]"))
        .collect();
    if running.admin.listen != new.admin.listen {
        out.push("[admin] listen".to_owned());
    }
    out
}

/// `[admin]` keys a reload applies (credentials and who needs them), one line each; never
/// the secrets themselves. (`Secret`'s `Debug` hides them, so compare the values.)
pub(super) fn admin_changes(running: &AdminConfig, new: &AdminConfig) -> Vec<String> {
    let mut out = Vec::new();
    let token = |a: &AdminConfig| a.token.as_ref().map(|t| t.0.clone());
    if token(running) != token(new) {
        out.push("[admin] token: changed; the previous one is no longer accepted".to_owned());
    }
    let basic = |a: &AdminConfig| {
        a.basic
            .as_ref()
            .map(|b| (b.user.clone(), b.password.0.clone()))
    };
    if basic(running) != basic(new) {
        out.push("[admin] basic: changed; the previous credentials are no longer accepted".into());
    }
    if running.require_auth != new.require_auth {
        out.push(format!("[admin] require_auth: now {:?}", new.require_auth));
    }
    if running.allowed_hosts != new.allowed_hosts {
        out.push(format!(
            "[admin] allowed_hosts: now {:?}",
            new.allowed_hosts
        ));
    }
    out
}

/// A reload cannot apply new broker or store credentials (the connections are made with the
/// old ones): a changed URL that carries a password refuses the reload, naming the key, so
/// nobody believes a rotated password is in use when it is not.
pub(super) fn credentials_needing_restart(
    running: &Config,
    new: &Config,
) -> Result<(), ReloadError> {
    let carries_secret = |url: &str| crate::redact::redact_url(url) != url;
    let check = |key: &'static str, a: &[String], b: &[String]| {
        if a != b && a.iter().chain(b).any(|u| carries_secret(u)) {
            Err(ReloadError::CredentialsChanged { key })
        } else {
            Ok(())
        }
    };
    check(
        "[broker] url",
        std::slice::from_ref(&running.broker.url),
        std::slice::from_ref(&new.broker.url),
    )?;
    check("[broker] urls", &running.broker.urls, &new.broker.urls)?;
    check(
        "[store] url",
        std::slice::from_ref(&running.store.url),
        std::slice::from_ref(&new.store.url),
    )
}
