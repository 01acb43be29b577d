//! What a sandboxed process may do, as data: the network it may reach ([`Egress`]), the resources each of its
//! processes may use ([`ResourceLimits`]), and the [`Confinement`] the process applies to itself from inside
//! the sandbox (Landlock rules, seccomp, rlimits, the user it becomes) before it runs the agent.
//!
//! A `Confinement` crosses one `execve`: the runner serializes it as JSON onto the command line of
//! `ahp-relay sandbox-exec` inside the sandbox (see [`crate::exec`]). It holds paths and numbers only, never a
//! secret.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The TCP connections an agent may open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "EgressSetting", into = "EgressSetting")]
pub enum Egress {
    /// The network of the runner (loopback included): only for agents whose runner the operator fenced.
    Any,
    /// No network at all: a network namespace with only its own loopback.
    None,
    /// TCP connections to these ports only (Landlock, ABI 4+); UDP (DNS) is not restricted.
    Ports(Vec<u16>),
}

impl Default for Egress {
    /// HTTPS only: what hosted coding agents need to reach their model APIs.
    fn default() -> Self {
        Egress::Ports(vec![443])
    }
}

impl Egress {
    /// Whether enforcing this needs Landlock's TCP rules (ABI 4).
    pub fn needs_port_rules(&self) -> bool {
        matches!(self, Egress::Ports(_))
    }
}

/// How an egress is written in the agents file: `"any"`, `"none"` or a list of TCP ports.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum EgressSetting {
    Word(String),
    Ports(Vec<u16>),
}

impl TryFrom<EgressSetting> for Egress {
    type Error = String;

    fn try_from(setting: EgressSetting) -> Result<Self, Self::Error> {
        match setting {
            EgressSetting::Word(word) if word == "any" => Ok(Egress::Any),
            EgressSetting::Word(word) if word == "none" => Ok(Egress::None),
            EgressSetting::Word(word) => Err(format!(
                "egress must be \"any\", \"none\" or a list of TCP ports, not {word:?}"
            )),
            EgressSetting::Ports(ports) if ports.contains(&0) => {
                Err("egress ports must be between 1 and 65535".into())
            }
            EgressSetting::Ports(ports) if ports.is_empty() => {
                Err("an empty egress list allows nothing: write egress = \"none\"".into())
            }
            EgressSetting::Ports(ports) => Ok(Egress::Ports(ports)),
        }
    }
}

impl From<Egress> for EgressSetting {
    fn from(egress: Egress) -> Self {
        match egress {
            Egress::Any => EgressSetting::Word("any".into()),
            Egress::None => EgressSetting::Word("none".into()),
            Egress::Ports(ports) => EgressSetting::Ports(ports),
        }
    }
}

/// Limits of each process in a sandbox (rlimits, set from inside before the agent runs). Limits not written in
/// the agents file keep their defaults; `None` ones are inherited from the relay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResourceLimits {
    /// Processes and threads (RLIMIT_NPROC). Counted per user: when the relay runs as root each tenant has a
    /// user of its own, so this bounds the tenant's processes on the machine (see `processes_per_tenant`);
    /// otherwise each sandbox has a user namespace of its own and this bounds the sandbox.
    pub processes: Option<u64>,
    /// Open files of one process (RLIMIT_NOFILE).
    pub open_files: Option<u64>,
    /// Largest file one process may write, in bytes (RLIMIT_FSIZE): a bigger write fails with EFBIG.
    pub file_size_bytes: Option<u64>,
    /// CPU time of one process, in seconds (RLIMIT_CPU).
    pub cpu_seconds: Option<u64>,
    /// Largest virtual memory of one process, in bytes (RLIMIT_AS). Node reserves far more address space than
    /// it uses: prefer `data_bytes`.
    pub address_space_bytes: Option<u64>,
    /// Heap and writable private memory of one process, in bytes (RLIMIT_DATA).
    pub data_bytes: Option<u64>,
}

