//! A group that shrinks after a failure and grows back: this test binary re-runs itself as 4
//! ranks (env:// over a TcpStore hosted by the parent, gloo on 127.0.0.1) that train a linear
//! model data-parallel through the DDP `Reducer` (gradients by hand, SGD). After step
//! `KILL_AFTER` the parent SIGKILLs rank `DEAD`; the survivors' next step fails, they
//! `shrink_group([DEAD])`, build a new Reducer and redo the step on 3 ranks. At step `GROW_AT`
//! the parent starts a replacement, which calls `join_process_group` while the survivors call
//! `grow_group(1)`: the group is 4 ranks again, the newcomer receives the parameters (and the
//! step) by broadcast from rank 0, and all four train to the end. Every rank then prints its
//! parameters' bits: the four must be identical, and equal to what the same schedule gives in
//! this process without any communication.

use c10d_core::Tensor;
use c10d_ddp::{broadcast_coalesced, Reducer, ReducerOptions};
use c10d_testing::world as world_common;
use c10d_world as dist;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CHILD: &str = "C10D_WORLD_GROW_CHILD";
/// Set on the replacement: the UNIX time (ns) the parent started it.
const JOINER: &str = "C10D_WORLD_GROW_JOINER";
const N: usize = 4;
const DEAD: usize = 2;
const STEPS: usize = 10;
const KILL_AFTER: usize = 2;
const GROW_AT: usize = 5;
/// Features of the linear model (parameters: weight [D], bias [1]).
const D: usize = 33;
const LR: f32 = 0.05;
const TEST: &str = "four_ranks_lose_one_shrink_grow_back_and_agree_bit_for_bit";

/// Sample `j` of rank `r`'s batch at `step`: (features, target).
fn sample(step: usize, r: usize, j: usize) -> (Vec<f32>, f32) {
    let x = (0..D)
        .map(|d| ((step * 7 + r * 13 + j * 3 + d) % 17) as f32 / 17.0 - 0.5)
        .collect();
    (x, ((step + 2 * r + j) % 5) as f32 / 5.0)
}

/// Rank `r`'s gradient (weight, bias) of the mean squared error over its 4 samples.
fn local_grad(w: &[f32], b: f32, step: usize, r: usize) -> (Vec<f32>, f32) {
    let (mut gw, mut gb) = (vec![0f32; D], 0f32);
    for j in 0..4 {
        let (x, y) = sample(step, r, j);
        let err = w.iter().zip(&x).map(|(a, c)| a * c).sum::<f32>() + b - y;
        for (g, xi) in gw.iter_mut().zip(&x) {
            *g += err * xi / 4.0;
        }
        gb += err / 4.0;
    }
    (gw, gb)
}

/// One DDP step on `world` ranks: local gradients into the Reducer, mean gradients out, SGD.
fn ddp_step(red: &Reducer, params: &[Tensor], step: usize, rank: usize) -> c10d_core::Result<()> {
    let w: Vec<f32> = params[0].to_vec()?;
    let b: f32 = params[1].to_vec::<f32>()?[0];
    let (gw, gb) = local_grad(&w, b, step, rank);
    red.prepare_for_backward(&[])?;
    red.grad(1)?.write(|g: &mut [f32]| g[0] = gb)?;
    red.mark_variable_ready(1)?;
    red.grad(0)?.write(|g: &mut [f32]| g.copy_from_slice(&gw))?;
    red.mark_variable_ready(0)?;
    red.finalize_backward()?;
    for (i, p) in params.iter().enumerate() {
        let g: Vec<f32> = red.grad(i)?.to_vec()?;
        p.write(|v: &mut [f32]| {
            for (x, gi) in v.iter_mut().zip(&g) {
                *x -= LR * gi;
            }
        })?;
    }
    Ok(())
}

/// The parameters' bits as hex.
fn bits(params: &[Tensor]) -> String {
    params
        .iter()
        .flat_map(|p| p.to_vec::<f32>().unwrap())
        .map(|x| format!("{:08x}", x.to_bits()))
        .collect()
}

fn reducer(params: &[Tensor]) -> Reducer {
    let pg = dist::World::global().world_group().unwrap();
    Reducer::new(params, pg, ReducerOptions::default()).unwrap()
}

fn barrier(key: &str, n: usize) {
    let ds = dist::World::global().default_store().unwrap();
    c10d_store::store_barrier(ds.as_ref(), key, n, Duration::from_secs(60)).unwrap();
}

/// The data ranks of a step: the 4 original workers' data before the failure and after the
/// grow, the survivors' in between (the newcomer takes the dead rank's place in the data).
fn world_at(step: usize) -> usize {
    if step > KILL_AFTER && step < GROW_AT {
        N - 1
    } else {
        N
    }
}

