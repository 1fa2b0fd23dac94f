//! The harness of the multi-process tests: starts real rank processes of the
//! `wm-test-rank` program through the same launcher as `wm-run`, collects
//! their output, and checks that nothing of ours is left in `/dev/shm`.
//!
//! A test names a scenario of `wm-test-rank` and the world to run it in; the
//! scenario itself checks its results on every rank and exits non-zero on
//! the first wrong one.

use std::time::Duration;

use wm_comm::launch::{self, Launch, Meet, Report};

/// The world a scenario runs in.
#[derive(Debug, Clone)]
pub struct World {
    /// Ranks.
    pub ranks: usize,
    /// Ranks per simulated node.
    pub node_size: Option<usize>,
    /// How ranks meet.
    pub meet: Meet,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// Kill everything after this long.
    pub limit: Duration,
}

impl World {
    /// `ranks` ranks on one node.
    pub fn new(ranks: usize) -> Self {
        Self { ranks, node_size: None, meet: Meet::Dir, env: Vec::new(), limit: Duration::from_secs(240) }
    }

    /// Poses as nodes of `k` ranks each.
    pub fn nodes_of(mut self, k: usize) -> Self {
        self.node_size = Some(k);
        self
    }

    /// Meets over TCP instead of a directory.
    pub fn tcp(mut self) -> Self {
        self.meet = Meet::Tcp;
        self
    }

    /// Adds an environment variable.
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.to_owned(), v.to_owned()));
        self
    }

    /// Runs `program args…` in this world and returns how every rank ended.
    /// Checks `/dev/shm` afterwards.
    ///
    /// # Panics
    /// When the ranks cannot be started, or something of ours is left in
    /// `/dev/shm`.
    pub fn run(&self, program: &str, args: &[&str]) -> Report {
        let program = relocated(program);
        let program = program.as_str();
        let mut l = Launch::new(self.ranks, program, args.iter().copied());
        l.node_size = self.node_size;
        l.meet = self.meet;
        l.echo = false;
        l.grace = Duration::from_secs(15);
        l.limit = Some(self.limit);
        l.env = self.env.iter().map(|(k, v)| (k.into(), v.into())).collect();
        let report = launch::run(&l).unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
        let left = shm_leftovers();
        assert!(left.is_empty(), "left in /dev/shm after {args:?}: {left:?}");
        report
    }

    /// Runs and panics, with every rank's output, unless all ranks succeed.
    pub fn run_ok(&self, program: &str, args: &[&str]) -> Report {
        let report = self.run(program, args);
        if !report.success() {
            panic!(
                "{args:?} on {} ranks (node size {:?}) failed: {:?}\n{}",
                self.ranks,
                self.node_size,
                report.failures(),
                transcript(&report)
            );
        }
        report
    }
}

/// The rank program's path: where cargo built it, unless `WM_TEST_BIN_DIR`
/// names a directory holding a program of the same name (test binaries
/// copied to a machine without the build tree, as `scripts/gpu-check.sh`
/// does).
pub fn relocated(program: &str) -> String {
    let Some(dir) = wm_topology::env::WM_TEST_BIN_DIR.get() else { return program.to_owned() };
    let name = std::path::Path::new(program).file_name().unwrap_or_default();
    let moved = std::path::Path::new(&dir).join(name);
    if moved.exists() { moved.to_string_lossy().into_owned() } else { program.to_owned() }
}

/// A private scratch directory (mode 700) for one test, removed on drop.
#[derive(Debug)]
pub struct Scratch(pub std::path::PathBuf);

