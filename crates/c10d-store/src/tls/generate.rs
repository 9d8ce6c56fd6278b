//! A job's TLS files made on the spot: a fresh CA and one certificate it signed, for
//! [`super::DEFAULT_SERVER_NAME`] (what `c10d-store new-tls DIR` writes). Enough for a job whose
//! processes share a file system or get the files copied; a cluster with its own PKI gives each
//! host a certificate of its CA instead.

use super::{tls_err, TlsFiles, DEFAULT_SERVER_NAME};
use c10d_core::Result;
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Writes `ca.pem`, `cert.pem` and `key.pem` (owner-only) into `dir` (created if missing): a new
/// CA (ECDSA P-256) and a certificate it signed for [`DEFAULT_SERVER_NAME`], valid for any use.
/// The CA's own key is not kept: nobody can sign another certificate of this job.
///
/// # Errors
/// [`DistError::InvalidArgument`](c10d_core::ErrorKind::InvalidArgument) when `dir` cannot be
/// created, when one of the files already exists (never overwritten), or when writing fails.
pub fn create_job_files(dir: &Path) -> Result<TlsFiles> {
    let bad = |e: rcgen::Error| tls_err(format!("cannot make a certificate: {e}"));
    let ca_key = KeyPair::generate().map_err(bad)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(bad)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).map_err(bad)?;
    let key = KeyPair::generate().map_err(bad)?;
    let leaf = CertificateParams::new(vec![DEFAULT_SERVER_NAME.to_string()]).map_err(bad)?;
    let cert = leaf.signed_by(&key, &ca_cert, &ca_key).map_err(bad)?;
    std::fs::create_dir_all(dir)
        .map_err(|e| tls_err(format!("cannot create {}: {e}", dir.display())))?;
    let files = TlsFiles {
        cert: dir.join("cert.pem"),
        key: dir.join("key.pem"),
        ca: dir.join("ca.pem"),
    };
    write_new(&files.ca, ca_cert.pem().as_bytes(), 0o644)?;
    write_new(&files.cert, cert.pem().as_bytes(), 0o644)?;
    write_new(&files.key, key.serialize_pem().as_bytes(), 0o600)?;
    Ok(files)
}

/// Creates `path` with `mode` and writes `bytes`; refuses an existing file.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| tls_err(format!("cannot create {}: {e}", path.display())))?;
    f.write_all(bytes)
        .map_err(|e| tls_err(format!("cannot write {}: {e}", path.display())))
}
