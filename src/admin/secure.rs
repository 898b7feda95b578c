//! `/metrics` over HTTPS with authentication and authorization, as controller-runtime's secure
//! metrics server (and so every CAPI manager) serves it by default: the caller's bearer token
//! is checked with a TokenReview, then the user is asked for with a SubjectAccessReview of
//! `get` on the non-resource URL `/metrics`. 401 without a valid token, 403 without the grant.
//! Answers are kept for a minute per token, so a scrape costs the API server nothing most of
//! the time.
//!
//! Anyone who can reach the port can send tokens, so what they cost is bounded:
//!
//! - reviews go out on a client of their own with its own token bucket ([`REVIEW_QPS`],
//!   [`REVIEW_BURST`]), never on the client of leader election and probes;
//! - at most [`UNKNOWN_AT_ONCE`] reviews of tokens not seen allowed before run at once; a
//!   caller that finds them all busy gets 429 at once (nothing queues);
//! - answers are remembered by the token's SHA-256, allowed and refused ones apart, and a
//!   full record drops its oldest entry only: random tokens fill the record of refused ones
//!   and never push out a reader, whose answer is renewed ahead of unknown callers (a lane of
//!   its own, the urgent lane of the bucket);
//! - the TLS server ([`super::tls`]) bounds connections and how long they may idle.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{Api, PostParams};
use tokio::sync::Semaphore;
use tracing::{debug, warn};

/// How long a review's answer is reused for the same token.
const REVIEW_TTL: Duration = Duration::from_secs(60);
/// Tokens allowed recently, remembered at most.
const MAX_ALLOWED: usize = 64;
/// Tokens refused recently, remembered at most.
const MAX_REFUSED: usize = 1024;
/// The reviews' own client: requests per second (a review is a TokenReview and, for a valid
/// token, a SubjectAccessReview), and the burst.
pub(crate) const REVIEW_QPS: f32 = 2.0;
pub(crate) const REVIEW_BURST: u32 = 10;
/// Reviews at once of tokens not allowed before; more callers get 429.
const UNKNOWN_AT_ONCE: usize = 2;
/// Renewals at once of answers of tokens allowed before; more wait for their turn.
const KNOWN_AT_ONCE: usize = 2;
/// Longest a review may take.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

/// A token as remembered: its SHA-256.
type TokenKey = [u8; 32];

fn token_key(token: &str) -> TokenKey {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(digest.as_ref());
    key
}

/// Answers of reviews by token, at most `capacity`; a full record drops its oldest entry.
struct Remembered {
    entries: HashMap<TokenKey, (Instant, StatusCode)>,
    capacity: usize,
}

impl Remembered {
    fn new(capacity: usize) -> Self {
        Remembered {
            entries: HashMap::new(),
            capacity,
        }
    }

    /// The answer for `key`, if given less than [`REVIEW_TTL`] ago.
    fn fresh(&self, key: &TokenKey) -> Option<StatusCode> {
        self.entries
            .get(key)
            .filter(|(at, _)| at.elapsed() < REVIEW_TTL)
            .map(|(_, code)| *code)
    }

    fn contains(&self, key: &TokenKey) -> bool {
        self.entries.contains_key(key)
    }

    fn remember(&mut self, key: TokenKey, code: StatusCode) {
        if !self.entries.contains_key(&key)
            && self.entries.len() >= self.capacity
            && let Some(oldest) = self.entries.iter().min_by_key(|(_, (at, _))| *at).map(|(k, _)| *k)
        {
            self.entries.remove(&oldest);
        }
        self.entries.insert(key, (Instant::now(), code));
    }

    fn forget(&mut self, key: &TokenKey) {
        self.entries.remove(key);
    }
}

/// The answers remembered: allowed and refused apart, so that refused ones never push out an
/// allowed one.
struct Answers {
    allowed: Remembered,
    refused: Remembered,
}

/// Who may read `/metrics`: asks the API server, remembers its answers briefly.
#[derive(Clone)]
pub(crate) struct Gate {
    /// The reviews' own client, rate-limited ([`REVIEW_QPS`], [`REVIEW_BURST`]).
    client: kube::Client,
    answers: Arc<Mutex<Answers>>,
    unknown: Arc<Semaphore>,
    known: Arc<Semaphore>,
}

