//! Reading a peer's memory: `process_vm_readv` (the only `unsafe` of cross-memory attach),
//! the (pid, address, length) messages peers publish their buffers with, and the probe value.

use super::{all_to_all, everyone, STEP_ADDR};
use crate::engine::Comm;
use c10d_core::Result;

/// A value at a known address that peers read to probe cross-memory attach.
pub(super) static PROBE: u64 = 0xC10D_C3A0_5EED_0001;

/// Copies `dst.len()` bytes at address `remote` in process `pid` into `dst`.
pub(super) fn read_remote(pid: u64, remote: u64, dst: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0usize;
    while done < dst.len() {
        let local = libc::iovec {
            iov_base: dst[done..].as_mut_ptr().cast(),
            iov_len: dst.len() - done,
        };
        let from = libc::iovec {
            iov_base: (remote as usize + done) as *mut libc::c_void,
            iov_len: dst.len() - done,
        };
        // SAFETY: `local` describes the exclusively borrowed, live `dst[done..]`, the only
        // memory the kernel writes; the remote range is only read, and checked by the kernel.
        let k = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &from, 1, 0) };
        if k < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if k == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "process_vm_readv copied nothing",
            ));
        }
        done += k as usize;
    }
    Ok(())
}

pub(super) fn encode(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

pub(super) fn word(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8 bytes"))
}

/// One peer's published buffers: its pid and (address, length) of each.
pub(crate) struct Published {
    pid: u64,
    regions: Vec<(u64, u64)>,
}

impl Published {
    /// Bytes of the peer's region `i`, if it published that many regions.
    pub fn len(&self, i: usize) -> Option<u64> {
        self.regions.get(i).map(|r| r.1)
    }

    /// Copies `dst.len()` bytes at byte `offset` of the peer's region `i` into `dst`.
    ///
    /// # Errors
    /// The region is shorter than that (`InvalidInput`), or the read failed (see
    /// `process_vm_readv`).
    pub fn read(&self, i: usize, offset: usize, dst: &mut [u8]) -> std::io::Result<()> {
        let (addr, len) = self.regions.get(i).copied().unwrap_or((0, 0));
        if (offset + dst.len()) as u64 > len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "region {i} of {len} bytes has no bytes {offset}..{}",
                    offset + dst.len()
                ),
            ));
        }
        read_remote(self.pid, addr + offset as u64, dst)
    }
}

/// Sends every peer our pid and the (address, length) of each of `regions`; returns every
/// rank's (ours at index `rank`).
pub(super) fn publish(comm: &mut Comm<'_>, regions: &[&[u8]]) -> Result<Vec<Published>> {
    publish_among(comm, &everyone(comm), regions)
}

/// [`publish`] among `ranks` (which holds us): `out[k]` is `ranks[k]`'s.
pub(crate) fn publish_among(
    comm: &mut Comm<'_>,
    ranks: &[usize],
    regions: &[&[u8]],
) -> Result<Vec<Published>> {
    let mut words = vec![u64::from(std::process::id()), regions.len() as u64];
    for b in regions {
        words.push(b.as_ptr() as u64);
        words.push(b.len() as u64);
    }
    let msg = encode(&words);
    let got = all_to_all(comm, ranks, STEP_ADDR, &msg, msg.len())?;
    Ok(got
        .iter()
        .zip(ranks)
        .map(|(m, &p)| {
            let m = if p == comm.rank() { &msg } else { m };
            Published {
                pid: word(m, 0),
                regions: (0..word(m, 1) as usize)
                    .map(|i| (word(m, 2 + 2 * i), word(m, 3 + 2 * i)))
                    .collect(),
            }
        })
        .collect())
}

/// This process's probe message: its pid and the address of [`PROBE`].
pub(super) fn probe_message() -> Vec<u8> {
    encode(&[u64::from(std::process::id()), &PROBE as *const u64 as u64])
}

/// Reads the probe value a peer's [`probe_message`] points at: `Ok(true)` when it is
/// [`PROBE`] (cross-memory attach to that peer works).
///
/// # Errors
/// The read failed (no permission, process gone).
pub(super) fn read_probe(msg: &[u8]) -> std::io::Result<bool> {
    let mut v = [0u8; 8];
    read_remote(word(msg, 0), word(msg, 1), &mut v)?;
    Ok(u64::from_le_bytes(v) == PROBE)
}
