//! Who may do what on the admin server (`[admin] token` and/or `basic`).
//!
//! - First the `Host` header (`origin`): a name this server does not answer to is refused
//!   before anything else.
//! - A state change (any method but GET and HEAD: console actions, the JSON actions,
//!   `POST /admin/reload`, `POST /admin/canary/...`) always needs credentials: a bearer
//!   token or basic auth. With none configured, state changes are refused.
//! - Off loopback, or with `[admin] require_auth = "all"`, every page needs them too, except
//!   `/healthz` and `/readyz` (probes; `/readyz` then shows only its status line unless the
//!   caller is authenticated). `/login` always needs them: it makes a browser ask once, then
//!   it sends them along.
//! - A state change authenticated by basic auth (what a browser resends on its own) must
//!   also come from the console's own origin (`Sec-Fetch-Site`, else `Origin` against
//!   `Host`): a page on another site cannot make an operator's browser replay or purge.
//! - Secrets are compared in constant time (SHA-256 of both sides, then `subtle`).
//! - Credentials are read from the running config on every request, so a reload that
//!   rotates the token or the password applies at once (the old ones stop working).

use crate::config::{AdminConfig, RequireAuth};
use crate::live::LiveHandle;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use sha2::{Digest, Sha256};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The configured credentials and where they are needed.
pub struct Auth {
    token: Option<String>,
    basic: Option<(String, String)>,
    /// Every page needs credentials (the server listens off loopback, or
    /// `require_auth = "all"`).
    pages_need_auth: bool,
    /// `[admin] allowed_hosts`.
    allowed_hosts: Vec<String>,
}

/// Whether the request's caller proved credentials (`/readyz` shows its detail only then,
/// where pages need credentials).
#[derive(Debug, Clone, Copy)]
pub struct Authenticated {
    /// Credentials were checked and are good.
    pub caller_known: bool,
    /// Reads need credentials on this server.
    pub pages_need_auth: bool,
    /// `[admin] token` or `basic` is set: state changes are possible at all.
    pub credentials_configured: bool,
}

impl Authenticated {
    /// Whether the caller may see what a read shows.
    pub fn may_read(&self) -> bool {
        self.caller_known || !self.pages_need_auth
    }

    /// Why the caller cannot replay, purge or edit (the console disables those and says
    /// this beside them); `None`: it can.
    pub fn why_no_actions(&self) -> Option<NoActions> {
        match (self.caller_known, self.credentials_configured) {
            (true, _) => None,
            (false, true) => Some(NoActions::LogIn),
            (false, false) => Some(NoActions::NoCredentials),
        }
    }
}

/// Why the console's actions are off for a viewer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoActions {
    /// Credentials exist; this browser has not sent them yet (`/login`).
    LogIn,
    /// The config sets neither `[admin] token` nor `basic`: nobody can act.
    NoCredentials,
}

/// Who made a request, for the records an action keeps (an edit's author): the `[admin]
/// basic` user, or `token` for the bearer token. The guard sets it on every request whose
/// credentials are good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operator(pub String);

/// Where the guard reads the credentials: the running config, the start-up one until the
/// gateway has started.
pub struct Credentials {
    startup: AdminConfig,
    live: LiveHandle,
}

impl Credentials {
    pub fn new(startup: &AdminConfig, live: LiveHandle) -> Self {
        Self {
            startup: startup.clone(),
            live,
        }
    }

    /// The rules now. `listen` is always the start-up one (only a restart moves it).
    fn current(&self) -> Auth {
        match self.live.config() {
            Some(config) => Auth::new(&AdminConfig {
                listen: self.startup.listen.clone(),
                ..config.admin.clone()
            }),
            None => Auth::new(&self.startup),
        }
    }
}

/// What a request's `Authorization` header proved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// A valid bearer token.
    Bearer,
    /// Valid basic-auth credentials.
    Basic,
    /// No credentials, or wrong ones.
    Unknown,
}

impl Auth {
    /// From `[admin]` (already validated and interpolated).
    pub fn new(admin: &AdminConfig) -> Self {
        Self {
            token: admin.token.as_ref().map(|t| t.0.clone()),
            basic: admin
                .basic
                .as_ref()
                .map(|b| (b.user.clone(), b.password.0.clone())),
            pages_need_auth: (!admin.listen.is_empty() && !admin.is_loopback())
                || admin.require_auth == RequireAuth::All,
            allowed_hosts: admin
                .allowed_hosts
                .iter()
                .cloned()
                .chain(listen_name(&admin.listen))
                .collect(),
        }
    }

