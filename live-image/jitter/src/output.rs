//! Output files (`--json`, `--svg`, `--save-cyclictest`), opened before the
//! measurement so a bad path fails at once, not after minutes of cyclictest.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// An output opened for writing. One jitter created is removed again when
/// it is dropped unwritten (the run failed), so a failed run leaves no
/// empty report behind.
#[derive(Debug)]
pub struct OutputFile {
    path: PathBuf,
    file: File,
    created: bool,
    written: bool,
}

impl OutputFile {
    /// Opens `path` for writing, creating it if it does not exist. An
    /// existing file keeps its contents until [`OutputFile::write`].
    pub fn open(path: &Path) -> Result<OutputFile> {
        let (file, created) = match OpenOptions::new().write(true).create_new(true).open(path) {
            Ok(file) => (file, true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let file = OpenOptions::new()
                    .write(true)
                    .open(path)
                    .with_context(|| format!("cannot write {}", path.display()))?;
                (file, false)
            }
            Err(e) => return Err(e).with_context(|| format!("cannot write {}", path.display())),
        };
        Ok(OutputFile {
            path: path.to_path_buf(),
            file,
            created,
            written: false,
        })
    }

    /// Replaces the file's contents with `contents`.
    pub fn write(mut self, contents: &[u8]) -> Result<()> {
        self.written = true;
        let context = || format!("writing {}", self.path.display());
        // Only a regular file can be truncated; /dev/null and pipes cannot.
        if self.file.metadata().with_context(context)?.is_file() {
            self.file.set_len(0).with_context(context)?;
        }
        self.file.write_all(contents).with_context(context)?;
        self.file.flush().with_context(context)
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if self.created && !self.written {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_directory_fails_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let error = OutputFile::open(&dir.path().join("missing/report.json")).unwrap_err();
        assert!(format!("{error:#}").contains("missing/report.json"), "{error:#}");
        assert!(
            OutputFile::open(dir.path()).is_err(),
            "a directory is not an output"
        );
    }

    #[test]
    fn an_unwritten_new_file_is_removed_an_existing_one_kept() {
        let dir = tempfile::tempdir().unwrap();
        let new = dir.path().join("new.json");
        drop(OutputFile::open(&new).unwrap());
        assert!(!new.exists());
        let old = dir.path().join("old.json");
        std::fs::write(&old, "previous report").unwrap();
        drop(OutputFile::open(&old).unwrap());
        assert_eq!(std::fs::read_to_string(&old).unwrap(), "previous report");
    }

    #[test]
    fn write_replaces_the_contents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("report.json");
        std::fs::write(&path, "a much longer previous report").unwrap();
        OutputFile::open(&path).unwrap().write(b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        OutputFile::open(Path::new("/dev/null"))
            .unwrap()
            .write(b"x")
            .unwrap();
    }
}
