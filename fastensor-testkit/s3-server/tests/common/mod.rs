//! Test support: starts the server binary on a fresh directory, and speaks HTTP/1.1 by hand
//! over a `TcpStream` (one request per connection), with optional SigV4 signing.

#![allow(dead_code)] // Each test file uses its own subset.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

pub const ACCESS_KEY: &str = "fastensor";
pub const SECRET_KEY: &str = "fastensor-secret";
pub const REGION: &str = "us-east-1";

/// A running server on its own directory; killed and cleaned up on drop.
pub struct Server {
    child: Child,
    /// `host:port`, from the printed URL.
    pub addr: String,
    /// The line the server printed.
    pub url: String,
    pub root: PathBuf,
}

impl Server {
    /// Starts the binary with `--root` on a new directory (which it must create) and
    /// reads the one line it prints.
    pub fn start() -> Server {
        static N: AtomicUsize = AtomicUsize::new(0);
        let root = std::env::temp_dir().join(format!(
            "fastensor-s3-server-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        let mut child = Command::new(env!("CARGO_BIN_EXE_fastensor-s3-server"))
            .arg("--root")
            .arg(root.join("data"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .expect("read the URL");
        let url = line.trim_end().to_owned();
        let addr = url
            .strip_prefix("http://")
            .unwrap_or_else(|| panic!("not a URL: {line:?}"))
            .to_owned();
        Server {
            child,
            addr,
            url,
            root,
        }
    }

    /// Sends SIGTERM and waits (at most 10 s) for the exit status.
    pub fn terminate(mut self) -> ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "server did not exit on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// An unsigned request.
    pub fn raw(&self, method: &str, target: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
        send(&self.addr, method, target, headers, body)
    }

    /// A SigV4-signed request (path-style). `target` is the path and query exactly as
    /// sent; its query must already be in canonical order with `=` after every key.
    /// Bodies over 64 KiB are sent as `UNSIGNED-PAYLOAD`.
    pub fn signed(
        &self,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        self.signed_for(REGION, method, target, headers, body)
    }

    /// [`Server::signed`] with the credential scope naming `region`.
    pub fn signed_for(
        &self,
        region: &str,
        method: &str,
        target: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let payload_hash = if body.len() > 64 * 1024 {
            "UNSIGNED-PAYLOAD".to_owned()
        } else {
            hex(&Sha256::digest(body))
        };
        let amz_date = amz_date(SystemTime::now());
        let date = &amz_date[..8];
        let canonical_request = format!(
            "{method}\n{path}\n{query}\nhost:{host}\nx-amz-content-sha256:{payload_hash}\n\
             x-amz-date:{amz_date}\n\nhost;x-amz-content-sha256;x-amz-date\n{payload_hash}",
            host = self.addr
        );
        let scope = format!("{date}/{region}/s3/aws4_request");
        let string_to_sign = format!(
            "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
            hex(&Sha256::digest(canonical_request.as_bytes()))
        );
        let mut key = hmac(format!("AWS4{SECRET_KEY}").as_bytes(), date.as_bytes());
        for part in [region, "s3", "aws4_request"] {
            key = hmac(&key, part.as_bytes());
        }
        let signature = hex(&hmac(&key, string_to_sign.as_bytes()));
        let authorization = format!(
            "AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/{scope}, \
             SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={signature}"
        );
        let mut all: Vec<(&str, &str)> = vec![
            ("x-amz-content-sha256", &payload_hash),
            ("x-amz-date", &amz_date),
            ("authorization", &authorization),
        ];
        all.extend_from_slice(headers);
        send(&self.addr, method, target, &all, body)
    }

    /// Adds a fault rule; panics unless the server accepts it.
    pub fn add_fault(&self, rule: &str) {
        let reply = self.raw("POST", "/_faults", &[], rule.as_bytes());
        assert_eq!(reply.status, 200, "{rule}: {}", reply.text());
    }

    /// `GET /_faults`, parsed.
    pub fn fault_report(&self) -> serde_json::Value {
        let reply = self.raw("GET", "/_faults", &[], b"");
        assert_eq!(reply.status, 200);
        serde_json::from_slice(&reply.body).expect("JSON report")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// What came back on one connection.
#[derive(Debug)]
pub struct Reply {
    /// 0 when the connection closed before a status line.
    pub status: u16,
    /// Names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Whether the connection ended in an error (reset) rather than a clean EOF.
    pub reset: bool,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The declared Content-Length.
    pub fn content_length(&self) -> Option<usize> {
        self.header("content-length").and_then(|v| v.parse().ok())
    }
}

/// Sends one request with `Connection: close` and reads until the server closes.
fn send(addr: &str, method: &str, target: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut head = format!(
        "{method} {target} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    // A dropped connection may refuse the rest of a large body: that is the test's answer.
    let _ = stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body));

    let mut raw = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    let mut reset = false;
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                assert!(
                    e.kind() != std::io::ErrorKind::WouldBlock
                        && e.kind() != std::io::ErrorKind::TimedOut,
                    "server did not answer within 30 s"
                );
                reset = true;
                break;
            }
        }
    }
    parse_reply(&raw, reset, method == "HEAD")
}

fn parse_reply(raw: &[u8], reset: bool, head_request: bool) -> Reply {
    let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Reply {
            status: 0,
            headers: Vec::new(),
            body: raw.to_vec(),
            reset,
        };
    };
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    if chunked && !head_request {
        body = dechunk(&body);
    }
    Reply {
        status,
        headers,
        body,
        reset,
    }
}

/// Decodes a chunked body (as far as it goes).
fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line_end) = data.windows(2).position(|w| w == b"\r\n") {
        let size_text = String::from_utf8_lossy(&data[..line_end]);
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let Ok(size) = usize::from_str_radix(size_text, 16) else {
            break;
        };
        data = &data[line_end + 2..];
        if size == 0 {
            break;
        }
        let take = size.min(data.len());
        out.extend_from_slice(&data[..take]);
        data = &data[take..];
        data = data.strip_prefix(b"\r\n").unwrap_or(data);
    }
    out
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `YYYYMMDDTHHMMSSZ` in UTC.
fn amz_date(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).unwrap().as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[test]
fn amz_date_matches_known_instants() {
    assert_eq!(amz_date(UNIX_EPOCH), "19700101T000000Z");
    let t = UNIX_EPOCH + Duration::from_secs(1_709_210_096); // 2024-02-29 12:34:56 UTC
    assert_eq!(amz_date(t), "20240229T123456Z");
}
