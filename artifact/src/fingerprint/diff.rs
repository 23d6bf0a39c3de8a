//! The differences of two JSON objects, field by field, each named with
//! its path and both values.

use serde::Serialize;
use serde_json::Value;

pub(super) fn to_map<T: Serialize>(v: &T) -> serde_json::Map<String, Value> {
    match serde_json::to_value(v) {
        Ok(Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    }
}

pub(super) fn diff_json(
    prefix: &str,
    captured: &serde_json::Map<String, Value>,
    live: &serde_json::Map<String, Value>,
) -> Vec<String> {
    let mut out = Vec::new();
    let keys: std::collections::BTreeSet<&String> = captured.keys().chain(live.keys()).collect();
    for k in keys {
        let (a, b) = (
            captured.get(k).unwrap_or(&Value::Null),
            live.get(k).unwrap_or(&Value::Null),
        );
        if a == b {
            continue;
        }
        match (a, b) {
            (Value::Object(a), Value::Object(b)) => {
                out.extend(diff_json(&format!("{prefix}.{k}"), a, b))
            }
            _ => out.push(format!(
                "{prefix}.{k}: captured {}, live {}",
                short(a),
                short(b)
            )),
        }
    }
    out
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 120 {
        format!("{}...", &s[..117])
    } else {
        s
    }
}
