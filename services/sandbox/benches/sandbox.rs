//! What the sandbox costs (issue 22; design §8: an agent's start at most 50 ms over an unsandboxed start, a
//! build-like workload at least 0.95 of its unsandboxed speed), each figure against the same work run
//! unsandboxed in the same run, the two interleaved so that a noisy machine affects both alike:
//! - **start**: a process that does nothing (`true`), started and reaped, sandboxed or not;
//! - **build**: a C project (48 files) compiled and linked with `make -j2` in the session's workspace;
//! - **files**: 3,000 files unpacked from a tarball, listed, read back and removed.
//!
//! The jobs run 9 times each way, alternating which goes first; the medians are compared.
//!
//! `scripts/bench sandbox` runs it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use relay_sandbox::{Egress, Launcher, ResourceLimits, Sandbox, SandboxSettings, SandboxSpec, TenantUsers};

const START_ROUNDS: usize = 60;
const WORK_ROUNDS: usize = 9;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run());
}

async fn run() {
    let root = tempfile::tempdir().expect("tempdir");
    let sandbox = Sandbox::probe(SandboxSettings {
        helper: PathBuf::from(env!("CARGO_BIN_EXE_relay-sandbox-exec")),
        bwrap: None,
        pasta: None,
        protected: vec![],
        extra_system: vec![],
        nice: 0,
        probe_user: 64_999,
        scratch: std::env::temp_dir(),
    })
    .await
    .expect("this machine can sandbox");
    println!(
        "sandbox: Landlock {}, TCP port rules {}, scoped {}, per-tenant users {}",
        sandbox.enforced().landlock,
        sandbox.enforced().port_rules,
        sandbox.enforced().scoped,
        relay_sandbox::running_as_root()
    );
    let sandboxed = Launcher::Sandboxed(std::sync::Arc::new(sandbox));
    let spec = session(root.path());
    let env = BTreeMap::from([
        ("PATH".to_string(), "/usr/local/bin:/usr/bin:/bin".to_string()),
        ("LANG".to_string(), "C.UTF-8".to_string()),
    ]);

    // Start.
    let mut plain = Vec::new();
    let mut confined = Vec::new();
    for _ in 0..START_ROUNDS {
        plain.push(timed(&Launcher::Unconfined, &spec, &env, "true").await);
        confined.push(timed(&sandboxed, &spec, &env, "true").await);
    }
    let (p50_plain, p50_confined) = (percentile(&mut plain, 50), percentile(&mut confined, 50));
    println!(
        "start   unsandboxed p50 {:>7.2} ms p90 {:>7.2} ms | sandboxed p50 {:>7.2} ms p90 {:>7.2} ms | added p50 {:>6.2} ms, {:.1}x unsandboxed (target <= 50 ms)",
        ms(p50_plain),
        ms(percentile(&mut plain, 90)),
        ms(p50_confined),
        ms(percentile(&mut confined, 90)),
        ms(p50_confined.saturating_sub(p50_plain)),
        p50_confined.as_secs_f64() / p50_plain.as_secs_f64().max(f64::MIN_POSITIVE),
    );

    // Work.
    write_project(&spec.workspace.join("project"));
    write_tree(&spec.workspace.join("tree"));
    let tarball = "tar -C tree -cf tree.tar . && rm -rf tree";
    let _ = timed(&Launcher::Unconfined, &spec, &env, tarball).await;
    if let Some(user) = spec.user {
        relay_sandbox::users::hand_over(&spec.workspace, user).expect("hand the workspace over");
    }
    for (name, script) in [
        ("build", "cd project && make -s clean && make -s -j2"),
        (
            "files",
            "mkdir -p out && tar -C out -xf tree.tar && find out -type f | wc -l >/dev/null \
             && cat $(find out -type f) >/dev/null && rm -rf out",
        ),
    ] {
        let mut plain = Vec::new();
        let mut confined = Vec::new();
        for round in 0..WORK_ROUNDS {
            // Which goes first alternates, so that neither always runs on a warmer cache.
            for sandboxed_now in [round % 2 == 0, round % 2 == 1] {
                if sandboxed_now {
                    confined.push(timed(&sandboxed, &spec, &env, script).await);
                } else {
                    plain.push(timed(&Launcher::Unconfined, &spec, &env, script).await);
                }
                if let Some(user) = spec.user {
                    // What an unsandboxed run (as root) left is the tenant's again.
                    relay_sandbox::users::hand_over(&spec.workspace, user).expect("hand the workspace over");
                }
            }
        }
        let (plain, confined) = (percentile(&mut plain, 50), percentile(&mut confined, 50));
        println!(
            "{name:<7} unsandboxed p50 {:>7.1} ms | sandboxed p50 {:>7.1} ms | speed {:.3} of unsandboxed (target >= 0.95)",
            ms(plain),
            ms(confined),
            plain.as_secs_f64() / confined.as_secs_f64()
        );
    }
}

