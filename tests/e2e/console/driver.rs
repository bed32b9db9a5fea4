//! A headless Chromium for the console's browser tests, driven through Debian's
//! `chromedriver` with fantoccini. Missing Chromium fails the test (CI installs it).

use crate::support::wait_listening;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Bound on starting the driver and opening a session.
const START: Duration = Duration::from_secs(60);

fn find(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path).chain([PathBuf::from("/usr/bin")]) {
        for name in names {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    None
}

/// A chromedriver process of this test (its own process group) and a browser session.
pub struct Browser {
    pub client: fantoccini::Client,
    driver: Child,
    port: u16,
    chromium: PathBuf,
}

impl Browser {
    pub async fn start() -> Self {
        let driver_bin = find(&["chromedriver"]).unwrap_or_else(|| {
            panic!(
                "chromedriver is not installed: the console's browser tests need Debian's \
                 `chromium` and `chromium-driver` (apt-get install -y chromium chromium-driver; \
                 scripts/test.sh installs them)"
            )
        });
        let chromium = find(&["chromium", "chromium-browser"]).unwrap_or_else(|| {
            panic!(
                "chromium is not installed: apt-get install -y chromium chromium-driver \
                 (scripts/test.sh installs them)"
            )
        });
        let port = crate::live::free_port();
        let mut cmd = Command::new(&driver_bin);
        cmd.arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let driver = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", driver_bin.display()));
        let mut browser_holder = Holder(Some(driver));
        wait_listening("chromedriver to listen", port, START).await;
        let client = new_session(port, &chromium).await;
        Self {
            client,
            driver: browser_holder.0.take().expect("driver"),
            port,
            chromium,
        }
    }

    /// Another session on the same driver (no cached credentials).
    pub async fn another_session(&self) -> fantoccini::Client {
        new_session(self.port, &self.chromium).await
    }

    /// Ends the session and the driver.
    pub async fn close(self) {
        let client = self.client.clone();
        let _ = tokio::time::timeout(Duration::from_secs(20), client.close()).await;
    }

    /// Saves a PNG of the page into `$CARTEIRO_CONSOLE_SCREENSHOTS/NAME.png`, when set.
    pub async fn screenshot(client: &fantoccini::Client, name: &str) {
        let Some(dir) = std::env::var_os("CARTEIRO_CONSOLE_SCREENSHOTS") else {
            return;
        };
        let png = client.screenshot().await.expect("screenshot");
        let path = Path::new(&dir).join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
}

/// Kills the driver's process group if a start fails half-way.
struct Holder(Option<Child>);

impl Drop for Holder {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            kill_group(child);
        }
    }
}

fn kill_group(child: &mut Child) {
    // chromedriver was started as the leader of a process group of its own (its id is the
    // group's), which the Chromium it starts joins: that group, by id, and nothing else.
    // `--` keeps `kill` from reading the negative id as an option.
    let group = child.id();
    if group > 1 && matches!(child.try_wait(), Ok(None)) {
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{group}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Browser {
    fn drop(&mut self) {
        kill_group(&mut self.driver);
    }
}

async fn new_session(port: u16, chromium: &Path) -> fantoccini::Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": chromium.display().to_string(),
            // `*.evil.example` resolves to loopback: a DNS-rebinding page, for the Host
            // allow-list's browser test.
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1400,1000",
                     "--host-resolver-rules=MAP *.evil.example 127.0.0.1"],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let url = format!("http://127.0.0.1:{port}");
    let mut builder = fantoccini::ClientBuilder::new(connector);
    builder.capabilities(caps);
    match tokio::time::timeout(START, builder.connect(&url)).await {
        Ok(Ok(client)) => client,
        Ok(Err(e)) => panic!("cannot open a Chromium session through chromedriver: {e}"),
        Err(_) => panic!("opening a Chromium session timed out after {START:?}"),
    }
}
