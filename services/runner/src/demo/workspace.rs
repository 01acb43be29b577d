//! Where the demo agent works when it has a workspace (its notes file, edited in its own sandbox), and how fast it
//! streams ([`DemoPace`]).

use std::sync::Arc;
use std::time::Duration;

/// The file the demo's echo tool reports editing (nothing is written: the edit is shown, not applied).
pub(crate) const DEMO_EDITED_FILE: &str = "/demo/notes.md";
/// That file's content before the edit; the edit appends the prompt as a line.
pub(crate) const DEMO_EDITED_BEFORE: &str = "# Notes\n\nEchoed prompts:\n";

/// How fast the demo agent streams.
#[derive(Debug, Clone, Copy)]
pub struct DemoPace {
    /// Pause before each streamed action.
    pub step: Duration,
}

impl Default for DemoPace {
    fn default() -> Self {
        Self {
            step: Duration::from_millis(40),
        }
    }
}

/// The workspace the demo agent works in: its root (`<root>/<tenant>/<host>/<session>` its sessions'
/// directories) and the tenants' file servers that write there.
#[derive(Clone)]
pub struct DemoWorkspace {
    pub root: std::path::PathBuf,
    pub files: Arc<dyn crate::files::FileAccess>,
}

impl std::fmt::Debug for DemoWorkspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DemoWorkspace").field("root", &self.root).finish()
    }
}

impl DemoWorkspace {
    /// The directory a session of `tenant` on `host` works in: the one its client named (inside the tenant's
    /// directory, and neither that directory nor its host's, which hold other sessions'), else its own — the
    /// rule agents' sessions follow ([`crate::acp::workspace::Workspaces::session`]).
    pub(crate) fn session_dir(
        &self,
        tenant: &str,
        host: &str,
        session: &str,
        named: Option<&str>,
    ) -> Result<String, String> {
        let tenant_root = self
            .files
            .tenant_root(tenant)
            .ok_or_else(|| "the demo agent's workspace is not available".to_string())?;
        let Some(named) = named else {
            let dir = crate::acp::workspace::default_session_dir(&tenant_root, host, session);
            return Ok(dir.display().to_string());
        };
        let path = std::path::PathBuf::from(named.strip_prefix("file://").unwrap_or(named));
        let inside = path.starts_with(&tenant_root)
            && !path
                .components()
                .any(|part| part == std::path::Component::ParentDir);
        let host_dir = tenant_root.join(crate::acp::workspace::encode(host));
        let shared = path == tenant_root || path == host_dir;
        if !inside || shared {
            return Err(format!(
                "{named}: a working directory is a directory of its own inside {}",
                tenant_root.display()
            ));
        }
        Ok(path.display().to_string())
    }
}
