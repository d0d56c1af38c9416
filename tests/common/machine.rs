//! A Debian tree booted by `systemd-nspawn --boot`: a live systemd as PID 1
//! of its own pid, mount and network namespaces, so the `systemctl`, the
//! journal and the nftables a test drives are the machine's, never the
//! host's. The tree (minbase + systemd, dbus, nftables, of the host's Debian
//! release so the built binary's libc fits) is built once by debootstrap and
//! cached under target/ ([`tree`]); every [`Machine`] boots it with
//! `--volatile=overlay` (all writes land in a tmpfs that goes with it) and
//! `--private-network`. Commands run inside through nsenter(1), each bounded
//! by timeout(1). nspawn runs as PID 1 of a pid namespace of its own
//! (`unshare --pid --kill-child`), so killing that one process ends the
//! machine whole: Drop does, also when the test panics, then removes the
//! machine's cgroups and temp dir; and a test process killed outright takes
//! its machines along (the kernel's parent-death signal).

use super::{kill_and_reap, read_lossy, require, require_root, signal, wait_exit};
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Once, OnceLock};
use std::thread;
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// What debootstrap adds to minbase: PID 1, the bus logind wants (so the
/// machine boots clean, not degraded), nft.
const INCLUDE: &str = "systemd,dbus,nftables";
/// Part of the cached tree's name: change it when `INCLUDE` or the set-up
/// changes, so a stale cache is not used.
const TREE_TAG: &str = "v1";
/// Written into the tree once debootstrap has succeeded: a tree without it
/// is not used.
const MARK: &str = ".fleetban-test-tree";
/// The longest a tree build may take (it downloads ~60 MB of packages;
/// ~90 s on the test machines).
const BUILD_LIMIT: Duration = Duration::from_secs(600);
/// The longest a machine may take to boot (~1 s).
const BOOT_LIMIT: Duration = Duration::from_secs(60);
/// The longest one command inside may run.
pub const COMMAND_LIMIT: Duration = Duration::from_secs(30);
/// The Debian mirror debootstrap reads, unless `FLEETBAN_DEBIAN_MIRROR`.
const MIRROR: &str = "http://deb.debian.org/debian";
/// Where nspawn leaves a directory per machine on a /run that is not tmpfs.
const PROPAGATE: &str = "/run/systemd/nspawn/propagate";
/// PATH inside, as systemd sets it for services.
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

static COUNTER: AtomicU32 = AtomicU32::new(0);
static SWEEP: Once = Once::new();

/// The cached tree, built on first use (one build per target dir; later
/// runs find it). Panics, with debootstrap's log, if it cannot be built.
pub fn tree() -> PathBuf {
    static TREE: OnceLock<PathBuf> = OnceLock::new();
    TREE.get_or_init(build_tree).clone()
}

/// The host's Debian codename (`VERSION_CODENAME`), bookworm if unknown.
fn codename() -> String {
    fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
                .map(|v| v.trim_matches('"').to_owned())
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "bookworm".to_owned())
}

fn build_tree() -> PathBuf {
    require_root("building the systemd test tree");
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("systemd-tree");
    let suite = codename();
    let tree = base.join(format!("{suite}-{TREE_TAG}"));
    if tree.join(MARK).is_file() {
        return tree;
    }
    fs::create_dir_all(&base).unwrap_or_else(|e| panic!("create {}: {e}", base.display()));
    let partial_prefix = format!("{suite}-{TREE_TAG}.partial-");
    sweep_partial_trees(&base, &partial_prefix);
    // Built beside the final name and renamed at the end: a tree is there
    // whole or not at all, whoever else builds one meanwhile.
    let partial = base.join(format!("{partial_prefix}{}", std::process::id()));
    remove_tree(&partial);
    let mirror = std::env::var("FLEETBAN_DEBIAN_MIRROR").unwrap_or_else(|_| MIRROR.to_owned());
    let log_path = base.join(format!("debootstrap-{}.log", std::process::id()));
    let log = fs::File::create(&log_path).expect("create the debootstrap log");
    eprintln!(
        "building the systemd test tree: debootstrap {suite} from {mirror} into {} (once per target dir)",
        tree.display()
    );
    let started = Instant::now();
    let mut child = Command::new(require("debootstrap"))
        .args(["--variant=minbase", &format!("--include={INCLUDE}")])
        // Named, so a missing keyring fails instead of skipping the check.
        .arg("--keyring=/usr/share/keyrings/debian-archive-keyring.gpg")
        .arg(&suite)
        .arg(&partial)
        .arg(&mirror)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clone the log's descriptor"))
        .stderr(log)
        // Its own group, so a timeout kills dpkg and wget with it.
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn debootstrap: {e}"));
    let finished = wait_exit(&mut child, BUILD_LIMIT);
    if !finished {
        if let Ok(pgid) = libc::pid_t::try_from(child.id()) {
            // SAFETY: kill(2) with a negative pid signals that process group; plain integers.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
        kill_and_reap(&mut child);
    }
    let ok = finished && child.wait().map(|s| s.success()).unwrap_or(false);
    if !ok {
        remove_tree(&partial);
        let text = read_lossy(&log_path);
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        panic!(
            "debootstrap {suite} {} (limit {BUILD_LIMIT:?}); last lines of {}:\n{}",
            if finished { "failed" } else { "timed out" },
            log_path.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    // The downloaded packages are not needed to boot.
    if let Ok(entries) = fs::read_dir(partial.join("var/cache/apt/archives")) {
        for e in entries.flatten() {
            if e.path().extension().is_some_and(|x| x == "deb") {
                let _ = fs::remove_file(e.path());
            }
        }
    }
    fs::write(partial.join(MARK), format!("{suite} minbase +{INCLUDE}\n")).expect("mark the tree");
    if let Err(e) = fs::rename(&partial, &tree) {
        remove_tree(&partial);
        assert!(
            tree.join(MARK).is_file(),
            "rename the tree into {}: {e}",
            tree.display()
        );
    }
    let _ = fs::remove_file(&log_path);
    eprintln!("systemd test tree built in {:.0?}", started.elapsed());
    tree
}

/// Removes the half-built trees of test runs that are gone.
fn sweep_partial_trees(base: &Path, prefix: &str) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(prefix).and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            eprintln!("removing a stale partial tree {name}");
            remove_tree(&e.path());
        }
    }
}

