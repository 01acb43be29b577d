//! The HS256 signing secret: given on the command line or in the environment, read from a file
//! (`--jwt-secret-file`, so it never shows in `ps`), or — for the embedded relay — generated once and kept in
//! the data directory.
//!
//! A secret must be at least [`MIN_SECRET_BYTES`] long (a short HMAC key can be guessed offline from any
//! token), and hold at least [`MIN_SECRET_BITS`] bits by its characters' spread (40 × `s` is 40 bytes and no
//! secret at all). The estimate is the length times the Shannon entropy of the secret's own byte frequencies: a
//! generated secret in hex or base64 passes with room to spare; a repeated or tiny alphabet does not. A secret file must not be readable by group or others: the relay refuses to start rather than
//! sign with a key other local users may have read. The data directory is created `0700`.
//!
//! A secret file may be readable by its group (not writable): that is how orchestrators mount secrets for a
//! non-root process (a Kubernetes secret volume gives the pod's `fsGroup` read access, `0440`).

use std::path::{Path, PathBuf};

use anyhow::Context;
use rand::RngCore;

const SECRET_FILE: &str = "jwt-secret";

/// Shortest accepted HS256 secret, in bytes (RFC 7518 §3.2: a key at least as long as the hash output).
pub const MIN_SECRET_BYTES: usize = 32;

/// Least estimated entropy of an accepted secret, in bits.
pub const MIN_SECRET_BITS: f64 = 128.0;

/// The secret's entropy estimate, in bits: its length times the Shannon entropy of its byte frequencies.
fn estimated_bits(secret: &[u8]) -> f64 {
    let mut counts = [0_usize; 256];
    for byte in secret {
        counts[usize::from(*byte)] += 1;
    }
    let length = secret.len() as f64;
    let per_byte: f64 = counts
        .iter()
        .filter(|count| **count > 0)
        .map(|count| {
            let p = *count as f64 / length;
            -p * p.log2()
        })
        .sum();
    per_byte * length
}

/// Where the secret comes from, in order of precedence.
#[derive(Clone, Copy)]
pub struct SecretSource<'a> {
    pub explicit: Option<&'a str>,
    pub file: Option<&'a Path>,
    pub data_dir: &'a Path,
}

/// The secret from `explicit`, else from `file`, else from `<data_dir>/jwt-secret`, creating that file
/// (mode 0600, in a 0700 directory) if missing.
pub fn load_or_create(source: SecretSource<'_>) -> anyhow::Result<Vec<u8>> {
    if let Some(secret) = source.explicit {
        return checked(secret.as_bytes().to_vec(), "--jwt-secret")
            .and_then(|secret| unpredictable(secret, "--jwt-secret"));
    }
    if let Some(file) = source.file {
        return read_private(file).and_then(|secret| unpredictable(secret, &file.display().to_string()));
    }
    let path = secret_path(source.data_dir);
    if path.exists() {
        return read_private(&path).and_then(|secret| unpredictable(secret, &path.display().to_string()));
    }
    create_private_dir(source.data_dir)?;
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let secret: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    write_private(&path, &secret)?;
    Ok(secret.into_bytes())
}

fn checked(secret: Vec<u8>, origin: &str) -> anyhow::Result<Vec<u8>> {
    anyhow::ensure!(
        secret.len() >= MIN_SECRET_BYTES,
        "the JWT secret from {origin} is {} bytes; at least {MIN_SECRET_BYTES} are required",
        secret.len()
    );
    Ok(secret)
}

/// `secret` (an HS256 key), if it holds at least [`MIN_SECRET_BITS`] by [`estimated_bits`].
fn unpredictable(secret: Vec<u8>, origin: &str) -> anyhow::Result<Vec<u8>> {
    let bits = estimated_bits(&secret);
    anyhow::ensure!(
        bits >= MIN_SECRET_BITS,
        "the JWT secret from {origin} holds about {bits:.0} bits (repeated or few distinct characters); at least \
         {MIN_SECRET_BITS} are required: generate one, e.g. `openssl rand -hex 32`"
    );
    Ok(secret)
}

