//! Where a session's agent works, and what it owns on disk:
//! - its working directory: `<root>/<tenant>/<host>/<session>`, or one the client named inside
//!   `<root>/<tenant>/` (a shared project; never removed with the session);
//! - its private home, `/tmp` and `/dev/shm`: `<root>/.sandbox/<tenant>/<host>/<session>/{home,tmp,shm}`.
//!
//! Names map injectively to directory names ([`encode`]): letters, digits, `-` and `_` stay; every other
//! byte becomes `%XX`; very long names keep a prefix and a SHA-256 of the whole. `a.b` and `a_b` are two
//! directories. When the relay runs as root a tenant's directories belong to the tenant's own user
//! ([`relay_sandbox::TenantUsers`]) and are private to it (`0700`); `<root>/.sandbox` itself stays root's
//! (`0711`: no tenant lists or renames another's directories).
//!
//! A disposed session's working directory (the default one) and private directories are removed, at once or
//! after the configured retention ([`Workspaces::dispose`], [`Workspaces::sweep`]).

use std::path::{Component, Path, PathBuf};

use relay_sandbox::beneath::{BeneathError, WorkspaceRoot};
use relay_sandbox::{TenantUsers, UserSwitch};
use sha2::Digest;

/// The directory (under `<root>`) holding sessions' private homes and temporary directories. Never a tenant's
/// name: an encoded name never starts with a dot.
const PRIVATE_DIRS: &str = ".sandbox";
/// The file that marks a disposed session's directories for removal, holding when they may go (Unix seconds).
const DISPOSED_MARKER: &str = "disposed-until";
/// Encoded names longer than this keep a prefix and a hash.
const MAX_NAME_BYTES: usize = 160;
/// A session's cgroup name longer than this is hashed (a path segment has at most 255 bytes).
const MAX_CGROUP_NAME_BYTES: usize = 200;

