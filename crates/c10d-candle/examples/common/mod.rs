//! What the candle examples share: joining the job on the device chosen at run time, and the
//! exit code of a run that checks its own results.

use c10d_core::Result;
use candle_core::Device;
use std::process::ExitCode;
use std::time::Duration;

/// `init_process_group` (env:// rendezvous, 60 s timeout) with the backend for the device
/// `C10D_CANDLE_DEVICE` chooses (`c10d_candle::device_and_backend_from_env`); the device.
///
/// # Errors
/// As `device_and_backend_from_env` and `init_process_group`.
pub fn init_on_chosen_device() -> Result<Device> {
    let (dev, backend) = c10d_candle::device_and_backend_from_env()?;
    c10d_world::init_process_group(c10d_world::InitOptions {
        backend: Some(backend),
        timeout: Some(Duration::from_secs(60)),
        ..Default::default()
    })?;
    Ok(dev)
}

/// Success when the run's checks passed; failure when they did not, or when it failed (the
/// error on stderr after `name`).
pub fn exit_code(name: &str, run: Result<bool>) -> ExitCode {
    match run {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}
