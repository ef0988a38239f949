//! Helpers shared by the integration tests.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// How the test server answers the N-th request (0-based).
#[derive(Clone, Debug)]
pub enum Reply {
    /// 200 with the whole body.
    Full,
    /// Announces the full length, sends this many bytes, then drops the connection.
    DieAfter(usize),
    /// An empty response with this status.
    Status(u16),
}

/// A real HTTP/1.1 server on 127.0.0.1 serving one body.
pub struct HttpServer {
    pub url: String,
    requests: Arc<AtomicUsize>,
}

impl HttpServer {
    /// Serves `body` at `/<name>`; request N gets `plan[N]`, later ones `Reply::Full`.
    pub fn start(name: &str, body: Vec<u8>, plan: Vec<Reply>) -> HttpServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/{name}", listener.local_addr().unwrap());
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = requests.clone();
        let plan = Arc::new(Mutex::new(plan));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let n = counter.fetch_add(1, Ordering::SeqCst);
                let reply = plan.lock().unwrap().get(n).cloned().unwrap_or(Reply::Full);
                serve(stream, &body, reply);
            }
        });
        HttpServer { url, requests }
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

fn serve(mut stream: TcpStream, body: &[u8], reply: Reply) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    // Read the request head up to the blank line.
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
    }
    let _ = match reply {
        Reply::Full => {
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            stream.write_all(body)
        }
        Reply::DieAfter(n) => {
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(&body[..n.min(body.len())]);
            let _ = stream.flush();
            stream.shutdown(std::net::Shutdown::Both)
        }
        Reply::Status(code) => write!(
            stream,
            "HTTP/1.1 {code} Test\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ),
    };
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Files (not directories) under `dir`, recursively.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter_map(Result::ok)
        .filter(|e| !e.file_type().is_dir())
        .map(|e| e.path().to_path_buf())
        .collect()
}

pub fn sha256_hex(data: &[u8]) -> String {
    imgbuild::io::hashing::sha256_hex(data)
}

