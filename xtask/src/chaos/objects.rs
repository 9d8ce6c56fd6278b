//! The `objects` layer: hostile pickles through the object collectives. A 2-rank job of the
//! `hostile_object` example (`crates/c10d-world/examples/hostile_object.rs`) in which rank 1
//! speaks an object collective's wire pattern (`recv_object_list`, `broadcast_object_list` or
//! `all_gather_object`, drawn) with a hostile pickle as the object: a memo bomb (lists of
//! references to lists, or one list referenced 300 000 times: gigabytes once expanded), lists
//! nested thousands deep, or a declared length (`BINUNICODE`, `BINBYTES8`, `LONG4`) far past
//! the bytes sent. Rank 0 must fail the op naming rank 1 and the bound it exceeded, within
//! [`DETECT`] of rank 1's send, with its peak memory under the bound plus [`SLACK_KB`]; both
//! ranks then leave cleanly and nothing is left behind.

use super::job::{self, Rank};
use super::layer::{Ctx, Layer, TrialOut, Turns};
use super::leaks;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// The layer's one kind; its variants (below) are taken in turn.
const KIND: &str = "hostile pickle";
const MEMO: &str = "memo bomb";
const DEEP: &str = "deep nesting";
const LENGTH: &str = "huge length";

/// From rank 1's send to rank 0's refusal. The scan of the largest pickle drawn (620 kB)
/// takes about 100 ms in a debug build; 5 s leaves room for a loaded 2-core machine.
const DETECT: Duration = Duration::from_secs(5);
/// The library's default bound on a pickle's expansion (`PickleLimits::default().min_bytes`;
/// every pickle drawn is far under 2 MiB, so the bound is this floor).
const BOUND_KB: u64 = 64 << 10;
/// Rank 0's peak memory beyond the bound: a debug build of the example with its gloo group
/// peaks at 10–30 MiB (code, thread stacks, the pickle and the scan); an expanded bomb would
/// need gigabytes.
const SLACK_KB: u64 = 64 << 10;
/// Start-up to exit of the whole job: two debug processes rendezvousing through a store on a
/// loaded machine take a few seconds; the refusal itself is [`DETECT`].
const JOB: Duration = Duration::from_secs(60);

/// The layer, with the example binary once built.
pub struct Objects {
    bin: Option<PathBuf>,
    variants: Turns,
}

impl Objects {
    pub fn new() -> Objects {
        Objects {
            bin: None,
            variants: Turns::default(),
        }
    }

    fn bin(&mut self) -> Result<PathBuf, String> {
        if let Some(b) = &self.bin {
            return Ok(b.clone());
        }
        let st = crate::cargo()
            .args([
                "build",
                "-q",
                "-p",
                "c10d-world",
                "--example",
                "hostile_object",
            ])
            .status()
            .map_err(|e| format!("cargo: {e}"))?;
        if !st.success() {
            return Err("cannot build the hostile_object example".into());
        }
        let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
        let b = std::fs::canonicalize(format!("{target}/debug/examples/hostile_object"))
            .map_err(|e| format!("hostile_object not built: {e}"))?;
        self.bin = Some(b.clone());
        Ok(b)
    }
}