/// Unmounts whatever is mounted under `dir` (debootstrap mounts /proc and
/// /sys inside the tree while it works), then removes it.
fn remove_tree(dir: &Path) {
    if !dir.exists() {
        return;
    }
    let mut mounts: Vec<PathBuf> = fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(m.replace("\\040", " ")))
        .filter(|m| m.starts_with(dir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.as_os_str().len()));
    for m in mounts {
        if let Ok(c) = CString::new(m.as_os_str().as_bytes()) {
            // SAFETY: umount2 takes a valid NUL-terminated path and a flag.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
    if let Err(e) = fs::remove_dir_all(dir) {
        eprintln!("could not remove {}: {e}", dir.display());
    }
}

/// A booted machine. Dropping it stops it and removes everything it left.
pub struct Machine {
    /// `fbt-<pid>-<n>`: the machine's name, and its cgroups'.
    pub name: String,
    /// unshare(1), our child: its child, systemd-nspawn, is PID 1 of a
    /// pid namespace holding the machine's.
    unshare: Child,
    /// The machine's PID 1 as the host sees it; 0 until found.
    leader: u32,
    /// The cgroup nspawn runs in, one per hierarchy systemd uses: nspawn
    /// splits it into `payload` and `supervisor`, so each machine needs its
    /// own.
    cgroups: Vec<PathBuf>,
    /// Holds nspawn's output, the machine's console (`console.log`).
    dir: TempDir,
}

impl Machine {
    /// Boots the cached [`tree`] with `binds` (host path, path inside)
    /// mounted read-only, and waits until systemd has finished starting up.
    /// The machine lives no longer than the thread that boots it (the
    /// parent-death signal is the thread's).
    pub fn boot(binds: &[(&Path, &str)]) -> Machine {
        require_root("Machine::boot");
        let tree = tree();
        SWEEP.call_once(sweep_stale_cgroups);
        let name = format!("fbt-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        let dir = tempfile::Builder::new()
            .prefix("fbt-machine-")
            .tempdir()
            .expect("create the machine's temp dir");
        let console = fs::File::create(dir.path().join("console.log")).expect("create console.log");
        let cgroups = create_cgroups(&name);

        let mut cmd = Command::new(require("unshare"));
        cmd.args(["--pid", "--fork", "--kill-child", "--mount-proc", "--"])
            .arg(require("systemd-nspawn"))
            .arg("--directory")
            .arg(&tree)
            .arg(format!("--machine={name}"))
            .args([
                "--boot",
                "--volatile=overlay",
                "--private-network",
                // No systemd on the host to register with or to ask for a scope.
                "--register=no",
                "--keep-unit",
                "--console=pipe",
            ]);
        for (host, inside) in binds {
            let host = host.to_str().expect("a bind's host path is UTF-8");
            assert!(
                !host.contains(':') && !inside.contains(':'),
                "nspawn binds cannot hold ':'"
            );
            cmd.arg(format!("--bind-ro={host}:{inside}"));
        }
        cmd.stdin(Stdio::null())
            .stdout(console.try_clone().expect("clone the console's descriptor"))
            .stderr(console);
        let procs: Vec<CString> = cgroups
            .iter()
            .map(|c| CString::new(c.join("cgroup.procs").as_os_str().as_bytes()).expect("a cgroup path"))
            .collect();
        // SAFETY: between fork and exec the closure only calls open, write,
        // close and prctl on memory prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                for p in &procs {
                    let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                    let err = std::io::Error::last_os_error();
                    libc::close(fd);
                    if n != 1 {
                        return Err(err);
                    }
                }
                // A test process killed outright takes its machines along.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let unshare = match cmd.spawn() {
            Ok(child) => child,
            Err(e) => {
                for cg in &cgroups {
                    remove_cgroup(cg);
                }
                panic!("spawn unshare + systemd-nspawn: {e}");
            }
        };
        // From here on Drop cleans up, also if the boot fails.
        let mut m = Machine {
            name,
            unshare,
            leader: 0,
            cgroups,
            dir,
        };
        m.leader = m.find_leader();
        m.wait_booted();
        m
    }

    /// The machine's systemd: nspawn's child, unshare's grandchild.
    fn find_leader(&mut self) -> u32 {
        let deadline = Instant::now() + BOOT_LIMIT;
        while Instant::now() < deadline {
            if !matches!(self.unshare.try_wait(), Ok(None)) {
                panic!("systemd-nspawn exited while booting:\n{}", self.console());
            }
            let grandchildren = children(self.unshare.id()).into_iter().flat_map(children);
            for pid in grandchildren {
                if fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "systemd") {
                    return pid;
                }
            }
            thread::sleep(Duration::from_millis(20));
        }
        panic!("no systemd in the machine after {BOOT_LIMIT:?}:\n{}", self.console());
    }

    /// Until `systemctl is-system-running --wait` says the boot is over.
    fn wait_booted(&self) {
        let deadline = Instant::now() + BOOT_LIMIT;
        let mut last = String::new();
        while Instant::now() < deadline {
            let out = self.try_run(&["systemctl", "is-system-running", "--wait"]);
            let state = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            // degraded: some unit of the image failed; the machine still runs
            // services, and the tests look at theirs.
            if state == "running" || state == "degraded" {
                return;
            }
            last = format!("{state} {}", String::from_utf8_lossy(&out.stderr).trim());
            thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "machine not up after {BOOT_LIMIT:?} (last: {last}):\n{}",
            self.console()
        );
    }

    /// `argv` inside the machine (every namespace of its PID 1, its root),
    /// with systemd's PATH and nothing else of our environment, killed
    /// after `limit`; not yet run.
    pub fn command(&self, limit: Duration, argv: &[&str]) -> Command {
        assert!(self.leader != 0, "the machine has no PID 1 yet");
        let mut cmd = Command::new(require("timeout"));
        cmd.arg("--kill-after=5s")
            .arg(format!("{}s", limit.as_secs().max(1)))
            .arg(require("nsenter"))
            .arg(format!("--target={}", self.leader))
            .args(["--all", "--"])
            .args(argv)
            .env_clear()
            .env("PATH", PATH)
            .env("SYSTEMD_PAGER", "")
            .stdin(Stdio::null());
        cmd
    }

    /// Runs `argv` inside to completion (at most [`COMMAND_LIMIT`]), whatever it exits with.
    pub fn try_run(&self, argv: &[&str]) -> Output {
        let mut cmd = self.command(COMMAND_LIMIT, argv);
        cmd.output().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"))
    }

    /// Runs `argv` inside; panics with what it printed unless it succeeds.
    /// Returns its stdout.
    pub fn run(&self, argv: &[&str]) -> String {
        let out = self.try_run(argv);
        assert!(
            out.status.success(),
            "{argv:?} in {} failed ({}):\nstdout: {}\nstderr: {}",
            self.name,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `systemctl show -P PROPERTY UNIT`.
    pub fn property(&self, unit: &str, property: &str) -> String {
        self.run(&["systemctl", "show", "-P", property, unit]).trim().to_owned()
    }

    /// Everything the journal holds about `unit`, its own lines and
    /// systemd's about it, message text only.
    pub fn journal(&self, unit: &str) -> String {
        self.run(&["journalctl", "--no-pager", "-o", "cat", "-u", unit])
    }

    /// Where `inside` (an absolute path in the machine) is seen from the host.
    pub fn path(&self, inside: &str) -> PathBuf {
        assert!(inside.starts_with('/'), "an absolute path inside: {inside}");
        PathBuf::from(format!("/proc/{}/root{inside}", self.leader))
    }

    /// Writes `text` at `inside` (parents created); it lives in the
    /// machine's tmpfs and goes with it.
    pub fn write(&self, inside: &str, text: &str) {
        let p = self.path(inside);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).unwrap_or_else(|e| panic!("create {}: {e}", parent.display()));
        }
        fs::write(&p, text).unwrap_or_else(|e| panic!("write {inside} in {}: {e}", self.name));
    }

    /// The machine's user `name` (from its /etc/passwd).
    pub fn uid(&self, name: &str) -> u32 {
        self.id_in("/etc/passwd", name)
    }

    /// The machine's group `name` (from its /etc/group).
    pub fn gid(&self, name: &str) -> u32 {
        self.id_in("/etc/group", name)
    }

    /// The third field of `name`'s line in `file` (passwd, group).
    fn id_in(&self, file: &str, name: &str) -> u32 {
        read_lossy(&self.path(file))
            .lines()
            .find_map(|l| {
                let mut f = l.split(':');
                (f.next() == Some(name)).then(|| f.nth(1).and_then(|id| id.parse().ok()))?
            })
            .unwrap_or_else(|| panic!("no {name} in the machine's {file}"))
    }

    /// What the machine printed on its console so far.
    pub fn console(&self) -> String {
        read_lossy(&self.dir.path().join("console.log"))
    }

    /// Polls `f` every 100 ms (each poll runs commands inside) until it
    /// holds; panics naming `what` after `timeout`.
    pub fn wait(&self, timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            if f() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}"
            );
            thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        // nspawn, PID 1 of unshare's pid namespace, goes and everything in
        // the machine with it (nothing in it needs a clean shutdown);
        // unshare reaps it and exits.
        for pid in children(self.unshare.id()) {
            signal(pid, libc::SIGKILL);
        }
        if !wait_exit(&mut self.unshare, Duration::from_secs(10)) {
            kill_and_reap(&mut self.unshare);
        }
        let _ = fs::remove_dir_all(Path::new(PROPAGATE).join(&self.name));
        for cg in &self.cgroups {
            remove_cgroup(cg);
        }
    }
}

