//! The panic hook installed by `init_process_group`: panic messages get a `[rank{N}]: ` prefix
//! on every line, like PyTorch's `_distributed_excepthook`.
//!
//! The rank is taken from the panicking thread when a [`crate::World`] was initialised on it
//! (tests run ranks as threads), else from the process's last `init_process_group`.

use std::cell::Cell;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Once;

static PROCESS_RANK: AtomicI64 = AtomicI64::new(-1);

thread_local! {
    static THREAD_RANK: Cell<i64> = const { Cell::new(-1) };
}

/// Records `rank` for this thread and the process and installs the hook once.
pub(crate) fn install(rank: usize) {
    PROCESS_RANK.store(rank as i64, Ordering::SeqCst);
    THREAD_RANK.with(|r| r.set(rank as i64));
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let rank = THREAD_RANK.with(|r| r.get());
            let rank = if rank >= 0 {
                rank
            } else {
                PROCESS_RANK.load(Ordering::SeqCst)
            };
            if rank < 0 {
                prev(info);
                return;
            }
            let text = format_panic(info);
            eprint!("{}", prefix_lines(rank as usize, &text));
        }));
    });
}

fn format_panic(info: &std::panic::PanicHookInfo<'_>) -> String {
    let msg = if let Some(s) = info.payload().downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = info.payload().downcast_ref::<String>() {
        s.clone()
    } else {
        "Box<dyn Any>".to_string()
    };
    let thread = std::thread::current();
    let name = thread.name().unwrap_or("<unnamed>");
    match info.location() {
        Some(l) => format!(
            "thread '{name}' panicked at {}:{}:{}:\n{msg}\n",
            l.file(),
            l.line(),
            l.column()
        ),
        None => format!("thread '{name}' panicked:\n{msg}\n"),
    }
}

/// Prefixes every non-empty line with `[rank{N}]: ` (empty lines stay empty, as PyTorch does).
pub fn prefix_lines(rank: usize, text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        if !line.is_empty() {
            out.push_str(&format!("[rank{rank}]: {line}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn prefixes_each_line() {
        assert_eq!(super::prefix_lines(3, "a\nb\n"), "[rank3]: a\n[rank3]: b\n");
    }
}
