//! Shared memory that fits a container's `/dev/shm`: this test binary starts again inside a
//! private mount namespace (`unshare -m`) whose `/dev/shm` is a small tmpfs, and runs its ranks
//! there as threads over gloo.
//!
//! * A 64 MiB `/dev/shm` (Docker's default): a 3-D DeviceMesh (2, 2, 2) on 8 ranks runs a 1 KiB
//!   all_reduce along every dimension through shared memory (each group's
//!   `ProcessGroupGloo::shared_memory` verdict), every element checked. Before segments were
//!   reserved lazily and sized to the op, the mesh's groups asked for 128 MiB at connect time.
//! * A full `/dev/shm`: a 4-rank group falls back to sockets with exactly one warning naming
//!   `/dev/shm`, and its results are right.
//!
//! Needs root (a mount namespace and a tmpfs mount); elsewhere each test says it skipped and why.
//! With `C10D_SHM_FITS_FIGURE=1` the mesh test also prints the figure of the README's "Device
//! mesh creation" paragraph: `/dev/shm` bytes the mesh's segments take, and the 1 KiB
//! all_reduce time per dimension (run it once more with `C10D_GLOO_SHM=0` for sockets).

use c10d_core::{Backend, DeviceType, Tensor};
use c10d_gloo::{GlooOptions, ProcessGroupGloo};
use c10d_store::{HashStore, Store};
use c10d_world::{register_backend, BackendCreateArgs, InitOptions, World};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

const CHILD: &str = "C10D_SHM_FITS_CHILD";
/// Elements of a 1 KiB f32 tensor.
const ELEMS: usize = 256;

/// Every gloo group made in this process: (group name, rank, group).
type Groups = Mutex<Vec<(String, usize, Arc<ProcessGroupGloo>)>>;

fn groups() -> &'static Groups {
    static G: OnceLock<Groups> = OnceLock::new();
    G.get_or_init(Default::default)
}

/// Registers "shmgloo": plain gloo whose groups this test can ask for their shared-memory
/// verdict.
fn register() {
    let creator = Arc::new(|args: &BackendCreateArgs| {
        let o = GlooOptions::from_backend_options(&args.backend_options("gloo"));
        let pg = ProcessGroupGloo::new(args.store.clone(), args.group_rank, args.group_size, o)?;
        groups()
            .lock()
            .unwrap()
            .push((args.group_name.clone(), args.group_rank, pg.clone()));
        Ok(Some(pg as Arc<dyn Backend>))
    });
    register_backend("shmgloo", creator, Some(&[DeviceType::Cpu]), true);
}

/// The shared-memory verdict of this rank's group `name`.
fn verdict(name: &str, rank: usize) -> Option<bool> {
    let g = groups().lock().unwrap();
    let pg = g
        .iter()
        .find(|(n, r, _)| n == name && *r == rank)
        .unwrap_or_else(|| panic!("no gloo group {name} on rank {rank}"));
    pg.2.shared_memory()
}

/// Warnings logged in this process.
static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;
impl log::Log for Capture {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record<'_>) {
        if r.level() <= log::Level::Warn {
            eprintln!("{}: {}", r.level(), r.args());
            WARNINGS.lock().unwrap().push(r.args().to_string());
        }
    }
    fn flush(&self) {}
}

/// Size and used bytes of this namespace's `/dev/shm`.
fn dev_shm() -> (u64, u64) {
    // SAFETY: an all-zero statvfs is a valid value; the path is a valid C string and `st` is
    // writable.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::statvfs(c"/dev/shm".as_ptr(), &mut st) }, 0);
    let unit = st.f_frsize as u64;
    (
        st.f_blocks as u64 * unit,
        (st.f_blocks - st.f_bfree) as u64 * unit,
    )
}

