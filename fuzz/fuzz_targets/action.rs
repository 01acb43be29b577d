//! Action validation: any JSON dispatched as an action on the session or the chat is validated and either
//! applied or rejected, never a panic; a fresh subscriber still gets a snapshot of both.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use relay_shard::harness::Harness;

struct Fixture {
    runtime: tokio::runtime::Runtime,
    harness: Harness,
    _dir: tempfile::TempDir,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let dir = tempfile::tempdir().expect("tempdir");
        let harness = runtime.block_on(Harness::open(dir.path())).expect("harness");
        Fixture {
            runtime,
            harness,
            _dir: dir,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((first, rest)) = data.split_first() else {
        return;
    };
    let Ok(action) = serde_json::from_slice::<serde_json::Value>(rest) else {
        return;
    };
    let fixture = fixture();
    fixture.runtime.block_on(async {
        fixture.harness.dispatch(first % 2 == 0, action).await;
        let state = fixture.harness.state().await;
        assert!(
            state.as_array().is_some_and(|s| s.iter().all(|s| s.is_object())),
            "a snapshot went missing: {state}"
        );
    });
});
