//! The HTTP service in front of s3s: answers the `/_faults` control API itself, and passes
//! every other request to the S3 service through the fault rules.
//!
//! Contract: a request whose path is `/_faults` (or below it) is never seen by s3s, never
//! signed, and never counted. Every other request is counted and gets at most one fault
//! (see [`crate::faults`]); with none it is answered by s3s unchanged.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, ALLOW, CONTENT_LENGTH, CONTENT_TYPE, ETAG};
use http::{Method, Request, Response, StatusCode};
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use s3s::service::S3Service;
use s3s::{Body, StdError};

use crate::faults::{Fault, FaultState, Rule, WRONG_ETAG};
use crate::meter::Meter;

/// The control API's path. Bucket names cannot start with `_`, so no S3 path collides.
pub const FAULTS_PATH: &str = "/_faults";

/// The largest `POST /_faults` body read.
const MAX_RULE_BODY: usize = 64 * 1024;

/// How long a truncated response waits, after its last byte was handed to hyper, before
/// the connection is aborted: hyper flushes what it buffered only when the body stalls;
/// an error returned at once would discard the buffered head and body.
const TRUNCATE_FLUSH_GRACE: Duration = Duration::from_millis(100);

/// The S3 service with fault injection in front. Cheap to clone (shared state).
#[derive(Clone, Debug)]
pub struct FaultLayer {
    s3: S3Service,
    faults: Arc<FaultState>,
    meter: Arc<Meter>,
    /// `--anonymous`: a bearer token (a GCS client's OAuth header) is dropped, not verified.
    anonymous: bool,
}

/// The error that makes hyper close the connection without answering (the `drop` fault).
#[derive(Debug)]
struct DroppedByFault;

impl std::fmt::Display for DroppedByFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped by fault injection")
    }
}

impl std::error::Error for DroppedByFault {}

/// The service's error: hyper closes the connection without (or in the middle of) a
/// response. A named type rather than `Box<dyn Error>`, which hyper-util's bounds trip on
/// (rustc's higher-ranked lifetime limitation when the connection is spawned).
#[derive(Debug)]
pub struct CloseConnection(StdError);

impl std::fmt::Display for CloseConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for CloseConnection {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

impl FaultLayer {
    /// Wraps `s3`; faults start empty; every response body is counted and paced by
    /// `meter`.
    pub fn new(s3: S3Service, meter: Meter) -> Self {
        Self {
            s3,
            faults: Arc::default(),
            meter: Arc::new(meter),
            anonymous: false,
        }
    }

    /// Serves unauthenticated clients of GCS's XML API too: their `Authorization: Bearer`
    /// header (an OAuth token, empty for an emulator) is dropped before s3s sees it.
    pub fn anonymous(mut self, on: bool) -> Self {
        self.anonymous = on;
        self
    }

    /// Handles one request. An `Err` makes hyper close the connection without a response
    /// (the `drop` fault, a response body `truncate` had to read whole and could not, or
    /// s3s's own failures). Over HTTP/2 the same error resets only the request's stream.
    ///
    /// Takes `self` by value (a clone per request) so the future is `'static`.
    pub async fn call(self, req: Request<Incoming>) -> Result<Response<Body>, CloseConnection> {
        self.handle(req).await.map_err(CloseConnection)
    }

