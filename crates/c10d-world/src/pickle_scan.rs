//! A bounded pre-scan of a pickle's opcodes, run before `serde-pickle` reads a peer's object.
//!
//! `serde-pickle` keeps a memoised value once while it parses, but copies it at every
//! reference when it builds the result (and at a `PUT` of a `GET`, a `DUP`, ...): a pickle of
//! a few kilobytes (the "billion laughs": a list of ten references to a list of ten
//! references to ...) expands to gigabytes. A declared length (`BINUNICODE`, `BINBYTES8`,
//! `LONG4`) can announce 4 GiB or more, and nesting deep enough exhausts the stack of the
//! recursive deserializer. The scan mirrors the reader's stack machine on a graph of small
//! nodes (one per value, an edge per item put into a container, a memo reference pointing at
//! the memoised node) and computes, without building anything:
//!
//! - the bytes the reader holds while parsing: every value's own size (a fixed [`VALUE`] plus
//!   its payload), a [`VALUE`] per memo reference, and every copy the reader makes (a `DUP`,
//!   a `PUT` of a reference, resolved arguments);
//! - the bytes of the result: every value's own size counted once per path from the result to
//!   it (so a memo reference counts as the size of what it references);
//! - the nesting depth of the result;
//! - every declared length, checked against the bytes that remain.
//!
//! Its own memory is a few words per opcode, and it stops as soon as the parse-time total
//! passes the bound, so it never holds more than about the bound. A pickle the reader would
//! refuse anyway (an unsupported opcode, a missing memo entry, a stack underflow) is passed on
//! at that point: the reader fails at the same opcode, before going further.

use std::collections::HashMap;

/// Bytes counted per value: about the size of `serde_pickle::Value` (an enum of 32 bytes)
/// plus a share of its container's vector.
pub const VALUE: u64 = 32;

/// Bounds on what a peer's pickle may expand to (see [`crate::objects`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PickleLimits {
    /// The expanded size is allowed at least this many bytes (default 64 MiB).
    pub min_bytes: u64,
    /// ... and at least this many times the pickle's length (default 32): a pickle without
    /// shared references never passes it (each opcode byte makes at most one value of
    /// 32 bytes, as the scan counts a value), so only memo expansion and parse-time copies do.
    pub per_pickle_byte: u64,
    /// Deepest nesting allowed (default 500: `serde-pickle`'s recursive reader needs about
    /// 2 kB of stack per level in a debug build, and a thread has 2 MiB; Python's own
    /// `pickle.dumps` stops near 1000, its recursion limit).
    pub max_depth: usize,
}

impl Default for PickleLimits {
    fn default() -> PickleLimits {
        PickleLimits {
            min_bytes: 64 << 20,
            per_pickle_byte: 32,
            max_depth: 500,
        }
    }
}

impl PickleLimits {
    /// The defaults, overridden by `C10D_OBJECT_MAX_BYTES` (the floor, bytes) and
    /// `C10D_OBJECT_MAX_DEPTH` where set to a number.
    pub fn from_env() -> PickleLimits {
        let mut l = PickleLimits::default();
        let var = |n: &str| {
            std::env::var(n)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        if let Some(b) = var("C10D_OBJECT_MAX_BYTES") {
            l.min_bytes = b;
        }
        if let Some(d) = var("C10D_OBJECT_MAX_DEPTH") {
            l.max_depth = d as usize;
        }
        l
    }

    /// The bound on the expanded size of a pickle of `len` bytes.
    pub fn bound(&self, len: usize) -> u64 {
        self.min_bytes
            .max(self.per_pickle_byte.saturating_mul(len as u64))
    }
}

/// Why a pickle was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// It expands past the bound (bytes).
    Expands { bound: u64 },
    /// It nests deeper than the bound.
    Deep { bound: usize },
    /// An opcode at `at` declares `len` bytes where `left` remain.
    Length { at: usize, len: u64, left: usize },
    /// The result refers to itself (the reader cannot build it).
    Recursive,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Expands { bound } => write!(
                f,
                "pickle expands past the {} bound (memoised values are copied at every reference; C10D_OBJECT_MAX_BYTES raises it)",
                human(*bound)
            ),
            Refused::Deep { bound } => write!(
                f,
                "pickle nests deeper than the bound of {bound} levels (C10D_OBJECT_MAX_DEPTH raises it)"
            ),
            Refused::Length { at, len, left } => write!(
                f,
                "pickle declares a length of {len} bytes at offset {at} where {left} remain (bound: the bytes received)"
            ),
            Refused::Recursive => write!(f, "pickle refers to itself (recursive structures cannot be read)"),
        }
    }
}

