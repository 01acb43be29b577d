//! The configuration every git the relay starts on a tenant's content runs with ([`ForcedConfig`]): nothing of
//! the tenant's may make it run a command.
//!
//! A repository's own configuration (`.git/config`, what it includes, `.git/info/attributes`) is the agent's to
//! write. The relay never reads it to decide what is safe (its parser would disagree with git's: a section header
//! on the line of another, a byte that is not UTF-8). Instead every key git runs a command from is forced at the
//! command scope, which wins over every file: hooks, the filesystem monitor, pagers, editors, ssh, askpass,
//! signing programs, external diff and every transport off. Filter, diff and merge drivers have names of the
//! repository's choosing, so git itself lists the names its configuration defines (`git config --list`, includes
//! followed, with this same forced configuration) and each driver found is forced empty: a filter with no
//! command is no filter. Forced keys travel as `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_n`/`GIT_CONFIG_VALUE_n`, so no
//! name (a subsection may hold `=`) is ever parsed twice.
//!
//! The relay also runs such git where it sees only the session's directory (the session's sandbox, or a
//! Landlock domain of that directory inside the file server), so a driver defined between the listing and the
//! run (the agent runs meanwhile) runs with no more reach than the agent has already.

use std::collections::BTreeMap;

/// Keys forced for every git, whatever the repository says.
const FORCED: &[(&str, &str)] = &[
    ("core.hooksPath", "/dev/null"),
    ("core.fsmonitor", "false"),
    ("core.sshCommand", "false"),
    ("core.askPass", "false"),
    ("core.pager", "cat"),
    ("core.editor", "true"),
    ("core.gitProxy", ""),
    ("core.alternateRefsCommand", ""),
    ("core.autocrlf", "false"),
    ("core.untrackedCache", "false"),
    ("sequence.editor", "true"),
    ("diff.external", ""),
    ("credential.helper", ""),
    ("gpg.program", "false"),
    ("gpg.ssh.program", "false"),
    ("gpg.x509.program", "false"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("protocol.allow", "never"),
    ("submodule.recurse", "false"),
    ("uploadpack.packObjectsHook", ""),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("safe.bareRepository", "explicit"),
    ("trace2.normalTarget", ""),
    ("trace2.perfTarget", ""),
    ("trace2.eventTarget", ""),
];

/// The environment every git gets (besides `PATH`): no system or global configuration, no prompts.
pub const ENVIRONMENT: &[(&str, &str)] = &[
    ("GIT_CONFIG_NOSYSTEM", "1"),
    ("GIT_CONFIG_GLOBAL", "/dev/null"),
    ("GIT_ATTR_NOSYSTEM", "1"),
    ("GIT_TERMINAL_PROMPT", "0"),
    ("GIT_PAGER", "cat"),
    ("GIT_EDITOR", "true"),
    ("GIT_SSH_COMMAND", "false"),
    ("GIT_ASKPASS", "false"),
    ("SSH_ASKPASS", "false"),
    ("GIT_PROTOCOL_FROM_USER", "0"),
    ("GIT_LITERAL_PATHSPECS", "1"),
    ("GIT_OPTIONAL_LOCKS", "0"),
];

/// The arguments that make git list the names its configuration defines (NUL-separated).
pub const LIST_NAMES: &[&str] = &["config", "--null", "--name-only", "--list"];

/// The driver keys of each kind, and what each is forced to.
const DRIVERS: &[(&str, &[(&str, &str)])] = &[
    (
        "filter",
        &[
            ("clean", ""),
            ("smudge", ""),
            ("process", ""),
            ("required", "false"),
        ],
    ),
    ("diff", &[("command", ""), ("textconv", "cat")]),
    ("merge", &[("driver", "")]),
];

/// The forced configuration of one git run.
#[derive(Debug, Clone, Default)]
pub struct ForcedConfig {
    keys: Vec<(String, String)>,
}

impl ForcedConfig {
    /// The keys forced whatever the repository (enough where git runs on a configuration the relay wrote).
    pub fn base() -> ForcedConfig {
        ForcedConfig {
            keys: FORCED
                .iter()
                .map(|(key, value)| (key.to_string(), value.to_string()))
                .collect(),
        }
    }

    /// The base keys, and every driver `listed` (the output of git with [`LIST_NAMES`]) names forced empty.
    pub fn for_listed(listed: &[u8]) -> ForcedConfig {
        let mut forced = ForcedConfig::base();
        let mut drivers: Vec<(&str, String)> = Vec::new();
        for name in listed.split(|byte| *byte == 0 || *byte == b'\n') {
            let Ok(name) = std::str::from_utf8(name) else {
                // git lists names as it read them; a subsection that is not UTF-8 cannot travel as a key here,
                // so such a repository is refused by the caller (see `names_unforceable`).
                continue;
            };
            let Some((section, rest)) = name.split_once('.') else {
                continue;
            };
            let Some((subsection, _key)) = rest.rsplit_once('.') else {
                continue;
            };
            let section = section.to_ascii_lowercase();
            if let Some((kind, _)) = DRIVERS.iter().find(|(kind, _)| *kind == section) {
                if !drivers.iter().any(|(k, s)| k == kind && s.as_str() == subsection) {
                    drivers.push((kind, subsection.to_string()));
                }
            }
        }
        for (kind, subsection) in drivers {
            if let Some((_, keys)) = DRIVERS.iter().find(|(k, _)| *k == kind) {
                for (key, value) in keys.iter() {
                    forced
                        .keys
                        .push((format!("{kind}.{subsection}.{key}"), value.to_string()));
                }
            }
        }
        forced
    }

    /// Whether `listed` names a driver whose name this module cannot force (not UTF-8): such a repository is
    /// not worked on.
    pub fn names_unforceable(listed: &[u8]) -> bool {
        listed
            .split(|byte| *byte == 0 || *byte == b'\n')
            .any(|name| std::str::from_utf8(name).is_err())
    }

    /// The environment of a git run: [`ENVIRONMENT`] and the forced keys.
    pub fn environment(&self) -> BTreeMap<String, String> {
        let mut env: BTreeMap<String, String> = ENVIRONMENT
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect();
        env.insert("GIT_CONFIG_COUNT".into(), self.keys.len().to_string());
        for (index, (key, value)) in self.keys.iter().enumerate() {
            env.insert(format!("GIT_CONFIG_KEY_{index}"), key.clone());
            env.insert(format!("GIT_CONFIG_VALUE_{index}"), value.clone());
        }
        env
    }

    /// A `git` command whose environment is exactly [`ForcedConfig::environment`] plus `PATH` (callers add
    /// what they need after).
    pub fn command(&self) -> std::process::Command {
        let mut command = std::process::Command::new("git");
        command
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .envs(self.environment());
        command
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::process::Command;

    /// A repository whose configuration plants every command-running key the issue names, each `touch`ing a
    /// file in `witness` when it runs.
    fn planted_repository(dir: &Path, witness: &Path) {
        let git = |args: &[&str]| {
            let status = Command::new("git")
                .args(args)
                .current_dir(dir)
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .status()
                .expect("git");
            assert!(status.success(), "{args:?}");
        };
        git(&["init", "-q", "-b", "main"]);
        git(&[
            "-c",
            "user.name=a",
            "-c",
            "user.email=a@b",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "first",
        ]);
        git(&["branch", "other"]);
        let touch = |name: &str| format!("touch {}", witness.join(name).display());
        let included = dir.join(".git/extra.inc");
        std::fs::write(
            &included,
            format!(
                "[filter \"inc\"]\n\tclean = {}\n\tsmudge = {}\n",
                touch("included-clean"),
                touch("included-smudge")
            ),
        )
        .expect("include");
        let mut config = std::fs::read(dir.join(".git/config")).expect("config");
        config.extend_from_slice(b"# \xff not UTF-8\n");
        config.extend_from_slice(
            format!(
                "[core] [filter \"x\"]\n\tclean = {}\n\tsmudge = {}\n\tprocess = {}\n\trequired = true\n\
                 [core]\n\tfsmonitor = {}\n\thooksPath = {}\n\
                 [diff]\n\texternal = {}\n[diff \"d\"]\n\ttextconv = {}\n\tcommand = {}\n\
                 [include]\n\tpath = {}\n",
                touch("clean"),
                touch("smudge"),
                touch("process"),
                touch("fsmonitor"),
                witness.join("hooks").display(),
                touch("external"),
                touch("textconv"),
                touch("diff-command"),
                included.display(),
            )
            .as_bytes(),
        );
        std::fs::write(dir.join(".git/config"), config).expect("config");
        std::fs::create_dir_all(witness.join("hooks")).expect("hooks");
        for hook in [
            "pre-commit",
            "post-commit",
            "post-checkout",
            "commit-msg",
            "prepare-commit-msg",
        ] {
            let path = witness.join("hooks").join(hook);
            std::fs::write(&path, format!("#!/bin/sh\n{}\n", touch(hook))).expect("hook");
            let mut perms = std::fs::metadata(&path).expect("meta").permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
            std::fs::set_permissions(&path, perms).expect("chmod");
        }
        std::fs::write(
            dir.join(".git/info/attributes"),
            "* filter=x diff=d\n*.inc filter=inc\n",
        )
        .expect("attributes");
        std::fs::write(dir.join("a.txt"), "hello\n").expect("file");
        std::fs::write(dir.join("b.inc"), "hello\n").expect("file");
    }

    fn forced_git(dir: &Path, args: &[&str]) -> std::process::Output {
        let listed = ForcedConfig::base()
            .command()
            .args(LIST_NAMES)
            .current_dir(dir)
            .output()
            .expect("list")
            .stdout;
        let mut command = ForcedConfig::for_listed(&listed).command();
        command.args(args).current_dir(dir);
        command.env("GIT_AUTHOR_NAME", "t").env("GIT_AUTHOR_EMAIL", "t@t");
        command
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t");
        command.output().expect("git")
    }

    #[test]
    fn no_planted_command_runs_on_stage_commit_or_switch() {
        let top = tempfile::tempdir().expect("tempdir");
        let (repo, witness) = (top.path().join("repo"), top.path().join("witness"));
        std::fs::create_dir_all(&repo).expect("repo");
        std::fs::create_dir_all(&witness).expect("witness");
        planted_repository(&repo, &witness);
        for args in [
            &["add", "-A"][..],
            &["commit", "-q", "-m", "planted"][..],
            &["diff", "HEAD~1", "--stat"][..],
            &["for-each-ref", "refs/heads"][..],
            &["switch", "-q", "other"][..],
            &["switch", "-q", "main"][..],
        ] {
            let output = forced_git(&repo, args);
            assert!(
                output.status.success(),
                "{args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let ran: Vec<_> = std::fs::read_dir(&witness)
            .expect("witness")
            .flatten()
            .map(|entry| entry.file_name())
            .filter(|name| name != "hooks")
            .collect();
        assert!(ran.is_empty(), "planted commands ran: {ran:?}");
        assert_eq!(
            std::fs::read_to_string(repo.join("a.txt")).expect("checked out"),
            "hello\n"
        );
    }

    #[test]
    fn unforced_the_same_repository_runs_them() {
        // The witness works: plain git (no global configuration) runs the planted filter.
        let top = tempfile::tempdir().expect("tempdir");
        let (repo, witness) = (top.path().join("repo"), top.path().join("witness"));
        std::fs::create_dir_all(&repo).expect("repo");
        std::fs::create_dir_all(&witness).expect("witness");
        planted_repository(&repo, &witness);
        let _ = Command::new("git")
            .args(["add", "-A"])
            .current_dir(&repo)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .output();
        assert!(witness.join("clean").exists() || witness.join("process").exists());
    }
}