fn child_main() {
    let joiner = std::env::var(JOINER).ok();
    let opts = dist::InitOptions {
        backend: Some("gloo".into()),
        timeout: Some(Duration::from_secs(30)),
        ..Default::default()
    };
    let params = [
        Tensor::from_vec(vec![0f32; D]),
        Tensor::from_vec(vec![0f32; 1]),
    ];
    let mut s = 0usize;
    if let Some(started) = joiner {
        dist::join_process_group(opts).unwrap();
        let pg = dist::World::global().world_group().unwrap();
        let step = Tensor::from_vec(vec![0f32]);
        broadcast_coalesced(
            &pg,
            &[params[0].clone(), params[1].clone(), step.clone()],
            1 << 20,
            0,
            None,
        )
        .unwrap();
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            - started.parse::<u128>().unwrap();
        s = step.to_vec::<f32>().unwrap()[0] as usize;
        println!(
            "JOINED rank={} size={} step={s} start_to_first_collective_ms={}",
            dist::get_rank(None).unwrap(),
            dist::get_world_size(None).unwrap(),
            since / 1_000_000
        );
    } else {
        dist::init_process_group(opts).unwrap();
    }
    let mut red = reducer(&params);
    while s < STEPS {
        let me = dist::get_rank(None).unwrap() as usize;
        if let Err(e) = ddp_step(&red, &params, s, me) {
            assert_eq!(
                s,
                KILL_AFTER + 1,
                "rank {me}: unexpected failure at step {s}: {e}"
            );
            println!("FAILED rank={me} step={s}");
            barrier("failed", N - 1);
            dist::shrink_group(&[DEAD], None).unwrap();
            red = reducer(&params);
            continue;
        }
        println!(
            "STEP rank={me} step={s} size={}",
            dist::get_world_size(None).unwrap()
        );
        s += 1;
        if s == KILL_AFTER + 1 && dist::get_world_size(None).unwrap() == N as i64 {
            barrier("before_kill", N);
            if me == DEAD {
                println!("KILLME rank={me}");
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
        if s == GROW_AT && dist::get_world_size(None).unwrap() == (N - 1) as i64 {
            barrier("before_grow", N - 1);
            if me == 0 {
                println!("GROWME");
            }
            let t0 = Instant::now();
            dist::grow_group(1, None).unwrap();
            let took = t0.elapsed();
            let pg = dist::World::global().world_group().unwrap();
            let step = Tensor::from_vec(vec![s as f32]);
            broadcast_coalesced(
                &pg,
                &[params[0].clone(), params[1].clone(), step],
                1 << 20,
                0,
                None,
            )
            .unwrap();
            println!(
                "GROWN rank={me} size={} took_ms={}",
                pg.size(),
                took.as_millis()
            );
            red = reducer(&params);
        }
    }
    let me = dist::get_rank(None).unwrap();
    println!("PARAMS rank={me} bits={}", bits(&params));
    // Every rank (the newcomer too) names the next group alike: a subgroup works.
    let sub = dist::new_group(Some(&[1, 3]), Default::default()).unwrap();
    if me == 1 || me == 3 {
        let t = Tensor::from_vec(vec![me as f32; 3]);
        dist::all_reduce(&t).group(&sub).run().unwrap();
        assert_eq!(
            t.to_vec::<f32>().unwrap(),
            [4.0; 3],
            "subgroup after the grow"
        );
        println!("SUBGROUP rank={me} ok");
    }
    barrier("end", N);
    dist::destroy_process_group(None).unwrap();
}

/// The parameters the schedule gives without communication: each step's mean of the
/// `world_at(step)` ranks' gradients (summed in rank order; the all_reduce may sum in another
/// order, so this is compared within float tolerance).
fn expected_params() -> Vec<f32> {
    let (mut w, mut b) = (vec![0f32; D], 0f32);
    for step in 0..STEPS {
        let n = world_at(step);
        let (mut sw, mut sb) = (vec![0f32; D], 0f32);
        for r in 0..n {
            let (gw, gb) = local_grad(&w, b, step, r);
            for (a, g) in sw.iter_mut().zip(&gw) {
                *a += g;
            }
            sb += gb;
        }
        for (x, g) in w.iter_mut().zip(&sw) {
            *x -= LR * (g / n as f32);
        }
        b -= LR * (sb / n as f32);
    }
    w.push(b);
    w
}

/// The parameters in `bits`' hex.
fn from_bits(hex: &str) -> Vec<f32> {
    (0..hex.len() / 8)
        .map(|i| f32::from_bits(u32::from_str_radix(&hex[8 * i..8 * i + 8], 16).unwrap()))
        .collect()
}

/// Spawns a child (rank `r` of `N`, or the joiner when `joiner`) whose stdout lines reach `tx`.
fn start(
    port: u16,
    r: usize,
    joiner: bool,
    tx: &mpsc::Sender<(usize, String)>,
) -> (std::process::Child, std::thread::JoinHandle<()>) {
    let mut cmd = world_common::rank_command(TEST, CHILD, port, r, N, "grow-test");
    if joiner {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        cmd.env(JOINER, now.to_string())
            .env_remove("RANK")
            .env_remove("WORLD_SIZE");
    }
    world_common::spawn_lines(cmd, r, tx)
}

#[test]
fn four_ranks_lose_one_shrink_grow_back_and_agree_bit_for_bit() {
    if std::env::var_os(CHILD).is_some() {
        child_main();
        return;
    }
    let srv = world_common::store_server();
    let (tx, rx) = mpsc::channel::<(usize, String)>();
    // Slot N is the replacement.
    let mut kids: Vec<Option<std::process::Child>> = Vec::new();
    let mut readers = Vec::new();
    for r in 0..N {
        let (k, h) = start(srv.port(), r, false, &tx);
        kids.push(Some(k));
        readers.push(h);
    }
    kids.push(None);
    let mut lines: Vec<Vec<String>> = vec![Vec::new(); N + 1];
    let start_t = Instant::now();
    let mut done = [false; N + 1];
    done[DEAD] = true;
    while start_t.elapsed() < Duration::from_secs(120) && !done.iter().all(|d| *d) {
        while let Ok((r, line)) = rx.recv_timeout(Duration::from_millis(20)) {
            if line.contains("KILLME") {
                kids[DEAD].as_mut().unwrap().kill().unwrap();
            }
            if line.contains("GROWME") {
                let (k, h) = start(srv.port(), N, true, &tx);
                kids[N] = Some(k);
                readers.push(h);
            }
            lines[r].push(line);
        }
        for (i, k) in kids.iter_mut().enumerate() {
            if let Some(k) = k {
                if !done[i] && k.try_wait().unwrap().is_some() {
                    done[i] = true;
                }
            }
        }
    }
    drop(tx);
    let mut errs = vec![String::new(); N + 1];
    for (i, k) in kids.into_iter().enumerate() {
        if let Some(mut k) = k {
            let _ = k.kill();
            let o = k.wait_with_output().unwrap();
            assert!(
                i == DEAD || o.status.success(),
                "slot {i} failed: {}\n{}",
                String::from_utf8_lossy(&o.stderr),
                lines[i].join("\n")
            );
            errs[i] = String::from_utf8_lossy(&o.stderr).into_owned();
        }
    }
    for h in readers {
        h.join().unwrap();
    }
    while let Ok((r, line)) = rx.try_recv() {
        lines[r].push(line);
    }
    let all = |i: usize| format!("slot {i}:\n{}\n{}", lines[i].join("\n"), errs[i]);
    let mut seen = Vec::new();
    for i in (0..=N).filter(|&i| i != DEAD) {
        let p = lines[i]
            .iter()
            .find_map(|l| l.split("bits=").nth(1))
            .unwrap_or_else(|| panic!("no parameters from slot {i}\n{}", all(i)));
        seen.push((i, p.to_string()));
    }
    for (i, p) in &seen {
        assert_eq!(
            p,
            &seen[0].1,
            "slot {i} ends with other bits than slot 0\n{}",
            all(*i)
        );
    }
    assert_eq!(seen.len(), N);
    // Slot 1 kept rank 1; the newcomer (slot N) is rank 3.
    for (i, me) in [(1, 1), (N, 3)] {
        let ok = format!("SUBGROUP rank={me} ok");
        assert!(lines[i].iter().any(|l| l.contains(&ok)), "{}", all(i));
    }
    let (got, want) = (from_bits(&seen[0].1), expected_params());
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * w.abs().max(1.0),
            "parameter {k}: {g} vs {w} alone"
        );
    }
    assert!(want.iter().any(|w| *w != 0.0), "the model did not train");
    let joined = lines[N]
        .iter()
        .find(|l| l.contains("JOINED"))
        .unwrap_or_else(|| panic!("{}", all(N)));
    assert!(
        joined.contains(&format!("rank={} size={N} step={GROW_AT}", N - 1)),
        "{joined}"
    );
    println!("{joined}");
    for i in [0, 1, 3] {
        let g = lines[i].iter().find(|l| l.contains("GROWN")).unwrap();
        println!("{g}");
    }
}
