//! `plugins/enrollment` (the reference handler) written against [`NativeHost`]: the same
//! decisions, kv record and events, so that the pipeline benchmark can compare it with the
//! component. A measuring instrument, not part of the product build: the bench and the e2e
//! test that checks it decides as the component does include this file by path. What the two
//! must agree on (payload, ids, kv key, routing keys, verdict texts) is not copied here but
//! shared with the component: `plugins/enrollment-rules`; this file only does the I/O.

use carteiro::runtime::native::{
    Event, KvError, Level, NativeFuture, NativeHandler, NativeHost, OutboxError,
};
use carteiro::runtime::{Header, Message, RetryRequest, Verdict};
use enrollment_rules::{
    CAUSATION_HEADER, CONTENT_SERVICE_DOWN, DEFAULT_EVENTS_EXCHANGE, Matricula, ROUTING_KEYS,
    invalid,
};

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
        Err(e) => return Ok(Err(Verdict::DeadLetter(invalid(e)))),
    };
    if host.config_var("content_service".into()).await?.as_deref() == Some("down") {
        return Ok(Err(retry(CONTENT_SERVICE_DOWN.into())));
    }
    let key = matricula.key();
    let existing = match host.kv_get(key.clone()).await? {
        Ok(found) => found,
        Err(e) => return Ok(Err(kv_verdict(e))),
    };
    if let Some(bytes) = existing {
        let verdict = match serde_json::from_slice::<Matricula>(&bytes) {
            Ok(existing) if existing == matricula => {
                host.log(Level::Info, matricula.already_confirmed()).await?;
                return Ok(Ok(()));
            }
            Ok(_) => Verdict::DeadLetter(matricula.confirmed_differently()),
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
                name: CAUSATION_HEADER.into(),
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
    host.log(Level::Info, matricula.confirmed()).await?;
    Ok(Ok(()))
}