impl Gate {
    pub(crate) fn new(client: kube::Client) -> Gate {
        Gate {
            client,
            answers: Arc::new(Mutex::new(Answers {
                allowed: Remembered::new(MAX_ALLOWED),
                refused: Remembered::new(MAX_REFUSED),
            })),
            unknown: Arc::new(Semaphore::new(UNKNOWN_AT_ONCE)),
            known: Arc::new(Semaphore::new(KNOWN_AT_ONCE)),
        }
    }

    fn answers(&self) -> std::sync::MutexGuard<'_, Answers> {
        self.answers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// 200 when the token's user may `get /metrics`, 401 for no or an invalid token, 403
    /// otherwise; 429 when too many unknown tokens are being reviewed; 500 (not remembered)
    /// when the API server could not be asked.
    async fn decide(&self, token: Option<&str>) -> StatusCode {
        let Some(token) = token.filter(|t| !t.is_empty()) else {
            return StatusCode::UNAUTHORIZED;
        };
        let key = token_key(token);
        let known = {
            let answers = self.answers();
            if let Some(code) = answers.allowed.fresh(&key).or_else(|| answers.refused.fresh(&key)) {
                return code;
            }
            answers.allowed.contains(&key)
        };
        let turn = if known {
            self.known.clone().acquire_owned().await.ok()
        } else {
            self.unknown.clone().try_acquire_owned().ok()
        };
        let Some(_turn) = turn else {
            debug!("too many /metrics callers being reviewed; answering 429");
            return StatusCode::TOO_MANY_REQUESTS;
        };
        // Renewed by another request of the same reader while this one waited.
        if let Some(code) = self.answers().allowed.fresh(&key) {
            return code;
        }
        let review = tokio::time::timeout(REVIEW_TIMEOUT, self.review(token));
        let reviewed = if known {
            crate::client::urgent(review).await
        } else {
            review.await
        };
        let code = match reviewed {
            Ok(Ok(code)) => code,
            Ok(Err(e)) => {
                warn!(error = %e, "could not review a /metrics caller");
                return StatusCode::INTERNAL_SERVER_ERROR;
            }
            Err(_) => {
                warn!(timeout = ?REVIEW_TIMEOUT, "could not review a /metrics caller in time");
                return StatusCode::INTERNAL_SERVER_ERROR;
            }
        };
        let mut answers = self.answers();
        if code == StatusCode::OK {
            answers.refused.forget(&key);
            answers.allowed.remember(key, code);
        } else {
            answers.allowed.forget(&key);
            answers.refused.remember(key, code);
        }
        code
    }

    async fn review(&self, token: &str) -> Result<StatusCode, kube::Error> {
        let tr = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        let tr = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &tr)
            .await?;
        let status = tr.status.unwrap_or_default();
        let Some(user) = status.user.filter(|_| status.authenticated == Some(true)) else {
            return Ok(StatusCode::UNAUTHORIZED);
        };
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                groups: user.groups.clone(),
                uid: user.uid.clone(),
                extra: user.extra.clone(),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".into()),
                    verb: Some("get".into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let sar = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &sar)
            .await?;
        let allowed = sar.status.is_some_and(|s| s.allowed);
        debug!(user = ?user.username, allowed, "reviewed a /metrics caller");
        Ok(if allowed { StatusCode::OK } else { StatusCode::FORBIDDEN })
    }
}

/// The middleware in front of `/metrics`.
async fn authorize(State(gate): State<Gate>, req: Request, next: Next) -> Response {
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match gate.decide(token).await {
        StatusCode::OK => next.run(req).await,
        StatusCode::TOO_MANY_REQUESTS => (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, "1")],
            "Too Many Requests".to_string(),
        )
            .into_response(),
        code => (code, code.canonical_reason().unwrap_or_default().to_string()).into_response(),
    }
}

