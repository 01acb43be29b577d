//! `ahp-relay identity-keys`: the key pair of the internal link's identity assertions (Ed25519, PKCS#8 and SPKI
//! PEM), made where a deployment's gateways and shards will read it. An existing pair is kept, so a deployment's
//! init step may run it at every start.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{EncodePrivateKey, EncodePublicKey};

/// The private key's file name (for `--identity-signing-key`).
pub const PRIVATE: &str = "identity.pem";
/// The public key's file name (for `--identity-verifying-key`).
pub const PUBLIC: &str = "identity.pub.pem";

#[derive(clap::Args)]
pub struct IdentityKeysArgs {
    /// The directory to make them in (created if missing).
    #[arg(long)]
    dir: PathBuf,
    /// Put the public key here instead (a directory the shards mount, which the private key must not reach).
    #[arg(long)]
    public_dir: Option<PathBuf>,
}

/// Make the pair unless the private key is there; print where they are.
pub fn run(args: &IdentityKeysArgs) -> anyhow::Result<()> {
    let public_dir = args.public_dir.as_ref().unwrap_or(&args.dir);
    let (private, public) = (args.dir.join(PRIVATE), public_dir.join(PUBLIC));
    if private.exists() && public.exists() {
        println!("kept {} and {}", private.display(), public.display());
        return Ok(());
    }
    for dir in [&args.dir, public_dir] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // Half a pair (a run stopped between the two writes) is made again whole.
    for half in [&private, &public] {
        if half.exists() {
            std::fs::remove_file(half).with_context(|| format!("removing {}", half.display()))?;
        }
    }
    let key = ed25519_dalek::SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    let private_pem = key
        .to_pkcs8_pem(LineEnding::LF)
        .context("encoding the private key")?;
    let public_pem = key
        .verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .context("encoding the public key")?;
    write(&public, public_pem.as_bytes(), 0o444)?;
    // The private key last: its presence says the pair is whole.
    write(&private, private_pem.as_bytes(), 0o400)?;
    println!("made {} and {}", private.display(), public.display());
    Ok(())
}

/// Write a new file `path` (never over one) with `mode`.
pub(crate) fn write(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(bytes)
        .with_context(|| format!("writing {}", path.display()))
}
