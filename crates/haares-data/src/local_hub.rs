//! A Hugging Face hub on 127.0.0.1, for tests: the `local-hub` feature, which only test builds
//! turn on (docs/data.md, "Testing downloads").
//!
//! It answers the requests `hf-hub`'s client makes the way huggingface.co answers them:
//! - a revision's listing, `GET /api/datasets/<repo>/revision/<revision>`, with each file's size
//!   and LFS hash (`?blobs=true`);
//! - a file's resolution, `GET /datasets/<repo>/resolve/<revision>/<path>`: a redirect to the
//!   content carrying `X-Repo-Commit` and `X-Linked-Etag`, as the hub sends an LFS file to its CDN;
//! - the content, `Range` requests answered `206 Partial Content` with `Content-Range`.
//!
//! A file can fail the way a hub or a network fails ([`Fault`]), and every request is logged
//! ([`LocalHub::requests`]), so a test can say what was fetched. The HTTP server is `tiny_http`;
//! a pipe of bytes sits in front of it, because an HTTP server keeps a connection open after a
//! short answer and only the pipe can cut it, as a dropped network does. Files live in memory:
//! this serves tests, not data.

use std::collections::{BTreeMap, HashSet};
use std::io::{Cursor, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tiny_http::{Header, Response, Server};

/// How the downloads of one file fail, until [`LocalHub::heal`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Its resolution answers this HTTP status (404, 500, …).
    Status(u16),
    /// Every connection that carries its content drops after this many bytes of it.
    Cut(usize),
    /// Its content stops after this many bytes and the connection waits, until the hub is
    /// healed or 60 s pass: a download in flight when its process is killed.
    Hold(usize),
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
}

