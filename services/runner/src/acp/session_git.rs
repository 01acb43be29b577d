//! Git at a session's start, in the session's own sandbox (the agent's confinement) with the configuration
//! [`crate::git`] forces: listing the repository's configuration, and switching its working directory to a
//! branch. Nothing the repository names runs.

use super::agent_link::Place;

/// Switch the session's working directory (a git repository) to `branch`, in the session's own sandbox (the
/// agent's confinement), before its agent starts, with the configuration [`crate::git`] forces: nothing the
/// repository names runs.
pub(crate) async fn switch_branch(
    place: &Place,
    spec: &relay_sandbox::SandboxSpec,
    branch: &str,
) -> Result<(), String> {
    let valid = !branch.is_empty()
        && branch.len() <= 255
        && !branch.starts_with('-')
        && !branch.contains("..")
        && !branch
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || "~^:?*[\\".contains(c));
    if !valid {
        return Err(format!("{branch:?} is not a branch name"));
    }
    let failed = |why: String| format!("cannot switch to branch {branch}: {why}");
    // The drivers the repository defines, as git reads them (in the sandbox), each forced empty for the switch.
    let (listed, listing) = git_in_sandbox(
        place,
        spec,
        &crate::git::ForcedConfig::base(),
        crate::git::LIST_NAMES,
    )
    .await
    .map_err(failed)?;
    // A listing that failed or was cut could leave a driver unforced.
    listing.map_err(failed)?;
    if listed.len() >= LISTING_MAX {
        return Err(failed(
            "the repository's configuration is too large to check".into(),
        ));
    }
    if crate::git::ForcedConfig::names_unforceable(&listed) {
        return Err(failed(
            "the repository's configuration has names that are not UTF-8".into(),
        ));
    }
    let forced = crate::git::ForcedConfig::for_listed(&listed);
    let (_, status) = git_in_sandbox(place, spec, &forced, &["switch", branch])
        .await
        .map_err(failed)?;
    status.map_err(failed)
}

/// The most of a git's output read (a configuration's names); reaching it is an error for the listing.
pub(crate) const LISTING_MAX: usize = 1024 * 1024;
/// How long a git the session's start runs (listing the configuration, switching branch) may take.
pub(crate) const GIT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// Run git with `args` and the `forced` configuration in the session's sandbox: its output (at most 1 MiB), and
/// whether it succeeded (else what it said).
pub(crate) async fn git_in_sandbox(
    place: &Place,
    spec: &relay_sandbox::SandboxSpec,
    forced: &crate::git::ForcedConfig,
    args: &[&str],
) -> Result<(Vec<u8>, Result<(), String>), String> {
    use tokio::io::AsyncReadExt;
    let mut env = forced.environment();
    env.insert("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into());
    let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
    let (mut child, _slot) = place
        .sandboxes
        .start(&place.tenant, spec, "git", &args, &env)
        .await
        .map_err(|error| error.to_string())?;
    drop(child.stdin.take());
    let (mut out, mut said) = (Vec::new(), Vec::new());
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    // What is kept is bounded; the rest is read and dropped, so git never waits on a full pipe (a refused
    // switch lists every dirty file).
    let read_out = async {
        if let Some(mut stdout) = stdout {
            let _ = (&mut stdout).take(LISTING_MAX as u64).read_to_end(&mut out).await;
            let _ = tokio::io::copy(&mut stdout, &mut tokio::io::sink()).await;
        }
    };
    let read_err = async {
        if let Some(mut stderr) = stderr {
            let _ = (&mut stderr).take(8 * 1024).read_to_end(&mut said).await;
            let _ = tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await;
        }
    };
    let finished = tokio::time::timeout(GIT_PATIENCE, async {
        tokio::join!(read_out, read_err);
        child.wait().await
    })
    .await;
    let status = match finished {
        Ok(status) => status.map_err(|error| error.to_string())?,
        Err(_) => {
            let _ = child.start_kill();
            return Err(format!("git did not finish within {}s", GIT_PATIENCE.as_secs()));
        }
    };
    let said = String::from_utf8_lossy(&said);
    let outcome = if status.success() {
        Ok(())
    } else {
        Err(said.trim().to_string())
    };
    Ok((out, outcome))
}
