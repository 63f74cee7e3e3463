//! `GET /metrics` over HTTP/1.1, one connection at a time.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The Content-Type of the text exposition format, version 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Longest request head read (request line and headers); a scraper sends
/// a few hundred bytes.
const MAX_HEAD_BYTES: usize = 8 * 1024;

/// Time a client gets to send its request head, and a send of the
/// response to make progress: a stuck or slow client holds the (single)
/// responder at most this long.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

/// A thread answering `GET /metrics` (and `HEAD`) with `render()`'s text;
/// other paths get 404, other methods 405. One connection at a time,
/// closed after each response (`Connection: close`): scrapes come every
/// few seconds, and a thread per connection would let a client make the
/// daemon spawn threads. Stopped on drop.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `listen` (port 0: any free port) and starts the thread
    /// (named `thread_name`). Fails only if the address cannot be bound.
    pub fn start(
        listen: SocketAddr,
        thread_name: &str,
        render: impl Fn() -> String + Send + 'static,
    ) -> io::Result<Self> {
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(thread_name.into())
            .spawn(move || accept_loop(&listener, &s, &render))?;
        Ok(Self {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The bound address (with the port resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept; the loop sees the flag and ends.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, stop: &AtomicBool, render: &dyn Fn() -> String) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match conn {
            Ok(s) => {
                if let Err(e) = answer(s, render) {
                    log::debug!("metrics: {e}");
                }
            }
            Err(e) => {
                // Out of file descriptors and the like: back off rather
                // than spin.
                log::warn!("metrics: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Reads one request head and writes the response.
fn answer(mut s: TcpStream, render: &dyn Fn() -> String) -> io::Result<()> {
    s.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let head = match read_head(&mut s)? {
        Ok(h) => h,
        Err(status) => {
            respond(&mut s, status, "", false)?;
            // Closing with unread request bytes would reset the
            // connection, and the client could lose the answer.
            return drain_and_close(s);
        }
    };
    let line = head.lines().next().unwrap_or("");
    let mut words = line.split(' ');
    let (method, target, version) = (words.next(), words.next(), words.next());
    if !version.is_some_and(|v| v.starts_with("HTTP/1.")) {
        return respond(&mut s, "400 Bad Request", "bad request line\n", false);
    }
    let path = target.unwrap_or("").split('?').next().unwrap_or("");
    match (method, path) {
        (Some(m @ ("GET" | "HEAD")), "/metrics") => {
            let body = render();
            respond(&mut s, "200 OK", &body, m == "HEAD")
        }
        (Some("GET" | "HEAD"), _) => {
            respond(&mut s, "404 Not Found", "metrics are at /metrics\n", false)
        }
        _ => respond(&mut s, "405 Method Not Allowed", "GET only\n", false),
    }
}

/// The request head as text, or the error status to answer with. The
/// whole head must arrive within [`CLIENT_TIMEOUT`] (not each read: a
/// client trickling one byte at a time is cut off too).
fn read_head(s: &mut TcpStream) -> io::Result<Result<String, &'static str>> {
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Err("408 Request Timeout"));
        }
        s.set_read_timeout(Some(left))?;
        let n = match s.read(&mut chunk) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(Err("408 Request Timeout"))
            }
            Err(e) => return Err(e),
        };
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.truncate(end);
            return Ok(String::from_utf8(buf).map_err(|_| "400 Bad Request"));
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Ok(Err("431 Request Header Fields Too Large"));
        }
    }
}

/// Half-closes, then reads and drops what the client still sends (at most
/// 64 KiB, for at most a second) before the socket closes.
fn drain_and_close(mut s: TcpStream) -> io::Result<()> {
    s.shutdown(std::net::Shutdown::Write)?;
    s.set_read_timeout(Some(Duration::from_secs(1)))?;
    let mut chunk = [0u8; 4096];
    let mut left = 64 * 1024usize;
    while left > 0 {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
    Ok(())
}

fn respond(s: &mut TcpStream, status: &str, body: &str, head_only: bool) -> io::Result<()> {
    let ctype = if status.starts_with("200") {
        CONTENT_TYPE
    } else {
        "text/plain; charset=utf-8"
    };
    let allow = if status.starts_with("405") {
        "Allow: GET, HEAD\r\n"
    } else {
        ""
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    if !head_only {
        s.write_all(body.as_bytes())?;
    }
    s.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(request).unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    }

    fn server() -> MetricsServer {
        MetricsServer::start("127.0.0.1:0".parse().unwrap(), "metrics-test", || {
            "# HELP x_up up\n# TYPE x_up gauge\nx_up 1\n".into()
        })
        .unwrap()
    }

    #[test]
    fn get_metrics_answers_with_the_exposition_content_type() {
        let s = server();
        let r = exchange(
            s.local_addr(),
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n",
        );
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(
            r.contains(&format!("Content-Type: {CONTENT_TYPE}\r\n")),
            "{r}"
        );
        let body = "# HELP x_up up\n# TYPE x_up gauge\nx_up 1\n";
        assert!(
            r.contains(&format!("Content-Length: {}\r\n", body.len())),
            "{r}"
        );
        assert!(r.ends_with(&format!("\r\n\r\n{body}")), "{r}");
        let r = exchange(s.local_addr(), b"HEAD /metrics?x=1 HTTP/1.0\r\n\r\n");
        assert!(
            r.starts_with("HTTP/1.1 200 OK\r\n") && r.ends_with("\r\n\r\n"),
            "{r}"
        );
    }

    #[test]
    fn other_paths_methods_and_garbage_are_refused() {
        let s = server();
        let a = s.local_addr();
        assert!(exchange(a, b"GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        let r = exchange(a, b"POST /metrics HTTP/1.1\r\n\r\n");
        assert!(
            r.starts_with("HTTP/1.1 405") && r.contains("Allow: GET, HEAD"),
            "{r}"
        );
        assert!(exchange(a, b"hello\r\n\r\n").starts_with("HTTP/1.1 400"));
        let mut big = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        big.extend(std::iter::repeat_n(b'a', 3 * MAX_HEAD_BYTES));
        let mut c = TcpStream::connect(a).unwrap();
        // The server may close before reading all of it.
        let _ = c.write_all(&big);
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        drop(c);
        assert!(out.starts_with("HTTP/1.1 431"), "{out}");
        // Still serving afterwards.
        assert!(exchange(a, b"GET /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200"));
    }
}