/// The children of every thread of `pid`.
fn children(pid: u32) -> Vec<u32> {
    fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// The hierarchies systemd uses and where each is mounted: the unified one
/// (cgroup2; all of /sys/fs/cgroup, or /sys/fs/cgroup/unified beside v1),
/// and v1's `name=systemd` on a hybrid host; with our own cgroup in each.
fn hierarchies() -> Vec<PathBuf> {
    let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let path_of = |controllers: &str| {
        own.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, c, p) = (f.next()?, f.next()?, f.next()?);
            (c == controllers).then(|| p.trim_start_matches('/').to_owned())
        })
    };
    let root = Path::new("/sys/fs/cgroup");
    let mut out = Vec::new();
    if root.join("cgroup.controllers").is_file() {
        out.extend(path_of("").map(|p| root.join(p)));
    } else {
        out.extend(path_of("name=systemd").map(|p| root.join("systemd").join(p)));
        if root.join("unified/cgroup.controllers").is_file() {
            out.extend(path_of("").map(|p| root.join("unified").join(p)));
        }
    }
    assert!(!out.is_empty(), "no cgroup hierarchy for systemd found:\n{own}");
    out
}

fn create_cgroups(name: &str) -> Vec<PathBuf> {
    hierarchies()
        .into_iter()
        .map(|h| {
            let cg = h.join(name);
            fs::create_dir(&cg).unwrap_or_else(|e| panic!("create cgroup {}: {e}", cg.display()));
            cg
        })
        .collect()
}

