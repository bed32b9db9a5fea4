//! Tests of `plugin new` and the vendored SDK (`cli::scaffold`, `cli::sdk`).

use super::*;
use std::collections::BTreeMap;

const LANGS: [Lang; 3] = [Lang::Rust, Lang::Python, Lang::Js];

/// The repository carteiro is built from: no generated file may mention it.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn new_project(parent: &Path, name: &str, lang: Lang) -> PathBuf {
    create(&NewArgs {
        name: name.into(),
        lang,
        dir: parent.to_path_buf(),
        sdk_path: None,
    })
    .unwrap_or_else(|e| panic!("plugin new --lang {lang}: {e:#}"))
}

/// Every file under `dir`, by path relative to it.
fn files(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let relative = path.strip_prefix(root).expect("under root").to_path_buf();
                out.insert(relative, std::fs::read(&path).expect("read"));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn text(files: &BTreeMap<PathBuf, Vec<u8>>, path: &str) -> String {
    let bytes = files
        .get(Path::new(path))
        .unwrap_or_else(|| panic!("{path} was not written; have {:?}", files.keys()));
    String::from_utf8(bytes.clone()).expect("UTF-8")
}

/// Asserts that the project of `lang` (its `written` files) has each of `paths`.
fn assert_has(written: &BTreeMap<PathBuf, Vec<u8>>, lang: Lang, paths: &[&str]) {
    for path in paths {
        assert!(written.contains_key(Path::new(path)), "{lang}: {path}");
    }
}

#[test]
fn no_generated_file_points_at_this_machine() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo_paths = [
        repo().display().to_string(),
        repo().canonicalize().expect("repo").display().to_string(),
        env!("CARGO_MANIFEST_DIR").to_owned(),
    ];
    for lang in LANGS {
        let root = new_project(dir.path(), &format!("greeter-{lang}"), lang);
        let written = files(&root);
        assert!(written.len() > 10, "{lang}: only {:?}", written.keys());
        for (path, contents) in &written {
            let contents = String::from_utf8_lossy(contents);
            for repo_path in &repo_paths {
                assert!(
                    !contents.contains(repo_path.as_str()),
                    "{lang}: {} mentions {repo_path}",
                    path.display()
                );
            }
            // The vendored SDK is copied verbatim (its docs may show `{{` in Rust code).
            assert!(
                path.starts_with("vendor") || !contents.contains("{{"),
                "{lang}: {} has an unfilled placeholder",
                path.display()
            );
            assert!(
                !path.to_string_lossy().ends_with(".tmpl"),
                "{}",
                path.display()
            );
            assert!(
                !path.components().any(|c| c.as_os_str() == "__pycache__"),
                "{}",
                path.display()
            );
        }
        let common = [
            "README.md",
            "message.json",
            ".gitignore",
            "vendor/README.md",
        ];
        assert_has(&written, lang, &common);
        let message: serde_json::Value =
            serde_json::from_str(&text(&written, "message.json")).expect("message.json");
        assert_eq!(message["routing_key"], format!("greeter-{lang}.in"));
        assert!(
            text(&written, "README.md").contains("carteiro plugin sdk --update"),
            "{lang}: the README says how to refresh the SDK"
        );
    }
}

