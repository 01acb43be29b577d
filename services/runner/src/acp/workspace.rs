//! Where a session's agent works: a directory under `<workspace_root>/<tenant>/`, and nowhere else.

use std::path::{Component, Path, PathBuf};

/// Why a working directory was refused.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error("the working directory {0} is outside this tenant's workspace")]
    Outside(String),
    #[error("the working directory {0} is not an absolute path or file:// URI")]
    NotAbsolute(String),
    #[error("cannot prepare the working directory {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// The directory a session's agent works in, created if missing: `requested` (a `file://` URI or absolute
/// path) when it lies inside `<root>/<tenant>/`, or `<root>/<tenant>/<host>/<session name>` when none is
/// named.
/// `..` components and symlinks that lead out of the tenant's directory are refused.
pub fn session_directory(
    root: &Path,
    tenant: &str,
    host: &str,
    session: &str,
    requested: Option<&str>,
) -> Result<PathBuf, WorkspaceError> {
    let tenant_dir = root.join(safe_name(tenant));
    create(&tenant_dir)?;
    let tenant_real = canonical(&tenant_dir)?;
    let wanted = match requested {
        None => tenant_dir
            .join(safe_name(host))
            .join(safe_name(session.trim_start_matches("ahp-session:"))),
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
    create(&wanted)?;
    let real = canonical(&wanted)?;
    if !real.starts_with(&tenant_real) {
        return Err(WorkspaceError::Outside(wanted.display().to_string()));
    }
    Ok(real)
}

/// A single path segment made of the name's safe characters.
fn safe_name(name: &str) -> String {
    let cleaned: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if cleaned.chars().all(|c| c == '_') {
        format!("_{}", cleaned.len())
    } else {
        cleaned
    }
}

fn create(path: &Path) -> Result<(), WorkspaceError> {
    std::fs::create_dir_all(path).map_err(|source| WorkspaceError::Io {
        path: path.to_path_buf(),
        source,
    })
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

    #[test]
    fn a_session_works_inside_its_tenants_directory_only() {
        let root = tempfile::tempdir().expect("tempdir");
        let root = root.path();
        let default = session_directory(root, "acme", "default", "ahp-session:/s1", None).expect("default");
        assert!(default.ends_with("acme/default/_s1"), "{}", default.display());
        let inside = root.join("acme/project");
        let named = format!("file://{}", inside.display());
        assert_eq!(
            session_directory(root, "acme", "default", "ahp-session:/s2", Some(&named)).expect("inside"),
            inside.canonicalize().expect("exists")
        );
        let escapes = [
            format!("{}/acme/../globex", root.display()),
            format!("{}/globex/x", root.display()),
            "/etc".to_string(),
            "relative/dir".to_string(),
        ];
        for escape in &escapes {
            assert!(
                session_directory(root, "acme", "default", "ahp-session:/s3", Some(escape)).is_err(),
                "{escape}"
            );
        }
        // A symlink inside the tenant's directory that leads out of it.
        let outside = root.join("globex");
        std::fs::create_dir_all(&outside).expect("mkdir");
        std::os::unix::fs::symlink(&outside, root.join("acme/link")).expect("symlink");
        let through_link = format!("{}/acme/link", root.display());
        assert!(session_directory(root, "acme", "default", "ahp-session:/s4", Some(&through_link)).is_err());
    }
}