/// `b` bytes as "64 MiB" when a whole number of MiB, else bytes.
pub fn human(b: u64) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else {
        format!("{b} bytes")
    }
}

/// One stack entry: a node, and whether it is a memo reference (cheap to copy).
#[derive(Clone, Copy)]
struct Entry {
    node: usize,
    memo_ref: bool,
}

struct Node {
    own: u64,
    /// Its nesting as the reader holds it while parsing (a memo reference is a leaf there):
    /// dropping or copying the reader's state recurses this deep, even when it then fails.
    depth: usize,
    /// First edge (index into `edges`), `usize::MAX` when none.
    head: usize,
}

struct Scan<'a> {
    b: &'a [u8],
    pos: usize,
    nodes: Vec<Node>,
    /// (child, next edge of the same parent).
    edges: Vec<(usize, usize)>,
    stack: Vec<Entry>,
    marks: Vec<usize>,
    memo: HashMap<u64, usize>,
    /// Bytes the reader holds while parsing (values made and copies), checked as it grows.
    parsed: u64,
    bound: u64,
    depth: usize,
}

/// What makes the scan stop: a refusal, or a pickle the reader itself refuses at this point.
enum Stop {
    Refused(Refused),
    ReaderFails,
}

type Step<T> = std::result::Result<T, Stop>;

const NONE: usize = usize::MAX;

/// Checks `pickle` against `limits`: `Ok` when `serde-pickle` may read it (or fails on it by
/// itself before holding more than the bound), else why not.
///
/// # Errors
/// [`Refused`] when it expands past [`PickleLimits::bound`], nests deeper than
/// `max_depth`, declares a length past its end, or refers to itself.
pub fn check(pickle: &[u8], limits: &PickleLimits) -> std::result::Result<(), Refused> {
    let mut s = Scan {
        b: pickle,
        pos: 0,
        nodes: Vec::new(),
        edges: Vec::new(),
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        parsed: 0,
        bound: limits.bound(pickle.len()),
        depth: limits.max_depth,
    };
    match s.run() {
        Ok(root) => s.expanded(root).map_err(|e| match e {
            Stop::Refused(r) => r,
            Stop::ReaderFails => unreachable!("expanded only refuses"),
        }),
        Err(Stop::Refused(r)) => Err(r),
        Err(Stop::ReaderFails) => Ok(()),
    }
}

