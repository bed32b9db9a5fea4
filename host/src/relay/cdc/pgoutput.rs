//! The two pgoutput (protocol 1, text format) messages the CDC relay needs: `Relation`
//! (column names of a table) and `Insert` (a new row). `pgwire-replication` decodes only the
//! transaction boundaries (Begin, Commit) and hands every other message over raw.
//!
//! Wire format: PostgreSQL's "Logical Replication Message Formats" chapter.

use std::collections::HashMap;

use crate::store::{NewOutboxRow, OutboxRow, StoreError, headers_from_json};

/// A pgoutput message the relay cannot read.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("pgoutput message truncated while reading {0}")]
    Truncated(&'static str),
    #[error("pgoutput Insert for relation {0} before its Relation message")]
    UnknownRelation(u32),
    #[error("outbox row from the replication slot: column {0} missing or NULL")]
    Missing(&'static str),
    #[error("outbox row from the replication slot: column {column} is not valid: {why}")]
    Invalid { column: &'static str, why: String },
    #[error("outbox row from the replication slot: {0}")]
    Store(#[from] StoreError),
}

/// What one message means to the relay.
#[derive(Debug, PartialEq, Eq)]
pub enum Message {
    /// A table's columns (sent before its first change in a session, and after DDL).
    Relation(Relation),
    /// A row inserted into relation `relation`: its text-format values, `None` for NULL or
    /// an unchanged TOAST value (an insert never has those).
    Insert {
        relation: u32,
        values: Vec<Option<Vec<u8>>>,
    },
    /// Anything else (Update, Delete, Truncate, Type, Origin, ...): not the relay's.
    Other,
}

/// A table as a Relation message describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub id: u32,
    pub namespace: String,
    pub name: String,
    pub columns: Vec<String>,
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Truncated(what));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn cstr(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let end = self
            .0
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::Truncated(what))?;
        let text = String::from_utf8_lossy(&self.0[..end]).into_owned();
        self.0 = &self.0[end + 1..];
        Ok(text)
    }
}

/// Decodes one pgoutput message (the payload of an XLogData).
pub fn decode(data: &[u8]) -> Result<Message, DecodeError> {
    let mut r = Reader(data);
    match r.u8("message tag")? {
        b'R' => {
            let id = r.u32("relation id")?;
            let namespace = r.cstr("namespace")?;
            let name = r.cstr("relation name")?;
            let _identity = r.u8("replica identity")?;
            let n = r.u16("column count")?;
            let mut columns = Vec::with_capacity(usize::from(n));
            for _ in 0..n {
                let _flags = r.u8("column flags")?;
                columns.push(r.cstr("column name")?);
                let _type = r.u32("column type")?;
                let _typmod = r.u32("column type modifier")?;
            }
            Ok(Message::Relation(Relation {
                id,
                namespace,
                name,
                columns,
            }))
        }
        b'I' => {
            let relation = r.u32("relation id")?;
            let _new = r.u8("tuple marker")?;
            let n = r.u16("tuple column count")?;
            let mut values = Vec::with_capacity(usize::from(n));
            for _ in 0..n {
                match r.u8("column kind")? {
                    b't' | b'b' => {
                        let len = r.u32("value length")? as usize;
                        values.push(Some(r.take(len, "value")?.to_vec()));
                    }
                    // 'n' NULL, 'u' unchanged TOAST value.
                    _ => values.push(None),
                }
            }
            Ok(Message::Insert { relation, values })
        }
        _ => Ok(Message::Other),
    }
}

/// The relations seen in this replication session, by id.
#[derive(Debug, Default)]
pub struct Relations(HashMap<u32, Relation>);

impl Relations {
    pub fn remember(&mut self, relation: Relation) {
        self.0.insert(relation.id, relation);
    }

    /// The relation `id`, if it is the outbox table (`schema.table`).
    pub fn get(&self, id: u32) -> Result<&Relation, DecodeError> {
        self.0.get(&id).ok_or(DecodeError::UnknownRelation(id))
    }
}

/// An inserted outbox row as the polling relay would have read it from the table.
pub fn outbox_row(
    relation: &Relation,
    values: &[Option<Vec<u8>>],
) -> Result<OutboxRow, DecodeError> {
    let col = |name: &'static str| -> Option<&[u8]> {
        let i = relation.columns.iter().position(|c| c == name)?;
        values.get(i)?.as_deref()
    };
    let text = |name: &'static str| -> Result<String, DecodeError> {
        let raw = col(name).ok_or(DecodeError::Missing(name))?;
        String::from_utf8(raw.to_vec()).map_err(|e| DecodeError::Invalid {
            column: name,
            why: e.to_string(),
        })
    };
    let opt_text = |name: &'static str| -> Result<Option<String>, DecodeError> {
        match col(name) {
            None => Ok(None),
            Some(_) => text(name).map(Some),
        }
    };
    let int = |name: &'static str| -> Result<i64, DecodeError> {
        text(name)?
            .parse()
            .map_err(|e: std::num::ParseIntError| DecodeError::Invalid {
                column: name,
                why: e.to_string(),
            })
    };
    Ok(OutboxRow {
        id: int("id")?,
        event: NewOutboxRow {
            event_id: text("event_id")?,
            route: text("route")?,
            plugin: text("plugin")?,
            exchange: text("exchange")?,
            routing_key: text("routing_key")?,
            headers: headers_from_json(&text("headers")?)?,
            content_type: opt_text("content_type")?,
            payload: bytea(&text("payload")?)?,
            ordering_key: text("ordering_key")?,
        },
        created_at: int("created_at")?,
        attempts: col("attempts").map_or(Ok(0), |_| int("attempts"))?,
        last_error: opt_text("last_error")?,
        message_type: None,
        refused: None,
    })
}