    fn configured(&self) -> bool {
        self.token.is_some() || self.basic.is_some()
    }

    /// Checks the `Authorization` header.
    pub fn caller(&self, headers: &HeaderMap) -> Caller {
        let Some(value) = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
        else {
            return Caller::Unknown;
        };
        let (scheme, rest) = value.trim().split_once(' ').unwrap_or((value, ""));
        if scheme.eq_ignore_ascii_case("bearer")
            && let Some(token) = &self.token
            && secret_eq(rest.trim(), token)
        {
            return Caller::Bearer;
        }
        if scheme.eq_ignore_ascii_case("basic")
            && let Some((user, password)) = &self.basic
            && let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(rest.trim())
            && let Ok(decoded) = String::from_utf8(decoded)
            && let Some((u, p)) = decoded.split_once(':')
        {
            // Both compared whatever the first says: no early exit to time.
            let ok = secret_eq(u, user) & secret_eq(p, password);
            if ok {
                return Caller::Basic;
            }
        }
        Caller::Unknown
    }

    /// 401; `challenge`: with `WWW-Authenticate` (page loads only: a refused form post
    /// shows its sentence rather than a browser's login dialog).
    fn refuse(&self, why: &str, challenge: bool) -> Response {
        let mut response = (StatusCode::UNAUTHORIZED, why.to_owned()).into_response();
        if challenge
            && self.basic.is_some()
            && let Ok(v) =
                header::HeaderValue::from_str("Basic realm=\"carteiro\", charset=\"UTF-8\"")
        {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, v);
        }
        response
    }
}

/// The host name of a `listen` address given by name (`carteiro.internal:9090`): the admin
/// server answers to it too (the CLI sends it as `Host`).
fn listen_name(listen: &str) -> Option<String> {
    let (host, _) = listen.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty() && host.parse::<std::net::IpAddr>().is_err())
        .then(|| host.to_ascii_lowercase())
}

/// Constant-time equality of two secrets (of any lengths).
pub fn secret_eq(given: &str, expected: &str) -> bool {
    let a = Sha256::digest(given.as_bytes());
    let b = Sha256::digest(expected.as_bytes());
    a.ct_eq(&b).into()
}

/// Whether a request comes from the admin server's own pages, by what the browser says:
/// `Sec-Fetch-Site` (same-origin, or none: typed by the user), else `Origin` naming the
/// `Host` it was sent to. A request with neither is not from a browser form.
pub fn same_origin(headers: &HeaderMap) -> bool {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = get("sec-fetch-site") {
        return site == "same-origin" || site == "none";
    }
    match (get("origin"), get("host")) {
        (None, _) => true,
        (Some(origin), Some(host)) => {
            let authority = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                .unwrap_or("");
            authority.eq_ignore_ascii_case(host)
        }
        (Some(_), None) => false,
    }
}

/// The middleware: checks `Host`, then lets a request through or refuses it (401, or 403
/// when cross-site); every response gets the framing and security headers.
pub async fn guard(
    State(credentials): State<Arc<Credentials>>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = decide(&credentials.current(), request, next).await;
    super::origin::secure(&mut response);
    response
}

async fn decide(auth: &Auth, mut request: Request, next: Next) -> Response {
    if let Some(refused) =
        super::origin::check_host(request.headers(), request.uri(), &auth.allowed_hosts)
    {
        return refused;
    }
    let changes_state = !matches!(*request.method(), Method::GET | Method::HEAD);
    let path = request.uri().path();
    let probe = path == "/healthz" || path == "/readyz";
    // `/login` always asks, so a browser learns the credentials before its first action.
    let login = path == "/login";
    let caller = auth.caller(request.headers());
    request.extensions_mut().insert(Authenticated {
        caller_known: caller != Caller::Unknown,
        pages_need_auth: auth.pages_need_auth,
        credentials_configured: auth.configured(),
    });
    let operator = match caller {
        Caller::Bearer => Some("token".to_owned()),
        Caller::Basic => auth.basic.as_ref().map(|(user, _)| user.clone()),
        Caller::Unknown => None,
    };
    if let Some(name) = operator {
        request.extensions_mut().insert(Operator(name));
    }
    if !changes_state && !login && (probe || !auth.pages_need_auth) {
        return next.run(request).await;
    }
    if !auth.configured() {
        return auth.refuse(
            "401 Unauthorized: this gateway has no admin credentials, so nothing may change \
             state through the admin server. Set `token` or `basic` in [admin], then reload \
             (SIGHUP) or restart.\n",
            false,
        );
    }
    match caller {
        Caller::Bearer => next.run(request).await,
        Caller::Basic if changes_state && !same_origin(request.headers()) => (
            StatusCode::FORBIDDEN,
            "403 Forbidden: cross-site request refused (a state change must come from the \
             console's own pages)\n",
        )
            .into_response(),
        Caller::Basic => next.run(request).await,
        Caller::Unknown if changes_state => auth.refuse(
            "401 Unauthorized: this action changes state and needs credentials \
             (Authorization: Bearer <[admin] token>, or basic auth from [admin] basic: in a \
             browser, open /login first)\n",
            false,
        ),
        Caller::Unknown => auth.refuse(
            "401 Unauthorized: this page needs credentials (Authorization: Bearer <[admin] \
             token>, or basic auth from [admin] basic); the admin server listens off loopback, \
             [admin] require_auth is \"all\", or this is /login\n",
            true,
        ),
    }
}

