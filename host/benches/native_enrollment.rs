//! `plugins/enrollment` (the reference handler) written against [`NativeHost`]: the same
//! decisions, kv record and events, so that the pipeline benchmark can compare it with the
//! component. A measuring instrument, not part of the product build: the bench and the e2e
//! test that checks it decides as the component does include this file by path.

use carteiro::runtime::native::{
    Event, KvError, Level, NativeFuture, NativeHandler, NativeHost, OutboxError,
};
use carteiro::runtime::{Header, Message, RetryRequest, Verdict};
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use std::fmt;

const DEFAULT_EVENTS_EXCHANGE: &str = "carteiro.events";
const ROUTING_KEYS: [&str; 3] = ["acesso.liberado", "fatura.solicitada", "email.solicitado"];

/// The enrollment handler compiled into the host (see the module docs).
#[derive(Debug, Default, Clone, Copy)]
pub struct Enrollment;

impl NativeHandler for Enrollment {
    fn handle<'a>(&'a self, message: &'a Message, host: &'a mut NativeHost) -> NativeFuture<'a> {
        Box::pin(async move {
            Ok(match confirm(message, host).await? {
                Ok(()) => Verdict::Ack,
                Err(verdict) => verdict,
            })
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Id {
    Text(String),
    Number(i128),
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Id::Text(s) => f.write_str(s),
            Id::Number(n) => write!(f, "{n}"),
        }
    }
}

impl Serialize for Id {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Id::Text(t) => s.serialize_str(t),
            Id::Number(n) => s.serialize_i128(*n),
        }
    }
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct IdVisitor;
        impl Visitor<'_> for IdVisitor {
            type Value = Id;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a non-empty string or an integer id")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Id, E> {
                if v.is_empty() {
                    return Err(E::invalid_value(de::Unexpected::Str(v), &self));
                }
                Ok(Id::Text(v.to_owned()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Id, E> {
                Ok(Id::Number(v.into()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Id, E> {
                Ok(Id::Number(v.into()))
            }
        }
        d.deserialize_any(IdVisitor)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Matricula {
    matricula_id: Id,
    usuario_id: Id,
    curso_id: Id,
}

fn retry(reason: String) -> Verdict {
    Verdict::Retry(RetryRequest {
        delay_ms: None,
        reason,
    })
}

fn kv_verdict(e: KvError) -> Verdict {
    match e {
        KvError::Unavailable(why) => retry(format!("kv unavailable: {why}")),
        KvError::InvalidKey(why) => Verdict::DeadLetter(format!("invalid kv key: {why}")),
        KvError::ValueTooLarge(max) => {
            Verdict::DeadLetter(format!("kv value larger than {max} bytes"))
        }
    }
}

fn outbox_verdict(e: OutboxError) -> Verdict {
    Verdict::DeadLetter(match e {
        OutboxError::InvalidEvent(why) => format!("invalid event: {why}"),
        OutboxError::TooManyEvents(max) => format!("more than {max} events"),
        OutboxError::PayloadTooLarge(max) => format!("event payload larger than {max} bytes"),
    })
}

/// `Ok(Err(verdict))`: the handler's refusal; `Err`: a cap the host enforces was hit.
async fn confirm(msg: &Message, host: &mut NativeHost) -> wasmtime::Result<Result<(), Verdict>> {
    let matricula: Matricula = match serde_json::from_slice(&msg.body) {
        Ok(m) => m,
        Err(e) => {
            return Ok(Err(Verdict::DeadLetter(format!(
                "invalid matricula.confirmada: {e}"
            ))));
        }
    };
    if host.config_var("content_service".into()).await?.as_deref() == Some("down") {
        return Ok(Err(retry("content service unavailable".into())));
    }
    let key = format!("matricula/{}", matricula.matricula_id);
    let existing = match host.kv_get(key.clone()).await? {
        Ok(found) => found,
        Err(e) => return Ok(Err(kv_verdict(e))),
    };
    if let Some(bytes) = existing {
        let verdict = match serde_json::from_slice::<Matricula>(&bytes) {
            Ok(existing) if existing == matricula => {
                let text = format!(
                    "matricula {} already confirmed; nothing to do",
                    matricula.matricula_id
                );
                host.log(Level::Info, text).await?;
                return Ok(Ok(()));
            }
            Ok(_) => Verdict::DeadLetter(format!(
                "matricula {} was already confirmed with a different usuario_id or curso_id",
                matricula.matricula_id
            )),
            Err(e) => {
                Verdict::DeadLetter(format!("value of `{key}` is not the expected JSON: {e}"))
            }
        };
        return Ok(Err(verdict));
    }
    let record = serde_json::to_vec(&matricula)?;
    if let Err(e) = host.kv_set(key, record.clone()).await? {
        return Ok(Err(kv_verdict(e)));
    }
    let exchange = host
        .config_var("events_exchange".into())
        .await?
        .unwrap_or_else(|| DEFAULT_EVENTS_EXCHANGE.to_owned());
    for routing_key in ROUTING_KEYS {
        let headers = msg
            .id
            .iter()
            .map(|id| Header {
                name: "x-causation-id".into(),
                value: id.clone(),
            })
            .collect();
        let event = Event {
            exchange: exchange.clone(),
            routing_key: routing_key.into(),
            headers,
            content_type: Some("application/json".into()),
            payload: record.clone(),
        };
        if let Err(e) = host.emit(event).await? {
            return Ok(Err(outbox_verdict(e)));
        }
    }
    let text = format!("matricula {} confirmed", matricula.matricula_id);
    host.log(Level::Info, text).await?;
    Ok(Ok(()))
}
