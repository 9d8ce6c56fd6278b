//! What each rank gets back from a collective, given every rank's contribution: the
//! collectives' definitions (NCCL's "Collective Operations" page), on bytes.

use crate::nccl::codes::INVALID_USAGE;
use crate::nccl::wire::OpHeader;
use crate::reduce::{self, RedOp};

/// One rank's contribution.
pub struct Part {
    /// What it called.
    pub header: OpHeader,
    /// Its data.
    pub data: Vec<u8>,
}

fn red_op(red: i32) -> Result<RedOp, String> {
    Ok(match red {
        0 => RedOp::Sum,
        1 => RedOp::Prod,
        2 => RedOp::Max,
        3 => RedOp::Min,
        4 => RedOp::Avg,
        other => return Err(format!("unknown reduction {other}")),
    })
}

fn reduced(parts: &[Part]) -> Result<Vec<u8>, String> {
    let h = parts[0].header;
    let inputs: Vec<&[u8]> = parts.iter().map(|p| p.data.as_slice()).collect();
    let mut out = vec![0u8; inputs[0].len()];
    reduce::reduce(h.dtype, &red_op(h.red)?, &inputs, &mut out)?;
    Ok(out)
}

/// Checks that every rank called the same collective with the same type, count, reduction and
/// root: an error naming the first rank that differs from rank 0 (NCCL would hang or corrupt).
pub fn check_matching(parts: &[Part]) -> Result<(), (i32, String)> {
    let first = parts[0].header;
    for (r, p) in parts.iter().enumerate().skip(1) {
        if p.header != first {
            return Err((
                INVALID_USAGE,
                format!(
                    "c10d-gpusim: mismatched collective: rank 0 called {:?}, rank {r} called {:?}",
                    first, p.header
                ),
            ));
        }
    }
    Ok(())
}

/// Each rank's result bytes, in rank order.
pub fn results(parts: &[Part]) -> Result<Vec<Vec<u8>>, String> {
    let h = parts[0].header;
    let n = parts.len();
    let size =
        reduce::dtype_size(h.dtype).ok_or_else(|| format!("unknown data type {}", h.dtype))?;
    let chunk = h.count as usize * size;
    let root = usize::try_from(h.root).unwrap_or(usize::MAX);
    Ok(match h.op {
        1 => vec![reduced(parts)?; n],
        2 => vec![parts.get(root).ok_or("bad root")?.data.clone(); n],
        3 => (0..n)
            .map(|r| {
                if r == root {
                    reduced(parts)
                } else {
                    Ok(Vec::new())
                }
            })
            .collect::<Result<_, _>>()?,
        4 => vec![parts.iter().flat_map(|p| p.data.iter().copied()).collect(); n],
        5 => {
            let all = reduced(parts)?;
            (0..n)
                .map(|r| all[r * chunk..(r + 1) * chunk].to_vec())
                .collect()
        }
        other => return Err(format!("unknown collective {other}")),
    })
}
