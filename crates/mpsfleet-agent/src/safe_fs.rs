//! Reading, creating and removing files of the agent's data dir without following links.
//!
//! Below a directory the agent trusts (its tasks dir, a container's state dir) no path
//! component is followed when it is a symlink: every directory is opened with `O_NOFOLLOW`
//! relative to the one before it (`openat`), and files are opened the same way, so neither a
//! link in place of a file nor one in place of a directory leads out of it. The trusted root
//! itself is the operator's to choose and may be reached through links.

use nix::fcntl::{openat, OFlag};
use nix::sys::stat::Mode;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path};

/// A directory opened without following links, to open files in.
#[derive(Debug)]
pub struct Dir(OwnedFd);

fn errno(e: nix::Error) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

impl Dir {
    /// Opens `root` (links allowed: the operator's path), then each component of `rel` in turn
    /// without following links. `Ok(None)` when one of them does not exist; an error (`ELOOP`,
    /// `ENOTDIR`) when one is a link or not a directory. `rel` must be relative, without `..`.
    pub fn open_beneath(root: &Path, rel: &Path) -> io::Result<Option<Dir>> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let mut fd = match nix::fcntl::open(root, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(nix::Error::ENOENT) => return Ok(None),
            Err(e) => return Err(errno(e)),
        };
        for part in rel.components() {
            let Component::Normal(name) = part else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: only plain names may follow {}", rel.display(), root.display()),
                ));
            };
            fd = match openat(fd.as_fd(), name, flags | OFlag::O_NOFOLLOW, Mode::empty()) {
                Ok(next) => next,
                Err(nix::Error::ENOENT) => return Ok(None),
                Err(e) => return Err(errno(e)),
            };
        }
        Ok(Some(Dir(fd)))
    }

    /// Opens the file `name` of this directory for reading, without following a link and
    /// without blocking on a FIFO. `Ok(None)` when it does not exist; `ELOOP` for a link.
    pub fn open_file(&self, name: &str) -> io::Result<Option<File>> {
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        match openat(self.0.as_fd(), Path::new(name), flags, Mode::empty()) {
            Ok(fd) => Ok(Some(File::from(fd))),
            Err(nix::Error::ENOENT) => Ok(None),
            Err(e) => Err(errno(e)),
        }
    }

    /// Opens `name` and reads at most `max` bytes of it when it is a regular file with one
    /// link; `Ok(None)` when it does not exist.
    pub fn read_plain(&self, name: &str, max: u64) -> io::Result<Option<Vec<u8>>> {
        use std::io::Read;
        let Some(file) = self.open_file(name)? else { return Ok(None) };
        let meta = file.metadata()?;
        if !meta.file_type().is_file() || meta.nlink() != 1 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{name}: not a plain file")));
        }
        let mut out = Vec::new();
        file.take(max).read_to_end(&mut out)?;
        Ok(Some(out))
    }
}

/// Reads the file at `root`/`rel` (at most `max` bytes) without following a link below `root`,
/// when it is a regular file with one link; `Ok(None)` when it, or a directory on the way, does
/// not exist.
pub fn read_beneath(root: &Path, rel: &Path, max: u64) -> io::Result<Option<Vec<u8>>> {
    let (parent, name) = split(rel)?;
    match Dir::open_beneath(root, parent)? {
        Some(dir) => dir.read_plain(name, max),
        None => Ok(None),
    }
}

/// `rel` as its directory part and its last name.
pub fn split(rel: &Path) -> io::Result<(&Path, &str)> {
    let name = rel.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidInput, format!("{}: no file name", rel.display()))
    })?;
    Ok((rel.parent().unwrap_or(Path::new("")), name))
}

/// Creates the directory `path` (parents as needed, with `mode` too) and gives it `mode` whatever
/// it had, refusing a link or anything but a directory in its place.
pub fn private_dir(path: &Path, mode: u32) -> io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(mode).create(path)?;
    set_dir_mode(path, mode)
}

