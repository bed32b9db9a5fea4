//! Issue 23 §1: the real `carteiro` binary over TLS to a PostgreSQL with `ssl = on` and a
//! RabbitMQ with a TLS listener, both on certificates this test makes with `openssl`.
//! - `end_to_end`: a message processed and its event relayed, every connection TLS (the
//!   broker sees EXTERNAL logins by client certificate), and the CLI over the same settings;
//! - `refusals`: a wrong CA, a name mismatch, and TLS required against plain servers: each
//!   refused with an error that says what to fix, nothing sent in clear.
//!
//! The servers (`scripts/postgres.sh start-tls`, `scripts/rabbitmq.sh` with a TLS listener)
//! are shared by the tests that run at the same time and stopped when the last one ends.

mod end_to_end;
mod refusals;

use crate::support::{create_database, repo, run_ok, script, script_quietly, unique};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Weak};

/// The user name in the broker's client certificate (RabbitMQ logs it in by its CN).
pub const BROKER_USER: &str = "carteiro-tls";

fn openssl(dir: &Path, args: &[&str]) {
    run_ok(
        &format!("openssl {args:?} (apt-get install openssl)"),
        Command::new("openssl").args(args).current_dir(dir),
    );
}

/// Throwaway certificates: two unrelated CAs, a server certificate for `localhost` only
/// (signed by `ca`), and client certificates for PostgreSQL (CN `postgres`) and the broker
/// (CN [`BROKER_USER`]).
pub struct Pki {
    pub dir: tempfile::TempDir,
}

impl Pki {
    fn make() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        for ca in ["ca", "other-ca"] {
            openssl(
                d,
                &[
                    "req",
                    "-x509",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-days",
                    "2",
                    "-subj",
                    &format!("/CN=carteiro test {ca}"),
                    "-keyout",
                    &format!("{ca}.key"),
                    "-out",
                    &format!("{ca}.pem"),
                    "-addext",
                    "basicConstraints=critical,CA:TRUE",
                    "-addext",
                    "keyUsage=critical,keyCertSign,cRLSign",
                ],
            );
        }
        let leaves = [
            (
                "server",
                "localhost",
                "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth",
            ),
            ("pg-client", "postgres", "extendedKeyUsage=clientAuth"),
            ("mq-client", BROKER_USER, "extendedKeyUsage=clientAuth"),
        ];
        for (name, cn, ext) in leaves {
            std::fs::write(
                d.join(format!("{name}.ext")),
                format!("basicConstraints=CA:FALSE\n{ext}\n"),
            )
            .expect("write ext");
            openssl(
                d,
                &[
                    "req",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-subj",
                    &format!("/CN={cn}"),
                    "-keyout",
                    &format!("{name}.key"),
                    "-out",
                    &format!("{name}.csr"),
                ],
            );
            openssl(
                d,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &format!("{name}.csr"),
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-out",
                    &format!("{name}.pem"),
                    "-extfile",
                    &format!("{name}.ext"),
                ],
            );
        }
        Self { dir }
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// Copies `files` into `dest` (a config folder, so configs can name them relatively).
    pub fn copy_to(&self, dest: &Path, files: &[&str]) {
        for f in files {
            std::fs::copy(self.path(f), dest.join(f)).expect("copy certificate");
        }
    }
}

fn free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// A free port for PostgreSQL.
fn free_pg_port() -> u16 {
    (0..500)
        .map(|_| 56_100 + rand::random_range(0..800u16))
        .find(|p| free(*p))
        .expect("a free port")
}

/// A port `p` with `p`, `p + 1` (TLS) and `p + 20000` (the Erlang distribution port
/// scripts/rabbitmq.sh derives) free.
fn free_mq_ports() -> u16 {
    (0..500)
        .map(|_| 6_300 + rand::random_range(0..400u16) * 2)
        .find(|p| free(*p) && free(p + 1) && free(p + 20000))
        .expect("free ports")
}

/// PostgreSQL with `ssl = on` (TLS with a client certificate only) and RabbitMQ with a
/// plain listener (for the test's own client) beside a TLS one (`verify_peer`, EXTERNAL).
pub struct Servers {
    pub pki: Pki,
    pg_name: String,
    pub pg_port: u16,
    mq_name: String,
    pub mq_plain_port: u16,
    pub mq_tls_port: u16,
}