impl Scan<'_> {
    fn byte(&mut self) -> Step<u8> {
        let b = *self.b.get(self.pos).ok_or(Stop::ReaderFails)?;
        self.pos += 1;
        Ok(b)
    }

    fn fixed<const N: usize>(&mut self) -> Step<[u8; N]> {
        let s = self
            .b
            .get(self.pos..self.pos + N)
            .ok_or(Stop::ReaderFails)?;
        self.pos += N;
        Ok(s.try_into().expect("N bytes"))
    }

    /// Skips a text line; its length.
    fn line(&mut self) -> Step<u64> {
        let rest = &self.b[self.pos..];
        let n = rest
            .iter()
            .position(|&c| c == b'\n')
            .ok_or(Stop::ReaderFails)?;
        self.pos += n + 1;
        Ok(n as u64)
    }

    /// A memo id written as a text line (`PUT`, `GET`).
    fn text_id(&mut self) -> Step<u64> {
        let start = self.pos;
        self.line()?;
        std::str::from_utf8(&self.b[start..self.pos - 1])
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or(Stop::ReaderFails)
    }

    /// Skips a payload of `len` declared bytes (checked against what remains); `len`.
    fn payload(&mut self, at: usize, len: u64) -> Step<u64> {
        let left = self.b.len() - self.pos;
        if len > left as u64 {
            return Err(Stop::Refused(Refused::Length { at, len, left }));
        }
        self.pos += len as usize;
        Ok(len)
    }

    fn charge(&mut self, bytes: u64) -> Step<()> {
        self.parsed = self.parsed.saturating_add(bytes);
        if self.parsed > self.bound {
            return Err(Stop::Refused(Refused::Expands { bound: self.bound }));
        }
        Ok(())
    }

    /// A new value of `own` bytes with `children`, pushed.
    fn push_new(&mut self, own: u64, children: &[Entry]) -> Step<()> {
        self.charge(own)?;
        let node = self.nodes.len();
        let depth = 1 + children.iter().map(|c| self.held(*c)).max().unwrap_or(0);
        self.deep_enough(depth)?;
        self.nodes.push(Node {
            own,
            depth,
            head: NONE,
        });
        for c in children {
            self.edge(node, c.node);
        }
        self.stack.push(Entry {
            node,
            memo_ref: false,
        });
        Ok(())
    }

    /// How deep `e` nests where the reader holds it (1 for a memo reference).
    fn held(&self, e: Entry) -> usize {
        if e.memo_ref {
            1
        } else {
            self.nodes[e.node].depth
        }
    }

    fn deep_enough(&self, depth: usize) -> Step<()> {
        if depth > self.depth {
            return Err(Stop::Refused(Refused::Deep { bound: self.depth }));
        }
        Ok(())
    }

    fn edge(&mut self, parent: usize, child: usize) {
        let next = self.nodes[parent].head;
        self.nodes[parent].head = self.edges.len();
        self.edges.push((child, next));
    }

    /// The lowest stack index the reader can pop (it keeps a separate stack per mark).
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self) -> Step<Entry> {
        if self.stack.len() <= self.floor() {
            return Err(Stop::ReaderFails);
        }
        self.stack.pop().ok_or(Stop::ReaderFails)
    }

    fn pop_mark(&mut self) -> Step<Vec<Entry>> {
        let m = self.marks.pop().ok_or(Stop::ReaderFails)?;
        Ok(self.stack.split_off(m))
    }

    fn top(&self) -> Step<Entry> {
        if self.stack.len() <= self.floor() {
            return Err(Stop::ReaderFails);
        }
        self.stack.last().copied().ok_or(Stop::ReaderFails)
    }

    /// Items added to the container on top of the stack.
    fn extend_top(&mut self, items: &[Entry]) -> Step<()> {
        let top = self.top()?;
        for i in items {
            let d = 1 + self.held(*i);
            self.deep_enough(d)?;
            let n = &mut self.nodes[top.node];
            n.depth = n.depth.max(d);
            self.edge(top.node, i.node);
        }
        Ok(())
    }

    /// The reader copies the value of `e` here (unless it is a memo reference, a small copy).
    fn copied(&mut self, e: Entry, always: bool) -> Step<()> {
        if e.memo_ref || always {
            let room = self.bound.saturating_sub(self.parsed);
            let size = self.expanded_within(e.node, room)?;
            self.charge(size)?;
        }
        Ok(())
    }

    fn memoize(&mut self, id: u64) -> Step<()> {
        let top = self.pop()?;
        // A memo reference memoised again is copied into the new entry.
        self.copied(top, false)?;
        self.memo.insert(id, top.node);
        self.stack.push(Entry {
            node: top.node,
            memo_ref: true,
        });
        Ok(())
    }

    fn get(&mut self, id: u64) -> Step<()> {
        let node = *self.memo.get(&id).ok_or(Stop::ReaderFails)?;
        self.charge(VALUE)?;
        self.stack.push(Entry {
            node,
            memo_ref: true,
        });
        Ok(())
    }

    /// Parses up to STOP; the result's node.
    fn run(&mut self) -> Step<usize> {
        loop {
            let at = self.pos;
            let op = self.byte()?;
            match op {
                0x80 => {
                    self.byte()?;
                } // PROTO
                0x95 => {
                    self.fixed::<8>()?;
                } // FRAME
                b'.' => {
                    let top = self.pop()?;
                    return Ok(top.node);
                } // STOP
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    if self.marks.last() == Some(&self.stack.len()) {
                        self.pop_mark()?;
                    } else {
                        self.pop()?;
                    }
                }
                b'1' => {
                    self.pop_mark()?;
                }
                b'2' => {
                    // DUP: the reader clones the top value.
                    let top = self.top()?;
                    if !top.memo_ref {
                        self.copied(top, true)?;
                    }
                    self.stack.push(top);
                }
                b'p' => {
                    let id = self.text_id()?;
                    self.memoize(id)?;
                }
                b'q' => {
                    let id = self.byte()?;
                    self.memoize(id.into())?;
                }
                b'r' => {
                    let id = u32::from_le_bytes(self.fixed()?);
                    self.memoize(id.into())?;
                }
                0x94 => {
                    let id = self.memo.len() as u64;
                    self.memoize(id)?;
                }
                b'g' => {
                    let id = self.text_id()?;
                    self.get(id)?;
                }
                b'h' => {
                    let id = self.byte()?;
                    self.get(id.into())?;
                }
                b'j' => {
                    let id = u32::from_le_bytes(self.fixed()?);
                    self.get(id.into())?;
                }
                b'N' | 0x88 | 0x89 | b'G' | b'J' | b'K' | b'M' => {
                    match op {
                        b'G' => drop(self.fixed::<8>()?),
                        b'J' => drop(self.fixed::<4>()?),
                        b'K' => drop(self.fixed::<1>()?),
                        b'M' => drop(self.fixed::<2>()?),
                        _ => {}
                    }
                    self.push_new(VALUE, &[])?;
                }
                b'I' | b'L' | b'F' | b'S' | b'V' => {
                    let n = self.line()?;
                    self.push_new(VALUE + n, &[])?;
                }
                0x8a | b'C' | b'U' | 0x8c => {
                    let len = self.byte()?;
                    let n = self.payload(at, len.into())?;
                    self.push_new(VALUE + n, &[])?;
                }
                0x8b | b'T' => {
                    // LONG4, BINSTRING: signed 32-bit lengths.
                    let len = i32::from_le_bytes(self.fixed()?);
                    if len < 0 {
                        return Err(Stop::ReaderFails);
                    }
                    let n = self.payload(at, len as u64)?;
                    self.push_new(VALUE + n, &[])?;
                }
                b'B' | b'X' => {
                    let len = u32::from_le_bytes(self.fixed()?);
                    let n = self.payload(at, len.into())?;
                    self.push_new(VALUE + n, &[])?;
                }
                0x8d | 0x8e | 0x96 => {
                    let len = u64::from_le_bytes(self.fixed()?);
                    let n = self.payload(at, len)?;
                    self.push_new(VALUE + n, &[])?;
                }
                b')' | b']' | b'}' | 0x8f => self.push_new(VALUE, &[])?,
                0x85..=0x87 => {
                    let k = (op - 0x84) as usize;
                    let mut items = Vec::with_capacity(k);
                    for _ in 0..k {
                        items.push(self.pop()?);
                    }
                    self.push_new(VALUE, &items)?;
                }
                b't' | b'l' | b'd' | 0x91 => {
                    let items = self.pop_mark()?;
                    self.push_new(VALUE, &items)?;
                }
                b'a' => {
                    let v = self.pop()?;
                    self.extend_top(&[v])?;
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    self.extend_top(&[k, v])?;
                }
                b'e' | b'u' | 0x90 => {
                    let items = self.pop_mark()?;
                    self.extend_top(&items)?;
                }
                b'c' => {
                    let a = self.line()?;
                    let b = self.line()?;
                    self.push_new(VALUE + a + b, &[])?;
                }
                0x93 => {
                    // STACK_GLOBAL: the names are resolved (copied).
                    let n = self.pop()?;
                    self.copied(n, false)?;
                    let m = self.pop()?;
                    self.copied(m, false)?;
                    self.push_new(VALUE, &[])?;
                }
                b'R' => {
                    // REDUCE: arguments and callable resolved (copied); the result may hold
                    // the arguments.
                    let args = self.pop()?;
                    self.copied(args, false)?;
                    let f = self.pop()?;
                    self.copied(f, false)?;
                    self.push_new(VALUE, &[args])?;
                }
                b'i' => {
                    self.line()?;
                    self.line()?;
                    let args = self.pop_mark()?;
                    self.push_new(VALUE, &args)?;
                }
                b'o' => {
                    let args = self.pop_mark()?;
                    self.pop()?;
                    self.push_new(VALUE, &args)?;
                }
                0x81 => {
                    let args = self.pop()?;
                    self.pop()?;
                    self.push_new(VALUE, &[args])?;
                }
                0x92 => {
                    let kw = self.pop()?;
                    let args = self.pop()?;
                    self.pop()?;
                    self.push_new(VALUE, &[args, kw])?;
                }
                b'b' => {
                    let state = self.pop()?;
                    self.pop()?;
                    self.stack.push(state);
                }
                // Opcodes the reader does not support (persistent ids, extensions, buffers):
                // it fails here.
                _ => return Err(Stop::ReaderFails),
            }
        }
    }

    /// The expanded size of `root` (checked against the bound), and its depth (checked).
    fn expanded(&self, root: usize) -> Step<()> {
        self.walk(root, self.bound, true).map(drop)
    }

    /// The expanded size of `node`, refused when past `room`.
    fn expanded_within(&self, node: usize, room: u64) -> Step<u64> {
        self.walk(node, room, false)
    }

    /// Iterative post-order walk of the graph under `root`: the sum over every path of the
    /// nodes' own sizes (each distinct node's size computed once), refused past `room`;
    /// with `depth`, the nesting depth is checked and cycles are refused.
    fn walk(&self, root: usize, room: u64, depth: bool) -> Step<u64> {
        // Per visited node: (size, depth); absent: not visited; `None`: on the current path.
        let mut done: HashMap<usize, Option<(u64, usize)>> = HashMap::new();
        // (node, next edge to visit, size so far, deepest child so far)
        let mut path: Vec<(usize, usize, u64, usize)> =
            vec![(root, self.nodes[root].head, self.nodes[root].own, 0)];
        done.insert(root, None);
        let too_big = Stop::Refused(Refused::Expands { bound: self.bound });
        while let Some(top) = path.last_mut() {
            if top.1 == NONE {
                let (node, _, size, d) = *top;
                path.pop();
                done.insert(node, Some((size, d + 1)));
                if depth && d + 1 > self.depth {
                    return Err(Stop::Refused(Refused::Deep { bound: self.depth }));
                }
                if size > room {
                    return Err(too_big);
                }
                if let Some(parent) = path.last_mut() {
                    parent.2 = parent.2.saturating_add(size);
                    parent.3 = parent.3.max(d + 1);
                    if parent.2 > room {
                        return Err(too_big);
                    }
                }
                continue;
            }
            let (child, next) = self.edges[top.1];
            top.1 = next;
            match done.get(&child) {
                Some(Some((size, d))) => {
                    top.2 = top.2.saturating_add(*size);
                    top.3 = top.3.max(*d);
                    if top.2 > room {
                        return Err(too_big);
                    }
                }
                Some(None) => {
                    if depth {
                        return Err(Stop::Refused(Refused::Recursive));
                    }
                    // While parsing, a container may hold itself (the reader keeps a memo
                    // reference there): counted once.
                }
                None => {
                    if depth && path.len() >= self.depth {
                        return Err(Stop::Refused(Refused::Deep { bound: self.depth }));
                    }
                    done.insert(child, None);
                    path.push((child, self.nodes[child].head, self.nodes[child].own, 0));
                }
            }
        }
        Ok(done.get(&root).copied().flatten().map_or(0, |(s, _)| s))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::{check, PickleLimits, Refused};

    /// "Billion laughs": `levels` lists, each of `fan` memo references to the one before
    /// (expands to `fan^levels` values from a pickle of about `levels * 2 * fan` bytes).
    pub(crate) fn memo_bomb(levels: u8, fan: usize) -> Vec<u8> {
        let mut p = vec![0x80, 2, b']', b'q', 0];
        for i in 1..=levels {
            p.extend([b']', b'q', i, b'(']);
            for _ in 0..fan {
                p.extend([b'h', i - 1]);
            }
            p.push(b'e');
        }
        p.push(b'.');
        p
    }

    /// One list of `n` Nones (memo 0) referenced `refs` times by the result list.
    pub(crate) fn wide_memo_bomb(n: usize, refs: usize) -> Vec<u8> {
        let mut p = vec![0x80, 2, b'('];
        p.extend(std::iter::repeat_n(b'N', n));
        p.extend([b'l', b'q', 0, b'0', b']', b'(']);
        for _ in 0..refs {
            p.extend([b'h', 0]);
        }
        p.extend([b'e', b'.']);
        p
    }

    /// Lists nested `n` deep.
    pub(crate) fn deep(n: usize) -> Vec<u8> {
        let mut p = vec![0x80, 2];
        p.extend(std::iter::repeat_n(b'(', n - 1));
        p.push(b']');
        p.extend(std::iter::repeat_n(b'l', n - 1));
        p.push(b'.');
        p
    }

    /// A `BINUNICODE` declaring 4 GiB − 1 bytes, followed by a few.
    pub(crate) fn huge_length() -> Vec<u8> {
        let mut p = vec![0x80, 3, b'X', 0xff, 0xff, 0xff, 0xff];
        p.extend(b"abc.");
        p
    }

    /// A list of `n` Nones, memoised as 0, then `copies` times `GET 0; PUT 1; POP`.
    fn put_bomb(n: usize, copies: usize) -> Vec<u8> {
        let mut p = vec![0x80, 2, b'('];
        p.extend(std::iter::repeat_n(b'N', n));
        p.extend([b'l', b'q', 0]);
        for _ in 0..copies {
            p.extend([b'h', 0, b'q', 1, b'0']);
        }
        p.push(b'.');
        p
    }

    type Plain = (Vec<i64>, String, Vec<(u8, Vec<String>)>, Option<f64>);

    fn refused(p: &[u8]) -> Refused {
        check(p, &PickleLimits::default()).expect_err("refused")
    }

    #[test]
    fn plain_objects_pass_and_read() {
        let obj: Plain = (
            (0..100_000).collect(),
            "x".repeat(1 << 20),
            (0..1000)
                .map(|i| (i as u8, vec![format!("{i}"); 3]))
                .collect(),
            Some(1.5),
        );
        let p = crate::objects::encode(&obj).unwrap();
        check(&p, &PickleLimits::default()).unwrap();
        let back: Plain = crate::objects::decode(&p).unwrap();
        assert_eq!(back, obj);
        // A big list of small ints (2 pickle bytes per value) stays under 32 bytes per byte.
        let ints: Vec<u8> = vec![7; 3 << 20];
        let p = crate::objects::encode(&ints.iter().map(|&i| i as i64).collect::<Vec<_>>());
        check(&p.unwrap(), &PickleLimits::default()).unwrap();
    }

    #[test]
    fn a_memo_bomb_is_refused_fast_without_expanding() {
        // 10^9 values (32 GB as serde-pickle values) from 200 bytes.
        let p = memo_bomb(9, 10);
        assert!(p.len() < 300);
        let t = std::time::Instant::now();
        assert_eq!(refused(&p), Refused::Expands { bound: 64 << 20 });
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        let msg = refused(&p).to_string();
        assert!(
            msg.contains("pickle expands past the 64 MiB bound"),
            "{msg}"
        );
        // A small fan-out is plain shared data, read as usual.
        let small = memo_bomb(1, 10);
        check(&memo_bomb(3, 10), &PickleLimits::default()).unwrap();
        let v: serde_pickle::Value = crate::objects::decode(&small).unwrap();
        assert!(matches!(v, serde_pickle::Value::List(l) if l.len() == 10));
        // One list of 20 000 Nones referenced 300 000 times (600 kB of pickle): serde-pickle
        // copies it at each reference, 190 GB.
        let t = std::time::Instant::now();
        assert!(matches!(
            refused(&wide_memo_bomb(20_000, 300_000)),
            Refused::Expands { .. }
        ));
        assert!(t.elapsed() < std::time::Duration::from_secs(2));
        check(&wide_memo_bomb(1000, 10), &PickleLimits::default()).unwrap();
        let v: Vec<Vec<()>> = crate::objects::decode(&wide_memo_bomb(1000, 10)).unwrap();
        assert_eq!(v.len(), 10);
    }

    #[test]
    fn copies_made_while_parsing_count() {
        // 10 000 Nones (320 kB) copied 100 000 times by PUT of a GET: 32 GB.
        assert!(matches!(
            refused(&put_bomb(10_000, 100_000)),
            Refused::Expands { .. }
        ));
        check(&put_bomb(10_000, 3), &PickleLimits::default()).unwrap();
        let mut dup = vec![0x80, 2, b'('];
        dup.extend(std::iter::repeat_n(b'N', 10_000));
        dup.push(b'l');
        dup.extend(std::iter::repeat_n(b'2', 100_000));
        dup.push(b'.');
        assert!(matches!(refused(&dup), Refused::Expands { .. }));
    }

    #[test]
    fn deep_nesting_is_refused_and_python_depths_read() {
        assert_eq!(refused(&deep(100_000)), Refused::Deep { bound: 500 });
        // Refused while parsing, even when the pickle then goes wrong: the reader's error
        // path drops what it holds, recursively.
        let mut bad = deep(100_000);
        bad.pop();
        bad.extend(b"a.");
        assert_eq!(refused(&bad), Refused::Deep { bound: 500 });
        assert!(refused(&deep(501)).to_string().contains("500 levels"));
        let ok = deep(500);
        check(&ok, &PickleLimits::default()).unwrap();
        // serde-pickle reads (and drops) 500 levels on a test thread's 2 MiB stack.
        let v: serde_pickle::Value = crate::objects::decode(&ok).unwrap();
        drop(v);
    }

    #[test]
    fn huge_declared_lengths_are_refused() {
        let r = refused(&huge_length());
        assert_eq!(
            r,
            Refused::Length {
                at: 2,
                len: u32::MAX as u64,
                left: 4
            }
        );
        let mut b8 = vec![0x80, 4, 0x8e];
        b8.extend((1u64 << 60).to_le_bytes());
        b8.push(b'.');
        assert!(matches!(refused(&b8), Refused::Length { len, .. } if len == 1 << 60));
        let mut l4 = vec![0x80, 2, 0x8b];
        l4.extend(i32::MAX.to_le_bytes());
        l4.push(b'.');
        assert!(matches!(refused(&l4), Refused::Length { .. }));
    }

    #[test]
    fn self_reference_and_reader_errors() {
        // L = []; L.append(L)
        let p = [0x80, 2, b']', b'q', 0, b'h', 0, b'a', b'.'];
        assert_eq!(refused(&p), Refused::Recursive);
        // Malformed or unsupported: left to the reader, which fails at the same opcode.
        for p in [&b"\x80\x02h\x05."[..], b"\x80\x02a.", b"\x80\x02P1\n.", b""] {
            check(p, &PickleLimits::default()).unwrap();
            assert!(crate::objects::decode::<serde_pickle::Value>(p).is_err());
        }
    }

    #[test]
    fn limits_are_configurable() {
        let l = PickleLimits {
            min_bytes: 1 << 10,
            per_pickle_byte: 1,
            max_depth: 5,
        };
        assert!(matches!(
            check(&deep(6), &l),
            Err(Refused::Deep { bound: 5 })
        ));
        assert!(matches!(
            check(&memo_bomb(3, 10), &l),
            Err(Refused::Expands { bound: 1024 })
        ));
        assert_eq!(PickleLimits::default().bound(10), 64 << 20);
        assert_eq!(PickleLimits::default().bound(4 << 20), 128 << 20);
    }
}
