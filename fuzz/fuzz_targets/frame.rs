//! Frame parsing: any bytes a client sends are either a JSON-RPC message or a clear rejection, never a panic
//! (and never unbounded recursion: nesting beyond the limit is refused before it is parsed).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = relay_core::rpc::read_frame(data, relay_shard::harness::MAX_DEPTH);
});
