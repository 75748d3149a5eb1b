//! The runtime's own small records in its data directory: which image references were pulled
//! successfully (for the `once` pull behaviour) and when each was last used by a launch (for
//! image cleanup). One JSON file, written through a temporary file and a rename.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The file name inside the data directory.
pub const IMAGES_RECORD: &str = "images.json";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageRecord {
    /// A pull of this reference succeeded at least once.
    #[serde(default)]
    pub pulled: bool,
    /// The last launch that used it, milliseconds since the Unix epoch.
    #[serde(default)]
    pub last_used_ms: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRecords {
    #[serde(default)]
    pub images: BTreeMap<String, ImageRecord>,
}

impl ImageRecords {
    pub fn path(data_dir: &Path) -> PathBuf {
        data_dir.join(IMAGES_RECORD)
    }

    /// Reads the records; a missing or unreadable file is an empty record (the worst outcome
    /// is one more pull, or an image kept one more cycle).
    pub fn load(data_dir: &Path) -> ImageRecords {
        std::fs::read(Self::path(data_dir))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    pub fn save(&self, data_dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(data_dir)?;
        let path = Self::path(data_dir);
        let tmp = data_dir.join(format!("{IMAGES_RECORD}.tmp"));
        let bytes = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_missing_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(ImageRecords::load(dir.path()), ImageRecords::default());
        let mut r = ImageRecords::default();
        r.images.insert("busybox:latest".into(), ImageRecord { pulled: true, last_used_ms: 7 });
        r.save(&dir.path().join("sub")).expect("save");
        assert_eq!(ImageRecords::load(&dir.path().join("sub")), r);
        std::fs::write(dir.path().join(IMAGES_RECORD), b"not json").expect("write");
        assert_eq!(ImageRecords::load(dir.path()), ImageRecords::default());
    }
}