#[test]
fn each_language_depends_on_its_vendored_sdk_by_a_relative_path() {
    let dir = tempfile::tempdir().expect("tempdir");

    let rust = files(&new_project(dir.path(), "greeter", Lang::Rust));
    let manifest: toml::Table = text(&rust, "Cargo.toml").parse().expect("Cargo.toml");
    assert_eq!(
        manifest["dependencies"]["carteiro-sdk"]["path"].as_str(),
        Some("vendor/carteiro-sdk")
    );
    assert!(text(&rust, "src/lib.rs").contains("export_handler!(handle);"));
    assert!(text(&rust, "src/lib.rs").contains("\"greeter.processed\""));

    let python = files(&new_project(dir.path(), "greeter-py", Lang::Python));
    let requirements = text(&python, "requirements.txt");
    assert!(
        requirements.contains("\n-e ./vendor/carteiro-py\n"),
        "{requirements}"
    );
    let pins = Pins::embedded().expect("pins");
    assert!(requirements.contains(&format!("componentize-py=={}", pins.componentize_py)));
    assert!(text(&python, "app.py").contains("@carteiro.handler"));
    assert!(text(&python, "tests/test_app.py").contains("mock_host"));

    let js = files(&new_project(dir.path(), "greeter-js", Lang::Js));
    let package: serde_json::Value =
        serde_json::from_str(&text(&js, "package.json")).expect("package.json");
    assert_eq!(package["name"], "greeter-js");
    assert_eq!(
        package["dependencies"]["carteiro-sdk"],
        "file:vendor/carteiro-sdk"
    );
    assert_eq!(
        package["devDependencies"]["@bytecodealliance/componentize-js"],
        pins.componentize_js.as_str()
    );
    assert_eq!(
        package["devDependencies"]["rolldown"],
        pins.rolldown.as_str()
    );
    assert!(text(&js, "src/handler.js").contains("export const handle = handler("));

    // Each language's vendored SDK, where its manifest points.
    assert_has(
        &rust,
        Lang::Rust,
        &[
            "vendor/carteiro-sdk/src/lib.rs",
            "vendor/carteiro-sdk/src/testing.rs",
            "vendor/carteiro-sdk/wit/handler.wit",
            "vendor/carteiro-sdk/README.md",
        ],
    );
    assert_has(
        &python,
        Lang::Python,
        &[
            "pyproject.toml",
            "vendor/carteiro-py/pyproject.toml",
            "vendor/carteiro-py/src/carteiro/__init__.py",
            "vendor/carteiro-py/src/carteiro/_host/mock.py",
            "vendor/carteiro-py/src/carteiro/py.typed",
            "vendor/wit/handler.wit",
        ],
    );
    assert_has(
        &js,
        Lang::Js,
        &[
            "test/handler.test.js",
            "vendor/carteiro-sdk/package.json",
            "vendor/carteiro-sdk/index.d.ts",
            "vendor/carteiro-sdk/src/host/mock.js",
            "vendor/carteiro-sdk/src/host/wasm.js",
            "vendor/wit/handler.wit",
        ],
    );
}

#[test]
fn the_vendored_crate_manifest_builds_outside_the_workspace() {
    let files = sdk::vendored_files(Lang::Rust).expect("files");
    let manifest = String::from_utf8(files[Path::new("vendor/carteiro-sdk/Cargo.toml")].clone())
        .expect("UTF-8");
    let parsed: toml::Table = manifest.parse().expect("TOML");
    let workspace: toml::Table = std::fs::read_to_string(repo().join("Cargo.toml"))
        .expect("workspace manifest")
        .parse()
        .expect("TOML");
    let package = &parsed["package"];
    assert_eq!(package["name"].as_str(), Some("carteiro-sdk"));
    for key in ["edition", "version", "license", "rust-version"] {
        assert_eq!(
            package.get(key),
            workspace["workspace"]["package"].get(key),
            "{key}"
        );
    }
    assert_eq!(parsed.get("lints"), workspace["workspace"].get("lints"));
    assert!(parsed["dependencies"].get("wit-bindgen").is_some());
    assert!(!manifest.contains("workspace"), "{manifest}");

    let err = sdk::standalone_manifest("[dependencies]\nserde.workspace = true\n", "[workspace]\n")
        .expect_err("a dependency inherited from the workspace");
    assert!(err.to_string().contains("serde.workspace"), "{err}");
}

/// The SDK carried in the binary is the one in the source tree (a file added to the SDK
/// after carteiro was last compiled would be missing: touch host/src/cli/sdk.rs).
#[test]
fn the_embedded_sdk_is_the_source_tree_sdk() {
    let sdk = repo().join("plugin-sdk");
    let cases = [
        (Lang::Rust, "vendor/carteiro-sdk/src", sdk.join("src")),
        (Lang::Rust, "vendor/carteiro-sdk/wit", sdk.join("wit")),
        (
            Lang::Python,
            "vendor/carteiro-py/src/carteiro",
            sdk.join("python/src/carteiro"),
        ),
        (Lang::Js, "vendor/carteiro-sdk/src", sdk.join("js/src")),
    ];
    for (lang, vendored, source) in cases {
        let embedded: BTreeMap<PathBuf, Vec<u8>> = sdk::vendored_files(lang)
            .expect("files")
            .into_iter()
            .filter_map(|(p, c)| Some((p.strip_prefix(vendored).ok()?.to_path_buf(), c)))
            .collect();
        let on_disk: BTreeMap<PathBuf, Vec<u8>> = files(&source)
            .into_iter()
            .filter(|(p, _)| !p.ancestors().any(sdk::is_byproduct))
            .collect();
        assert_eq!(
            embedded.keys().collect::<Vec<_>>(),
            on_disk.keys().collect::<Vec<_>>(),
            "{lang}: {} (touch host/src/cli/sdk.rs to re-embed it)",
            source.display()
        );
        assert!(
            embedded == on_disk,
            "{lang}: contents of {}",
            source.display()
        );
    }
}