/// A cache shared by the tests of one checkout, so the kernel source is
/// extracted once (`target/test-cache`).
pub fn shared_cache() -> PathBuf {
    let dir = repo_root().join("target/test-cache");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A real Debian kernel (`rt`, `cloud`, `rt-arm64` or `arm64`): vmlinuz,
/// config and dummy.ko, fetched by `ci/fetch-fixtures` into
/// `target/fixtures` on first use.
pub fn debian_kernel(flavor: &str) -> PathBuf {
    let fixtures = repo_root().join("target/fixtures");
    let dir = fixtures.join(format!("debian-{flavor}"));
    if !dir.join("complete").exists() {
        let status = std::process::Command::new(repo_root().join("ci/fetch-fixtures"))
            .arg(&fixtures)
            .arg(flavor)
            .status()
            .expect("running ci/fetch-fixtures");
        assert!(
            status.success(),
            "ci/fetch-fixtures failed (is the Debian archive reachable?)"
        );
    }
    dir
}

/// Copies the repository's recipes, kernel configs and overlays into `dir`
/// so a test can add or change files beside them.
pub fn copy_project_inputs(dir: &Path) {
    for sub in ["recipes", "kernel-configs", "overlays", "live-image"] {
        let from = repo_root().join(sub);
        if !from.exists() {
            continue;
        }
        for entry in walkdir::WalkDir::new(&from) {
            let entry = entry.unwrap();
            let rel = entry.path().strip_prefix(repo_root()).unwrap();
            let to = dir.join(rel);
            if entry.file_type().is_dir() {
                std::fs::create_dir_all(&to).unwrap();
            } else if entry.file_type().is_symlink() {
                std::os::unix::fs::symlink(std::fs::read_link(entry.path()).unwrap(), &to).unwrap();
            } else {
                std::fs::copy(entry.path(), &to).unwrap();
            }
        }
    }
}

/// Appends one entry to a tar under construction.
pub fn tar_entry(
    builder: &mut tar::Builder<Vec<u8>>,
    path: &str,
    kind: tar::EntryType,
    mode: u32,
    data: &[u8],
    link: Option<&str>,
) {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(1_700_000_000);
    header.set_size(data.len() as u64);
    if kind == tar::EntryType::Char {
        header.set_device_major(1).unwrap();
        header.set_device_minor(3).unwrap();
    }
    if let Some(link) = link {
        builder.append_link(&mut header, path, link).unwrap();
    } else {
        builder.append_data(&mut header, path, data).unwrap();
    }
}

/// A small Debian-like rootfs tarball: merged /usr, /etc, /var with a dpkg
/// database, /root, a setuid binary, a device node, an absolute symlink, and a
/// static busybox standing in for ostree-prepare-root.
pub fn synthetic_rootfs_tarball(dest: &Path) {
    use tar::EntryType::{Char, Directory, Regular, Symlink};
    let busybox = std::fs::read("/bin/busybox").expect("busybox-static is installed");
    let mut b = tar::Builder::new(Vec::new());
    for dir in [
        "dev",
        "etc",
        "etc/alternatives",
        "home",
        "root",
        "usr",
        "usr/bin",
        "usr/lib",
        "usr/lib/ostree",
        "usr/local",
        "usr/local/bin",
        "var",
        "var/lib",
        "var/lib/dpkg",
        "var/log",
        "boot",
        "tmp",
        "proc",
        "sys",
        "run",
    ] {
        tar_entry(
            &mut b,
            dir,
            Directory,
            if dir == "root" { 0o700 } else { 0o755 },
            b"",
            None,
        );
    }
    tar_entry(&mut b, "bin", Symlink, 0o777, b"", Some("usr/bin"));
    tar_entry(&mut b, "lib", Symlink, 0o777, b"", Some("usr/lib"));
    tar_entry(&mut b, "dev/null", Char, 0o666, b"", None);
    tar_entry(&mut b, "etc/hostname", Regular, 0o644, b"localhost\n", None);
    tar_entry(
        &mut b,
        "etc/passwd",
        Regular,
        0o644,
        b"root:x:0:0:root:/root:/bin/sh\n",
        None,
    );
    tar_entry(
        &mut b,
        "etc/shadow",
        Regular,
        0o640,
        b"root:*:19000:0:99999:7:::\n",
        None,
    );
    tar_entry(
        &mut b,
        "etc/alternatives/awk",
        Symlink,
        0o777,
        b"",
        Some("/usr/bin/mawk"),
    );
    tar_entry(
        &mut b,
        "usr/bin/su",
        Regular,
        0o4755,
        b"\x7fELF setuid stand-in",
        None,
    );
    tar_entry(
        &mut b,
        "usr/bin/mawk",
        Regular,
        0o755,
        b"\x7fELF mawk stand-in",
        None,
    );
    tar_entry(
        &mut b,
        "usr/lib/ostree/ostree-prepare-root",
        Regular,
        0o755,
        &busybox,
        None,
    );
    tar_entry(
        &mut b,
        "var/lib/dpkg/status",
        Regular,
        0o644,
        b"Package: base-files\nStatus: install ok installed\n",
        None,
    );
    tar_entry(&mut b, "root/.profile", Regular, 0o644, b"PATH=/usr/bin\n", None);
    tar_entry(&mut b, "boot/vmlinuz-stale", Regular, 0o644, b"old kernel", None);
    std::fs::write(dest, b.into_inner().unwrap()).unwrap();
}

/// The Debian RT kernel laid out as imgbuild's kernel stage leaves it.
pub fn debian_kernel_files(flavor: &str, dir: &Path) -> imgbuild::stages::rootfs::KernelFiles {
    let fixture = debian_kernel(flavor);
    let package = std::fs::read_to_string(fixture.join("package")).unwrap();
    let release = package.trim().trim_start_matches("linux-image-").to_string();
    let modules = dir.join(format!("modules/lib/modules/{release}"));
    std::fs::create_dir_all(modules.join("kernel/drivers/net")).unwrap();
    std::fs::copy(
        fixture.join("dummy.ko"),
        modules.join("kernel/drivers/net/dummy.ko"),
    )
    .unwrap();
    imgbuild::stages::rootfs::KernelFiles {
        bzimage: fixture.join("vmlinuz"),
        config: fixture.join("config"),
        modules: Some(modules),
        release,
    }
}

/// A throwaway GPG key in its own homedir.
pub struct GpgKey {
    pub home: tempfile::TempDir,
    pub fingerprint: String,
    /// ASCII-armored public key (for `remote add --gpg-import`).
    pub public: PathBuf,
    /// A directory holding the public key as a binary keyring, the form
    /// libostree reads for `--gpg-homedir` (GnuPG's own pubring.kbx is not).
    pub keyring_dir: PathBuf,
}

/// Runs `gpg --batch ARGS` in `home`, asserts it succeeded and returns its stdout.
fn gpg_in(home: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("gpg")
        .arg("--homedir")
        .arg(home)
        .arg("--batch")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gpg {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Generates a passphrase-less ed25519 signing key `name <name@example.org>`
/// in `home`; returns its fingerprint.
fn gen_key(home: &Path, name: &str) -> String {
    let status = gpg_in(
        home,
        &[
            "--status-fd",
            "1",
            "--passphrase",
            "",
            "--quick-gen-key",
            &format!("{name} <{name}@example.org>"),
            "ed25519",
            "sign",
            "never",
        ],
    );
    let fingerprint = status
        .lines()
        .find_map(|l| l.strip_prefix("[GNUPG:] KEY_CREATED "))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or_else(|| panic!("no KEY_CREATED: {status}"))
        .to_string();
    // The key is in the keyring, as a secret key, under that fingerprint.
    let listing = gpg_in(home, &["--with-colons", "--list-secret-keys", &fingerprint]);
    assert!(
        listing
            .lines()
            .any(|l| l.starts_with("fpr:") && l.split(':').nth(9) == Some(fingerprint.as_str())),
        "{listing}"
    );
    fingerprint
}

impl GpgKey {
    pub fn generate(name: &str) -> GpgKey {
        let home = tempfile::Builder::new().prefix("gpg").tempdir_in("/tmp").unwrap();
        let gpg = |args: &[&str]| gpg_in(home.path(), args);
        let fingerprint = gen_key(home.path(), name);
        let public = home.path().join("public.asc");
        std::fs::write(&public, gpg(&["--armor", "--export", &fingerprint])).unwrap();
        let keyring_dir = home.path().join("keyring");
        std::fs::create_dir(&keyring_dir).unwrap();
        let binary = std::process::Command::new("gpg")
            .arg("--homedir")
            .arg(home.path())
            .args(["--batch", "--export", &fingerprint])
            .output()
            .unwrap();
        std::fs::write(keyring_dir.join("trusted.gpg"), binary.stdout).unwrap();
        GpgKey {
            home,
            fingerprint,
            public,
            keyring_dir,
        }
    }

    /// Generates another secret key `name` in this key's homedir; returns
    /// its fingerprint.
    pub fn add_key(&self, name: &str) -> String {
        let fingerprint = gen_key(self.home.path(), name);
        assert_ne!(fingerprint, self.fingerprint);
        fingerprint
    }
}

impl Drop for GpgKey {
    fn drop(&mut self) {
        let _ = std::process::Command::new("gpgconf")
            .arg("--homedir")
            .arg(self.home.path())
            .args(["--kill", "gpg-agent"])
            .status();
    }
}

/// A static file server on 127.0.0.1 (a real HTTP/1.1 server, one request
/// per connection) that logs each request and counts the body bytes it sent.
pub struct StaticServer {
    pub url: String,
    log: Arc<Mutex<Vec<(String, u64)>>>,
}

impl StaticServer {
    pub fn start(root: &Path) -> StaticServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let log = Arc::new(Mutex::new(Vec::new()));
        let (root, shared) = (root.to_path_buf(), log.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (root, log) = (root.clone(), shared.clone());
                std::thread::spawn(move || serve_file(stream, &root, &log));
            }
        });
        StaticServer { url, log }
    }

    /// Requests so far, as (path, body bytes sent).
    pub fn requests(&self) -> Vec<(String, u64)> {
        self.log.lock().unwrap().clone()
    }

    pub fn bytes_sent(&self) -> u64 {
        self.requests().iter().map(|(_, n)| n).sum()
    }

    pub fn reset(&self) {
        self.log.lock().unwrap().clear();
    }
}

