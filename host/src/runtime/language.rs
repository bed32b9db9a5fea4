//! The language a component was written in, read from the metadata its toolchain leaves in
//! it, and the isolation a plugin gets from it when its `[plugins.NAME]` entry sets none
//! (docs/handler-guide.md, "Isolation"). A fresh instance costs a compiled (Rust) component
//! a fraction of a millisecond, but a Python or JavaScript one about 10 or 2 ms of CPU (an
//! interpreter's heap to set up), more than the hand-written consumer it replaces: so
//! those reuse an instance for a batch of deliveries by default.

use super::pool::Isolation;
use std::fmt;
use wasmparser::{KnownCustom, Parser, Payload};

/// Deliveries an instance serves by default before a fresh one replaces it.
pub const DEFAULT_REUSE: u32 = 64;

/// The core module componentize-py links every Python component with.
const COMPONENTIZE_PY_RUNTIME: &str = "libcomponentize_py_runtime";
/// The tool componentize-py runs last (pre-initialising the interpreter); it signs the
/// component's `producers` section.
const COMPONENTIZE_PY_INIT: &str = "component-init-transform";

/// What runs inside a component, as far as its instances' cost goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    /// componentize-py: CPython inside.
    Python,
    /// ComponentizeJS: StarlingMonkey (SpiderMonkey) inside.
    JavaScript,
    /// Anything else: Rust, C, Go... compiled to wasm, no interpreter.
    Compiled,
}

impl Language {
    /// Reads the component's own `producers` section (the one outside its core modules)
    /// and its names of core modules. Malformed metadata reads as [`Language::Compiled`]:
    /// the component's validity is wasmtime's to judge.
    pub fn of(component: &[u8]) -> Self {
        let mut depth = 0usize;
        for payload in Parser::new(0).parse_all(component) {
            let Ok(payload) = payload else { break };
            match payload {
                Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
                Payload::End(_) => depth = depth.saturating_sub(1),
                Payload::CustomSection(section) if depth == 0 => {
                    if let Some(language) = Self::from_custom(section.as_known()) {
                        return language;
                    }
                }
                _ => {}
            }
        }
        Self::Compiled
    }

    /// What one custom section of the outer component says, if anything.
    fn from_custom(section: KnownCustom<'_>) -> Option<Self> {
        match section {
            KnownCustom::Producers(fields) => {
                for field in fields.into_iter().flatten() {
                    for value in field.values.into_iter().flatten() {
                        match (field.name, value.name) {
                            ("language", "JavaScript") | ("processed-by", "ComponentizeJS") => {
                                return Some(Self::JavaScript);
                            }
                            ("language", "Python") | ("processed-by", COMPONENTIZE_PY_INIT) => {
                                return Some(Self::Python);
                            }
                            _ => {}
                        }
                    }
                }
                None
            }
            KnownCustom::ComponentName(names) => {
                for name in names.into_iter().flatten() {
                    if let wasmparser::ComponentName::CoreModules(modules) = name
                        && modules
                            .into_iter()
                            .flatten()
                            .any(|m| m.name.starts_with(COMPONENTIZE_PY_RUNTIME))
                    {
                        return Some(Self::Python);
                    }
                }
                None
            }
            _ => None,
        }
    }

    /// Whether an interpreter runs inside (a fresh instance costs milliseconds).
    pub fn interpreted(self) -> bool {
        matches!(self, Self::Python | Self::JavaScript)
    }

    /// How many instances of a component may be alive at once when the config does not
    /// say; each warm one keeps its interpreter's heap resident, and deliveries beyond it
    /// wait for a free one. A Python instance keeps about 10 MiB, and one per core ran as
    /// fast as two at prefetch 64 with 21 MiB less peak RSS; a JavaScript one keeps about
    /// 4 MiB and gained 10% throughput from the second per core (bench/README.md, issue 38).
    /// Compiled components are limited only by the runtime's instance slots.
    pub fn default_concurrency(self) -> Option<u32> {
        let per_core = match self {
            Self::Python => 1,
            Self::JavaScript => 2,
            Self::Compiled => return None,
        };
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Some(u32::try_from(cores * per_core).unwrap_or(u32::MAX))
    }

