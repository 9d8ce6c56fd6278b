//! Two "hosts" on this machine for tests: network namespaces joined by a veth pair `v0`/`v1`,
//! with private addresses `10.231.<subnet>.1` / `.2` that exist only inside them. Nothing is
//! routed anywhere else. Needs root and `ip netns`; removed on drop.

use std::process::Command;

/// Runs `ip args`; the error carries ip's stderr.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
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

/// Two namespaces `c10d-<tag>-<pid>-{a,b}` joined by veth `v0` (in a) / `v1` (in b).
pub struct Hosts {
    /// The two namespaces (a, b).
    pub names: [String; 2],
    subnet: u8,
}

impl Hosts {
    /// Makes the pair, `tag` naming the test (namespaces of tests running at once differ) and
    /// `subnet` its private /24.
    ///
    /// # Errors
    /// "not root", or the failing `ip` command; what was made is removed again.
    pub fn new(tag: &str, subnet: u8) -> Result<Hosts, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        let id = std::process::id();
        let mut h = Hosts {
            names: [String::new(), String::new()],
            subnet,
        };
        for (i, side) in ["a", "b"].iter().enumerate() {
            let n = format!("c10d-{tag}-{id}-{side}");
            ip(&["netns", "add", &n])?;
            h.names[i] = n;
        }
        let [a, b] = &h.names;
        ip(&[
            "link", "add", "v0", "netns", a, "type", "veth", "peer", "name", "v1", "netns", b,
        ])?;
        for (i, n) in h.names.iter().enumerate() {
            let dev = format!("v{i}");
            ip(&[
                "-n",
                n,
                "addr",
                "add",
                &format!("{}/24", h.addr(i)),
                "dev",
                &dev,
            ])?;
            ip(&["-n", n, "link", "set", "lo", "up"])?;
            ip(&["-n", n, "link", "set", &dev, "up"])?;
        }
        Ok(h)
    }

    /// [`Hosts::new`], or `None` after printing why the caller skips (not root, no `ip netns`).
    #[allow(dead_code)]
    pub fn or_skip(tag: &str, subnet: u8) -> Option<Hosts> {
        match Hosts::new(tag, subnet) {
            Ok(h) => Some(h),
            Err(why) => {
                println!("skipped: cannot make network namespaces ({why})");
                None
            }
        }
    }

    /// `program` run on host `h` as rank `rank` of an env:// job of `world` ranks,
    /// `local_world` per host, whose store listens on host 0's address at `port` (a fixed port
    /// is safe there: the namespace exists only for its test). Output piped.
    #[allow(dead_code)]
    pub fn rank_command(
        &self,
        h: usize,
        program: &str,
        rank: usize,
        world: usize,
        local_world: usize,
        port: u16,
    ) -> std::process::Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.names[h], program])
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", (rank % local_world).to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_WORLD_SIZE", local_world.to_string())
            .env("MASTER_ADDR", self.addr(0))
            .env("MASTER_PORT", port.to_string())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c
    }

    /// The address of host `i` (0 or 1) on the veth link.
    pub fn addr(&self, i: usize) -> String {
        format!("10.231.{}.{}", self.subnet, i + 1)
    }

    /// Takes the link down on both ends (not every test that shares this module does).
    ///
    /// # Errors
    /// The failing `ip` command.
    #[allow(dead_code)]
    pub fn link_down(&self) -> Result<(), String> {
        for (i, n) in self.names.iter().enumerate() {
            ip(&["-n", n, "link", "set", &format!("v{i}"), "down"])?;
        }
        Ok(())
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for n in self.names.iter().filter(|n| !n.is_empty()) {
            let _ = ip(&["netns", "del", n]);
        }
    }
}

/// `n` hosts on one switch: namespaces `c10d-<tag>-<pid>-h<i>`, each with a veth `e<i>` whose
/// peer sits on a bridge in namespace `c10d-<tag>-<pid>-sw`, addresses `10.231.<subnet>.<i+1>`
/// that exist only inside them. Needs root and `ip netns`; removed on drop. Hosts can be cut
/// off one by one ([`Lan::unplug`]).
pub struct Lan {
    /// The hosts' namespaces, in order (not the switch's).
    pub names: Vec<String>,
    switch: String,
    subnet: u8,
}

#[allow(dead_code)]
impl Lan {
    /// Makes the switch and `n` hosts; `tag` names the test, `subnet` its private /24.
    ///
    /// # Errors
    /// "not root", or the failing `ip` command; what was made is removed again.
    pub fn new(tag: &str, subnet: u8, n: usize) -> Result<Lan, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        let id = std::process::id();
        let mut lan = Lan {
            names: Vec::new(),
            switch: format!("c10d-{tag}-{id}-sw"),
            subnet,
        };
        ip(&["netns", "add", &lan.switch])?;
        let sw = lan.switch.clone();
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        for i in 0..n {
            let h = format!("c10d-{tag}-{id}-h{i}");
            ip(&["netns", "add", &h])?;
            lan.names.push(h.clone());
            let (e, p) = (format!("e{i}"), format!("p{i}"));
            ip(&[
                "link", "add", &e, "netns", &h, "type", "veth", "peer", "name", &p, "netns", &sw,
            ])?;
            ip(&["-n", &sw, "link", "set", &p, "master", "br0"])?;
            ip(&["-n", &sw, "link", "set", &p, "up"])?;
            let addr = format!("{}/24", lan.addr(i));
            ip(&["-n", &h, "addr", "add", &addr, "dev", &e])?;
            ip(&["-n", &h, "link", "set", "lo", "up"])?;
            ip(&["-n", &h, "link", "set", &e, "up"])?;
        }
        Ok(lan)
    }

    /// [`Lan::new`], or `None` after printing why the caller skips.
    pub fn or_skip(tag: &str, subnet: u8, n: usize) -> Option<Lan> {
        match Lan::new(tag, subnet, n) {
            Ok(l) => Some(l),
            Err(why) => {
                println!("skipped: cannot make network namespaces ({why})");
                None
            }
        }
    }

    /// The address of host `i`.
    pub fn addr(&self, i: usize) -> String {
        format!("10.231.{}.{}", self.subnet, i + 1)
    }

    /// Cuts host `i` off the switch.
    ///
    /// # Errors
    /// The failing `ip` command.
    pub fn unplug(&self, i: usize) -> Result<(), String> {
        ip(&["-n", &self.switch, "link", "set", &format!("p{i}"), "down"])
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for n in self.names.iter().chain([&self.switch]) {
            let _ = ip(&["netns", "del", n]);
        }
    }
}
