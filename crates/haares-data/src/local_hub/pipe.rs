//! The pipe of bytes in front of the local hub's HTTP server. An HTTP server keeps a connection
//! open after a short answer; a dropped network does not. The pipe forwards every connection byte
//! for byte and cuts one once the server marked it and it has nothing more in flight.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Forwards every connection on `listener` to `upstream`, and cuts a connection once the server
/// marked it (by the address it sees, the pipe's side of it) in `cuts`.
pub(super) fn pipe(
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
