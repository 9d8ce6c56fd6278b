//! Setting a segment up through the group's store, at the op that first needs it (see
//! `algo::shm::probe`, which every rank runs at the same op): rank 0 checks that `/dev/shm` has
//! room, creates the segment under a random name and publishes the name (or why there is none);
//! every rank maps it and votes; the name is unlinked once the votes are in, so no segment
//! outlives the group even if a rank crashes.

use super::fit::{self, Room};
use super::segment::*;
use c10d_core::{DistError, Result};
use c10d_store::Store;
use std::ffi::CString;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Store keys of set-up number `gen` (under the group's store).
fn key_name(gen: u32) -> String {
    format!("c10d_shm/{gen}/name")
}
fn key_vote(gen: u32, rank: usize) -> String {
    format!("c10d_shm/{gen}/vote/{rank}")
}

/// One set-up as every rank of the group asks for it.
pub(crate) struct Ask<'a> {
    pub store: &'a dyn Store,
    /// Set-ups of this group before this one (equal on every rank; names the store keys).
    pub gen: u32,
    pub rank: usize,
    pub n: usize,
    /// Bytes per slot.
    pub slot: usize,
    /// This rank lets the group use shared memory (else it votes no).
    pub allowed: bool,
    /// The op's deadline.
    pub deadline: Instant,
    /// "ProcessGroupGloo (group G, rank R)", for texts.
    pub ctx: &'a str,
}

/// What a set-up gave; every rank of the group gets the same.
pub(crate) enum Outcome {
    /// Every rank mapped the new segment.
    Mapped(Segment),
    /// `/dev/shm` had no room for it (rank 0 warned).
    NoRoom,
    /// A rank does not allow shared memory or could not create or map the segment.
    Refused,
    /// A rank timed out waiting for the parts of these ranks and vetoed them: nothing
    /// changes, a later op may set up again.
    Abandoned(Vec<usize>),
    /// Rank `.0` asked for slots of `.1` bytes, not this rank's: the ranks run ops of
    /// different sizes.
    Mismatch(usize, usize),
}

/// Rank 0's word in the store: a name, no room, or refused.
const NAME: u8 = b'N';
const NO_ROOM: u8 = b'R';
const REFUSED: u8 = b'X';
/// Written in place of a part a rank timed out waiting for (name or vote).
const VETO: u8 = b'A';

/// Writes `value` under `key` unless something is there already; returns what is there now.
/// Every key of a set-up is written once, by its owner or by a rank that vetoes it, so every
/// rank reads the same values.
fn write_once(ask: &Ask<'_>, key: &str, value: &[u8]) -> Result<Vec<u8>> {
    ask.store.compare_set(key, b"", value)
}

/// Runs set-up `ask.gen` (see the module docs); `alive` is called between looks at the store
/// (its error, e.g. a peer lost or the group stopped, ends the set-up).
///
/// # Errors
/// A store failure or `alive`'s error ([`SetupError::Failed`]), or the op's deadline passed
/// waiting for peers ([`SetupError::TimedOut`], naming them: their parts were vetoed, so every
/// rank gets [`Outcome::Abandoned`] or this error); the name is unlinked anyway.
pub(crate) fn setup_slot(
    ask: &Ask<'_>,
    alive: &mut dyn FnMut() -> Result<()>,
) -> std::result::Result<Outcome, SetupError> {
    let word = match ask.rank {
        0 => {
            let (word, seg) = create(ask);
            let unlink = seg.as_ref().map(|(_, name)| Unlink(name.clone()));
            if write_once(ask, &key_name(ask.gen), &word)? != word {
                return Ok(Outcome::Abandoned(vec![0]));
            }
            let seg = seg.map(|(s, _)| s);
            let outcome = conclude(ask, &word, seg, alive);
            drop(unlink);
            return outcome;
        }
        _ => {
            let key = key_name(ask.gen);
            match wait_keys(ask, std::slice::from_ref(&key), &[0], alive) {
                Err(SetupError::TimedOut(m)) if write_once(ask, &key, &[VETO])? == [VETO] => {
                    return Err(SetupError::TimedOut(m));
                }
                Err(SetupError::Failed(e)) => return Err(SetupError::Failed(e)),
                _ => {}
            }
            ask.store.get(&key)?
        }
    };
    let seg = match word.split_first() {
        Some((&NAME, named)) if ask.allowed => open(ask, named),
        _ => None,
    };
    conclude(ask, &word, seg, alive)
}

/// Why a set-up ended without an outcome.
pub(crate) enum SetupError {
    /// The store failed, or `alive` said so.
    Failed(DistError),
    /// The op's deadline passed; these ranks had not written their part.
    TimedOut(Vec<usize>),
}

impl From<DistError> for SetupError {
    fn from(e: DistError) -> Self {
        SetupError::Failed(e)
    }
}

/// Waits until the store holds every key of `keys` (`keys[i]` written by rank `writers[i]`),
/// looking with `check` (a timed-out wait may leave a store connection unusable) and calling
/// `alive` between looks, until the op's deadline.
fn wait_keys(
    ask: &Ask<'_>,
    keys: &[String],
    writers: &[usize],
    alive: &mut dyn FnMut() -> Result<()>,
) -> std::result::Result<(), SetupError> {
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut pause = Duration::from_micros(20);
    while !ask.store.check(&refs)? {
        if Instant::now() >= ask.deadline {
            let mut missing = Vec::new();
            for (k, w) in refs.iter().copied().zip(writers) {
                if !ask.store.check(&[k])? {
                    missing.push(*w);
                }
            }
            return Err(SetupError::TimedOut(missing));
        }
        alive()?;
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(2));
    }
    Ok(())
}

