//! The NCCL backend through the world layer, on a GPU (`cargo xtask test-multigpu`;
//! `harness = false`): two processes, each on its own GPU when there are two (`cuda:rank`),
//! else sharing one (each with its own `NCCL_HOSTID`), make a `"cpu:gloo,cuda:nccl"` world
//! bound to their device, and run collectives on CUDA and CPU tensors
//! in one group, a `new_group`, a `split_group` (made by `ncclCommSplit`), a barrier, CUDA
//! tensors through `"gloo"`, cudarc buffers, DDP's Reducer on CUDA parameters (`gpu_ddp`), and
//! `shrink_group` (`ncclCommShrink`). Prints
//! `skipped: no GPU` without a GPU (fails instead when `C10D_REQUIRE_GPU=1`), else one line per
//! rank and `N passed, M failed`.

mod gpu_ddp;

use c10d_core::{DType, Device, ReduceOp, Tensor};
use c10d_store::{ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use c10d_world::{GroupMember, GroupOptions, InitOptions, Rank, SplitOptions, World};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

const WORLD: usize = 2;
/// This rank's device (`C10D_GPU_DEVICE`, set by the parent).
fn dev() -> Device {
    let i = std::env::var("C10D_GPU_DEVICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Device::Cuda(i)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("world_layer_cpu_gloo_cuda_nccl (2 ranks: groups, split_group, shrink_group, gloo on CUDA tensors, cudarc buffers, DDP Reducer with buckets on the GPU)");
        return;
    }
    if let Ok(r) = std::env::var("C10D_GPU_WORLD_RANK") {
        let rank: usize = r.parse().unwrap();
        match std::panic::catch_unwind(|| rank_main(rank)) {
            Ok(Ok(())) => println!("rank {rank}: ok"),
            Ok(Err(e)) => {
                println!("rank {rank}: FAILED: {e}");
                std::process::exit(1);
            }
            Err(_) => {
                println!("rank {rank}: FAILED: panicked");
                std::process::exit(1);
            }
        }
        return;
    }
    if c10d_nccl::cuda_device_count() == 0 {
        if std::env::var("C10D_REQUIRE_GPU").as_deref() == Ok("1") {
            eprintln!("no GPU, but C10D_REQUIRE_GPU=1");
            std::process::exit(1);
        }
        println!("skipped: no GPU");
        return;
    }
    let server = TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        ..ServerOptions::default()
    })
    .expect("store server");
    let exe = std::env::current_exe().unwrap();
    let gpus = c10d_nccl::cuda_device_count();
    let mut kids: Vec<_> = (0..WORLD)
        .map(|r| {
            let mut cmd = Command::new(&exe);
            cmd.env("C10D_GPU_WORLD_RANK", r.to_string())
                .env("C10D_GPU_STORE_PORT", server.port().to_string())
                .env("C10D_GPU_DEVICE", (r % gpus).to_string())
                .env("LOCAL_RANK", r.to_string());
            if gpus < WORLD {
                cmd.env("NCCL_HOSTID", format!("c10d-world-rank-{r}"))
                    .env("NCCL_SOCKET_IFNAME", "lo")
                    // The socket transport, as the suite says: not an InfiniBand loopback.
                    .env("NCCL_NET", "Socket")
                    .env("NCCL_IB_DISABLE", "1");
            }
            cmd.spawn().unwrap()
        })
        .collect();
    // Bounded: ranks still running after 120 s are killed (and count as failed).
    let pids: Vec<u32> = kids.iter().map(|k| k.id()).collect();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = done.clone();
    let killer = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while std::time::Instant::now() < deadline {
            if seen.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for p in pids {
            let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
        }
    });
    let failed = kids
        .iter_mut()
        .map(|k| k.wait().unwrap())
        .filter(|s| !s.success())
        .count();
    done.store(true, std::sync::atomic::Ordering::Release);
    let _ = killer.join();
    println!("{} passed, {} failed", WORLD - failed, failed);
    std::process::exit(if failed == 0 { 0 } else { 1 });
}

fn cuda(v: Vec<f32>) -> Result<Tensor, String> {
    c10d_nccl::memory::from_cpu(&Tensor::from_vec(v), dev()).map_err(|e| e.to_string())
}

fn expect(what: &str, got: Vec<f32>, want: Vec<f32>) -> Result<(), String> {
    if got != want {
        return Err(format!("{what}: got {got:?}, expected {want:?}"));
    }
    Ok(())
}

