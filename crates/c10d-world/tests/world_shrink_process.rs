//! Shrink after a real failure: this test binary re-runs itself as 4 ranks (env:// init over a
//! TcpStore hosted by the parent, gloo on 127.0.0.1, as in `world_process.rs`). The ranks run
//! all_reduce "training steps"; after step `KILL_AFTER` rank `DEAD` tells the parent, which
//! SIGKILLs it. The survivors' next all_reduce fails, they call `shrink_group([DEAD])` (which
//! makes the shrunk group the new WORLD), redo the failed step and finish the job on 3 ranks.

use c10d_core::Tensor;
use c10d_testing::world as world_common;
use c10d_world as dist;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CHILD: &str = "C10D_WORLD_SHRINK_CHILD";
const N: usize = 4;
const DEAD: usize = 2;
const STEPS: usize = 8;
const KILL_AFTER: usize = 3;

/// The value rank `r` (pre-shrink numbering) contributes at `step`.
fn contribution(r: usize, step: usize) -> f32 {
    ((r + 1) * (step + 1)) as f32
}

fn step(step: usize, old_rank: usize) -> c10d_core::Result<f32> {
    let t = Tensor::from_vec(vec![contribution(old_rank, step); 256]);
    dist::all_reduce(&t).run()?;
    let v = t.to_vec::<f32>().unwrap();
    assert!(v.iter().all(|&x| x == v[0]), "step {step}: {v:?}");
    Ok(v[0])
}

