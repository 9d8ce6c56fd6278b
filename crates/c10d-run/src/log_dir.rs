//! Where the worker logs and error files go (`--log-dir` or a temporary directory).

use crate::cli::Config;
use std::path::PathBuf;

/// Where the worker logs and error files go: `--log-dir` (kept) or a temporary directory.
pub(crate) struct LogDir {
    job: PathBuf,
    temporary: bool,
}

impl LogDir {
    pub(crate) fn new(cfg: &Config) -> Result<LogDir, String> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let (base, temporary) = match &cfg.log_dir {
            Some(d) => (d.clone(), false),
            None => (std::env::temp_dir(), true),
        };
        let name = if temporary {
            format!("c10drun-{}-{}-{nanos:08x}", cfg.run_id, std::process::id())
        } else {
            format!("{}_{}_{nanos:08x}", cfg.run_id, std::process::id())
        };
        let job = base.join(name);
        std::fs::create_dir_all(&job)
            .map_err(|e| format!("cannot create the log directory {}: {e}", job.display()))?;
        Ok(LogDir { job, temporary })
    }
    /// The directory of `attempt` (made).
    pub(crate) fn attempt(&self, attempt: u32) -> Result<PathBuf, String> {
        let d = self.job.join(format!("attempt_{attempt}"));
        std::fs::create_dir_all(&d)
            .map_err(|e| format!("cannot create the log directory {}: {e}", d.display()))?;
        Ok(d)
    }
    pub(crate) fn worker(&self, attempt: u32, local_rank: usize) -> Result<PathBuf, String> {
        let d = self
            .job
            .join(format!("attempt_{attempt}"))
            .join(local_rank.to_string());
        std::fs::create_dir_all(&d)
            .map_err(|e| format!("cannot create the log directory {}: {e}", d.display()))?;
        Ok(d)
    }
}

impl Drop for LogDir {
    fn drop(&mut self) {
        if self.temporary {
            let _ = std::fs::remove_dir_all(&self.job);
        }
    }
}