fn rank_main(rank: usize) -> Result<(), String> {
    let e = |e: c10d_core::DistError| e.to_string();
    let port: u16 = std::env::var("C10D_GPU_STORE_PORT")
        .unwrap()
        .parse()
        .unwrap();
    let opts = TcpStoreOptions {
        timeout: Duration::from_secs(60),
        ..TcpStoreOptions::default()
    };
    let store: Arc<dyn Store> = Arc::new(TcpStore::new("127.0.0.1", port, opts).map_err(e)?);
    let w = World::new();
    w.init_process_group(InitOptions {
        backend: Some("cpu:gloo,cuda:nccl".into()),
        store: Some(store.clone()),
        world_size: Some(WORLD),
        rank: Some(rank),
        device_id: Some(dev()),
        timeout: Some(Duration::from_secs(60)),
        ..Default::default()
    })
    .map_err(e)?;
    if !c10d_world::is_nccl_available() {
        return Err("is_nccl_available() is false on a GPU machine".into());
    }
    let want_sum = vec![3.0f32; 4];
    let g = cuda(vec![(rank + 1) as f32; 4])?;
    w.all_reduce(&g).run().map_err(e)?;
    expect("cuda all_reduce", g.to_vec().map_err(e)?, want_sum.clone())?;
    let c = Tensor::from_vec(vec![(rank + 1) as f32; 4]);
    w.all_reduce(&c).run().map_err(e)?;
    expect("cpu all_reduce (gloo)", c.to_vec().map_err(e)?, want_sum)?;
    let m = cuda(vec![rank as f32; 2])?;
    w.all_reduce(&m)
        .op(ReduceOp::Max)
        .start()
        .map_err(e)?
        .wait()
        .map_err(e)?;
    expect("async max", m.to_vec().map_err(e)?, vec![1.0; 2])?;
    let sub = w
        .new_group(Some(&[0, 1]), GroupOptions::default())
        .map_err(e)?;
    let b = cuda(vec![rank as f32 + 10.0; 3])?;
    w.broadcast(&b, Rank::Group(1))
        .group(&sub)
        .run()
        .map_err(e)?;
    expect("new_group broadcast", b.to_vec().map_err(e)?, vec![11.0; 3])?;
    let split = w
        .split_group(None, &[vec![0], vec![1]], SplitOptions::default())
        .map_err(e)?;
    if !matches!(split, GroupMember::Group(_)) {
        return Err("split_group gave no group to a member".into());
    }
    let s = cuda(vec![5.0; 2])?;
    w.all_reduce(&s).group(&split).run().map_err(e)?;
    expect(
        "split_group all_reduce (1 rank)",
        s.to_vec().map_err(e)?,
        vec![5.0; 2],
    )?;
    let out = c10d_nccl::memory::zeros(DType::F32, &[WORLD * 2], dev()).map_err(e)?;
    let mine = cuda(vec![rank as f32; 2])?;
    w.all_gather_into_tensor(&out, &mine).run().map_err(e)?;
    expect(
        "all_gather_into_tensor",
        out.to_vec().map_err(e)?,
        vec![0.0, 0.0, 1.0, 1.0],
    )?;
    cudarc_buffers(&w, rank)?;
    gpu_ddp::device_reducer(&w, rank, dev())?;
    gpu_ddp::device_reducer_on_a_declared_stream(&w, rank, dev())?;
    w.barrier().run().map_err(e)?;
    store.set(&format!("done{rank}"), b"1").map_err(e)?;
    store.wait(&["done0", "done1"]).map_err(e)?;
    gloo_world(rank, store.clone())?;
    shrink(&w, rank, store)
}

