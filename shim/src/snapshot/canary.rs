//! The public canary check over HTTP: the same request as the private
//! canary (one greedy token of "The capital of France is"), sent to the
//! engine's OpenAI-style API, compared with the oracle by the protocol's rule.
//! Used for the barrier profile, which has no status handshake of its own.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::{json, Value};
use vsnap_protocol::Oracle;

const PROMPT: &str = "The capital of France is";
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// Asks the engine at `addr` (call from inside its network namespace) and
/// checks the answer against `oracle`.
pub fn check(addr: SocketAddr, oracle: &Oracle) -> Result<(), String> {
    let models = request(addr, "GET", "/v1/models", None)?;
    let model = models["data"][0]["id"]
        .as_str()
        .ok_or_else(|| format!("GET /v1/models: no model id in {models}"))?
        .to_string();
    let body = json!({
        "model": model, "prompt": PROMPT, "min_tokens": 1, "max_tokens": 1, "temperature": 0,
        "seed": 0, "logprobs": 0, "return_token_ids": true,
    });
    let answer = request(addr, "POST", "/v1/completions", Some(body))?;
    let observed = observed(&answer)?;
    oracle
        .check_matches(&observed, "HTTP canary")
        .map_err(|e| e.to_string())
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

fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Result<Value, String> {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)
        .map_err(|e| format!("{method} {path}: {e}"))?;
    s.set_read_timeout(Some(IO_TIMEOUT)).ok();
    s.set_write_timeout(Some(IO_TIMEOUT)).ok();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())
        .and_then(|_| s.write_all(body.as_bytes()))
        .map_err(|e| format!("{method} {path}: {e}"))?;
    let mut response = Vec::new();
    s.take(1 << 20)
        .read_to_end(&mut response)
        .map_err(|e| format!("{method} {path}: {e}"))?;
    let response = String::from_utf8_lossy(&response);
    let (status, rest) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{method} {path}: not an HTTP response"))?;
    if !status.starts_with("HTTP/1.1 200") && !status.starts_with("HTTP/1.0 200") {
        let line = status.lines().next().unwrap_or_default();
        return Err(format!("{method} {path}: {line}"));
    }
    serde_json::from_str(rest).map_err(|e| format!("{method} {path}: body is not JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

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
