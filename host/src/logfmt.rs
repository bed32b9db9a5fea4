//! Text logs that a plugin or a publisher cannot forge: every field value (and the message)
//! has its control characters escaped, so a plugin's log line, a dead-letter reason or a
//! message id with a newline, a carriage return or a terminal escape stays on its own line
//! and cannot paint a fake entry after it. JSON logs need nothing: JSON escapes them.
//!
//! One formatter for every field rather than a wrapper at each call site, so a field added
//! later is covered too.

use std::fmt::{self, Write};
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::{Writer, debug_fn};

/// What is logged unless `CARTEIRO_LOG` says otherwise: INFO, but not what Carteiro says
/// better itself:
/// - sqlx's relay of PostgreSQL's notices (`relation "_sqlx_migrations" already exists,
///   skipping` on every start) only from WARN;
/// - lapin's dump of a returned message (a `BasicReturnMessage` struct) only from ERROR: the
///   publish that met it fails with "unroutable" in words;
/// - none of lapin's connection-level errors (`Connection error ... Closed` at every clean
///   shutdown): each connection's owner logs the loss it handles, with the reason.
pub const DEFAULT_FILTER: &str =
    "info,sqlx::postgres::notice=warn,lapin::returned_messages=error,lapin::channels=off";

/// The field formatter of text logs: `name=value` pairs separated by spaces, the message
/// bare, every value escaped as [`escape_into`] does.
pub fn escaped_fields() -> impl for<'w> FormatFields<'w> + Send + Sync + 'static {
    debug_fn(|writer: &mut Writer<'_>, field, value| {
        let text = format!("{value:?}");
        if field.name() != "message" {
            write!(writer, "{}=", field.name())?;
        }
        escape_into(writer, &text)
    })
    .delimited(" ")
}

/// Writes `text` with every control character (C0, DEL, C1: newlines, carriage returns,
/// tabs, terminal escapes) and every bidirectional-override character written as an escape
/// (`\n`, `\r`, `\t`, `\u{1b}`, ...). Printable text, including a backslash, is unchanged.
pub fn escape_into(out: &mut impl Write, text: &str) -> fmt::Result {
    for c in text.chars() {
        match c {
            '\n' => out.write_str("\\n")?,
            '\r' => out.write_str("\\r")?,
            '\t' => out.write_str("\\t")?,
            c if c.is_control() || is_bidi_control(c) => write!(out, "\\u{{{:x}}}", c as u32)?,
            c => out.write_char(c)?,
        }
    }
    Ok(())
}

/// Characters that reorder how the text around them is shown (the "Trojan Source" ones).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Log output kept in memory, for tests that check what was logged.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::{Arc, Mutex};

    /// Pass a clone to a subscriber's `with_writer`, read what it wrote with
    /// [`LogBuffer::text`].
    #[derive(Clone, Default)]
    pub(crate) struct LogBuffer(Arc<Mutex<Vec<u8>>>);

    impl LogBuffer {
        /// What was written so far.
        pub(crate) fn text(&self) -> String {
            String::from_utf8(self.0.lock().expect("lock").clone()).expect("utf-8")
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuffer {
        type Writer = LogBuffer;

        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    impl std::io::Write for LogBuffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::Error::other("poisoned"))?
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::LogBuffer;
    use super::*;

    fn escaped(text: &str) -> String {
        let mut out = String::new();
        escape_into(&mut out, text).expect("write to a String");
        out
    }

    #[test]
    fn control_characters_are_escaped_and_printable_text_kept() {
        assert_eq!(escaped("a\nb\rc\td"), "a\\nb\\rc\\td");
        assert_eq!(
            escaped("\u{1b}[2J\u{7}\u{0}\u{7f}\u{85}"),
            "\\u{1b}[2J\\u{7}\\u{0}\\u{7f}\\u{85}"
        );
        assert_eq!(escaped("x\u{202e}y\u{2066}"), "x\\u{202e}y\\u{2066}");
        assert_eq!(
            escaped("plain, ünïcode and a \\ backslash"),
            "plain, ünïcode and a \\ backslash"
        );
    }

    #[test]
    fn the_default_filter_keeps_info_but_not_what_carteiro_says_better() {
        use tracing::Level;
        use tracing_subscriber::layer::SubscriberExt;
        let filter = tracing_subscriber::EnvFilter::new(super::DEFAULT_FILTER);
        let subscriber = tracing_subscriber::registry().with(filter);
        tracing::subscriber::with_default(subscriber, || {
            assert!(tracing::enabled!(target: "carteiro::gateway", Level::INFO));
            assert!(!tracing::enabled!(target: "sqlx::postgres::notice", Level::INFO));
            assert!(tracing::enabled!(target: "sqlx::postgres::notice", Level::WARN));
            assert!(!tracing::enabled!(target: "lapin::returned_messages", Level::WARN));
            assert!(!tracing::enabled!(target: "lapin::channels", Level::ERROR));
            assert!(tracing::enabled!(target: "lapin::channel", Level::ERROR));
        });
    }

    #[test]
    fn a_forged_line_stays_inside_its_entry() {
        let buffer = LogBuffer::default();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(escaped_fields())
            .with_ansi(false)
            .with_writer(buffer.clone())
            .finish();
        let forged = "ok\n2099-01-01T00:00:00Z ERROR carteiro: forged";
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(plugin = "p", reason = %forged, "{forged}");
        });
        let text = buffer.text();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.contains("ok\\n2099-01-01T00:00:00Z ERROR carteiro: forged"),
            "{text}"
        );
        assert!(text.contains("reason=ok\\n2099"), "{text}");
        assert!(text.contains("plugin=\"p\""), "{text}");
    }
}
