//! PyTorch 2.x `TCPStore` wire protocol: command numbers, request encoders and an incremental,
//! resumable request decoder (see `shared/docs/store-protocol.md` §0–§3).
//!
//! Encoding: integers are little-endian (`u8` command, `u64` lengths/counts, `i64` numbers,
//! `u32` magic/nonce); a string or byte vector is `u64 len` + raw bytes; a key list is
//! `u64 count` + strings. Requests carry no frame header and are self-delimiting.

use std::fmt;

/// Magic number sent with `VALIDATE` (`0x3C85F7CE`, bytes `ce f7 85 3c`).
pub const VALIDATE_MAGIC: u32 = 0x3C85_F7CE;

/// Command bytes of PyTorch ≥ 2.2 (`QueryType`, append-only; 2.15 ends at `BARRIER`).
#[allow(missing_docs)]
pub mod cmd {
    pub const VALIDATE: u8 = 0;
    pub const SET: u8 = 1;
    pub const COMPARE_SET: u8 = 2;
    pub const GET: u8 = 3;
    pub const ADD: u8 = 4;
    pub const CHECK: u8 = 5;
    pub const WAIT: u8 = 6;
    pub const GETNUMKEYS: u8 = 7;
    pub const DELETE_KEY: u8 = 8;
    pub const APPEND: u8 = 9;
    pub const MULTI_GET: u8 = 10;
    pub const MULTI_SET: u8 = 11;
    pub const CANCEL_WAIT: u8 = 12;
    pub const PING: u8 = 13;
    pub const QUEUE_PUSH: u8 = 14;
    pub const QUEUE_POP: u8 = 15;
    pub const QUEUE_LEN: u8 = 16;
    pub const LIST_KEYS: u8 = 17;
    pub const BARRIER: u8 = 18;
}

/// `CheckResponseType::READY`.
pub const CHECK_READY: u8 = 0;
/// `CheckResponseType::NOT_READY`.
pub const CHECK_NOT_READY: u8 = 1;
/// `WaitResponseType::STOP_WAITING`.
pub const STOP_WAITING: u8 = 0;
/// `WaitResponseType::WAIT_CANCELED`.
pub const WAIT_CANCELED: u8 = 1;

/// Byte strings: keys and values (arbitrary bytes on the wire).
pub type Bytes = Vec<u8>;

/// One decoded client request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Request {
    Validate(u32),
    Set(Bytes, Bytes),
    CompareSet(Bytes, Bytes, Bytes),
    Get(Bytes),
    Add(Bytes, i64),
    Check(Vec<Bytes>),
    Wait(Vec<Bytes>),
    GetNumKeys,
    DeleteKey(Bytes),
    Append(Bytes, Bytes),
    MultiGet(Vec<Bytes>),
    MultiSet(Vec<(Bytes, Bytes)>),
    CancelWait,
    Ping(u32),
    QueuePush(Bytes, Bytes),
    QueuePop(Bytes),
    QueueLen(Bytes),
    ListKeys,
    Barrier(Bytes, i64),
}

/// Why a byte stream was rejected; the server closes that connection. Fields: the offending
/// length/count and the limit.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    /// Command byte outside `0..=18`.
    UnknownCommand(u8),
    /// A key longer than the key-length limit.
    KeyTooLong { len: u64, max: usize },
    /// A value longer than the payload limit (libuv: "Invalid payload size").
    PayloadTooLarge { len: u64, max: usize },
    /// A key count above the limit.
    TooManyKeys { count: u64, max: usize },
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::UnknownCommand(c) => write!(f, "unknown command byte {c}"),
            ProtocolError::KeyTooLong { len, max } => {
                write!(f, "invalid key size {len}, max: {max}")
            }
            ProtocolError::PayloadTooLarge { len, max } => {
                write!(f, "Invalid payload size {len}, max: {max}")
            }
            ProtocolError::TooManyKeys { count, max } => {
                write!(f, "invalid key count {count}, max: {max}")
            }
        }
    }
}

impl std::error::Error for ProtocolError {}

