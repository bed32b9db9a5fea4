//! Batches: one `handle-batch` call on one instance for several deliveries, each with effects
//! of its own.
//!
//! A component of the `batch-handler` world calls the `batch.item(i)` import before handling
//! message `i` (the SDKs do it). The host keeps one [`HostCalls`] per message: the current
//! one in the store's `HostState`, the others parked in [`BatchSlots`]; `item` swaps them.
//! So every kv write, event and log line belongs to exactly one message, which has its own
//! host-call cap and byte totals, and its kv reads see the committed store plus its own
//! writes only — never another message's, as if the messages were concurrent deliveries.
//! The pipeline then commits the effects of the acked messages only.
//!
//! Limits of a batch call: the plugin's `timeout` is per message, so a batch of n runs
//! under n × `timeout`; the host-call cap and the kv/event/log totals are per message; the
//! memory cap is the instance's. Isolation is per batch: guest globals set while handling
//! one message are seen by the next messages of the same call.

use super::bindings::types;
use super::effects::{Effects, KvSource};
use super::host::{BatchSlots, HostCalls};
use super::linked::{Exports, Linked};
use super::plugin::{Code, Invocation, Plugin, PluginFailure};
use super::pool::Bound;
use std::sync::Arc;

impl Plugin {
    /// Whether the component exports `handle-batch` (a `batch-handler` world).
    pub fn supports_batch(&self) -> bool {
        matches!(&self.code, Code::Wasm(Linked::Batch(_)))
    }

    /// Runs `handle-batch` on `messages` in one instance (fresh, or from the pool with
    /// `isolation = "per-batch"`); one [`Invocation`] per message, in order, each with its
    /// own effects. A trap, timeout or limit fails the whole batch (`Err`). A guest that
    /// answers with the wrong number of verdicts gets a retry verdict for every message,
    /// with a reason saying so, and no effects.
    pub async fn handle_batch(
        &self,
        messages: &[types::Message],
        kv: Arc<dyn KvSource>,
    ) -> Result<Vec<Invocation>, PluginFailure> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let messages = messages.to_vec();
        self.run_on_compute(move |plugin| async move { plugin.run_batch(&messages, kv).await })
            .await
    }

    /// [`Plugin::handle_batch`] on the calling task (the dispatch benchmark).
    pub async fn handle_batch_in_place(
        &self,
        messages: &[types::Message],
        kv: Arc<dyn KvSource>,
    ) -> Result<Vec<Invocation>, PluginFailure> {
        self.run_batch(messages, kv).await
    }

    async fn run_batch(
        &self,
        messages: &[types::Message],
        kv: Arc<dyn KvSource>,
    ) -> Result<Vec<Invocation>, PluginFailure> {
        let Code::Wasm(linked @ Linked::Batch(_)) = &self.code else {
            return Err(PluginFailure::Instantiate(format!(
                "plugin `{}` does not export handle-batch",
                self.name()
            )));
        };
        let mut calls: Vec<HostCalls> = messages
            .iter()
            .map(|_| HostCalls::new(self.identity.clone(), kv.clone()))
            .collect();
        let rest = calls.split_off(1);
        let Some(first) = calls.pop() else {
            return Ok(Vec::new());
        };
        let (mut instance, turn) = self.acquire(first).await?;
        instance.store.data_mut().batch = Some(BatchSlots::new(rest));
        // The timeout is per message: a batch of n may take n times as long.
        let n = u32::try_from(messages.len()).unwrap_or(u32::MAX);
        let timeout = self.limits().timeout.saturating_mul(n);
        let reused = instance.begin(timeout);
        self.runtime
            .count_instance(self.name(), self.version(), reused);

        let call = async {
            let exports = match instance.handler.take() {
                Some(Bound::Carteiro(exports)) => exports,
                _ => linked.instantiate(&mut instance.store).await?,
            };
            let Exports::Batch(batch) = &exports else {
                return Err(wasmtime::Error::msg("the instance lacks handle-batch"));
            };
            let verdicts = batch
                .call_handle_batch(&mut instance.store, messages)
                .await?;
            Ok::<_, wasmtime::Error>((Bound::Carteiro(exports), verdicts))
        };
        let outcome = tokio::time::timeout(timeout + super::EPOCH_TICK * 5, call).await;
        // Each message's effects, taken out before `conclude` finishes the current one.
        let per_message = {
            let state = instance.store.data_mut();
            match state.batch.take() {
                Some(slots) => slots.finish(&mut state.calls),
                None => vec![state.calls.finish()],
            }
        };
        let (_, verdicts) = self.conclude(&mut instance, timeout, outcome);
        let store_trouble = per_message.iter().any(|(_, e)| e.is_some());
        let right_length = verdicts.as_ref().is_ok_and(|v| v.len() == messages.len());
        let reusable = right_length && !store_trouble;
        let _spent = self.release(instance, reusable, turn);
        let verdicts = verdicts?;
        if verdicts.len() != messages.len() {
            let reason = format!(
                "the batch handler returned {} verdicts for {} messages; every message of the \
                 batch is retried (a batch handler returns one verdict per message, in order)",
                verdicts.len(),
                messages.len()
            );
            return Ok(messages
                .iter()
                .map(|_| Invocation {
                    verdict: types::Verdict::Retry(types::RetryRequest {
                        delay_ms: None,
                        reason: reason.clone(),
                    }),
                    effects: Effects::default(),
                    store_error: None,
                    standard_error: None,
                })
                .collect());
        }
        Ok(verdicts
            .into_iter()
            .zip(per_message)
            .map(|(verdict, (effects, store_error))| Invocation {
                verdict,
                effects,
                store_error,
                standard_error: None,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::KvFuture;
    use crate::runtime::host::PluginIdentity;
    use crate::runtime::limits::DeliveryTotals;
    use std::collections::BTreeMap;

    struct NoKv;
    impl KvSource for NoKv {
        fn get<'a>(&'a self, _: &'a str, _: &'a str) -> KvFuture<'a> {
            Box::pin(async { Ok(None) })
        }
    }

    fn calls() -> HostCalls {
        let identity = Arc::new(PluginIdentity {
            name: "p".into(),
            variables: BTreeMap::new(),
            max_host_calls: 10,
            max_events: 10,
            totals: DeliveryTotals::default(),
            standard_exchange: None,
        });
        HostCalls::new(identity, Arc::new(NoKv))
    }

    #[test]
    fn each_message_keeps_its_own_effects_and_an_index_past_the_batch_traps() {
        let mut current = calls();
        let mut slots = BatchSlots::new(vec![calls(), calls()]);
        current
            .effects
            .writes
            .insert("zero".into(), Some(b"0".to_vec()));
        slots.switch(&mut current, 2).expect("in range");
        current
            .effects
            .writes
            .insert("two".into(), Some(b"2".to_vec()));
        slots.switch(&mut current, 0).expect("in range");
        assert!(
            current.effects.writes.contains_key("zero"),
            "back to message 0's own state"
        );
        assert!(slots.switch(&mut current, 3).is_err(), "past the batch");
        let finished = slots.finish(&mut current);
        assert_eq!(finished.len(), 3);
        assert_eq!(
            finished[0].0.writes.keys().collect::<Vec<_>>(),
            vec!["zero"]
        );
        assert!(finished[1].0.writes.is_empty());
        assert_eq!(finished[2].0.writes.keys().collect::<Vec<_>>(), vec!["two"]);
    }
}