fn serve_file(mut stream: TcpStream, root: &Path, log: &Mutex<Vec<(String, u64)>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request = String::new();
    if reader.read_line(&mut request).is_err() {
        return;
    }
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
    }
    let mut words = request.split_whitespace();
    let method = words.next().unwrap_or_default().to_string();
    let path = words
        .next()
        .unwrap_or("/")
        .split('?')
        .next()
        .unwrap_or("/")
        .to_string();
    let file = root.join(path.trim_start_matches('/'));
    let body = if path.contains("..") {
        None
    } else {
        std::fs::read(&file).ok().filter(|_| file.is_file())
    };
    match body {
        Some(body) => {
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let sent = if method == "HEAD" {
                0
            } else {
                let _ = stream.write_all(&body);
                body.len() as u64
            };
            log.lock().unwrap().push((path, sent));
        }
        None => {
            let _ = write!(
                stream,
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            log.lock().unwrap().push((path, 0));
        }
    }
}

pub const RELEASE: &str = "6.12.0";
pub const RT_UTS: &str = "#1 SMP PREEMPT_RT Sun Nov 30 00:00:00 UTC 2025";
pub const GENERIC_UTS: &str = "#1 SMP PREEMPT_DYNAMIC Sun Nov 30 00:00:00 UTC 2025";
pub const RT_CONFIG: &str = "CONFIG_PREEMPT_RT=y\nCONFIG_IKCONFIG=y\n";
pub const GENERIC_CONFIG: &str =
    "# CONFIG_PREEMPT_RT is not set\nCONFIG_PREEMPT_DYNAMIC=y\nCONFIG_IKCONFIG=y\n";

