//! What the server sends: every forwarded response's body bytes counted, and (with
//! `--bandwidth`) paced so that all bodies together go out at most that many bytes a
//! second: a storage or network bottleneck shared by every client, as a cluster's object
//! store is.
//!
//! Contract: the count includes every body byte handed to hyper of every S3 response
//! (control requests excluded); pacing delays each body frame until the shared budget has
//! room for it (a token bucket with no burst beyond one frame), never drops or reorders.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use s3s::{Body, StdError};
use tokio::time::Instant;

/// The count and the pace, shared by every connection.
#[derive(Debug, Default)]
pub struct Meter {
    sent: AtomicU64,
    /// Bytes a second for all bodies together; `None`: unpaced.
    bandwidth: Option<u64>,
    /// When the link is next free (the end of the last frame's slot).
    free_at: Mutex<Option<Instant>>,
}

impl Meter {
    /// A meter pacing bodies to `bandwidth` bytes a second (unpaced when `None`).
    pub fn new(bandwidth: Option<u64>) -> Self {
        Meter {
            bandwidth: bandwidth.filter(|&b| b > 0),
            ..Meter::default()
        }
    }

    /// Body bytes sent since the start or the last [`reset`](Self::reset).
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Zeroes the count.
    pub fn reset(&self) {
        self.sent.store(0, Ordering::Relaxed);
    }

    /// The pace in bytes a second, if any.
    pub fn bandwidth(&self) -> Option<u64> {
        self.bandwidth
    }

    /// Counts `n` bytes and returns when they may go out (now when unpaced).
    fn reserve(&self, n: u64) -> Option<Instant> {
        self.sent.fetch_add(n, Ordering::Relaxed);
        let rate = self.bandwidth?;
        let now = Instant::now();
        let mut free = self.free_at.lock().unwrap_or_else(|p| p.into_inner());
        let start = free.map_or(now, |f| f.max(now));
        let end = start + Duration::from_secs_f64(n as f64 / rate as f64);
        *free = Some(end);
        Some(end)
    }

    /// `body`, counted and paced by this meter.
    pub fn wrap(self: &Arc<Self>, body: Body) -> Body {
        Body::http_body_unsync(Metered {
            size_hint: http_body::Body::size_hint(&body),
            inner: body,
            meter: self.clone(),
            held: None,
        })
    }
}

/// A body whose frames are counted and held until the meter lets them go.
struct Metered {
    inner: Body,
    size_hint: SizeHint,
    meter: Arc<Meter>,
    held: Option<(Frame<Bytes>, Pin<Box<tokio::time::Sleep>>)>,
}

impl http_body::Body for Metered {
    type Data = Bytes;
    type Error = StdError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, StdError>>> {
        let this = &mut *self;
        if let Some((_, sleep)) = &mut this.held {
            ready!(sleep.as_mut().poll(cx));
            let (frame, _) = this.held.take().expect("held");
            return Poll::Ready(Some(Ok(frame)));
        }
        let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => frame,
            other => return Poll::Ready(other),
        };
        let n = frame.data_ref().map_or(0, |d| d.len() as u64);
        match this.meter.reserve(n) {
            Some(at) if at > Instant::now() => {
                let mut sleep = Box::pin(tokio::time::sleep_until(at));
                if sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Some(Ok(frame)));
                }
                this.held = Some((frame, sleep));
                Poll::Pending
            }
            _ => Poll::Ready(Some(Ok(frame))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.size_hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn counts_and_paces_frames_across_bodies() {
        let meter = Arc::new(Meter::new(Some(10 << 20)));
        let started = Instant::now();
        let mut total = 0;
        for _ in 0..2 {
            let body = meter.wrap(Body::from(Bytes::from(vec![7u8; 1 << 20])));
            let got = http_body_util::BodyExt::collect(body)
                .await
                .unwrap()
                .to_bytes();
            total += got.len();
        }
        assert_eq!(total, 2 << 20);
        assert_eq!(meter.sent(), 2 << 20);
        // 2 MiB at 10 MiB/s: the second frame waits for the first's slot.
        assert!(
            started.elapsed() >= Duration::from_millis(150),
            "{:?}",
            started.elapsed()
        );
        meter.reset();
        assert_eq!(meter.sent(), 0);
    }

    #[tokio::test]
    async fn unpaced_meter_only_counts() {
        let meter = Arc::new(Meter::new(None));
        let body = meter.wrap(Body::from(Bytes::from(vec![1u8; 4096])));
        let started = Instant::now();
        http_body_util::BodyExt::collect(body).await.unwrap();
        assert_eq!(meter.sent(), 4096);
        assert!(started.elapsed() < Duration::from_millis(100));
    }
}
