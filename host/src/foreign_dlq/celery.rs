//! A dead letter in Celery's message protocol v2 read as the task it is: the `task`, `id`,
//! `argsrepr` and `kwargsrepr` headers, and a JSON body `[args, kwargs, embed]`.

use serde::Serialize;
use serde_json::{Map, Value as Json};

/// A Celery task, as `dlq show`, the console and search show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CeleryTask {
    /// `task`: its registered name (`tasks.liberar_acesso_curso`).
    pub task: String,
    /// `id`: the task id.
    pub id: String,
    /// The positional arguments (the body's first item).
    pub args: Json,
    /// The keyword arguments (the body's second item).
    pub kwargs: Json,
    /// `argsrepr` and `kwargsrepr`: how the caller printed them (may be shortened).
    pub argsrepr: Option<String>,
    pub kwargsrepr: Option<String>,
}

/// The task `headers` and `body` make, when they are protocol v2 with a JSON body.
pub fn celery_task(headers: &[(String, String)], body: &[u8]) -> Option<CeleryTask> {
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let task = header("task").filter(|t| !t.is_empty())?;
    let id = header("id")?;
    let Ok(Json::Array(parts)) = serde_json::from_slice::<Json>(body) else {
        return None;
    };
    let (args, kwargs) = match parts.as_slice() {
        [args @ Json::Array(_), kwargs @ Json::Object(_), ..] => (args.clone(), kwargs.clone()),
        _ => return None,
    };
    Some(CeleryTask {
        task,
        id,
        args,
        kwargs,
        argsrepr: header("argsrepr"),
        kwargsrepr: header("kwargsrepr"),
    })
}

impl CeleryTask {
    /// What the task is found by, as the JSON object a search reads instead of its body:
    /// `task`, `id`, `args` (by position: `body.args[0]`) and `kwargs` (`body.kwargs.NAME`).
    pub fn search_fields(&self) -> Json {
        let args: Map<String, Json> = self
            .args
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .map(|(i, v)| (i.to_string(), v.clone()))
            .collect();
        serde_json::json!({
            "task": self.task,
            "id": self.id,
            "args": args,
            "kwargs": self.kwargs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers() -> Vec<(String, String)> {
        [
            ("task", "tasks.liberar_acesso_curso"),
            ("id", "6f1c"),
            ("argsrepr", "(42, 'ev-1')"),
            ("kwargsrepr", "{}"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .to_vec()
    }

    #[test]
    fn a_protocol_v2_message_reads_as_its_task() {
        let body = br#"[[42, "ev-1"], {"curso": "rust"}, {"callbacks": null}]"#;
        let t = celery_task(&headers(), body).expect("a task");
        assert_eq!(t.task, "tasks.liberar_acesso_curso");
        assert_eq!(t.args, serde_json::json!([42, "ev-1"]));
        assert_eq!(t.argsrepr.as_deref(), Some("(42, 'ev-1')"));
        let fields = t.search_fields();
        assert_eq!(fields["args"]["0"], 42);
        assert_eq!(fields["kwargs"]["curso"], "rust");
    }

    #[test]
    fn other_messages_are_not_tasks() {
        assert!(celery_task(&headers(), b"{\"a\": 1}").is_none());
        assert!(celery_task(&headers(), b"[1, 2]").is_none());
        assert!(celery_task(&[], br#"[[], {}, {}]"#).is_none());
    }
}