/// A synthetic kernel: a bzImage setup header with the version string and an
/// embedded config, its build config, and one module.
#[derive(Clone, Copy, PartialEq)]
pub enum Kernel {
    Rt,
    Generic,
}

impl Kernel {
    pub fn uts(self) -> &'static str {
        match self {
            Kernel::Rt => RT_UTS,
            Kernel::Generic => GENERIC_UTS,
        }
    }

    pub fn config(self) -> &'static str {
        match self {
            Kernel::Rt => RT_CONFIG,
            Kernel::Generic => GENERIC_CONFIG,
        }
    }

    pub fn image(self) -> Vec<u8> {
        let version = format!("{RELEASE} (ci@imgbuild) {}", self.uts());
        rtcheck::bzimage::synthetic::kernel(&version, Some(self.config()))
    }

    pub fn module(self) -> Vec<u8> {
        let flags = if self == Kernel::Rt { " preempt_rt" } else { "" };
        rtcheck::vermagic::synthetic::module(format!("vermagic={RELEASE} SMP{flags} mod_unload\0").as_bytes())
    }

    /// Writes `usr/lib/modules/<release>/{vmlinuz,initramfs.img,config,kernel/dummy.ko}` under `tree`.
    pub fn install(self, tree: &Path) {
        let dir = tree.join("usr/lib/modules").join(RELEASE);
        std::fs::create_dir_all(dir.join("kernel")).unwrap();
        std::fs::write(dir.join("vmlinuz"), self.image()).unwrap();
        std::fs::write(dir.join("initramfs.img"), b"initramfs").unwrap();
        std::fs::write(dir.join("config"), self.config()).unwrap();
        std::fs::write(dir.join("kernel/dummy.ko"), self.module()).unwrap();
    }

    /// The verify stage's evidence on this kernel, as the pipeline records it.
    pub fn evidence(self) -> rtcheck::Evidence {
        let dir = tempfile::tempdir().unwrap();
        self.install(dir.path());
        let kernel = dir.path().join("usr/lib/modules").join(RELEASE);
        let mut evidence = imgbuild::stages::verify::check_artifacts(
            &kernel.join("vmlinuz"),
            Some(&kernel.join("config")),
            Some(&kernel),
        )
        .unwrap();
        evidence
            .checks
            .insert(0, imgbuild::stages::verify::config_check(42, true));
        evidence
    }
}

