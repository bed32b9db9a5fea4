//! `carteiro plugin new` for each language, then the new project's own native tests, then
//! `carteiro plugin build`, then `carteiro plugin test --expect ack` on the component it
//! built — all with the real binary, as an author outside this repository would, in a
//! temporary folder. The toolchains are the ones `scripts/build-lang-plugins.sh` installs
//! (`.local/py`, `node_modules`; `scripts/test.sh` runs it first): a missing one fails the
//! test, never skips it. One component build per language in the whole suite.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("repository folder")
}

/// The version `file` pins after `prefix` (`componentize-py==`, `"rolldown": "`).
fn pinned(file: &str, prefix: &str) -> String {
    let text = std::fs::read_to_string(repo().join(file)).expect("pin file");
    let start = text.find(prefix).map(|i| i + prefix.len());
    let rest = &text[start.unwrap_or_else(|| panic!("{file} pins no {prefix}"))..];
    rest.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '-')
        .collect()
}

/// What a finished command printed.
struct Ran {
    success: bool,
    stdout: String,
    stderr: String,
}

/// Runs `cmd` in a process group of its own, its output in files (no pipe can fill up),
/// and kills the whole group (cargo, rustc, node, ...) if it outlives `limit`.
fn run(what: &str, cmd: &mut Command, limit: Duration) -> Ran {
    use std::os::unix::process::CommandExt;
    let logs = tempfile::tempdir().expect("tempdir");
    let (out, err) = (logs.path().join("stdout"), logs.path().join("stderr"));
    cmd.stdin(Stdio::null())
        .stdout(File::create(&out).expect("stdout file"))
        .stderr(File::create(&err).expect("stderr file"))
        .process_group(0);
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}"));
    let started = Instant::now();
    let deadline = started + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = Command::new("kill")
                .args(["-KILL", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("{what}: {:.1?}", started.elapsed());
    let stdout = std::fs::read_to_string(&out).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    let Some(status) = status else {
        panic!("{what}: still running after {limit:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}");
    };
    Ran {
        success: status.success(),
        stdout,
        stderr,
    }
}

/// [`run`], failing the test unless the command succeeds.
fn ok(what: &str, cmd: &mut Command, limit: Duration) -> Ran {
    let ran = run(what, cmd, limit);
    assert!(
        ran.success,
        "{what} failed\n--- stdout\n{}\n--- stderr\n{}",
        ran.stdout, ran.stderr
    );
    ran
}

/// The `carteiro` binary under test, with none of the environment that steers a build, and
/// its compiled-component cache in the repository's target folder (not the user's).
fn carteiro() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_carteiro"));
    cmd.env("CARTEIRO_LOG", "warn")
        .env("XDG_CACHE_HOME", repo().join("target/scaffold-e2e/cache"))
        .env_remove("CARTEIRO_JS_TOOLCHAIN")
        .env_remove("VIRTUAL_ENV");
    cmd
}

/// `carteiro plugin new NAME --lang LANG` into `parent`; returns the project folder.
fn plugin_new(parent: &Path, name: &str, lang: &str) -> PathBuf {
    ok(
        "carteiro plugin new",
        carteiro()
            .args(["plugin", "new", name, "--lang", lang, "--dir"])
            .arg(parent),
        Duration::from_secs(30),
    );
    let root = parent.join(name);
    assert!(root.join("README.md").is_file() && root.join("message.json").is_file());
    root
}

/// `carteiro plugin build` in `root`: the component's path, the last line of its stdout.
fn plugin_build(root: &Path, cmd: &mut Command) -> PathBuf {
    let built = ok(
        "carteiro plugin build",
        cmd.args(["plugin", "build"]).current_dir(root),
        Duration::from_secs(900),
    );
    let wasm = PathBuf::from(built.stdout.lines().last().unwrap_or_default().trim());
    let header = std::fs::read(&wasm)
        .unwrap_or_else(|e| panic!("plugin build printed {wasm:?}, not a file: {e}"));
    assert!(
        header.starts_with(&[0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00]),
        "{} is not a component",
        wasm.display()
    );
    wasm
}

/// `carteiro plugin test WASM --message message.json --expect ack`, and its effects.
fn plugin_test_acks(root: &Path, wasm: &Path, name: &str) {
    let ran = ok(
        "carteiro plugin test",
        carteiro()
            .args(["plugin", "test"])
            .arg(wasm)
            .args(["--message", "message.json", "--expect", "ack"])
            .current_dir(root),
        Duration::from_secs(300),
    );
    for expected in [
        "verdict  ack",
        "\"count/a-1\" = 1",
        &format!("routing key \"{name}.processed\""),
    ] {
        assert!(ran.stdout.contains(expected), "{expected}:\n{}", ran.stdout);
    }
}

#[test]
fn rust_scaffold_passes_its_tests_builds_and_acks() {
    let parent = tempfile::tempdir().expect("tempdir");
    let root = plugin_new(parent.path(), "greeter-rs", "rust");
    // The versions the repository's own plugins lock (and CI already downloaded), so the
    // test needs no registry; an author's first build resolves the same requirements.
    std::fs::copy(repo().join("plugins/Cargo.lock"), root.join("Cargo.lock")).expect("lock");
    // One target folder for every run, so the SDK's dependencies build once per machine.
    let target = repo().join("target/scaffold-e2e");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());

    let tests = ok(
        "cargo test in the scaffold",
        Command::new(&cargo)
            .arg("test")
            .current_dir(&root)
            .env("CARGO_TARGET_DIR", &target),
        Duration::from_secs(900),
    );
    assert!(
        tests.stdout.contains("test result: ok. 1 passed"),
        "{}",
        tests.stdout
    );

    let wasm = plugin_build(&root, carteiro().env("CARGO_TARGET_DIR", &target));
    assert_eq!(
        wasm,
        target.join("wasm32-wasip2/release/greeter_rs.wasm"),
        "cargo's output"
    );
    plugin_test_acks(&root, &wasm, "greeter-rs");
}

