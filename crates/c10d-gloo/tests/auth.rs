//! With `C10D_AUTH_SECRET_FILE` set, every connection of a group's mesh proves the job's secret
//! before its hello (`c10d_store::auth`): a stranger that reaches a rank's published address is
//! challenged, dropped when its answer is wrong, and the group's own ranks still connect and
//! reduce correctly. (This test binary sets the variable for its whole process: one test only.)

mod common;
use c10d_core::Tensor;
use c10d_gloo::ProcessGroupGloo;
use c10d_store::{HashStore, Store};
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

#[test]
fn a_stranger_is_dropped_and_the_members_connect() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secret");
    c10d_store::AuthSecret::create_file(&path).unwrap();
    std::env::set_var("C10D_AUTH_SECRET_FILE", &path);

    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let s0 = store.clone();
    let rank0 = std::thread::spawn(move || ProcessGroupGloo::new(s0, 0, 2, opts()).unwrap());
    store
        .wait_timeout(&["gloo/addr/0"], Duration::from_secs(30))
        .unwrap();
    let addr = String::from_utf8(store.get("gloo/addr/0").unwrap()).unwrap();

    // A stranger claiming to be a peer: challenged, answers wrongly, is dropped.
    let mut stranger = TcpStream::connect(&addr).unwrap();
    stranger
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut challenge = [0u8; c10d_store::auth::CHALLENGE_LEN];
    stranger.read_exact(&mut challenge).unwrap();
    assert_eq!(&challenge[..8], b"C10DAUTH");
    stranger
        .write_all(&[7u8; c10d_store::auth::ANSWER_LEN])
        .unwrap();
    let mut rest = Vec::new();
    let _ = stranger.read_to_end(&mut rest);
    assert!(rest.is_empty(), "the stranger got a reply: {rest:?}");

    let s1 = store.clone();
    let rank1 = std::thread::spawn(move || ProcessGroupGloo::new(s1, 1, 2, opts()).unwrap());
    let pgs = vec![rank0.join().unwrap(), rank1.join().unwrap()];
    let ts: Vec<Tensor> = (0..2)
        .map(|r| Tensor::from_vec(vec![(r + 1) as f32; 8]))
        .collect();
    all_reduce_each(&pgs, &ts);
    for t in &ts {
        assert_eq!(f32s(t), vec![3.0; 8]);
    }
}