#[derive(Default)]
struct State {
    /// `(repository, commit)` → files by repository path.
    revisions: BTreeMap<(String, String), BTreeMap<String, HubFile>>,
    /// `(repository, name)` → commit, for revisions asked for by a branch name.
    aliases: BTreeMap<(String, String), String>,
    faults: BTreeMap<String, Fault>,
    requests: Vec<Logged>,
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
                        answer(request, &endpoint, &state, &stop, &cuts);
                    });
                }
            });
        }
        {
            let stop = stop.clone();
            std::thread::spawn(move || pipe(listener, upstream, cuts, &stop));
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

    /// Publishes a revision of dataset repository `repo` at `commit`, holding `files`.
    pub fn publish(&self, repo: &str, commit: &str, files: Vec<(String, Vec<u8>)>) {
        let files = files
            .into_iter()
            .map(|(path, bytes)| {
                let sha256 = sha256_hex(&bytes);
                let etag = sha256.clone();
                (
                    path,
                    HubFile {
                        bytes,
                        sha256,
                        etag,
                    },
                )
            })
            .collect();
        self.state()
            .revisions
            .insert((repo.into(), commit.into()), files);
    }

    /// Points the branch `name` of `repo` (such as `main`) at `commit`.
    pub fn alias(&self, repo: &str, name: &str, commit: &str) {
        self.state()
            .aliases
            .insert((repo.into(), name.into()), commit.into());
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

    /// Clears every fault and lets a held connection go on.
    pub fn heal(&self) {
        self.state().faults.clear();
    }

    /// The requests received so far, in order.
    pub fn requests(&self) -> Vec<Logged> {
        self.state().requests.clone()
    }

    /// Forgets the requests received so far.
    pub fn clear_requests(&self) {
        self.state().requests.clear();
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

fn header(name: &str, value: &str) -> Header {
    Header::from_bytes(name.as_bytes(), value.as_bytes()).expect("ASCII header")
}

fn status(code: u16, message: &str) -> Response<Cursor<Vec<u8>>> {
    Response::from_string(format!("{{\"error\":\"{message}\"}}"))
        .with_status_code(code)
        .with_header(header("Content-Type", "application/json"))
}

/// The repository and the rest of a path below `/datasets/` or `/api/datasets/`, split at
/// `separator` (repository ids hold a slash, so the separator is what delimits them).
fn split_at<'a>(rest: &'a str, separator: &str) -> Option<(&'a str, &'a str)> {
    let at = rest.find(separator)?;
    Some((&rest[..at], &rest[at + separator.len()..]))
}

/// The byte range `start..end` a `Range: bytes=a-b` header asks of `size` bytes.
fn requested_range(range: Option<&str>, size: usize) -> Option<(usize, usize)> {
    let Some(range) = range else {
        return Some((0, size));
    };
    let (start, end) = range.strip_prefix("bytes=")?.split_once('-')?;
    let start: usize = start.parse().ok()?;
    let end = match end {
        "" => size,
        end => end.parse::<usize>().ok()?.saturating_add(1).min(size),
    };
    (start < end).then_some((start, end))
}

fn answer(
    request: tiny_http::Request,
    endpoint: &str,
    state: &Mutex<State>,
    stop: &AtomicBool,
    cuts: &Mutex<HashSet<SocketAddr>>,
) {
    let url = request.url().to_string();
    let range = request
        .headers()
        .iter()
        .find(|h| h.field.equiv("Range"))
        .map(|h| h.value.as_str().to_string());
    lock(state).requests.push(Logged {
        url: url.clone(),
        range: range.clone(),
    });
    let path = url
        .split('?')
        .next()
        .unwrap_or_default()
        .replace("%2F", "/");
    let peer = request.remote_addr().copied();
    let response = if let Some(rest) = path.strip_prefix("/api/datasets/") {
        listing(rest, state)
    } else if let Some(rest) = path.strip_prefix("/datasets/") {
        resolution(rest, endpoint, state)
    } else if let Some(rest) = path.strip_prefix("/cdn/") {
        return content(request, rest, range.as_deref(), state, stop, cuts, peer);
    } else {
        status(404, "no such route")
    };
    let _ = request.respond(response);
}

/// The commit a revision (a commit or a branch name) of `repo` stands for.
fn commit_of(state: &State, repo: &str, revision: &str) -> Option<String> {
    let key = (repo.to_string(), revision.to_string());
    if state.revisions.contains_key(&key) {
        return Some(revision.to_string());
    }
    state.aliases.get(&key).cloned()
}

fn listing(rest: &str, state: &Mutex<State>) -> Response<Cursor<Vec<u8>>> {
    let state = lock(state);
    let Some((repo, revision)) = split_at(rest, "/revision/") else {
        return status(404, "Repository not found");
    };
    let Some(commit) = commit_of(&state, repo, revision) else {
        return status(404, "Invalid rev id");
    };
    let files = &state.revisions[&(repo.to_string(), commit.clone())];
    let siblings: Vec<serde_json::Value> = files
        .iter()
        .map(|(path, file)| {
            serde_json::json!({
                "rfilename": path,
                "size": file.bytes.len(),
                "lfs": {"sha256": file.sha256, "size": file.bytes.len(), "pointerSize": 134},
            })
        })
        .collect();
    let body = serde_json::json!({"id": repo, "sha": commit, "siblings": siblings});
    Response::from_string(body.to_string()).with_header(header("Content-Type", "application/json"))
}

fn resolution(rest: &str, endpoint: &str, state: &Mutex<State>) -> Response<Cursor<Vec<u8>>> {
    let state = lock(state);
    let Some((repo, rest)) = split_at(rest, "/resolve/") else {
        return status(404, "Repository not found");
    };
    let Some((revision, file_path)) = rest.split_once('/') else {
        return status(404, "Entry not found");
    };
    if let Some(Fault::Status(code)) = state.faults.get(file_path) {
        return status(*code, "injected by the test");
    }
    let Some(commit) = commit_of(&state, repo, revision) else {
        return status(404, "Invalid rev id");
    };
    let Some(file) = state.revisions[&(repo.to_string(), commit.clone())].get(file_path) else {
        return status(404, "Entry not found");
    };
    Response::from_string("")
        .with_status_code(302)
        .with_header(header(
            "Location",
            &format!("{endpoint}/cdn/{repo}/{commit}/{file_path}"),
        ))
        .with_header(header("X-Repo-Commit", &commit))
        .with_header(header("X-Linked-Etag", &format!("\"{}\"", file.etag)))
        .with_header(header("X-Linked-Size", &file.bytes.len().to_string()))
}

/// Bytes that stop after `ready` and wait until the fault is healed (or 60 s pass).
struct Held<'a> {
    bytes: Cursor<Vec<u8>>,
    state: &'a Mutex<State>,
    stop: &'a AtomicBool,
    file_path: String,
}

impl Read for Held<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.bytes.read(buf)?;
        if read > 0 {
            return Ok(read);
        }
        let start = Instant::now();
        while matches!(
            lock(self.state).faults.get(&self.file_path),
            Some(Fault::Hold(_))
        ) && !self.stop.load(Ordering::Relaxed)
            && start.elapsed() < Duration::from_secs(60)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(std::io::Error::other("held connection released"))
    }
}

