//! Weight sync between ranks (threads, one `World` each): rank 0 sends a small model's tensors,
//! the others receive them bit for bit, unpacked and packed (buffers smaller than a tensor, two
//! in flight), and a receiver expecting another model fails before any data moves.

use c10d_testing::world as world_common;

use c10d_core::{DType, Tensor};
use c10d_world::weight_sync::{ReceiveOptions, TensorSpec};
use world_common::*;

fn model() -> Vec<(String, Tensor)> {
    let w: Vec<f32> = (0..64 * 33).map(|i| (i as f32).sin()).collect();
    let b: Vec<c10d_core::half::bf16> = (0..64)
        .map(|i| c10d_core::half::bf16::from_f32(i as f32 / 7.0))
        .collect();
    let steps = vec![42i64];
    vec![
        (
            "fc.weight".into(),
            Tensor::from_vec_shaped(w, &[64, 33]).unwrap(),
        ),
        ("fc.bias".into(), Tensor::from_vec(b)),
        ("step".into(), Tensor::from_vec(steps)),
    ]
}

fn specs() -> Vec<TensorSpec> {
    model()
        .iter()
        .map(|(n, t)| TensorSpec {
            name: n.clone(),
            shape: t.shape().to_vec(),
            dtype: t.dtype(),
        })
        .collect()
}

fn bytes(t: &Tensor) -> Vec<u8> {
    t.read_bytes(|b| b.to_vec()).unwrap()
}

#[test]
fn receivers_get_the_senders_tensors_bit_for_bit() {
    let out = run(3, |w, r| {
        let mut got = Vec::new();
        // Unpacked; packed in two buffers; packed one tensor a buffer (three buffers, more than
        // the two in flight).
        for packed in [None, Some(1000), Some(100)] {
            let opts = ReceiveOptions {
                packed_buffer_bytes: packed,
                expected: Some(specs()),
                ..Default::default()
            };
            if r == 0 {
                w.send_weights(&model(), &opts).unwrap();
                w.send_weights(&model(), &opts).unwrap();
                continue;
            }
            let rec = w.receive_weights(&opts).unwrap();
            assert_eq!(rec.bytes, 64 * 33 * 4 + 64 * 2 + 8);
            got.push(
                rec.tensors
                    .iter()
                    .map(|(_, t)| bytes(t))
                    .collect::<Vec<_>>(),
            );
            // The next update lands in the tensors this one made.
            let mine: Vec<(String, Tensor)> = rec
                .tensors
                .iter()
                .map(|(s, t)| (s.name.clone(), t.clone()))
                .collect();
            mine.iter()
                .for_each(|(_, t)| t.write_bytes(|b| b.fill(0)).unwrap());
            w.receive_weights_into(&mine, &opts).unwrap();
            got.push(mine.iter().map(|(_, t)| bytes(t)).collect::<Vec<_>>());
        }
        got
    });
    let want: Vec<Vec<u8>> = model().iter().map(|(_, t)| bytes(t)).collect();
    for rank in &out[1..] {
        assert_eq!(rank.len(), 6);
        assert!(rank.iter().all(|mode| *mode == want));
    }
}

#[test]
fn an_unexpected_manifest_fails_before_any_data() {
    let out = run(2, |w, r| {
        let opts = ReceiveOptions::default();
        if r == 0 {
            // Only the manifest goes out: the receiver refuses it and nothing else is sent.
            let mut m = [vec![(
                "fc.weight".to_string(),
                vec![64i64, 33],
                "torch.float32".to_string(),
            )]];
            w.broadcast_object_list(&mut m).run().unwrap();
            return String::new();
        }
        let expected = Some(vec![TensorSpec {
            name: "fc.weight".into(),
            shape: vec![64, 32],
            dtype: DType::F32,
        }]);
        let e = w
            .receive_weights(&ReceiveOptions { expected, ..opts })
            .unwrap_err();
        e.to_string()
    });
    assert!(
        out[1].contains("tensor 0 of the manifest is fc.weight [64, 33]"),
        "{}",
        out[1]
    );
}
