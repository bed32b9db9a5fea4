//! An in-memory kv store: what `carteiro plugin test` runs on, and what a shadow run writes
//! into — optionally over a read-only seed (a shadow run's seed is the real kv, which it
//! reads and never writes).

use super::effects::{KvFuture, KvSource, KvValue};
use crate::store::StoreError;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// Why a delivery's writes could not be applied to a [`MemoryKv`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryKvError {
    /// A thread panicked while holding the entries.
    #[error("memory kv poisoned")]
    Poisoned,
    /// Reading a written key's current version failed (the seed did not answer).
    #[error("{0}")]
    Read(StoreError),
}

/// Keys written here (a deleted key is kept as `None`) shadow the seed's.
#[derive(Default)]
pub struct MemoryKv {
    entries: Mutex<HashMap<(String, String), Option<KvValue>>>,
    seed: Option<Arc<dyn KvSource>>,
}

impl MemoryKv {
    /// An empty store whose reads fall back to `seed` for keys not written here.
    pub fn over(seed: Arc<dyn KvSource>) -> Self {
        Self {
            entries: Mutex::default(),
            seed: Some(seed),
        }
    }

    /// Sets what `key` reads as (`None`: absent), shadowing the seed.
    pub fn preset(&self, namespace: &str, key: &str, value: Option<KvValue>) {
        if let Ok(mut m) = self.entries.lock() {
            m.insert((namespace.to_owned(), key.to_owned()), value);
        }
    }

    /// Applies one delivery's writes as its commit would (each written key's version one
    /// above the version it had), so later deliveries read them. The seed is never touched.
    pub async fn apply(
        &self,
        namespace: &str,
        writes: &BTreeMap<String, Option<Vec<u8>>>,
    ) -> Result<(), MemoryKvError> {
        for (key, value) in writes {
            let found = self
                .get(namespace, key)
                .await
                .map_err(MemoryKvError::Read)?;
            let version = found.map_or(0, |v| v.version) + 1;
            let entry = value.clone().map(|value| KvValue { value, version });
            self.entries
                .lock()
                .map_err(|_| MemoryKvError::Poisoned)?
                .insert((namespace.to_owned(), key.clone()), entry);
        }
        Ok(())
    }
}

impl KvSource for MemoryKv {
    fn get<'a>(&'a self, namespace: &'a str, key: &'a str) -> KvFuture<'a> {
        let found = self
            .entries
            .lock()
            .map_err(|_| StoreError::Unavailable("memory kv poisoned".to_owned()))
            .map(|m| m.get(&(namespace.to_owned(), key.to_owned())).cloned());
        Box::pin(async move {
            match (found?, &self.seed) {
                (Some(written), _) => Ok(written),
                (None, Some(seed)) => seed.get(namespace, key).await,
                (None, None) => Ok(None),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn writes_shadow_the_seed_which_is_never_written() {
        let seed = Arc::new(MemoryKv::default());
        let mut w = BTreeMap::new();
        w.insert("a".to_owned(), Some(b"seeded".to_vec()));
        w.insert("b".to_owned(), Some(b"seeded".to_vec()));
        seed.apply("ns", &w).await.expect("seed");
        let kv = MemoryKv::over(seed.clone());
        let mut w = BTreeMap::new();
        w.insert("a".to_owned(), Some(b"new".to_vec()));
        w.insert("b".to_owned(), None);
        kv.apply("ns", &w).await.expect("apply");
        let a = kv.get("ns", "a").await.expect("a").expect("a present");
        assert_eq!((a.value.as_slice(), a.version), (&b"new"[..], 2));
        assert_eq!(kv.get("ns", "b").await.expect("b"), None);
        let seeded = seed.get("ns", "a").await.expect("seed a").expect("present");
        assert_eq!(seeded.value, b"seeded");
        assert!(seed.get("ns", "b").await.expect("seed b").is_some());
    }
}