/// Gives the existing directory `path` the `mode` (a link in its place is refused, not
/// followed).
pub fn set_dir_mode(path: &Path, mode: u32) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.file_type().is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a directory (a link is not followed)", path.display()),
        ));
    }
    if meta.permissions().mode() & 0o7777 != mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Gives the existing file `path` the `mode` (a link in its place is refused, not followed).
pub fn set_file_mode(path: &Path, mode: u32) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if !meta.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file (a link is not followed)", path.display()),
        ));
    }
    if meta.permissions().mode() & 0o7777 != mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// Removes `path` and everything in it without following any link: a link in the tree (or in
/// place of `path`) is removed, never what it points to. Nothing there is fine.
/// (`std::fs::remove_dir_all` opens every directory relative to its parent with `O_NOFOLLOW`.)
pub fn remove_tree(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
        Ok(meta) if meta.file_type().is_dir() => match std::fs::remove_dir_all(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        },
        Ok(_) => std::fs::remove_file(path),
    }
}

/// Writes `bytes` to `path` whole or not at all, for the owner only (0600): a temporary file
/// beside it (`PATH.tmp`) is written and synced, then renamed over `path`. A leftover
/// temporary file, of another mode or a link, is removed rather than written through.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn links_below_the_root_are_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), b"s3cret").unwrap();
        std::fs::write(root.join("a/b/log"), b"mine").unwrap();
        assert_eq!(read_beneath(&root, Path::new("a/b/log"), 100).unwrap().unwrap(), b"mine");
        assert_eq!(read_beneath(&root, Path::new("a/b/none"), 100).unwrap(), None);
        assert_eq!(read_beneath(&root, Path::new("a/x/log"), 100).unwrap(), None);
        // A link in place of a directory component.
        symlink(&outside, root.join("a/c")).unwrap();
        let err = read_beneath(&root, Path::new("a/c/secret"), 100).unwrap_err();
        // O_NOFOLLOW with O_DIRECTORY on a link: ENOTDIR.
        assert_eq!(err.raw_os_error(), Some(nix::libc::ENOTDIR), "{err}");
        // A link in place of the file, and a hard link.
        symlink(outside.join("secret"), root.join("a/b/link")).unwrap();
        let err = read_beneath(&root, Path::new("a/b/link"), 100).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(nix::libc::ELOOP), "{err}");
        std::fs::hard_link(outside.join("secret"), root.join("a/b/hard")).unwrap();
        assert!(read_beneath(&root, Path::new("a/b/hard"), 100).is_err());
        assert!(Dir::open_beneath(&root, Path::new("a/../a")).is_err());
        // The root itself may be a link (the operator's path).
        symlink(&root, tmp.path().join("via")).unwrap();
        assert!(read_beneath(&tmp.path().join("via"), Path::new("a/b/log"), 100).unwrap().is_some());
    }

    #[test]
    fn removal_does_not_follow_links() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"x").unwrap();
        let tree = tmp.path().join("tree");
        std::fs::create_dir_all(tree.join("sub")).unwrap();
        symlink(&outside, tree.join("sub/link")).unwrap();
        symlink(outside.join("keep"), tree.join("file-link")).unwrap();
        remove_tree(&tree).unwrap();
        assert!(!tree.exists());
        assert!(outside.join("keep").exists(), "followed a link while removing");
        // A link in place of the tree: the link goes, not its target.
        symlink(&outside, &tree).unwrap();
        remove_tree(&tree).unwrap();
        assert!(std::fs::symlink_metadata(&tree).is_err());
        assert!(outside.join("keep").exists());
        remove_tree(&tree).unwrap();
    }

    #[test]
    fn modes_are_set_on_directories_and_files_not_links() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("d/e");
        private_dir(&dir, 0o700).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777, 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&dir, 0o700).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777, 0o700);
        let file = dir.join("f");
        std::fs::write(&file, b"x").unwrap();
        set_file_mode(&file, 0o600).unwrap();
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o7777, 0o600);
        symlink(&file, dir.join("l")).unwrap();
        assert!(set_file_mode(&dir.join("l"), 0o644).is_err());
        assert!(set_dir_mode(&dir.join("l"), 0o755).is_err());
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o7777, 0o600);
    }
}
