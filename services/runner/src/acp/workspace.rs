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

use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

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
    #[error("{0}")]
    User(#[from] relay_sandbox::users::UserError),
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

/// The workspace root of this runner (or `serve`).
#[derive(Debug)]
pub struct Workspaces {
    root: PathBuf,
    /// Per-tenant users, when sandboxes switch users.
    users: Option<TenantUsers>,
}

impl Workspaces {
    pub fn new(root: PathBuf, users: Option<TenantUsers>) -> Self {
        Self { root, users }
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
        create(&self.root)?;
        Ok(Some(users.claim(&self.root, &self.tenant_dir(tenant), tenant)?))
    }

    /// The directories of `session` (of `host` of `tenant`), created if missing: its working directory is
    /// `requested` (a `file://` URI or absolute path) when that lies inside `<root>/<tenant>/`, else its own.
    /// `..` components and symlinks that lead out of the tenant's directory are refused.
    pub fn session(
        &self,
        tenant: &str,
        host: &str,
        session: &str,
        requested: Option<&str>,
    ) -> Result<SessionDirs, WorkspaceError> {
        let user = self.tenant_user(tenant)?;
        let tenant_dir = self.tenant_dir(tenant);
        create_owned(&tenant_dir, user)?;
        let tenant_real = canonical(&tenant_dir)?;
        let wanted = match requested {
            None => self.default_workspace(tenant, host, session),
            Some(requested) => {
                let path = PathBuf::from(requested.strip_prefix("file://").unwrap_or(requested));
                if !path.is_absolute() {
                    return Err(WorkspaceError::NotAbsolute(requested.into()));
                }
                if path.components().any(|c| matches!(c, Component::ParentDir)) {
                    return Err(WorkspaceError::Outside(requested.into()));
                }
                let inside = path.starts_with(&tenant_dir) || path.starts_with(&tenant_real);
                if !inside {
                    return Err(WorkspaceError::Outside(requested.into()));
                }
                path
            }
        };
        create_owned(&wanted, user)?;
        let workspace = canonical(&wanted)?;
        if !workspace.starts_with(&tenant_real) {
            return Err(WorkspaceError::Outside(wanted.display().to_string()));
        }
        let private = self.private_dir(tenant, host, session);
        self.private_root()?;
        create_owned(&self.tenant_private_dir(tenant), user)?;
        let [home, tmp, shm] = ["home", "tmp", "shm"].map(|name| private.join(name));
        for dir in [&home, &tmp, &shm] {
            create_owned(dir, user)?;
        }
        // A session disposed and created again (the same URI) keeps its new directories.
        let _ = std::fs::remove_file(private.join(DISPOSED_MARKER));
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
        create(&dir)?;
        if self.users.is_some() {
            let io = |source| WorkspaceError::Io {
                path: dir.clone(),
                source,
            };
            std::os::unix::fs::lchown(&dir, Some(0), Some(0)).map_err(io)?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).map_err(io)?;
        }
        Ok(())
    }

    /// The session is gone: remove its own working directory (not a shared one a client named) and its
    /// private directories, now or — with a retention — once it passed ([`Workspaces::sweep`]).
    pub fn dispose(&self, tenant: &str, host: &str, session: &str, retention: std::time::Duration) {
        let private = self.private_dir(tenant, host, session);
        let workspace = self.default_workspace(tenant, host, session);
        if retention.is_zero() {
            remove(&workspace);
            remove(&private);
            return;
        }
        let until = unix_now().saturating_add(retention.as_secs());
        if std::fs::create_dir_all(&private).is_ok() {
            if let Err(error) = std::fs::write(private.join(DISPOSED_MARKER), until.to_string()) {
                tracing::warn!(%error, path = %private.display(), "cannot mark a disposed session's directories");
            }
        }
    }

    /// Remove the directories of disposed sessions whose retention passed; returns how many sessions' went.
    pub fn sweep(&self) -> usize {
        let now = unix_now();
        let mut removed = 0;
        let private_root = self.root.join(PRIVATE_DIRS);
        for tenant in children(&private_root) {
            for host in children(&tenant) {
                for session in children(&host) {
                    let due = std::fs::read_to_string(session.join(DISPOSED_MARKER))
                        .ok()
                        .and_then(|text| text.trim().parse::<u64>().ok())
                        .is_some_and(|until| until <= now);
                    if !due {
                        continue;
                    }
                    // The same three names under the tenant's workspace: the session's own working directory.
                    if let (Some(t), Some(h), Some(s)) =
                        (tenant.file_name(), host.file_name(), session.file_name())
                    {
                        remove(&self.root.join(t).join(h).join(s));
                    }
                    remove(&session);
                    removed += 1;
                }
            }
        }
        removed
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

fn children(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|entry| entry.path()).collect())
        .unwrap_or_default()
}

fn remove(path: &Path) {
    match std::fs::remove_dir_all(path) {
        Ok(()) => tracing::debug!(path = %path.display(), "removed a disposed session's directory"),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => {
            tracing::warn!(%error, path = %path.display(), "cannot remove a disposed session's directory")
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn create(path: &Path) -> Result<(), WorkspaceError> {
    std::fs::create_dir_all(path).map_err(|source| WorkspaceError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Create `path` and its missing parents; those made here belong to `user` (when there is one) and are private
/// to it (`0700`).
fn create_owned(path: &Path, user: Option<UserSwitch>) -> Result<(), WorkspaceError> {
    let missing: Vec<PathBuf> = path
        .ancestors()
        .take_while(|ancestor| !ancestor.exists())
        .map(Path::to_path_buf)
        .collect();
    create(path)?;
    if let Some(user) = user {
        for dir in missing {
            let io = |source| WorkspaceError::Io {
                path: dir.clone(),
                source,
            };
            std::os::unix::fs::lchown(&dir, Some(user.uid), Some(user.gid)).map_err(io)?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
        }
    }
    Ok(())
}

fn canonical(path: &Path) -> Result<PathBuf, WorkspaceError> {
    path.canonicalize().map_err(|source| WorkspaceError::Io {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspaces(root: &Path) -> Workspaces {
        Workspaces::new(root.to_path_buf(), None)
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
