//! Topology errors and reading the broker's "inequivalent arg" replies.

use lapin::protocol::{AMQPErrorKind, AMQPSoftError};

/// Why a route's topology could not be declared.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// The queue exists with other arguments than this route asks for.
    #[error(
        "queue '{queue}' already exists with a different '{argument}' ({detail}); Carteiro never \
         deletes queues: delete the queue (drain it first, its messages would be lost) or change \
         the route's config to match"
    )]
    Mismatch {
        /// The existing queue.
        queue: String,
        /// The differing argument, e.g. `x-message-ttl` or `durable`.
        argument: String,
        /// The broker's words: `received ... but current is ...`.
        detail: String,
    },
    /// An exchange exists with another type or other arguments.
    #[error(
        "exchange '{exchange}' already exists with a different '{argument}' ({detail}); delete \
         the exchange or change the route's binding to match"
    )]
    ExchangeMismatch {
        /// The existing exchange.
        exchange: String,
        /// The differing argument, e.g. `type`.
        argument: String,
        /// The broker's words.
        detail: String,
    },
    /// The route's settings cannot be declared at all (name too long, zero delay, ...).
    #[error("invalid topology for queue '{queue}': {reason}")]
    Invalid {
        /// The route's work queue.
        queue: String,
        /// What to fix in the config.
        reason: String,
    },
    /// The broker refused a declaration for another reason (permissions, reserved name,
    /// unsupported argument).
    #[error("broker refused to declare {what}: {reason}")]
    Refused {
        /// E.g. `queue 'orders.dlq'`.
        what: String,
        /// The broker's reply.
        reason: String,
    },
    /// The connection failed meanwhile; declaring again after reconnecting may succeed.
    #[error("lost the broker while declaring {what}: {reason}")]
    Broker {
        /// E.g. `queue 'orders.dlq'`.
        what: String,
        /// lapin's reason.
        reason: String,
    },
}

impl TopologyError {
    /// True when declaring again cannot help until someone changes the config or the
    /// broker: report it and stop instead of retrying.
    pub fn is_permanent(&self) -> bool {
        !matches!(self, TopologyError::Broker { .. })
    }
}

/// What was being declared, to turn a broker reply into the right error.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Entity<'a> {
    Queue(&'a str),
    Exchange(&'a str),
    Binding { queue: &'a str, exchange: &'a str },
}

impl std::fmt::Display for Entity<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Entity::Queue(q) => write!(f, "queue '{q}'"),
            Entity::Exchange(x) => write!(f, "exchange '{x}'"),
            Entity::Binding { queue, exchange } => {
                write!(f, "binding of queue '{queue}' to exchange '{exchange}'")
            }
        }
    }
}

/// Classifies a lapin error from declaring `entity`.
pub(crate) fn classify(entity: Entity<'_>, err: &lapin::Error) -> TopologyError {
    let what = entity.to_string();
    let lapin::ErrorKind::ProtocolError(amqp) = err.kind() else {
        return TopologyError::Broker {
            what,
            reason: err.to_string(),
        };
    };
    let text = amqp.get_message().as_str();
    let soft = match amqp.kind() {
        AMQPErrorKind::Soft(soft) => soft,
        // Connection-level errors (e.g. the broker shutting down) are transient.
        AMQPErrorKind::Hard(_) => {
            return TopologyError::Broker {
                what,
                reason: err.to_string(),
            };
        }
    };
    if let (AMQPSoftError::PRECONDITIONFAILED, Some((argument, detail))) =
        (soft, inequivalent_arg(text))
    {
        return match entity {
            Entity::Queue(queue) => TopologyError::Mismatch {
                queue: queue.to_owned(),
                argument,
                detail,
            },
            Entity::Exchange(exchange) => TopologyError::ExchangeMismatch {
                exchange: exchange.to_owned(),
                argument,
                detail,
            },
            Entity::Binding { .. } => TopologyError::Refused {
                what,
                reason: text.to_owned(),
            },
        };
    }
    TopologyError::Refused {
        what,
        reason: text.to_owned(),
    }
}

/// Parses RabbitMQ's `PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'q'
/// in vhost '/': received the value '6000' of type 'long' but current is none` into the
/// argument and the `received ...` part. The entity's name is taken from our side, since a
/// name may itself contain quotes.
pub(crate) fn inequivalent_arg(text: &str) -> Option<(String, String)> {
    const MARK: &str = "inequivalent arg '";
    let rest = &text[text.find(MARK)? + MARK.len()..];
    let argument = &rest[..rest.find('\'')?];
    let detail = rest
        .find("': received")
        .map(|i| &rest[i + 3..])
        .or_else(|| rest.find("received").map(|i| &rest[i..]))
        .unwrap_or(rest);
    Some((argument.to_owned(), detail.trim().to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_brokers_inequivalent_arg_reply() {
        let text = "PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'o.retry.5000ms' \
                    in vhost '/': received the value '6000' of type 'long' but current is the value \
                    '5000' of type 'long'";
        let (arg, detail) = inequivalent_arg(text).expect("parses");
        assert_eq!(arg, "x-message-ttl");
        assert_eq!(
            detail,
            "received the value '6000' of type 'long' but current is the value '5000' of type 'long'"
        );
        let (arg, detail) = inequivalent_arg(
            "inequivalent arg 'durable' for queue 'it's' in vhost '/': received 'true' but current is 'false'",
        )
        .expect("parses");
        assert_eq!(
            (arg.as_str(), detail.as_str()),
            ("durable", "received 'true' but current is 'false'")
        );
        assert!(inequivalent_arg("NOT_FOUND - no queue 'x'").is_none());
    }

    #[test]
    fn mismatch_message_says_what_to_do() {
        let err = TopologyError::Mismatch {
            queue: "orders".into(),
            argument: "x-message-ttl".into(),
            detail: "received 1 but current is 2".into(),
        };
        let text = err.to_string();
        for needle in [
            "'orders'",
            "'x-message-ttl'",
            "delete the queue",
            "change the route's config",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from: {text}");
        }
        assert!(err.is_permanent());
    }
}