/// A session's directories, the tenant's own (when root).
fn session(root: &Path) -> SandboxSpec {
    let user = relay_sandbox::running_as_root().then(|| {
        TenantUsers::new(64_000, 900)
            .claim(
                &relay_sandbox::beneath::WorkspaceRoot::open(root).expect("root"),
                "bench",
                "bench",
            )
            .expect("a user")
    });
    let base = root.join("bench");
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
        egress: Egress::None,
        loopback_ports: Vec::new(),
        limits: ResourceLimits::default(),
        cgroup: None,
        user,
    }
}

/// Start `sh -c script` (or `true`) and wait for it; how long that took.
async fn timed(
    launcher: &Launcher,
    spec: &SandboxSpec,
    env: &BTreeMap<String, String>,
    script: &str,
) -> Duration {
    let (program, args) = if script == "true" {
        ("true", vec![])
    } else {
        ("sh", vec!["-c".to_string(), script.to_string()])
    };
    let mut command = launcher
        .command(spec, program, &args, env)
        .await
        .expect("command");
    command.stdin(std::process::Stdio::null());
    let started = Instant::now();
    let child = Launcher::spawn(command).await.expect("spawn");
    let output = child.wait_with_output().await.expect("wait");
    let took = started.elapsed();
    assert!(
        output.status.success(),
        "{script}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    took
}

/// 48 C files of some substance and a Makefile that builds them into one program.
fn write_project(dir: &Path) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let mut objects = Vec::new();
    for n in 0..48 {
        let mut source = String::new();
        for f in 0..40 {
            source.push_str(&format!(
                "static int step_{f}(int x) {{ int a[64]; for (int i = 0; i < 64; i++) a[i] = (x * {f} + i) ^ (i << 3); \
                 for (int i = 0; i < 64; i++) for (int j = i + 1; j < 64; j++) if (a[i] > a[j]) {{ int t = a[i]; \
                 a[i] = a[j]; a[j] = t; }} switch (x & 7) {{ case 0: return a[1] + {n}; case 1: return a[3]; \
                 case 2: return a[x & 63] - {f}; default: return a[x & 31] * 3; }} }}\n"
            ));
        }
        source.push_str(&format!("int unit_{n}(int x) {{ int s = 0;"));
        for f in 0..40 {
            source.push_str(&format!(" s += step_{f}(x + s);"));
        }
        source.push_str(" return s; }\n");
        std::fs::write(dir.join(format!("unit_{n}.c")), source).expect("write");
        objects.push(format!("unit_{n}.o"));
    }
    let mut main = String::from("#include <stdio.h>\n");
    for n in 0..48 {
        main.push_str(&format!("int unit_{n}(int);\n"));
    }
    main.push_str("int main(void) { int s = 0;");
    for n in 0..48 {
        main.push_str(&format!(" s += unit_{n}(s);"));
    }
    main.push_str(" printf(\"%d\\n\", s); return 0; }\n");
    std::fs::write(dir.join("main.c"), main).expect("write");
    std::fs::write(
        dir.join("Makefile"),
        format!(
            "CFLAGS = -O2\nOBJECTS = main.o {}\nprogram: $(OBJECTS)\n\tcc -o $@ $(OBJECTS)\nclean:\n\trm -f program *.o\n",
            objects.join(" ")
        ),
    )
    .expect("write Makefile");
}

/// 3,000 small files in 30 directories.
fn write_tree(dir: &Path) {
    for d in 0..30 {
        let sub = dir.join(format!("d{d}"));
        std::fs::create_dir_all(&sub).expect("mkdir");
        for f in 0..100 {
            std::fs::write(
                sub.join(format!("f{f}.txt")),
                format!("file {d}/{f}\n").repeat(20),
            )
            .expect("write");
        }
    }
}

fn percentile(samples: &mut [Duration], p: usize) -> Duration {
    samples.sort();
    samples[(samples.len() * p / 100).min(samples.len() - 1)]
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
