//! Real sandboxes on this machine (bubblewrap, Landlock, seccomp), probed and then attacked from inside with
//! shell commands: what a sandboxed program can see, write, signal and reach.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use relay_sandbox::{
    Egress, Launcher, ResourceLimits, Sandbox, SandboxSettings, SandboxSpec, TenantUsers, UserSwitch,
};

/// A sandbox context like the relay's, with `protected` hidden and `system_extra` shown read-only.
async fn launcher(protected: Vec<PathBuf>, system_extra: Vec<PathBuf>) -> Launcher {
    let sandbox = Sandbox::probe(SandboxSettings {
        helper: PathBuf::from(env!("CARGO_BIN_EXE_relay-sandbox-exec")),
        bwrap: None,
        pasta: None,
        protected,
        extra_system: system_extra,
        nice: 10,
        probe_user: 63_999,
        scratch: std::env::temp_dir(),
    })
    .await
    .expect("this machine can sandbox (bubblewrap and Landlock)");
    Launcher::Sandboxed(std::sync::Arc::new(sandbox))
}

/// A session's directories under `root`, owned by the tenant's user when the test runs as root.
fn session(root: &Path, tenant: &str) -> SandboxSpec {
    let user = relay_sandbox::running_as_root().then(|| {
        TenantUsers::new(63_000, 900)
            .claim(
                &relay_sandbox::beneath::WorkspaceRoot::open(root).expect("root"),
                tenant,
                tenant,
            )
            .expect("claim a user")
    });
    let base = root.join(tenant);
    let dirs = ["workspace", "home", "tmp", "shm"].map(|name| base.join(name));
    for dir in &dirs {
        std::fs::create_dir_all(dir).expect("mkdir");
        if let Some(user) = user {
            std::os::unix::fs::chown(dir, Some(user.uid), Some(user.gid)).expect("chown");
        }
    }
    let [workspace, home, tmp, shm] = dirs;
    SandboxSpec {
        tenant: base
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        anchor: base
            .parent()
            .map(std::path::Path::to_path_buf)
            .unwrap_or_default(),
        cwd: workspace.clone(),
        workspace,
        home,
        tmp,
        shm,
        install: vec![],
        egress: Egress::default(),
        loopback_ports: Vec::new(),
        limits: ResourceLimits::default(),
        cgroup: None,
        user,
    }
}