impl Layer for Objects {
    fn kinds(&self) -> Vec<&'static str> {
        vec![KIND]
    }

    fn trial(&mut self, _kind: &'static str, ctx: &mut Ctx<'_>) -> TrialOut {
        let kind = [MEMO, DEEP, LENGTH][self.variants.next(3, ctx.rng)];
        let (variant, n, expect) = match kind {
            MEMO if ctx.rng.range(0, 1) == 0 => (
                "memo",
                ctx.rng.range(8, 40) as usize,
                "pickle expands past the 64 MiB bound",
            ),
            MEMO => (
                "wide",
                ctx.rng.range(1_000, 20_000) as usize,
                "pickle expands past the 64 MiB bound",
            ),
            DEEP => (
                "deep",
                ctx.rng.range(501, 200_000) as usize,
                "pickle nests deeper than the bound of 500 levels",
            ),
            _ => (
                "length",
                ctx.rng.range(0, 2) as usize,
                "pickle declares a length of",
            ),
        };
        let op = *ctx.rng.pick(&["recv", "broadcast", "all_gather"]);
        let mut out = TrialOut {
            desc: format!("hostile_object {variant} n={n} through {op}"),
            ..TrialOut::default()
        };
        let bin = match self.bin() {
            Ok(b) => b,
            Err(e) => {
                out.problems.push(e);
                return out;
            }
        };
        let tmp =
            std::env::temp_dir().join(format!("c10d-chaos-{}-{}", std::process::id(), ctx.trial));
        let _ = std::fs::create_dir_all(&tmp);
        let shm_before = leaks::shm();
        let port = super::ranks::free_port();
        let mut ranks: Vec<Rank> = Vec::new();
        for r in 0..2 {
            let mut cmd = Command::new(&bin);
            cmd.env("RANK", r.to_string())
                .env("WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("HOSTILE", variant)
                .env("HOSTILE_N", n.to_string())
                .env("HOSTILE_OP", op)
                .env("C10D_CHAOS_TRIAL", job::marker(ctx.trial))
                .env("TMPDIR", &tmp)
                .env("TORCH_FR_DUMP_ON_TIMEOUT", "0")
                .env_remove("C10D_OBJECT_MAX_BYTES")
                .env_remove("C10D_OBJECT_MAX_DEPTH")
                .env_remove("RUST_LOG");
            match job::spawn(&mut cmd) {
                Ok(rank) => ranks.push(rank),
                Err(e) => out.problems.push(format!("cannot start rank {r}: {e}")),
            }
        }
        if ranks.len() == 2 && !job::wait(&mut ranks, &[0, 1], Instant::now() + JOB) {
            out.problems
                .push(format!("hang: the job still ran after {} s", JOB.as_secs()));
        }
        job::kill_all(&mut ranks);
        if ranks.len() == 2 {
            judge(&ranks, expect, &mut out);
        }
        for (r, rank) in ranks.iter().enumerate() {
            out.log += &format!("=== rank {r} (exit {:?})\n{}\n", rank.exit, rank.output());
        }
        let pids: Vec<i32> = ranks.iter().map(|r| r.pid).collect();
        for l in leaks::check(&job::marker(ctx.trial), &pids, &tmp, &shm_before) {
            out.problems.push(format!("leak: {l}"));
        }
        let _ = std::fs::remove_dir_all(&tmp);
        out
    }
}

/// Rank 0 refused the pickle in time, naming rank 1 and the bound (`expect`), under the
/// memory bound; both ranks exited 0.
fn judge(ranks: &[Rank], expect: &str, out: &mut TrialOut) {
    for (r, rank) in ranks.iter().enumerate() {
        if rank.exit != Some(Some(0)) {
            out.problems
                .push(format!("rank {r} exited with {:?}", rank.exit));
        }
    }
    let Some((sent_at, _)) = ranks[1].line_with("hostile_object: sent") else {
        out.problems.push("rank 1 did not send its pickle".into());
        return;
    };
    if ranks[0].line_with("hostile_object: ACCEPTED").is_some() {
        out.problems
            .push("rank 0 accepted the hostile pickle".into());
    }
    match ranks[0].line_with("hostile_object: refused") {
        None => out.problems.push("rank 0 did not fail the op".into()),
        Some((at, line)) => {
            let took = at.saturating_duration_since(sent_at);
            out.detect.push(took);
            if took > DETECT {
                out.problems.push(format!(
                    "rank 0 refused the pickle {} ms after it was sent (bound {} ms)",
                    took.as_millis(),
                    DETECT.as_millis()
                ));
            }
            if !line.contains("from rank 1 (global rank 1)") || !line.contains(expect) {
                out.problems.push(format!(
                    "rank 0's error does not name rank 1 (global rank 1) and \"{expect}\": {line}"
                ));
            }
        }
    }
    let hwm = ranks[0]
        .line_with("hostile_object: VmHWM")
        .and_then(|(_, l)| {
            l.split_whitespace()
                .nth(2)
                .and_then(|v| v.parse::<u64>().ok())
        });
    match hwm {
        None => out.problems.push("rank 0 did not report its VmHWM".into()),
        Some(kb) if kb > BOUND_KB + SLACK_KB => out.problems.push(format!(
            "rank 0's peak memory {kb} kB passed the bound {BOUND_KB} kB + {SLACK_KB} kB"
        )),
        Some(_) => {}
    }
}
