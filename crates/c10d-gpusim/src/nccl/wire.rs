//! The frames between a rank and its communicator's hub, over TCP on 127.0.0.1:
//! `[u32 length][u8 kind][u64 comm][u64 seq][u32 rank][u32 aux][payload]`, little-endian.

use std::io::{self, Read, Write};

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// rank → hub: joins communicator `comm` as `rank` of `aux`; payload: host id and device.
    Hello = 1,
    /// hub → rank: every rank of `comm` joined.
    Ready = 2,
    /// rank → hub: this rank's part of collective `seq` (an [`OpHeader`] then its data).
    Contribute = 3,
    /// hub → rank: this rank's result of collective `seq`.
    Result = 4,
    /// rank → hub: message `seq` from `rank` to `aux`.
    Send = 5,
    /// rank → hub: `rank` waits for message `seq` from `aux`.
    RecvPost = 6,
    /// hub → rank: message `seq` from `aux`.
    Deliver = 7,
    /// rank → hub: the rank leaves `comm` on purpose (destroy, finalize).
    Bye = 8,
    /// hub → rank: the wait named by the payload's first byte (a kind) and `seq`/`aux` fails
    /// with NCCL result `rank`; the rest of the payload is the message.
    Error = 9,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        use Kind::*;
        [
            Hello, Ready, Contribute, Result, Send, RecvPost, Deliver, Bye, Error,
        ]
        .into_iter()
        .find(|k| *k as u8 == v)
    }
}

/// One frame.
#[derive(Clone, Debug)]
pub struct Frame {
    /// What it is.
    pub kind: Kind,
    /// The communicator's key.
    pub comm: u64,
    /// Collective or message sequence number.
    pub seq: u64,
    /// A rank (or a result code in [`Kind::Error`]).
    pub rank: u32,
    /// A second number (peer rank, world size).
    pub aux: u32,
    /// The bytes.
    pub payload: Vec<u8>,
}

const HEADER: usize = 1 + 8 + 8 + 4 + 4;

impl Frame {
    /// A frame with an empty payload.
    pub fn new(kind: Kind, comm: u64, seq: u64, rank: u32, aux: u32) -> Frame {
        Frame {
            kind,
            comm,
            seq,
            rank,
            aux,
            payload: Vec::new(),
        }
    }

    /// The frame with `payload`.
    pub fn with(mut self, payload: Vec<u8>) -> Frame {
        self.payload = payload;
        self
    }

    /// Writes the frame.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let mut buf = Vec::with_capacity(4 + HEADER + self.payload.len());
        buf.extend_from_slice(&((HEADER + self.payload.len()) as u32).to_le_bytes());
        buf.push(self.kind as u8);
        buf.extend_from_slice(&self.comm.to_le_bytes());
        buf.extend_from_slice(&self.seq.to_le_bytes());
        buf.extend_from_slice(&self.rank.to_le_bytes());
        buf.extend_from_slice(&self.aux.to_le_bytes());
        buf.extend_from_slice(&self.payload);
        w.write_all(&buf)
    }

    /// Reads one frame; `UnexpectedEof` when the peer closed the connection.
    pub fn read_from(r: &mut impl Read) -> io::Result<Frame> {
        let mut len = [0u8; 4];
        r.read_exact(&mut len)?;
        let len = u32::from_le_bytes(len) as usize;
        if len < HEADER {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "short frame"));
        }
        let mut buf = vec![0u8; len];
        r.read_exact(&mut buf)?;
        let kind = Kind::from_u8(buf[0])
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unknown frame kind"))?;
        let u64_at = |i: usize| u64::from_le_bytes(buf[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(buf[i..i + 4].try_into().expect("4 bytes"));
        Ok(Frame {
            kind,
            comm: u64_at(1),
            seq: u64_at(9),
            rank: u32_at(17),
            aux: u32_at(21),
            payload: buf[HEADER..].to_vec(),
        })
    }
}

/// What a collective is, sent before its data so the hub can check that every rank called the
/// same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpHeader {
    /// 1 all_reduce, 2 broadcast, 3 reduce, 4 all_gather, 5 reduce_scatter, 6 split, 7 shrink.
    pub op: u8,
    /// NCCL data type.
    pub dtype: i32,
    /// NCCL reduction (0..=4; PreMulSum is applied by the rank and sent as a sum).
    pub red: i32,
    /// Root rank (broadcast, reduce), split color, or -1.
    pub root: i32,
    /// Element count as the call gave it.
    pub count: u64,
}

/// Bytes of an encoded [`OpHeader`].
pub const OP_HEADER: usize = 1 + 4 + 4 + 4 + 8;

impl OpHeader {
    /// The header followed by `data`.
    pub fn encode(&self, data: &[u8]) -> Vec<u8> {
        let mut v = Vec::with_capacity(OP_HEADER + data.len());
        v.push(self.op);
        v.extend_from_slice(&self.dtype.to_le_bytes());
        v.extend_from_slice(&self.red.to_le_bytes());
        v.extend_from_slice(&self.root.to_le_bytes());
        v.extend_from_slice(&self.count.to_le_bytes());
        v.extend_from_slice(data);
        v
    }

    /// The header and the data after it.
    pub fn decode(b: &[u8]) -> Option<(OpHeader, &[u8])> {
        if b.len() < OP_HEADER {
            return None;
        }
        let i32_at = |i: usize| i32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let h = OpHeader {
            op: b[0],
            dtype: i32_at(1),
            red: i32_at(5),
            root: i32_at(9),
            count: u64::from_le_bytes(b[13..21].try_into().expect("8 bytes")),
        };
        Some((h, &b[OP_HEADER..]))
    }
}
