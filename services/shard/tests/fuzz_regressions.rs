//! The fuzz targets' findings and edge cases, replayed on stable Rust in every CI run: each file of
//! `fuzz/regressions/<target>/` goes through the same code as the target (`fuzz/fuzz_targets/<target>.rs`).
//! None may panic; after each, the host still answers and a fresh subscriber still gets both snapshots.

use std::path::PathBuf;

use relay_shard::harness::{Harness, MAX_DEPTH};

fn inputs(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../fuzz/regressions/{target}"));
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("entry").path())
        .collect();
    files.sort();
    let inputs: Vec<_> = files
        .into_iter()
        .map(|path| {
            let name = path.file_name().expect("name").to_string_lossy().into_owned();
            (name, std::fs::read(&path).expect("read"))
        })
        .collect();
    assert!(!inputs.is_empty(), "no inputs for {target}");
    inputs
}

#[test]
fn frame_inputs_are_parsed_or_refused() {
    for (_, data) in inputs("frame") {
        let _ = relay_core::rpc::read_frame(&data, MAX_DEPTH);
    }
}

async fn assert_healthy(harness: &Harness, name: &str) {
    let ping = harness
        .call(harness.member, br#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#)
        .await;
    assert!(
        ping.is_some_and(|p| p.get("result").is_some()),
        "{name}: the host stopped answering"
    );
}

#[tokio::test]
async fn rpc_inputs_leave_the_host_answering() {
    for (name, data) in inputs("rpc") {
        // A fresh host per input: one may dispose what the next needs.
        let dir = tempfile::tempdir().expect("tempdir");
        let harness = Harness::open(dir.path()).await.expect("harness");
        harness.call(harness.member, &data).await;
        assert_healthy(&harness, &name).await;
    }
}

#[tokio::test]
async fn action_inputs_are_applied_or_rejected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let harness = Harness::open(dir.path()).await.expect("harness");
    for (name, data) in inputs("action") {
        let Some((first, rest)) = data.split_first() else {
            continue;
        };
        let Ok(action) = serde_json::from_slice::<serde_json::Value>(rest) else {
            continue;
        };
        harness.dispatch(first % 2 == 0, action).await;
        assert_healthy(&harness, &name).await;
        let state = harness.state().await;
        assert!(
            state
                .as_array()
                .is_some_and(|s| s.len() == 2 && s.iter().all(|s| s.is_object())),
            "{name}: a snapshot went missing: {state}"
        );
    }
}