/// Run `sh -c script` in the sandbox; its stdout and stderr, and whether it exited 0.
async fn sh(launcher: &Launcher, spec: &SandboxSpec, script: &str) -> (String, bool) {
    let env = BTreeMap::from([("PATH".to_string(), "/usr/bin:/bin".to_string())]);
    let command = launcher
        .command(spec, "sh", &["-c".to_string(), script.to_string()], &env)
        .await
        .expect("command");
    let child = Launcher::spawn(command).await.expect("spawn");
    let output = child.wait_with_output().await.expect("wait");
    let text = format!(
        "{}{}[{}]",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        output.status
    );
    (text, output.status.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_sees_the_system_and_its_workspace_and_nothing_else() {
    let outside = tempfile::tempdir().expect("tempdir");
    let system = outside.path().join("system");
    std::fs::create_dir_all(system.join("secrets")).expect("mkdir");
    std::fs::write(system.join("tool.txt"), "a tool").expect("write");
    std::fs::write(system.join("secrets/key"), "the-relay-secret").expect("write");
    let elsewhere = outside.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).expect("mkdir");
    std::fs::write(elsewhere.join("note"), "not yours").expect("write");
    let launcher = launcher(vec![system.join("secrets")], vec![system.clone()]).await;
    let spec = session(&outside.path().join("tenants"), "acme");

    let (said, _) = sh(
        &launcher,
        &spec,
        &format!(
            "cat {sys}/tool.txt; echo; cat {sys}/secrets/key; ls {sys}/secrets; cat {else}/note; \
             echo mine > {ws}/file && cat {ws}/file; echo home > $HOME/h && cat $HOME/h; echo t > /tmp/t && cat /tmp/t; \
             echo x > {sys}/new 2>&1 || echo no-write-system; echo x > /etc/new 2>&1 || echo no-write-etc; \
             env | sort",
            sys = system.display(),
            else = elsewhere.display(),
            ws = spec.workspace.display(),
        ),
    )
    .await;
    assert!(said.contains("a tool"), "the system is readable: {said}");
    assert!(
        !said.contains("the-relay-secret"),
        "a protected file was read: {said}"
    );
    assert!(
        !said.contains("not yours"),
        "a directory outside the sandbox was read: {said}"
    );
    assert!(
        said.contains("mine\n") && said.contains("home\n") && said.contains("t\n"),
        "{said}"
    );
    assert!(
        said.contains("no-write-system") && said.contains("no-write-etc"),
        "{said}"
    );
    // Exactly the given environment, plus the private HOME and TMPDIR (and what the shell sets itself).
    let names: Vec<&str> = said
        .lines()
        .filter_map(|line| line.split_once('=').map(|(name, _)| name))
        .filter(|name| name.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .collect();
    for name in &names {
        assert!(
            ["HOME", "PATH", "TMPDIR", "PWD", "OLDPWD", "SHLVL", "_"].contains(name),
            "{name}: {said}"
        );
    }
    assert!(
        said.contains("HOME=/home/agent\n") && said.contains("TMPDIR=/tmp\n"),
        "{said}"
    );
    // Nothing landed outside.
    assert!(!elsewhere.join("file").exists());
    assert!(!system.join("new").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_sees_and_signals_only_its_own_processes() {
    let outside = tempfile::tempdir().expect("tempdir");
    let launcher = launcher(vec![], vec![]).await;
    let spec = session(outside.path(), "acme");
    let mut bystander = tokio::process::Command::new("sleep")
        .arg("30")
        .kill_on_drop(true)
        .spawn()
        .expect("a process outside");
    let (said, _) = sh(
        &launcher,
        &spec,
        "ls -d /proc/[0-9]* | wc -l; cat /proc/1/environ >/dev/null 2>&1 && echo read-init; kill -9 -1; echo after-kill",
    )
    .await;
    let visible: usize = said
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("a count");
    assert!(visible <= 5, "the sandbox sees {visible} processes: {said}");
    assert!(!said.contains("read-init"), "{said}");
    assert!(
        bystander.try_wait().expect("try_wait").is_none(),
        "kill -9 -1 reached outside"
    );
    bystander.kill().await.expect("kill");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_is_the_listed_ports_or_nothing() {
    let outside = tempfile::tempdir().expect("tempdir");
    let launcher = launcher(vec![], vec![]).await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let probe =
        format!("if (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null; then echo OPEN; else echo CLOSED; fi");
    let script = format!("bash -c '{probe}'");
    let mut spec = session(outside.path(), "acme");
    let first_line = |said: (String, bool)| said.0.lines().next().unwrap_or_default().to_string();
    assert_eq!(
        first_line(sh(&launcher, &spec, &script).await),
        "CLOSED",
        "HTTPS only by default"
    );
    spec.egress = Egress::Ports(vec![port]);
    assert_eq!(
        first_line(sh(&launcher, &spec, &script).await),
        "CLOSED",
        "a listed port, but on this machine's loopback: the sandbox's 127.0.0.1 is its own"
    );
    spec.egress = Egress::Ports(vec![443]);
    spec.loopback_ports = vec![port];
    assert_eq!(
        first_line(sh(&launcher, &spec, &script).await),
        "OPEN",
        "a loopback port the operator allows"
    );
    spec.loopback_ports = Vec::new();
    spec.egress = Egress::None;
    assert_eq!(
        first_line(sh(&launcher, &spec, &script).await),
        "CLOSED",
        "no network"
    );
    spec.egress = Egress::Any;
    assert_eq!(first_line(sh(&launcher, &spec, &script).await), "OPEN", "any");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_bound_files_and_processes_and_tenants_are_different_users() {
    let outside = tempfile::tempdir().expect("tempdir");
    let launcher = launcher(vec![], vec![]).await;
    let mut spec = session(outside.path(), "acme");
    spec.limits = ResourceLimits {
        processes: Some(40),
        file_size_bytes: Some(1024 * 1024),
        ..ResourceLimits::default()
    };
    let (said, _) = sh(
        &launcher,
        &spec,
        "head -c 2000000 /dev/zero > big; echo head=$?; stat -c %s big; \
         i=0; while [ $i -lt 100 ]; do sleep 1 & i=$((i+1)); done 2>&1 | tail -1; echo started; \
         io=$(python3 -c 'import ctypes,sys; libc=ctypes.CDLL(None); print(libc.syscall(425,8,0))' 2>&1); echo io_uring=$io; id -u",
    )
    .await;
    assert!(!said.contains("head=0"), "{said}");
    assert!(said.contains("1048576"), "the file stops at the limit: {said}");
    assert!(
        said.contains("fork") || said.contains("Resource temporarily unavailable"),
        "{said}"
    );
    assert!(said.contains("io_uring=-1"), "io_uring_setup is refused: {said}");
    if let Some(UserSwitch { uid, .. }) = spec.user {
        let other = session(outside.path(), "globex");
        let other_uid = other.user.expect("a user").uid;
        assert_ne!(uid, other_uid);
        assert!(
            said.lines().any(|line| line == uid.to_string()),
            "runs as the tenant's user: {said}"
        );
    }
}
