//! The store the workers of each attempt rendezvous in.
//!
//! PyTorch's env:// (2.15) adds no per-attempt key prefix when
//! `TORCHELASTIC_USE_AGENT_STORE=True` (its comment: "a new TCPStore for every retry"), and
//! neither does c10d-world's. So the keys one attempt's workers wrote (gloo's addresses, group
//! counters, barriers) must be out of sight of the next attempt's, or a restarted worker reads a
//! dead peer's address and fails to connect. The first attempt's workers use the agent store
//! (`MASTER_PORT` = the store port, as torchrun's static rendezvous gives); each restart gets a
//! fresh, empty server on a free port of the hosting agent, whose port reaches the other nodes
//! under the attempt's key, set before the host joins that attempt's rendezvous (so it is there
//! once the rendezvous completes).

use crate::agent::{fail_text, AgentKeys, AgentStore};
use c10d_store::tcp::{ServerOptions, TcpStoreServer};
use c10d_store::Store;
use std::time::Duration;

/// Before the rendezvous of `attempt`: on the hosting agent of a restart, a fresh server,
/// its port published to the other nodes. `None` for the first attempt and on other nodes.
///
/// Errors: the server cannot bind; the agent store fails.
pub fn prepare(
    attempt: u32,
    hosting: bool,
    agent: Option<&mut AgentStore>,
    keys: &AgentKeys,
) -> Result<Option<TcpStoreServer>, String> {
    if attempt == 0 || !hosting {
        return Ok(None);
    }
    let server = TcpStoreServer::bind(ServerOptions {
        host: None,
        port: 0,
        world_size: None,
        ..Default::default()
    })
    .map_err(|e| format!("cannot host the store of attempt {attempt}: {e}"))?;
    if let Some(s) = agent {
        let (key, port) = (keys.worker_port(attempt), server.port().to_string());
        s.bounded("publish the workers' store", Duration::ZERO, move |st| {
            st.set(&key, port.as_bytes())
        })
        .map_err(|e| fail_text(&e))?;
    }
    Ok(Some(server))
}

/// After the rendezvous of `attempt`: the port its workers get as `MASTER_PORT` (the agent
/// store's `agent_port` for the first attempt; this agent's `fresh` server, or the port the
/// hosting agent published).
///
/// Errors: the agent store fails, or holds no valid port for the attempt.
pub fn port(
    attempt: u32,
    fresh: Option<&TcpStoreServer>,
    agent_port: u16,
    agent: &mut Option<AgentStore>,
    keys: &AgentKeys,
) -> Result<u16, String> {
    if attempt == 0 {
        return Ok(agent_port);
    }
    if let Some(server) = fresh {
        return Ok(server.port());
    }
    let Some(s) = agent.as_mut() else {
        return Ok(agent_port);
    };
    let key = keys.worker_port(attempt);
    let raw = s
        .bounded("read the workers' store", Duration::ZERO, move |st| {
            st.get(&key)
        })
        .map_err(|e| fail_text(&e))?;
    String::from_utf8_lossy(&raw)
        .parse()
        .map_err(|_| format!("the store holds no valid port for attempt {attempt}: {raw:?}"))
}
