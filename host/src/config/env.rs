//! `${VAR}` interpolation for the few values that may hold secrets (URLs, plugin variables).
//! It runs after parsing, so a secret never shows up in a TOML syntax error's snippet.

/// Replaces every `${NAME}` with the environment variable `NAME`; `$${` escapes a literal `${`.
/// The error names the missing variable (never the value).
pub fn interpolate(text: &str) -> Result<String, String> {
    interpolate_with(text, |name| std::env::var(name).ok())
}

pub(crate) fn interpolate_with(
    text: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find('$') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        if let Some(escaped) = after.strip_prefix("${") {
            out.push_str("${");
            rest = escaped;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body
                .find('}')
                .ok_or_else(|| "unterminated `${` (write `${NAME}`)".to_owned())?;
            let name = &body[..end];
            let value = lookup(name).ok_or_else(|| {
                format!("environment variable `{name}` is not set (referenced as `${{{name}}}`)")
            })?;
            out.push_str(&value);
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(name: &str) -> Option<String> {
        (name == "PASS").then(|| "s3cret".to_owned())
    }

    #[test]
    fn replaces_known_variables_and_escapes() {
        assert_eq!(
            interpolate_with("amqp://u:${PASS}@h/$${x}$", lookup).as_deref(),
            Ok("amqp://u:s3cret@h/${x}$")
        );
    }

    #[test]
    fn missing_variable_is_named_not_leaked() {
        let err = interpolate_with("${NOPE}", lookup).unwrap_err();
        assert!(err.contains("`NOPE` is not set"), "{err}");
        assert!(interpolate_with("${OPEN", lookup).is_err());
    }
}