fn content(
    request: tiny_http::Request,
    rest: &str,
    range: Option<&str>,
    state: &Mutex<State>,
    stop: &AtomicBool,
    cuts: &Mutex<HashSet<SocketAddr>>,
    peer: Option<SocketAddr>,
) {
    let found = {
        let state = lock(state);
        state.revisions.iter().find_map(|((repo, commit), files)| {
            let file_path = rest.strip_prefix(&format!("{repo}/{commit}/"))?;
            let file = files.get(file_path)?;
            Some((
                file_path.to_string(),
                file.bytes.clone(),
                state.faults.get(file_path).cloned(),
            ))
        })
    };
    let Some((file_path, mut bytes, fault)) = found else {
        let _ = request.respond(status(404, "no such blob"));
        return;
    };
    if let Some(Fault::Size(size)) = fault {
        bytes.resize(size, 0);
    }
    let size = bytes.len();
    let Some((start, end)) = requested_range(range, size) else {
        let response = status(416, "Range Not Satisfiable")
            .with_header(header("Content-Range", &format!("bytes */{size}")));
        let _ = request.respond(response);
        return;
    };
    let probe = end - start == 1 && start == 0;
    let body = bytes[start..end].to_vec();
    let headers = vec![
        header(
            "Content-Range",
            &format!("bytes {start}-{}/{size}", end - 1),
        ),
        header("Accept-Ranges", "bytes"),
    ];
    let code = if range.is_some() { 206 } else { 200 };
    let length = body.len();
    // Identity encoding with a Content-Length, so that a body cut short is seen as cut.
    let respond = |reader: Box<dyn Read + Send>, request: tiny_http::Request| {
        let response = Response::new(code.into(), headers.clone(), reader, Some(length), None)
            .with_chunked_threshold(usize::MAX);
        let _ = request.respond(response);
    };
    match fault {
        Some(Fault::Cut(after)) if !probe => {
            let sent = body[..after.min(length)].to_vec();
            respond(Box::new(Cursor::new(sent)), request);
            if let Some(peer) = peer {
                cuts.lock().unwrap_or_else(|p| p.into_inner()).insert(peer);
            }
        }
        Some(Fault::Hold(after)) if !probe => {
            let held = Held {
                bytes: Cursor::new(body[..after.min(length)].to_vec()),
                state,
                stop,
                file_path,
            };
            // `respond` needs a reader that lives as long as the thread: run it here.
            let response = Response::new(code.into(), headers, held, Some(length), None)
                .with_chunked_threshold(usize::MAX);
            let _ = request.respond(response);
            if let Some(peer) = peer {
                cuts.lock().unwrap_or_else(|p| p.into_inner()).insert(peer);
            }
        }
        _ => respond(Box::new(Cursor::new(body)), request),
    }
}

/// Forwards every connection on `listener` to `upstream`, byte for byte, and cuts a connection
/// once the server marked it in `cuts` and it has nothing more in flight.
fn pipe(
    listener: TcpListener,
    upstream: SocketAddr,
    cuts: Arc<Mutex<HashSet<SocketAddr>>>,
    stop: &AtomicBool,
) {
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    while !stop.load(Ordering::Relaxed) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
        };
        if client.set_nonblocking(false).is_err() {
            continue;
        }
        let Ok(server) = TcpStream::connect(upstream) else {
            continue;
        };
        let Ok(marker) = server.local_addr() else {
            continue;
        };
        let (Ok(mut client_in), Ok(mut server_out)) = (client.try_clone(), server.try_clone())
        else {
            continue;
        };
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut client_in, &mut server_out);
            let _ = server_out.shutdown(Shutdown::Write);
        });
        let cuts = cuts.clone();
        std::thread::spawn(move || forward(server, client, marker, &cuts));
    }
}

fn forward(
    mut server: TcpStream,
    mut client: TcpStream,
    marker: SocketAddr,
    cuts: &Mutex<HashSet<SocketAddr>>,
) {
    let _ = server.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = vec![0; 64 * 1024];
    loop {
        match server.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if client.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if cuts
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&marker)
                {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    let _ = client.shutdown(Shutdown::Both);
    let _ = server.shutdown(Shutdown::Both);
}