/// Decoder limits (PyTorch's libuv server: key 8192 B, value 8 MiB, 131072 keys per request).
///
/// Memory held for one partly received request is bounded by these: a key list (CHECK, WAIT,
/// MULTI_GET) at most `max_keys` × (`max_key_len` + 8) bytes, COMPARE_SET one key and two
/// values, and a MULTI_SET at most max(`max_request`, one key + one value): a longer MULTI_SET is
/// handed out in pieces of complete pairs (see [`Decoder::decode`]).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest key, bytes.
    pub max_key_len: usize,
    /// Longest value, bytes.
    pub max_payload: usize,
    /// Most keys in CHECK/WAIT/MULTI_GET/MULTI_SET.
    pub max_keys: usize,
    /// Most bytes a MULTI_SET buffers before its complete pairs are handed out as a piece.
    pub max_request: usize,
}

impl Limits {
    /// PyTorch's server limits (libuv backend: key 8 KiB, value 8 MiB, 131,072 keys a request)
    /// and a 64 MiB MULTI_SET piece: the server's defaults and what the client checks.
    pub const DEFAULT: Limits = Limits {
        max_key_len: 8192,
        max_payload: 8 << 20,
        max_keys: 131_072,
        max_request: 64 << 20,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    U32,
    I64,
    Key,
    Val,
    Count,
}

/// The field layout of a command: fixed fields, or a count followed by items of the given kinds.
fn layout(c: u8) -> Option<(&'static [Kind], bool)> {
    use Kind::*;
    Some(match c {
        cmd::VALIDATE | cmd::PING => (&[U32], false),
        cmd::SET | cmd::APPEND | cmd::QUEUE_PUSH => (&[Key, Val], false),
        cmd::COMPARE_SET => (&[Key, Val, Val], false),
        cmd::GET | cmd::DELETE_KEY | cmd::QUEUE_POP | cmd::QUEUE_LEN => (&[Key], false),
        cmd::ADD | cmd::BARRIER => (&[Key, I64], false),
        cmd::CHECK | cmd::WAIT | cmd::MULTI_GET => (&[Key], true),
        cmd::MULTI_SET => (&[Key, Val], true),
        cmd::GETNUMKEYS | cmd::CANCEL_WAIT | cmd::LIST_KEYS => (&[], false),
        _ => return None,
    })
}

/// Incremental request decoder. Feed it bytes as they arrive, in any split; it consumes each
/// byte once (no re-parsing), never allocates from a length field before the bytes arrived,
/// and enforces [`Limits`].
#[derive(Debug)]
pub struct Decoder {
    limits: Limits,
    state: Option<Partial>,
    /// Scratch for a fixed-size integer split across feeds.
    scratch: [u8; 8],
    scratch_len: usize,
}

#[derive(Debug)]
struct Partial {
    cmd: u8,
    kinds: &'static [Kind],
    list: bool,
    /// Fields completed so far (for list commands, the count is field 0).
    done: usize,
    count: u64,
    num: i64,
    strs: Vec<Bytes>,
    /// Length of the string being received, once its length field is complete.
    cur_len: Option<usize>,
    cur: Bytes,
    total: usize,
}

impl Partial {
    fn total_fields(&self) -> Option<u64> {
        if self.list {
            if self.done == 0 {
                None
            } else {
                Some(1 + self.count * self.kinds.len() as u64)
            }
        } else {
            Some(self.kinds.len() as u64)
        }
    }

    fn next_kind(&self) -> Kind {
        if self.list {
            if self.done == 0 {
                Kind::Count
            } else {
                self.kinds[(self.done - 1) % self.kinds.len()]
            }
        } else {
            self.kinds[self.done]
        }
    }

