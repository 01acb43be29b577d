//! Why an agent did not start, in its own words: what the connection said, how its process ended, the tail of
//! its stderr (kept as it runs), the paths it names that its sandbox does not show, and its ACP `authMethods`.

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

/// What is kept of an agent's stderr, for the message when it fails.
pub(crate) const STDERR_TAIL_BYTES: usize = 4096;

/// Why an agent did not start, in its own words: what the connection said, how the process ended, the tail of
/// its stderr, and any path it names that its sandbox does not show (with how to show it).
pub(crate) async fn start_failure(
    error: &str,
    mut exited: tokio::sync::watch::Receiver<Option<String>>,
    tail: &Mutex<std::collections::VecDeque<u8>>,
    unseen: &[PathBuf],
) -> String {
    // The process usually ended already; what it said is read by then.
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        exited.wait_for(Option::is_some),
    )
    .await;
    let status = exited
        .borrow()
        .clone()
        .unwrap_or_else(|| "still running".to_string());
    let said = {
        let tail = tail.lock();
        String::from_utf8_lossy(&tail.iter().copied().collect::<Vec<u8>>())
            .trim()
            .to_string()
    };
    let mut message = format!("the agent did not start: {error} (the agent: {status}");
    if !said.is_empty() {
        message.push_str(&format!("; it said: {said}"));
    }
    message.push(')');
    message.push_str(&unseen_hints(unseen));
    message
}

/// What to say of paths an agent's start names that its sandbox does not show, and how to show them.
pub(crate) fn unseen_hints(unseen: &[PathBuf]) -> String {
    unseen
        .iter()
        .map(|path| {
            let dir = path.parent().unwrap_or(path);
            format!(
                ". {} is not visible in the agent's sandbox: add {} to the agent's read_only_paths in the \
                 agents file",
                path.display(),
                dir.display()
            )
        })
        .collect()
}

/// Keep the last [`STDERR_TAIL_BYTES`] of what the agent writes to stderr (and log it, at debug).
pub(crate) async fn keep_tail(
    mut stderr: super::quota::ThrottledReader<tokio::process::ChildStderr>,
    tail: Arc<Mutex<std::collections::VecDeque<u8>>>,
    session: String,
) {
    use tokio::io::AsyncReadExt;
    let mut buffer = vec![0_u8; 8192];
    while let Ok(read) = stderr.read(&mut buffer).await {
        if read == 0 {
            return;
        }
        tracing::debug!(%session, stderr = %String::from_utf8_lossy(&buffer[..read]), "agent stderr");
        let mut tail = tail.lock();
        tail.extend(&buffer[..read]);
        let excess = tail.len().saturating_sub(STDERR_TAIL_BYTES);
        tail.drain(..excess);
    }
}

/// An agent's ACP `authMethods`, for its operators: `name (id): description`, `; `-separated.
pub(crate) fn describe_auth_methods(methods: &[agent_client_protocol::v1::schema::AuthMethod]) -> String {
    use agent_client_protocol::v1::schema::AuthMethod;
    methods
        .iter()
        .map(|method| {
            let (id, name, description) = match method {
                AuthMethod::Terminal(m) => (m.id.to_string(), &m.name, m.description.as_deref()),
                AuthMethod::Agent(m) => (m.id.to_string(), &m.name, m.description.as_deref()),
                #[allow(unreachable_patterns)]
                _ => return String::from("(an unknown kind of method)"),
            };
            match description {
                Some(description) => format!("{name} ({id}): {description}"),
                None => format!("{name} ({id})"),
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}
