//! The public canary check over HTTP: the same request as the private
//! canary (one greedy token of "The capital of France is"), sent to the
//! engine's OpenAI-style API, compared with the oracle by the protocol's rule.
//! Used for the barrier profile, which has no status handshake of its own.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};
use vsnap_protocol::Oracle;

const PROMPT: &str = "The capital of France is";
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// The most of a response body read (a completion of one token is small).
const BODY_LIMIT: u64 = 1 << 20;

/// The key the engine's API requires (`--api-key`, `VLLM_API_KEY`), sent
/// as a Bearer token. Secret: its Debug form is redacted, and it is never
/// put in a log line or an error.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: String) -> Self {
        ApiKey(key)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// Asks the engine at `addr` (call from inside its network namespace) and
/// checks the answer against `oracle`. `api_key`: the engine's, when its
/// API requires one.
pub fn check(addr: SocketAddr, oracle: &Oracle, api_key: Option<&str>) -> Result<(), String> {
    let client = Client::new(addr, api_key);
    let models = client.request("GET", "/v1/models", None)?;
    let model = models["data"][0]["id"]
        .as_str()
        .ok_or_else(|| format!("GET /v1/models: no model id in {models}"))?
        .to_string();
    let body = json!({
        "model": model, "prompt": PROMPT, "min_tokens": 1, "max_tokens": 1, "temperature": 0,
        "seed": 0, "logprobs": 0, "return_token_ids": true,
    });
    let answer = client.request("POST", "/v1/completions", Some(body))?;
    let observed = observed(&answer)?;
    oracle
        .check_matches(&observed, "HTTP canary")
        .map_err(|e| e.to_string())
}

/// Plain HTTP/1.1 to one address: no proxy (the engine is local to the
/// namespace the call runs in), no redirects, every status read.
struct Client<'a> {
    agent: ureq::Agent,
    base: String,
    api_key: Option<&'a str>,
}

impl<'a> Client<'a> {
    fn new(addr: SocketAddr, api_key: Option<&'a str>) -> Self {
        let agent = ureq::Agent::config_builder()
            .proxy(None)
            .max_redirects(0)
            .http_status_as_error(false)
            .timeout_connect(Some(IO_TIMEOUT))
            .timeout_send_request(Some(IO_TIMEOUT))
            .timeout_send_body(Some(IO_TIMEOUT))
            .timeout_recv_response(Some(IO_TIMEOUT))
            .timeout_recv_body(Some(IO_TIMEOUT))
            .build()
            .new_agent();
        Client {
            agent,
            base: format!("http://{addr}"),
            api_key,
        }
    }

    /// The JSON body of a 200 answer; else an error naming the request and
    /// the status (with the start of the body, which says why).
    fn request(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let fail = |m: String| self.redact(format!("{method} {path}: {m}"));
        let url = format!("{}{path}", self.base);
        let bearer = self.api_key.map(|k| format!("Bearer {k}"));
        let response = match body {
            Some(body) => {
                let mut r = self.agent.post(&url).content_type("application/json");
                if let Some(b) = &bearer {
                    r = r.header("Authorization", b);
                }
                r.send(body.to_string())
            }
            None => {
                let mut r = self.agent.get(&url);
                if let Some(b) = &bearer {
                    r = r.header("Authorization", b);
                }
                r.call()
            }
        };
        let mut response = response.map_err(|e| fail(e.to_string()))?;
        let status = response.status();
        let text = response
            .body_mut()
            .with_config()
            .limit(BODY_LIMIT)
            .lossy_utf8(true)
            .read_to_string()
            .map_err(|e| fail(format!("HTTP {}: reading the body: {e}", status.as_u16())))?;
        if status != ureq::http::StatusCode::OK {
            let said: String = text.trim().chars().take(200).collect();
            return Err(fail(format!("HTTP {status}: {said}")));
        }
        serde_json::from_str(&text).map_err(|e| fail(format!("body is not JSON: {e}")))
    }

    /// The key never leaves in an error, even from a server that echoed it.
    fn redact(&self, message: String) -> String {
        match self.api_key {
            Some(k) if !k.is_empty() => message.replace(k, "<redacted>"),
            _ => message,
        }
    }
}

