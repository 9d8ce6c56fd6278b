//! The hello a connecting rank sends and the accepting rank's answer: who connects (magic,
//! rank, group size, group name), what makes the answer a refusal, and the length-prefixed
//! reply frames (`OK` or the refusal's text).

use std::io::{Read, Write};

const HELLO_MAGIC: u32 = 0x61F0_C10D;

/// A rank of a group, as its hello names it and as the accepting rank checks it.
#[derive(Clone, Debug)]
pub(crate) struct Who {
    pub group_name: String,
    pub rank: usize,
    pub size: usize,
}

impl Who {
    /// Prefixes an error text with the group and the rank.
    pub(crate) fn ctx(&self, m: impl std::fmt::Display) -> String {
        format!("{}: {m}", self.name())
    }

    /// "ProcessGroupGloo (group G, rank R)".
    pub(crate) fn name(&self) -> String {
        format!(
            "ProcessGroupGloo (group {}, rank {})",
            self.group_name, self.rank
        )
    }
}

/// The fixed-size head of a hello: magic, rank, group size, length of the group name.
pub(crate) struct HelloHead {
    pub(crate) magic: u32,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) name_len: usize,
}

/// The hello a connecting rank sends: [`HelloHead`] (little endian: u32, u64, u64, u32) then
/// the group name's bytes.
pub(crate) fn encode_hello(me: &Who) -> Vec<u8> {
    let mut hello = Vec::new();
    hello.extend_from_slice(&HELLO_MAGIC.to_le_bytes());
    hello.extend_from_slice(&(me.rank as u64).to_le_bytes());
    hello.extend_from_slice(&(me.size as u64).to_le_bytes());
    hello.extend_from_slice(&(me.group_name.len() as u32).to_le_bytes());
    hello.extend_from_slice(me.group_name.as_bytes());
    hello
}

fn decode_hello_head(head: &[u8; 24]) -> HelloHead {
    HelloHead {
        magic: u32::from_le_bytes(head[0..4].try_into().expect("4")),
        rank: u64::from_le_bytes(head[4..12].try_into().expect("8")) as usize,
        size: u64::from_le_bytes(head[12..20].try_into().expect("8")) as usize,
        name_len: u32::from_le_bytes(head[20..24].try_into().expect("4")) as usize,
    }
}

/// Reads a hello from `s` (at most 1 MiB of group name); `Err` says why it is not one.
pub(crate) fn read_hello(s: &mut impl Read) -> std::result::Result<(HelloHead, String), String> {
    let mut head = [0u8; 24];
    s.read_exact(&mut head)
        .map_err(|e| format!("bad hello: {e}"))?;
    let head = decode_hello_head(&head);
    if head.magic != HELLO_MAGIC || head.name_len > 1 << 20 {
        return Err("not a c10d-gloo peer".to_string());
    }
    let mut name = vec![0u8; head.name_len];
    s.read_exact(&mut name)
        .map_err(|e| format!("bad hello: {e}"))?;
    Ok((head, String::from_utf8_lossy(&name).to_string()))
}

/// Why rank `me.rank` refuses a well-formed hello (other group, other size, a rank that is not
/// above ours or already `connected`), if it does.
pub(crate) fn hello_problem(
    me: &Who,
    connected: &dyn Fn(usize) -> bool,
    h: &HelloHead,
    name: &str,
) -> Option<String> {
    let (prank, psize) = (h.rank, h.size);
    if name != me.group_name {
        Some(format!(
            "handshake mismatch: rank {prank} belongs to group '{name}' but rank {} belongs to group '{}'",
            me.rank, me.group_name
        ))
    } else if psize != me.size {
        Some(format!(
            "handshake mismatch: rank {prank} has group size {psize} but rank {} has group size {}",
            me.rank, me.size
        ))
    } else if prank <= me.rank || prank >= me.size || connected(prank) {
        Some(format!(
            "handshake mismatch: unexpected connection claiming rank {prank} (to rank {})",
            me.rank
        ))
    } else {
        None
    }
}

/// Writes a length-prefixed reply frame.
pub(crate) fn write_frame(s: &mut impl Write, b: &[u8]) -> std::io::Result<()> {
    s.write_all(&(b.len() as u32).to_le_bytes())?;
    s.write_all(b)
}

/// Reads a reply frame (at most 1 MiB); a peer that answers with an authentication challenge or
/// a TLS alert instead gets an error saying what it requires.
pub(crate) fn read_frame(s: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut l = [0u8; 4];
    s.read_exact(&mut l)?;
    if l == c10d_store::auth::MAGIC[..4] {
        return Err(std::io::Error::other(format!(
            "the peer requires authentication: set {} to the job's secret file",
            c10d_store::auth::SECRET_FILE_ENV
        )));
    }
    if c10d_store::tls::is_tls_alert(&l) {
        return Err(std::io::Error::other(format!(
            "the peer {}",
            c10d_store::tls::requires_tls()
        )));
    }
    let n = u32::from_le_bytes(l) as usize;
    if n > 1 << 20 {
        return Err(std::io::Error::other("handshake reply too long"));
    }
    let mut b = vec![0u8; n];
    s.read_exact(&mut b)?;
    Ok(b)
}

#[cfg(test)]
mod fuzz_bounded {
    /// The `gloo_hello` fuzz target's check on 100,000 seeded byte strings of up to 64 bytes,
    /// half of them a hello head (magic, a rank and size near the group's, a short name
    /// length) followed by random bytes.
    #[test]
    fn random_hellos_are_read_or_refused() {
        let mut next = crate::fuzzing::seeded(0x4E11_0C10_D026_0001);
        for i in 0..100_000 {
            let len = (next() % 65) as usize;
            let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if i % 2 == 0 {
                let mut h = super::HELLO_MAGIC.to_le_bytes().to_vec();
                h.extend_from_slice(&(next() % 6).to_le_bytes());
                h.extend_from_slice(&(next() % 6).to_le_bytes());
                h.extend_from_slice(&((next() % 4) as u32).to_le_bytes());
                h.append(&mut b);
                b = h;
            }
            crate::fuzzing::hello(&b);
        }
    }
}
