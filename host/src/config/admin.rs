//! `[admin]`: the admin server's address and credentials, and their checks. It stays in
//! `config` because the admin server sits above the config: it shows and reloads the whole
//! [`Config`](super::Config), so `config` cannot import `admin`.

use super::{Secret, interpolate};
use serde::Deserialize;

/// `[admin]`
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminConfig {
    /// Address of the admin HTTP server; empty disables it. Loopback by default. A
    /// non-loopback address needs `token` or `basic`: every page then asks for them.
    pub listen: String,
    /// Bearer token (`Authorization: Bearer ...`) for state changes (and every page off
    /// loopback); `${VAR}` is replaced from the environment. Never printed.
    pub token: Option<Secret>,
    /// Basic auth for the console in a browser; `${VAR}` is replaced in the password.
    pub basic: Option<BasicAuth>,
    /// What needs credentials: `"writes"` (state changes; every page too off loopback) or
    /// `"all"` (every page and JSON read as well, on loopback too; `/healthz` and the
    /// status line of `/readyz` stay open for probes).
    pub require_auth: RequireAuth,
    /// Host names (`Host` header, without the port) the admin server answers to besides
    /// loopback names and IP addresses, e.g. `["carteiro.internal"]`. Any other name is
    /// refused (403): a DNS-rebinding page cannot reach the console.
    pub allowed_hosts: Vec<String>,
}

/// `[admin] require_auth`
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RequireAuth {
    /// Credentials for state changes; reads are open on a loopback `listen`.
    #[default]
    Writes,
    /// Credentials for everything but `/healthz` and `/readyz`'s status line.
    All,
}

/// `[admin] basic = { user = "...", password = "..." }`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    /// User name.
    pub user: String,
    /// Password (`${VAR}` from the environment). Never printed.
    pub password: Secret,
}

impl AdminConfig {
    /// Whether `listen` is a loopback address (`127.0.0.0/8`, `[::1]`, `localhost`).
    pub fn is_loopback(&self) -> bool {
        if let Ok(addr) = self.listen.parse::<std::net::SocketAddr>() {
            return addr.ip().is_loopback();
        }
        let host = self
            .listen
            .rsplit_once(':')
            .map_or(self.listen.as_str(), |(h, _)| h);
        host.eq_ignore_ascii_case("localhost")
    }

    /// Whether any credentials are configured.
    pub fn has_credentials(&self) -> bool {
        self.token.is_some() || self.basic.is_some()
    }
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9090".to_owned(),
            token: None,
            basic: None,
            require_auth: RequireAuth::default(),
            allowed_hosts: Vec::new(),
        }
    }
}

impl AdminConfig {
    /// Interpolates the secrets and checks them; an address off loopback needs credentials.
    /// `Err((key, message))` with the key under `admin`.
    pub(super) fn validate(&mut self) -> Result<(), (&'static str, String)> {
        if let Some(token) = &mut self.token {
            token.0 = interpolate(&token.0).map_err(|m| ("token", m.to_string()))?;
            if token.0.is_empty() {
                return Err((
                    "token",
                    "is empty; set a long random token or remove the key".into(),
                ));
            }
        }
        if let Some(basic) = &mut self.basic {
            basic.password.0 =
                interpolate(&basic.password.0).map_err(|m| ("basic.password", m.to_string()))?;
            if basic.user.is_empty() || basic.user.contains(':') || basic.password.0.is_empty() {
                return Err((
                    "basic",
                    "needs a user (without `:`) and a non-empty password".into(),
                ));
            }
        }
        for host in &self.allowed_hosts {
            let bad = host.is_empty()
                || host.contains(':')
                || !host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
            if bad {
                return Err((
                    "allowed_hosts",
                    format!(
                        "`{host}` is not a host name: give names like `carteiro.internal`, \
                         without a scheme or port"
                    ),
                ));
            }
        }
        if self.require_auth == RequireAuth::All && !self.has_credentials() {
            return Err((
                "require_auth",
                "is \"all\" but [admin] has no `token` or `basic`: nothing could be read; set \
                 credentials or use \"writes\""
                    .into(),
            ));
        }
        if !self.listen.is_empty() && !self.is_loopback() && !self.has_credentials() {
            return Err((
                "listen",
                format!(
                    "`{}` is not a loopback address, so the admin server and its console need \
                     credentials: set `token = \"${{CARTEIRO_ADMIN_TOKEN}}\"` and/or \
                     `basic = {{ user = \"...\", password = \"${{CARTEIRO_ADMIN_PASSWORD}}\" }}` \
                     in [admin], or listen on 127.0.0.1",
                    self.listen
                ),
            ));
        }
        Ok(())
    }
}
