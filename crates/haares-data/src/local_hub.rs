//! A Hugging Face hub on 127.0.0.1, for tests: the `local-hub` feature, which only test builds
//! turn on (docs/data.md, "Testing downloads").
//!
//! It answers the requests `hf-hub`'s client makes the way huggingface.co answers them, wherever
//! the client depends on the answer:
//! - a revision's listing, `GET /api/datasets/<repo>/revision/<revision>`, with each file's size
//!   and LFS hash only when asked with `?blobs=true`, as the hub does;
//! - a file's resolution, `GET /datasets/<repo>/resolve/<revision>/<path>`: for a file stored with
//!   Git LFS, a redirect to the content carrying `X-Repo-Commit`, `X-Linked-Etag` and
//!   `X-Linked-Size`, as the hub sends an LFS file to its CDN; for a file stored in git itself
//!   ([`LocalHub::publish_in_git`]), the content at once with an `ETag` that is not its SHA-256
//!   and no linked headers; for a renamed repository ([`LocalHub::rename`]), a redirect with a
//!   relative `Location` to the new name;
//! - the content, `Range` requests answered `206 Partial Content` with `Content-Range`.
//!
//! The listing, the resolution and the content can each fail the way a hub or a network fails
//! ([`Fault`], [`LocalHub::fail_listing`]), and every request and every content byte is counted
//! ([`LocalHub::requests`], [`LocalHub::bytes_served`]), so a test can say what was fetched. The
//! routes are in `routes.rs`; the HTTP server is `tiny_http`, behind a pipe of bytes
//! (`pipe.rs`) that can cut a connection as a dropped network does. Files live in memory: this
//! serves tests, not data.

mod pipe;
mod routes;

use std::collections::{BTreeMap, HashSet};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use sha2::{Digest, Sha256};
use tiny_http::Server;

/// How the downloads of one file fail, until [`LocalHub::heal`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Its resolution answers this HTTP status (404, 500, …).
    Status(u16),
    /// Its content request (after the resolution's redirect) answers this HTTP status.
    ContentStatus(u16),
    /// Every connection that carries its content drops after this many bytes of it.
    Cut(usize),
    /// Its content stops after this many bytes and the connection waits, until the hub is
    /// healed or 60 s pass: a download in flight when its process is killed.
    Hold(usize),
    /// Its resolution says it is served from this commit (`X-Repo-Commit`), not the one asked
    /// for: a hub whose listing and resolution disagree.
    ServedFrom(String),
    /// It is served as if it had this many bytes (cut short or padded with zeros), while the
    /// listing keeps its true size and hash.
    Size(usize),
}

/// One request the hub received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    /// The path and query.
    pub url: String,
    /// The `Range` header, if any.
    pub range: Option<String>,
}

/// A file as the hub holds it.
#[derive(Debug, Clone)]
struct HubFile {
    bytes: Vec<u8>,
    /// What the listing says: the hash of the bytes when they were published.
    sha256: String,
    /// The ETag the resolution sends; it names the client's cached blob.
    etag: String,
    /// Stored with Git LFS (served through a redirect), or in git itself (served at once).
    lfs: bool,
}

/// The listing's answer while [`LocalHub::fail_listing`] holds: this status, so many more times.
#[derive(Debug, Clone, Copy)]
struct ListingFault {
    status: u16,
    remaining: usize,
}

#[derive(Default)]
struct State {
    /// `(repository, commit)` → files by repository path.
    revisions: BTreeMap<(String, String), BTreeMap<String, HubFile>>,
    /// `(repository, name)` → commit, for revisions asked for by a branch name.
    aliases: BTreeMap<(String, String), String>,
    /// Old repository name → new one.
    renamed: BTreeMap<String, String>,
    faults: BTreeMap<String, Fault>,
    listing_fault: Option<ListingFault>,
    requests: Vec<Logged>,
    bytes_served: u64,
}

/// The hub: started by [`LocalHub::start`], stopped when dropped.
pub struct LocalHub {
    endpoint: String,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    server: Arc<Server>,
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl LocalHub {
    /// Starts a hub with no repositories on a free port of 127.0.0.1.
    pub fn start() -> std::io::Result<Self> {
        let server = Arc::new(Server::http("127.0.0.1:0").map_err(std::io::Error::other)?);
        let upstream = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| std::io::Error::other("the hub's server has no IP address"))?;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let state: Arc<Mutex<State>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let cuts: Arc<Mutex<HashSet<SocketAddr>>> = Arc::default();
        {
            let (server, state, stop, cuts, endpoint) = (
                server.clone(),
                Arc::clone(&state),
                stop.clone(),
                cuts.clone(),
                endpoint.clone(),
            );
            std::thread::spawn(move || {
                for request in server.incoming_requests() {
                    let (state, stop, cuts) = (state.clone(), stop.clone(), cuts.clone());
                    let endpoint = endpoint.clone();
                    std::thread::spawn(move || {
                        let shared = routes::Shared {
                            endpoint: &endpoint,
                            state: &state,
                            stop: &stop,
                            cuts: &cuts,
                        };
                        routes::answer(request, &shared);
                    });
                }
            });
        }
        {
            let stop = stop.clone();
            std::thread::spawn(move || pipe::pipe(listener, upstream, cuts, &stop));
        }
        Ok(Self {
            endpoint,
            state,
            stop,
            server,
        })
    }

