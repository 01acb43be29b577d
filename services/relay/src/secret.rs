//! The HS256 signing secret of an embedded relay: given, or generated once and kept in the data dir.

use std::path::{Path, PathBuf};

use anyhow::Context;
use rand::RngCore;

const SECRET_FILE: &str = "jwt-secret";

/// The secret from `explicit`, else from `<data_dir>/jwt-secret`, creating that file (mode 0600) if missing.
pub fn load_or_create(explicit: Option<&str>, data_dir: &Path) -> anyhow::Result<Vec<u8>> {
    if let Some(secret) = explicit {
        anyhow::ensure!(!secret.is_empty(), "the JWT secret must not be empty");
        return Ok(secret.as_bytes().to_vec());
    }
    let path = secret_path(data_dir);
    if let Ok(existing) = std::fs::read_to_string(&path) {
        let trimmed = existing.trim();
        anyhow::ensure!(!trimmed.is_empty(), "{} is empty", path.display());
        return Ok(trimmed.as_bytes().to_vec());
    }
    std::fs::create_dir_all(data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let secret: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    write_private(&path, &secret)?;
    Ok(secret.into_bytes())
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
