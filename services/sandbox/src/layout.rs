//! The sandbox's view of the filesystem, as bubblewrap arguments: a fresh root with only the system read-only,
//! the agent's installation read-only, and the session's workspace, private home, `/tmp` and `/dev/shm`
//! writable; its own `/proc` (its processes only) and a minimal `/dev`. Paths the relay knows to be sensitive
//! (its data directory, secret files, the workspace root holding other tenants' directories) are covered when
//! a read-only bind would otherwise show them.
//!
//! The same paths become the [`Confinement`]'s Landlock rules: even a mount the layout got wrong is not
//! readable unless a rule names it.

use std::ffi::OsString;
use std::path::PathBuf;

use crate::policy::{Confinement, Egress, ResourceLimits, UserSwitch};

/// The private home inside every sandbox (`HOME`).
pub const HOME_IN_SANDBOX: &str = "/home/agent";

/// Where the relay's binary is mounted to confine the sandbox from inside (`ahp-relay sandbox-exec`).
pub const HELPER_IN_SANDBOX: &str = "/.ahp-relay-sandbox-exec";

/// Top-level system hierarchies shown read-only when they exist.
const SYSTEM_DIRECTORIES: &[&str] = &["/usr", "/etc", "/opt"];

/// Top-level entries that are directories on some systems and symlinks into `/usr` on others.
const SYSTEM_LINKS: &[&str] = &["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];

/// Devices a program may open read-write.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];

/// How the system is shown, decided once per process ([`SystemView::detect`]).
#[derive(Debug, Clone)]
pub struct SystemView {
    /// Directories bound read-only at the same path.
    pub read_only: Vec<PathBuf>,
    /// Symlinks recreated inside: (target, link).
    pub links: Vec<(PathBuf, PathBuf)>,
}

impl SystemView {
    /// This machine's system hierarchies, plus `extra` (e.g. `/nix/store`) when they exist.
    pub fn detect(extra: &[PathBuf]) -> SystemView {
        let mut read_only = Vec::new();
        let mut links = Vec::new();
        for path in SYSTEM_DIRECTORIES
            .iter()
            .map(PathBuf::from)
            .chain(extra.iter().cloned())
        {
            if path.is_dir() {
                read_only.push(path);
            }
        }
        for path in SYSTEM_LINKS.iter().map(PathBuf::from) {
            match std::fs::symlink_metadata(&path) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    if let Ok(target) = std::fs::read_link(&path) {
                        links.push((target, path));
                    }
                }
                Ok(meta) if meta.is_dir() => read_only.push(path),
                _ => {}
            }
        }
        SystemView { read_only, links }
    }
}

/// One sandbox to start: a session's agent, or a command it runs.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// The tenant (a name safe as a path segment): sandboxes of one tenant share its user namespace.
    pub tenant: String,
    /// A trusted directory the workspace lies beneath (the workspace root): the workspace is opened from it
    /// without following any symlink.
    pub anchor: PathBuf,
    /// The session's working directory tree: writable, at the same path as outside.
    pub workspace: PathBuf,
    /// The session's private home (outside path), shown at [`HOME_IN_SANDBOX`].
    pub home: PathBuf,
    /// The session's private `/tmp` (outside path).
    pub tmp: PathBuf,
    /// The session's private `/dev/shm` (outside path).
    pub shm: PathBuf,
    /// Where the program starts (inside path, normally in the workspace).
    pub cwd: PathBuf,
    /// The agent's installation: shown read-only at the same paths.
    pub install: Vec<PathBuf>,
    pub egress: Egress,
    /// TCP ports of this machine's loopback the sandbox may connect to (with port egress: forwarded into its
    /// network namespace by pasta, and allowed by Landlock); none by default.
    pub loopback_ports: Vec<u16>,
    pub limits: ResourceLimits,
    /// The `cgroup.procs` of the session's cgroup, which the sandbox joins before it starts (where the relay
    /// has a delegated cgroup v2; see [`crate::cgroups`]).
    pub cgroup: Option<PathBuf>,
    /// The user the sandbox becomes (when the relay runs as root).
    pub user: Option<UserSwitch>,
}

/// Descriptors a sandbox is built from (inherited by bubblewrap; numbers in this process).
#[derive(Debug, Clone, Default)]
pub struct Descriptors {
    /// The session's working directory, opened without following symlinks.
    pub workspace: Option<i32>,
    /// The relay's binary.
    pub helper: Option<i32>,
    /// The tenant's user namespace (unprivileged relays).
    pub user_namespace: Option<i32>,
    /// The agent's environment (a memory file the helper reads once confined).
    pub environment: Option<i32>,
    /// bubblewrap's ends of the network set-up pipes (`--info-fd`, `--block-fd`): a network namespace of its
    /// own, connected by pasta ([`crate::network`]).
    pub network: Option<(i32, i32)>,
    /// The namespace's resolver configuration (a memory file) and where it is mounted, when the host's would
    /// name the namespace's own loopback ([`crate::network::ForwardedResolver`]).
    pub resolver: Option<(i32, PathBuf)>,
}