impl Scratch {
    /// A fresh directory under the temporary directory, named by `tag`,
    /// this process and thread.
    ///
    /// # Panics
    /// When it cannot be made.
    pub fn new(tag: &str) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let p = std::env::temp_dir().join(format!("wm-test.{tag}.{}.{:?}", std::process::id(), std::thread::current().id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap_or_else(|e| panic!("creating {}: {e}", p.display()));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
        Self(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh job key: 64 hexadecimal digits from `/dev/urandom`.
///
/// # Panics
/// When `/dev/urandom` cannot be read.
pub fn random_key() -> String {
    use std::io::Read;
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).unwrap_or_else(|e| panic!("reading /dev/urandom: {e}"));
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A rank of `program` to start by hand rather than through the launcher
/// (so a test can act between ranks starting), as a command to adjust and
/// spawn: rank `rank` of `world` meeting at `rendezvous`, a 60-second
/// timeout, no job key, node id or congestion control from the test's own
/// environment, then `env`; stdout and stderr piped.
pub fn rank_by_hand(
    program: impl AsRef<std::ffi::OsStr>,
    rank: usize,
    world: usize,
    rendezvous: &str,
    env: &[(&str, &str)],
    args: &[&str],
) -> std::process::Command {
    use std::process::Stdio;
    let mut c = std::process::Command::new(program);
    c.args(args)
        .env("WM_RANK", rank.to_string())
        .env("WM_WORLD_SIZE", world.to_string())
        .env("WM_RENDEZVOUS", rendezvous)
        .env("WM_TIMEOUT_S", "60")
        .env_remove("WM_JOB_KEY")
        .env_remove("WM_JOB_KEY_FILE")
        .env_remove("WM_NODE_ID")
        .env_remove("WM_TCP_CONGESTION")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// A command that starts the test program `program` (relocated) with
/// `args` outside any job: no rank, world size, rendezvous or node id from
/// the test's own environment, the job key `key` and a timeout of
/// `timeout_s` seconds; stdin empty, stdout and stderr piped.
pub fn outside_job(program: &str, key: &str, timeout_s: &str, args: &[&str]) -> std::process::Command {
    use std::process::Stdio;
    let mut c = std::process::Command::new(relocated(program));
    c.args(args)
        .env("WM_JOB_KEY", key)
        .env("WM_TIMEOUT_S", timeout_s)
        .env_remove("WM_RANK")
        .env_remove("WM_WORLD_SIZE")
        .env_remove("WM_RENDEZVOUS")
        .env_remove("WM_NODE_ID")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// The `main` of a test program whose ranks run one scenario: joins the
/// job, runs `scenario` with the world, the scenario's name (the first
/// argument) and the arguments after it, and ends as [`exit_with`] does.
pub fn rank_main(scenario: impl FnOnce(&std::sync::Arc<dyn wm_comm::Communicator>, &str, &[String]) -> anyhow::Result<()>) {
    use anyhow::Context as _;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let name = args.first().cloned().unwrap_or_default();
    let rest = &args[1.min(args.len())..];
    exit_with(wm_comm::init().context("bootstrap").and_then(|world| scenario(&world, &name, rest)));
}

/// How a test program ends: `ok` on stdout for `Ok`, else `FAILED:` and
/// the error on stderr and exit status 1.
pub fn exit_with(result: anyhow::Result<()>) {
    if let Err(e) = result {
        eprintln!("FAILED: {e:#}");
        std::process::exit(1);
    }
    println!("ok");
}

/// What a process printed, stdout then stderr.
pub fn output_text(o: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Whether this process runs as root (read from `/proc`: no unsafe call).
pub fn running_as_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_whitespace().nth(2)) == Some("0")
}

/// Every rank's output, prefixed with its rank.
pub fn transcript(r: &Report) -> String {
    let mut s = String::new();
    for o in &r.ranks {
        for line in &o.output {
            s.push_str(&format!("[{}] {line}\n", o.rank));
        }
    }
    s
}

/// Entries of `/dev/shm` named like ours.
pub fn shm_leftovers() -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    let l = n.to_ascii_lowercase();
                    l.contains("wholemem") || l.starts_with("wm-") || l.starts_with("wm_")
                })
                .collect()
        })
        .unwrap_or_default()
}

/// What a rank program does with a case it cannot run here (`what`: the
/// case; `reason`: the capability query's answer for `ty` at `loc`).
///
/// It prints a `skip` line and goes on — except under `WM_REQUIRE_GPU=1`
/// for device memory, where a skip is an error naming the reason, so a GPU
/// run cannot pass having tested nothing. A device case stays a skip there
/// only when the world's shape rules the type out for host memory too
/// (continuous or chunked memory across simulated nodes): no GPU would
/// change that.
///
/// # Errors
/// The message to fail with.
pub fn skip(
    world: &dyn wm_comm::Communicator,
    ty: wholemem::MemoryType,
    loc: wholemem::Location,
    what: &str,
    reason: &str,
) -> Result<(), String> {
    use wholemem::Location;
    if loc == Location::Device && wm_topology::env::require_gpu() {
        if let Some(host) = wholemem::query(world, ty, Location::Host).reason() {
            println!("skip {what}: {reason} (allowed under WM_REQUIRE_GPU=1: host {ty} memory is refused too: {host})");
            return Ok(());
        }
        return Err(format!("WM_REQUIRE_GPU=1, but {what} would be skipped: {reason}"));
    }
    println!("skip {what}: {reason}");
    Ok(())
}

/// A small deterministic generator (splitmix64) for test programs: every
/// rank derives the same "random" choices from the same seed.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// Seeded from several values (a case number, the world size, …).
    pub fn new(seed: &[u64]) -> Self {
        let mut r = Rng(0x5eed);
        for &s in seed {
            r.0 ^= s;
            r.next();
        }
        r
    }

    /// The next 64 random bits.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value below `n` (0 for `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The TCP ports `pid` listens on, from its descriptors and /proc/net/tcp.
pub fn tcp_listeners_of(pid: u32) -> Vec<u16> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return Vec::new() };
    let inodes: Vec<String> = fds
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| l.to_str().and_then(|s| s.strip_prefix("socket:[")).map(|s| s.trim_end_matches(']').to_owned()))
        .collect();
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (local, state, inode) = (f.get(1)?, f.get(3)?, f.get(9)?);
            (*state == "0A" && inodes.iter().any(|i| i == inode)).then(|| u16::from_str_radix(local.rsplit(':').next()?, 16).ok())?
        })
        .collect()
}
