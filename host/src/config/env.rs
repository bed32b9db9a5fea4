//! `${VAR}` interpolation for the few values that may hold secrets (URLs, plugin variables).
//! It runs after parsing, so a secret never shows up in a TOML syntax error's snippet.

/// Why `${VAR}` interpolation failed. It names the variable, never a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InterpolateError {
    /// A `${` with no closing `}`.
    #[error("unterminated `${{` (write `${{NAME}}`)")]
    Unterminated,
    /// The referenced environment variable is not set.
    #[error("environment variable `{0}` is not set (referenced as `${{{0}}}`)")]
    NotSet(String),
}

/// Replaces every `${NAME}` with the environment variable `NAME`; `$${` escapes a literal `${`.
/// The error names the missing variable (never the value).
pub fn interpolate(text: &str) -> Result<String, InterpolateError> {
    interpolate_with(text, |name| std::env::var(name).ok())
}

pub(crate) fn interpolate_with(
    text: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, InterpolateError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find('$') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        if let Some(escaped) = after.strip_prefix("${") {
            out.push_str("${");
            rest = escaped;
        } else if let Some(body) = after.strip_prefix('{') {
            let end = body.find('}').ok_or(InterpolateError::Unterminated)?;
            let name = &body[..end];
            let value = lookup(name).ok_or_else(|| InterpolateError::NotSet(name.to_owned()))?;
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
        let err = interpolate_with("${NOPE}", lookup).unwrap_err().to_string();
        assert_eq!(
            err,
            "environment variable `NOPE` is not set (referenced as `${NOPE}`)"
        );
        assert_eq!(
            interpolate_with("${OPEN", lookup),
            Err(InterpolateError::Unterminated)
        );
        assert_eq!(
            InterpolateError::Unterminated.to_string(),
            "unterminated `${` (write `${NAME}`)"
        );
    }
}
