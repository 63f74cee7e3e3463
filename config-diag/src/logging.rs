//! The daemons' logging setup, one for both binaries (see [`init_logging`]).

/// Sets up logging at `default` level (`RUST_LOG` overrides). Under
/// systemd, stderr goes to the journal, which stamps every line with its
/// own time: a timestamp of ours would be a second, redundant one. There a
/// line is `<N>target: message`, `<N>` the syslog priority journald reads
/// as the line's level (`SyslogLevelPrefix=`, on by default), so
/// `journalctl -p warning` works. Under systemd means: `$JOURNAL_STREAM`
/// names our stderr (what systemd sets when it connects a unit's stderr
/// to the journal), or `$INVOCATION_ID` is set (a unit runs us).
pub fn init_logging(default: &str) {
    use std::io::Write as _;
    let mut b =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default));
    if under_systemd() {
        b.format(|buf, r| {
            let priority = match r.level() {
                log::Level::Error => 3,
                log::Level::Warn => 4,
                log::Level::Info => 6,
                log::Level::Debug | log::Level::Trace => 7,
            };
            writeln!(buf, "<{priority}>{}: {}", r.target(), r.args())
        });
    } else {
        b.format_timestamp_millis();
    }
    b.init();
}

/// Whether systemd runs us (see [`init_logging`]).
pub fn under_systemd() -> bool {
    if std::env::var_os("INVOCATION_ID").is_some() {
        return true;
    }
    let Some(stream) = std::env::var("JOURNAL_STREAM").ok() else {
        return false;
    };
    // "DEVICE:INODE" of the journal's socket; stderr may have been
    // redirected since (then it is not the journal).
    use std::os::unix::fs::MetadataExt as _;
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    stream == format!("{}:{}", meta.dev(), meta.ino())
}
