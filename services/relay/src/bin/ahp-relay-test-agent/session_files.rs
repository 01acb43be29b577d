//! Where the test agent keeps its sessions (`<cwd>/.test-agent/<id>`: the number of prompts seen), so a new process
//! can `session/load` them.

use std::path::PathBuf;

pub(crate) fn session_file(cwd: &std::path::Path, id: &str) -> PathBuf {
    cwd.join(".test-agent").join(id)
}

pub(crate) fn load_count(cwd: &std::path::Path, id: &str) -> Option<u64> {
    std::fs::read_to_string(session_file(cwd, id))
        .ok()?
        .trim()
        .parse()
        .ok()
}

pub(crate) fn store_count(cwd: &std::path::Path, id: &str, count: u64) -> agent_client_protocol::Result<()> {
    let file = session_file(cwd, id);
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).map_err(agent_client_protocol::Error::into_internal_error)?;
    }
    std::fs::write(file, count.to_string()).map_err(agent_client_protocol::Error::into_internal_error)
}
