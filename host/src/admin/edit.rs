//! Edit and retry on a dead letter's page (`dlq::edit`): what the route's inbox says about
//! the message (it deduplicates by its key, so an edit of a message already applied needs a
//! new key), the form (the body in a textarea, one row per header, a new-id checkbox), the
//! edits made so far, and `POST /dead-letters/message/{id}/edit`, which sends the edited copy
//! — only it — and comes back to the page. Credentials and the same-origin rule are the
//! guard's (`auth`), as for every state change; the edit records the caller (`Operator`).

use super::auth::Operator;
use super::page::{Fields, error_page, see_other, time};
use super::{AdminState, GatewayHandle, Refusal, banners};
use crate::broker::{ConfirmedPublisher, PublisherOptions};
use crate::dlq::edit::{self, Changes, Dedup, EditContext, EditError, EditRequest};
use crate::pipeline::key::MissingKey;
use crate::store::{DeadLetter, DeadLetterEvent};
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use maud::{Markup, html};

/// Empty header rows the form offers for new headers.
const NEW_HEADER_ROWS: usize = 2;

/// What the route's inbox says about a dead letter.
pub struct Inbox {
    /// How the route deduplicates; `None`: the route is not in the running config.
    pub dedup: Option<Dedup>,
    /// The archived message's key, or why it has none.
    pub key: Option<Result<String, MissingKey>>,
    /// Whether that key is in the inbox (`None`: unknown).
    pub applied: Option<bool>,
}

/// Reads what the inbox says about `d` (store trouble leaves `applied` unknown).
pub async fn inbox(s: &AdminState, d: &DeadLetter) -> Inbox {
    let dedup = s
        .handle
        .live
        .config()
        .and_then(|config| Dedup::of(&config, &d.letter.route));
    let key = dedup.as_ref().map(|dedup| dedup.key_of(d));
    let applied = match &key {
        Some(Ok(key)) => s
            .handle
            .store
            .inbox_contains(&d.letter.route, key)
            .await
            .ok(),
        _ => None,
    };
    Inbox {
        dedup,
        key,
        applied,
    }
}

fn inbox_note(inbox: &Inbox) -> Markup {
    let Some(dedup) = &inbox.dedup else {
        return html! {
            "This route is not in the running config: an edit cannot be checked against its \
             inbox, so it is refused."
        };
    };
    html! {
        "This route's inbox deduplicates messages by their " strong { (dedup.describe()) }
        @match &inbox.key {
            Some(Ok(key)) => {
                ": this message's key is " code #inbox-key { (key) }
                @match inbox.applied {
                    Some(true) => {
                        ", which is " strong #already-applied { "already applied" } ". An \
                        edited copy with the same key would be acked as a duplicate without \
                        running the handler, so the edit is refused unless the copy gets a new key"
                        @if dedup.by_message_id() { " (tick “Send with a new message id”)." }
                        @else { " (change " (dedup.describe()) " in the edit: a new message id does not change it)." }
                    },
                    Some(false) => { ", not applied yet: an edited copy keeping it is processed as usual." },
                    None => { "." },
                }
            },
            Some(Err(why)) => { ": this message has none (" (why) ")." },
            None => { "." },
        }
    }
}

