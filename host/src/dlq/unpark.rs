//! `carteiro dlq unpark`: moves a quorum route's parked dead letters (`Q.dlq.parked`, where
//! the broker put those the archiver could not take within `Q.dlq`'s delivery limit) back
//! into `Q.dlq`, for the archiver to try again. Each message is republished with its own
//! properties and acked in the parked queue only after the broker confirmed the copy, so a
//! crash mid-way can only leave a message in both queues, never in neither (the archive
//! may then hold it twice).

use lapin::options::{BasicAckOptions, BasicGetOptions, BasicPublishOptions};
use lapin::{Confirmation, Connection};

use crate::topology::{dlq_name, parked_name, queue_state};

/// Why an unpark stopped.
#[derive(Debug, thiserror::Error)]
pub enum UnparkError {
    #[error("queue `{queue}` not found (only quorum routes have one): {source}")]
    NoParkedQueue {
        queue: String,
        #[source]
        source: lapin::Error,
    },
    #[error("broker error while moving `{queue}` back: {source}")]
    Broker {
        queue: String,
        #[source]
        source: lapin::Error,
    },
    #[error("the broker refused the copy of a parked message to `{dlq}` (nack); it stays parked")]
    Nacked { dlq: String },
}

/// Moves at most the messages parked when it starts (so a message that comes straight back
/// is not moved in a loop) from `route`'s parked queue into its DLQ. Returns how many.
pub async fn unpark(conn: &Connection, route: &str) -> Result<u64, UnparkError> {
    let (parked, dlq) = (parked_name(route), dlq_name(route));
    let broker = |source| UnparkError::Broker {
        queue: parked.clone(),
        source,
    };
    let channel = conn.create_channel().await.map_err(broker)?;
    let count = queue_state(&channel, &parked)
        .await
        .map_err(|source| UnparkError::NoParkedQueue {
            queue: parked.clone(),
            source,
        })?
        .message_count();
    let channel = conn.create_channel().await.map_err(broker)?;
    channel
        .confirm_select(Default::default())
        .await
        .map_err(broker)?;
    let mut moved = 0;
    while moved < u64::from(count) {
        let Some(message) = channel
            .basic_get(parked.as_str().into(), BasicGetOptions::default())
            .await
            .map_err(broker)?
        else {
            break;
        };
        let delivery = message.delivery;
        let confirm = channel
            .basic_publish(
                "".into(),
                dlq.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                &delivery.data,
                delivery.properties.clone(),
            )
            .await
            .map_err(broker)?
            .await
            .map_err(broker)?;
        match confirm {
            Confirmation::Ack(None) => {}
            _ => return Err(UnparkError::Nacked { dlq: dlq.clone() }),
        }
        delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .map_err(broker)?;
        moved += 1;
    }
    let _ = channel.close(200, "unparked".into()).await;
    Ok(moved)
}
