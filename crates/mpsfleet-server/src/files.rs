//! The server's files in its data dir, written whole and with their modes: secrets (tokens)
//! for their owner only, public files (the CA bundle) through a temporary file, and the data
//! dir itself 0700 whatever it was before.

use std::io::Write as _;
use std::path::Path;

/// Writes a secret file readable by its owner only.
pub fn write_secret(path: &Path, secret: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    f.write_all(secret.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()
}

/// Writes `text` to `path` (0644) through a temporary file, so a reader never sees half of it.
pub(crate) fn write_public(path: &Path, text: &str) -> std::io::Result<()> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    restrict(&tmp, 0o644)?;
    std::fs::rename(&tmp, path)
}

/// Creates `dir` 0700, or makes an existing one 0700.
pub(crate) fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if !dir.is_dir() {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    }
    restrict(dir, 0o700)
}

/// Sets `path`'s mode to `mode` when it exists and has any other bit.
pub(crate) fn restrict(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Ok(m) if m.permissions().mode() & 0o777 != mode => {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        }
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}