    fn finish(self) -> Request {
        let mut strs = self.strs.into_iter();
        let mut s = || strs.next().unwrap_or_default();
        match self.cmd {
            cmd::VALIDATE => Request::Validate(self.num as u32),
            cmd::PING => Request::Ping(self.num as u32),
            cmd::SET => Request::Set(s(), s()),
            cmd::APPEND => Request::Append(s(), s()),
            cmd::QUEUE_PUSH => Request::QueuePush(s(), s()),
            cmd::COMPARE_SET => Request::CompareSet(s(), s(), s()),
            cmd::GET => Request::Get(s()),
            cmd::DELETE_KEY => Request::DeleteKey(s()),
            cmd::QUEUE_POP => Request::QueuePop(s()),
            cmd::QUEUE_LEN => Request::QueueLen(s()),
            cmd::ADD => Request::Add(s(), self.num),
            cmd::BARRIER => Request::Barrier(s(), self.num),
            cmd::GETNUMKEYS => Request::GetNumKeys,
            cmd::CANCEL_WAIT => Request::CancelWait,
            cmd::LIST_KEYS => Request::ListKeys,
            cmd::CHECK => Request::Check(strs.collect()),
            cmd::WAIT => Request::Wait(strs.collect()),
            cmd::MULTI_GET => Request::MultiGet(strs.collect()),
            _ => Request::MultiSet(pairs_of(strs.collect())),
        }
    }
}

/// Alternating keys and values → pairs.
fn pairs_of(strs: Vec<Bytes>) -> Vec<(Bytes, Bytes)> {
    let mut pairs = Vec::with_capacity(strs.len() / 2);
    let mut it = strs.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        pairs.push((k, v));
    }
    pairs
}

impl Decoder {
    /// A decoder enforcing `limits`.
    pub fn new(limits: Limits) -> Self {
        Decoder {
            limits,
            state: None,
            scratch: [0; 8],
            scratch_len: 0,
        }
    }

    /// True when no request is partially received.
    pub fn is_idle(&self) -> bool {
        self.state.is_none() && self.scratch_len == 0
    }

    /// Bytes currently held for the partial request (received strings plus bookkeeping).
    pub fn buffered(&self) -> usize {
        self.state.as_ref().map_or(0, |p| {
            // `total` counts the string being received at its full length already.
            let unreceived = p.cur_len.map_or(0, |l| l - p.cur.len());
            p.total - unreceived
        }) + self.scratch_len
    }

    /// Takes a fixed-size field of `n` bytes from `input`, buffering partial bytes in scratch.
    fn take_fixed(&mut self, input: &mut &[u8], n: usize) -> Option<[u8; 8]> {
        let want = n - self.scratch_len;
        let got = want.min(input.len());
        self.scratch[self.scratch_len..self.scratch_len + got].copy_from_slice(&input[..got]);
        self.scratch_len += got;
        *input = &input[got..];
        if self.scratch_len == n {
            self.scratch_len = 0;
            let out = self.scratch;
            self.scratch = [0; 8];
            Some(out)
        } else {
            None
        }
    }

    /// Consumes bytes from the front of `input` and returns the next complete request, if any.
    /// Call repeatedly until it returns `Ok(None)` (all input consumed, request incomplete).
    ///
    /// A MULTI_SET that would buffer more than [`Limits::max_request`] bytes comes out as
    /// several [`Request::MultiSet`]s of complete pairs, in order (the last one when the request
    /// ends): applying them one after the other is applying the request, and memory stays bounded
    /// whatever the request's size.
    ///
    /// # Errors
    /// [`ProtocolError`] on an unknown command or a violated limit; the stream is then unusable.
    pub fn decode(&mut self, input: &mut &[u8]) -> Result<Option<Request>, ProtocolError> {
        loop {
            if self.state.is_none() && !self.begin(input)? {
                return Ok(None);
            }
            let p = self.state.as_ref().expect("state set above");
            if p.total_fields() == Some(p.done as u64) {
                let p = self.state.take().expect("state set above");
                return Ok(Some(p.finish()));
            }
            let kind = p.next_kind();
            let step = match (kind, p.cur_len) {
                (Kind::U32, _) => self.take_u32(input),
                (Kind::I64 | Kind::Count, _) => self.take_i64(input, kind)?,
                (Kind::Key | Kind::Val, None) => self.take_len(input, kind)?,
                (Kind::Key | Kind::Val, Some(len)) => self.take_bytes(input, len),
            };
            match step {
                Step::Progress => {}
                Step::NeedInput => return Ok(None),
                Step::Emit(r) => return Ok(Some(r)),
            }
        }
    }

    /// Starts a request from its command byte; `false` when `input` is empty.
    fn begin(&mut self, input: &mut &[u8]) -> Result<bool, ProtocolError> {
        let Some(&c) = input.first() else {
            return Ok(false);
        };
        let (kinds, list) = layout(c).ok_or(ProtocolError::UnknownCommand(c))?;
        *input = &input[1..];
        self.state = Some(Partial {
            cmd: c,
            kinds,
            list,
            done: 0,
            count: 0,
            num: 0,
            strs: Vec::new(),
            cur_len: None,
            cur: Vec::new(),
            total: 0,
        });
        Ok(true)
    }

