//! What every admin response and request goes through before any credentials:
//! - the `Host` header must name this server: a loopback name (`localhost`), an IP address,
//!   or one of `[admin] allowed_hosts`. A DNS-rebinding page (a name of the attacker's that
//!   resolves to 127.0.0.1) sends its own name and is refused, whatever the credentials;
//! - every response carries headers that keep a browser from framing the console, sniffing
//!   types, or telling other sites which console page a link was followed from.

use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

/// The console's own resources only, never in a frame.
pub const CSP: &str = "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; \
                       form-action 'self'; object-src 'none'";

/// Adds the framing and security headers to `response`.
pub fn secure(response: &mut Response) {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
}

/// The host a request was sent to (`Host`, else the URI's authority), without the port;
/// IPv6 literals keep their brackets off.
fn requested_host(headers: &HeaderMap, uri: &Uri) -> Option<String> {
    let authority = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| uri.authority().map(|a| a.as_str().to_owned()))?;
    let authority = authority.trim();
    if let Some(rest) = authority.strip_prefix('[') {
        let (ip, _) = rest.split_once(']')?;
        return Some(ip.to_owned());
    }
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
        _ => authority,
    };
    Some(host.trim_end_matches('.').to_ascii_lowercase())
}

/// `None` when the request may go on; else the refusal (403 naming the host).
pub fn check_host(headers: &HeaderMap, uri: &Uri, allowed: &[String]) -> Option<Response> {
    let Some(host) = requested_host(headers, uri) else {
        return Some(
            (
                StatusCode::BAD_REQUEST,
                "400 Bad Request: no Host header; the admin server answers only requests that \
                 name it\n",
            )
                .into_response(),
        );
    };
    let ok = host.parse::<std::net::IpAddr>().is_ok()
        || host == "localhost"
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(&host));
    if ok {
        return None;
    }
    // The name is the requester's own text: shown escaped-free as plain text, bounded.
    let shown: String = host.chars().take(100).collect();
    Some(
        (
            StatusCode::FORBIDDEN,
            format!(
                "403 Forbidden: this admin server does not answer to the host name `{shown}` \
                 (a page of another site, DNS rebinding?). Use 127.0.0.1 or localhost, or add \
                 the name to [admin] allowed_hosts\n"
            ),
        )
            .into_response(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(value: &str) -> Option<Response> {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, value.parse().expect("header"));
        check_host(
            &headers,
            &Uri::from_static("/"),
            &["carteiro.internal".into()],
        )
    }

    #[test]
    fn loopback_names_addresses_and_allowed_hosts_pass() {
        for ok in [
            "127.0.0.1:9090",
            "localhost:9090",
            "LOCALHOST",
            "[::1]:9090",
            "10.1.2.3:9090",
            "carteiro.internal:9090",
            "Carteiro.Internal.",
        ] {
            assert!(host(ok).is_none(), "{ok}");
        }
        for refused in [
            "evil.example:9090",
            "localhost.evil.example",
            "127.0.0.1.nip.io:9090",
            "carteiro.internal.evil",
            "",
        ] {
            let response = host(refused).unwrap_or_else(|| panic!("{refused} passed"));
            assert_eq!(response.status(), StatusCode::FORBIDDEN, "{refused}");
        }
        let none = check_host(&HeaderMap::new(), &Uri::from_static("/"), &[]);
        assert_eq!(none.map(|r| r.status()), Some(StatusCode::BAD_REQUEST));
    }
}
