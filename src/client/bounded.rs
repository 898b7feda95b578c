//! Bounds on what a server sends back, for the Kairon APIs named by tenants' identities.
//!
//! kube reads an error answer (any 4xx or 5xx) whole into a string, which becomes the error's
//! message; reads a list whole before parsing it; and reads a watch line by line with no limit
//! on a line. A server that answers 500 with 50 MiB of text, or streams a watch line that never
//! ends, would make the manager hold all of it (and then copy it into logs and conditions).
//! [`BodyLimits`] wraps every response body of a client:
//!
//! - an error answer is cut after [`BodyLimits::error_body`] bytes (the start says what went
//!   wrong; a real API server's `Status` is well under a KiB);
//! - a watch fails once a line (one event) passes [`BodyLimits::watch_line`] bytes;
//! - any other answer fails once it passes [`BodyLimits::body`] bytes.
//!
//! A body that is cut or refused is dropped at once, and its connection with it.
//!
//! Bytes are bounded, and so is time: the client's read timeout restarts after every byte
//! (hyper-timeout's timer is per read), so a server that trickles an answer one byte at a time
//! would hold the reconcile waiting on it — and its worker — for as long as it likes. Every
//! request but a watch must be answered whole within [`BodyLimits::request`], from when it is
//! sent to its last byte; a watch within the `timeoutSeconds` it asks for, plus
//! [`BodyLimits::request`] (a watch that asks for no end has none).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use tower::{BoxError, Layer, Service};

use super::verb;

/// Limits on response bodies; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BodyLimits {
    pub error_body: usize,
    pub watch_line: usize,
    pub body: usize,
    /// How long a request may take, from when it is sent to its answer's last byte.
    pub request: Duration,
}

impl BodyLimits {
    /// For the Kairon APIs of identities. A Kairon Machine is at most what the API server
    /// stores (1.5 MiB in etcd, JSON for custom resources): one watch event is well under
    /// 4 MiB. A list page holds [`crate::controller::endpoints`]' page size of them. A
    /// working API server answers in well under a second; a write may wait on admission
    /// webhooks, which the API server gives at most 30 s.
    pub(crate) const IDENTITY: BodyLimits = BodyLimits {
        error_body: 16 * 1024,
        watch_line: 4 * 1024 * 1024,
        body: 16 * 1024 * 1024,
        request: Duration::from_secs(30),
    };

    /// How long the request may take in all: `None` for a watch that asks for no end.
    fn deadline_of<B>(&self, req: &Request<B>) -> Option<Duration> {
        if verb(req) != "watch" {
            return Some(self.request);
        }
        let asked = req
            .uri()
            .query()
            .unwrap_or_default()
            .split('&')
            .find_map(|p| p.strip_prefix("timeoutSeconds=").and_then(|t| t.parse::<u64>().ok()));
        asked.map(|t| Duration::from_secs(t) + self.request)
    }
}

/// A request that was not answered whole within its deadline.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the server did not answer within {0:?}; the request is given up")]
pub(crate) struct TooSlow(pub Duration);

impl<S> Layer<S> for BodyLimits {
    type Service = Limited<S>;
    fn layer(&self, inner: S) -> Limited<S> {
        Limited { inner, limits: *self }
    }
}

#[derive(Clone)]
pub(crate) struct Limited<S> {
    inner: S,
    limits: BodyLimits,
}

type BoxFut<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B, RB> Service<Request<B>> for Limited<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    RB: Body<Data = Bytes> + Unpin,
    RB::Error: Into<BoxError>,
{
    type Response = Response<LimitedBody<RB>>;
    type Error = BoxError;
    type Future = BoxFut<Self::Response, BoxError>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let watch = verb(&req) == "watch";
        let limits = self.limits;
        let deadline = limits.deadline_of(&req);
        let fut = self.inner.call(req);
        Box::pin(async move {
            let end = deadline.map(|d| (d, tokio::time::Instant::now() + d));
            let res = match end {
                None => fut.await.map_err(Into::into)?,
                Some((d, at)) => match tokio::time::timeout_at(at, fut).await {
                    Ok(res) => res.map_err(Into::into)?,
                    Err(_) => return Err(TooSlow(d).into()),
                },
            };
            let budget = Budget::for_answer(&limits, res.status().as_u16(), watch);
            Ok(res.map(|inner| LimitedBody {
                inner,
                budget,
                done: false,
                deadline: end.map(|(d, at)| (d, Box::pin(tokio::time::sleep_until(at)))),
            }))
        })
    }
}

/// What one body may still carry.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Budget {
    /// An error answer: the first `left` bytes are kept, the rest is not read.
    Cut { left: usize },
    /// Fails past `left` more bytes.
    Total { left: usize, limit: usize },
    /// Fails when a line passes `max` bytes; `run` bytes since the last newline.
    Lines { max: usize, run: usize },
}

/// What to do with the next chunk of a body.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Pass(Bytes),
    /// These bytes, then the end.
    Last(Bytes),
    Refuse(TooLarge),
}

