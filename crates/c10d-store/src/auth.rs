//! Authentication of store connections (opt-in, off by default so that PyTorch's clients and
//! servers keep working): a shared job secret, proved by challenge–response.
//!
//! The secret comes from a file: `C10D_AUTH_SECRET_FILE=path` in the environment (read when a
//! server starts or a client connects, unless the options carry a secret), or
//! [`AuthSecret::from_file`]. Never the secret itself on a command line or in the environment,
//! where other users can read it. The file must be readable by its owner only (mode `0600` or
//! stricter) and hold at least 16 bytes.
//!
//! The handshake runs before any request, on every connection:
//!
//! ```text
//! server → client   "C10DAUTH" ‖ version 1 (1 byte) ‖ server nonce (32 bytes)
//! client → server   client nonce (32 bytes) ‖ HMAC-SHA256(secret, "c10d-rs store client" ‖ sn ‖ cn)
//! server → client   HMAC-SHA256(secret, "c10d-rs store server" ‖ cn ‖ sn)
//! ```
//!
//! Fresh random nonces on both sides: neither the secret nor a replayable answer crosses the
//! wire, and the server's answer proves to the client that it, too, knows the secret. A server
//! with a secret refuses a connection whose answer is wrong or that does not answer within
//! [`HANDSHAKE_TIMEOUT`] (PyTorch's client, which sends its VALIDATE request and waits, is one)
//! before reading any request, and logs the peer's address; a client without a secret meeting
//! such a server fails with "the store at H:P requires authentication".

use c10d_core::{DistError, Result};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::fmt;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The environment variable naming the secret file.
pub const SECRET_FILE_ENV: &str = "C10D_AUTH_SECRET_FILE";
/// What a server sends first when it requires authentication.
pub const MAGIC: &[u8; 8] = b"C10DAUTH";
const VERSION: u8 = 1;
/// Bytes of a nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of the server's challenge: magic, version, nonce.
pub const CHALLENGE_LEN: usize = MAGIC.len() + 1 + NONCE_LEN;
/// Bytes of the client's answer: its nonce and its MAC.
pub const ANSWER_LEN: usize = NONCE_LEN + MAC_LEN;
/// Bytes of a MAC (HMAC-SHA256).
pub const MAC_LEN: usize = 32;
/// How long a server waits for a client's answer before it closes the connection.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const MIN_SECRET_LEN: usize = 16;

/// A job's shared secret (cheap to clone; never printed).
#[derive(Clone)]
pub struct AuthSecret(Arc<Vec<u8>>);

impl fmt::Debug for AuthSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AuthSecret(..)")
    }
}

impl AuthSecret {
    /// The secret in `bytes` (at least 16 bytes).
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] for a shorter secret.
    pub fn from_bytes(bytes: &[u8]) -> Result<AuthSecret> {
        if bytes.len() < MIN_SECRET_LEN {
            return Err(DistError::invalid(format!(
                "an authentication secret needs at least {MIN_SECRET_LEN} bytes, got {}",
                bytes.len()
            )));
        }
        Ok(AuthSecret(Arc::new(bytes.to_vec())))
    }

    /// The secret in the file at `path` (its whole content), which only its owner may read.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] when the file cannot be read, is readable or writable by
    /// its group or others ("chmod 600 it"), or holds fewer than 16 bytes.
    pub fn from_file(path: &Path) -> Result<AuthSecret> {
        use std::os::unix::fs::PermissionsExt;
        let shown = path.display();
        let meta = std::fs::metadata(path)
            .map_err(|e| DistError::invalid(format!("cannot read the secret file {shown}: {e}")))?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(DistError::invalid(format!(
                "the secret file {shown} is accessible to other users (mode {mode:o}); chmod 600 it"
            )));
        }
        let bytes = std::fs::read(path)
            .map_err(|e| DistError::invalid(format!("cannot read the secret file {shown}: {e}")))?;
        AuthSecret::from_bytes(&bytes)
            .map_err(|e| DistError::invalid(format!("the secret file {shown}: {}", e.message())))
    }

    /// Makes a new secret file at `path` (which must not exist): 32 random bytes, readable and
    /// writable by its owner only. Returns the secret it holds.
    ///
    /// # Errors
    /// [`DistError::InvalidArgument`] when the file exists or cannot be written.
    pub fn create_file(path: &Path) -> Result<AuthSecret> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut bytes = [0u8; 32];
        rand::fill(&mut bytes[..]);
        let shown = path.display();
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .and_then(|mut f| f.write_all(&bytes))
            .map_err(|e| {
                DistError::invalid(format!("cannot create the secret file {shown}: {e}"))
            })?;
        AuthSecret::from_bytes(&bytes)
    }

    /// The secret named by `C10D_AUTH_SECRET_FILE`, `None` when it is unset or empty.
    ///
    /// # Errors
    /// As [`AuthSecret::from_file`].
    pub fn from_env() -> Result<Option<AuthSecret>> {
        match std::env::var_os(SECRET_FILE_ENV) {
            Some(p) if !p.is_empty() => AuthSecret::from_file(Path::new(&p)).map(Some),
            _ => Ok(None),
        }
    }

    /// `given`, else the environment's ([`AuthSecret::from_env`]).
    ///
    /// # Errors
    /// As [`AuthSecret::from_env`].
    pub fn given_or_env(given: Option<&AuthSecret>) -> Result<Option<AuthSecret>> {
        match given {
            Some(s) => Ok(Some(s.clone())),
            None => AuthSecret::from_env(),
        }
    }

    fn mac(&self, label: &[u8], first: &[u8], second: &[u8]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("any key length");
        m.update(label);
        m.update(first);
        m.update(second);
        m
    }
}

