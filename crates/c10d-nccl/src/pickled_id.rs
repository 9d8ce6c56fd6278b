//! vLLM's `ncclUniqueId` as its `StatelessProcessGroup.broadcast_obj` stores it: `pickle.dumps`
//! of a ctypes `Structure` whose only field is `internal = c_byte * 128`. CPython pickles such an
//! object as a call of `_ctypes._unpickle(cls, ({}, <the 128 bytes>))`.
//!
//! A pickle is a program: loading one runs whatever callable it names, which is how pickled
//! store values become remote code execution in the stacks that load them. Nothing here loads a
//! pickle. [`decode`] walks the opcodes and accepts exactly one shape, the one CPython writes
//! for this object with protocol 3, 4 or 5:
//!
//! ```text
//! PROTO n [FRAME len] GLOBAL("_ctypes", "_unpickle") GLOBAL(<module>, "ncclUniqueId")
//! EMPTY_DICT BYTES(128) TUPLE2 TUPLE2 REDUCE STOP        (memo puts allowed anywhere)
//! ```
//!
//! where GLOBAL is `GLOBAL` (protocol 3) or two strings and `STACK_GLOBAL` (4 and 5), and BYTES
//! is `SHORT_BINBYTES` or `BINBYTES`; anything else (and anything over 1 KiB) is refused with
//! the offending opcode and its offset. [`encode`] writes what CPython's `pickle.dumps(id, protocol=4)` writes for
//! vLLM's class (byte for byte), so vLLM's workers load it as their own.

use c10d_core::{DistError, Result};

/// The module vLLM defines `ncclUniqueId` in.
pub const VLLM_MODULE: &str = "vllm.distributed.device_communicators.pynccl_wrapper";

/// The class name the pickle must name.
const CLASS: &str = "ncclUniqueId";

/// Bytes of an `ncclUniqueId`.
pub const ID_BYTES: usize = 128;

/// The longest pickle read (CPython's is about 250 bytes): nothing larger is walked.
const MAX_PICKLE: usize = 1024;

mod op {
    pub const PROTO: u8 = 0x80;
    pub const FRAME: u8 = 0x95;
    pub const GLOBAL: u8 = b'c';
    pub const STACK_GLOBAL: u8 = 0x93;
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE: u8 = b'X';
    pub const MEMOIZE: u8 = 0x94;
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const EMPTY_DICT: u8 = b'}';
    pub const SHORT_BINBYTES: u8 = b'C';
    pub const BINBYTES: u8 = b'B';
    pub const TUPLE2: u8 = 0x86;
    pub const REDUCE: u8 = b'R';
    pub const STOP: u8 = b'.';
}

/// The pickle CPython writes for vLLM's `ncclUniqueId` holding `id` (protocol 4).
pub fn encode(id: &[u8; ID_BYTES]) -> Vec<u8> {
    let mut body = Vec::with_capacity(256);
    let memo = |b: &mut Vec<u8>| b.push(op::MEMOIZE);
    for s in ["_ctypes", "_unpickle"] {
        short_unicode(&mut body, s);
        memo(&mut body);
    }
    body.push(op::STACK_GLOBAL);
    memo(&mut body);
    for s in [VLLM_MODULE, CLASS] {
        short_unicode(&mut body, s);
        memo(&mut body);
    }
    body.push(op::STACK_GLOBAL);
    memo(&mut body);
    body.push(op::EMPTY_DICT);
    memo(&mut body);
    body.push(op::SHORT_BINBYTES);
    body.push(ID_BYTES as u8);
    body.extend_from_slice(id);
    memo(&mut body);
    for _ in 0..2 {
        body.push(op::TUPLE2);
        memo(&mut body);
    }
    body.push(op::REDUCE);
    memo(&mut body);
    body.push(op::STOP);
    let mut out = vec![op::PROTO, 4, op::FRAME];
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend(body);
    out
}

fn short_unicode(out: &mut Vec<u8>, s: &str) {
    out.push(op::SHORT_BINUNICODE);
    out.push(s.len() as u8);
    out.extend_from_slice(s.as_bytes());
}

/// What the walk has seen, in the order the accepted shape wants it.
#[derive(Debug, PartialEq)]
enum Item {
    Str(String),
    Global(String, String),
    Dict,
    Bytes(Vec<u8>),
    Tuple(Vec<Item>),
    /// What `_ctypes._unpickle(ncclUniqueId, ({}, bytes))` makes: the only accepted result.
    Id(Vec<u8>),
}

