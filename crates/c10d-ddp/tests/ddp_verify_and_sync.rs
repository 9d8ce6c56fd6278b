//! DDP's checks and initial sync with ranks as threads: `verify_params_across_processes` names
//! the rank and parameter that differ, and `broadcast_coalesced` copies rank 0's values into
//! every rank's tensors through a few flat buffers.

use c10d_testing::world as world_common;

use c10d_core::{DType, Tensor};
use c10d_ddp::{broadcast_coalesced, verify_params_across_processes};
use c10d_testing::fake_device::HostBackedDevice;
use std::time::Duration;
use world_common::{run, run_gloo_as};

const T: Option<Duration> = Some(Duration::from_secs(20));

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("p{i}")).collect()
}

#[test]
fn same_parameters_pass() {
    run(3, |w, _| {
        let pg = w.world_group().unwrap();
        let ps = [
            Tensor::zeros(DType::F32, &[4, 3]),
            Tensor::zeros(DType::F64, &[3]),
        ];
        verify_params_across_processes(&pg, &ps, &names(2), T).unwrap();
    });
}

#[test]
fn a_shape_mismatch_names_the_rank_and_parameter() {
    let errs = run(3, |w, rank| {
        let pg = w.world_group().unwrap();
        let bias = if rank == 2 { 5 } else { 3 };
        let ps = [
            Tensor::zeros(DType::F32, &[4, 3]),
            Tensor::zeros(DType::F32, &[bias]),
        ];
        verify_params_across_processes(&pg, &ps, &names(2), T)
            .unwrap_err()
            .to_string()
    });
    assert_eq!(
        errs[0],
        "[0]: params[1] (p1) in this process with sizes [3] and dtype torch.float32 appears not \
         to match sizes [5] and dtype torch.float32 of the same param in process 2."
    );
    assert!(
        errs[2].starts_with("[2]: params[1] (p1) in this process with sizes [5]"),
        "{}",
        errs[2]
    );
    assert!(
        errs[2].ends_with("of the same param in process 0."),
        "{}",
        errs[2]
    );
}

#[test]
fn a_dtype_or_count_mismatch_is_reported() {
    let errs = run(2, |w, rank| {
        let pg = w.world_group().unwrap();
        let dt = if rank == 1 { DType::F64 } else { DType::F32 };
        let ps = [Tensor::zeros(dt, &[2])];
        verify_params_across_processes(&pg, &ps, &[], T)
            .unwrap_err()
            .to_string()
    });
    assert!(errs[0].contains("dtype torch.float32 appears not to match sizes [2] and dtype torch.float64 of the same param in process 1."), "{}", errs[0]);
    let errs = run(2, |w, rank| {
        let pg = w.world_group().unwrap();
        let ps: Vec<Tensor> = (0..2 + rank)
            .map(|_| Tensor::zeros(DType::F32, &[2]))
            .collect();
        verify_params_across_processes(&pg, &ps, &[], T)
            .unwrap_err()
            .to_string()
    });
    assert_eq!(
        errs[1],
        "DDP expects same model across all ranks, but Rank 1 has 3 params, while rank 0 has inconsistent 2 params."
    );
}

#[test]
fn broadcast_coalesced_copies_rank_0s_values() {
    run(3, |w, rank| {
        let pg = w.world_group().unwrap();
        let r = rank as f32;
        let ts = vec![
            Tensor::from_vec_shaped(vec![r; 6], &[2, 3]).unwrap(),
            Tensor::from_vec(vec![rank as f64 + 0.5; 3]),
            Tensor::from_vec(vec![r + 1.0; 5]),
            Tensor::from_vec(vec![rank as i64; 2]),
        ];
        // 24 bytes: the first float32 tensor fills a buffer by itself.
        broadcast_coalesced(&pg, &ts, 24, 1, T).unwrap();
        assert_eq!(ts[0].to_vec::<f32>().unwrap(), vec![1.0; 6]);
        assert_eq!(ts[1].to_vec::<f64>().unwrap(), vec![1.5; 3]);
        assert_eq!(ts[2].to_vec::<f32>().unwrap(), vec![2.0; 5]);
        assert_eq!(ts[3].to_vec::<i64>().unwrap(), vec![1; 2]);
        assert!(broadcast_coalesced(&pg, &ts, 24, 3, T).is_err());
    });
}

/// Device parameters on a group whose only backend takes device tensors (`"cuda:gloo"`, as
/// `"nccl"`): the verification gathers and the initial sync packs on the parameters' device
/// (on-device copies counted by the fake device), and a mismatch is still named.
#[test]
fn device_parameters_are_verified_and_synced_on_their_device() {
    run_gloo_as(
        2,
        "cuda:gloo",
        |_| {},
        |w, rank| {
            let pg = w.world_group().unwrap();
            let v = |n: usize, k: usize| -> Vec<f32> {
                (0..n).map(|i| (rank * 100 + k * 10 + i) as f32).collect()
            };
            let ps = vec![
                HostBackedDevice::tensor(&v(12, 0), &[4, 3], 0),
                HostBackedDevice::tensor(&[rank as f64 + 0.5; 5], &[5], 0),
                HostBackedDevice::tensor(&v(4, 2), &[2, 2], 0),
            ];
            verify_params_across_processes(&pg, &ps, &names(3), T).unwrap();
            broadcast_coalesced(&pg, &ps, 16, 0, T).unwrap();
            let rank0 =
                |n: usize, k: usize| -> Vec<f32> { (0..n).map(|i| (k * 10 + i) as f32).collect() };
            assert_eq!(ps[0].to_vec::<f32>().unwrap(), rank0(12, 0));
            assert_eq!(ps[1].to_vec::<f64>().unwrap(), vec![0.5; 5]);
            assert_eq!(ps[2].to_vec::<f32>().unwrap(), rank0(4, 2));
            assert!(
                HostBackedDevice::device_ops(&ps[0]).unwrap() > 0,
                "packed on the device"
            );
            let odd = HostBackedDevice::zeros(DType::F32, &[4 + rank, 3], 0);
            let e = verify_params_across_processes(&pg, &[odd], &names(1), T).unwrap_err();
            assert!(e.to_string().contains("params[0] (p0)"), "{e}");
        },
    );
}
