//! Encryption of TCP connections between hosts (opt-in): TLS 1.3 / 1.2 through rustls, with
//! mutual authentication by certificates from PEM files.
//!
//! Turned on by three files, given in [`TlsConfig::from_files`] or in the environment:
//!
//! | variable | what |
//! |---|---|
//! | `C10D_TLS_CERT_FILE` | this process's certificate chain (PEM), leaf first |
//! | `C10D_TLS_KEY_FILE` | its private key (PEM: PKCS#8, PKCS#1 or SEC1); owner-only (`0600`) |
//! | `C10D_TLS_CA_FILE` | the certificate(s) of the job's CA (PEM): peers must chain to one |
//! | `C10D_TLS_SERVER_NAME` | optional: the DNS name every certificate carries (default `c10d-rs`) |
//!
//! Both sides present a certificate and check the other's against the CA (mutual TLS): a
//! process without a certificate of the job's CA cannot connect, and cannot be connected to.
//! Ranks connect by IP address, so the name checked is not the peer's address but one name
//! that all of a job's certificates carry as a DNS subject-alternative name
//! ([`DEFAULT_SERVER_NAME`] unless `C10D_TLS_SERVER_NAME` says otherwise). One certificate may
//! serve every process of a job.
//!
//! Where it applies: the `TcpStore` server and client, and the CPU backend's TCP connections.
//! Same-host Unix sockets, shared memory and cross-memory attach never leave the host and stay
//! as they are. A PyTorch client meeting a TLS store fails its handshake (PyTorch's TCPStore
//! speaks no TLS). TLS and the job secret ([`crate::auth`]) combine: the secret's handshake
//! then runs inside the encrypted channel.
//!
//! [`TlsSession`] (in `session.rs`) is the connection state; it reads and writes over any
//! `Read + Write` transport, blocking or non-blocking.

#[cfg(feature = "cert-gen")]
mod generate;
mod session;

#[cfg(feature = "cert-gen")]
pub use generate::create_job_files;
pub use session::{TlsIo, TlsSession};

use c10d_core::{DistError, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The variable naming this process's certificate chain (PEM).
pub const CERT_FILE_ENV: &str = "C10D_TLS_CERT_FILE";
/// The variable naming this process's private key (PEM, owner-only).
pub const KEY_FILE_ENV: &str = "C10D_TLS_KEY_FILE";
/// The variable naming the job's CA certificate(s) (PEM).
pub const CA_FILE_ENV: &str = "C10D_TLS_CA_FILE";
/// The variable overriding the DNS name that certificates must carry.
pub const SERVER_NAME_ENV: &str = "C10D_TLS_SERVER_NAME";
/// The DNS name certificates carry unless `C10D_TLS_SERVER_NAME` says otherwise.
pub const DEFAULT_SERVER_NAME: &str = "c10d-rs";

/// A job's TLS configuration: this process's certificate and key, the CA its peers must chain
/// to, and the name their certificates carry. Cheap to clone.
#[derive(Clone)]
pub struct TlsConfig {
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
    name: ServerName<'static>,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TlsConfig(name={:?})", self.name)
    }
}

/// Whether `first` (at least 2 bytes of a reply) opens a TLS alert record (type 21, version
/// 3.x): the peer speaks TLS only and refused our plain bytes.
pub fn is_tls_alert(first: &[u8]) -> bool {
    first.len() >= 2 && first[0] == 0x15 && first[1] == 0x03
}

/// What to tell a plain client that met a TLS peer: "requires TLS: set … to the job's files".
pub fn requires_tls() -> String {
    format!(
        "requires TLS: set {CERT_FILE_ENV}, {KEY_FILE_ENV} and {CA_FILE_ENV} to the job's files"
    )
}

/// Two configurations are equal when they are the same one (clones of one `from_files` /
/// `from_pem`) expecting the same name.
impl PartialEq for TlsConfig {
    fn eq(&self, other: &TlsConfig) -> bool {
        Arc::ptr_eq(&self.client, &other.client)
            && Arc::ptr_eq(&self.server, &other.server)
            && self.name == other.name
    }
}

/// The files of a [`TlsConfig`].
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// Certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// Private key (PEM), readable by its owner only.
    pub key: PathBuf,
    /// The job's CA certificate(s) (PEM).
    pub ca: PathBuf,
}

fn tls_err(m: String) -> DistError {
    DistError::invalid(format!("TLS configuration: {m}"))
}