    /// A u32 field (the request's number).
    fn take_u32(&mut self, input: &mut &[u8]) -> Step {
        let Some(b) = self.take_fixed(input, 4) else {
            return Step::NeedInput;
        };
        let p = self.state.as_mut().expect("state");
        p.num = i64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        p.done += 1;
        Step::Progress
    }

    /// An i64 field: the request's number, or the count of a list (bounded by `max_keys`).
    fn take_i64(&mut self, input: &mut &[u8], kind: Kind) -> Result<Step, ProtocolError> {
        let Some(b) = self.take_fixed(input, 8) else {
            return Ok(Step::NeedInput);
        };
        let max_keys = self.limits.max_keys;
        let p = self.state.as_mut().expect("state");
        if kind == Kind::Count {
            let count = u64::from_le_bytes(b);
            if count > max_keys as u64 {
                return Err(ProtocolError::TooManyKeys {
                    count,
                    max: max_keys,
                });
            }
            p.count = count;
            p.strs.reserve((count as usize * p.kinds.len()).min(1024));
        } else {
            p.num = i64::from_le_bytes(b);
        }
        p.done += 1;
        Ok(Step::Progress)
    }

    /// The length of a key or value (checked against the limits). A MULTI_SET about to pass
    /// `max_request` first hands out its complete pairs.
    fn take_len(&mut self, input: &mut &[u8], kind: Kind) -> Result<Step, ProtocolError> {
        let Some(b) = self.take_fixed(input, 8) else {
            return Ok(Step::NeedInput);
        };
        let len = u64::from_le_bytes(b);
        let lim = self.limits;
        if kind == Kind::Key && len > lim.max_key_len as u64 {
            return Err(ProtocolError::KeyTooLong {
                len,
                max: lim.max_key_len,
            });
        }
        if kind == Kind::Val && len > lim.max_payload as u64 {
            return Err(ProtocolError::PayloadTooLarge {
                len,
                max: lim.max_payload,
            });
        }
        let p = self.state.as_mut().expect("state");
        // 8 bytes of bookkeeping per field (the length field itself).
        let field = len as usize + 8;
        let piece =
            if p.cmd == cmd::MULTI_SET && p.total + field > lim.max_request && p.strs.len() >= 2 {
                // Hand out the complete pairs; a key already received stays.
                let keep = p.strs.len() % 2;
                let rest = p.strs.split_off(p.strs.len() - keep);
                let pairs = std::mem::replace(&mut p.strs, rest);
                p.total = p.strs.iter().map(|s| s.len() + 8).sum();
                Some(pairs_of(pairs))
            } else {
                None
            };
        p.total += field;
        p.cur_len = Some(len as usize);
        Ok(match piece {
            Some(pairs) => Step::Emit(Request::MultiSet(pairs)),
            None => Step::Progress,
        })
    }

    /// The bytes of a key or value of length `len`, possibly over several calls.
    fn take_bytes(&mut self, input: &mut &[u8], len: usize) -> Step {
        let p = self.state.as_mut().expect("state");
        let want = len - p.cur.len();
        let got = want.min(input.len());
        p.cur.extend_from_slice(&input[..got]);
        *input = &input[got..];
        if p.cur.len() < len {
            return Step::NeedInput;
        }
        let s = std::mem::take(&mut p.cur);
        p.strs.push(s);
        p.cur_len = None;
        p.done += 1;
        Step::Progress
    }
}

/// What one decoding step produced.
enum Step {
    /// A field (or part of one) was taken; go on.
    Progress,
    /// `input` is used up before the field is complete.
    NeedInput,
    /// A request to hand out now (a piece of a large MULTI_SET).
    Emit(Request),
}

// ---------------------------------------------------------------------------------------------
// Encoders (used by the client, by tests and by the bench).

/// Appends a `u64` length-prefixed byte string.
pub fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

/// Appends a `u64`.
pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends an `i64`.
pub fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends a key list (`u64 count` + strings).
pub fn put_keys<K: AsRef<[u8]>>(out: &mut Vec<u8>, keys: &[K]) {
    put_u64(out, keys.len() as u64);
    for k in keys {
        put_bytes(out, k.as_ref());
    }
}

