//! The OpenAI-style API: `GET /health`, `GET /v1/models`, `POST /v1/completions`, and
//! `GET /v1/identity` (identity.rs).
//! Greedy decoding only; any malformed request is a 400 with a JSON error, never a panic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use crate::http::{Request, Response};
use crate::identity::Userspace;
use crate::model::{encode, token_text, Model, MAX_CONTEXT, VOCAB};

const DEFAULT_MAX_TOKENS: u64 = 16;
const MAX_TOKENS_LIMIT: u64 = 1024;
const MAX_PROMPT_CHARS: usize = 4096;
const MAX_LOGPROBS: u64 = 20;

pub struct App {
    model: Arc<Model>,
    name: String,
    next_id: AtomicU64,
    userspace: Arc<Userspace>,
}

/// A validated completion request.
#[derive(Debug, PartialEq)]
struct Completion {
    prompt: Vec<u32>,
    max_tokens: usize,
    logprobs: Option<usize>,
    return_token_ids: bool,
}

impl App {
    pub fn new(model: Arc<Model>, name: String, userspace: Arc<Userspace>) -> Self {
        App {
            model,
            name,
            next_id: AtomicU64::new(0),
            userspace,
        }
    }

    pub fn route(&self, request: &Request) -> Response {
        match (request.method.as_str(), request.path.as_str()) {
            ("GET", "/health") => Response {
                status: 200,
                content_type: "text/plain",
                body: Vec::new(),
            },
            ("GET", "/v1/models") => Response::json(
                200,
                &json!({"object": "list", "data": [{"id": self.name, "object": "model", "owned_by": "vsnap"}]}),
            ),
            ("GET", "/watch") => Response::json(200, &crate::watch::report()),
            ("GET", "/v1/identity") => Response::json(200, &self.userspace.report()),
            ("POST", "/v1/completions") => match parse_completion(&request.body) {
                Ok(completion) => self.complete(&completion),
                Err(message) => Response::error(400, &message),
            },
            (_, "/health" | "/v1/models" | "/v1/completions" | "/v1/identity") => {
                Response::error(405, "method not allowed")
            }
            _ => Response::error(404, "not found"),
        }
    }

    fn complete(&self, request: &Completion) -> Response {
        let steps = self.model.generate(
            &request.prompt,
            request.max_tokens,
            request.logprobs.unwrap_or(0),
        );
        let text: String = steps.iter().map(|s| token_text(s.token)).collect();
        let mut choice = Map::new();
        choice.insert("index".into(), json!(0));
        choice.insert("text".into(), json!(text));
        if request.return_token_ids {
            choice.insert("prompt_token_ids".into(), json!(request.prompt));
            let ids: Vec<u32> = steps.iter().map(|s| s.token).collect();
            choice.insert("token_ids".into(), json!(ids));
        }
        let logprobs = match request.logprobs {
            None => Value::Null,
            Some(n) => json!({
                "tokens": steps.iter().map(|s| token_text(s.token)).collect::<Vec<_>>(),
                "token_logprobs": steps.iter().map(|s| s.logprob).collect::<Vec<_>>(),
                "top_logprobs": if n == 0 {
                    Value::Null
                } else {
                    steps
                        .iter()
                        .map(|s| {
                            s.top
                                .iter()
                                .map(|(t, lp)| (token_text(*t), json!(lp)))
                                .collect::<Map<_, _>>()
                        })
                        .collect()
                },
            }),
        };
        choice.insert("logprobs".into(), logprobs);
        choice.insert("finish_reason".into(), json!("length"));
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        Response::json(
            200,
            &json!({
                "id": format!("cmpl-{}-{id}", std::process::id()),
                "object": "text_completion",
                "created": created,
                "model": self.name,
                "choices": [Value::Object(choice)],
                "usage": {
                    "prompt_tokens": request.prompt.len(),
                    "completion_tokens": steps.len(),
                    "total_tokens": request.prompt.len() + steps.len(),
                },
            }),
        )
    }
}