/// A body that passed its limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TooLarge {
    #[error("the server sent a response over {0} bytes; it is not read further")]
    Body(usize),
    #[error("the server sent a watch event over {0} bytes; the watch is dropped")]
    WatchLine(usize),
}

impl Budget {
    fn for_answer(limits: &BodyLimits, status: u16, watch: bool) -> Budget {
        if status >= 400 {
            Budget::Cut {
                left: limits.error_body,
            }
        } else if watch {
            Budget::Lines {
                max: limits.watch_line,
                run: 0,
            }
        } else {
            Budget::Total {
                left: limits.body,
                limit: limits.body,
            }
        }
    }

    fn admit(&mut self, chunk: Bytes) -> Verdict {
        match self {
            Budget::Cut { left } if chunk.len() >= *left => {
                let kept = chunk.slice(..*left);
                *left = 0;
                Verdict::Last(kept)
            }
            Budget::Cut { left } => {
                *left -= chunk.len();
                Verdict::Pass(chunk)
            }
            Budget::Total { left, limit } => match left.checked_sub(chunk.len()) {
                Some(rest) => {
                    *left = rest;
                    Verdict::Pass(chunk)
                }
                None => Verdict::Refuse(TooLarge::Body(*limit)),
            },
            Budget::Lines { max, run } => {
                let tail = match chunk.iter().rposition(|b| *b == b'\n') {
                    // The longest line inside the chunk is checked too.
                    Some(last) => {
                        let first = chunk.iter().position(|b| *b == b'\n').unwrap_or(last);
                        let longest_inside = chunk[first..=last]
                            .split(|b| *b == b'\n')
                            .map(<[u8]>::len)
                            .max()
                            .unwrap_or(0);
                        if *run + first > *max || longest_inside > *max {
                            return Verdict::Refuse(TooLarge::WatchLine(*max));
                        }
                        chunk.len() - last - 1
                    }
                    None => *run + chunk.len(),
                };
                if tail > *max {
                    return Verdict::Refuse(TooLarge::WatchLine(*max));
                }
                *run = tail;
                Verdict::Pass(chunk)
            }
        }
    }
}

/// A response body held to its [`Budget`].
pub(crate) struct LimitedBody<B> {
    inner: B,
    budget: Budget,
    done: bool,
    /// When the whole request must be over, and how long it was given.
    deadline: Option<(Duration, Pin<Box<tokio::time::Sleep>>)>,
}

