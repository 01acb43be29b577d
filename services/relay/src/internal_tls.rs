//! `ahp-relay internal-tls`: TLS for the internal gRPC link of a deployment that has no certificate authority of
//! its own (docker-compose): a private CA, and the shards' server certificate signed by it for the names the
//! shards are reached at. The shards read the certificate and its key (`--internal-tls-cert`,
//! `--internal-tls-key`); gateways and runners read only the CA's certificate (`--internal-tls-ca`) and reach
//! the shards over `https://`. The CA's key is not kept: nothing else can be signed with it. Existing files are
//! kept, so a deployment's init step may run it at every start. (The Helm chart takes a certificate from the
//! cluster's issuer instead: `internalTls.secretName`.)

use std::path::PathBuf;

use anyhow::Context;

/// The shards' certificate's file name.
pub const CERTIFICATE: &str = "tls.crt";
/// Its key's file name.
pub const KEY: &str = "tls.key";
/// The CA's certificate's file name.
pub const CA: &str = "ca.crt";

#[derive(clap::Args)]
pub struct InternalTlsArgs {
    /// Where the shards' certificate and key go (created if missing; only the shards mount it).
    #[arg(long)]
    dir: PathBuf,
    /// Where the CA's certificate goes, for gateways and runners (created if missing).
    #[arg(long)]
    ca_dir: PathBuf,
    /// A DNS name or IP address the shards are reached at (repeatable, or comma-separated).
    #[arg(long = "name", value_delimiter = ',', required = true)]
    names: Vec<String>,
    /// How long the certificates are valid, in days. A set within 30 days of its end is made anew at the next
    /// run (restart the shards, gateways and runners to load it).
    #[arg(long, default_value_t = 825, value_parser = clap::value_parser!(i64).range(31..=3650))]
    days: i64,
}

/// A set with less than this left is made anew.
const RENEW_BEFORE: time::Duration = time::Duration::days(30);

/// The file beside the key that says when the set ends (unix seconds).
const EXPIRES: &str = "tls.expires";

/// Make the CA and the shards' certificate unless they are there; print where they are.
pub fn run(args: &InternalTlsArgs) -> anyhow::Result<()> {
    let (certificate, key, ca) = (
        args.dir.join(CERTIFICATE),
        args.dir.join(KEY),
        args.ca_dir.join(CA),
    );
    let expires = args.dir.join(EXPIRES);
    let lasting = std::fs::read_to_string(&expires)
        .ok()
        .and_then(|text| text.trim().parse::<i64>().ok())
        .and_then(|at| time::OffsetDateTime::from_unix_timestamp(at).ok())
        .is_none_or(|at| at - time::OffsetDateTime::now_utc() > RENEW_BEFORE);
    if certificate.exists() && key.exists() && ca.exists() && lasting {
        println!(
            "kept {}, {} and {}",
            certificate.display(),
            key.display(),
            ca.display()
        );
        return Ok(());
    }
    for dir in [&args.dir, &args.ca_dir] {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // Part of a set (a run stopped between the writes) is made again whole.
    for part in [&certificate, &key, &ca, &expires] {
        if part.exists() {
            std::fs::remove_file(part).with_context(|| format!("removing {}", part.display()))?;
        }
    }
    let made = make(&args.names, args.days)?;
    crate::identity_keys::write(
        &expires,
        made.until.unix_timestamp().to_string().as_bytes(),
        0o444,
    )?;
    crate::identity_keys::write(&ca, made.ca.as_bytes(), 0o444)?;
    crate::identity_keys::write(&certificate, made.certificate.as_bytes(), 0o444)?;
    // The key last: its presence says the set is whole.
    crate::identity_keys::write(&key, made.key.as_bytes(), 0o400)?;
    println!(
        "made {}, {} and {}",
        certificate.display(),
        key.display(),
        ca.display()
    );
    Ok(())
}

/// A CA's certificate, and a server certificate it signed with its key (all PEM).
struct Made {
    until: time::OffsetDateTime,
    ca: String,
    certificate: String,
    key: String,
}

fn make(names: &[String], days: i64) -> anyhow::Result<Made> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
    };
    let now = time::OffsetDateTime::now_utc();
    let until = now + time::Duration::days(days);
    let ca_key = KeyPair::generate().context("making the CA's key")?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).context("the CA's certificate")?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::CommonName, "ahp-relay internal link CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    (ca.not_before, ca.not_after) = (now, until);
    let ca = ca.self_signed(&ca_key).context("signing the CA's certificate")?;
    let key = KeyPair::generate().context("making the shards' key")?;
    let mut server = CertificateParams::new(names.to_vec()).context("the shards' names")?;
    server
        .distinguished_name
        .push(DnType::CommonName, names.first().map_or("shard", String::as_str));
    server.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    (server.not_before, server.not_after) = (now, until);
    let server = server
        .signed_by(&key, &ca, &ca_key)
        .context("signing the shards' certificate")?;
    Ok(Made {
        until,
        ca: ca.pem(),
        certificate: server.pem(),
        key: key.serialize_pem(),
    })
}
