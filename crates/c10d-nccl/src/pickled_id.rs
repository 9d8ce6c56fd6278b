//! vLLM's `ncclUniqueId` as its `StatelessProcessGroup.broadcast_obj` stores it: `pickle.dumps`
//! of a ctypes `Structure` whose only field is `internal = c_byte * 128`. CPython pickles such an
//! object as a call of `_ctypes._unpickle(cls, ({}, <the 128 bytes>))`.
//!
//! A pickle is a program: loading one runs whatever callable it names, which is how pickled
//! store values become remote code execution in the stacks that load them. Nothing here loads a
//! pickle. [`decode`] reads it with the workspace's one pickle codec, `serde-pickle` (as the
//! object collectives and the flight recorder do), which resolves no global and runs nothing: a
//! call of an unknown global is kept as its arguments. It then accepts exactly one shape, a
//! call on `(class, ({}, 128 bytes))`, from a pickle of protocol 3, 4 or 5 of at most 1 KiB
//! that names `_ctypes`, `_unpickle` and `ncclUniqueId` (serde-pickle keeps no global's name, so
//! the names are looked for in the pickle's bytes; the 128 bytes are all that is ever read from
//! it). Anything else is refused, with serde-pickle's reason where it is a malformed pickle.
//!
//! [`encode`] writes what CPython's `pickle.dumps(id, protocol=4)` writes for vLLM's class (byte
//! for byte, a fixed template around the id: serde-pickle writes no globals), so vLLM's workers
//! load it as their own.

use c10d_core::{DistError, Result};
use serde_pickle::{DeOptions, Value};

/// The module vLLM defines `ncclUniqueId` in.
pub const VLLM_MODULE: &str = "vllm.distributed.device_communicators.pynccl_wrapper";

/// The class name the pickle must name.
const CLASS: &str = "ncclUniqueId";

/// The callable CPython pickles a ctypes structure as a call of (module, name).
const UNPICKLE: (&str, &str) = ("_ctypes", "_unpickle");

/// Bytes of an `ncclUniqueId`.
pub const ID_BYTES: usize = 128;

/// The longest pickle read (CPython's is about 250 bytes): nothing larger is parsed.
const MAX_PICKLE: usize = 1024;

/// The opcodes of [`encode`]'s template (CPython's protocol-4 output for vLLM's id).
mod op {
    pub const PROTO: u8 = 0x80;
    pub const FRAME: u8 = 0x95;
    pub const STACK_GLOBAL: u8 = 0x93;
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const MEMOIZE: u8 = 0x94;
    pub const EMPTY_DICT: u8 = b'}';
    pub const SHORT_BINBYTES: u8 = b'C';
    pub const TUPLE2: u8 = 0x86;
    pub const REDUCE: u8 = b'R';
    pub const STOP: u8 = b'.';
}