/// The 128 id bytes of a pickled vLLM `ncclUniqueId` (see the module docs).
///
/// # Errors
/// [`DistError::InvalidArgument`] naming the first opcode (and its offset) that is not part of
/// the accepted shape, a truncated pickle, or a well-formed pickle of something else.
pub fn decode(pickle: &[u8]) -> Result<[u8; ID_BYTES]> {
    if pickle.len() > MAX_PICKLE {
        return Err(refused(format!(
            "{} bytes (at most {MAX_PICKLE})",
            pickle.len()
        )));
    }
    let mut r = Reader { b: pickle, at: 0 };
    let (proto, version) = (r.byte()?, r.byte()?);
    if proto != op::PROTO {
        return Err(refused("no PROTO opcode at its start".into()));
    }
    if !(3..=5).contains(&version) {
        return Err(refused(format!(
            "pickle protocol {version} (3 to 5 are read)"
        )));
    }
    if r.b.get(2) == Some(&op::FRAME) {
        r.take(9)?;
    }
    let mut stack: Vec<Item> = Vec::new();
    loop {
        let at = r.at;
        let code = r.byte()?;
        match code {
            op::MEMOIZE => {}
            op::BINPUT => {
                r.take(1)?;
            }
            op::LONG_BINPUT => {
                r.take(4)?;
            }
            op::SHORT_BINUNICODE => {
                let n = r.byte()? as usize;
                stack.push(Item::Str(r.utf8(n)?));
            }
            op::BINUNICODE => {
                let n = r.u32()? as usize;
                stack.push(Item::Str(r.utf8(n)?));
            }
            op::GLOBAL => {
                let module = r.line()?;
                let name = r.line()?;
                stack.push(Item::Global(module, name));
            }
            op::STACK_GLOBAL => {
                let (Some(Item::Str(name)), Some(Item::Str(module))) = (stack.pop(), stack.pop())
                else {
                    return Err(refused(format!(
                        "STACK_GLOBAL without two names at byte {at}"
                    )));
                };
                stack.push(Item::Global(module, name));
            }
            op::EMPTY_DICT => stack.push(Item::Dict),
            op::SHORT_BINBYTES => {
                let n = r.byte()? as usize;
                stack.push(Item::Bytes(r.take(n)?.to_vec()));
            }
            op::BINBYTES => {
                let n = r.u32()? as usize;
                stack.push(Item::Bytes(r.take(n)?.to_vec()));
            }
            op::TUPLE2 => {
                let (Some(b), Some(a)) = (stack.pop(), stack.pop()) else {
                    return Err(refused(format!("TUPLE2 on a short stack at byte {at}")));
                };
                stack.push(Item::Tuple(vec![a, b]));
            }
            op::REDUCE => check_call(&mut stack)?,
            op::PROTO | op::FRAME => {
                return Err(refused(format!("opcode 0x{code:02x} at byte {at}")));
            }
            op::STOP => return finish(stack, r.at, pickle.len()),
            other => {
                return Err(refused(format!("opcode 0x{other:02x} at byte {at}")));
            }
        }
    }
}

/// REDUCE pops (callable, args): it must be `_ctypes._unpickle(<module>.ncclUniqueId, ({},
/// bytes))`; the id bytes are left on the stack for [`finish`].
fn check_call(stack: &mut Vec<Item>) -> Result<()> {
    let (Some(Item::Tuple(args)), Some(Item::Global(m, f))) = (stack.pop(), stack.pop()) else {
        return Err(refused(
            "REDUCE of something other than a global and a tuple".into(),
        ));
    };
    if (m.as_str(), f.as_str()) != ("_ctypes", "_unpickle") {
        return Err(refused(format!(
            "a call of {m}.{f} (only _ctypes._unpickle is read)"
        )));
    }
    let [Item::Global(_, class), Item::Tuple(state)] = args.as_slice() else {
        return Err(refused(
            "_ctypes._unpickle of something other than (class, state)".into(),
        ));
    };
    if class != CLASS {
        return Err(refused(format!("a ctypes {class} (expected {CLASS})")));
    }
    let [Item::Dict, Item::Bytes(bytes)] = state.as_slice() else {
        return Err(refused("a ctypes state other than ({}, bytes)".into()));
    };
    stack.push(Item::Id(bytes.clone()));
    Ok(())
}

fn finish(mut stack: Vec<Item>, end: usize, len: usize) -> Result<[u8; ID_BYTES]> {
    if end != len {
        return Err(refused(format!("{} bytes after STOP", len - end)));
    }
    match (stack.pop(), stack.is_empty()) {
        (Some(Item::Id(b)), true) => b.try_into().map_err(|b: Vec<u8>| {
            refused(format!("an id of {} bytes (expected {ID_BYTES})", b.len()))
        }),
        _ => Err(refused("a pickle that is not one ncclUniqueId".into())),
    }
}