fn child_main() {
    dist::init_process_group(dist::InitOptions {
        backend: Some("gloo".into()),
        timeout: Some(Duration::from_secs(30)),
        ..Default::default()
    })
    .unwrap();
    let me = dist::get_rank(None).unwrap() as usize;
    let full: f32 = (0..N).map(|r| contribution(r, 0)).sum();
    let survivors: f32 = (0..N)
        .filter(|&r| r != DEAD)
        .map(|r| contribution(r, 0))
        .sum();
    let mut shrunk = false;
    let mut s = 0;
    while s < STEPS {
        let t_step = Instant::now();
        match step(s, me) {
            Ok(v) => {
                let per_step = if shrunk { survivors } else { full };
                assert_eq!(v, per_step * (s + 1) as f32, "rank {me} step {s}");
                println!("STEP rank={me} step={s} sum={v}");
            }
            Err(e) => {
                // Only the step right after the kill may fail, and only on the full world.
                assert!(
                    s == KILL_AFTER + 1 && !shrunk,
                    "rank {me}: unexpected failure at step {s}: {e}"
                );
                assert_eq!(dist::get_world_size(None).unwrap(), N as i64);
                let detect = t_step.elapsed();
                println!(
                    "FAILED rank={me} step={s} after_ms={} error={e}",
                    detect.as_millis()
                );
                // Measure the shrink itself, not the wait for the slowest survivor to see the
                // failure: meet on the (parent-hosted) store first.
                let ds = dist::World::global().default_store().unwrap();
                c10d_store::store_barrier(ds.as_ref(), "failed", N - 1, Duration::from_secs(60))
                    .unwrap();
                let t0 = Instant::now();
                let g = dist::shrink_group(&[DEAD], None).unwrap();
                let took = t0.elapsed();
                shrunk = true;
                let pg = g.group().unwrap();
                let new_rank = dist::get_rank(None).unwrap();
                assert_eq!(new_rank as usize, pg.rank());
                assert_eq!(new_rank as usize, if me < DEAD { me } else { me - 1 });
                assert_eq!(dist::get_world_size(None).unwrap(), (N - 1) as i64);
                println!(
                    "SHRUNK rank={me} new_rank={new_rank} size={} took_us={}",
                    pg.size(),
                    took.as_micros()
                );
                continue; // redo step s on the shrunk WORLD
            }
        }
        if s == KILL_AFTER {
            // Every rank has finished step KILL_AFTER (a rank's all_reduce can return before its
            // last sends have reached the others), so only step KILL_AFTER + 1 can fail.
            let ds = dist::World::global().default_store().unwrap();
            c10d_store::store_barrier(ds.as_ref(), "before_kill", N, Duration::from_secs(60))
                .unwrap();
        }
        if s == KILL_AFTER && me == DEAD {
            println!("KILLME rank={me}");
            // The parent SIGKILLs us; never go on.
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        if s > KILL_AFTER {
            assert_eq!(dist::get_world_size(None).unwrap(), (N - 1) as i64);
        }
        s += 1;
    }
    println!("DONE rank={me}");
    // Survivors meet before tearing down so that none fails another's last op.
    let ds = dist::World::global().default_store().unwrap();
    c10d_store::store_barrier(ds.as_ref(), "end", N - 1, Duration::from_secs(60)).unwrap();
    dist::destroy_process_group(None).unwrap();
}

#[test]
fn four_processes_one_killed_survivors_shrink_and_finish() {
    if std::env::var_os(CHILD).is_some() {
        child_main();
        return;
    }
    let srv = world_common::store_server();
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    let mut kids = Vec::new();
    let mut readers = Vec::new();
    for r in 0..N {
        let cmd = world_common::rank_command(
            "four_processes_one_killed_survivors_shrink_and_finish",
            CHILD,
            srv.port(),
            r,
            N,
            "shrink-test",
        );
        let (k, reader) = world_common::spawn_lines(cmd, r, &tx);
        readers.push(reader);
        kids.push(k);
    }
    drop(tx);
    let start = Instant::now();
    let deadline = Duration::from_secs(120);
    let mut lines: Vec<Vec<String>> = vec![Vec::new(); N];
    let mut done: Vec<Option<std::process::ExitStatus>> = vec![None; N];
    let mut killed = false;
    while start.elapsed() < deadline {
        loop {
            match rx.recv_timeout(Duration::from_millis(20)) {
                Ok((r, line)) => {
                    if line.contains("KILLME") && r == DEAD && !killed {
                        // std's Child::kill sends SIGKILL on Unix.
                        kids[DEAD].kill().unwrap();
                        killed = true;
                    }
                    lines[r].push(line);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                // Every reader is done: wait for the exits without spinning.
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    std::thread::sleep(Duration::from_millis(20));
                    break;
                }
            }
        }
        for (i, k) in kids.iter_mut().enumerate() {
            if done[i].is_none() {
                done[i] = k.try_wait().unwrap();
            }
        }
        if done.iter().all(|d| d.is_some()) {
            break;
        }
    }
    let mut errs = Vec::new();
    for mut k in kids {
        let _ = k.kill();
        let o = k.wait_with_output().unwrap();
        errs.push(String::from_utf8_lossy(&o.stderr).to_string());
    }
    for h in readers {
        h.join().unwrap();
    }
    while let Ok((r, line)) = rx.try_recv() {
        lines[r].push(line);
    }
    let dump1 = |r: usize| {
        format!(
            "rank {r} stdout:\n{}\nstderr:\n{}",
            lines[r].join("\n"),
            errs[r]
        )
    };
    let dump = |r: usize| {
        let others: Vec<String> = (0..N).filter(|&o| o != r).map(dump1).collect();
        format!("{}\n--- other ranks ---\n{}", dump1(r), others.join("\n"))
    };
    assert!(
        killed,
        "rank {DEAD} never asked to be killed\n{}",
        dump(DEAD)
    );
    let mut worst = Duration::ZERO;
    let full: usize = (1..=N).sum();
    let surv: usize = (1..=N).filter(|&x| x != DEAD + 1).sum();
    for r in (0..N).filter(|&r| r != DEAD) {
        let st = done[r].unwrap_or_else(|| panic!("rank {r} did not finish\n{}", dump(r)));
        assert!(st.success(), "rank {r} failed\n{}", dump(r));
        let has = |p: &str| lines[r].iter().any(|l| l.contains(p));
        assert!(
            has(&format!("FAILED rank={r} step={}", KILL_AFTER + 1)),
            "{}",
            dump(r)
        );
        assert!(has(&format!("DONE rank={r}")), "{}", dump(r));
        for s in 0..STEPS {
            let want = if s <= KILL_AFTER { full } else { surv } * (s + 1);
            assert!(
                has(&format!("STEP rank={r} step={s} sum={want}")),
                "rank {r} step {s}: want {want}\n{}",
                dump(r)
            );
        }
        let shrunk = lines[r]
            .iter()
            .find(|l| l.contains("SHRUNK"))
            .unwrap_or_else(|| panic!("{}", dump(r)));
        let failed = lines[r]
            .iter()
            .find(|l| l.contains("FAILED rank="))
            .unwrap();
        println!("{}", &failed[failed.find("FAILED").unwrap()..]);
        println!("{shrunk}");
        let us: u64 = shrunk
            .rsplit("took_us=")
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap();
        worst = worst.max(Duration::from_micros(us));
    }
    // The dead rank never got past step KILL_AFTER.
    assert!(!lines[DEAD]
        .iter()
        .any(|l| l.contains(&format!("step={}", KILL_AFTER + 1))));
    println!("shrink_group after SIGKILL (3 survivor processes, gloo): slowest took {worst:?}");
    // Well under a second in practice; the bound is generous against loaded CI machines.
    assert!(worst < Duration::from_secs(5), "shrink took {worst:?}");
}
