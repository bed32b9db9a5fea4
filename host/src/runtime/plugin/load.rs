//! Loading a plugin: a component read, checked against its digest pin, compiled and
//! pre-linked for the world it implements; or a handler compiled into the host.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use wasmtime::component::Component;

use super::{Code, LoadError, Plugin, PluginLimits};
use crate::runtime::Runtime;
use crate::runtime::bindings::HandlerPre;
use crate::runtime::bindings::batch_world::BatchHandlerPre;
use crate::runtime::host::PluginIdentity;
use crate::runtime::language::{IsolationChoice, Language};
use crate::runtime::linked::Linked;
use crate::runtime::native::NativeHandler;
use crate::runtime::pool::Isolation;
use crate::runtime::standard::{self, MessagingCorePre, World, WorldProblem};

impl Plugin {
    /// Reads, verifies (digest pin), compiles and pre-links a component.
    pub fn load(
        runtime: &Arc<Runtime>,
        name: &str,
        path: &Path,
        expected_sha256: Option<&str>,
        limits: PluginLimits,
        variables: BTreeMap<String, String>,
    ) -> Result<Self, LoadError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            name: name.into(),
            path: shown.clone(),
            source,
        })?;
        let digest = hex::encode(Sha256::digest(&bytes));
        if let Some(expected) = expected_sha256
            && !expected.eq_ignore_ascii_case(&digest)
        {
            return Err(LoadError::DigestMismatch {
                name: name.into(),
                path: shown,
                expected: expected.to_ascii_lowercase(),
                actual: digest,
            });
        }
        let component = Component::from_binary(&runtime.engine, &bytes).map_err(|e| {
            LoadError::NotAComponent {
                name: name.into(),
                path: shown.clone(),
                detail: format!("{e:#}"),
            }
        })?;
        let ty = component.component_type();
        let world = standard::detect(
            ty.exports(&runtime.engine).map(|(export, _)| export),
            ty.imports(&runtime.engine).map(|(import, _)| import),
        )
        .map_err(|problem| match problem {
            WorldProblem::UnsupportedImport { .. } => LoadError::UnsupportedImport {
                name: name.into(),
                path: shown.clone(),
                problem,
            },
            other => LoadError::WrongWorld {
                name: name.into(),
                path: shown.clone(),
                detail: other.to_string(),
            },
        })?;
        let wrong_world = |e: wasmtime::Error| LoadError::WrongWorld {
            name: name.into(),
            path: shown.clone(),
            detail: format!("as a {} component: {e:#}", world.label()),
        };
        let instance_pre = runtime
            .linker
            .instantiate_pre(&component)
            .map_err(wrong_world)?;
        let code = match world {
            // A component of the `batch-handler` world also exports `handle-batch`; its type
            // is checked here, so a wrong signature is a load error rather than a plain handler.
            World::Carteiro if component.get_export_index(None, "handle-batch").is_some() => {
                Code::Wasm(Linked::Batch(
                    BatchHandlerPre::new(instance_pre).map_err(wrong_world)?,
                ))
            }
            World::Carteiro => Code::Wasm(Linked::Plain(
                HandlerPre::new(instance_pre).map_err(wrong_world)?,
            )),
            World::Standard => {
                Code::Standard(MessagingCorePre::new(instance_pre).map_err(wrong_world)?)
            }
        };
        Ok(Self::assemble(
            runtime,
            name,
            code,
            limits,
            Language::of(&bytes),
            variables,
            digest,
        ))
    }

    /// A plugin whose deliveries run `handler`, compiled into the host, under the same
    /// imports, caps and limits as a component (benchmarks: what the sandbox costs). Its
    /// digest is that of the label `native:<name>`.
    pub fn native(
        runtime: &Arc<Runtime>,
        name: &str,
        handler: Arc<dyn NativeHandler>,
        limits: PluginLimits,
        variables: BTreeMap<String, String>,
    ) -> Self {
        let digest = hex::encode(Sha256::digest(format!("native:{name}").as_bytes()));
        Self::assemble(
            runtime,
            name,
            Code::Native(handler),
            limits,
            Language::Compiled,
            variables,
            digest,
        )
    }

    /// A plugin of `code`, whatever it is compiled to: its identity, limits and permits,
    /// with the isolation and concurrency its `language` gets where `limits` set none.
    fn assemble(
        runtime: &Arc<Runtime>,
        name: &str,
        code: Code,
        limits: PluginLimits,
        language: Language,
        variables: BTreeMap<String, String>,
        digest: String,
    ) -> Self {
        let isolation = IsolationChoice::new(limits.isolation, language);
        let concurrency = limits
            .max_concurrency
            .or_else(|| language.default_concurrency())
            .map_or(tokio::sync::Semaphore::MAX_PERMITS, |n| n.max(1) as usize);
        let pool = match (&code, isolation.isolation) {
            (Code::Wasm(_) | Code::Standard(_), Isolation::PerBatch { reuse }) => {
                Some(runtime.pools.add(reuse))
            }
            _ => None,
        };
        Self {
            runtime: runtime.clone(),
            identity: Arc::new(PluginIdentity {
                name: name.into(),
                variables,
                max_host_calls: limits.max_host_calls,
                max_events: limits.max_events,
                totals: limits.totals,
                standard_exchange: None,
            }),
            code,
            limits,
            isolation,
            digest: digest.into(),
            concurrency: Arc::new(tokio::sync::Semaphore::new(concurrency)),
            pool,
        }
    }
}
