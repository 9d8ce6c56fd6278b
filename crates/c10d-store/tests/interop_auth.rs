//! Interop: PyTorch's TCPStore client against a store that requires authentication is refused
//! (it cannot answer the challenge), and nothing it sent is applied. Needs `C10D_TORCH_PYTHON`.

use c10d_store::{AuthSecret, ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use c10d_testing::interop as interop_common;
use interop_common::*;
use std::process::{Command, Stdio};
use std::time::Duration;

#[test]
fn pytorch_client_is_refused_and_nothing_it_sent_is_applied() {
    let Some(py) = torch_python() else { return };
    let job = AuthSecret::from_bytes(b"0123456789abcdef-job").unwrap();
    let srv = TcpStoreServer::bind(ServerOptions {
        host: Some("127.0.0.1".into()),
        auth: Some(job.clone()),
        handshake_timeout: Duration::from_secs(2),
        ..Default::default()
    })
    .unwrap();
    let code = format!(
        "import datetime, torch.distributed as d\n\
         try:\n\
         \x20   s = d.TCPStore('127.0.0.1', {}, is_master=False, wait_for_workers=False, timeout=datetime.timedelta(seconds=5))\n\
         \x20   s.set('intruder', 'x')\n\
         \x20   print('ADMITTED')\n\
         except Exception as e:\n\
         \x20   print('REFUSED', type(e).__name__, e)\n",
        srv.port()
    );
    let child = Command::new(&py)
        .args(["-c", &code])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (_, out, err) = finish(Guard(child), Duration::from_secs(120));
    assert!(out.contains("REFUSED"), "stdout:\n{out}\nstderr:\n{err}");
    let good = TcpStore::new(
        "127.0.0.1",
        srv.port(),
        TcpStoreOptions {
            wait_for_workers: false,
            auth: Some(job),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!good.check(&["intruder"]).unwrap());
    assert_eq!(good.num_keys().unwrap(), 0);
}