/// Validates a completion request, field group by field group, in the order
/// their errors are reported.
fn parse_completion(body: &[u8]) -> Result<Completion, String> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("request body is not JSON: {e}"))?;
    let Value::Object(fields) = value else {
        return Err("request body must be a JSON object".into());
    };
    if let Some(model) = field(&fields, "model") {
        if !model.is_string() {
            return Err("model must be a string".into());
        }
    }
    let prompt = prompt(&fields)?;
    let max_tokens = token_limits(&fields)?;
    check_greedy(&fields)?;
    let logprobs = logprobs(&fields)?;
    let return_token_ids = match field(&fields, "return_token_ids") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("return_token_ids must be a boolean".into()),
    };
    check_one_whole_choice(&fields)?;
    let prompt = encode(&prompt);
    if prompt.len() + max_tokens as usize > MAX_CONTEXT {
        return Err(format!(
            "prompt plus max_tokens exceeds the context of {MAX_CONTEXT}"
        ));
    }
    Ok(Completion {
        prompt,
        max_tokens: max_tokens as usize,
        logprobs,
        return_token_ids,
    })
}

/// A field's value; JSON null counts as absent.
fn field<'a>(fields: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    fields.get(key).filter(|v| !v.is_null())
}

/// The prompt: one non-empty string (or a list of exactly one), at most
/// MAX_PROMPT_CHARS characters.
fn prompt(fields: &Map<String, Value>) -> Result<String, String> {
    let prompt = match field(fields, "prompt") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(items)) => match items.as_slice() {
            [Value::String(s)] => s.clone(),
            _ => return Err("prompt must be a string or a list of exactly one string".into()),
        },
        Some(_) => return Err("prompt must be a string".into()),
        None => return Err("prompt is required".into()),
    };
    if prompt.is_empty() {
        return Err("prompt must not be empty".into());
    }
    if prompt.chars().count() > MAX_PROMPT_CHARS {
        return Err(format!(
            "prompt is longer than {MAX_PROMPT_CHARS} characters"
        ));
    }
    Ok(prompt)
}

/// `max_tokens` (returned) and `min_tokens`, which must not exceed it.
fn token_limits(fields: &Map<String, Value>) -> Result<u64, String> {
    let max_tokens = match field(fields, "max_tokens") {
        None => DEFAULT_MAX_TOKENS,
        Some(v) => v
            .as_u64()
            .filter(|n| (1..=MAX_TOKENS_LIMIT).contains(n))
            .ok_or_else(|| format!("max_tokens must be an integer from 1 to {MAX_TOKENS_LIMIT}"))?,
    };
    let min_tokens = match field(fields, "min_tokens") {
        None => 0,
        Some(v) => v
            .as_u64()
            .ok_or("min_tokens must be a non-negative integer")?,
    };
    if min_tokens > max_tokens {
        return Err("min_tokens must not exceed max_tokens".into());
    }
    Ok(max_tokens)
}

/// Sampling settings this engine accepts: temperature 0 (or none) and an
/// integer seed, which greedy decoding ignores.
fn check_greedy(fields: &Map<String, Value>) -> Result<(), String> {
    // Missing temperature means greedy here: this engine has no sampler.
    if let Some(t) = field(fields, "temperature") {
        if t.as_f64() != Some(0.0) {
            return Err("only temperature 0 (greedy decoding) is supported".into());
        }
    }
    if let Some(seed) = field(fields, "seed") {
        if !(seed.is_i64() || seed.is_u64()) {
            return Err("seed must be an integer".into());
        }
    }
    Ok(())
}

/// How many top logprobs each token reports, if any.
fn logprobs(fields: &Map<String, Value>) -> Result<Option<usize>, String> {
    Ok(match field(fields, "logprobs") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .filter(|n| *n <= MAX_LOGPROBS.min(VOCAB as u64))
                .ok_or_else(|| format!("logprobs must be an integer from 0 to {MAX_LOGPROBS}"))?
                as usize,
        ),
    })
}