    /// The isolation a plugin in this language gets when its config sets none: one
    /// instance per [`DEFAULT_REUSE`] deliveries for an interpreter, a fresh one per
    /// delivery otherwise.
    pub fn default_isolation(self) -> Isolation {
        if self.interpreted() {
            Isolation::PerBatch {
                reuse: DEFAULT_REUSE,
            }
        } else {
            Isolation::PerDelivery
        }
    }
}

impl fmt::Display for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Python => "Python",
            Self::JavaScript => "JavaScript",
            Self::Compiled => "compiled (Rust, C, Go)",
        })
    }
}

/// The isolation a plugin runs with, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IsolationChoice {
    pub isolation: Isolation,
    /// `None`: the config set it.
    pub default_for: Option<Language>,
}

impl IsolationChoice {
    /// The config's `isolation` when set, else the default for `language`.
    pub fn new(configured: Option<Isolation>, language: Language) -> Self {
        match configured {
            Some(isolation) => Self {
                isolation,
                default_for: None,
            },
            None => Self {
                isolation: language.default_isolation(),
                default_for: Some(language),
            },
        }
    }
}

/// "per-batch (reuse 64), the default for a Python component"; "per-delivery, set in the
/// config".
impl fmt::Display for IsolationChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.isolation {
            Isolation::PerDelivery => f.write_str("per-delivery")?,
            Isolation::PerBatch { reuse } => write!(f, "per-batch (reuse {reuse})")?,
        }
        match self.default_for {
            Some(language) => write!(f, ", the default for a {language} component"),
            None => f.write_str(", set in the config"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A component whose only content is a top-level `producers` section of `fields`.
    fn with_producers(fields: &[(&str, &str)]) -> Vec<u8> {
        let mut section = wasm_encoder::ProducersSection::new();
        for (field, value) in fields {
            let mut values = wasm_encoder::ProducersField::new();
            values.value(value, "1.0");
            section.field(field, &values);
        }
        let mut component = wasm_encoder::Component::new();
        component.section(&section);
        component.finish()
    }

    #[test]
    fn the_outer_producers_section_names_the_language() {
        let js = with_producers(&[("language", "JavaScript")]);
        assert_eq!(Language::of(&js), Language::JavaScript);
        let py = with_producers(&[("processed-by", COMPONENTIZE_PY_INIT)]);
        assert_eq!(Language::of(&py), Language::Python);
        let rust = with_producers(&[("processed-by", "wit-component")]);
        assert_eq!(Language::of(&rust), Language::Compiled);
        assert_eq!(Language::of(b"not wasm"), Language::Compiled);
    }

    #[test]
    fn python_keeps_one_warm_instance_per_core_and_javascript_two() {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let cores = u32::try_from(cores).expect("few cores");
        assert_eq!(Language::Python.default_concurrency(), Some(cores));
        assert_eq!(Language::JavaScript.default_concurrency(), Some(2 * cores));
        assert_eq!(Language::Compiled.default_concurrency(), None);
    }

    #[test]
    fn the_config_wins_over_the_language_default() {
        let set = IsolationChoice::new(Some(Isolation::PerDelivery), Language::Python);
        assert_eq!(set.isolation, Isolation::PerDelivery);
        assert_eq!(set.to_string(), "per-delivery, set in the config");
        let python = IsolationChoice::new(None, Language::Python);
        assert_eq!(
            python.to_string(),
            "per-batch (reuse 64), the default for a Python component"
        );
        let rust = IsolationChoice::new(None, Language::Compiled);
        assert_eq!(rust.isolation, Isolation::PerDelivery);
    }
}