/// The builders on cudarc buffers of the caller's non-blocking stream, for one blocking call
/// each: all_reduce in place on a `CudaSlice` (values per rank and element), all_gather from a
/// `&CudaSlice` into a `CudaViewMut` of part of a buffer (the rest untouched), and a broadcast
/// into a `CudaViewMut`; read back on that stream with no other synchronisation.
fn cudarc_buffers(w: &World, rank: usize) -> Result<(), String> {
    let e = |e: c10d_core::DistError| e.to_string();
    let d = |e: c10d_nccl::cudarc::driver::DriverError| format!("{e:?}");
    let ctx = c10d_nccl::device::context(dev()).map_err(e)?;
    let s = ctx.new_stream().map_err(d)?;
    let mine: Vec<f32> = (0..1001).map(|i| (rank * 7 + i % 251) as f32).collect();
    let mut g = s.clone_htod(&mine).map_err(d)?;
    w.all_reduce(&mut g).run().map_err(e)?;
    let want: Vec<f32> = (0..1001)
        .map(|i| (0..WORLD).map(|r| (r * 7 + i % 251) as f32).sum())
        .collect();
    expect(
        "all_reduce(&mut CudaSlice)",
        s.clone_dtoh(&g).map_err(d)?,
        want,
    )?;
    let small = s.clone_htod(&[rank as f32 + 1.0; 2]).map_err(d)?;
    let mut out = s.clone_htod(&[-1.0f32; 2 * WORLD + 1]).map_err(d)?;
    w.all_gather_into_tensor(out.slice_mut(1..), &small)
        .run()
        .map_err(e)?;
    expect(
        "all_gather_into_tensor(CudaViewMut, &CudaSlice)",
        s.clone_dtoh(&out).map_err(d)?,
        vec![-1.0, 1.0, 1.0, 2.0, 2.0],
    )?;
    let mut b = s.clone_htod(&[rank as f32; 3]).map_err(d)?;
    w.broadcast(b.slice_mut(..), Rank::Group(1))
        .run()
        .map_err(e)?;
    expect(
        "broadcast(CudaViewMut)",
        s.clone_dtoh(&b).map_err(d)?,
        vec![1.0; 3],
    )
}

/// `shrink_group([1])` of the NCCL world: rank 0 goes on alone, its CUDA backend made by
/// `ncclCommShrink` (NCCL ≥ 2.27) and its CPU backend made anew; rank 1 takes no part.
fn shrink(w: &World, rank: usize, store: Arc<dyn Store>) -> Result<(), String> {
    let e = |e: c10d_core::DistError| e.to_string();
    if rank == 1 {
        store.wait(&["shrunk"]).map_err(e)?;
        return Ok(());
    }
    let g = w.shrink_group(&[1], None).map_err(e)?;
    if w.get_world_size(None).map_err(e)? != 1 || !matches!(g, GroupMember::Group(_)) {
        return Err("the shrunk world is not one rank".into());
    }
    let t = cuda(vec![4.0; 3])?;
    w.all_reduce(&t).run().map_err(e)?;
    expect(
        "cuda all_reduce after shrink",
        t.to_vec().map_err(e)?,
        vec![4.0; 3],
    )?;
    let c = Tensor::from_vec(vec![2.0f32; 2]);
    w.all_reduce(&c).run().map_err(e)?;
    expect(
        "cpu all_reduce after shrink",
        c.to_vec().map_err(e)?,
        vec![2.0; 2],
    )?;
    store.set("shrunk", b"1").map_err(e)?;
    w.destroy_process_group(None).map_err(e)
}

/// CUDA tensors through the CPU backend (`"gloo"` = `"cpu:gloo,cuda:gloo"`), both ranks on the
/// one GPU: staged through host memory as PyTorch's Gloo does.
fn gloo_world(rank: usize, store: Arc<dyn Store>) -> Result<(), String> {
    let e = |e: c10d_core::DistError| e.to_string();
    let w = World::new();
    w.init_process_group(InitOptions {
        backend: Some("gloo".into()),
        store: Some(Arc::new(c10d_store::PrefixStore::new(
            "gloo/",
            store.clone(),
        ))),
        world_size: Some(WORLD),
        rank: Some(rank),
        timeout: Some(Duration::from_secs(60)),
        ..Default::default()
    })
    .map_err(e)?;
    let t = cuda(vec![(rank + 1) as f32; 5])?;
    w.all_reduce(&t).run().map_err(e)?;
    expect(
        "gloo all_reduce of a CUDA tensor",
        t.to_vec().map_err(e)?,
        vec![3.0; 5],
    )?;
    let b = cuda(vec![rank as f32; 2])?;
    w.broadcast(&b, 1).run().map_err(e)?;
    expect(
        "gloo broadcast of a CUDA tensor",
        b.to_vec().map_err(e)?,
        vec![1.0; 2],
    )?;
    let out = c10d_nccl::memory::zeros(DType::F32, &[WORLD * 2], dev()).map_err(e)?;
    let mine = cuda(vec![rank as f32 + 1.0; 2])?;
    w.all_gather_into_tensor(&out, &mine)
        .start()
        .map_err(e)?
        .wait()
        .map_err(e)?;
    expect(
        "gloo all_gather of CUDA tensors",
        out.to_vec().map_err(e)?,
        vec![1.0, 1.0, 2.0, 2.0],
    )?;
    store.set(&format!("gloo-done{rank}"), b"1").map_err(e)?;
    store.wait(&["gloo-done0", "gloo-done1"]).map_err(e)?;
    w.destroy_process_group(None).map_err(e)?;
    Ok(())
}