/// A finished command's exit code, stdout and stderr, for assertion messages.
pub fn text(out: &std::process::Output) -> String {
    format!(
        "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `cmd`, asserts it succeeded (its output in the message) and returns its stdout.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("running a command");
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The ostree CLI with `args`.
pub fn ostree(args: &[&str]) -> Command {
    let mut cmd = Command::new("ostree");
    cmd.args(args);
    cmd
}

/// A real OpenSSH server on 127.0.0.1 with its own config, host key and
/// port, accepting one client key; killed when dropped. `config` is an
/// ssh_config for the client (`ssh -F`): the key, and a known_hosts holding
/// this server's host key, so host key checking stays on.
pub struct Sshd {
    child: std::process::Child,
    pub port: u16,
    pub config: PathBuf,
    pub known_hosts: PathBuf,
}

impl Drop for Sshd {
    /// The whole process group: sshd's per-connection children too.
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

impl Sshd {
    pub fn start(dir: &Path) -> Sshd {
        std::fs::create_dir_all(dir).unwrap();
        for key in ["host_key", "client_key"] {
            run(Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", key, "-f"])
                .arg(dir.join(key)));
        }
        std::fs::copy(dir.join("client_key.pub"), dir.join("authorized_keys")).unwrap();
        // sshd wants its privilege separation dir.
        std::fs::create_dir_all("/run/sshd").unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = dir.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\nPidFile {d}/sshd.pid\n\
                 AuthorizedKeysFile {d}/authorized_keys\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nStrictModes no\n\
                 UsePAM no\nLogLevel VERBOSE\n",
                d = dir.display()
            ),
        )
        .unwrap();
        let log = dir.join("sshd.log");
        let child = Command::new("/usr/sbin/sshd")
            .args(["-D", "-e", "-f"])
            .arg(&config)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .process_group(0)
            .spawn()
            .expect("sshd (Debian package openssh-server, installed by ci/setup)");
        let host_key = std::fs::read_to_string(dir.join("host_key.pub")).unwrap();
        let known_hosts = dir.join("known_hosts");
        std::fs::write(&known_hosts, format!("[127.0.0.1]:{port} {host_key}")).unwrap();
        let client = dir.join("ssh_config");
        std::fs::write(
            &client,
            format!(
                "Host 127.0.0.1\n  User root\n  IdentityFile {d}/client_key\n  IdentitiesOnly yes\n\
                 UserKnownHostsFile {known}\n  StrictHostKeyChecking yes\n  LogLevel ERROR\n",
                d = dir.display(),
                known = known_hosts.display()
            ),
        )
        .unwrap();
        let started = std::time::Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(10),
                "sshd did not listen on {port}: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Sshd {
            child,
            port,
            config: client,
            known_hosts,
        }
    }

    /// `ssh://root@127.0.0.1:PORT/PATH`.
    pub fn url(&self, path: &Path) -> String {
        format!("ssh://root@127.0.0.1:{}{}", self.port, path.display())
    }
}

/// The workspace's `jitter`: `$IMGBUILD_JITTER`, else the one `cargo test
/// --workspace` builds beside the test binaries.
pub fn jitter_binary() -> PathBuf {
    imgbuild::stages::rootfs::find_jitter(rtcheck::Arch::host())
        .unwrap_or_else(|e| panic!("{e:#} (or run `cargo build -p jitter` first)"))
}

/// The workspace's `emberrtos-device` (a binary of its own crate, so no
/// `CARGO_BIN_EXE_` here): `$IMGBUILD_DEVICE_TOOL`, else the one `cargo test
/// --workspace` builds beside the test binaries.
pub fn device_binary() -> PathBuf {
    imgbuild::stages::rootfs::find_device_tool(rtcheck::Arch::host())
        .unwrap_or_else(|e| panic!("{e:#} (or run `cargo build -p emberrtos-device` first)"))
}

impl GpgKey {
    /// Signs `file` with this key: an armored detached signature at
    /// `<file>.sig`, as `imgbuild cache push --gpg-key` writes one.
    pub fn sign_file(&self, file: &Path) {
        let signature = PathBuf::from(format!("{}.sig", file.display()));
        let _ = std::fs::remove_file(&signature);
        gpg_in(
            self.home.path(),
            &[
                "--armor",
                "--local-user",
                &self.fingerprint,
                "--output",
                signature.to_str().unwrap(),
                "--detach-sign",
                file.to_str().unwrap(),
            ],
        );
    }
}

