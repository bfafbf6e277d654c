//! Fault rules: what `POST /_faults` accepts, and the shared state every S3 request consults.
//!
//! Contract: rules are kept in the order they were added; each S3 request is counted, then
//! takes at most one fault, from the first rule whose method and path match and that has
//! `times` left; taking it counts that rule down (a rule at zero is removed) and counts the
//! fault's kind as fired. `reset` clears rules and counters together.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use http::Method;
use serde::Deserialize;

/// What a fault does to one request. See the crate README for the wire behaviour of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// 503 with the S3 `SlowDown` error body, not forwarded.
    SlowDown,
    /// 500 with the S3 `InternalError` error body, not forwarded.
    InternalError,
    /// The connection is closed without a response.
    Drop,
    /// Forwarded; the status and headers are sent, then half the body, then the connection
    /// is aborted.
    Truncate,
    /// Forwarded after this pause.
    Delay(Duration),
    /// Forwarded; the response's ETag header (when it has one) is replaced by
    /// [`WRONG_ETAG`].
    WrongEtag,
}

/// The ETag a `wrong_etag` fault puts in place of the real one (quoted, as S3 sends them).
pub const WRONG_ETAG: &str = "\"00000000000000000000000000000000\"";

/// The kind names of the JSON API, in the order `GET /_faults` lists them.
pub const KIND_NAMES: [&str; 6] = [
    "slow_down",
    "internal_error",
    "drop",
    "truncate",
    "delay",
    "wrong_etag",
];

impl Fault {
    /// The kind's name in the JSON API (one of [`KIND_NAMES`]).
    pub fn kind_name(self) -> &'static str {
        match self {
            Fault::SlowDown => KIND_NAMES[0],
            Fault::InternalError => KIND_NAMES[1],
            Fault::Drop => KIND_NAMES[2],
            Fault::Truncate => KIND_NAMES[3],
            Fault::Delay(_) => KIND_NAMES[4],
            Fault::WrongEtag => KIND_NAMES[5],
        }
    }
}

/// Which request methods a rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum MethodMatch {
    /// `GET`.
    Get,
    /// `PUT`.
    Put,
    /// `POST`.
    Post,
    /// `HEAD`.
    Head,
    /// `DELETE`.
    Delete,
    /// Every method (the default when `method` is left out).
    #[default]
    Any,
}

impl MethodMatch {
    fn matches(self, method: &Method) -> bool {
        match self {
            MethodMatch::Any => true,
            MethodMatch::Get => method == Method::GET,
            MethodMatch::Put => method == Method::PUT,
            MethodMatch::Post => method == Method::POST,
            MethodMatch::Head => method == Method::HEAD,
            MethodMatch::Delete => method == Method::DELETE,
        }
    }

    fn name(self) -> &'static str {
        match self {
            MethodMatch::Get => "GET",
            MethodMatch::Put => "PUT",
            MethodMatch::Post => "POST",
            MethodMatch::Head => "HEAD",
            MethodMatch::Delete => "DELETE",
            MethodMatch::Any => "ANY",
        }
    }
}

/// The JSON body of `POST /_faults`, as sent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSpec {
    kind: String,
    #[serde(default)]
    method: MethodMatch,
    #[serde(default)]
    path_contains: String,
    #[serde(default = "one")]
    times: u64,
    delay_ms: Option<u64>,
}

fn one() -> u64 {
    1
}

/// One rule: a fault, which requests it matches, and how many more it applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    fault: Fault,
    method: MethodMatch,
    /// Matched as a substring of the request target (path and query, as sent).
    path_contains: String,
    remaining: u64,
}

impl Rule {
    /// Parses and checks a `POST /_faults` body.
    ///
    /// # Errors
    /// A message for the client (answered as 400) when the JSON is malformed, has unknown
    /// fields or an unknown kind, `times` is 0, or `delay_ms` is missing for `delay` or
    /// given for another kind.
    pub fn from_json(body: &[u8]) -> Result<Rule, String> {
        let spec: RuleSpec =
            serde_json::from_slice(body).map_err(|e| format!("invalid fault rule: {e}"))?;
        let fault = match (spec.kind.as_str(), spec.delay_ms) {
            ("delay", Some(ms)) => Fault::Delay(Duration::from_millis(ms)),
            ("delay", None) => return Err("kind \"delay\" needs \"delay_ms\"".to_owned()),
            (_, Some(_)) => return Err("\"delay_ms\" only applies to kind \"delay\"".to_owned()),
            ("slow_down", None) => Fault::SlowDown,
            ("internal_error", None) => Fault::InternalError,
            ("drop", None) => Fault::Drop,
            ("truncate", None) => Fault::Truncate,
            ("wrong_etag", None) => Fault::WrongEtag,
            (other, None) => {
                return Err(format!(
                    "unknown fault kind {other:?}; known: {}",
                    KIND_NAMES.join(", ")
                ))
            }
        };
        if spec.times == 0 {
            return Err("\"times\" must be at least 1".to_owned());
        }
        Ok(Rule {
            fault,
            method: spec.method,
            path_contains: spec.path_contains,
            remaining: spec.times,
        })
    }

    fn matches(&self, method: &Method, target: &str) -> bool {
        self.remaining > 0 && self.method.matches(method) && target.contains(&self.path_contains)
    }
}

#[derive(Debug, Default)]
struct Inner {
    rules: Vec<Rule>,
    fired: BTreeMap<&'static str, u64>,
    requests: BTreeMap<String, u64>,
}

/// The rules and counters, shared by every connection.
#[derive(Debug, Default)]
pub struct FaultState {
    inner: Mutex<Inner>,
}

