//! Files mounted from Secrets, read again while the process runs (issue 28): the API's
//! certificate and key, the tokens file. Every `server.reload_interval` the files are read
//! through their paths (so the atomic `..data` symlink swap Kubernetes does in a Secret volume is
//! seen like any other change; nothing relies on file notifications) and, when the bytes differ
//! from what is in use, handed to an `apply` that parses and checks them. What cannot be read,
//! parsed or checked is never used: the previous contents stay, a WARN names the file, and the
//! failure is counted. The task never exits on its own and never panics.
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::time::Duration;

/// A refusal of new contents: the file it concerns (for the WARN) and why, in words that never
/// quote the file's text.
#[derive(Debug)]
pub struct Refused {
    pub file: PathBuf,
    pub reason: String,
}

/// Parses and takes new contents (in the order of the watch's paths), or refuses them.
pub type Apply<'a> = dyn FnMut(&[Vec<u8>]) -> Result<(), Refused> + Send + 'a;

/// What a poll did (tests and the log).
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Same bytes as in use, or as the last refused ones.
    Unchanged,
    /// The files changed between two reads of one poll (a rotation under way): next poll.
    InMotion,
    Applied,
    Refused,
}

/// One set of files watched together (a certificate and its key change as a pair).
pub struct Watch {
    /// What the log lines call it: `api_certificate`, `api_tokens`.
    pub what: &'static str,
    pub paths: Vec<PathBuf>,
    /// Digest of the contents in use (the ones read at start, then each applied one).
    in_use: [u8; 32],
    /// Digest of the contents last refused, or the last read error, so that one broken state
    /// logs one WARN and counts one failure, not one per poll.
    last_refused: Option<Result<[u8; 32], String>>,
}

/// Longest a poll waits for the file system (a hung network mount must not stop the loop).
const READ_TIMEOUT: Duration = Duration::from_secs(10);

fn digest(contents: &[Vec<u8>]) -> [u8; 32] {
    let mut h = Sha256::new();
    for c in contents {
        h.update((c.len() as u64).to_be_bytes());
        h.update(c);
    }
    h.finalize().into()
}

/// Every file's bytes, or the first file that cannot be read.
async fn read_all(paths: &[PathBuf]) -> Result<Vec<Vec<u8>>, Refused> {
    let mut out = Vec::with_capacity(paths.len());
    for p in paths {
        let read = tokio::time::timeout(READ_TIMEOUT, tokio::fs::read(p)).await;
        match read {
            Ok(Ok(bytes)) => out.push(bytes),
            Ok(Err(e)) => {
                return Err(Refused {
                    file: p.clone(),
                    reason: format!("cannot be read: {e}"),
                });
            }
            Err(_) => {
                return Err(Refused {
                    file: p.clone(),
                    reason: format!("cannot be read: no answer in {READ_TIMEOUT:?}"),
                });
            }
        }
    }
    Ok(out)
}

impl Watch {
    /// `initial` is what the process loaded at start, in the order of `paths`.
    pub fn new(what: &'static str, paths: Vec<PathBuf>, initial: &[Vec<u8>]) -> Watch {
        Watch {
            what,
            paths,
            in_use: digest(initial),
            last_refused: None,
        }
    }