/// The edit section of a dead letter's page: the inbox note, the form, the edits so far.
/// `off`: the viewer cannot act (the page says why above): the form shows, its button
/// disabled.
pub fn section(d: &DeadLetter, inbox: &Inbox, events: &[DeadLetterEvent], off: bool) -> Markup {
    let editable = edit::editable_headers(d);
    let body = std::str::from_utf8(&d.letter.body).ok();
    let edits: Vec<&DeadLetterEvent> = events.iter().filter(|e| e.is_edit()).collect();
    html! {
        h2 #edit-and-retry { "Edit and retry" }
        p #inbox-note { (inbox_note(inbox)) }
        @if let Some(at) = d.edited_at {
            div.notice #edited-note {
                "Edited " (time(at)) ": only edited copies of this dead letter are sent, never \
                its original (replays skip it). Editing it again sends another copy."
            }
        }
        form #edit-form method="post" action=(format!("/dead-letters/message/{}/edit", d.id)) {
            @match body {
                Some(text) => {
                    // One leading newline: a browser drops the first one of a textarea.
                    label { "Body" br;
                        textarea #edit-body name="body" rows="14" cols="100" spellcheck="false" { "\n" (text) } }
                },
                None => p.muted {
                    "The body is not UTF-8, so it is sent as archived; edit it with "
                    code { "carteiro dlq edit " (d.id) " --body-file PATH" } "."
                },
            }
            table #edit-headers {
                tr { th { "Header" } th { "Value" } th { "Remove" } }
                @for (name, value) in &editable {
                    tr.header-row {
                        td { input type="text" name="hname" value=(name) size="30"; }
                        td { input type="text" name="hvalue" value=(value) size="50"; }
                        td { input type="checkbox" name="unset" value=(name); }
                    }
                }
                @for _ in 0..NEW_HEADER_ROWS {
                    tr.header-row {
                        td { input type="text" name="hname" size="30" placeholder="new header"; }
                        td { input type="text" name="hvalue" size="50"; }
                        td {}
                    }
                }
            }
            p.muted { "Carteiro's own headers (x-carteiro-*) cannot be edited; the copy keeps them as a replay does. A JSON body must still be JSON." }
            label { input #edit-new-id type="checkbox" name="new_id" value="1"; " Send with a new message id" }
            " "
            button #edit-submit type="submit" disabled[off] { "Send the edited copy" }
            p.muted { "Only the edited copy is sent. The original stays in the archive as it was and is never replayed afterwards." }
        }
        @if !edits.is_empty() {
            h3 { "Edits" }
            table #edits {
                tr { th { "When" } th { "By" } th { "What changed" } }
                @for e in &edits {
                    @let changes = Changes::from_detail(&e.detail);
                    tr.edit {
                        td { (time(e.at)) }
                        td.actor { (e.actor.as_deref().unwrap_or("-")) }
                        td.changes {
                            (changes.summary())
                            @if let Some(sent) = &e.body {
                                details {
                                    summary { "Body sent (" (sent.len()) " bytes)" }
                                    pre.sent-body { (String::from_utf8_lossy(sent)) }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// What a browser sends for a text input holding `text`: its value without line breaks.
fn as_input_sends(text: &str) -> String {
    text.chars().filter(|c| !matches!(c, '\r' | '\n')).collect()
}

/// The body to send for the textarea's `sent` text. A browser sends a textarea's line breaks
/// (LF, CR or CRLF) all as CRLF, so a body the operator did not touch is the archived one,
/// byte for byte; an edited one keeps CRLF only if the archived body used CRLF throughout.
fn body_of(archived: &[u8], sent: &str) -> Vec<u8> {
    let lf = |text: &str| text.replace("\r\n", "\n").replace('\r', "\n");
    let sent_lf = lf(sent);
    let Ok(archived_text) = std::str::from_utf8(archived) else {
        return sent_lf.into_bytes();
    };
    if lf(archived_text) == sent_lf {
        return archived.to_vec();
    }
    let crlf_throughout = archived_text.contains("\r\n")
        && archived_text.matches('\n').count() == archived_text.matches("\r\n").count()
        && archived_text.matches('\r').count() == archived_text.matches("\r\n").count();
    if crlf_throughout {
        sent_lf.replace('\n', "\r\n").into_bytes()
    } else {
        sent_lf.into_bytes()
    }
}

/// The header row (`name`, `value`) as the operator meant it: an archived header the row
/// shows unchanged (as a browser sends it: trimmed name, value without line breaks) is that
/// archived header exactly.
fn header_of(editable: &[(String, String)], name: &str, value: &str) -> (String, String) {
    let name = name.trim();
    editable
        .iter()
        .find(|(n, v)| as_input_sends(n).trim() == name && as_input_sends(v) == value)
        .cloned()
        .unwrap_or_else(|| (name.to_owned(), value.to_owned()))
}

/// The edit a submitted form asks for: `body` (absent: unchanged), the header rows (`hname`
/// and `hvalue` pairs; an `unset` tick drops a row), `new_id`. Fields the operator did not
/// touch come back as archived ([`body_of`], [`header_of`]).
fn request_of(d: &DeadLetter, f: &Fields) -> EditRequest {
    let body = f
        .all("body")
        .first()
        .map(|text| body_of(&d.letter.body, text));
    let (names, values) = (f.all("hname"), f.all("hvalue"));
    let unset: Vec<String> = f.all("unset").into_iter().map(as_input_sends).collect();
    let editable = edit::editable_headers(d);
    let wanted: Vec<(String, String)> = names
        .iter()
        .copied()
        .zip(values.iter().copied().chain(std::iter::repeat("")))
        .filter(|(name, _)| !name.trim().is_empty() && !unset.contains(&as_input_sends(name)))
        .map(|(name, value)| header_of(&editable, name, value))
        .collect();
    let (set, unset) = edit::header_changes(d, &wanted);
    EditRequest {
        body,
        set,
        unset,
        new_id: f.get("new_id").is_some(),
    }
}

/// The status an edit's refusal or failure answers with.
fn refusal(e: EditError) -> Refusal {
    let status = match &e {
        EditError::AlreadyApplied { .. } | EditError::Busy { .. } | EditError::Unsettled { .. } => {
            StatusCode::CONFLICT
        }
        EditError::UnknownRoute { .. } => StatusCode::UNPROCESSABLE_ENTITY,
        EditError::NotSent { .. } => StatusCode::BAD_GATEWAY,
        EditError::Store(_) | EditError::Unrecorded { .. } => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::BAD_REQUEST,
    };
    Refusal::new(status, e.to_string())
}

fn unavailable(why: String) -> Refusal {
    Refusal::new(StatusCode::SERVICE_UNAVAILABLE, why)
}

/// Checks and sends the edit of `d` as `actor` (see `dlq::edit`).
async fn send(
    s: &AdminState,
    d: &DeadLetter,
    request: EditRequest,
    actor: &str,
) -> Result<Changes, Refusal> {
    let config = s
        .handle
        .live
        .config()
        .ok_or_else(|| unavailable("the gateway is still starting".to_owned()))?;
    let route = d.letter.route.clone();
    let dedup = Dedup::of(&config, &route).ok_or_else(|| {
        refusal(EditError::UnknownRoute {
            route: route.clone(),
        })
    })?;
    let copy = edit::prepare(d, request).map_err(refusal)?;
    let connection = s.probe.connection(&config).await.map_err(|e| {
        unavailable(format!(
            "cannot reach the broker to send the edited copy: {e:#}; nothing was sent"
        ))
    })?;
    let publisher = ConfirmedPublisher::open(connection, PublisherOptions { lanes: 1 })
        .await
        .map_err(|e| unavailable(format!("{e}; nothing was sent")))?;
    let seal = crate::services::seal_key(&s.handle.store)
        .await
        .map_err(|e| unavailable(format!("{e:#}; nothing was sent")))?;
    let context = EditContext {
        store: &s.handle.store,
        publisher: &publisher,
        seal: &seal,
        publish_timeout: config.broker.publish_timeout,
    };
    let changes = context
        .send(d, copy, &dedup, actor)
        .await
        .map_err(refusal)?;
    tracing::info!(id = d.id, route = %route, actor, changes = %changes.summary(), "dead letter edited in the console; the edited copy was sent");
    Ok(changes)
}

fn refused(h: &GatewayHandle, refusal: Refusal) -> Response {
    error_page(refusal.status, &banners(h), &refusal.why)
}

/// `POST /dead-letters/message/{id}/edit`: sends the edited copy (see [`request_of`] for the
/// fields), then back to the message's page, which shows the edit; a refusal's page says why
/// and that nothing was sent.
pub async fn submit(
    State(s): State<AdminState>,
    Path(id): Path<i64>,
    operator: Option<Extension<Operator>>,
    form: String,
) -> Response {
    let h = &s.handle;
    let d = match h.store.dead_letter_get(id).await {
        Ok(Some(d)) => d,
        Ok(None) => {
            let why = format!("no dead letter {id}");
            return refused(h, Refusal::new(StatusCode::NOT_FOUND, why));
        }
        Err(e) => return refused(h, unavailable(e.to_string())),
    };
    let request = request_of(&d, &Fields::parse(&form));
    // The guard lets only callers with good credentials change state, and names them.
    let actor = operator.map_or_else(|| "console".to_owned(), |Extension(Operator(name))| name);
    match send(&s, &d, request, &actor).await {
        Ok(_) => see_other(&format!("/dead-letters/message/{id}#edits")),
        Err(refusal) => refused(h, refusal),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn letter(body: &[u8]) -> DeadLetter {
        let headers = vec![
            ("x-tenant".into(), "acme".into()),
            ("x-region".into(), "eu".into()),
            (":message-id".into(), "m-1".into()),
        ];
        DeadLetter::fixture(3, headers, body)
    }

    #[test]
    fn a_form_becomes_an_edit() {
        let d = letter(b"{\n  \"a\": 1\n}");
        let form = "body=%7B%0D%0A++%22a%22%3A+2%0D%0A%7D\
                    &hname=x-tenant&hvalue=acme&unset=x-region\
                    &hname=x-region&hvalue=eu\
                    &hname=x-new&hvalue=1&hname=&hvalue=&new_id=1";
        let request = request_of(&d, &Fields::parse(form));
        assert_eq!(request.body.as_deref(), Some(&b"{\n  \"a\": 2\n}"[..]));
        assert_eq!(request.set, vec![("x-new".to_owned(), "1".to_owned())]);
        assert_eq!(request.unset, ["x-region"]);
        assert!(request.new_id);
        let untouched = request_of(&d, &Fields::parse("hname=x-tenant&hvalue=acme"));
        assert_eq!(untouched.body, None, "no textarea: the body is kept");
        assert_eq!(untouched.unset, ["x-region"], "a row left out is removed");
    }

    /// What a browser submits for fields the operator did not touch: a textarea's line
    /// breaks all as CRLF, a text input's value without its line breaks. Adding one header
    /// must change nothing else.
    #[test]
    fn untouched_fields_come_back_as_archived() {
        let headers = vec![
            ("x-note".into(), "first\nsecond".into()),
            ("x-tenant".into(), "acme".into()),
            (":message-id".into(), "m-1".into()),
        ];
        let d = DeadLetter::fixture(3, headers, b"line1\r\nline2\nline3");
        let form = "body=line1%0D%0Aline2%0D%0Aline3\
                    &hname=x-note&hvalue=firstsecond\
                    &hname=x-tenant&hvalue=acme\
                    &hname=x-new&hvalue=1";
        let request = request_of(&d, &Fields::parse(form));
        let body = request.body.as_deref().unwrap_or(&d.letter.body);
        assert_eq!(
            String::from_utf8_lossy(body),
            "line1\r\nline2\nline3",
            "the body was not touched"
        );
        assert_eq!(request.set, vec![("x-new".to_owned(), "1".to_owned())]);
        assert!(request.unset.is_empty(), "{:?}", request.unset);
    }

    #[test]
    fn the_page_shows_the_form_and_the_inbox_rule() {
        let d = letter(b"{}");
        let inbox = Inbox {
            dedup: Some(Dedup {
                source: crate::pipeline::KeySource::MessageId,
                on_missing: crate::pipeline::MissingKeyPolicy::DeadLetter,
            }),
            key: Some(Ok("m-1".into())),
            applied: Some(true),
        };
        let html = section(&d, &inbox, &[], false).into_string();
        assert!(html.contains("id=\"edit-body\""), "{html}");
        assert!(html.contains("already applied"), "{html}");
        assert!(html.contains("new message id"), "{html}");
        assert!(!html.contains("id=\"edits\""), "no edits yet");
    }
}