/// [`StaticServer`]'s files, except that a `.tar` body trickles out one
/// byte every `interval` (its full length announced): a server that would
/// hold a download forever.
pub struct TricklingServer {
    pub url: String,
}

impl TricklingServer {
    pub fn start(root: &Path, interval: std::time::Duration) -> TricklingServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let root = root.to_path_buf();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let root = root.clone();
                std::thread::spawn(move || {
                    let mut head = [0u8; 512];
                    let n = stream.peek(&mut head).unwrap_or(0);
                    let line = String::from_utf8_lossy(&head[..n]).into_owned();
                    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
                    match std::fs::read(root.join(path.trim_start_matches('/'))) {
                        Ok(body) if path.ends_with(".tar") && !path.contains("..") => {
                            trickle(stream, &body, interval)
                        }
                        _ => serve_file(stream, &root, &Mutex::new(Vec::new())),
                    }
                });
            }
        });
        TricklingServer { url }
    }
}

fn trickle(mut stream: TcpStream, body: &[u8], interval: std::time::Duration) {
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if stream.write_all(head.as_bytes()).is_err() {
        return;
    }
    for byte in body {
        std::thread::sleep(interval);
        if stream.write_all(&[*byte]).and_then(|()| stream.flush()).is_err() {
            return;
        }
    }
}

/// A stand-in kernel tree whose Makefile has the targets imgbuild runs and
/// builds nothing real (a `bzImage` of text), and a `standard` recipe
/// building it: the kernel stage in a second, `make` visible in its log.
pub fn standin_kernel_recipe(dir: &Path) -> PathBuf {
    const MAKEFILE: &str = "# Stand-in kernel tree: the targets imgbuild runs.\n\
.PHONY: tinyconfig olddefconfig bzImage\n\
tinyconfig:\n\tprintf 'CONFIG_STANDIN=y\\n' > $(O)/.config\n\
olddefconfig:\n\t@true\n\
bzImage:\n\t@mkdir -p $(O)/arch/x86/boot $(O)/include/config\n\
\techo '  LD      arch/x86/boot/bzImage'\n\
\tprintf 'stand-in kernel built by make\\n' > $(O)/arch/x86/boot/bzImage\n\
\techo 6.12.0-standin > $(O)/include/config/kernel.release\n\
\ttouch $(O)/System.map\n";
    let tree = dir.join("linux-standin");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::write(tree.join("Makefile"), MAKEFILE).unwrap();
    let tarball = dir.join("linux-standin.tar");
    let status = Command::new("tar")
        .arg("-C")
        .arg(dir)
        // Dated as a real source is: the kernel's date is its newest file's.
        .args([
            "--sort=name",
            "--mtime=@1764460800",
            "--owner=0",
            "--group=0",
            "-cf",
        ])
        .arg(&tarball)
        .arg("linux-standin")
        .status()
        .unwrap();
    assert!(status.success());
    let sha = sha256_hex(&std::fs::read(&tarball).unwrap());
    std::fs::write(dir.join("standin.config"), "CONFIG_STANDIN=y\n").unwrap();
    let recipe = dir.join("standin.yaml");
    std::fs::write(
        &recipe,
        format!(
            "name: standin\nversion: \"1\"\nflavor: standard\nkernel:\n  source: {{ path: linux-standin.tar, sha256: {sha} }}\n  base: tinyconfig\n  fragments: [standin.config]\nrootfs:\n  base: {{ debian: bookworm }}\nostree: {{ ref: standin/x86_64/standard }}\n"
        ),
    )
    .unwrap();
    recipe
}

/// A test certificate authority, and a server certificate it signed for
/// 127.0.0.1 (PEM).
pub struct TestPki {
    pub ca_pem: Vec<u8>,
    pub server_cert_pem: Vec<u8>,
    pub server_key_pem: Vec<u8>,
}