/// Runs `f(world, rank)` on `n` rank threads over "shmgloo"; they meet in a store barrier
/// before tearing down.
fn run_ranks(n: usize, f: impl Fn(&World, usize) + Send + Sync + 'static) {
    register();
    let store: Arc<dyn Store> = Arc::new(HashStore::new());
    let f = Arc::new(f);
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let (store, f) = (store.clone(), f.clone());
            std::thread::spawn(move || {
                let w = World::new();
                w.init_process_group(InitOptions {
                    backend: Some("shmgloo".into()),
                    store: Some(store.clone()),
                    world_size: Some(n),
                    rank: Some(r),
                    timeout: Some(Duration::from_secs(15)),
                    ..Default::default()
                })
                .expect("init");
                f(&w, r);
                c10d_store::store_barrier(store.as_ref(), "end", n, Duration::from_secs(15))
                    .unwrap();
                w.destroy_process_group(None).unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

/// An all_reduce of `elems` f32 on `g`, every element checked (rank p gives p * 1000 + i).
fn reduce_checked(
    w: &World,
    g: &c10d_world::GroupMember,
    members: &[usize],
    me: usize,
    elems: usize,
) {
    let t = Tensor::from_vec(
        (0..elems)
            .map(|i| (me * 1000 + i) as f32)
            .collect::<Vec<_>>(),
    );
    w.all_reduce(&t).group(g).run().unwrap();
    let got = t.to_vec::<f32>().unwrap();
    for (i, v) in got.iter().enumerate() {
        let want: f32 = members.iter().map(|p| (p * 1000 + i) as f32).sum();
        assert_eq!(*v, want, "rank {me}, group {members:?}, element {i}");
    }
}

/// Child: the 3-D mesh under a 64 MiB /dev/shm.
fn mesh_child() {
    let figure = std::env::var_os("C10D_SHM_FITS_FIGURE").is_some();
    let sockets = std::env::var("C10D_GLOO_SHM").is_ok_and(|v| v.trim() == "0");
    let used0 = dev_shm().1;
    run_ranks(8, move |w, r| {
        let m = w
            .init_device_mesh("cpu", &[2, 2, 2], Some(&["a", "b", "c"]))
            .unwrap();
        for d in 0..3 {
            let g = m.get_group(d).unwrap();
            let members = w.get_process_group_ranks(g.group()).unwrap();
            reduce_checked(w, &g, &members, r, ELEMS);
            let name = g.group().unwrap().group_name().to_string();
            let grank = members.iter().position(|&p| p == r).unwrap();
            assert_eq!(
                verdict(&name, grank),
                Some(!sockets),
                "rank {r} dim {d}: shared memory"
            );
        }
        let world = c10d_world::GroupMember::Group(w.world_group().unwrap());
        reduce_checked(w, &world, &(0..8).collect::<Vec<_>>(), r, ELEMS);
        if figure {
            time_dims(w, &m, r);
        }
    });
    let (size, used) = dev_shm();
    println!(
        "SHMFITS mesh ok: /dev/shm {size} bytes, segments {} bytes",
        used - used0
    );
}

/// The figure: median 1 KiB all_reduce time per dimension, in rank 0's group of it (the other
/// groups wait: this machine's 2 cores cannot run 8 ranks at once; rank 0 prints).
fn time_dims(w: &World, m: &c10d_world::DeviceMesh, r: usize) {
    let t = Tensor::from_vec(vec![1f32; ELEMS]);
    for d in 0..3 {
        w.barrier().run().unwrap();
        let g = m.get_group(d).unwrap();
        let members = w.get_process_group_ranks(g.group()).unwrap();
        if !members.contains(&0) {
            continue;
        }
        let mut rounds = Vec::new();
        for _ in 0..7 {
            for _ in 0..200 {
                w.all_reduce(&t).group(&g).run().unwrap();
            }
            let s = Instant::now();
            for _ in 0..1000 {
                w.all_reduce(&t).group(&g).run().unwrap();
            }
            rounds.push(s.elapsed().as_secs_f64() / 1000.0 * 1e6);
        }
        rounds.sort_by(f64::total_cmp);
        if r == 0 {
            println!(
                "SHMFITS dim {d}: 1 KiB all_reduce {:.2} us (median of 7 rounds of 1000; {:.2}-{:.2})",
                rounds[3], rounds[0], rounds[6]
            );
        }
    }
}

/// Child: a full /dev/shm.
fn full_child() {
    use std::io::Write;
    let mut f = std::fs::File::create("/dev/shm/filler").unwrap();
    let chunk = vec![1u8; 64 << 10];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.flush();
    log::set_logger(&Capture).unwrap();
    log::set_max_level(log::LevelFilter::Warn);
    run_ranks(4, |w, r| {
        let world = c10d_world::GroupMember::Group(w.world_group().unwrap());
        let all: Vec<usize> = (0..4).collect();
        for elems in [ELEMS, 25_000, ELEMS] {
            reduce_checked(w, &world, &all, r, elems);
        }
        let name = world.group().unwrap().group_name().to_string();
        assert_eq!(verdict(&name, r), Some(false), "rank {r}: shared memory");
    });
    let warnings = WARNINGS.lock().unwrap();
    let shm: Vec<_> = warnings.iter().filter(|w| w.contains("/dev/shm")).collect();
    assert_eq!(shm.len(), 1, "one warning for the group: {warnings:?}");
    assert!(
        shm[0].contains(" free) has no room") && shm[0].contains("would fit"),
        "{}",
        shm[0]
    );
    println!("SHMFITS full ok: {}", shm[0]);
}

/// Runs this test again in a private mount namespace whose /dev/shm is a `size` tmpfs; `None`
/// (after saying why) where that cannot be done here.
fn in_namespace(test: &str, mode: &str, size: &str) -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("{test}: skipped: needs root for a private /dev/shm");
        return None;
    }
    let probe = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs -o size=1m tmpfs /dev/shm")
        .output();
    match probe {
        Err(e) => {
            println!("{test}: skipped: cannot run unshare: {e}");
            return None;
        }
        Ok(o) if !o.status.success() => {
            let why = String::from_utf8_lossy(&o.stderr);
            println!("{test}: skipped: no private /dev/shm here: {}", why.trim());
            return None;
        }
        Ok(_) => {}
    }
    let script = format!("mount -t tmpfs -o size={size} tmpfs /dev/shm && exec \"$0\" \"$@\"");
    let mut k = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while k.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = k.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = k.wait_with_output().unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{test} ({mode}) failed: {out}\n{err}");
    Some(out.into_owned())
}

/// The child's report lines (the test harness prints the test's name before the first).
fn reports(out: &str) -> Vec<&str> {
    out.lines()
        .filter_map(|l| l.find("SHMFITS").map(|i| &l[i..]))
        .collect()
}

#[test]
fn mesh_of_8_ranks_runs_every_dimension_on_shared_memory_in_64_mib() {
    match std::env::var(CHILD).as_deref() {
        Ok("mesh") => return mesh_child(),
        Ok(_) => return,
        Err(_) => {}
    }
    let test = "mesh_of_8_ranks_runs_every_dimension_on_shared_memory_in_64_mib";
    if let Some(out) = in_namespace(test, "mesh", "64m") {
        let lines = reports(&out);
        assert!(
            lines.iter().any(|l| l.starts_with("SHMFITS mesh ok")),
            "{out}"
        );
        for l in lines {
            println!("{l}");
        }
    }
}

#[test]
fn a_full_dev_shm_falls_back_to_sockets_with_one_warning() {
    match std::env::var(CHILD).as_deref() {
        Ok("full") => return full_child(),
        Ok(_) => return,
        Err(_) => {}
    }
    let test = "a_full_dev_shm_falls_back_to_sockets_with_one_warning";
    if let Some(out) = in_namespace(test, "full", "4m") {
        let lines = reports(&out);
        let line = lines.iter().find(|l| l.starts_with("SHMFITS full ok"));
        println!("{}", line.unwrap_or_else(|| panic!("{out}")));
    }
}
