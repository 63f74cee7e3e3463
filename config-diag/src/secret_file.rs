//! Files that hold secrets (DH-HMAC-CHAP keys) must not be readable by
//! every user: a key anyone on the host can read authenticates anyone.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::ConfigError;

/// Refuses `path` when its permission bits let every user read it (`o+r`),
/// naming the file, its mode and the fix. `what` says what the file holds
/// ("holds DH-HMAC-CHAP secrets"). A file that cannot be inspected is an
/// error too: a secret whose exposure cannot be checked is not used.
pub fn refuse_world_readable(path: &Path, what: &str) -> Result<(), ConfigError> {
    let meta = std::fs::metadata(path)
        .map_err(|e| ConfigError::whole_file(path, format!("cannot inspect: {e}")))?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o004 != 0 {
        return Err(ConfigError::whole_file(
            path,
            format!(
                "{what} but is readable by every user (mode {mode:04o}); \
                 restrict it first, e.g. `chmod o-r {}` (or `chmod 600`)",
                path.display()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn world_readable_is_refused_and_named() {
        let dir = std::env::temp_dir().join(format!("secret-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("k.toml");
        std::fs::write(&f, "x").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = refuse_world_readable(&f, "holds DH-HMAC-CHAP secrets").unwrap_err();
        let text = e.to_string();
        assert!(text.contains("k.toml"), "{text}");
        assert!(
            text.contains("readable by every user (mode 0644)"),
            "{text}"
        );
        assert!(text.contains("chmod o-r"), "{text}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        refuse_world_readable(&f, "holds DH-HMAC-CHAP secrets").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        refuse_world_readable(&f, "holds DH-HMAC-CHAP secrets").unwrap();
        let e = refuse_world_readable(&dir.join("missing"), "holds secrets").unwrap_err();
        assert!(e.to_string().contains("cannot inspect"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