    async fn handle(&self, mut req: Request<Incoming>) -> Result<Response<Body>, StdError> {
        if self.anonymous {
            let bearer = req
                .headers()
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("Bearer"));
            if bearer {
                req.headers_mut().remove(http::header::AUTHORIZATION);
            }
        }
        let path = req.uri().path();
        if path == FAULTS_PATH || path.starts_with("/_faults/") {
            return Ok(self.control(req).await);
        }
        let target = req
            .uri()
            .path_and_query()
            .map_or(path, |pq| pq.as_str())
            .to_owned();
        let Some(fault) = self.faults.on_request(req.method(), &target) else {
            return self.forward(req).await;
        };
        eprintln!(
            "fastensor-s3-server: fault {} on {} {target}",
            fault.kind_name(),
            req.method()
        );
        match fault {
            Fault::SlowDown => {
                drain(req.into_body()).await;
                Ok(s3_error_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "SlowDown",
                    "Please reduce your request rate.",
                ))
            }
            Fault::InternalError => {
                drain(req.into_body()).await;
                Ok(s3_error_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalError",
                    "We encountered an internal error. Please try again.",
                ))
            }
            Fault::Drop => Err(Box::new(DroppedByFault)),
            Fault::Delay(pause) => {
                tokio::time::sleep(pause).await;
                self.forward(req).await
            }
            Fault::Truncate => truncate(self.forward(req).await?).await,
            Fault::WrongEtag => {
                let mut resp = self.forward(req).await?;
                if resp.headers().contains_key(ETAG) {
                    resp.headers_mut()
                        .insert(ETAG, HeaderValue::from_static(WRONG_ETAG));
                }
                Ok(resp)
            }
        }
    }

    async fn forward(&self, req: Request<Incoming>) -> Result<Response<Body>, StdError> {
        let resp = self
            .s3
            .call(req.map(Body::from))
            .await
            .map_err(StdError::from)?;
        Ok(resp.map(|body| self.meter.wrap(body)))
    }

    /// `POST` adds a rule, `GET` reports counters (with `sent_bytes`: the body bytes of
    /// every S3 response since the last `DELETE`, and `bandwidth`) and rules, `DELETE`
    /// clears both.
    async fn control(&self, req: Request<Incoming>) -> Response<Body> {
        if req.uri().path() != FAULTS_PATH {
            return json_response(StatusCode::NOT_FOUND, r#"{"error":"not found"}"#.to_owned());
        }
        match *req.method() {
            Method::GET => {
                let mut snap = self.faults.snapshot();
                snap["sent_bytes"] = self.meter.sent().into();
                snap["bandwidth"] = self.meter.bandwidth().into();
                json_response(StatusCode::OK, snap.to_string())
            }
            Method::DELETE => {
                self.faults.reset();
                self.meter.reset();
                json_response(StatusCode::OK, r#"{"ok":true}"#.to_owned())
            }
            Method::POST => {
                let body = match http_body_util::Limited::new(req.into_body(), MAX_RULE_BODY)
                    .collect()
                    .await
                {
                    Ok(collected) => collected.to_bytes(),
                    Err(e) => return bad_request(&format!("cannot read the rule: {e}")),
                };
                match Rule::from_json(&body) {
                    Ok(rule) => {
                        let n = self.faults.add(rule);
                        json_response(StatusCode::OK, format!(r#"{{"ok":true,"rules":{n}}}"#))
                    }
                    Err(message) => bad_request(&message),
                }
            }
            _ => {
                let mut resp = json_response(
                    StatusCode::METHOD_NOT_ALLOWED,
                    r#"{"error":"use GET, POST or DELETE"}"#.to_owned(),
                );
                resp.headers_mut()
                    .insert(ALLOW, HeaderValue::from_static("GET, POST, DELETE"));
                resp
            }
        }
    }
}

fn bad_request(message: &str) -> Response<Body> {
    let body = serde_json::json!({ "error": message }).to_string();
    json_response(StatusCode::BAD_REQUEST, body)
}

fn json_response(status: StatusCode, body: String) -> Response<Body> {
    with_body(status, "application/json", body)
}

/// An S3 error response as S3 sends it: XML `Error` with `Code` and `Message`.
fn s3_error_response(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\
         <Error><Code>{code}</Code><Message>{message}</Message></Error>"
    );
    with_body(status, "application/xml", body)
}

fn with_body(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut resp = Response::new(Body::from(body.clone()));
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
    resp
}

/// Reads and discards a request body, so that answering before the upload finished does
/// not reset the connection under the client (a real S3 error reply reads the body too).
async fn drain(mut body: Incoming) {
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            break;
        }
    }
}

/// Keeps `resp`'s status and headers, cuts its body to the first half of its length
/// (`Content-Length`, else the body's exact size, else its length once read whole), then
/// aborts the connection.
async fn truncate(resp: Response<Body>) -> Result<Response<Body>, StdError> {
    let (parts, body) = resp.into_parts();
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .or_else(|| body.size_hint().exact());
    let (body, total) = match declared {
        Some(total) => (body, total),
        None => {
            let bytes = body.collect().await?.to_bytes();
            let total = bytes.len() as u64;
            (Body::from(bytes), total)
        }
    };
    let truncated = Truncated {
        size_hint: body.size_hint(),
        inner: body,
        remaining: total / 2,
        phase: Phase::Passing,
    };
    Ok(Response::from_parts(
        parts,
        Body::http_body_unsync(truncated),
    ))
}

/// A body that passes on its inner body's first `remaining` bytes, then stalls for
/// [`TRUNCATE_FLUSH_GRACE`] and fails, which makes hyper abort the connection. Its size
/// hint stays the inner body's, so the declared length does not change.
struct Truncated {
    inner: Body,
    size_hint: SizeHint,
    remaining: u64,
    phase: Phase,
}

enum Phase {
    Passing,
    Aborting(Pin<Box<tokio::time::Sleep>>),
}

impl http_body::Body for Truncated {
    type Data = Bytes;
    type Error = StdError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StdError>>> {
        let this = &mut *self;
        loop {
            match &mut this.phase {
                Phase::Passing if this.remaining == 0 => {
                    this.phase =
                        Phase::Aborting(Box::pin(tokio::time::sleep(TRUNCATE_FLUSH_GRACE)));
                }
                Phase::Passing => match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                    Some(Ok(frame)) => {
                        // Trailers are dropped: the body never ends properly anyway.
                        if let Ok(mut data) = frame.into_data() {
                            let keep = usize::try_from(this.remaining).unwrap_or(usize::MAX);
                            data.truncate(keep);
                            this.remaining -= data.len() as u64;
                            return Poll::Ready(Some(Ok(Frame::data(data))));
                        }
                    }
                    Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                    // Shorter than declared (or a HEAD answer): abort all the same.
                    None => this.remaining = 0,
                },
                Phase::Aborting(grace) => {
                    ready!(grace.as_mut().poll(cx));
                    return Poll::Ready(Some(Err("body truncated by fault injection".into())));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        false
    }

    fn size_hint(&self) -> SizeHint {
        self.size_hint
    }
}