impl Request {
    /// Appends the wire encoding of this request to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        match self {
            Request::Validate(m) => {
                out.push(cmd::VALIDATE);
                out.extend_from_slice(&m.to_le_bytes());
            }
            Request::Ping(n) => {
                out.push(cmd::PING);
                out.extend_from_slice(&n.to_le_bytes());
            }
            Request::Set(k, v) => enc2(out, cmd::SET, k, v),
            Request::Append(k, v) => enc2(out, cmd::APPEND, k, v),
            Request::QueuePush(k, v) => enc2(out, cmd::QUEUE_PUSH, k, v),
            Request::CompareSet(k, e, d) => {
                out.push(cmd::COMPARE_SET);
                put_bytes(out, k);
                put_bytes(out, e);
                put_bytes(out, d);
            }
            Request::Get(k) => enc1(out, cmd::GET, k),
            Request::DeleteKey(k) => enc1(out, cmd::DELETE_KEY, k),
            Request::QueuePop(k) => enc1(out, cmd::QUEUE_POP, k),
            Request::QueueLen(k) => enc1(out, cmd::QUEUE_LEN, k),
            Request::Add(k, d) => {
                out.push(cmd::ADD);
                put_bytes(out, k);
                put_i64(out, *d);
            }
            Request::Barrier(k, w) => {
                out.push(cmd::BARRIER);
                put_bytes(out, k);
                put_i64(out, *w);
            }
            Request::Check(ks) => {
                out.push(cmd::CHECK);
                put_keys(out, ks);
            }
            Request::Wait(ks) => {
                out.push(cmd::WAIT);
                put_keys(out, ks);
            }
            Request::MultiGet(ks) => {
                out.push(cmd::MULTI_GET);
                put_keys(out, ks);
            }
            Request::MultiSet(kv) => {
                out.push(cmd::MULTI_SET);
                put_u64(out, kv.len() as u64);
                for (k, v) in kv {
                    put_bytes(out, k);
                    put_bytes(out, v);
                }
            }
            Request::GetNumKeys => out.push(cmd::GETNUMKEYS),
            Request::CancelWait => out.push(cmd::CANCEL_WAIT),
            Request::ListKeys => out.push(cmd::LIST_KEYS),
        }
    }

    /// The wire encoding of this request.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.encode_into(&mut v);
        v
    }
}

fn enc1(out: &mut Vec<u8>, c: u8, k: &[u8]) {
    out.push(c);
    put_bytes(out, k);
}

fn enc2(out: &mut Vec<u8>, c: u8, k: &[u8], v: &[u8]) {
    out.push(c);
    put_bytes(out, k);
    put_bytes(out, v);
}

