//! TORCHELASTIC_USE_AGENT_STORE: a master whose bind fails becomes a client of the agent's store
//! when MASTER_PORT names that port (own test binary: it changes the process environment).

use c10d_core::ErrorKind;
use c10d_store::{ServerOptions, Store, TcpStore, TcpStoreOptions, TcpStoreServer};
use std::time::Duration;

#[test]
fn agent_store_fallback() {
    let agent = TcpStoreServer::bind(ServerOptions::default()).unwrap();
    let port = agent.port();
    let opts = TcpStoreOptions {
        is_master: true,
        timeout: Duration::from_secs(30),
        ..Default::default()
    };
    // Without the env: a plain bind failure.
    std::env::remove_var("TORCHELASTIC_USE_AGENT_STORE");
    assert_eq!(
        TcpStore::new("127.0.0.1", port, opts.clone())
            .unwrap_err()
            .kind(),
        ErrorKind::Network
    );
    std::env::set_var("TORCHELASTIC_USE_AGENT_STORE", "True");
    std::env::set_var("MASTER_PORT", (port.wrapping_add(1)).to_string());
    assert_eq!(
        TcpStore::new("127.0.0.1", port, opts.clone())
            .unwrap_err()
            .kind(),
        ErrorKind::Network
    );
    std::env::set_var("MASTER_PORT", port.to_string());
    let s = TcpStore::new("127.0.0.1", port, opts.clone()).unwrap();
    assert!(!s.is_master());
    s.set("k", b"v").unwrap();
    std::env::set_var("TORCHELASTIC_USE_AGENT_STORE", "1");
    let s2 = TcpStore::new("127.0.0.1", port, opts).unwrap();
    assert_eq!(s2.get("k").unwrap(), b"v");
}