/// How bubblewrap creates the sandbox's namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Privilege {
    /// The relay runs as root: bubblewrap needs no user namespace; the process keeps CAP_SETUID/SETGID/SETPCAP
    /// only to become the tenant's user from inside (then has none).
    Root,
    /// The relay runs as an ordinary user: bubblewrap creates a user namespace.
    Unprivileged,
}

/// The settings every sandbox of this process shares.
#[derive(Debug, Clone)]
pub struct Layout {
    pub system: SystemView,
    /// Paths never shown: covered by an empty directory or file where a read-only bind would show them.
    pub protected: Vec<PathBuf>,
    /// The relay's binary (outside path, for logs: it is mounted from a descriptor opened at start, so an
    /// upgrade that replaces the file does not change what sandboxes run), at [`HELPER_IN_SANDBOX`].
    pub helper: PathBuf,
    pub privilege: Privilege,
    /// Whether a fresh `/proc` can be mounted (not in some containers: then none is).
    pub proc: bool,
    /// Niceness of sandboxed processes.
    pub nice: i32,
}

impl Layout {
    /// bubblewrap's arguments for `spec`, ending with the helper that confines itself and then does `run`
    /// (`-- PROGRAM ARGS…`, or `--probe`). What `fds` names is inherited by bubblewrap: the workspace and the
    /// helper are mounted from descriptors (opened without following symlinks: a path swapped for a symlink
    /// after it was checked cannot redirect the mount), the tenant's user namespace joined from one.
    pub fn bwrap_args(&self, spec: &SandboxSpec, fds: &Descriptors, run: &[OsString]) -> Vec<OsString> {
        let mut out: Vec<OsString> = Vec::new();
        let mut made: Vec<PathBuf> = Vec::new();
        let mut push = |items: &[&dyn AsRef<std::ffi::OsStr>]| {
            out.extend(items.iter().map(|item| item.as_ref().to_os_string()));
        };
        // bubblewrap makes missing mount points' parents 0700 (root's, in the sandbox's root): the tenant's
        // user could not walk through them, so they are made first, 0755.
        let mut parents = |dest: &std::path::Path, out: &mut dyn FnMut(&[&dyn AsRef<std::ffi::OsStr>])| {
            let mut ancestors: Vec<&std::path::Path> = dest.ancestors().skip(1).collect();
            ancestors.reverse();
            for ancestor in ancestors.into_iter().skip(1) {
                if !made.iter().any(|m| m == ancestor) {
                    made.push(ancestor.to_path_buf());
                    out(&[&"--dir", &ancestor]);
                }
            }
        };
        push(&[
            &"--die-with-parent",
            &"--new-session",
            &"--unshare-pid",
            &"--unshare-ipc",
            &"--unshare-uts",
            &"--unshare-cgroup-try",
            &"--hostname",
            &"ahp-sandbox",
        ]);
        match self.privilege {
            Privilege::Root => push(&[
                &"--cap-add",
                &"CAP_SETUID",
                &"--cap-add",
                &"CAP_SETGID",
                &"--cap-add",
                &"CAP_SETPCAP",
            ]),
            Privilege::Unprivileged => match fds.user_namespace {
                // The tenant's user namespace: the kernel counts the tenant's processes there.
                Some(fd) => push(&[&"--userns", &fd.to_string()]),
                None => push(&[&"--unshare-user"]),
            },
        }
        if spec.egress == Egress::None {
            push(&[&"--unshare-net"]);
        } else if let Some((info, block)) = fds.network {
            push(&[
                &"--unshare-net",
                &"--info-fd",
                &info.to_string(),
                &"--block-fd",
                &block.to_string(),
            ]);
        }
        if self.proc {
            push(&[&"--proc", &"/proc"]);
        }
        push(&[&"--dev", &"/dev"]);
        // The private directories first: read-only binds beneath /tmp (an installation there) go on top.
        push(&[&"--bind", &spec.tmp, &"/tmp"]);
        push(&[&"--bind", &spec.shm, &"/dev/shm"]);
        parents(std::path::Path::new(HOME_IN_SANDBOX), &mut push);
        push(&[&"--bind", &spec.home, &HOME_IN_SANDBOX]);
        let shown = self.read_only_shown(spec);
        for path in &shown {
            parents(path, &mut push);
            push(&[&"--ro-bind", path, path]);
        }
        for (target, link) in &self.system.links {
            push(&[&"--symlink", target, link]);
        }
        if let Some((fd, mount_at)) = &fds.resolver {
            parents(mount_at, &mut push);
            // Readable by the tenant's user (bubblewrap makes data files 0600, root's, otherwise).
            push(&[&"--perms", &"0644", &"--ro-bind-data", &fd.to_string(), mount_at]);
        }
        for covered in self
            .protected
            .iter()
            .filter(|p| shown.iter().any(|s| p.starts_with(s)))
        {
            match std::fs::symlink_metadata(covered) {
                // An empty tmpfs: nothing to read, and Landlock grants no writes there.
                Ok(meta) if meta.is_dir() => push(&[&"--tmpfs", covered]),
                Ok(_) => push(&[&"--ro-bind", &"/dev/null", covered]),
                Err(_) => {}
            }
        }
        parents(&spec.workspace, &mut push);
        match fds.workspace {
            Some(fd) => push(&[&"--bind-fd", &fd.to_string(), &spec.workspace]),
            None => push(&[&"--bind", &spec.workspace, &spec.workspace]),
        }
        match fds.helper {
            Some(fd) => push(&[&"--ro-bind-fd", &fd.to_string(), &HELPER_IN_SANDBOX]),
            None => push(&[&"--ro-bind", &self.helper, &HELPER_IN_SANDBOX]),
        }
        push(&[&"--remount-ro", &"/"]);
        push(&[&"--chdir", &spec.cwd]);
        let mut confinement = self.confinement(spec);
        confinement.environment_fd = fds.environment;
        // The resolver's file may be mounted outside what the system shows (systemd's `/etc/resolv.conf` links
        // to `/run/systemd/resolve/…`): Landlock must let it be read.
        if let Some((_, mount_at)) = &fds.resolver {
            if !confinement
                .read_only
                .iter()
                .any(|shown| mount_at.starts_with(shown))
            {
                confinement.read_only.push(mount_at.clone());
            }
        }
        let json = serde_json::to_string(&confinement).unwrap_or_default();
        push(&[&"--", &HELPER_IN_SANDBOX, &crate::exec::SUBCOMMAND, &json]);
        out.extend(run.iter().cloned());
        out
    }