impl TestPki {
    pub fn generate() -> TestPki {
        use openssl::x509::extension::{
            BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName,
        };
        let (ca_key, server_key) = (ec_key(), ec_key());
        let ca_name = x509_name("imgbuild test CA");
        let mut ca = certificate_builder(&ca_name, &ca_name, &ca_key);
        ca.append_extension(BasicConstraints::new().critical().ca().build().unwrap())
            .unwrap();
        ca.append_extension(KeyUsage::new().critical().key_cert_sign().build().unwrap())
            .unwrap();
        ca.sign(&ca_key, openssl::hash::MessageDigest::sha256()).unwrap();
        let ca = ca.build();
        let mut server = certificate_builder(&x509_name("127.0.0.1"), &ca_name, &server_key);
        let san = SubjectAlternativeName::new()
            .ip("127.0.0.1")
            .build(&server.x509v3_context(Some(&ca), None))
            .unwrap();
        server.append_extension(san).unwrap();
        server
            .append_extension(ExtendedKeyUsage::new().server_auth().build().unwrap())
            .unwrap();
        server
            .sign(&ca_key, openssl::hash::MessageDigest::sha256())
            .unwrap();
        TestPki {
            ca_pem: ca.to_pem().unwrap(),
            server_cert_pem: server.build().to_pem().unwrap(),
            server_key_pem: server_key.private_key_to_pem_pkcs8().unwrap(),
        }
    }
}

fn ec_key() -> openssl::pkey::PKey<openssl::pkey::Private> {
    let group = openssl::ec::EcGroup::from_curve_name(openssl::nid::Nid::X9_62_PRIME256V1).unwrap();
    openssl::pkey::PKey::from_ec_key(openssl::ec::EcKey::generate(&group).unwrap()).unwrap()
}

fn x509_name(common_name: &str) -> openssl::x509::X509Name {
    let mut name = openssl::x509::X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", common_name).unwrap();
    name.build()
}

/// A certificate of `key` for `subject` by `issuer`, valid for a day.
fn certificate_builder(
    subject: &openssl::x509::X509Name,
    issuer: &openssl::x509::X509Name,
    key: &openssl::pkey::PKey<openssl::pkey::Private>,
) -> openssl::x509::X509Builder {
    let mut builder = openssl::x509::X509Builder::new().unwrap();
    builder.set_version(2).unwrap();
    let serial = openssl::bn::BigNum::from_u32(rand_serial()).unwrap();
    builder
        .set_serial_number(&serial.to_asn1_integer().unwrap())
        .unwrap();
    builder.set_subject_name(subject).unwrap();
    builder.set_issuer_name(issuer).unwrap();
    builder.set_pubkey(key).unwrap();
    builder
        .set_not_before(&openssl::asn1::Asn1Time::days_from_now(0).unwrap())
        .unwrap();
    builder
        .set_not_after(&openssl::asn1::Asn1Time::days_from_now(1).unwrap())
        .unwrap();
    builder
}

fn rand_serial() -> u32 {
    let mut bytes = [0u8; 4];
    openssl::rand::rand_bytes(&mut bytes).unwrap();
    u32::from_be_bytes(bytes) | 1
}

/// A real HTTPS server on 127.0.0.1 answering every request with `status`
/// (`200 OK`), `headers` (each `Name: value`) and one body.
pub struct HttpsServer {
    pub url: String,
}

impl HttpsServer {
    pub fn start(pki: &TestPki, status: &str, body: Vec<u8>, headers: &[&str]) -> HttpsServer {
        let identity = native_tls::Identity::from_pkcs8(&pki.server_cert_pem, &pki.server_key_pem).unwrap();
        let acceptor = Arc::new(native_tls::TlsAcceptor::new(identity).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let head = headers.iter().map(|h| format!("{h}\r\n")).collect::<String>();
        let status = status.to_string();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                // A client that refuses the certificate ends the handshake.
                let Ok(mut tls) = acceptor.accept(stream) else {
                    continue;
                };
                let mut reader = BufReader::new(&mut tls);
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                    line.clear();
                }
                let _ = write!(
                    tls,
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\n{head}Connection: close\r\n\r\n",
                    body.len()
                );
                let _ = tls.write_all(&body);
            }
        });
        HttpsServer { url }
    }
}