impl FaultState {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The state stays consistent even if a holder panicked: every update is one step.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Appends a rule after the existing ones; returns how many rules are now active.
    pub fn add(&self, rule: Rule) -> usize {
        let mut inner = self.lock();
        inner.rules.push(rule);
        inner.rules.len()
    }

    /// Removes every rule and zeroes the counters.
    pub fn reset(&self) {
        *self.lock() = Inner::default();
    }

    /// Counts one S3 request and returns the fault it gets, if any (see the module docs).
    /// `target` is the request's path and query as sent.
    pub fn on_request(&self, method: &Method, target: &str) -> Option<Fault> {
        let mut inner = self.lock();
        *inner
            .requests
            .entry(method.as_str().to_owned())
            .or_default() += 1;
        let index = inner.rules.iter().position(|r| r.matches(method, target))?;
        let rule = &mut inner.rules[index];
        rule.remaining -= 1;
        let fault = rule.fault;
        if rule.remaining == 0 {
            inner.rules.remove(index);
        }
        *inner.fired.entry(fault.kind_name()).or_default() += 1;
        Some(fault)
    }

    /// The `GET /_faults` answer: `fired` per kind (every kind listed, zeros included),
    /// `requests` per method (GET, PUT, POST, HEAD, DELETE always listed, other methods
    /// once seen), and the active `rules` with the times each has left.
    pub fn snapshot(&self) -> serde_json::Value {
        let inner = self.lock();
        let fired: serde_json::Map<String, serde_json::Value> = KIND_NAMES
            .iter()
            .map(|&k| {
                (
                    k.to_owned(),
                    inner.fired.get(k).copied().unwrap_or(0).into(),
                )
            })
            .collect();
        let mut requests: BTreeMap<String, u64> = ["GET", "PUT", "POST", "HEAD", "DELETE"]
            .iter()
            .map(|m| ((*m).to_owned(), 0))
            .collect();
        for (method, n) in &inner.requests {
            requests.insert(method.clone(), *n);
        }
        let rules: Vec<serde_json::Value> = inner
            .rules
            .iter()
            .map(|r| {
                let mut v = serde_json::json!({
                    "kind": r.fault.kind_name(),
                    "method": r.method.name(),
                    "path_contains": r.path_contains,
                    "times": r.remaining,
                });
                if let Fault::Delay(d) = r.fault {
                    v["delay_ms"] = u64::try_from(d.as_millis()).unwrap_or(u64::MAX).into();
                }
                v
            })
            .collect();
        serde_json::json!({ "fired": fired, "requests": requests, "rules": rules })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(json: &str) -> Rule {
        Rule::from_json(json.as_bytes()).unwrap()
    }

    #[test]
    fn parses_defaults_and_rejects_bad_rules() {
        let r = rule(r#"{"kind": "slow_down"}"#);
        assert_eq!(r.fault, Fault::SlowDown);
        assert_eq!(r.method, MethodMatch::Any);
        assert_eq!(r.path_contains, "");
        assert_eq!(r.remaining, 1);
        let r = rule(r#"{"kind": "delay", "delay_ms": 250, "method": "GET", "times": 3}"#);
        assert_eq!(r.fault, Fault::Delay(Duration::from_millis(250)));
        assert_eq!(r.method, MethodMatch::Get);
        assert_eq!(r.remaining, 3);

        for bad in [
            r#"{"kind": "delay"}"#,
            r#"{"kind": "drop", "delay_ms": 5}"#,
            r#"{"kind": "explode"}"#,
            r#"{"kind": "drop", "times": 0}"#,
            r#"{"kind": "drop", "method": "PATCH"}"#,
            r#"{"kind": "drop", "path": "/b"}"#,
            "not json",
        ] {
            assert!(Rule::from_json(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn first_matching_rule_wins_and_counts_down() {
        let state = FaultState::default();
        state.add(rule(
            r#"{"kind": "slow_down", "method": "PUT", "path_contains": "/b/x", "times": 2}"#,
        ));
        state.add(rule(r#"{"kind": "drop", "method": "ANY"}"#));

        // GET does not match the first rule; the second (ANY) takes it.
        assert_eq!(state.on_request(&Method::GET, "/b/x"), Some(Fault::Drop));
        // The ANY rule is used up; PUTs to another key match nothing.
        assert_eq!(state.on_request(&Method::PUT, "/b/y"), None);
        assert_eq!(
            state.on_request(&Method::PUT, "/b/x?partNumber=1"),
            Some(Fault::SlowDown)
        );
        assert_eq!(
            state.on_request(&Method::PUT, "/b/x"),
            Some(Fault::SlowDown)
        );
        assert_eq!(state.on_request(&Method::PUT, "/b/x"), None);

        let snap = state.snapshot();
        assert_eq!(snap["fired"]["slow_down"], 2);
        assert_eq!(snap["fired"]["drop"], 1);
        assert_eq!(snap["fired"]["truncate"], 0);
        assert_eq!(snap["requests"]["PUT"], 4);
        assert_eq!(snap["requests"]["GET"], 1);
        assert_eq!(snap["requests"]["HEAD"], 0);
        assert_eq!(snap["rules"].as_array().unwrap().len(), 0);

        state.add(rule(r#"{"kind": "truncate"}"#));
        state.reset();
        assert_eq!(state.on_request(&Method::GET, "/b/x"), None);
        let snap = state.snapshot();
        assert_eq!(snap["fired"]["slow_down"], 0);
        assert_eq!(snap["requests"]["GET"], 1);
    }
}
