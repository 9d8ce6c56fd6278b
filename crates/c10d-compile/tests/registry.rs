//! The process-wide work registry (PyTorch's `WorkRegistry` rules). The registry is shared by
//! every test of this binary, so these tests take turns (`SERIAL`) and each leaves it empty.

mod common;

use c10d_compile::registry::{
    allow_inflight_collective_as_graph_input, track_async_work, unwaited_at_exit_message,
};
use c10d_compile::{
    allow_inflight_collective_as_graph_input_ctx, wait_tensor, wait_tensors, work_registry_size,
    Funcol,
};
use c10d_core::Tensor;
use c10d_world::World;
use common::run;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn registry_sizes_follow_pytorch() {
    let _g = serial();
    run(1, "store", |w, _| {
        let f = Funcol::new(w);
        assert_eq!(work_registry_size(), 0);
        let t = Tensor::from_vec(vec![1.0f32; 4]);
        let out = f.all_reduce(&t, "sum", "0").unwrap();
        assert_eq!(work_registry_size(), 1);
        let inner = out.inner_unwaited().clone();
        let same = wait_tensor(&inner).unwrap();
        assert!(
            same.shares_storage_with(&inner),
            "wait_tensor returns the same tensor"
        );
        assert_eq!(work_registry_size(), 0);
        // Waiting again, or on a tensor never registered, is a no-op.
        wait_tensor(&inner).unwrap();
        wait_tensor(&Tensor::from_vec(vec![0u8])).unwrap();
        assert!(out.to_vec::<f32>().is_ok());

        // A coalesced op registers each output (the same work under each).
        let outs = f
            .all_reduce_coalesced(&[t.clone(), Tensor::from_vec(vec![2.0f32])], "sum", "0")
            .unwrap();
        assert_eq!(work_registry_size(), 2);
        let ts: Vec<Tensor> = outs.iter().map(|o| o.inner_unwaited().clone()).collect();
        wait_tensors(&ts).unwrap();
        assert_eq!(work_registry_size(), 0);
        assert_eq!(
            wait_tensors(&[]).unwrap_err().to_string(),
            "wait_tensors requires at least one tensor"
        );

        // Two ops on one storage: two works under one key, both popped by one wait.
        f.all_reduce_(&t, "sum", "0").unwrap();
        f.all_reduce_(&t.narrow(0, 2).unwrap(), "sum", "0").unwrap();
        assert_eq!(work_registry_size(), 2);
        wait_tensor(&t.narrow(1, 1).unwrap()).unwrap();
        assert_eq!(work_registry_size(), 0);

        // Dropping the handle keeps the work registered (PyTorch keeps works alive) ...
        drop(f.all_reduce_(&t, "sum", "0").unwrap());
        assert_eq!(work_registry_size(), 1);
        // ... and the first access through a handle unregisters.
        let a = f.all_reduce(&t, "sum", "0").unwrap();
        assert_eq!(work_registry_size(), 2);
        a.tensor().unwrap();
        assert_eq!(work_registry_size(), 1);
        wait_tensor(&t).unwrap();
        assert_eq!(work_registry_size(), 0);
    });
}

#[test]
fn plain_async_collectives_register_only_inside_the_scope() {
    let _g = serial();
    run(1, "store", |w, _| {
        let b = 0;
        let t = Tensor::from_vec(vec![1i64; 2]);
        for _ in 0..2000 {
            let work = w.all_reduce(&t).start().unwrap();
            track_async_work(std::slice::from_ref(&t), work);
        }
        assert_eq!(
            work_registry_size(),
            b,
            "nothing registered outside the scope"
        );
        assert!(!allow_inflight_collective_as_graph_input());
        allow_inflight_collective_as_graph_input_ctx(|| {
            assert!(allow_inflight_collective_as_graph_input());
            let work = w.all_reduce(&t).start().unwrap();
            track_async_work(std::slice::from_ref(&t), work);
            assert_eq!(work_registry_size(), b + 1);
            allow_inflight_collective_as_graph_input_ctx(|| {
                let work = w.all_reduce(&t).start().unwrap();
                track_async_work(std::slice::from_ref(&t), work);
            });
            assert!(
                allow_inflight_collective_as_graph_input(),
                "nested scope restores"
            );
            assert_eq!(work_registry_size(), b + 2);
        });
        assert!(!allow_inflight_collective_as_graph_input());
        wait_tensor(&t).unwrap();
        assert_eq!(work_registry_size(), b);
    });
}

/// A tensor registered on one thread is waited from another.
#[test]
fn wait_tensor_from_another_thread() {
    let _g = serial();
    let out = run(2, "gloo", |w, r| {
        let f = Funcol::new(w);
        let t = Tensor::from_vec(vec![(r + 1) as f32; 8]);
        let out = f.all_reduce(&t, "sum", "0").unwrap();
        let inner = out.inner_unwaited().clone();
        let h = std::thread::spawn(move || {
            let t = wait_tensor(&inner).unwrap();
            t.to_vec::<f32>().unwrap()
        });
        let v = h.join().unwrap();
        // The first access through the handle finds nothing left to wait for.
        assert_eq!(out.to_vec::<f32>().unwrap(), v);
        v
    });
    assert_eq!(out[0], vec![3.0; 8]);
    assert_eq!(out[1], vec![3.0; 8]);
    assert_eq!(work_registry_size(), 0);
}

const CHILD: &str = "C10D_COMPILE_REGISTRY_EXIT_CHILD";

/// The child: two gloo ranks in this process, rank 1 never joins rank 0's all_reduce, the
/// result is never waited, and the process exits: PyTorch's warning, no hang.
fn exit_child() {
    common::register();
    let store = common::store();
    let worlds: Vec<Arc<World>> = (0..2)
        .map(|r| {
            let store = store.clone();
            std::thread::spawn(move || {
                let w = World::new();
                let mut o = common::opts("gloo", &store, r, 2);
                o.timeout = Some(Duration::from_secs(300));
                w.init_process_group(o).unwrap();
                Arc::new(w)
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    let f = Funcol::new(&worlds[0]);
    let t = Tensor::from_vec(vec![1.0f32; 4]);
    let out = f.all_reduce(&t, "sum", "0").unwrap();
    assert_eq!(work_registry_size(), 1);
    std::mem::forget(out);
    // Keep both worlds alive until the process ends (never destroyed, never waited).
    std::mem::forget(worlds);
    println!("CHILD DONE");
}

#[test]
fn unwaited_works_at_exit_warn_and_do_not_hang() {
    if std::env::var_os(CHILD).is_some() {
        exit_child();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let start = Instant::now();
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "unwaited_works_at_exit_warn_and_do_not_hang",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let limit = Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("the child hung at exit with an unwaited work");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "child failed: {out}\n{err}");
    assert!(out.contains("CHILD DONE"), "{out}\n{err}");
    assert!(
        err.contains(&unwaited_at_exit_message(1)),
        "missing exit warning:\n{err}"
    );
    assert!(err.contains(
        "At the time of process termination, there are still 1 unwaited collective calls."
    ));
}