/// The `Authorization` header value a client of this admin server sends (the CLI), if any
/// credentials are configured: the token, else basic auth.
pub fn client_authorization(admin: &AdminConfig) -> Option<String> {
    if let Some(token) = &admin.token {
        return Some(format!("Bearer {}", token.0));
    }
    admin.basic.as_ref().map(|b| {
        let pair = format!("{}:{}", b.user, b.password.0);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BasicAuth, Secret};

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(*k, v.parse().expect("header value"));
        }
        map
    }

    fn auth() -> Auth {
        Auth::new(&AdminConfig {
            listen: "0.0.0.0:9090".into(),
            token: Some(Secret("t0ken".into())),
            basic: Some(BasicAuth {
                user: "ops".into(),
                password: Secret("pa:ss".into()),
            }),
            ..AdminConfig::default()
        })
    }

    #[test]
    fn bearer_and_basic_are_checked() {
        let a = auth();
        assert!(a.pages_need_auth);
        assert_eq!(
            a.caller(&headers(&[("authorization", "Bearer t0ken")])),
            Caller::Bearer
        );
        assert_eq!(
            a.caller(&headers(&[("authorization", "bearer  t0ken ")])),
            Caller::Bearer
        );
        assert_eq!(
            a.caller(&headers(&[("authorization", "Bearer t0ke")])),
            Caller::Unknown
        );
        assert_eq!(a.caller(&headers(&[])), Caller::Unknown);
        let basic = |pair: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(pair)
            )
        };
        assert_eq!(
            a.caller(&headers(&[("authorization", &basic("ops:pa:ss"))])),
            Caller::Basic
        );
        assert_eq!(
            a.caller(&headers(&[("authorization", &basic("ops:pa"))])),
            Caller::Unknown
        );
        assert_eq!(
            a.caller(&headers(&[("authorization", &basic("op:pa:ss"))])),
            Caller::Unknown
        );
        assert_eq!(
            a.caller(&headers(&[("authorization", "Basic !!!")])),
            Caller::Unknown
        );
        assert_eq!(
            client_authorization(&AdminConfig {
                listen: String::new(),
                token: None,
                basic: Some(BasicAuth {
                    user: "ops".into(),
                    password: Secret("pa:ss".into()),
                }),
                ..AdminConfig::default()
            }),
            Some(basic("ops:pa:ss"))
        );
    }

    #[test]
    fn same_origin_by_fetch_metadata_or_origin() {
        assert!(same_origin(&headers(&[("sec-fetch-site", "same-origin")])));
        assert!(!same_origin(&headers(&[("sec-fetch-site", "cross-site")])));
        assert!(!same_origin(&headers(&[("sec-fetch-site", "same-site")])));
        assert!(same_origin(&headers(&[
            ("origin", "http://127.0.0.1:9090"),
            ("host", "127.0.0.1:9090")
        ])));
        assert!(!same_origin(&headers(&[
            ("origin", "http://evil.example"),
            ("host", "127.0.0.1:9090")
        ])));
        assert!(!same_origin(&headers(&[("origin", "null"), ("host", "h")])));
        assert!(same_origin(&headers(&[("host", "h")])), "not a browser");
    }

    #[test]
    fn a_listen_name_is_an_allowed_host() {
        assert_eq!(
            listen_name("Carteiro.Internal:9090").as_deref(),
            Some("carteiro.internal")
        );
        assert_eq!(listen_name("127.0.0.1:9090"), None);
        assert_eq!(listen_name("[::1]:9090"), None);
        assert_eq!(listen_name(""), None);
    }

    #[test]
    fn secrets_compare_whatever_their_length() {
        assert!(secret_eq("abc", "abc"));
        assert!(!secret_eq("abc", "abcd"));
        assert!(!secret_eq("", "a"));
    }
}
