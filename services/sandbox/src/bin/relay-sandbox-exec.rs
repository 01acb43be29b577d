//! `relay-sandbox-exec sandbox-exec CONFINEMENT -- PROGRAM…`: the sandbox's inner step on its own, for this
//! crate's tests (the relay's binary runs the same code as `ahp-relay sandbox-exec`).

fn main() {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(2).collect();
    std::process::exit(relay_sandbox::exec::main(args));
}
