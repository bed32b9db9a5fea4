//! Foreign dead-letter queues (`[[dead_letter_queues]]`): queues that services outside the
//! sandbox (an aio-pika consumer's `nack(requeue=False)`, a Celery task rejected or copied
//! there by the documented snippet) dead-letter into, archived into the same `dead_letters`
//! archive as the routes' own, so the same list, search, console, alerts, edit and replay
//! serve them. Replay goes back where each came from (see `dlq::replay`).
//!
//! - `celery`: a dead letter in Celery's message protocol read as its task;
//! - `config`: the section;
//! - `record`: a delivery as its archive row, with its reason and dedupe key;
//! - `consumer`: one queue's consumer (archive, then ack);
//! - `replay`: where a copy of one goes, and what it is sent with.

mod celery;
mod config;
mod consumer;
mod record;
mod replay;

pub use celery::{CeleryTask, celery_task};
pub use config::DeadLetterQueueConfig;
pub use consumer::{Deps, run};
pub use record::{Death, Foreign, latest_death, record};
pub use replay::{Destination, is_foreign, origin, restore};
