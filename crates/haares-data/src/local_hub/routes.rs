//! The local hub's routes: the listing, the resolution and the content, each answered as the hub
//! answers it (the module docs of `local_hub` list what that is) or with the fault a test set.

use std::collections::HashSet;
use std::io::{Cursor, Read};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tiny_http::{Header, Request, Response};

use super::{Fault, HubFile, Logged, State, lock};

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

/// What the connection threads share with a route.
pub(super) struct Shared<'a> {
    pub endpoint: &'a str,
    pub state: &'a Mutex<State>,
    pub stop: &'a AtomicBool,
    pub cuts: &'a Mutex<HashSet<SocketAddr>>,
}

pub(super) fn answer(request: Request, shared: &Shared<'_>) {
    let url = request.url().to_string();
    let range = request
        .headers()
        .iter()
        .find(|h| h.field.equiv("Range"))
        .map(|h| h.value.as_str().to_string());
    lock(shared.state).requests.push(Logged {
        url: url.clone(),
        range: range.clone(),
    });
    let (path, query) = url.split_once('?').unwrap_or((&url, ""));
    let path = path.replace("%2F", "/");
    let response = if let Some(rest) = path.strip_prefix("/api/datasets/") {
        let blobs = query.split('&').any(|pair| pair == "blobs=true");
        listing(rest, blobs, shared.state)
    } else if let Some(rest) = path.strip_prefix("/datasets/") {
        match resolution(rest, shared.state) {
            Resolved::Answer(response) => response,
            Resolved::InGit(file, commit, file_path) => {
                let headers = vec![
                    header("ETag", &format!("\"{}\"", file.etag)),
                    header("X-Repo-Commit", &commit),
                ];
                let served = Served {
                    file_path,
                    bytes: file.bytes,
                    fault: None,
                };
                return content(request, served, range.as_deref(), headers, shared);
            }
            Resolved::Redirect { location, headers } => {
                let location = if location.starts_with('/') {
                    location
                } else {
                    format!("{}/{location}", shared.endpoint)
                };
                let mut response = Response::from_string("")
                    .with_status_code(if headers.is_empty() { 307 } else { 302 })
                    .with_header(header("Location", &location));
                for h in headers {
                    response = response.with_header(h);
                }
                response
            }
        }
    } else if let Some(rest) = path.strip_prefix("/cdn/") {
        return match find_content(rest, shared.state) {
            Ok(served) => content(request, served, range.as_deref(), Vec::new(), shared),
            Err(response) => {
                let _ = request.respond(response);
            }
        };
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

fn listing(rest: &str, blobs: bool, state: &Mutex<State>) -> Response<Cursor<Vec<u8>>> {
    let mut state = lock(state);
    if let Some(fault) = state.listing_fault.as_mut()
        && fault.remaining > 0
    {
        if fault.remaining != usize::MAX {
            fault.remaining -= 1;
        }
        return status(fault.status, "injected by the test");
    }
    let Some((repo, revision)) = split_at(rest, "/revision/") else {
        return status(404, "Repository not found");
    };
    let repo = state.renamed.get(repo).map_or(repo, String::as_str);
    let Some(commit) = commit_of(&state, repo, revision) else {
        return status(404, "Invalid rev id");
    };
    let files = &state.revisions[&(repo.to_string(), commit.clone())];
    let siblings: Vec<serde_json::Value> = files
        .iter()
        .map(|(path, file)| match (blobs, file.lfs) {
            (false, _) => serde_json::json!({ "rfilename": path }),
            (true, false) => serde_json::json!({
                "rfilename": path,
                "blobId": file.etag,
                "size": file.bytes.len(),
            }),
            (true, true) => serde_json::json!({
                "rfilename": path,
                "blobId": file.etag,
                "size": file.bytes.len(),
                "lfs": {"sha256": file.sha256, "size": file.bytes.len(), "pointerSize": 134},
            }),
        })
        .collect();
    let body = serde_json::json!({"id": repo, "sha": commit, "siblings": siblings});
    Response::from_string(body.to_string()).with_header(header("Content-Type", "application/json"))
}

enum Resolved {
    Answer(Response<Cursor<Vec<u8>>>),
    /// A file stored in git: its content is the answer.
    InGit(HubFile, String, String),
    /// A redirect: relative when `headers` is empty (a renamed repository), else to the CDN.
    Redirect {
        location: String,
        headers: Vec<Header>,
    },
}

fn resolution(rest: &str, state: &Mutex<State>) -> Resolved {
    let state = lock(state);
    let Some((repo, rest)) = split_at(rest, "/resolve/") else {
        return Resolved::Answer(status(404, "Repository not found"));
    };
    if let Some(new) = state.renamed.get(repo) {
        return Resolved::Redirect {
            location: format!("/datasets/{new}/resolve/{rest}"),
            headers: Vec::new(),
        };
    }
    let Some((revision, file_path)) = rest.split_once('/') else {
        return Resolved::Answer(status(404, "Entry not found"));
    };
    if let Some(Fault::Status(code)) = state.faults.get(file_path) {
        return Resolved::Answer(status(*code, "injected by the test"));
    }
    let Some(commit) = commit_of(&state, repo, revision) else {
        return Resolved::Answer(status(404, "Invalid rev id"));
    };
    let Some(file) = state.revisions[&(repo.to_string(), commit.clone())].get(file_path) else {
        return Resolved::Answer(status(404, "Entry not found"));
    };
    let named = match state.faults.get(file_path) {
        Some(Fault::ServedFrom(other)) => other.clone(),
        _ => commit.clone(),
    };
    if !file.lfs {
        return Resolved::InGit(file.clone(), named, file_path.to_string());
    }
    Resolved::Redirect {
        location: format!("cdn/{repo}/{commit}/{file_path}"),
        headers: vec![
            header("X-Repo-Commit", &named),
            header("X-Linked-Etag", &format!("\"{}\"", file.etag)),
            header("X-Linked-Size", &file.bytes.len().to_string()),
        ],
    }
}

/// A file's content about to be served, and how it fails.
struct Served {
    file_path: String,
    bytes: Vec<u8>,
    fault: Option<Fault>,
}

fn find_content(rest: &str, state: &Mutex<State>) -> Result<Served, Response<Cursor<Vec<u8>>>> {
    let state = lock(state);
    let found = state.revisions.iter().find_map(|((repo, commit), files)| {
        let file_path = rest.strip_prefix(&format!("{repo}/{commit}/"))?;
        let file = files.get(file_path)?;
        Some(Served {
            file_path: file_path.to_string(),
            bytes: file.bytes.clone(),
            fault: state.faults.get(file_path).cloned(),
        })
    });
    match found {
        Some(Served {
            fault: Some(Fault::ContentStatus(code)),
            ..
        }) => Err(status(code, "injected by the test")),
        Some(served) => Ok(served),
        None => Err(status(404, "no such blob")),
    }
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
    request: Request,
    served: Served,
    range: Option<&str>,
    mut headers: Vec<Header>,
    shared: &Shared<'_>,
) {
    let Served {
        file_path,
        mut bytes,
        fault,
    } = served;
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
    headers.push(header(
        "Content-Range",
        &format!("bytes {start}-{}/{size}", end - 1),
    ));
    headers.push(header("Accept-Ranges", "bytes"));
    let code = if range.is_some() { 206 } else { 200 };
    let length = body.len();
    let sent = match fault {
        Some(Fault::Cut(after) | Fault::Hold(after)) if !probe => after.min(length),
        _ => length,
    };
    lock(shared.state).bytes_served += sent as u64;
    let reader: Box<dyn Read + Send + '_> = match fault {
        Some(Fault::Hold(_)) if !probe => Box::new(Held {
            bytes: Cursor::new(body[..sent].to_vec()),
            state: shared.state,
            stop: shared.stop,
            file_path,
        }),
        _ => Box::new(Cursor::new(body[..sent].to_vec())),
    };
    // Identity encoding with a Content-Length, so that a body cut short is seen as cut.
    let response = Response::new(code.into(), headers, reader, Some(length), None)
        .with_chunked_threshold(usize::MAX);
    let peer = request.remote_addr().copied();
    let _ = request.respond(response);
    if sent < length
        && let Some(peer) = peer
    {
        shared
            .cuts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(peer);
    }
}