/// The pickle CPython writes for vLLM's `ncclUniqueId` holding `id` (protocol 4).
pub fn encode(id: &[u8; ID_BYTES]) -> Vec<u8> {
    let mut body = Vec::with_capacity(256);
    let memo = |b: &mut Vec<u8>| b.push(op::MEMOIZE);
    for s in [UNPICKLE.0, UNPICKLE.1] {
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

/// The 128 id bytes of a pickled vLLM `ncclUniqueId` (see the module docs).
///
/// # Errors
/// [`DistError::InvalidArgument`] for a pickle over 1 KiB or of another protocol, one that
/// serde-pickle cannot read (naming its reason and offset), one that does not name vLLM's class
/// and `_ctypes._unpickle`, or a well-formed pickle of something else.
pub fn decode(pickle: &[u8]) -> Result<[u8; ID_BYTES]> {
    if pickle.len() > MAX_PICKLE {
        return Err(refused(format!(
            "{} bytes (at most {MAX_PICKLE})",
            pickle.len()
        )));
    }
    match pickle {
        [op::PROTO, 3..=5, ..] => {}
        [op::PROTO, v, ..] => {
            return Err(refused(format!("pickle protocol {v} (3 to 5 are read)")));
        }
        _ => return Err(refused("no PROTO opcode at its start".into())),
    }
    // A call of a global serde-pickle does not know keeps its arguments (`keep_restore_state`);
    // the globals themselves read as None (`replace_unresolved_globals`).
    let opts = DeOptions::new()
        .keep_restore_state()
        .replace_unresolved_globals();
    let value = serde_pickle::value_from_slice(pickle, opts)
        .map_err(|e| refused(format!("not a pickle serde-pickle reads ({e})")))?;
    let Value::Tuple(call) = value else {
        return Err(refused("a pickle that is not one ncclUniqueId".into()));
    };
    let [Value::None, Value::Tuple(state)] = call.as_slice() else {
        return Err(refused(
            "a call of something other than (class, state)".into(),
        ));
    };
    let [Value::Dict(d), Value::Bytes(bytes)] = state.as_slice() else {
        return Err(refused("a ctypes state other than ({}, bytes)".into()));
    };
    if !d.is_empty() {
        return Err(refused("a ctypes state other than ({}, bytes)".into()));
    }
    let call = format!("{}.{}", UNPICKLE.0, UNPICKLE.1);
    if !(names(pickle, UNPICKLE.0) && names(pickle, UNPICKLE.1)) {
        return Err(refused(format!("a call of a global other than {call}")));
    }
    if !names(pickle, CLASS) {
        return Err(refused(format!("a ctypes class other than {CLASS}")));
    }
    bytes.as_slice().try_into().map_err(|_| {
        refused(format!(
            "an id of {} bytes (expected {ID_BYTES})",
            bytes.len()
        ))
    })
}

/// Whether `name` occurs in the pickle's bytes (as a global's module or name must).
fn names(pickle: &[u8], name: &str) -> bool {
    pickle.windows(name.len()).any(|w| w == name.as_bytes())
}

fn refused(why: String) -> DistError {
    DistError::invalid(format!(
        "refusing a pickled store value that is not vLLM's ncclUniqueId: {why}; pickles are parsed, never loaded"
    ))
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
        // Protocol 5 (Python 3.14's default) writes the same opcodes.
        let mut p5 = p.clone();
        p5[1] = 5;
        assert_eq!(decode(&p5).unwrap(), id());
    }

    /// What CPython's `pickle.dumps(id, protocol=3)` writes: GLOBAL lines and BINPUT memos.
    #[test]
    fn protocol_3_is_read() {
        let mut p = vec![op::PROTO, 3];
        p.extend_from_slice(b"c_ctypes\n_unpickle\nq\x00c");
        p.extend_from_slice(VLLM_MODULE.as_bytes());
        p.extend_from_slice(b"\nncclUniqueId\nq\x01}q\x02C\x80");
        p.extend_from_slice(&id());
        p.extend_from_slice(b"q\x03\x86q\x04\x86q\x05Rq\x06.");
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
        assert_eq!(decode(&shaped(UNPICKLE, CLASS, &id())).unwrap(), id());
        let e = decode(&shaped(("posix", "system"), CLASS, &id())).unwrap_err();
        assert!(
            e.message()
                .contains("a call of a global other than _ctypes._unpickle"),
            "{e}"
        );
        let e = decode(&shaped(UNPICKLE, "c_char_p", &id())).unwrap_err();
        assert!(
            e.message()
                .contains("a ctypes class other than ncclUniqueId"),
            "{e}"
        );
        let e = decode(&shaped(UNPICKLE, CLASS, &id()[..127])).unwrap_err();
        assert!(e.message().contains("an id of 127 bytes"), "{e}");
        // A malformed pickle (TUPLE1 on an empty stack), trailing bytes, truncation, old
        // protocols: serde-pickle's reason.
        let e = decode(&[op::PROTO, 4, 0x85]).unwrap_err();
        assert!(
            e.message().contains("not a pickle serde-pickle reads"),
            "{e}"
        );
        let mut p = encode(&id());
        p.push(0);
        assert!(decode(&p).unwrap_err().message().contains("trailing bytes"));
        let p = encode(&id());
        assert!(decode(&p[..p.len() - 3]).is_err());
        let e = decode(&[op::PROTO, 2, op::STOP]).unwrap_err();
        assert!(e.message().contains("protocol 2"), "{e}");
        assert!(decode(b"").is_err());
        // Bare bytes, no PROTO, a non-empty state dict, a huge nest: refused, never a panic.
        let mut bare = vec![op::PROTO, 4, op::SHORT_BINBYTES, 128];
        bare.extend_from_slice(&id());
        bare.push(op::STOP);
        assert!(decode(&bare)
            .unwrap_err()
            .message()
            .contains("not one ncclUniqueId"));
        assert!(decode(&encode(&id())[2..]).is_err());
        let mut nest = vec![op::PROTO, 4];
        for _ in 0..100_000 {
            nest.extend([op::EMPTY_DICT, op::EMPTY_DICT, op::TUPLE2]);
        }
        assert!(decode(&nest).unwrap_err().message().contains("at most"));
        // A call of an unknown global never runs: reading one only yields its arguments.
        let exec = b"\x80\x04\x8c\x05posix\x8c\x06system\x93\x8c\x04true\x85R.";
        assert!(decode(exec).unwrap_err().message().contains("never loaded"));
    }
}
