//! A directory laid out as the kubelet lays out a Secret volume, for the rotation tests.
use std::path::PathBuf;

/// The files in a timestamped `..<time>` directory, `..data` pointing at it, and each key a
/// symlink through `..data`; removed when dropped.
pub struct SecretVolume {
    dir: PathBuf,
    generation: u32,
}

impl SecretVolume {
    pub fn new(name: &str, files: &[(&str, &str)]) -> SecretVolume {
        let dir = std::env::temp_dir().join(format!("lc-{name}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut v = SecretVolume { dir, generation: 0 };
        v.swap(files);
        for (file, _) in files {
            std::os::unix::fs::symlink(format!("..data/{file}"), v.dir.join(file)).unwrap();
        }
        v
    }

    /// The path a container reads `file` at (through `..data`).
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// The kubelet's atomic update: the new files in a new `..<timestamp>` directory, a
    /// `..data_tmp` link to it renamed over `..data`, the old directory removed.
    pub fn swap(&mut self, files: &[(&str, &str)]) {
        self.generation += 1;
        let old = std::fs::read_link(self.dir.join("..data")).ok();
        let new = format!(
            "..2026_12_03_00_00_{:02}.{:09}",
            self.generation, self.generation
        );
        std::fs::create_dir(self.dir.join(&new)).unwrap();
        for (file, text) in files {
            std::fs::write(self.dir.join(&new).join(file), text).unwrap();
        }
        let tmp = self.dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&new, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
        if let Some(old) = old {
            std::fs::remove_dir_all(self.dir.join(old)).unwrap();
        }
    }
}

impl Drop for SecretVolume {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
