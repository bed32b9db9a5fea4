//! `[[dead_letter_queues]]`: a queue other services dead-letter into, archived by Carteiro.

use crate::pipeline::DeadLetterAlertConfig;
use serde::Deserialize;

/// One foreign dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterQueueConfig {
    /// An existing queue (declared by its owners; Carteiro declares nothing).
    pub queue: String,
    /// Its name in the archive, the console and `dlq --route` (default: the queue).
    #[serde(default)]
    pub route: Option<String>,
    /// Raise the dead-letter alert when this many are archived within the window.
    #[serde(default)]
    pub alert: Option<DeadLetterAlertConfig>,
}

impl DeadLetterQueueConfig {
    /// The route its dead letters are archived under.
    pub fn route_name(&self) -> &str {
        self.route.as_deref().unwrap_or(&self.queue)
    }

    /// `Err((key, message))` with the key under `dead_letter_queues[i]`.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.queue.is_empty() || self.queue.len() > 255 {
            return Err(("queue", "queue names must be 1-255 bytes".into()));
        }
        if self
            .route
            .as_ref()
            .is_some_and(|r| r.is_empty() || r.len() > 200)
        {
            return Err(("route", "route names must be 1-200 bytes".into()));
        }
        if let Some(alert) = &self.alert
            && (alert.count == 0 || alert.window.is_zero())
        {
            return Err((
                "alert",
                "count and window must be above zero (`alert = { count = 10, window = \"1h\" }`)"
                    .into(),
            ));
        }
        Ok(())
    }
}