/// A `bytea` in PostgreSQL's text output (`bytea_output = hex`, the default: `\x0a1b...`).
pub(crate) fn bytea(text: &str) -> Result<Vec<u8>, DecodeError> {
    let invalid = |why: String| DecodeError::Invalid {
        column: "payload",
        why,
    };
    let hex_digits = text.strip_prefix("\\x").ok_or_else(|| {
        invalid(
            "not in hex form; set bytea_output = 'hex' (the default) for the relay's role".into(),
        )
    })?;
    hex::decode(hex_digits).map_err(|e| invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const COLUMNS: [&str; 17] = [
        "id",
        "event_id",
        "route",
        "plugin",
        "exchange",
        "routing_key",
        "headers",
        "content_type",
        "payload",
        "ordering_key",
        "created_at",
        "published_at",
        "attempts",
        "last_error",
        "next_attempt_at",
        "lease_owner",
        "lease_until",
    ];

    fn relation_message() -> Vec<u8> {
        let mut m = vec![b'R'];
        m.extend(16_385u32.to_be_bytes());
        m.extend(b"public\0outbox\0");
        m.push(b'd');
        m.extend((COLUMNS.len() as u16).to_be_bytes());
        for (i, c) in COLUMNS.iter().enumerate() {
            m.push(u8::from(i == 0));
            m.extend(c.as_bytes());
            m.push(0);
            m.extend(25u32.to_be_bytes());
            m.extend(u32::MAX.to_be_bytes());
        }
        m
    }

    fn insert_message(values: &[Option<&str>]) -> Vec<u8> {
        let mut m = vec![b'I'];
        m.extend(16_385u32.to_be_bytes());
        m.push(b'N');
        m.extend((values.len() as u16).to_be_bytes());
        for v in values {
            match v {
                Some(text) => {
                    m.push(b't');
                    m.extend((text.len() as u32).to_be_bytes());
                    m.extend(text.as_bytes());
                }
                None => m.push(b'n'),
            }
        }
        m
    }

    #[test]
    fn an_inserted_outbox_row_decodes_as_the_table_holds_it() {
        let Message::Relation(relation) = decode(&relation_message()).unwrap() else {
            panic!("a relation");
        };
        assert_eq!(
            (relation.namespace.as_str(), relation.name.as_str()),
            ("public", "outbox")
        );
        assert_eq!(relation.columns.len(), COLUMNS.len());
        let event_id = uuid::Uuid::now_v7().to_string();
        let values = [
            Some("42"),
            Some(event_id.as_str()),
            Some("r"),
            Some("p"),
            Some("events"),
            Some("acesso.liberado"),
            Some(r#"[["x-seq","7"],["traceparent","00-a-b-01"]]"#),
            None,
            Some("\\x7b7d"),
            Some("key-1"),
            Some("1700000000123"),
            None,
            Some("0"),
            None,
            Some("0"),
            None,
            None,
        ];
        let Message::Insert {
            relation: id,
            values,
        } = decode(&insert_message(&values)).unwrap()
        else {
            panic!("an insert");
        };
        assert_eq!(id, 16_385);
        let mut relations = Relations::default();
        relations.remember(relation);
        let row = outbox_row(relations.get(id).unwrap(), &values).unwrap();
        assert_eq!(row.id, 42);
        assert_eq!(row.event.event_id.to_string(), event_id);
        assert_eq!(row.event.exchange, "events");
        assert_eq!(row.event.routing_key, "acesso.liberado");
        assert_eq!(
            row.event.headers,
            vec![
                ("x-seq".to_owned(), "7".to_owned()),
                ("traceparent".to_owned(), "00-a-b-01".to_owned())
            ]
        );
        assert_eq!(row.event.content_type, None);
        assert_eq!(row.event.payload, b"{}".to_vec());
        assert_eq!(row.event.ordering_key, "key-1");
        assert_eq!(row.created_at, 1_700_000_000_123);
    }

    #[test]
    fn other_messages_are_skipped_and_broken_ones_refused() {
        assert_eq!(decode(b"U\0\0\0\x01").unwrap(), Message::Other);
        assert!(matches!(
            decode(b"I\0\0"),
            Err(DecodeError::Truncated("relation id"))
        ));
        let mut truncated = insert_message(&[Some("12345")]);
        truncated.truncate(truncated.len() - 2);
        assert!(matches!(
            decode(&truncated),
            Err(DecodeError::Truncated("value"))
        ));
        assert!(matches!(
            Relations::default().get(7),
            Err(DecodeError::UnknownRelation(7))
        ));
        assert!(bytea("\\x00ff").unwrap() == vec![0, 255]);
        assert!(bytea("escaped\\000").is_err());
    }
}