/// `app` behind the gate.
pub(crate) fn guarded(app: Router, gate: Gate) -> Router {
    app.layer(middleware::from_fn_with_state(gate, authorize))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request as HttpRequest, Response as HttpResponse};
    use kube::client::Body;

    #[test]
    fn refused_tokens_never_push_out_an_allowed_one_and_a_full_record_drops_its_oldest_only() {
        let mut answers = Answers {
            allowed: Remembered::new(MAX_ALLOWED),
            refused: Remembered::new(MAX_REFUSED),
        };
        let reader = token_key("reader");
        answers.allowed.remember(reader, StatusCode::OK);
        let first = token_key("random-0");
        for i in 0..2000 {
            answers
                .refused
                .remember(token_key(&format!("random-{i}")), StatusCode::UNAUTHORIZED);
        }
        assert_eq!(answers.allowed.fresh(&reader), Some(StatusCode::OK), "the reader stays");
        assert_eq!(answers.refused.entries.len(), MAX_REFUSED, "full, not wiped");
        assert!(!answers.refused.contains(&first), "the oldest went");
        assert_eq!(
            answers.refused.fresh(&token_key("random-1999")),
            Some(StatusCode::UNAUTHORIZED),
            "the newest stays"
        );
        assert_ne!(token_key("a"), token_key("b"));
        assert_eq!(token_key("a"), token_key("a"));
    }

    /// Unknown tokens are reviewed [`UNKNOWN_AT_ONCE`] at a time; one more caller gets 429
    /// without a request, while a token allowed before is still renewed.
    #[tokio::test]
    async fn unknown_tokens_beyond_the_reviews_at_once_get_429_and_a_reader_is_still_renewed() {
        let (service, mut handle) = tower_test::mock::pair::<HttpRequest<Body>, HttpResponse<Body>>();
        let gate = Gate::new(kube::Client::new(service, "default"));
        // The reader was allowed before; its answer has expired.
        let long_ago = Instant::now()
            .checked_sub(REVIEW_TTL + Duration::from_secs(1))
            .expect("a monotonic clock older than a minute");
        gate.answers()
            .allowed
            .entries
            .insert(token_key("reader"), (long_ago, StatusCode::OK));

        let mut pending = vec![];
        for i in 0..UNKNOWN_AT_ONCE {
            let gate = gate.clone();
            pending.push(tokio::spawn(
                async move { gate.decide(Some(&format!("unknown-{i}"))).await },
            ));
        }
        let mut held = vec![];
        for _ in 0..UNKNOWN_AT_ONCE {
            let (req, send) = handle.next_request().await.expect("a review");
            assert!(req.uri().path().ends_with("/tokenreviews"), "{}", req.uri());
            held.push(send);
        }
        assert_eq!(
            gate.decide(Some("one-more")).await,
            StatusCode::TOO_MANY_REQUESTS,
            "every review place is taken"
        );

        let reader = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.decide(Some("reader")).await })
        };
        let answer = |body: serde_json::Value| {
            HttpResponse::builder()
                .status(201)
                .body(Body::from(serde_json::to_vec(&body).unwrap()))
                .unwrap()
        };
        let (req, send) = handle.next_request().await.expect("the reader's review");
        assert!(req.uri().path().ends_with("/tokenreviews"), "{}", req.uri());
        send.send_response(answer(serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {},
            "status": {"authenticated": true, "user": {"username": "system:serviceaccount:monitoring:prometheus"}}
        })));
        let (req, send) = handle.next_request().await.expect("the reader's access review");
        assert!(req.uri().path().ends_with("/subjectaccessreviews"), "{}", req.uri());
        send.send_response(answer(serde_json::json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {},
            "status": {"allowed": true}
        })));
        assert_eq!(reader.await.unwrap(), StatusCode::OK);

        for send in held {
            send.send_response(answer(serde_json::json!({
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {},
                "status": {"authenticated": false}
            })));
        }
        for p in pending {
            assert_eq!(p.await.unwrap(), StatusCode::UNAUTHORIZED);
        }
        // Refused answers are remembered: asked again, no request.
        assert_eq!(gate.decide(Some("unknown-0")).await, StatusCode::UNAUTHORIZED);
        assert!(
            tokio::time::timeout(Duration::from_millis(100), handle.next_request())
                .await
                .is_err(),
            "no request for an answer remembered"
        );
    }
}
