//! Generates the gRPC code of `proto/relay.proto` with the vendored `protoc`, so nothing needs installing.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // prost-build runs `PROTOC`; a build script is single-threaded, so setting it here is sound.
    std::env::set_var("PROTOC", protoc);
    let proto = "../../proto/relay.proto";
    println!("cargo:rerun-if-changed={proto}");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&[proto], &["../../proto"])?;
    Ok(())
}