impl TlsConfig {
    /// Reads the three PEM files and builds the configuration, with [`DEFAULT_SERVER_NAME`].
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`](c10d_core::ErrorKind::InvalidArgument) naming the file
    /// when one cannot be read or parsed, holds no certificate or key, when the key file is
    /// readable by group or others, or when the certificate does not match the key.
    pub fn from_files(files: &TlsFiles) -> Result<TlsConfig> {
        check_key_mode(&files.key)?;
        let read = |p: &Path| {
            std::fs::read(p).map_err(|e| tls_err(format!("cannot read {}: {e}", p.display())))
        };
        Self::from_pem(&read(&files.cert)?, &read(&files.key)?, &read(&files.ca)?).map_err(|e| {
            tls_err(format!(
                "{} (files {}, {}, {})",
                e.message(),
                files.cert.display(),
                files.key.display(),
                files.ca.display()
            ))
        })
    }

    /// Builds the configuration from PEM text: `cert` this process's chain (leaf first), `key`
    /// its private key, `ca` the job's CA certificate(s).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`](c10d_core::ErrorKind::InvalidArgument) when a PEM holds no
    /// certificate or key, or the certificate does not match the key.
    pub fn from_pem(cert: &[u8], key: &[u8], ca: &[u8]) -> Result<TlsConfig> {
        let chain = certs(cert, "certificate")?;
        let key = PrivateKeyDer::from_pem_slice(key)
            .map_err(|e| tls_err(format!("no private key found: {e}")))?;
        let mut roots = RootCertStore::empty();
        for c in certs(ca, "CA")? {
            roots
                .add(c)
                .map_err(|e| tls_err(format!("bad CA certificate: {e}")))?;
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| tls_err(format!("client verifier: {e}")))?;
        let bad = |e: rustls::Error| tls_err(e.to_string());
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(bad)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(bad)?;
        // No session resumption between ranks: no tickets to send after the handshake.
        server.send_tls13_tickets = 0;
        let client = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(bad)?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(bad)?;
        Ok(TlsConfig {
            client: Arc::new(client),
            server: Arc::new(server),
            name: ServerName::try_from(DEFAULT_SERVER_NAME).expect("a valid DNS name"),
        })
    }

    /// The same configuration expecting `name` in every certificate instead.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`](c10d_core::ErrorKind::InvalidArgument) when `name` is
    /// not a DNS name.
    pub fn with_server_name(mut self, name: &str) -> Result<TlsConfig> {
        self.name = ServerName::try_from(name.to_string())
            .map_err(|e| tls_err(format!("'{name}' is not a DNS name: {e}")))?;
        Ok(self)
    }

    /// The configuration the environment gives (`C10D_TLS_CERT_FILE`, `C10D_TLS_KEY_FILE`,
    /// `C10D_TLS_CA_FILE`, optionally `C10D_TLS_SERVER_NAME`); `None` when none of the three
    /// files is named.
    ///
    /// # Errors
    /// As [`TlsConfig::from_files`]; also when only some of the three variables are set.
    pub fn from_env() -> Result<Option<TlsConfig>> {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let (cert, key, ca) = (var(CERT_FILE_ENV), var(KEY_FILE_ENV), var(CA_FILE_ENV));
        let files = match (cert, key, ca) {
            (None, None, None) => return Ok(None),
            (Some(cert), Some(key), Some(ca)) => TlsFiles { cert, key, ca },
            _ => {
                return Err(tls_err(format!(
                    "{CERT_FILE_ENV}, {KEY_FILE_ENV} and {CA_FILE_ENV} must be set together"
                )))
            }
        };
        let cfg = Self::from_files(&files)?;
        match std::env::var(SERVER_NAME_ENV) {
            Ok(n) if !n.is_empty() => cfg.with_server_name(&n).map(Some),
            _ => Ok(Some(cfg)),
        }
    }

    /// `given` when there is one, else [`TlsConfig::from_env`].
    ///
    /// # Errors
    /// As [`TlsConfig::from_env`].
    pub fn given_or_env(given: Option<&TlsConfig>) -> Result<Option<TlsConfig>> {
        match given {
            Some(c) => Ok(Some(c.clone())),
            None => Self::from_env(),
        }
    }

    /// A session for the side that connected (TLS client).
    pub fn client_session(&self) -> TlsSession {
        let c = rustls::ClientConnection::new(self.client.clone(), self.name.clone())
            .expect("a client connection from a valid configuration");
        TlsSession::new(c.into())
    }

    /// A session for the side that accepted (TLS server).
    pub fn server_session(&self) -> TlsSession {
        let c = rustls::ServerConnection::new(self.server.clone())
            .expect("a server connection from a valid configuration");
        TlsSession::new(c.into())
    }
}

fn certs(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let v: Vec<_> = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| tls_err(format!("bad {what} PEM: {e}")))?;
    if v.is_empty() {
        return Err(tls_err(format!("no {what} certificate found")));
    }
    Ok(v)
}

/// Refuses a key file that its group or others may read (as the job secret's file).
fn check_key_mode(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path)
        .map_err(|e| tls_err(format!("cannot read {}: {e}", path.display())))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(tls_err(format!(
            "the key file {} is readable by other users: make it owner-only (chmod 600)",
            path.display()
        )));
    }
    Ok(())
}
