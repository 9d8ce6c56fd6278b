//! The fixed 64-byte message header every frame on a peer connection starts with.
//!
//! Layout (little endian):
//!
//! | offset | size | field                                                        |
//! |--------|------|--------------------------------------------------------------|
//! | 0      | 4    | magic `0xC10D_61F0`                                          |
//! | 4      | 1    | kind: 1 collective, 2 point-to-point, 3 error text, 4 bye, 5 ping, 6 pong, 7 note |
//! | 5      | 1    | op ([`op_code`] of the `OpType`)                             |
//! | 6      | 1    | dtype ([`DType::code`])                                      |
//! | 8      | 4    | step (algorithm-defined, orders messages within one op)      |
//! | 16     | 8    | collective index (counts collectives only, equal on all ranks) |
//! | 24     | 8    | PyTorch sequence number of the sender's op (for messages)    |
//! | 32     | 8    | total bytes of the sender's op (for mismatch messages)       |
//! | 40     | 8    | payload bytes that follow the header                          |
//! | 48     | 8    | tag (point-to-point)                                          |
//!
//! The receiver compares kind, op, dtype, collective index, step, total and payload size against
//! what its own algorithm expects, so a rank that runs another collective, dtype or size is
//! detected on the first message, always (not only in a debug mode).

use c10d_core::{DType, OpType};

/// `step` of a [`Kind::Error`] frame whose text the sender received from another rank and
/// passes on (0: the sender's own failure).
pub(crate) const PASSED_ON: u32 = 1;

/// Header size in bytes.
pub(crate) const HDR: usize = 64;
const MAGIC: u32 = 0xC10D_61F0;

/// Message kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Part of a collective; matched by (collective index, step).
    Coll = 1,
    /// Point-to-point send; matched by (source, tag).
    P2p = 2,
    /// The sender failed the group; the payload is the UTF-8 error text. `step` is
    /// [`PASSED_ON`] when the text is another rank's, passed on unchanged.
    Error = 3,
    /// The sender shut its group down in an orderly way (no payload); EOF follows.
    Bye = 4,
    /// Liveness probe (no payload): answered with a pong by a peer whose engine runs.
    Ping = 5,
    /// Answer to a ping (no payload).
    Pong = 6,
    /// The sender's op timed out; the payload is its UTF-8 error text. Fails nothing: kept to
    /// explain a later loss of the sender.
    Note = 7,
}

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub kind: Kind,
    pub op: OpType,
    pub dtype: DType,
    pub step: u32,
    pub coll_seq: u64,
    pub seq: u64,
    pub total: u64,
    pub nbytes: u64,
    pub tag: i64,
}

/// Wire code of an op type.
pub(crate) fn op_code(op: OpType) -> u8 {
    op.code()
}

impl Header {
    /// Serialises into the 64-byte wire form.
    pub(crate) fn encode(&self) -> [u8; HDR] {
        let mut b = [0u8; HDR];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4] = self.kind as u8;
        b[5] = op_code(self.op);
        b[6] = self.dtype.code();
        b[8..12].copy_from_slice(&self.step.to_le_bytes());
        b[16..24].copy_from_slice(&self.coll_seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.seq.to_le_bytes());
        b[32..40].copy_from_slice(&self.total.to_le_bytes());
        b[40..48].copy_from_slice(&self.nbytes.to_le_bytes());
        b[48..56].copy_from_slice(&self.tag.to_le_bytes());
        b
    }

    /// Parses the wire form; `Err` describes what is wrong (bad magic, unknown kind/dtype).
    pub(crate) fn decode(b: &[u8]) -> Result<Header, String> {
        let u64at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let magic = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes"));
        if magic != MAGIC {
            return Err(format!(
                "bad frame magic {magic:#x} (stream out of sync or not a c10d-gloo peer)"
            ));
        }
        let kind = match b[4] {
            1 => Kind::Coll,
            2 => Kind::P2p,
            3 => Kind::Error,
            4 => Kind::Bye,
            5 => Kind::Ping,
            6 => Kind::Pong,
            7 => Kind::Note,
            k => return Err(format!("unknown frame kind {k}")),
        };
        let op = OpType::from_code(b[5]).ok_or_else(|| format!("unknown op code {}", b[5]))?;
        let dtype = DType::from_code(b[6]).ok_or_else(|| format!("unknown dtype code {}", b[6]))?;
        Ok(Header {
            kind,
            op,
            dtype,
            step: u32::from_le_bytes(b[8..12].try_into().expect("4 bytes")),
            coll_seq: u64at(16),
            seq: u64at(24),
            total: u64at(32),
            nbytes: u64at(40),
            tag: u64at(48) as i64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let h = Header {
            kind: Kind::P2p,
            op: OpType::Send,
            dtype: DType::BF16,
            step: 7,
            coll_seq: 1 << 40,
            seq: 12,
            total: 4096,
            nbytes: 4096,
            tag: -3,
        };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        let mut bad = h.encode();
        bad[0] = 0;
        assert!(Header::decode(&bad).unwrap_err().contains("magic"));
        for op in OpType::ALL {
            assert_eq!(OpType::from_code(op_code(op)), Some(op));
        }
    }
}

#[cfg(test)]
mod fuzz_bounded {
    /// The `gloo_frame_header` fuzz target's check on 200,000 seeded random headers, half of
    /// them with a valid magic (so the fields behind it are reached).
    #[test]
    fn random_headers_decode_or_are_refused() {
        let mut next = crate::fuzzing::seeded(0x6C0F_F00D_0000_0026);
        let mut b = [0u8; super::HDR];
        for i in 0..200_000 {
            for c in b.chunks_mut(8) {
                c.copy_from_slice(&next().to_le_bytes());
            }
            if i % 2 == 0 {
                b[0..4].copy_from_slice(&super::MAGIC.to_le_bytes());
                b[4] = (next() % 9) as u8;
            }
            crate::fuzzing::frame_header(&b);
        }
    }
}