const CLIENT_LABEL: &[u8] = b"c10d-rs store client";
const SERVER_LABEL: &[u8] = b"c10d-rs store server";

fn nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    rand::fill(&mut n[..]);
    n
}

/// The accepting side of one connection's handshake (the store's server; in c10d-gloo, the
/// rank that accepts a peer's connection).
pub struct ServerHandshake {
    nonce: [u8; NONCE_LEN],
}

impl Default for ServerHandshake {
    fn default() -> Self {
        Self::new()
    }
}

impl ServerHandshake {
    /// A handshake with a fresh nonce.
    pub fn new() -> Self {
        ServerHandshake { nonce: nonce() }
    }

    /// The challenge to send first ([`CHALLENGE_LEN`] bytes).
    pub fn challenge(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(CHALLENGE_LEN);
        b.extend_from_slice(MAGIC);
        b.push(VERSION);
        b.extend_from_slice(&self.nonce);
        b
    }

    /// Checks the client's answer ([`ANSWER_LEN`] bytes); returns the proof to send back, or
    /// `None` for a wrong answer (another secret, or none).
    pub fn answer(&self, secret: &AuthSecret, answer: &[u8]) -> Option<Vec<u8>> {
        if answer.len() != ANSWER_LEN {
            return None;
        }
        let (client_nonce, mac) = answer.split_at(NONCE_LEN);
        secret
            .mac(CLIENT_LABEL, &self.nonce, client_nonce)
            .verify_slice(mac)
            .ok()?;
        let proof = secret.mac(SERVER_LABEL, client_nonce, &self.nonce);
        Some(proof.finalize().into_bytes().to_vec())
    }
}

/// The connecting side, on a connected stream whose timeouts bound each step. `desc` names the
/// other side in errors ("the store at (host, port)", "rank 3 of group '0'").
///
/// # Errors
/// [`DistError::Network`]: no challenge came ("… did not ask for authentication: is it started
/// without a secret?"), the answer was refused ("authentication failed: … refused this job's
/// secret"), or the other side's proof is wrong (it does not know the secret).
pub fn client_handshake<S: Read + Write>(
    sock: &mut S,
    secret: &AuthSecret,
    desc: &str,
) -> Result<()> {
    let mut challenge = [0u8; CHALLENGE_LEN];
    sock.read_exact(&mut challenge).map_err(|e| {
        DistError::network(format!(
            "{desc} did not ask for authentication ({e}): is it started without a secret?"
        ))
    })?;
    if &challenge[..MAGIC.len()] != MAGIC || challenge[MAGIC.len()] != VERSION {
        return Err(DistError::network(format!(
            "{desc} did not ask for authentication: is it started without a secret?"
        )));
    }
    let server_nonce = &challenge[MAGIC.len() + 1..];
    let mine = nonce();
    let mac = secret
        .mac(CLIENT_LABEL, server_nonce, &mine)
        .finalize()
        .into_bytes();
    let mut answer = Vec::with_capacity(ANSWER_LEN);
    answer.extend_from_slice(&mine);
    answer.extend_from_slice(&mac);
    sock.write_all(&answer)?;
    let mut proof = [0u8; MAC_LEN];
    sock.read_exact(&mut proof).map_err(|e| {
        DistError::network(format!(
            "authentication failed: {desc} refused this job's secret ({e})"
        ))
    })?;
    secret
        .mac(SERVER_LABEL, &mine, server_nonce)
        .verify_slice(&proof)
        .map_err(|_| {
            DistError::network(format!(
                "authentication failed: {desc} does not know this job's secret"
            ))
        })
}

/// Whether `reply` (what a client without a secret read where it expected its PING's echo) is
/// the start of an authentication challenge.
pub(crate) fn is_challenge(reply: &[u8]) -> bool {
    let n = reply.len().min(MAGIC.len());
    n > 0 && reply[..n] == MAGIC[..n]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_right_answer_gets_a_proof_and_a_wrong_one_none() {
        let s = AuthSecret::from_bytes(b"0123456789abcdef-secret").unwrap();
        let other = AuthSecret::from_bytes(b"0123456789abcdef-other!").unwrap();
        let hs = ServerHandshake::new();
        let c = hs.challenge();
        let cn = nonce();
        let answer = |secret: &AuthSecret| {
            let mac = secret
                .mac(CLIENT_LABEL, &c[9..], &cn)
                .finalize()
                .into_bytes();
            [cn.as_slice(), mac.as_slice()].concat()
        };
        assert!(hs.answer(&s, &answer(&s)).is_some());
        assert!(hs.answer(&s, &answer(&other)).is_none());
        // A replayed answer does not fit another challenge (fresh server nonce).
        assert!(ServerHandshake::new().answer(&s, &answer(&s)).is_none());
    }

    #[test]
    fn short_secrets_and_open_files_are_refused() {
        assert!(AuthSecret::from_bytes(b"short").is_err());
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("secret");
        std::fs::write(&p, b"0123456789abcdef0123").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = AuthSecret::from_file(&p).unwrap_err();
        assert!(e.message().contains("chmod 600"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(AuthSecret::from_file(&p).is_ok());
        assert_eq!(
            format!("{:?}", AuthSecret::from_file(&p).unwrap()),
            "AuthSecret(..)"
        );
    }
}