/// Why a working directory was refused.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error("the working directory {0} is outside this tenant's workspace")]
    Outside(String),
    #[error("the working directory {0} is not an absolute path or file:// URI")]
    NotAbsolute(String),
    #[error("cannot prepare the working directory {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(
        "the working directory {0} holds other sessions' directories (name a project directory inside it)"
    )]
    SessionsDirectory(String),
    #[error("{0}")]
    User(#[from] relay_sandbox::users::UserError),
    #[error("{0}")]
    Beneath(#[from] BeneathError),
}

/// A session's directories, ready for its sandbox.
#[derive(Debug, Clone)]
pub struct SessionDirs {
    /// Its working directory (resolved), writable by its agent.
    pub workspace: PathBuf,
    pub home: PathBuf,
    pub tmp: PathBuf,
    pub shm: PathBuf,
    /// The user its processes run as (when the relay runs as root).
    pub user: Option<UserSwitch>,
    /// The names of its tenant's and its own cgroup ([`cgroup_names`]).
    pub tenant_key: String,
    pub session_key: String,
}

/// The workspace root of this runner (or `serve`), opened once: every directory of it the relay creates, hands
/// over, measures, marks or removes is reached by descriptor beneath it ([`WorkspaceRoot`]), never through a link
/// a tenant planted.
#[derive(Debug)]
pub struct Workspaces {
    /// The root as configured (paths the relay shows are written under it).
    root: PathBuf,
    opened: WorkspaceRoot,
    /// Per-tenant users, when sandboxes switch users.
    users: Option<TenantUsers>,
    /// The users claimed so far: a tenant's user is claimed once per process (the claim takes a file lock
    /// shared with other processes, and may change ownership), then known.
    claimed: parking_lot::Mutex<std::collections::HashMap<String, UserSwitch>>,
}

impl Workspaces {
    /// The workspace root `root` (created if missing), opened.
    pub fn new(root: PathBuf, users: Option<TenantUsers>) -> Result<Self, WorkspaceError> {
        let opened = WorkspaceRoot::open(&root)?;
        Ok(Self {
            root,
            opened,
            users,
            claimed: parking_lot::Mutex::default(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/<tenant>`: every directory of the tenant's sessions lies inside it.
    pub fn tenant_dir(&self, tenant: &str) -> PathBuf {
        self.root.join(encode(tenant))
    }

    /// `<root>/.sandbox/<tenant>`: the tenant's sessions' homes and temporary directories.
    pub fn tenant_private_dir(&self, tenant: &str) -> PathBuf {
        self.root.join(PRIVATE_DIRS).join(encode(tenant))
    }

    fn default_workspace(&self, tenant: &str, host: &str, session: &str) -> PathBuf {
        default_session_dir(&self.tenant_dir(tenant), host, session)
    }

    fn private_dir(&self, tenant: &str, host: &str, session: &str) -> PathBuf {
        self.tenant_private_dir(tenant)
            .join(encode(host))
            .join(session_name(session))
    }

    /// The tenant's user (claiming one for a new tenant), when sandboxes switch users.
    pub fn tenant_user(&self, tenant: &str) -> Result<Option<UserSwitch>, WorkspaceError> {
        let Some(users) = &self.users else {
            return Ok(None);
        };
        // Known, and its directory still the tenant's: it is that user's (a directory removed and made again
        // may have gone to another user meanwhile: claimed again).
        let known = self.claimed.lock().get(tenant).copied();
        if let Some(user) = known {
            let dir = self.opened.path().join(encode(tenant));
            let owner = std::fs::symlink_metadata(&dir)
                .ok()
                .filter(|meta| meta.is_dir())
                .map(|meta| std::os::unix::fs::MetadataExt::uid(&meta));
            if owner == Some(user.uid) {
                return Ok(Some(user));
            }
        }
        // The first claim blocks (a file lock, maybe a chown of the tenant's directory): off the runtime's
        // worker, which hands its other tasks over meanwhile.
        let user = blocking(|| users.claim(&self.opened, &encode(tenant), tenant))?;
        self.claimed.lock().insert(tenant.to_string(), user);
        Ok(Some(user))
    }

    /// The directories of `session` (of `host` of `tenant`), created if missing: its working directory is
    /// `requested` (a `file://` URI or absolute path) when that names a directory inside `<root>/<tenant>/`
    /// (not the tenant's directory itself, nor the one holding its host's sessions), else its own. `..`
    /// components and symbolic links anywhere on the way are refused.
    pub fn session(
        &self,
        tenant: &str,
        host: &str,
        session: &str,
        requested: Option<&str>,
    ) -> Result<SessionDirs, WorkspaceError> {
        let wanted = match requested {
            None => self.default_workspace(tenant, host, session),
            Some(requested) => self.named_workspace(tenant, host, requested)?,
        };
        self.dirs(tenant, host, session, &wanted)
    }

    /// The directories of the tenant's file server (`host`/`session` name its private ones): its working
    /// directory is the tenant's whole directory.
    pub fn tenant_wide(
        &self,
        tenant: &str,
        host: &str,
        session: &str,
    ) -> Result<SessionDirs, WorkspaceError> {
        self.dirs(tenant, host, session, &self.tenant_dir(tenant))
    }

    /// `dirs` with a home of the devices' own instead of the agent's (`…/<session>/device-home`): what a member
    /// types in a terminal (its history, its `~/.inputrc`, `~/.bashrc`) is not the agent's to read or plant.
    pub fn for_devices(&self, dirs: SessionDirs) -> Result<SessionDirs, WorkspaceError> {
        let Some(private) = dirs.home.parent() else {
            return Ok(dirs);
        };
        let home = private.join("device-home");
        self.opened.create_dirs(&home, dirs.user, 0o700)?;
        Ok(SessionDirs { home, ..dirs })
    }

    /// The directories of a file server of host `host` of the tenant alone (`session` names its private ones):
    /// its working directory is `<root>/<tenant>/<host>`.
    pub fn host_wide(&self, tenant: &str, host: &str, session: &str) -> Result<SessionDirs, WorkspaceError> {
        let wanted = self.tenant_dir(tenant).join(encode(host));
        self.dirs(tenant, &format!("{host}{session}"), session, &wanted)
    }

    /// The working directory a client named, checked: inside the tenant's directory, below it, and not the
    /// directory of the session's host (which holds other sessions' directories).
    fn named_workspace(&self, tenant: &str, host: &str, requested: &str) -> Result<PathBuf, WorkspaceError> {
        let path = PathBuf::from(requested.strip_prefix("file://").unwrap_or(requested));
        if !path.is_absolute() {
            return Err(WorkspaceError::NotAbsolute(requested.into()));
        }
        if path.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(WorkspaceError::Outside(requested.into()));
        }
        let tenant_dir = self.tenant_dir(tenant);
        let tenant_real = self.opened.path().join(encode(tenant));
        let inside = path
            .strip_prefix(&tenant_dir)
            .or_else(|_| path.strip_prefix(&tenant_real))
            .map_err(|_| WorkspaceError::Outside(requested.into()))?;
        let mut names = inside.components().filter(|c| !matches!(c, Component::CurDir));
        match (names.next(), names.next()) {
            (None, _) => Err(WorkspaceError::SessionsDirectory(requested.into())),
            (Some(first), None) if first.as_os_str() == encode(host).as_str() => {
                Err(WorkspaceError::SessionsDirectory(requested.into()))
            }
            _ => Ok(tenant_dir.join(inside)),
        }
    }

    /// Create (beneath the root, never through a link) the tenant's directory, `wanted` and the session's
    /// private directories.
    fn dirs(
        &self,
        tenant: &str,
        host: &str,
        session: &str,
        wanted: &Path,
    ) -> Result<SessionDirs, WorkspaceError> {
        let user = self.tenant_user(tenant)?;
        let mode = if user.is_some() { 0o700 } else { 0o755 };
        self.opened.create_dirs(&self.tenant_dir(tenant), user, mode)?;
        self.opened.create_dirs(wanted, user, mode)?;
        let workspace = self.opened.path().join(self.opened.relative(wanted)?);
        let private = self.private_dir(tenant, host, session);
        self.private_root()?;
        self.opened
            .create_dirs(&self.tenant_private_dir(tenant), user, 0o700)?;
        let [home, tmp, shm] = ["home", "tmp", "shm"].map(|name| private.join(name));
        for dir in [&home, &tmp, &shm] {
            self.opened.create_dirs(dir, user, 0o700)?;
        }
        // A session disposed and created again (the same URI) keeps its new directories.
        self.opened.remove(&private.join(DISPOSED_MARKER))?;
        let (tenant_key, session_key) = cgroup_names(tenant, host, session);
        Ok(SessionDirs {
            workspace,
            home,
            tmp,
            shm,
            user,
            tenant_key,
            session_key,
        })
    }

    /// `<root>/.sandbox`, created if missing; root's (mode `0711`) when tenants have users of their own, also
    /// if an earlier release had given it to a tenant.
    fn private_root(&self) -> Result<(), WorkspaceError> {
        let dir = self.root.join(PRIVATE_DIRS);
        let opened = self.opened.create_dirs(&dir, None, 0o711)?;
        if self.users.is_some() {
            let io = |errno: rustix::io::Errno| WorkspaceError::Io {
                path: dir.clone(),
                source: errno.into(),
            };
            let root = Some(rustix::fs::Uid::ROOT);
            rustix::fs::fchown(&opened, root, Some(rustix::fs::Gid::ROOT)).map_err(io)?;
            rustix::fs::fchmod(&opened, rustix::fs::Mode::from_raw_mode(0o711)).map_err(io)?;
        }
        Ok(())
    }

    /// The bytes `tenant`'s workspace, homes and `/tmp`s hold on disk (links never followed).
    pub fn disk_usage(&self, tenant: &str) -> u64 {
        [self.tenant_dir(tenant), self.tenant_private_dir(tenant)]
            .iter()
            .map(|dir| self.opened.disk_usage(dir))
            .fold(0, u64::saturating_add)
    }

    /// The session is gone: remove its own working directory (not a shared one a client named) and its
    /// private directories, now or — with a retention — once it passed ([`Workspaces::sweep`]).
    pub fn dispose(&self, tenant: &str, host: &str, session: &str, retention: std::time::Duration) {
        let private = self.private_dir(tenant, host, session);
        let workspace = self.default_workspace(tenant, host, session);
        if retention.is_zero() {
            self.remove(&workspace);
            self.remove(&private);
            return;
        }
        let until = unix_now().saturating_add(retention.as_secs());
        let marked = self.opened.create_dirs(&private, None, 0o700).and_then(|_| {
            self.opened
                .write_file(&private.join(DISPOSED_MARKER), until.to_string().as_bytes())
        });
        if let Err(error) = marked {
            tracing::warn!(%error, "cannot mark a disposed session's directories");
        }
    }

    /// Remove the directories of disposed sessions whose retention passed; returns how many sessions' went.
    pub fn sweep(&self) -> usize {
        let now = unix_now();
        let mut removed = 0;
        let private_root = self.root.join(PRIVATE_DIRS);
        for tenant in self.opened.subdirectories(&private_root) {
            let tenant_dir = private_root.join(&tenant);
            for host in self.opened.subdirectories(&tenant_dir) {
                let host_dir = tenant_dir.join(&host);
                for session in self.opened.subdirectories(&host_dir) {
                    let private = host_dir.join(&session);
                    let due = self
                        .opened
                        .read_file(&private.join(DISPOSED_MARKER), 64)
                        .ok()
                        .flatten()
                        .and_then(|text| String::from_utf8_lossy(&text).trim().parse::<u64>().ok())
                        .is_some_and(|until| until <= now);
                    if !due {
                        continue;
                    }
                    // The same three names under the tenant's workspace: the session's own working directory.
                    self.remove(&self.root.join(&tenant).join(&host).join(&session));
                    self.remove(&private);
                    removed += 1;
                }
            }
        }
        removed
    }

    fn remove(&self, path: &Path) {
        match self.opened.remove(path) {
            Ok(()) => tracing::debug!(path = %path.display(), "removed a disposed session's directory"),
            Err(error) => {
                tracing::warn!(%error, "cannot remove a disposed session's directory")
            }
        }
    }
}

/// `<root>/<tenant>` (where every directory of the tenant's sessions lies) as a `file://` URI, its path
/// written as [`Workspaces::session`] reads requested directories back (literally, not percent-decoded).
pub fn tenant_dir_uri(root: &Path, tenant: &str) -> String {
    format!("file://{}", root.join(encode(tenant)).display())
}

/// A name as one directory name, injectively: `[A-Za-z0-9_-]` kept, other bytes `%XX`, the empty name `%`;
/// names that would be longer than [`MAX_NAME_BYTES`] become a prefix, `%~` and the SHA-256 of the name.
/// The working directory a session gets when its client names none: `<tenant dir>/<host>/<session>`.
pub fn default_session_dir(tenant_dir: &Path, host: &str, session: &str) -> PathBuf {
    tenant_dir.join(encode(host)).join(session_name(session))
}

pub fn encode(name: &str) -> String {
    if name.is_empty() {
        return "%".into();
    }
    let mut out = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    if out.len() <= MAX_NAME_BYTES {
        return out;
    }
    let digest = sha2::Sha256::digest(name.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    let mut cut: usize = 64;
    // Never cut inside a %XX escape.
    while out.as_bytes().get(cut.saturating_sub(1)) == Some(&b'%')
        || out.as_bytes().get(cut.saturating_sub(2)) == Some(&b'%')
    {
        cut -= 1;
    }
    format!("{}%~{hex}", &out[..cut])
}

/// The names of a tenant's cgroup and of one of its sessions' (one path segment each, injective, within the
/// kernel's 255 bytes: a session's name that would be longer is `~` and the SHA-256 of it).
pub fn cgroup_names(tenant: &str, host: &str, session: &str) -> (String, String) {
    // `.` is never part of an encoded name: it separates the host from the session unambiguously.
    let session_key = format!("{}.{}", encode(host), session_name(session));
    let session_key = if session_key.len() > MAX_CGROUP_NAME_BYTES {
        // `~` never starts an encoded name: a hashed key never equals a plain one.
        let digest = sha2::Sha256::digest(session_key.as_bytes());
        format!(
            "~{}",
            digest.iter().map(|b| format!("{b:02x}")).collect::<String>()
        )
    } else {
        session_key
    };
    (encode(tenant), session_key)
}

/// A session URI's directory name: `ahp-session:/NAME` is `encode(NAME)`; any other URI is marked apart with
/// `%%` (which [`encode`] never produces), so no two URIs share a directory.
fn session_name(session: &str) -> String {
    match session.strip_prefix("ahp-session:/") {
        Some(rest) => encode(rest),
        None => format!("%%{}", encode(session)),
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Run blocking work from code that may run on a Tokio worker without holding up the worker's other tasks (on a
/// multi-thread runtime the worker hands them over while this blocks; elsewhere it just runs).
fn blocking<T>(work: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspaces(root: &Path) -> Workspaces {
        Workspaces::new(root.to_path_buf(), None).expect("workspaces")
    }

    #[test]
    fn a_session_works_inside_its_tenants_directory_only() {
        let root = tempfile::tempdir().expect("tempdir");
        let root = root.path();
        let ws = workspaces(root);
        let default = ws
            .session("acme", "default", "ahp-session:/s1", None)
            .expect("default");
        assert!(
            default.workspace.ends_with("acme/default/s1"),
            "{}",
            default.workspace.display()
        );
        assert!(
            default.home.ends_with(".sandbox/acme/default/s1/home"),
            "{}",
            default.home.display()
        );
        let inside = root.join("acme/project");
        let named = format!("file://{}", inside.display());
        assert_eq!(
            ws.session("acme", "default", "ahp-session:/s2", Some(&named))
                .expect("inside")
                .workspace,
            inside.canonicalize().expect("exists")
        );
        let escapes = [
            format!("{}/acme/../globex", root.display()),
            format!("{}/globex/x", root.display()),
            format!("{}/.sandbox/acme", root.display()),
            "/etc".to_string(),
            "relative/dir".to_string(),
        ];
        for escape in &escapes {
            assert!(
                ws.session("acme", "default", "ahp-session:/s3", Some(escape))
                    .is_err(),
                "{escape}"
            );
        }
        // A symlink inside the tenant's directory that leads out of it.
        let outside = root.join("globex");
        std::fs::create_dir_all(&outside).expect("mkdir");
        std::os::unix::fs::symlink(&outside, root.join("acme/link")).expect("symlink");
        let through_link = format!("{}/acme/link", root.display());
        assert!(ws
            .session("acme", "default", "ahp-session:/s4", Some(&through_link))
            .is_err());
    }

    #[test]
    fn names_map_to_directories_injectively() {
        let names = [
            "a.b",
            "a_b",
            "a%2Eb",
            "a/b",
            "",
            "%",
            ".",
            "..",
            "a-b",
            "A.B",
            "ahp-session:x",
            "é",
        ];
        let encoded: std::collections::HashSet<String> = names.iter().map(|n| encode(n)).collect();
        assert_eq!(encoded.len(), names.len(), "{encoded:?}");
        for name in encoded {
            assert!(
                !name.starts_with('.') && !name.contains('/') && !name.is_empty(),
                "{name}"
            );
        }
        let long_a = "x".repeat(300);
        let long_b = format!("{}y", "x".repeat(299));
        assert_ne!(encode(&long_a), encode(&long_b));
        assert!(encode(&long_a).len() < 255 && encode(&"é".repeat(200)).len() < 255);
        let sessions = [
            "ahp-session:/x",
            "ahp-session:x",
            "x",
            "ahp-session:/ahp-session:x",
        ];
        let dirs: std::collections::HashSet<String> = sessions.iter().map(|s| session_name(s)).collect();
        assert_eq!(dirs.len(), sessions.len(), "{dirs:?}");
    }

    #[test]
    fn disposing_removes_a_sessions_own_directories_and_keeps_a_shared_one() {
        let root = tempfile::tempdir().expect("tempdir");
        let ws = workspaces(root.path());
        let own = ws
            .session("acme", "default", "ahp-session:/s1", None)
            .expect("own");
        let shared_path = root.path().join("acme/shared");
        let shared = ws
            .session(
                "acme",
                "default",
                "ahp-session:/s2",
                Some(&shared_path.display().to_string()),
            )
            .expect("shared");
        std::fs::write(own.workspace.join("f"), "x").expect("write");
        std::fs::write(shared.workspace.join("g"), "x").expect("write");
        ws.dispose("acme", "default", "ahp-session:/s1", std::time::Duration::ZERO);
        ws.dispose("acme", "default", "ahp-session:/s2", std::time::Duration::ZERO);
        assert!(!own.workspace.exists() && !own.home.exists());
        assert!(
            shared.workspace.join("g").exists(),
            "a directory a client named is the tenant's"
        );
        assert!(!shared.home.exists());

        // With a retention: marked, kept, and swept only once it passed.
        let kept = ws
            .session("acme", "default", "ahp-session:/s3", None)
            .expect("kept");
        ws.dispose(
            "acme",
            "default",
            "ahp-session:/s3",
            std::time::Duration::from_secs(3600),
        );
        assert_eq!(ws.sweep(), 0);
        assert!(kept.workspace.exists());
        let marker = kept.home.parent().expect("private dir").join(DISPOSED_MARKER);
        std::fs::write(&marker, unix_now().saturating_sub(1).to_string()).expect("age the marker");
        assert_eq!(ws.sweep(), 1);
        assert!(!kept.workspace.exists() && !kept.home.exists());
    }

    #[test]
    fn a_tenant_root_or_host_directory_is_no_working_directory_and_links_lead_nowhere() {
        let top = tempfile::tempdir().expect("tempdir");
        let root = top.path().join("root");
        let ws = workspaces(&root);
        let outside = top.path().join("etc");
        std::fs::create_dir_all(&outside).expect("mkdir");
        std::fs::write(outside.join("passwd"), "root:x:0:0").expect("write");
        for named in [
            format!("file://{}/acme", root.display()),
            format!("file://{}/acme/", root.display()),
            format!("file://{}/acme/default", root.display()),
        ] {
            let refused = ws.session("acme", "default", "ahp-session:/s1", Some(&named));
            assert!(
                matches!(refused, Err(WorkspaceError::SessionsDirectory(_))),
                "{named}: {refused:?}"
            );
        }
        // The host directory swapped for a link (route (a) of issue 32): no session is made through it, and
        // disposing one removes nothing outside.
        let s1 = ws
            .session("acme", "default", "ahp-session:/etc", None)
            .expect("s1");
        std::fs::rename(root.join("acme/default"), root.join("acme/default-old")).expect("mv");
        std::os::unix::fs::symlink(top.path(), root.join("acme/default")).expect("ln");
        assert!(ws.session("acme", "default", "ahp-session:/s2", None).is_err());
        ws.dispose("acme", "default", "ahp-session:/etc", std::time::Duration::ZERO);
        assert_eq!(
            std::fs::read_to_string(outside.join("passwd")).expect("kept"),
            "root:x:0:0"
        );
        assert!(!s1.home.exists(), "its private directories went");
        // A link inside the tenant's directory (even to a directory of its own) names no working directory.
        std::os::unix::fs::symlink(root.join("acme/default-old"), root.join("acme/alias")).expect("ln");
        let alias = format!("file://{}/acme/alias/etc", root.display());
        assert!(ws
            .session("acme", "default", "ahp-session:/s3", Some(&alias))
            .is_err());
        // Swept with a retention: the same.
        let s4 = ws.session("acme", "other", "ahp-session:/etc", None).expect("s4");
        std::fs::write(s4.workspace.join("f"), "x").expect("write");
        ws.dispose(
            "acme",
            "other",
            "ahp-session:/etc",
            std::time::Duration::from_secs(1),
        );
        std::fs::rename(root.join("acme/other"), root.join("acme/other-old")).expect("mv");
        std::os::unix::fs::symlink(top.path(), root.join("acme/other")).expect("ln");
        let marker = s4.home.parent().expect("private").join(DISPOSED_MARKER);
        std::fs::write(&marker, "0").expect("age the marker");
        assert_eq!(ws.sweep(), 1);
        assert!(outside.join("passwd").exists());
        assert!(
            root.join("acme/other-old/etc/f").exists(),
            "the link was not followed"
        );
    }

    #[test]
    fn cgroup_names_are_distinct_path_segments_however_long_the_names() {
        let long = "h".repeat(400);
        let (tenant, session) = cgroup_names(&"t".repeat(400), &long, &format!("ahp-session:/{long}"));
        assert!(
            tenant.len() <= 255 && session.len() <= 255,
            "{} {}",
            tenant.len(),
            session.len()
        );
        assert!(!session.contains('/') && !tenant.contains('/'));
        let (_, other) = cgroup_names(&"t".repeat(400), &long, &format!("ahp-session:/{long}x"));
        assert_ne!(session, other, "two long sessions, two cgroups");
        let (_, short) = cgroup_names("t", "default", "ahp-session:/s1");
        assert_eq!(short, "default.s1");
    }
}
