//! Two "hosts" on this machine: network namespaces joined by a veth pair, with private
//! addresses (10.231.0.1 and 10.231.0.2) that exist only inside them. Nothing is routed
//! anywhere else. Removed on drop; namespaces left behind by an earlier run that died are
//! removed when the next one starts.

use std::process::{Command, Stdio};

/// The prefix of every namespace the harness makes.
const PREFIX: &str = "c10d-chaos-";

/// Address of host `h` (0 or 1) on the veth link.
pub fn addr(h: usize) -> String {
    format!("10.231.0.{}", h + 1)
}

/// Runs `ip args`; the error carries ip's stderr.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Names of the namespaces that exist now.
pub fn list() -> Vec<String> {
    Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.split_whitespace().next().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Two namespaces `c10d-chaos-<pid>-{a,b}` joined by veth `v0` (in A) / `v1` (in B).
pub struct HostPair {
    pub names: [String; 2],
}

impl HostPair {
    /// Makes the pair (needs root and `ip netns`).
    ///
    /// # Errors
    /// The failing `ip` command and its message; whatever was made is removed again.
    pub fn new() -> Result<HostPair, String> {
        remove_stale();
        let id = std::process::id();
        let pair = HostPair {
            names: [format!("{PREFIX}{id}-a"), format!("{PREFIX}{id}-b")],
        };
        for n in &pair.names {
            ip(&["netns", "add", n])?;
        }
        let [a, b] = &pair.names;
        ip(&[
            "link", "add", "v0", "netns", a, "type", "veth", "peer", "name", "v1", "netns", b,
        ])?;
        for (h, n) in pair.names.iter().enumerate() {
            let dev = format!("v{h}");
            ip(&[
                "-n",
                n,
                "addr",
                "add",
                &format!("{}/24", addr(h)),
                "dev",
                &dev,
            ])?;
            ip(&["-n", n, "link", "set", "lo", "up"])?;
            ip(&["-n", n, "link", "set", &dev, "up"])?;
        }
        Ok(pair)
    }

    /// Takes the link down (`up == false`) or up again, on both ends.
    ///
    /// # Errors
    /// The failing `ip` command.
    pub fn set_link(&self, up: bool) -> Result<(), String> {
        let state = if up { "up" } else { "down" };
        for (h, n) in self.names.iter().enumerate() {
            ip(&["-n", n, "link", "set", &format!("v{h}"), state])?;
        }
        Ok(())
    }
}

impl Drop for HostPair {
    fn drop(&mut self) {
        for n in &self.names {
            if let Err(e) = ip(&["netns", "del", n]) {
                eprintln!("chaos: cannot remove namespace {n}: {e}");
            }
        }
    }
}

/// Removes namespaces of earlier runs whose harness process is gone.
fn remove_stale() {
    for n in list() {
        let Some(rest) = n.strip_prefix(PREFIX) else {
            continue;
        };
        let pid = rest.split('-').next().unwrap_or("");
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", &n]);
        }
    }
}

/// Whether namespaces can be made here (root and a working `ip netns`), or why not.
pub fn available() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("not root".into());
    }
    let probe = format!("{PREFIX}{}-probe", std::process::id());
    ip(&["netns", "add", &probe])?;
    ip(&["netns", "del", &probe])
}