/// Kills what is left in `cg` and its children and removes them, deepest
/// first; retries for a few seconds while killed processes exit.
fn remove_cgroup(cg: &Path) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut dirs = Vec::new();
        collect_dirs(cg, &mut dirs);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.as_os_str().len()));
        for d in &dirs {
            for pid in read_lossy(&d.join("cgroup.procs"))
                .lines()
                .filter_map(|p| p.parse().ok())
            {
                signal(pid, libc::SIGKILL);
            }
            let _ = fs::remove_dir(d);
        }
        if !cg.exists() {
            return;
        }
        if Instant::now() >= deadline {
            eprintln!("could not remove cgroup {}", cg.display());
            return;
        }
        thread::sleep(Duration::from_millis(50));
    }
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    if !dir.is_dir() {
        return;
    }
    out.push(dir.to_owned());
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            collect_dirs(&e.path(), out);
        }
    }
}

/// Removes the cgroups (and whatever still runs in them) of machines whose
/// test run is gone.
fn sweep_stale_cgroups() {
    for h in hierarchies() {
        for e in fs::read_dir(&h).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let parts: Vec<&str> = name.split('-').collect();
            let ["fbt", pid, n] = parts[..] else {
                continue;
            };
            let (Ok(pid), Ok(_)) = (pid.parse::<u32>(), n.parse::<u32>()) else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                eprintln!("removing stale machine cgroup {}", e.path().display());
                remove_cgroup(&e.path());
                let _ = fs::remove_dir_all(Path::new(PROPAGATE).join(&name));
            }
        }
    }
}