/// Parses a stored counter like C's `stoll`: optional leading whitespace, optional sign, at least
/// one decimal digit; parsing stops at the first non-digit. `None` when there is no digit or the
/// number overflows `i64` (PyTorch's server then drops the connection).
pub fn parse_stoll(b: &[u8]) -> Option<i64> {
    let mut i = 0;
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c) {
        i += 1;
    }
    let neg = match b.get(i) {
        Some(b'-') => {
            i += 1;
            true
        }
        Some(b'+') => {
            i += 1;
            false
        }
        _ => false,
    };
    let start = i;
    let mut v: i64 = 0;
    while i < b.len() && b[i].is_ascii_digit() {
        let d = i64::from(b[i] - b'0');
        v = if neg {
            v.checked_mul(10)?.checked_sub(d)?
        } else {
            v.checked_mul(10)?.checked_add(d)?
        };
        i += 1;
    }
    if i == start {
        return None;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_requests() -> Vec<Request> {
        vec![
            Request::Validate(VALIDATE_MAGIC),
            Request::Set(b"/a".to_vec(), b"b".to_vec()),
            Request::CompareSet(b"/cs".to_vec(), vec![], b"v1".to_vec()),
            Request::Get(b"/a".to_vec()),
            Request::Add(b"/c".to_vec(), -5),
            Request::Check(vec![b"/a".to_vec(), b"/zz".to_vec()]),
            Request::Wait(vec![]),
            Request::GetNumKeys,
            Request::DeleteKey(b"/a".to_vec()),
            Request::Append(b"/a".to_vec(), vec![0; 3000]),
            Request::MultiGet(vec![b"/x".to_vec()]),
            Request::MultiSet(vec![
                (b"/m1".to_vec(), b"1".to_vec()),
                (b"/m2".to_vec(), b"22".to_vec()),
            ]),
            Request::CancelWait,
            Request::Ping(12345),
            Request::QueuePush(b"/q".to_vec(), b"item".to_vec()),
            Request::QueuePop(b"/q".to_vec()),
            Request::QueueLen(b"/q".to_vec()),
            Request::ListKeys,
            Request::Barrier(b"/bar".to_vec(), 4),
        ]
    }

    #[test]
    fn roundtrip_every_split() {
        let reqs = all_requests();
        let mut stream = Vec::new();
        for r in &reqs {
            r.encode_into(&mut stream);
        }
        for chunk in [1usize, 2, 3, 7, 64, 1440, stream.len()] {
            let mut d = Decoder::new(Limits::default());
            let mut got = Vec::new();
            for c in stream.chunks(chunk) {
                let mut input = c;
                while let Some(r) = d.decode(&mut input).unwrap() {
                    got.push(r);
                }
                assert!(input.is_empty());
            }
            assert_eq!(got, reqs, "chunk {chunk}");
            assert!(d.is_idle());
        }
    }

    #[test]
    fn limits_enforced_before_allocation() {
        let mut d = Decoder::new(Limits::default());
        let mut b = vec![cmd::SET];
        put_u64(&mut b, 2);
        b.extend_from_slice(b"/a");
        put_u64(&mut b, u64::MAX);
        let mut input = &b[..];
        assert!(matches!(
            d.decode(&mut input),
            Err(ProtocolError::PayloadTooLarge { .. })
        ));
        let mut d = Decoder::new(Limits::default());
        let mut b = vec![cmd::GET];
        put_u64(&mut b, 8193);
        assert!(matches!(
            d.decode(&mut &b[..]),
            Err(ProtocolError::KeyTooLong { .. })
        ));
        let mut d = Decoder::new(Limits::default());
        let mut b = vec![cmd::WAIT];
        put_u64(&mut b, 131_073);
        assert!(matches!(
            d.decode(&mut &b[..]),
            Err(ProtocolError::TooManyKeys { .. })
        ));
        let mut d = Decoder::new(Limits::default());
        assert_eq!(
            d.decode(&mut &[19u8][..]),
            Err(ProtocolError::UnknownCommand(19))
        );
    }

    #[test]
    fn large_multi_set_comes_out_in_pieces_of_bounded_size() {
        let limits = Limits {
            max_request: 1000,
            ..Limits::default()
        };
        let pairs: Vec<(Bytes, Bytes)> = (0..40u8)
            .map(|i| (vec![b'k', i], vec![i; usize::from(i) * 10]))
            .collect();
        let mut stream = Request::MultiSet(pairs.clone()).encode();
        Request::Ping(9).encode_into(&mut stream);
        for chunk in [1usize, 7, 300, stream.len()] {
            let mut d = Decoder::new(limits);
            let (mut got, mut pieces, mut rest) = (Vec::new(), 0, Vec::new());
            for c in stream.chunks(chunk) {
                let mut input = c;
                while let Some(r) = d.decode(&mut input).unwrap() {
                    match r {
                        Request::MultiSet(p) => {
                            pieces += 1;
                            got.extend(p);
                        }
                        other => rest.push(other),
                    }
                }
                assert!(d.buffered() <= 1000 + 8, "buffered {}", d.buffered());
            }
            assert_eq!(got, pairs, "chunk {chunk}");
            assert!(pieces > 5, "{pieces} pieces");
            assert_eq!(rest, vec![Request::Ping(9)]);
        }
    }

    #[test]
    fn stoll() {
        assert_eq!(parse_stoll(b"  -3x"), Some(-3));
        assert_eq!(parse_stoll(b"+7"), Some(7));
        assert_eq!(parse_stoll(b"abc"), None);
        assert_eq!(parse_stoll(b""), None);
        assert_eq!(parse_stoll(b"99999999999999999999"), None);
        assert_eq!(parse_stoll(b"-9223372036854775808"), Some(i64::MIN));
    }
}