/// After rank 0's word: the votes when it named a segment, else its verdict as is.
fn conclude(
    ask: &Ask<'_>,
    word: &[u8],
    seg: Option<Segment>,
    alive: &mut dyn FnMut() -> Result<()>,
) -> std::result::Result<Outcome, SetupError> {
    match word.first() {
        Some(&NAME) => {}
        Some(&NO_ROOM) => return Ok(Outcome::NoRoom),
        Some(&VETO) => return Ok(Outcome::Abandoned(vec![0])),
        _ => return Ok(Outcome::Refused),
    }
    let mut vote = vec![u8::from(seg.is_some())];
    vote.extend_from_slice(&(ask.slot as u64).to_le_bytes());
    write_once(ask, &key_vote(ask.gen, ask.rank), &vote)?;
    let keys: Vec<String> = (0..ask.n).map(|p| key_vote(ask.gen, p)).collect();
    let writers: Vec<usize> = (0..ask.n).collect();
    let mut vetoed = Vec::new();
    match wait_keys(ask, &keys, &writers, alive) {
        Err(SetupError::TimedOut(missing)) => {
            for p in missing {
                if write_once(ask, &keys[p], &[VETO])? == [VETO] {
                    vetoed.push(p);
                }
            }
        }
        Err(e) => return Err(e),
        Ok(()) => {}
    }
    if !vetoed.is_empty() {
        return Err(SetupError::TimedOut(vetoed));
    }
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let all = ask.store.multi_get(&refs)?;
    let vetoed: Vec<usize> = (0..ask.n).filter(|&p| all[p] == [VETO]).collect();
    if !vetoed.is_empty() {
        return Ok(Outcome::Abandoned(vetoed));
    }
    let slot_of = |v: &[u8]| {
        v.get(1..9)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8")) as usize)
    };
    if let Some(p) = (0..ask.n).find(|&p| slot_of(&all[p]) != Some(ask.slot)) {
        return Ok(Outcome::Mismatch(p, slot_of(&all[p]).unwrap_or(0)));
    }
    match seg {
        Some(seg) if all.iter().all(|v| v.first() == Some(&1)) => {
            seg.line(ask.rank)
                .pid
                .store(std::process::id() as i32, Ordering::Release);
            Ok(Outcome::Mapped(seg))
        }
        _ => Ok(Outcome::Refused),
    }
}

/// Unlinks a segment name when dropped (after the votes, or on a failed set-up).
struct Unlink(CString);

impl Drop for Unlink {
    fn drop(&mut self) {
        unlink(&self.0);
    }
}

/// Rank 0's word (see [`NAME`]) and, when it made one, its segment and the segment's name.
fn create(ask: &Ask<'_>) -> (Vec<u8>, Option<(Segment, CString)>) {
    if !ask.allowed {
        return (vec![REFUSED], None);
    }
    let room = match dev_shm_room() {
        Ok(r) => r,
        Err(e) => {
            log::info!("{}: no /dev/shm ({e}); using sockets", ask.ctx);
            return (vec![REFUSED], None);
        }
    };
    if !fit::fits(seg_len(ask.n, ask.slot), room) {
        return no_room(ask, room);
    }
    let name = CString::new(format!(
        "/c10d-shm-{}-{:016x}",
        std::process::id(),
        rand_u64()
    ))
    .expect("no NUL");
    match Segment::map(&name, ask.n, ask.slot, true) {
        Ok(s) => {
            let mut word = vec![NAME];
            word.extend_from_slice(&(ask.slot as u64).to_le_bytes());
            word.extend_from_slice(name.as_bytes());
            (word, Some((s, name)))
        }
        // Another group took the room between the check and the reservation.
        Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
            no_room(ask, dev_shm_room().unwrap_or(room))
        }
        Err(e) => {
            log::info!(
                "{}: no shared memory for the group ({e}); using sockets",
                ask.ctx
            );
            (vec![REFUSED], None)
        }
    }
}

/// Rank 0's word when `/dev/shm` has no room, after the group's one warning.
fn no_room(ask: &Ask<'_>, room: Room) -> (Vec<u8>, Option<(Segment, CString)>) {
    log::warn!("{}", fit::no_room_text(ask.ctx, ask.n, ask.slot, room));
    (vec![NO_ROOM], None)
}

/// A peer's mapping of the segment rank 0 named (after the slot size rank 0 made it with: its
/// 8 bytes, then the name). `None`: it cannot map it.
fn open(ask: &Ask<'_>, named: &[u8]) -> Option<Segment> {
    let slot = u64::from_le_bytes(named.get(..8)?.try_into().ok()?) as usize;
    let c = CString::new(named.get(8..)?).ok()?;
    // Rank 0's size, not ours: a rank of an op of another size maps what exists (and the
    // votes tell the ranks apart), never past the object's end.
    Segment::map(&c, ask.n, slot, false)
        .map_err(|e| {
            log::info!(
                "{}: cannot map the group's shared memory ({e}); using sockets",
                ask.ctx
            )
        })
        .ok()
}
