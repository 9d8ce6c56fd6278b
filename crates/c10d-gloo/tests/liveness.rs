//! Naming the silent rank when an op times out: liveness probes shortly before the deadline,
//! and the time-out note a rank leaves its peers before it goes away.

mod common;
use c10d_core::*;
use common::*;
use std::time::Duration;

fn err_text(r: Result<Work>) -> String {
    match r {
        Ok(w) => w.wait().expect_err("op should fail").to_string(),
        Err(e) => e.to_string(),
    }
}

fn all_reduce_with_timeout(pg: &c10d_gloo::ProcessGroupGloo, ms: u64) -> String {
    let t = Tensor::full(1.0f32, &[1 << 12]);
    err_text(pg.all_reduce(
        &[t],
        &AllreduceOptions {
            timeout: Some(Duration::from_millis(ms)),
            ..Default::default()
        },
    ))
}

#[test]
fn every_survivor_names_the_rank_that_does_not_answer() {
    // Rank 3 never enters the all_reduce (as if stopped): in a ring, ranks 1 and 2 get no data
    // from their healthy neighbours, yet all three must name rank 3.
    let res = run_world(4, opts(), |r, pg| {
        if r == 3 {
            std::thread::sleep(Duration::from_millis(1500));
            return String::new();
        }
        all_reduce_with_timeout(&pg, 400)
    });
    for (r, e) in res.iter().enumerate().take(3) {
        assert!(
            e.contains(&format!(
                "Timed out waiting 400ms for ALLREDUCE (seq 0) on rank {r}"
            )),
            "{e}"
        );
        // Ranks 0 and 2 are rank 3's ring neighbours (connected when the group was made) and
        // probe it; rank 1 needs rank 3 for this op's direct exchange, which never connects.
        let named = match r {
            1 => "; rank(s) 3 never connected to rank 1",
            _ => "; rank(s) 3 did not answer a liveness probe within 100ms",
        };
        assert!(e.contains(named), "rank {r}: {e}");
    }
}

#[test]
fn a_peer_that_left_after_its_time_out_is_explained_by_its_note() {
    // Rank 2 never enters the op. Rank 0 times out first, then goes away (abort, as a process
    // that exits on the error); rank 1, still waiting, loses rank 0 and must say what rank 0 had
    // reported: that rank 2 did not answer.
    let pgs = make_world(3, opts());
    let res = run_on(pgs, |r, pg| {
        // A first op sets the group's shared-memory segment up (a set-up that a time-out
        // abandons on every rank alike, whose error would race with rank 0's departure).
        let t = Tensor::full(1.0f32, &[1 << 12]);
        pg.all_reduce(std::slice::from_ref(&t), &AllreduceOptions::default())
            .unwrap()
            .wait()
            .unwrap();
        match r {
            0 => {
                let e = all_reduce_with_timeout(&pg, 400);
                pg.abort();
                e
            }
            1 => all_reduce_with_timeout(&pg, 20_000),
            _ => {
                std::thread::sleep(Duration::from_millis(1500));
                String::new()
            }
        }
    });
    assert!(res[0].contains("; rank(s) 2 did not answer"), "{}", res[0]);
    assert!(res[1].contains("connection to rank 0 lost"), "{}", res[1]);
    assert!(
        res[1].contains("before that, rank 0 had reported: ProcessGroupGloo (group 0): Timed out waiting 400ms for ALLREDUCE (seq 1) on rank 0"),
        "{}",
        res[1]
    );
    assert!(res[1].contains("rank(s) 2 did not answer"), "{}", res[1]);
}