    /// The URL to give `hf-hub` (`HubOptions::endpoint`, or `HF_ENDPOINT` for a process).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Publishes a revision of dataset repository `repo` at `commit`, holding `files`, each
    /// stored with Git LFS (as the hub stores every Parquet file).
    pub fn publish(&self, repo: &str, commit: &str, files: Vec<(String, Vec<u8>)>) {
        let files = files
            .into_iter()
            .map(|(path, bytes)| {
                let sha256 = sha256_hex(&bytes);
                let file = HubFile {
                    etag: sha256.clone(),
                    bytes,
                    sha256,
                    lfs: true,
                };
                (path, file)
            })
            .collect();
        self.state()
            .revisions
            .insert((repo.into(), commit.into()), files);
    }

    /// Adds to a published revision a file stored in git itself, not with LFS: the listing gives
    /// its size and no hash, and its resolution answers with its content and an `ETag` of its own
    /// (the hub's is the git object id), which is not its SHA-256.
    ///
    /// # Panics
    /// If the revision was not published (a mistake in the test).
    pub fn publish_in_git(&self, repo: &str, commit: &str, path: &str, bytes: Vec<u8>) {
        let etag = sha256_hex(&[b"blob ".as_slice(), &bytes].concat())[..40].to_string();
        let file = HubFile {
            sha256: sha256_hex(&bytes),
            etag,
            bytes,
            lfs: false,
        };
        self.state()
            .revisions
            .get_mut(&(repo.to_string(), commit.to_string()))
            .expect("the test adds to a published revision")
            .insert(path.into(), file);
    }

    /// Points the branch `name` of `repo` (such as `main`) at `commit`.
    pub fn alias(&self, repo: &str, name: &str, commit: &str) {
        self.state()
            .aliases
            .insert((repo.into(), name.into()), commit.into());
    }

    /// Renames repository `old` to `new` (published under `new`): a file's resolution under the
    /// old name answers `307` with a relative `Location` under the new one, and the listing under
    /// the old name is served as the new one's, as the hub follows a renamed repository.
    pub fn rename(&self, old: &str, new: &str) {
        self.state().renamed.insert(old.into(), new.into());
    }

    /// Changes one file of a published revision, as a hub whose file changed under a commit:
    /// the listing gives the new size and hash, and the ETag stays the old one (so a client
    /// that resumes a partial download by ETag appends the new bytes to the old).
    ///
    /// # Panics
    /// If the revision or the file was not published (a mistake in the test).
    pub fn replace(&self, repo: &str, commit: &str, path: &str, bytes: Vec<u8>) {
        let mut state = self.state();
        let file = state
            .revisions
            .get_mut(&(repo.to_string(), commit.to_string()))
            .and_then(|files| files.get_mut(path))
            .expect("the test replaces a published file");
        file.sha256 = sha256_hex(&bytes);
        file.bytes = bytes;
    }

    /// Makes the downloads of the file at repository path `path` fail with `fault`.
    pub fn fail(&self, path: &str, fault: Fault) {
        self.state().faults.insert(path.into(), fault);
    }

    /// Makes every revision listing answer HTTP `status`, for the next `times` listings
    /// (`usize::MAX`: until [`LocalHub::heal`]).
    pub fn fail_listing(&self, status: u16, times: usize) {
        self.state().listing_fault = Some(ListingFault {
            status,
            remaining: times,
        });
    }

    /// Clears every fault and lets a held connection go on.
    pub fn heal(&self) {
        let mut state = self.state();
        state.faults.clear();
        state.listing_fault = None;
    }

    /// The requests received so far, in order.
    pub fn requests(&self) -> Vec<Logged> {
        self.state().requests.clone()
    }

    /// Forgets the requests received so far and the bytes served.
    pub fn clear_requests(&self) {
        let mut state = self.state();
        state.requests.clear();
        state.bytes_served = 0;
    }

    /// The bytes of file content the hub sent since it started (or since
    /// [`LocalHub::clear_requests`]): every response body of a content request, one-byte probes
    /// included, as far as it was handed to the connection.
    pub fn bytes_served(&self) -> u64 {
        self.state().bytes_served
    }
}

impl Drop for LocalHub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.server.unblock();
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panicking request thread leaves the state as consistent as any request does.
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