#[test]
fn plugin_sdk_reports_and_updates_a_stale_vendored_copy() {
    let dir = tempfile::tempdir().expect("tempdir");
    for lang in LANGS {
        let root = new_project(dir.path(), &format!("old-{lang}"), lang);
        assert_eq!(
            sdk::differences(&root, lang).expect("diff"),
            Vec::<String>::new()
        );

        let wit = match lang {
            Lang::Rust => "vendor/carteiro-sdk/wit/handler.wit",
            _ => "vendor/wit/handler.wit",
        };
        std::fs::write(root.join(wit), "package old:handler;").expect("edit");
        let extra = Path::new(sdk::vendored_dirs(lang)[0]).join("dropped.txt");
        std::fs::write(root.join(&extra), "from an older SDK").expect("extra");
        // What pip leaves when it installs the vendored Python SDK is not a difference.
        let egg_info = root.join("vendor/wit/x.egg-info");
        std::fs::create_dir_all(&egg_info).expect("byproduct");
        std::fs::write(egg_info.join("PKG-INFO"), "").expect("byproduct");
        let diffs = sdk::differences(&root, lang).expect("diff");
        assert_eq!(
            diffs,
            [
                format!("differs  {wit}"),
                format!("extra    {}", extra.display())
            ],
            "{lang}"
        );

        sdk::write_vendor(&root, lang).expect("update");
        assert_eq!(
            sdk::differences(&root, lang).expect("diff"),
            Vec::<String>::new()
        );
        assert!(!root.join(&extra).exists());
        assert!(root.join("src").exists() || root.join("app.py").exists());
    }
}

#[test]
fn plugin_new_refuses_bad_names_existing_folders_and_misplaced_options() {
    let dir = tempfile::tempdir().expect("tempdir");
    let args = |name: &str, lang, sdk_path: Option<PathBuf>| NewArgs {
        name: name.into(),
        lang,
        dir: dir.path().to_path_buf(),
        sdk_path,
    };
    for name in ["", "Greeter", "1st", "a b", "../x", "-x"] {
        let err = create(&args(name, Lang::Rust, None)).expect_err(name);
        assert!(
            err.to_string().contains("not a valid project name"),
            "{err}"
        );
    }
    create(&args("taken", Lang::Js, None)).expect("first");
    let err = create(&args("taken", Lang::Python, None)).expect_err("exists");
    assert!(err.to_string().contains("already exists"), "{err}");
    let err = create(&args("py", Lang::Python, Some(repo().join("plugin-sdk")))).expect_err("");
    assert!(err.to_string().contains("Rust projects only"), "{err}");
}

#[test]
fn sdk_path_overrides_the_vendored_crate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sdk_dir = repo().join("plugin-sdk");
    let root = create(&NewArgs {
        name: "local".into(),
        lang: Lang::Rust,
        dir: dir.path().to_path_buf(),
        sdk_path: Some(sdk_dir.clone()),
    })
    .expect("created");
    let manifest: toml::Table = std::fs::read_to_string(root.join("Cargo.toml"))
        .expect("read")
        .parse()
        .expect("TOML");
    let path = sdk_dir.canonicalize().expect("canonical");
    assert_eq!(
        manifest["dependencies"]["carteiro-sdk"]["path"].as_str(),
        path.to_str()
    );
    assert!(!root.join("vendor").exists());
}

#[test]
fn placeholders_are_all_filled() {
    let vars = [("name", "x".to_owned())];
    assert_eq!(fill("a {{name}} b", &vars).expect("filled"), "a x b");
    let err = fill("a {{nmae}} b", &vars).expect_err("unknown");
    assert!(err.to_string().contains("{{nmae}}"), "{err}");
}
