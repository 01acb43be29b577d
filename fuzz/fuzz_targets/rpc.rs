//! JSON-RPC dispatch: any frame from an initialized member connection gets an answer or nothing, never a
//! panic, and the host keeps answering.
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
    let fixture = fixture();
    fixture.runtime.block_on(async {
        fixture.harness.call(fixture.harness.member, data).await;
        let ping = fixture
            .harness
            .call(fixture.harness.member, br#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#)
            .await;
        assert!(ping.is_some_and(|p| p.get("result").is_some()), "the host stopped answering");
    });
});