/// One choice, answered whole: no streaming, `n` 1.
fn check_one_whole_choice(fields: &Map<String, Value>) -> Result<(), String> {
    if field(fields, "stream") == Some(&Value::Bool(true)) {
        return Err("streaming is not supported".into());
    }
    if let Some(n) = field(fields, "n") {
        if n.as_u64() != Some(1) {
            return Err("only n = 1 is supported".into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Weights;

    fn app() -> App {
        App::new(
            Arc::new(Model::new(Weights::generate(1))),
            "m".into(),
            Arc::new(Userspace::with_seed(1)),
        )
    }

    fn post(app: &App, body: &str) -> (u16, Value) {
        let response = app.route(&Request {
            method: "POST".into(),
            path: "/v1/completions".into(),
            body: body.as_bytes().to_vec(),
        });
        (
            response.status,
            serde_json::from_slice(&response.body).unwrap_or(Value::Null),
        )
    }

    #[test]
    fn canary_request_returns_one_token_with_ids_and_logprob() {
        let (status, body) = post(
            &app(),
            r#"{"model":"m","prompt":"The capital of France is","min_tokens":1,"max_tokens":1,"temperature":0,"seed":0,"logprobs":0,"return_token_ids":true}"#,
        );
        assert_eq!(status, 200, "{body}");
        let choice = &body["choices"][0];
        assert_eq!(choice["token_ids"].as_array().unwrap().len(), 1);
        assert_eq!(choice["text"].as_str().unwrap().chars().count(), 1);
        assert!(choice["logprobs"]["token_logprobs"][0].as_f64().unwrap() < 0.0);
        assert_eq!(body["object"], "text_completion");
        assert_eq!(choice["finish_reason"], "length");
    }

    #[test]
    fn default_max_tokens_is_sixteen() {
        let (status, body) = post(&app(), r#"{"prompt":"hi"}"#);
        assert_eq!(status, 200);
        assert_eq!(body["usage"]["completion_tokens"], 16);
        assert_eq!(body["choices"][0]["logprobs"], Value::Null);
        assert!(body["choices"][0].get("token_ids").is_none());
    }

    #[test]
    fn top_logprobs_are_ranked() {
        let (_, body) = post(&app(), r#"{"prompt":"hi","max_tokens":2,"logprobs":3}"#);
        let top = body["choices"][0]["logprobs"]["top_logprobs"][0]
            .as_object()
            .unwrap();
        assert_eq!(top.len(), 3);
    }

    #[test]
    fn bad_requests_are_400_with_a_message() {
        for body in [
            "",
            "not json",
            "[]",
            r#"{"max_tokens":1}"#,
            r#"{"prompt":""}"#,
            r#"{"prompt":5}"#,
            r#"{"prompt":["a","b"]}"#,
            r#"{"prompt":"a","temperature":0.7}"#,
            r#"{"prompt":"a","temperature":"0"}"#,
            r#"{"prompt":"a","max_tokens":0}"#,
            r#"{"prompt":"a","max_tokens":-3}"#,
            r#"{"prompt":"a","max_tokens":100000}"#,
            r#"{"prompt":"a","max_tokens":2,"min_tokens":3}"#,
            r#"{"prompt":"a","logprobs":99}"#,
            r#"{"prompt":"a","return_token_ids":"yes"}"#,
            r#"{"prompt":"a","stream":true}"#,
            r#"{"prompt":"a","n":2}"#,
            r#"{"prompt":"a","seed":1.5}"#,
        ] {
            let (status, reply) = post(&app(), body);
            assert_eq!(status, 400, "{body}: {reply}");
            assert!(reply["message"].is_string(), "{body}");
        }
    }

    #[test]
    fn unknown_routes_and_methods() {
        let app = app();
        let get = |method: &str, path: &str| {
            app.route(&Request {
                method: method.into(),
                path: path.into(),
                body: Vec::new(),
            })
            .status
        };
        assert_eq!(get("GET", "/health"), 200);
        assert_eq!(get("GET", "/v1/models"), 200);
        assert_eq!(get("GET", "/nope"), 404);
        assert_eq!(get("DELETE", "/v1/completions"), 405);
        assert_eq!(get("GET", "/v1/identity"), 200);
        assert_eq!(get("POST", "/v1/identity"), 405);
    }

    #[test]
    fn random_bodies_never_panic() {
        let app = app();
        let mut rng = crate::prng::SplitMix64::new(9);
        let seed =
            br#"{"prompt":"The capital","max_tokens":2,"logprobs":1,"return_token_ids":true}"#;
        for _ in 0..2_000 {
            let mut body = seed.to_vec();
            for _ in 0..3 {
                let at = (rng.next_u64() as usize) % (body.len() + 1);
                match rng.next_u64() % 3 {
                    0 => body.truncate(at),
                    1 => body.insert(at, rng.next_u64() as u8),
                    _ => {
                        if at < body.len() {
                            body[at] ^= 1 << (rng.next_u64() % 8);
                        }
                    }
                }
            }
            let status = app
                .route(&Request {
                    method: "POST".into(),
                    path: "/v1/completions".into(),
                    body,
                })
                .status;
            assert!(status == 200 || status == 400);
        }
    }
}