impl Default for ResourceLimits {
    fn default() -> Self {
        Self {
            processes: Some(256),
            open_files: Some(4096),
            file_size_bytes: Some(2 * 1024 * 1024 * 1024),
            cpu_seconds: None,
            address_space_bytes: None,
            data_bytes: Some(8 * 1024 * 1024 * 1024),
        }
    }
}

impl ResourceLimits {
    /// Each limit with its resource, as `setrlimit(2)` takes them.
    pub fn rlimits(&self) -> Vec<(Rlimit, u64)> {
        [
            (Rlimit::Processes, self.processes),
            (Rlimit::OpenFiles, self.open_files),
            (Rlimit::FileSize, self.file_size_bytes),
            (Rlimit::CpuSeconds, self.cpu_seconds),
            (Rlimit::AddressSpace, self.address_space_bytes),
            (Rlimit::Data, self.data_bytes),
        ]
        .into_iter()
        .filter_map(|(resource, value)| value.map(|value| (resource, value)))
        .collect()
    }
}

/// A resource `setrlimit(2)` bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Rlimit {
    Processes,
    OpenFiles,
    FileSize,
    CpuSeconds,
    AddressSpace,
    Data,
}

/// The user a sandbox becomes from inside (when the relay runs as root): each tenant has its own, so tenants'
/// files and processes are apart for the kernel too, and RLIMIT_NPROC counts a tenant's processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserSwitch {
    pub uid: u32,
    pub gid: u32,
}

/// What the process applies to itself inside the sandbox, in this order: become `user`, set `limits` and
/// `nice`, restrict the filesystem and the network (Landlock), filter system calls (seccomp), then run the
/// agent. Paths are as the sandbox sees them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confinement {
    /// Hierarchies the sandbox may read and execute (the system, the agent's installation).
    pub read_only: Vec<PathBuf>,
    /// Hierarchies the sandbox may read, write and execute (its workspace, home and `/tmp`).
    pub read_write: Vec<PathBuf>,
    /// Device files it may read, write and control (`/dev/null`, `/dev/tty`, `/dev/pts`, …).
    pub devices: Vec<PathBuf>,
    /// Paths it may only read, not list or execute beneath (e.g. `/proc`).
    pub readable: Vec<PathBuf>,
    pub egress: Egress,
    pub limits: ResourceLimits,
    /// Scheduling niceness of every process (0–19): the relay's own work comes first.
    pub nice: i32,
    pub user: Option<UserSwitch>,
    /// A descriptor holding the agent's environment (`NAME=value`, NUL-separated), which the helper reads
    /// once confined and runs the agent with: nothing of it reaches bubblewrap or the helper's own start
    /// (a `LD_PRELOAD` there would run before any confinement).
    #[serde(default)]
    pub environment_fd: Option<i32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Agent {
        #[serde(default)]
        egress: Egress,
    }

    #[test]
    fn egress_is_any_none_or_ports_and_https_by_default() {
        let parse = |text: &str| toml::from_str::<Agent>(text).map(|agent| agent.egress);
        assert_eq!(parse("").expect("default"), Egress::Ports(vec![443]));
        assert_eq!(parse("egress = \"any\"").expect("any"), Egress::Any);
        assert_eq!(parse("egress = \"none\"").expect("none"), Egress::None);
        assert_eq!(
            parse("egress = [443, 80]").expect("ports"),
            Egress::Ports(vec![443, 80])
        );
        for bad in [
            "egress = \"all\"",
            "egress = []",
            "egress = [0]",
            "egress = [70000]",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_confinement_survives_its_trip_through_json() {
        let confinement = Confinement {
            read_only: vec!["/usr".into()],
            read_write: vec!["/work".into()],
            devices: vec!["/dev/null".into()],
            readable: vec!["/proc".into()],
            egress: Egress::Ports(vec![443]),
            limits: ResourceLimits::default(),
            nice: 10,
            user: Some(UserSwitch {
                uid: 40_001,
                gid: 40_001,
            }),
            environment_fd: Some(5),
        };
        let json = serde_json::to_string(&confinement).expect("json");
        assert_eq!(
            serde_json::from_str::<Confinement>(&json).expect("parse"),
            confinement
        );
    }
}
