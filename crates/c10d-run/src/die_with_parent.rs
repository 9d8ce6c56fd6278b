//! Child processes that never outlive their launcher (used by `c10drun` and `c10d-bench`).

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Makes the process `cmd` starts receive SIGKILL when the thread that spawned it dies
/// (Linux `PR_SET_PDEATHSIG`): spawn from the main thread, which lives until the launcher
/// exits, so that a killed launcher leaves no ranks behind.
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    // SAFETY: the closure runs in the forked child before exec and only makes the
    // async-signal-safe `prctl` syscall.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            );
            Ok(())
        })
    }
}