impl<B> Body for LimitedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        if let Some((given, sleep)) = &mut this.deadline
            && sleep.as_mut().poll(cx).is_ready()
        {
            this.done = true;
            return Poll::Ready(Some(Err(TooSlow(*given).into())));
        }
        let frame = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            None => return Poll::Ready(None),
            Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
            Some(Ok(frame)) => frame,
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(trailers) => return Poll::Ready(Some(Ok(trailers))),
        };
        Poll::Ready(Some(match this.budget.admit(data) {
            Verdict::Pass(data) => Ok(Frame::data(data)),
            Verdict::Last(data) => {
                this.done = true;
                Ok(Frame::data(data))
            }
            Verdict::Refuse(e) => {
                this.done = true;
                Err(e.into())
            }
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.done {
            return SizeHint::with_exact(0);
        }
        // An upper bound the server gave may be over what is read: keep the lower one only.
        SizeHint::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: BodyLimits = BodyLimits {
        error_body: 10,
        watch_line: 8,
        body: 20,
        request: Duration::from_secs(5),
    };

    /// Feeds `chunks` through a fresh budget; what came out, and whether it was refused.
    fn run(status: u16, watch: bool, chunks: &[&str]) -> (String, Option<TooLarge>) {
        let mut budget = Budget::for_answer(&SMALL, status, watch);
        let mut out = String::new();
        for c in chunks {
            match budget.admit(Bytes::copy_from_slice(c.as_bytes())) {
                Verdict::Pass(b) => out.push_str(std::str::from_utf8(&b).unwrap()),
                Verdict::Last(b) => {
                    out.push_str(std::str::from_utf8(&b).unwrap());
                    return (out, None);
                }
                Verdict::Refuse(e) => return (out, Some(e)),
            }
        }
        (out, None)
    }

    #[test]
    fn bodies_are_held_to_their_limits() {
        // (case, status, watch, chunks sent, what is read, refused)
        type Case<'a> = (&'a str, u16, bool, &'a [&'a str], &'a str, Option<TooLarge>);
        let cases: [Case; 11] = [
            ("small answer", 200, false, &["0123456789"], "0123456789", None),
            (
                "answer at the limit",
                200,
                false,
                &["0123456789", "0123456789"],
                "01234567890123456789",
                None,
            ),
            (
                "answer over the limit",
                200,
                false,
                &["0123456789", "0123456789", "x"],
                "01234567890123456789",
                Some(TooLarge::Body(20)),
            ),
            ("small error", 500, false, &["oops"], "oops", None),
            (
                "long error: its start only",
                500,
                false,
                &["0123456", "789abcdef", "never read"],
                "0123456789",
                None,
            ),
            (
                "an error answer to a watch is cut, not read as lines",
                403,
                true,
                &["0123456789abc"],
                "0123456789",
                None,
            ),
            (
                "watch lines within the limit, across chunks",
                200,
                true,
                &["{\"a\":1}\n{\"b", "\":2}\n", "{\"c\":3}\n"],
                "{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n",
                None,
            ),
            (
                "a line that never ends",
                200,
                true,
                &["{\"a\":1}\n{\"b", "xxxxxxxx"],
                "{\"a\":1}\n{\"b",
                Some(TooLarge::WatchLine(8)),
            ),
            (
                "a long line ending in the next chunk",
                200,
                true,
                &["xxxxxx", "xxxxx\n"],
                "xxxxxx",
                Some(TooLarge::WatchLine(8)),
            ),
            (
                "a long line inside one chunk",
                200,
                true,
                &["ab\nxxxxxxxxxxxx\ncd\n"],
                "",
                Some(TooLarge::WatchLine(8)),
            ),
            (
                "many short lines make no long one",
                200,
                true,
                &["a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n", "k\n"],
                "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\n",
                None,
            ),
        ];
        for (name, status, watch, chunks, want, refused) in cases {
            let (got, err) = run(status, watch, chunks);
            assert_eq!(got, want, "{name}");
            assert_eq!(err, refused, "{name}");
        }
    }

    /// Through the layer, as a client reads: an endless error body ends at the limit, an
    /// endless watch line fails.
    #[tokio::test]
    async fn the_layer_bounds_endless_bodies() {
        use http_body_util::BodyExt;

        type Chunks = futures::stream::BoxStream<'static, Result<Frame<Bytes>, std::io::Error>>;
        fn endless(status: u16) -> Response<http_body_util::StreamBody<Chunks>> {
            let chunks = futures::stream::repeat_with(|| Ok(Frame::data(Bytes::from_static(&[b'x'; 4096]))));
            let body = http_body_util::StreamBody::new(futures::StreamExt::boxed(chunks));
            Response::builder().status(status).body(body).unwrap()
        }
        let limits = BodyLimits::IDENTITY;
        for (status, uri, want_err) in [
            (500, "/apis/kairon.zyvor.dev/v1alpha1/machines", false),
            (200, "/apis/kairon.zyvor.dev/v1alpha1/machines?watch=true", true),
            (200, "/apis/kairon.zyvor.dev/v1alpha1/machines", true),
        ] {
            let svc = tower::service_fn(move |_req: Request<()>| async move { Ok::<_, BoxError>(endless(status)) });
            let mut svc = limits.layer(svc);
            let res = svc.call(Request::get(uri).body(()).unwrap()).await.unwrap();
            let got = res.into_body().collect().await;
            match got {
                Ok(b) => {
                    assert!(!want_err, "{uri}: read whole");
                    assert_eq!(b.to_bytes().len(), limits.error_body, "{uri}");
                }
                Err(e) => {
                    assert!(want_err, "{uri}: {e}");
                    assert!(e.to_string().contains("bytes"), "{e}");
                }
            }
        }
    }

    /// A server that answers one byte every 10 s, or never: the request is given up at its
    /// deadline (5 s here), from when it was sent, however often a byte arrives; a watch has
    /// the time it asked for on top.
    #[tokio::test(start_paused = true)]
    async fn a_trickled_or_unanswered_request_is_given_up_at_its_deadline() {
        use http_body_util::BodyExt;

        type Chunks = futures::stream::BoxStream<'static, Result<Frame<Bytes>, std::io::Error>>;
        fn trickle() -> Response<http_body_util::StreamBody<Chunks>> {
            let chunks = futures::stream::unfold((), |()| async {
                tokio::time::sleep(Duration::from_secs(10)).await;
                Some((Ok(Frame::data(Bytes::from_static(b"{"))), ()))
            });
            let body = http_body_util::StreamBody::new(futures::StreamExt::boxed(chunks));
            Response::builder().status(200).body(body).unwrap()
        }
        let list = "/apis/kairon.zyvor.dev/v1/namespaces/t/machinedisruptionbudgets";
        // (case, uri, headers sent, seconds until given up)
        let cases = [
            ("a list trickled a byte at a time", list.to_string(), true, 5),
            ("a list never answered", list.to_string(), false, 5),
            (
                "a watch asking for 20 s",
                format!("{list}?watch=true&timeoutSeconds=20"),
                true,
                25,
            ),
        ];
        for (name, uri, answers, want) in cases {
            let svc = tower::service_fn(move |_req: Request<()>| async move {
                if !answers {
                    std::future::pending::<()>().await;
                }
                Ok::<_, BoxError>(trickle())
            });
            let mut svc = SMALL.layer(svc);
            let start = tokio::time::Instant::now();
            let got = match svc.call(Request::get(uri.as_str()).body(()).unwrap()).await {
                Ok(res) => res.into_body().collect().await.map(|_| ()),
                Err(e) => Err(e),
            };
            let e = got.expect_err(name);
            assert!(e.to_string().contains("did not answer within"), "{name}: {e}");
            assert_eq!(start.elapsed().as_secs(), want, "{name}");
        }
    }
}
