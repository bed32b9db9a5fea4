//! Which world a component implements, read from the names of its exports and imports at
//! load (before linking), so a component of the wrong shape is refused with the name of
//! what it lacks or what it asks for.

/// The export of a `carteiro:handler@0.1.0` component.
pub const CARTEIRO_EXPORT: &str = "handle";
/// The export of a `wasi:messaging@0.2.0-draft` component.
pub const STANDARD_EXPORT: &str = "wasi:messaging/incoming-handler@0.2.0-draft";
/// The optional interface of the draft that Carteiro does not provide.
pub const REQUEST_REPLY_IMPORT: &str = "wasi:messaging/request-reply@0.2.0-draft";

/// The world a component was built against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum World {
    /// `carteiro:handler@0.1.0`: `handle(message) -> verdict`.
    Carteiro,
    /// `wasi:messaging@0.2.0-draft`, world `messaging-core`: `incoming-handler.handle`.
    Standard,
}

impl World {
    /// How operators and logs name it.
    pub fn label(self) -> &'static str {
        match self {
            Self::Carteiro => "carteiro:handler@0.1.0",
            Self::Standard => "wasi:messaging@0.2.0-draft",
        }
    }
}

/// Why a component is of no world Carteiro runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorldProblem {
    /// It exports neither handler; what it exports instead.
    NoHandler { exports: Vec<String> },
    /// A wasi:messaging handler that imports an interface Carteiro does not provide.
    UnsupportedImport { import: String },
    /// A wasi:messaging handler of another version than the one Carteiro serves.
    OtherVersion { export: String },
}

impl std::fmt::Display for WorldProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoHandler { exports } if exports.is_empty() => write!(
                f,
                "it exports nothing; a handler exports `{CARTEIRO_EXPORT}` \
                 (carteiro:handler@0.1.0) or `{STANDARD_EXPORT}`"
            ),
            Self::NoHandler { exports } => write!(
                f,
                "it exports neither `{CARTEIRO_EXPORT}` (carteiro:handler@0.1.0) nor \
                 `{STANDARD_EXPORT}`, only {}",
                exports
                    .iter()
                    .map(|e| format!("`{e}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Self::UnsupportedImport { import } => write!(
                f,
                "it imports `{import}`, which Carteiro does not provide (a handler's effects \
                 commit with its delivery, so it cannot wait for replies); build it against \
                 the world `messaging-core` of wasi:messaging@0.2.0-draft (imports only \
                 `producer` and `types`)"
            ),
            Self::OtherVersion { export } => write!(
                f,
                "it exports `{export}`, but Carteiro serves `{STANDARD_EXPORT}`; build it \
                 against the WIT vendored in plugin-sdk/wit/wasi-messaging-0.2.0-draft"
            ),
        }
    }
}

/// The world of a component with these export and import names.
pub fn detect<'a>(
    exports: impl IntoIterator<Item = &'a str>,
    imports: impl IntoIterator<Item = &'a str>,
) -> Result<World, WorldProblem> {
    let exports: Vec<&str> = exports.into_iter().collect();
    if exports.contains(&CARTEIRO_EXPORT) {
        return Ok(World::Carteiro);
    }
    if exports.contains(&STANDARD_EXPORT) {
        // Every version of request-reply: none is provided.
        let request_reply = REQUEST_REPLY_IMPORT
            .split_once('@')
            .map_or(REQUEST_REPLY_IMPORT, |(unversioned, _)| unversioned);
        if let Some(import) = imports
            .into_iter()
            .find(|i| i.split('@').next() == Some(request_reply))
        {
            return Err(WorldProblem::UnsupportedImport {
                import: import.to_owned(),
            });
        }
        return Ok(World::Standard);
    }
    if let Some(other) = exports
        .iter()
        .find(|e| e.starts_with("wasi:messaging/incoming-handler"))
    {
        return Err(WorldProblem::OtherVersion {
            export: (*other).to_owned(),
        });
    }
    Err(WorldProblem::NoHandler {
        exports: exports.iter().map(|e| (*e).to_owned()).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TYPES: &str = "wasi:messaging/types@0.2.0-draft";
    const PRODUCER: &str = "wasi:messaging/producer@0.2.0-draft";
    const NONE: [&str; 0] = [];

    #[test]
    fn a_carteiro_handler_is_recognised_by_its_handle_export() {
        assert_eq!(
            detect(["handle"], ["carteiro:handler/kv@0.1.0"]),
            Ok(World::Carteiro)
        );
    }

    #[test]
    fn a_standard_handler_is_recognised_by_its_incoming_handler_export() {
        assert_eq!(
            detect([STANDARD_EXPORT], [TYPES, PRODUCER]),
            Ok(World::Standard)
        );
        // A handler that never sends imports only `types`.
        assert_eq!(detect([STANDARD_EXPORT], [TYPES]), Ok(World::Standard));
    }

    #[test]
    fn request_reply_is_refused_naming_the_import() {
        let problem = detect([STANDARD_EXPORT], [TYPES, PRODUCER, REQUEST_REPLY_IMPORT])
            .expect_err("refused");
        assert_eq!(
            problem,
            WorldProblem::UnsupportedImport {
                import: REQUEST_REPLY_IMPORT.into()
            }
        );
        assert!(
            problem.to_string().contains(REQUEST_REPLY_IMPORT),
            "{problem}"
        );
        assert!(problem.to_string().contains("messaging-core"), "{problem}");
    }

    #[test]
    fn another_draft_and_no_handler_are_refused_naming_what_is_missing() {
        let other = detect(["wasi:messaging/incoming-handler@0.1.0"], NONE).expect_err("refused");
        assert!(matches!(other, WorldProblem::OtherVersion { .. }));
        assert!(other.to_string().contains(STANDARD_EXPORT), "{other}");

        let none = detect(NONE, NONE).expect_err("refused");
        assert!(none.to_string().contains("exports nothing"), "{none}");
        let wrong = detect(["wasi:http/incoming-handler@0.2.0"], NONE).expect_err("refused");
        let text = wrong.to_string();
        assert!(
            text.contains("`handle`")
                && text.contains(STANDARD_EXPORT)
                && text.contains("wasi:http"),
            "{text}"
        );
    }
}