/// Read a secret file, refusing one that others may read, or its group write.
pub fn read_private(path: &Path) -> anyhow::Result<Vec<u8>> {
    check_private(path)?;
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    checked(text.trim().as_bytes().to_vec(), &path.display().to_string())
}

#[cfg(unix)]
fn check_private(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .permissions()
        .mode();
    anyhow::ensure!(
        mode & 0o027 == 0,
        "{} is readable by others or writable by its group (mode {:o}); run: chmod 600 {}",
        path.display(),
        mode & 0o777,
        path.display()
    );
    Ok(())
}

#[cfg(not(unix))]
fn check_private(_path: &Path) -> anyhow::Result<()> {
    Ok(())
}

/// Create `dir` (and its parents) readable by its owner only.
pub fn create_private_dir(dir: &Path) -> anyhow::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))
}

fn secret_path(data_dir: &Path) -> PathBuf {
    data_dir.join(SECRET_FILE)
}

#[cfg(unix)]
fn write_private(path: &Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(contents.as_bytes())?;
    Ok(())
}

#[cfg(not(unix))]
fn write_private(path: &Path, contents: &str) -> anyhow::Result<()> {
    std::fs::write(path, contents).with_context(|| format!("creating {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_secrets_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let source = |explicit| SecretSource {
            explicit,
            file: None,
            data_dir: dir.path(),
        };
        assert!(load_or_create(source(Some("short"))).is_err());
        assert!(load_or_create(source(Some("0123456789abcdef0123456789abcdef0123"))).is_ok());
    }

    #[test]
    fn secrets_with_too_little_entropy_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let source = |explicit| SecretSource {
            explicit,
            file: None,
            data_dir: dir.path(),
        };
        let weak = ["s".repeat(40), "ab".repeat(32), "password".repeat(5)];
        for weak in &weak {
            assert!(load_or_create(source(Some(weak))).is_err(), "{weak}");
        }
        // What the relay generates, a base64 key, and the tests' own secret pass.
        let generated = load_or_create(source(None)).expect("generated");
        assert!(estimated_bits(&generated) >= MIN_SECRET_BITS);
        for strong in [
            "q5Jc1pXz7Kd0VbN3mR8tLw2YhFs6GuEa9oIyTvCn4Mk=",
            "e2e-test-secret-at-least-32-bytes-long",
        ] {
            assert!(load_or_create(source(Some(strong))).is_ok(), "{strong}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn secret_files_readable_by_others_are_refused_and_new_ones_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        let generated = load_or_create(SecretSource {
            explicit: None,
            file: None,
            data_dir: &data,
        })
        .expect("generate");
        assert_eq!(generated.len(), 64);
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&data), 0o700);
        assert_eq!(mode(&data.join(SECRET_FILE)), 0o600);

        let file = dir.path().join("secret");
        let strong = "Zq3vN8xK1pT6wL0dR5mY9cH2sJ7fB4gE";
        std::fs::write(&file, strong).expect("write");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let source = SecretSource {
            explicit: None,
            file: Some(&file),
            data_dir: &data,
        };
        let refused = load_or_create(source).expect_err("0644 must be refused");
        assert!(refused.to_string().contains("chmod 600"), "{refused}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o660)).expect("chmod");
        assert!(
            load_or_create(source).is_err(),
            "a group-writable secret is refused"
        );
        // A secret volume for a non-root pod: readable by the pod's group.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o440)).expect("chmod");
        assert_eq!(load_or_create(source).expect("0440 is fine"), strong.as_bytes());
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let read = load_or_create(SecretSource {
            explicit: None,
            file: Some(&file),
            data_dir: &data,
        })
        .expect("0600 is fine");
        assert_eq!(read, strong.as_bytes());
    }
}