    /// The read-only hierarchies: the system's and the installation's (those that exist).
    fn read_only_shown(&self, spec: &SandboxSpec) -> Vec<PathBuf> {
        let mut shown = self.system.read_only.clone();
        for path in &spec.install {
            if path.exists() && !shown.iter().any(|s| path.starts_with(s)) {
                shown.push(path.clone());
            }
        }
        shown
    }

    /// Whether a path of this machine (resolved) is seen at the same place inside a sandbox of `spec`: the
    /// system's and the installation's read-only hierarchies, and the session's working directory.
    pub fn shows(&self, spec: &SandboxSpec, path: &std::path::Path) -> bool {
        path.starts_with(&spec.workspace)
            || self
                .read_only_shown(spec)
                .iter()
                .any(|shown| path.starts_with(shown))
    }

    /// What the sandbox applies to itself from inside.
    pub fn confinement(&self, spec: &SandboxSpec) -> Confinement {
        let mut read_only = self.read_only_shown(spec);
        read_only.extend(self.system.links.iter().map(|(_, link)| link.clone()));
        Confinement {
            read_only,
            read_write: vec![
                spec.workspace.clone(),
                PathBuf::from(HOME_IN_SANDBOX),
                PathBuf::from("/tmp"),
                PathBuf::from("/dev/shm"),
            ],
            devices: DEVICES.iter().map(PathBuf::from).collect(),
            readable: if self.proc {
                vec![PathBuf::from("/proc")]
            } else {
                vec![]
            },
            egress: match &spec.egress {
                Egress::Ports(ports) => {
                    let mut ports = ports.clone();
                    ports.extend(spec.loopback_ports.iter().copied());
                    ports.sort_unstable();
                    ports.dedup();
                    Egress::Ports(ports)
                }
                other => other.clone(),
            },
            limits: spec.limits.clone(),
            nice: self.nice,
            user: spec.user,
            environment_fd: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn layout(protected: Vec<PathBuf>) -> Layout {
        Layout {
            system: SystemView {
                read_only: vec![PathBuf::from("/usr"), PathBuf::from("/etc")],
                links: vec![(PathBuf::from("usr/bin"), PathBuf::from("/bin"))],
            },
            protected,
            helper: PathBuf::from("/opt/relay/ahp-relay"),
            privilege: Privilege::Unprivileged,
            proc: true,
            nice: 10,
        }
    }

    fn spec(workspace: &Path) -> SandboxSpec {
        SandboxSpec {
            tenant: "acme".into(),
            anchor: workspace.to_path_buf(),
            workspace: workspace.to_path_buf(),
            home: workspace.join("../home"),
            tmp: workspace.join("../tmp"),
            shm: workspace.join("../shm"),
            cwd: workspace.to_path_buf(),
            install: vec![],
            egress: Egress::default(),
            loopback_ports: Vec::new(),
            limits: ResourceLimits::default(),
            cgroup: None,
            user: None,
        }
    }

    fn run(program: &str, args: &[&str]) -> Vec<OsString> {
        std::iter::once("--")
            .chain(std::iter::once(program))
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect()
    }

    fn text(args: &[OsString]) -> Vec<String> {
        args.iter().map(|a| a.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn the_workspace_is_writable_the_system_read_only_and_the_helper_runs_the_program() {
        let dir = tempfile::tempdir().expect("tempdir");
        let args = text(&layout(vec![]).bwrap_args(
            &spec(dir.path()),
            &Descriptors::default(),
            &run("agent", &["--flag"]),
        ));
        let joined = args.join(" ");
        let ws = dir.path().display().to_string();
        assert!(joined.contains(&format!("--bind {ws} {ws}")), "{joined}");
        assert!(joined.contains("--ro-bind /usr /usr"), "{joined}");
        assert!(joined.contains("--symlink usr/bin /bin"), "{joined}");
        assert!(joined.contains("--unshare-user"), "{joined}");
        assert!(
            !joined.contains("--unshare-net"),
            "HTTPS egress keeps the network: {joined}"
        );
        let helper_at = args
            .iter()
            .position(|a| a == HELPER_IN_SANDBOX && args.iter().any(|b| b == "--"));
        assert!(helper_at.is_some(), "{joined}");
        assert_eq!(&args[args.len() - 2..], ["agent", "--flag"]);
        assert!(
            joined.find("--remount-ro /").expect("root read-only") > joined.find("--bind").expect("bind")
        );
    }

    #[test]
    fn protected_paths_under_a_read_only_bind_are_covered_and_others_are_left_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let secret_dir = PathBuf::from("/etc");
        let nowhere = dir.path().join("not-shown");
        std::fs::create_dir_all(&nowhere).expect("mkdir");
        let args = text(
            &layout(vec![
                secret_dir.join("ssl"),
                PathBuf::from("/etc/hostname"),
                nowhere.clone(),
            ])
            .bwrap_args(&spec(dir.path()), &Descriptors::default(), &run("agent", &[])),
        );
        let joined = args.join(" ");
        if Path::new("/etc/ssl").is_dir() {
            assert!(joined.contains("--tmpfs /etc/ssl"), "{joined}");
        }
        if Path::new("/etc/hostname").is_file() {
            assert!(joined.contains("--ro-bind /dev/null /etc/hostname"), "{joined}");
        }
        assert!(
            !joined.contains(&format!("--tmpfs {}", nowhere.display())),
            "{joined}"
        );
    }

    #[test]
    fn no_egress_gets_a_network_namespace_of_its_own_and_root_keeps_only_the_user_switch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut no_net = spec(dir.path());
        no_net.egress = Egress::None;
        // A resolver's file mounted where the system is not shown (systemd's link target) is readable there.
        let resolver = Descriptors {
            resolver: Some((7, PathBuf::from("/run/systemd/resolve/stub-resolv.conf"))),
            ..Descriptors::default()
        };
        let joined =
            text(&layout(vec![]).bwrap_args(&spec(dir.path()), &resolver, &run("agent", &[]))).join(" ");
        assert!(
            joined.contains("--dir /run/systemd/resolve --perms 0644 --ro-bind-data 7 /run/systemd/resolve/stub-resolv.conf"),
            "{joined}"
        );
        assert!(
            joined.contains("\"/run/systemd/resolve/stub-resolv.conf\""),
            "the confinement lets the resolver's file be read: {joined}"
        );
        let mut root = layout(vec![]);
        root.privilege = Privilege::Root;
        let joined = text(&root.bwrap_args(&no_net, &Descriptors::default(), &run("agent", &[]))).join(" ");
        assert!(joined.contains("--unshare-net"), "{joined}");
        assert!(!joined.contains("--unshare-user"), "{joined}");
        assert!(
            joined.contains("--cap-add CAP_SETUID --cap-add CAP_SETGID --cap-add CAP_SETPCAP"),
            "{joined}"
        );
    }
}
