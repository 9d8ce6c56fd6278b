//! `verify_params_across_processes`: every rank must hold the same parameters (count, shapes,
//! dtypes) before data-parallel training starts (`dist._verify_params_across_processes`).

use super::bucket_memory::beside;
use c10d_core::{AllgatherOptions, Collectives, DType, DistError, ProcessGroup, Result, Tensor};
use std::time::Duration;

/// Checks that every rank of `pg` has the same parameters: their number, and each one's shape
/// and dtype. Every rank gathers every rank's description (two all_gathers, on the first
/// parameter's device, as PyTorch does), so all ranks either pass or fail together.
///
/// `names` (empty, or one per parameter) are used in the message; `timeout` bounds each
/// all_gather (`None` = the group's default backend timeout).
///
/// # Errors
/// [`DistError::InvalidArgument`] naming the first rank whose parameters differ, e.g.
/// `DDP expects same model across all ranks, but Rank 0 has 3 params, while rank 1 has
/// inconsistent 2 params.` or `[0]: params[1] (layer1.bias) in this process with sizes [8] and
/// dtype torch.float32 appears not to match sizes [9] and dtype torch.float32 of the same param
/// in process 1.`; a failed or timed-out collective.
pub fn verify_params_across_processes(
    pg: &ProcessGroup,
    params: &[Tensor],
    names: &[String],
    timeout: Option<Duration>,
) -> Result<()> {
    let timeout = match timeout {
        Some(t) => t,
        None => pg.default_backend()?.timeout(),
    };
    let mine = describe(params);
    let like = params
        .first()
        .cloned()
        .unwrap_or_else(|| Tensor::zeros(DType::I64, &[0]));
    let lens = all_gather(pg, &like, vec![mine.len() as i64], timeout)?;
    let width = lens.iter().copied().max().unwrap_or(0) as usize;
    let mut padded = mine.clone();
    padded.resize(width, -1);
    let all = all_gather(pg, &like, padded, timeout)?;
    let me = pg.rank();
    for (r, theirs) in all
        .chunks(width.max(1))
        .enumerate()
        .filter(|(r, _)| *r != me)
    {
        compare(me, r, &mine, theirs, names)?;
    }
    Ok(())
}

/// `[count, then per parameter: dtype code, ndim, dims...]`.
fn describe(params: &[Tensor]) -> Vec<i64> {
    let mut v = vec![params.len() as i64];
    for p in params {
        v.push(p.dtype().code() as i64);
        v.push(p.dim() as i64);
        v.extend(p.shape().iter().map(|&d| d as i64));
    }
    v
}

/// The parameters of a description as (dtype name, shape).
fn decode(v: &[i64]) -> Vec<(String, Vec<i64>)> {
    let n = v.first().copied().unwrap_or(0).max(0) as usize;
    let mut out = Vec::with_capacity(n);
    let mut at = 1;
    for _ in 0..n {
        let (Some(&code), Some(&nd)) = (v.get(at), v.get(at + 1)) else {
            break;
        };
        let dims = v
            .get(at + 2..at + 2 + nd.max(0) as usize)
            .unwrap_or(&[])
            .to_vec();
        let dtype = u8::try_from(code)
            .ok()
            .and_then(c10d_core::DType::from_code)
            .map_or_else(|| format!("dtype code {code}"), |d| d.to_string());
        out.push((dtype, dims));
        at += 2 + nd.max(0) as usize;
    }
    out
}

fn compare(me: usize, r: usize, mine: &[i64], theirs: &[i64], names: &[String]) -> Result<()> {
    let (a, b) = (decode(mine), decode(theirs));
    if a.len() != b.len() {
        return Err(DistError::invalid(format!(
            "DDP expects same model across all ranks, but Rank {me} has {} params, while rank {r} \
             has inconsistent {} params.",
            a.len(),
            b.len()
        )));
    }
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        if x != y {
            let name = names.get(i).map_or(String::new(), |n| format!(" ({n})"));
            return Err(DistError::invalid(format!(
                "[{me}]: params[{i}]{name} in this process with sizes {:?} and dtype {} appears \
                 not to match sizes {:?} and dtype {} of the same param in process {r}.",
                x.1, x.0, y.1, y.0
            )));
        }
    }
    Ok(())
}

/// All ranks' `data` (equal lengths), concatenated in rank order; gathered on `like`'s device.
fn all_gather(
    pg: &ProcessGroup,
    like: &Tensor,
    data: Vec<i64>,
    timeout: Duration,
) -> Result<Vec<i64>> {
    let n = data.len();
    let input = beside(like, &Tensor::from_vec(data))?;
    let output = like.new_zeros(DType::I64, &[n * pg.size()])?;
    let opts = AllgatherOptions {
        timeout: Some(timeout),
        ..Default::default()
    };
    pg.all_gather_into_tensor(&output, &input, &opts)?
        .wait_timeout(timeout)?;
    output.to_vec()
}
