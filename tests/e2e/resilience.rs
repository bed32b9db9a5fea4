//! Issue 3's faults, each on its own queues and database, every wait bounded:
//! - `broker`: a RabbitMQ restart while messages flow, and broker-native dead-lettering
//!   (TTL expiry, max-length overflow) archived with the broker's reason;
//! - `process`: the real binary under SIGTERM with deliveries in flight, bad config files,
//!   and broker credentials that must never reach the logs.
//!
//! The helpers here run the real `carteiro` binary and dedicated RabbitMQ instances
//! (`scripts/rabbitmq.sh`), and clean both up on drop, also when a test fails.

mod broker;
pub(crate) mod hostile;
mod process;

use crate::support::{Client, repo, script, script_quietly, unique, wait_for};
use carteiro::pipeline::RouteConfig;
use carteiro::topology::RouteTopology;
use std::io::Read;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A RabbitMQ instance of this test alone, stopped (and its state removed) on drop.
pub struct Rabbit {
    name: String,
    port: u16,
}

/// Runs `scripts/rabbitmq.sh ARGS` to completion (blocking), panicking with its output.
fn rabbitmq_sh(args: &[&str]) {
    script(
        "rabbitmq.sh",
        args,
        &[("CARTEIRO_RABBITMQ_START_TIMEOUT", "90".into())],
    );
}

/// A port in 5690..6190 that is free, as is the Erlang distribution port the script derives
/// from it (port + 20000).
fn free_port() -> u16 {
    for _ in 0..200 {
        let port = 5690 + rand::random_range(0..500u16);
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 20000) {
            return port;
        }
    }
    panic!("no free port for a dedicated RabbitMQ in 5690..6190");
}

impl Rabbit {
    /// Starts a fresh instance (10–40 s).
    pub async fn start() -> Self {
        let rabbit = Self {
            name: unique("resil"),
            port: free_port(),
        };
        let (name, port) = (rabbit.name.clone(), rabbit.port.to_string());
        tokio::task::spawn_blocking(move || rabbitmq_sh(&["start", &name, &port]))
            .await
            .expect("start task");
        rabbit
    }

    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// Stops the broker and waits until its process is gone.
    pub async fn stop(&self) {
        let name = self.name.clone();
        tokio::task::spawn_blocking(move || rabbitmq_sh(&["stop", &name]))
            .await
            .expect("stop task");
    }

    /// Starts it again on the same port, with the same (durable) state.
    pub async fn start_again(&self) {
        let (name, port) = (self.name.clone(), self.port.to_string());
        tokio::task::spawn_blocking(move || rabbitmq_sh(&["start", &name, &port]))
            .await
            .expect("start task");
    }

    /// Waits (`timeout` at most) until `queue` holds `at_least` messages, on a connection of
    /// its own (one opened before a restart is gone); returns how many it holds.
    pub async fn wait_depth(&self, queue: &str, at_least: u32, timeout: Duration) -> u32 {
        let client = Client::connect_to(&self.url()).await;
        wait_for(
            &format!("{at_least} messages in the sink"),
            timeout,
            || async {
                let n = queue_depth(&client, queue).await;
                (n >= at_least).then_some(n)
            },
        )
        .await
    }
}

impl Drop for Rabbit {
    fn drop(&mut self) {
        script_quietly("rabbitmq.sh", &["stop", &self.name]);
        let state = repo().join(".local/rabbitmq").join(&self.name);
        let _ = std::fs::remove_dir_all(state);
    }
}

/// The `carteiro` binary with a known log level.
pub fn carteiro() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_carteiro"));
    cmd.env("CARTEIRO_LOG", "info")
        .env_remove("CARTEIRO_CONFIG")
        .env_remove("CARTEIRO_FAULT")
        .stdin(Stdio::null());
    cmd
}

/// What a finished command printed.
pub struct Finished {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// A `carteiro` child process whose output is collected as it comes; killed on drop.
pub struct Running {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

fn collect(
    mut from: impl Read + Send + 'static,
    into: Arc<Mutex<String>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            if let Ok(mut text) = into.lock() {
                text.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        }
    })
}

impl Running {
    pub fn spawn(mut cmd: Command) -> Self {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn carteiro");
        let (stdout, stderr) = (Arc::default(), Arc::default());
        let readers = vec![
            collect(child.stdout.take().expect("stdout"), Arc::clone(&stdout)),
            collect(child.stderr.take().expect("stderr"), Arc::clone(&stderr)),
        ];
        Self {
            child,
            stdout,
            stderr,
            readers,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Waits for stderr to contain `needle`, failing after `timeout`.
    pub async fn wait_stderr(&mut self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.stderr().contains(needle) {
            let exited = self.child.try_wait().ok().flatten();
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "waiting for {needle:?} in stderr (exit: {exited:?}):\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits for the process to exit, failing (and killing it) after `timeout`.
    pub async fn finish(mut self, timeout: Duration) -> Finished {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!(
                    "carteiro did not exit within {timeout:?}; stderr:\n{}",
                    self.stderr()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        Finished {
            code: status.code(),
            stdout: self.stdout.lock().map(|s| s.clone()).unwrap_or_default(),
            stderr: self.stderr(),
        }
    }

    /// SIGKILLs it and returns what it printed.
    pub async fn kill(mut self) -> Finished {
        let _ = self.child.kill();
        self.finish(Duration::from_secs(10)).await
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs a short-lived `carteiro` command to completion, bounded.
pub async fn run_to_end(cmd: Command, timeout: Duration) -> Finished {
    Running::spawn(cmd).finish(timeout).await
}

/// Messages ready in `queue`.
pub async fn queue_depth(client: &Client, queue: &str) -> u32 {
    client
        .queue_state(queue)
        .await
        .unwrap_or_else(|e| panic!("passive declare of {queue}: {e}"))
        .message_count()
}

/// Deletes a queue a test left messages in, so the shared broker does not keep them.
pub async fn delete_queue(client: &Client, queue: &str) {
    client
        .channel
        .queue_delete(queue.into(), Default::default())
        .await
        .unwrap_or_else(|e| panic!("delete {queue}: {e}"));
}

/// The counter plugin's kv value (decimal text) for `key`, 0 when absent.
pub async fn counter_value(store: &carteiro::store::Store, key: &str) -> u64 {
    match store.kv_get("counter", key).await.expect("kv read") {
        Some(entry) => String::from_utf8_lossy(&entry.value)
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("counter kv {key} is not a number: {e}")),
        None => 0,
    }
}

/// The route's topology exactly as the gateway declares it.
pub fn topology_of(route: &RouteConfig) -> RouteTopology {
    route.topology()
}
