//! The server's data dir is private whatever it was before: 0700, and the state files 0600.

use mpsfleet_core::clock::SystemClock;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn an_open_data_dir_and_its_state_are_made_private() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data");
    drop(mpsfleet_server::open(&dir, Arc::new(SystemClock)).expect("first open"));
    // As an older version, a copy or an umask may have left them.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = dir.join(mpsfleet_server::STATE_FILE);
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o644)).unwrap();
    let opened = mpsfleet_server::open(&dir, Arc::new(SystemClock)).expect("second open");
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&state), 0o600);
    for extra in ["-wal", "-shm"] {
        let p = dir.join(format!("{}{extra}", mpsfleet_server::STATE_FILE));
        if p.exists() {
            assert_eq!(mode(&p), 0o600, "{}", p.display());
        }
    }
    for token in [mpsfleet_server::ADMIN_TOKEN_FILE, mpsfleet_server::JOIN_TOKEN_FILE] {
        assert_eq!(mode(&dir.join(token)), 0o600, "{token}");
    }
    drop(opened);
}
