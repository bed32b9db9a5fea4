//! The plugin's variables from the operator's TOML (`[plugins.NAME.variables]`).

use crate::host;

/// The variable called `name`, if the operator set it.
pub fn var(name: &str) -> Option<String> {
    host::config_get(name)
}

/// The variable called `name`, or `default` when unset.
pub fn var_or(name: &str, default: &str) -> String {
    var(name).unwrap_or_else(|| default.to_owned())
}

/// Every variable, as `(name, value)` pairs.
pub fn vars() -> Vec<(String, String)> {
    host::config_all()
}
