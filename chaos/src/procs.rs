//! The `carteiro` processes under test: gateways (`carteiro run`) and relays
//! (`carteiro relay`), each logging to its own file in the run folder.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::services::signal;

/// One supervised `carteiro` process.
pub struct Proc {
    /// `gateway-1`, `relay-2`, ...
    pub name: String,
    args: Vec<String>,
    binary: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    /// Times it was started (1 = never restarted).
    pub starts: u32,
}

impl Proc {
    /// Starts `carteiro <command> -c <config>`.
    pub fn spawn(
        binary: &Path,
        command: &str,
        name: &str,
        config: &Path,
        dir: &Path,
    ) -> anyhow::Result<Self> {
        let mut proc = Self {
            name: name.to_owned(),
            args: vec![
                command.to_owned(),
                "-c".into(),
                config.display().to_string(),
            ],
            binary: binary.to_owned(),
            log: dir.join(format!("{name}.log")),
            child: None,
            starts: 0,
        };
        proc.start()?;
        Ok(proc)
    }

    pub fn pid(&self) -> Option<String> {
        self.child.as_ref().map(|c| c.id().to_string())
    }

    /// (Re)starts it; its output is appended to its log.
    pub fn start(&mut self) -> anyhow::Result<()> {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(&self.binary)
            .args(&self.args)
            .env(
                "CARTEIRO_LOG",
                std::env::var("CARTEIRO_CHAOS_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {} ({})", self.name, self.binary.display()))?;
        self.child = Some(child);
        self.starts += 1;
        Ok(())
    }

    /// SIGKILL, and reap it.
    pub fn kill(&mut self) -> anyhow::Result<()> {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        Ok(())
    }

    pub fn pause(&self) -> anyhow::Result<()> {
        self.signal("STOP")
    }

    pub fn resume(&self) -> anyhow::Result<()> {
        self.signal("CONT")
    }

    fn signal(&self, sig: &str) -> anyhow::Result<()> {
        match self.pid() {
            Some(pid) => signal(sig, &pid),
            None => Ok(()),
        }
    }

    /// Exited on its own (a crash the campaign did not cause)?
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub fn terminate(&mut self, grace: Duration) {
        let _ = self.resume();
        let _ = self.signal("TERM");
        let deadline = Instant::now() + grace;
        if let Some(child) = self.child.as_mut() {
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    self.child = None;
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let _ = self.kill();
    }

    /// The last `n` lines of its log.
    pub fn tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.resume();
        let _ = self.kill();
    }
}
