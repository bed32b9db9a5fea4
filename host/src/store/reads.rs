//! Batched point reads for the pipeline. Every delivery asks "is this key in the inbox?"
//! and its handler reads kv keys; one statement each would make the database round trip
//! (and, on SQLite, the hand-off to the connection's worker thread) the cost of a delivery.
//! Callers queue their lookups here; a task answers whatever is queued with one
//! `IN (...)` query per route or namespace, a few batches in flight at a time.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc, oneshot};

use super::{KvEntry, Store, StoreError, nul_free};

/// Lookups answered by one batch at most.
const MAX_BATCH: usize = 1_024;
/// Batches running at once; the rest wait, growing the next batch.
const BATCHES_IN_FLIGHT: usize = 3;

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// Lookups waiting for one batch: by scope, each key and where its answer goes.
type Waiters<T> = BTreeMap<String, Vec<(String, Reply<T>)>>;

/// One key asked for in a scope (a route's inbox or a kv namespace), and where the answer
/// goes.
struct Ask<T> {
    scope: String,
    key: String,
    reply: Reply<T>,
}

impl<T> Ask<T> {
    /// Files this lookup among the `waiters` of its batch.
    fn wait_in(self, waiters: &mut Waiters<T>) {
        let Ask { scope, key, reply } = self;
        waiters.entry(scope).or_default().push((key, reply));
    }
}

enum Lookup {
    Inbox(Ask<bool>),
    Kv(Ask<Option<KvEntry>>),
}

/// Submits lookups to the batching task. Cheap to clone; the task ends with the last handle.
#[derive(Clone)]
pub struct BatchedReads {
    tx: mpsc::Sender<Lookup>,
}

impl BatchedReads {
    /// Starts the batching task. Needs a tokio runtime.
    pub fn spawn(store: Store) -> Self {
        let (tx, rx) = mpsc::channel(MAX_BATCH * 2);
        tokio::spawn(run(store, rx));
        Self { tx }
    }

    /// [`Store::inbox_contains`], batched with concurrent callers.
    pub async fn inbox_contains(&self, route: &str, key: &str) -> Result<bool, StoreError> {
        nul_free::text("route", route)?;
        nul_free::text("inbox key", key)?;
        self.ask(Lookup::Inbox, route, key).await
    }

    /// [`Store::kv_get`], batched with concurrent callers.
    pub async fn kv_get(&self, namespace: &str, key: &str) -> Result<Option<KvEntry>, StoreError> {
        nul_free::text("namespace", namespace)?;
        nul_free::text("kv key", key)?;
        self.ask(Lookup::Kv, namespace, key).await
    }

    /// Queues the lookup of `key` in `scope` (as `lookup`) and waits for its answer.
    async fn ask<T>(
        &self,
        lookup: fn(Ask<T>) -> Lookup,
        scope: &str,
        key: &str,
    ) -> Result<T, StoreError> {
        let stopped = || StoreError::Unavailable("the batched-read task has stopped".into());
        let (reply, answer) = oneshot::channel();
        let ask = Ask {
            scope: scope.to_owned(),
            key: key.to_owned(),
            reply,
        };
        self.tx.send(lookup(ask)).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn run(store: Store, mut rx: mpsc::Receiver<Lookup>) {
    let slots = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        // Wait for a free slot before collecting: lookups arriving meanwhile join this batch.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(lookup) => batch.push(lookup),
                Err(_) => break,
            }
        }
        let store = store.clone();
        tokio::spawn(async move {
            answer(&store, batch).await;
            drop(slot);
        });
    }
}

/// Answers one batch: one query per route (inbox) and per namespace (kv).
async fn answer(store: &Store, batch: Vec<Lookup>) {
    let mut inbox: Waiters<bool> = BTreeMap::new();
    let mut kv: Waiters<Option<KvEntry>> = BTreeMap::new();
    for lookup in batch {
        match lookup {
            Lookup::Inbox(ask) => ask.wait_in(&mut inbox),
            Lookup::Kv(ask) => ask.wait_in(&mut kv),
        }
    }
    for (route, waiters) in inbox {
        let keys: Vec<&str> = waiters.iter().map(|(k, _)| k.as_str()).collect();
        let found = store.inbox_contains_many(&route, &keys).await;
        for (key, reply) in waiters {
            let _ = reply.send(
                found
                    .as_ref()
                    .map(|f| f.contains(&key))
                    .map_err(Clone::clone),
            );
        }
    }
    for (namespace, waiters) in kv {
        let keys: Vec<&str> = waiters.iter().map(|(k, _)| k.as_str()).collect();
        let found: Result<HashMap<String, KvEntry>, StoreError> =
            store.kv_get_many(&namespace, &keys).await;
        for (key, reply) in waiters {
            let entry = match &found {
                // A key asked twice in one batch gets the same answer both times.
                Ok(entries) => Ok(entries.get(&key).cloned()),
                Err(e) => Err(e.clone()),
            };
            let _ = reply.send(entry);
        }
    }
}
