//! Canary decisions shared by every gateway on one store (`pipeline::canary`).

use super::{Store, StoreError, now_ms, nul_free};

/// How a canary ended, as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct CanaryDecision {
    pub plugin: String,
    /// The canary component's sha256.
    pub canary_digest: String,
    /// `rolled-back`, `promoted` or `aborted`.
    pub decision: String,
    pub reason: String,
}

impl Store {
    /// Records how a canary ended; the first decision for a version stands (a second
    /// gateway deciding the same a moment later changes nothing).
    pub async fn canary_decide(&self, d: &CanaryDecision) -> Result<(), StoreError> {
        self.bounded("canary decision", async {
            nul_free::text("plugin", &d.plugin)?;
            let insert = sqlx::query(
                "INSERT INTO canary_decisions (plugin, canary_digest, decision, reason, decided_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (plugin, canary_digest) DO NOTHING",
            )
            .bind(&d.plugin)
            .bind(&d.canary_digest)
            .bind(&d.decision)
            .bind(nul_free::lossy(&d.reason))
            .bind(now_ms());
            self.execute_write(insert).await?;
            Ok(())
        })
        .await
    }

    /// Every recorded canary decision.
    pub async fn canary_decisions(&self) -> Result<Vec<CanaryDecision>, StoreError> {
        self.bounded("canary decisions", async {
            let decisions: Vec<CanaryDecision> = sqlx::query_as(
                "SELECT plugin, canary_digest, decision, reason FROM canary_decisions",
            )
            .fetch_all(&self.pool)
            .await?;
            Ok(decisions)
        })
        .await
    }
}