fn observed(answer: &Value) -> Result<Oracle, String> {
    let choice = &answer["choices"][0];
    let token_ids = choice["token_ids"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .map(|t| t.as_u64().map(|t| t as u32))
                .collect::<Option<Vec<_>>>()
        })
        .ok_or_else(|| format!("POST /v1/completions: no choices[0].token_ids in {answer}"))?;
    let text = choice["text"]
        .as_str()
        .ok_or_else(|| format!("POST /v1/completions: no choices[0].text in {answer}"))?
        .to_string();
    let logprob = choice["logprobs"]["token_logprobs"][0]
        .as_f64()
        .ok_or_else(|| {
            format!("POST /v1/completions: no logprobs.token_logprobs[0] in {answer}")
        })?;
    Ok(Oracle {
        sampled_token_logprob: logprob,
        text,
        token_ids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{TcpListener, TcpStream};

    const KEY: &str = "sk-test-5ecret";

    fn oracle() -> Oracle {
        Oracle {
            sampled_token_logprob: -0.5,
            text: " Paris".into(),
            token_ids: vec![12366],
        }
    }

    /// A stand-in for vLLM's OpenAI server on a local port: answers every
    /// request with a chunked body (as uvicorn does), after checking the
    /// Bearer token when `key` is given (401 without it, as vLLM answers).
    /// Returns its address and what it saw of each request's Authorization.
    fn engine(key: Option<&'static str>) -> (SocketAddr, std::sync::mpsc::Receiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (seen, heard) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                // The test may not listen to what was seen.
                let _ = seen.send(answer(conn, key));
            }
        });
        (addr, heard)
    }

    fn answer(conn: TcpStream, key: Option<&str>) -> String {
        let mut reader = BufReader::new(conn.try_clone().unwrap());
        let (mut request_line, mut auth, mut length) = (String::new(), String::new(), 0);
        reader.read_line(&mut request_line).unwrap();
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':').unwrap();
            match name.to_ascii_lowercase().as_str() {
                "authorization" => auth = value.trim().to_string(),
                "content-length" => length = value.trim().parse().unwrap(),
                _ => {}
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        let authorized = key.is_none_or(|k| auth == format!("Bearer {k}"));
        let (status, body) = if !authorized {
            ("401 Unauthorized", json!({"error": "Unauthorized"}))
        } else if request_line.starts_with("GET /v1/models ") {
            (
                "200 OK",
                json!({"object": "list", "data": [{"id": "qwen", "object": "model"}]}),
            )
        } else if request_line.starts_with("POST /v1/completions ") {
            let asked: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(asked["model"], "qwen");
            assert_eq!(asked["prompt"], PROMPT);
            (
                "200 OK",
                json!({"choices": [{"text": " Paris", "token_ids": [12366],
                    "logprobs": {"token_logprobs": [-0.5]}}]}),
            )
        } else {
            ("404 Not Found", json!({"detail": "Not Found"}))
        };
        let body = body.to_string();
        let (first, second) = body.split_at(body.len() / 2);
        let mut out = conn;
        write!(
            out,
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{first}\r\n{:x}\r\n{second}\r\n0\r\n\r\n",
            first.len(),
            second.len()
        )
        .unwrap();
        auth
    }

    #[test]
    fn a_chunked_answer_is_read_and_checked() {
        let (addr, _) = engine(None);
        check(addr, &oracle(), None).unwrap();
        let other = Oracle {
            text: " Lyon".into(),
            ..oracle()
        };
        let e = check(addr, &other, None).unwrap_err();
        assert!(e.contains("text"), "{e}");
    }

    #[test]
    fn the_api_key_is_sent_as_a_bearer_token() {
        let (addr, heard) = engine(Some(KEY));
        check(addr, &oracle(), Some(KEY)).unwrap();
        assert_eq!(heard.recv().unwrap(), format!("Bearer {KEY}"));
    }

    #[test]
    fn without_the_key_the_status_is_named_and_the_key_never_shown() {
        let (addr, _) = engine(Some(KEY));
        let e = check(addr, &oracle(), None).unwrap_err();
        assert!(
            e.starts_with("GET /v1/models: HTTP 401 Unauthorized"),
            "{e}"
        );
        let e = check(addr, &oracle(), Some("sk-wrong")).unwrap_err();
        assert!(e.contains("HTTP 401") && !e.contains("sk-wrong"), "{e}");
    }

    #[test]
    fn a_key_echoed_by_the_server_is_redacted_from_the_error() {
        let client = Client::new("127.0.0.1:1".parse().unwrap(), Some(KEY));
        assert_eq!(
            client.redact(format!("GET /: HTTP 400: bad token {KEY}")),
            "GET /: HTTP 400: bad token <redacted>"
        );
    }

    /// ureq traces the bytes it sends, Authorization included: trace
    /// records must not exist in the shim (shim/Cargo.toml).
    #[test]
    fn the_http_clients_wire_traces_are_compiled_out() {
        assert!(log::STATIC_MAX_LEVEL <= log::LevelFilter::Debug);
    }

    #[test]
    fn an_api_keys_debug_form_is_redacted() {
        let key = ApiKey::new(KEY.into());
        assert_eq!(format!("{key:?}"), "ApiKey(<redacted>)");
        assert_eq!(
            format!("{:?}", Some(key.clone())),
            "Some(ApiKey(<redacted>))"
        );
        assert_eq!(key.expose(), KEY);
    }

    #[test]
    fn an_openai_answer_is_read_as_an_oracle() {
        let a = json!({"choices": [{"text": "u", "token_ids": [85], "logprobs": {"token_logprobs": [-1.25]}}]});
        let o = observed(&a).unwrap();
        assert_eq!(
            (
                o.text.as_str(),
                o.token_ids.as_slice(),
                o.sampled_token_logprob
            ),
            ("u", &[85u32][..], -1.25)
        );
        assert!(observed(&json!({"choices": []}))
            .unwrap_err()
            .contains("token_ids"));
    }
}