#[test]
fn python_scaffold_passes_its_tests_builds_and_acks() {
    let venv = repo().join(".local/py/bin");
    for tool in ["python", "componentize-py"] {
        assert!(
            venv.join(tool).is_file(),
            "{} is missing: run scripts/build-lang-plugins.sh (it installs the Python toolchain)",
            venv.join(tool).display()
        );
    }
    let parent = tempfile::tempdir().expect("tempdir");
    let root = plugin_new(parent.path(), "greeter-py", "python");

    // `pip install ./vendor/carteiro-py`, into a folder of the test's own: the shared venv
    // keeps its editable SDK. Offline: the toolchain has the SDK's build backend.
    let site = parent.path().join("site");
    ok(
        "pip install ./vendor/carteiro-py",
        Command::new(venv.join("python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args([
                "--no-deps",
                "--no-build-isolation",
                "--no-index",
                "--target",
            ])
            .arg(&site)
            .arg("./vendor/carteiro-py")
            .current_dir(&root),
        Duration::from_secs(180),
    );
    let python = |args: &[&str]| {
        let mut cmd = Command::new(venv.join("python"));
        cmd.args(args)
            .current_dir(&root)
            .env("PYTHONPATH", &site)
            .env("PYTHONDONTWRITEBYTECODE", "1");
        cmd
    };
    let imported = ok(
        "python -c 'import carteiro'",
        &mut python(&["-c", "import carteiro; print(carteiro.__file__)"]),
        Duration::from_secs(60),
    );
    assert!(
        Path::new(imported.stdout.trim()).starts_with(&site),
        "the tests must use the vendored SDK, not {}",
        imported.stdout
    );
    let tests = ok(
        "pytest in the scaffold",
        &mut python(&["-m", "pytest", "-q", "-p", "no:cacheprovider"]),
        Duration::from_secs(180),
    );
    assert!(tests.stdout.contains("1 passed"), "{}", tests.stdout);

    // Without componentize-py, the error names it and the command that installs it.
    let no_tools = tempfile::tempdir().expect("tempdir");
    let missing = run(
        "carteiro plugin build without componentize-py",
        carteiro()
            .args(["plugin", "build"])
            .current_dir(&root)
            .env("PATH", no_tools.path()),
        Duration::from_secs(60),
    );
    assert!(!missing.success);
    assert!(
        missing.stderr.contains("componentize-py not found")
            && missing.stderr.contains(&format!(
                "`pip install componentize-py=={}`",
                pinned("scripts/lang/requirements.txt", "componentize-py==")
            )),
        "{}",
        missing.stderr
    );

    let path = std::env::join_paths(std::iter::once(venv.clone()).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .expect("PATH");
    let wasm = plugin_build(&root, carteiro().env("PATH", path));
    assert_eq!(wasm, root.join("build/greeter-py.wasm"));
    plugin_test_acks(&root, &wasm, "greeter-py");
}

#[test]
fn js_scaffold_passes_its_tests_builds_and_acks() {
    let toolchain = repo().join("node_modules");
    assert!(
        toolchain
            .join("@bytecodealliance/componentize-js/package.json")
            .is_file(),
        "{} has no ComponentizeJS: run scripts/build-lang-plugins.sh (it runs npm ci)",
        toolchain.display()
    );
    let parent = tempfile::tempdir().expect("tempdir");
    let root = plugin_new(parent.path(), "greeter-js", "js");

    // Links the vendored SDK; the build toolchain (devDependencies) is the repository's.
    ok(
        "npm install in the scaffold",
        Command::new("npm")
            .args(["install", "--omit=dev", "--prefer-offline"])
            .args(["--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(&root),
        Duration::from_secs(300),
    );
    let linked = std::fs::canonicalize(root.join("node_modules/carteiro-sdk")).expect("linked");
    assert_eq!(
        linked,
        root.join("vendor/carteiro-sdk")
            .canonicalize()
            .expect("vendor")
    );
    let tests = ok(
        "node --test in the scaffold",
        Command::new("node")
            .args(["--test", "--test-reporter=spec", "--test-timeout=60000"])
            .current_dir(&root),
        Duration::from_secs(180),
    );
    assert!(
        tests.stdout.contains("pass 1") && tests.stdout.contains("fail 0"),
        "{}",
        tests.stdout
    );

    // Without the toolchain, the error names the packages and the command that installs them.
    let missing = run(
        "carteiro plugin build without ComponentizeJS",
        carteiro().args(["plugin", "build"]).current_dir(&root),
        Duration::from_secs(60),
    );
    assert!(!missing.success);
    let install = format!(
        "npm install --save-dev @bytecodealliance/componentize-js@{}",
        pinned("package.json", "\"@bytecodealliance/componentize-js\": \"")
    );
    assert!(missing.stderr.contains(&install), "{}", missing.stderr);

    let wasm = plugin_build(&root, carteiro().env("CARTEIRO_JS_TOOLCHAIN", &toolchain));
    assert_eq!(wasm, root.join("build/greeter-js.wasm"));
    plugin_test_acks(&root, &wasm, "greeter-js");
}