fn refused(why: String) -> DistError {
    DistError::invalid(format!(
        "refusing a pickled store value that is not vLLM's ncclUniqueId: {why}; pickles are parsed, never loaded"
    ))
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let end = end.ok_or_else(|| refused(format!("truncated at byte {}", self.at)))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn byte(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn utf8(&mut self, n: usize) -> Result<String> {
        let at = self.at;
        String::from_utf8(self.take(n)?.to_vec())
            .map_err(|_| refused(format!("a name that is not UTF-8 at byte {at}")))
    }

    /// A newline-terminated name (protocol 3's GLOBAL).
    fn line(&mut self) -> Result<String> {
        let rest = &self.b[self.at..];
        let n = rest
            .iter()
            .position(|&c| c == b'\n')
            .ok_or_else(|| refused(format!("an unterminated GLOBAL at byte {}", self.at)))?;
        let s = self.utf8(n)?;
        self.at += 1;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> [u8; ID_BYTES] {
        std::array::from_fn(|i| (i * 37 % 256) as u8)
    }

    #[test]
    fn encode_then_decode() {
        let p = encode(&id());
        assert_eq!(decode(&p).unwrap(), id());
    }

    /// The accepted shape with other names or bytes.
    fn shaped(call: (&str, &str), class: &str, bytes: &[u8]) -> Vec<u8> {
        let mut b = vec![op::PROTO, 4];
        for s in [call.0, call.1] {
            short_unicode(&mut b, s);
        }
        b.push(op::STACK_GLOBAL);
        for s in [VLLM_MODULE, class] {
            short_unicode(&mut b, s);
        }
        b.push(op::STACK_GLOBAL);
        b.push(op::EMPTY_DICT);
        b.push(op::SHORT_BINBYTES);
        b.push(bytes.len() as u8);
        b.extend_from_slice(bytes);
        b.extend([op::TUPLE2, op::TUPLE2, op::REDUCE, op::STOP]);
        b
    }

    #[test]
    fn anything_else_is_refused() {
        assert_eq!(
            decode(&shaped(("_ctypes", "_unpickle"), CLASS, &id())).unwrap(),
            id()
        );
        let e = decode(&shaped(("posix", "system"), CLASS, &id())).unwrap_err();
        assert!(e.message().contains("a call of posix.system"), "{e}");
        let e = decode(&shaped(("_ctypes", "_unpickle"), "c_char_p", &id())).unwrap_err();
        assert!(e.message().contains("a ctypes c_char_p"), "{e}");
        let e = decode(&shaped(("_ctypes", "_unpickle"), CLASS, &id()[..127])).unwrap_err();
        assert!(e.message().contains("an id of 127 bytes"), "{e}");
        // An opcode outside the shape (TUPLE1), trailing bytes, truncation, old protocols.
        let mut p = encode(&id());
        let e = decode(&[op::PROTO, 4, 0x85]).unwrap_err();
        assert!(e.message().contains("opcode 0x85 at byte 2"), "{e}");
        p.push(0);
        assert!(decode(&p).unwrap_err().message().contains("after STOP"));
        let p = encode(&id());
        assert!(decode(&p[..p.len() - 3]).is_err());
        let e = decode(&[op::PROTO, 2, op::STOP]).unwrap_err();
        assert!(e.message().contains("protocol 2"), "{e}");
        assert!(decode(b"").is_err());
        // Bare bytes, no PROTO, a second PROTO, a huge nest: refused, never a panic.
        let mut bare = vec![op::PROTO, 4, op::SHORT_BINBYTES, 128];
        bare.extend_from_slice(&id());
        bare.push(op::STOP);
        assert!(decode(&bare)
            .unwrap_err()
            .message()
            .contains("not one ncclUniqueId"));
        assert!(decode(&encode(&id())[2..]).is_err());
        let mut twice = vec![op::PROTO, 4, op::PROTO, 4];
        twice.extend_from_slice(&encode(&id())[2..]);
        assert!(decode(&twice).is_err());
        let mut nest = vec![op::PROTO, 4];
        for _ in 0..100_000 {
            nest.extend([op::EMPTY_DICT, op::EMPTY_DICT, op::TUPLE2]);
        }
        assert!(decode(&nest).unwrap_err().message().contains("at most"));
    }
}
