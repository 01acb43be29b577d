//! What a client whose token is scoped to hosts (its `hosts` claim) may reach of its tenant's workspace: the
//! directories of those hosts (`<tenant root>/<host>/…`, where their sessions' own directories lie) and nothing
//! else — not another host's sessions, not a shared project directory. A path is placed lexically here (no
//! `..`); the operation then runs in a file server whose sandbox shows that host's directory alone, so no link
//! inside it leads elsewhere ([`relay_runner::files::FileAccess::call_within`]). A token of the whole tenant
//! (no `hosts`) is not scoped.

use std::path::{Component, Path};

use relay_core::rpc::RpcError;
use relay_core::Identity;
use relay_runner::acp::workspace::encode;

/// The host of `identity`'s scope whose directory holds `path` (`None` for a token of the whole tenant), or a
/// permission refusal (-32009) when the token is scoped and the path lies in none of its hosts' directories.
pub(crate) fn scope_for(
    identity: &Identity,
    tenant_root: Option<&Path>,
    path: &str,
) -> Result<Option<String>, RpcError> {
    let Some(hosts) = &identity.hosts else {
        return Ok(None);
    };
    let refused = || {
        RpcError::permission_denied(format!(
            "{path} is outside the directories of the hosts this token is scoped to ({})",
            hosts.join(", ")
        ))
    };
    let rest = tenant_root
        .and_then(|root| Path::new(path).strip_prefix(root).ok())
        .ok_or_else(refused)?;
    if rest.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(refused());
    }
    let first = rest.components().next().ok_or_else(refused)?;
    hosts
        .iter()
        .find(|host| first.as_os_str() == encode(host).as_str())
        .map(|host| Some(host.clone()))
        .ok_or_else(refused)
}

/// Whether a working directory (a `file://` URI or path) lies in a directory the token reaches (always, for a
/// token of the whole tenant).
pub(crate) fn check_directory(
    identity: &Identity,
    tenant_root: Option<&Path>,
    directory: &str,
) -> Result<(), RpcError> {
    let path = directory.strip_prefix("file://").unwrap_or(directory);
    scope_for(identity, tenant_root, path).map(|_| ())
}

impl crate::host::HostCore {
    /// Whether `connection`'s token reaches `directory` (a working directory it names, or the one of a session
    /// it acts on): always for a token of the whole tenant; -32009 for a host-scoped token elsewhere.
    pub(crate) fn scope_reaches(
        &self,
        connection: relay_core::ConnectionId,
        directory: &str,
    ) -> Result<(), RpcError> {
        let identity = &self.connection(connection)?.identity;
        if identity.hosts.is_none() {
            return Ok(());
        }
        let root = self
            .providers
            .files()
            .and_then(|files| files.tenant_root(&self.key.tenant));
        check_directory(identity, root.as_deref(), directory)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_core::Role;

    fn identity(hosts: Option<&[&str]>) -> Identity {
        Identity {
            subject: "u".into(),
            tenant: "t".into(),
            role: Role::Member,
            hosts: hosts.map(|hosts| hosts.iter().map(|h| h.to_string()).collect()),
        }
    }

    #[test]
    fn a_scoped_token_reaches_its_hosts_directories_only() {
        let root = Path::new("/ws/t");
        let team1 = identity(Some(&["team1"]));
        assert_eq!(
            scope_for(&team1, Some(root), "/ws/t/team1/s1/a.txt").expect("inside"),
            Some("team1".to_string())
        );
        for path in [
            "/ws/t/team2/s1/a.txt",
            "/ws/t/team1/../team2/s1",
            "/ws/t/project/a.txt",
            "/ws/t",
            "/etc/passwd",
        ] {
            assert!(scope_for(&team1, Some(root), path).is_err(), "{path}");
        }
        assert!(
            scope_for(&team1, None, "/ws/t/team1/x").is_err(),
            "no workspace known"
        );
        // A host name is encoded as its directory is.
        let dotted = identity(Some(&["a.b"]));
        assert!(scope_for(&dotted, Some(root), "/ws/t/a%2Eb/s").is_ok());
        assert!(scope_for(&dotted, Some(root), "/ws/t/a.b/s").is_err());
        // A token of the whole tenant is not scoped.
        assert_eq!(
            scope_for(&identity(None), Some(root), "/ws/t/project").expect("tenant"),
            None
        );
        assert!(check_directory(&team1, Some(root), "file:///ws/t/team2/s").is_err());
        assert!(check_directory(&team1, Some(root), "file:///ws/t/team1/s").is_ok());
    }
}