    /// Reads the files (twice: a pair caught half-swapped waits for the next poll) and applies
    /// new contents. `apply` gets the bytes in the order of `paths`; `refused` is called once per
    /// new refusal (the metric).
    pub async fn poll(
        &mut self,
        apply: &mut Apply<'_>,
        refused: &(dyn Fn() + Send + Sync),
    ) -> Outcome {
        let first = match read_all(&self.paths).await {
            Ok(c) => c,
            Err(r) => return self.refuse(Err(r.reason.clone()), r, refused),
        };
        let d = digest(&first);
        if d == self.in_use {
            // Back to the contents in use (a broken rotation undone): nothing to do, and a later
            // break is news again.
            self.last_refused = None;
            return Outcome::Unchanged;
        }
        if self.last_refused == Some(Ok(d)) {
            return Outcome::Unchanged;
        }
        match read_all(&self.paths).await {
            Ok(second) if digest(&second) == d => {}
            _ => return Outcome::InMotion,
        }
        // A panic in a parser must not end the watch: it counts as a refusal.
        let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| apply(&first)))
            .unwrap_or_else(|_| {
                Err(Refused {
                    file: self.paths.first().cloned().unwrap_or_default(),
                    reason: "could not be loaded (the parser panicked)".to_string(),
                })
            });
        match applied {
            Ok(()) => {
                self.in_use = d;
                self.last_refused = None;
                tracing::info!(event = "secret_reloaded", what = self.what, files = ?self.paths, "new contents of mounted files are in use");
                Outcome::Applied
            }
            Err(r) => self.refuse(Ok(d), r, refused),
        }
    }

    fn refuse(
        &mut self,
        key: Result<[u8; 32], String>,
        r: Refused,
        refused: &(dyn Fn() + Send + Sync),
    ) -> Outcome {
        if self.last_refused.as_ref() == Some(&key) {
            return Outcome::Unchanged;
        }
        self.last_refused = Some(key);
        refused();
        tracing::warn!(
            event = "secret_reload_refused",
            what = self.what,
            file = %r.file.display(),
            reason = %r.reason,
            "{} {}: the previous contents stay in use",
            r.file.display(),
            r.reason
        );
        Outcome::Refused
    }

    /// Polls every `interval` for as long as the returned task lives (abort it to stop).
    pub fn spawn(
        mut self,
        interval: Duration,
        mut apply: impl FnMut(&[Vec<u8>]) -> Result<(), Refused> + Send + 'static,
        refused: impl Fn() + Send + Sync + 'static,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                self.poll(&mut apply, &refused).await;
            }
        })
    }
}

/// Aborts the tasks it holds when dropped (the watches live as long as the server).
#[derive(Default)]
pub struct Watches(pub Vec<tokio::task::JoinHandle<()>>);

impl Drop for Watches {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// One broken state is one refusal (one WARN, one count), however many polls see it; a
    /// return to the contents in use makes the next break news again.
    #[tokio::test]
    async fn a_broken_state_is_refused_once_and_good_contents_are_applied() {
        let dir = std::env::temp_dir().join(format!("lc-reload-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        std::fs::write(&path, "good-1").unwrap();
        let mut watch = Watch::new("test", vec![path.clone()], &[b"good-1".to_vec()]);
        let refusals = Arc::new(AtomicUsize::new(0));
        let counted = refusals.clone();
        let refused = move || {
            counted.fetch_add(1, Ordering::Relaxed);
        };
        let mut applied = Vec::new();
        let mut apply = |files: &[Vec<u8>]| -> Result<(), Refused> {
            if files[0].starts_with(b"good") {
                applied.push(files[0].clone());
                Ok(())
            } else {
                Err(Refused {
                    file: PathBuf::from("f"),
                    reason: "bad".into(),
                })
            }
        };
        assert_eq!(watch.poll(&mut apply, &refused).await, Outcome::Unchanged);
        std::fs::write(&path, "bad").unwrap();
        assert_eq!(watch.poll(&mut apply, &refused).await, Outcome::Refused);
        assert_eq!(watch.poll(&mut apply, &refused).await, Outcome::Unchanged);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(watch.poll(&mut apply, &refused).await, Outcome::Refused);
        assert_eq!(watch.poll(&mut apply, &refused).await, Outcome::Unchanged);
        assert_eq!(refusals.load(Ordering::Relaxed), 2);
        std::fs::write(&path, "good-1").unwrap();
        assert_eq!(watch.poll(&mut apply, &refused).await, Outcome::Unchanged);
        std::fs::write(&path, "bad").unwrap();
        assert_eq!(watch.poll(&mut apply, &refused).await, Outcome::Refused);
        assert_eq!(refusals.load(Ordering::Relaxed), 3);
        std::fs::write(&path, "good-2").unwrap();
        assert_eq!(watch.poll(&mut apply, &refused).await, Outcome::Applied);
        assert_eq!(watch.poll(&mut apply, &refused).await, Outcome::Unchanged);
        assert_eq!(applied, vec![b"good-2".to_vec()]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