impl Servers {
    fn start() -> Self {
        let pki = Pki::make();
        let pg_name = unique("pg-tls");
        let pg_port = free_pg_port();
        let mq_name = unique("mq-tls");
        let mq_plain_port = free_mq_ports();
        let servers = Self {
            pki,
            pg_name,
            pg_port,
            mq_name,
            mq_plain_port,
            mq_tls_port: mq_plain_port + 1,
        };
        let certs = servers.pki.dir.path().display().to_string();
        script(
            "postgres.sh",
            &["start-tls", &servers.pg_name, &pg_port.to_string(), &certs],
            &[],
        );
        let conf = format!(
            "listeners.ssl.1 = 127.0.0.1:{tls}\n\
             ssl_options.cacertfile = {certs}/ca.pem\n\
             ssl_options.certfile = {certs}/server.pem\n\
             ssl_options.keyfile = {certs}/server.key\n\
             ssl_options.verify = verify_peer\n\
             ssl_options.fail_if_no_peer_cert = false\n\
             ssl_cert_login_from = common_name\n\
             auth_mechanisms.1 = EXTERNAL\n\
             auth_mechanisms.2 = PLAIN\n\
             auth_mechanisms.3 = AMQPLAIN",
            tls = servers.mq_tls_port,
        );
        script(
            "rabbitmq.sh",
            &["start", &servers.mq_name, &mq_plain_port.to_string()],
            &[
                ("CARTEIRO_RABBITMQ_CONF_EXTRA", conf),
                (
                    "CARTEIRO_RABBITMQ_PLUGINS",
                    "rabbitmq_auth_mechanism_ssl".into(),
                ),
                ("CARTEIRO_RABBITMQ_START_TIMEOUT", "90".into()),
            ],
        );
        // The client certificate's CN is the user; it needs no password.
        servers.ctl(&["add_user", BROKER_USER, &unique("unused-password")]);
        servers.ctl(&["set_permissions", "-p", "/", BROKER_USER, ".*", ".*", ".*"]);
        servers
    }

    /// `rabbitmqctl ARGS` on the TLS broker; its last line of output.
    pub fn ctl(&self, args: &[&str]) -> String {
        let mut all = vec!["ctl", self.mq_name.as_str()];
        all.extend_from_slice(args);
        script("rabbitmq.sh", &all, &[])
    }

    /// `rabbitmqctl list_connections ARGS` on the TLS broker, one line per connection.
    pub fn connections(&self, columns: &[&str]) -> Vec<String> {
        let mut cmd = Command::new("bash");
        cmd.arg(repo().join("scripts/rabbitmq.sh"))
            .args([
                "ctl",
                &self.mq_name,
                "list_connections",
                "-q",
                "--no-table-headers",
            ])
            .args(columns);
        run_ok("list_connections", &mut cmd)
            .lines()
            .map(str::to_owned)
            .filter(|l| !l.trim().is_empty())
            .collect()
    }

    /// The broker's plain listener, for the test's own client.
    pub fn plain_amqp_url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.mq_plain_port)
    }

    /// The PostgreSQL URL of `database` over TLS as `postgres`: `sslmode`, `sslrootcert` and
    /// the client certificate as given (paths may be relative to a config file).
    pub fn pg_url(&self, host: &str, database: &str, params: &str) -> String {
        format!(
            "postgres://postgres@{host}:{}/{database}?{params}",
            self.pg_port
        )
    }

    /// The PostgreSQL URL with every TLS parameter absolute, for the test's own queries.
    pub fn pg_admin_url(&self, database: &str) -> String {
        let p = |f: &str| self.pki.path(f).display().to_string();
        self.pg_url(
            "localhost",
            database,
            &format!(
                "sslmode=verify-full&sslrootcert={}&sslcert={}&sslkey={}",
                p("ca.pem"),
                p("pg-client.pem"),
                p("pg-client.key")
            ),
        )
    }

    /// A fresh database on the TLS server; returns its name.
    pub async fn database(&self) -> String {
        create_database(&self.pg_admin_url("postgres"), "tls").await
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        script_quietly("rabbitmq.sh", &["stop", &self.mq_name]);
        script_quietly("postgres.sh", &["stop", &self.pg_name]);
        let _ = std::fs::remove_dir_all(repo().join(".local/rabbitmq").join(&self.mq_name));
        let pg = repo().join(".local/postgres").join(&self.pg_name);
        let _ = std::fs::remove_dir_all(&pg);
        let _ = std::fs::remove_file(pg.with_extension("initdb.log"));
    }
}

/// The servers, started by the first test that asks and stopped when no test holds them.
pub async fn servers() -> Arc<Servers> {
    static SHARED: tokio::sync::Mutex<Weak<Servers>> = tokio::sync::Mutex::const_new(Weak::new());
    let mut slot = SHARED.lock().await;
    if let Some(servers) = slot.upgrade() {
        return servers;
    }
    let servers = Arc::new(
        tokio::task::spawn_blocking(Servers::start)
            .await
            .expect("start the TLS servers"),
    );
    *slot = Arc::downgrade(&servers);
    servers
}
