//! The differences of two JSON objects, field by field, each named with
//! its path and what differs, whole however long (an operator refused a
//! restore needs to know which capability or mount it was):
//!
//! - a scalar (or a value of another kind on each side):
//!   `path: captured X, live Y`, both as JSON;
//! - an object: each differing field, by its path;
//! - a list of objects with an identifying field (`destination`, `path`,
//!   `type` or `name`, the first every element has, unique on each side):
//!   matched by it, each element the live list adds or drops named with its
//!   fields (`path: live adds /data (options [rbind, rw], type bind)`) and
//!   each changed one with the fields that changed
//!   (`path: /data: type bind -> tmpfs`; mount options changed one for one
//!   as `path: /data: rw -> ro`);
//! - any other list, as a multiset: the elements the live list adds or
//!   drops (`path: live adds CAP_NET_ADMIN and drops CAP_CHOWN`);
//! - a list whose elements are the same in another order: both orders.
//!
//! `->` reads captured to live. Every pair of values that differ gives at
//! least one line: an empty result means equal, and a restore relies on it.

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::{Map, Value};

pub(super) fn to_map<T: Serialize>(v: &T) -> Map<String, Value> {
    match serde_json::to_value(v) {
        Ok(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

/// Each difference of `live` from `captured`, every line starting with
/// `prefix.FIELD`.
pub(super) fn diff_json(
    prefix: &str,
    captured: &Map<String, Value>,
    live: &Map<String, Value>,
) -> Vec<String> {
    let mut out = Vec::new();
    diff_objects(prefix, captured, live, &mut out);
    out
}

fn diff_objects(
    prefix: &str,
    captured: &Map<String, Value>,
    live: &Map<String, Value>,
    out: &mut Vec<String>,
) {
    let keys: BTreeSet<&String> = captured.keys().chain(live.keys()).collect();
    for k in keys {
        let (a, b) = (
            captured.get(k).unwrap_or(&Value::Null),
            live.get(k).unwrap_or(&Value::Null),
        );
        diff_value(&format!("{prefix}.{k}"), a, b, out);
    }
}

fn diff_value(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    if a == b {
        return;
    }
    let before = out.len();
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => diff_objects(path, a, b, out),
        (Value::Array(a), Value::Array(b)) => diff_lists(path, a, b, out),
        // An absent list is an empty one: name its elements.
        (Value::Null, Value::Array(b)) => diff_lists(path, &[], b, out),
        (Value::Array(a), Value::Null) => diff_lists(path, a, &[], out),
        _ => {}
    }
    if out.len() == before {
        out.push(format!("{path}: captured {a}, live {b}"));
    }
}

fn diff_lists(path: &str, a: &[Value], b: &[Value], out: &mut Vec<String>) {
    match identifying_field(a, b) {
        Some(key) => diff_keyed(path, key, a, b, out),
        None => diff_multisets(path, a, b, out),
    }
}

/// The fields that identify an element of a list, most telling first:
/// a mount's `destination`, a device's `path`, a namespace's or rlimit's
/// `type`.
const IDENTIFYING: &[&str] = &["destination", "path", "type", "name"];

/// The first of [`IDENTIFYING`] that every element of both lists (all
/// objects) has, when it is a string unique on each side.
fn identifying_field(a: &[Value], b: &[Value]) -> Option<&'static str> {
    let all = || a.iter().chain(b);
    if !all().all(Value::is_object) || all().next().is_none() {
        return None;
    }
    let key = IDENTIFYING
        .iter()
        .find(|k| all().all(|e| e.get(**k).is_some()))?;
    let unique = |list: &[Value]| {
        let ids: Option<BTreeSet<&str>> = list.iter().map(|e| e[*key].as_str()).collect();
        ids.is_some_and(|ids| ids.len() == list.len())
    };
    (unique(a) && unique(b)).then_some(*key)
}

/// Lists matched by `key`: elements added, dropped and changed, in the
/// order of their key; the order itself when that alone differs.
fn diff_keyed(path: &str, key: &str, a: &[Value], b: &[Value], out: &mut Vec<String>) {
    let id = |e: &Value| e[key].as_str().unwrap_or_default().to_string();
    let find = |list: &[Value], k: &str| list.iter().find(|e| id(e) == k).cloned();
    let ids: BTreeSet<String> = a.iter().chain(b).map(id).collect();
    let before = out.len();
    for k in ids {
        match (find(a, &k), find(b, &k)) {
            (None, Some(added)) => out.push(format!(
                "{path}: live adds {}{}",
                show_str(&k),
                rest(key, &added)
            )),
            (Some(dropped), None) => out.push(format!(
                "{path}: live drops {}{}",
                show_str(&k),
                rest(key, &dropped)
            )),
            (Some(x), Some(y)) if x != y => {
                out.push(format!("{path}: {}: {}", show_str(&k), changes(&x, &y)))
            }
            _ => {}
        }
    }
    if out.len() == before {
        let order = |list: &[Value]| show_list(list.iter().map(|e| show_str(&id(e))));
        out.push(format!(
            "{path}: the same elements in another order: {} -> {}",
            order(a),
            order(b)
        ));
    }
}

/// An element's fields but its key, as ` (field value, ...)`; empty when
/// it has no other.
fn rest(key: &str, element: &Value) -> String {
    let fields: Vec<String> = element
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != key)
        .map(|(k, v)| format!("{k} {}", show(v)))
        .collect();
    if fields.is_empty() {
        String::new()
    } else {
        format!(" ({})", fields.join(", "))
    }
}

/// The fields of two elements with one key that differ, as
/// `field X -> Y, ...`; mount options changed one for one (`rw` for `ro`)
/// as just `rw -> ro`.
fn changes(a: &Value, b: &Value) -> String {
    let (empty, null) = (Map::new(), Value::Null);
    let (a, b) = (
        a.as_object().unwrap_or(&empty),
        b.as_object().unwrap_or(&empty),
    );
    let fields: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let mut out = Vec::new();
    for f in fields {
        let (x, y) = (a.get(f).unwrap_or(&null), b.get(f).unwrap_or(&null));
        if x == y {
            continue;
        }
        match one_for_one(x, y) {
            Some((gone, new)) if f == "options" => {
                out.push(format!("{} -> {}", show(gone), show(new)))
            }
            _ => out.push(format!("{f} {} -> {}", show(x), show(y))),
        }
    }
    out.join(", ")
}

/// The one element of list `a` that list `b` replaced, when that is all
/// that differs (in place or not).
fn one_for_one<'a>(a: &'a Value, b: &'a Value) -> Option<(&'a Value, &'a Value)> {
    let (a, b) = (a.as_array()?, b.as_array()?);
    match (surplus(a, b).as_slice(), surplus(b, a).as_slice()) {
        ([gone], [new]) => Some((*gone, *new)),
        _ => None,
    }
}

/// The elements of `a` that `b` lacks, counted: `[x, x]` against `[x]`
/// leaves one `x`.
fn surplus<'a>(a: &'a [Value], b: &[Value]) -> Vec<&'a Value> {
    let mut left: Vec<Option<&Value>> = b.iter().map(Some).collect();
    a.iter()
        .filter(|e| match left.iter_mut().find(|l| **l == Some(*e)) {
            Some(slot) => {
                *slot = None;
                false
            }
            None => true,
        })
        .collect()
}

/// Lists compared as multisets: what the live one adds and drops; both
/// whole when only the order differs.
fn diff_multisets(path: &str, a: &[Value], b: &[Value], out: &mut Vec<String>) {
    if a == b {
        // Absent against empty: the caller names both as they are.
        return;
    }
    let (added, dropped) = (surplus(b, a), surplus(a, b));
    let names = |list: &[&Value]| list.iter().map(|e| show(e)).collect::<Vec<_>>().join(", ");
    let line = match (added.is_empty(), dropped.is_empty()) {
        (true, true) => format!(
            "{path}: the same elements in another order: {} -> {}",
            show_list(a.iter().map(show)),
            show_list(b.iter().map(show))
        ),
        (false, true) => format!("{path}: live adds {}", names(&added)),
        (true, false) => format!("{path}: live drops {}", names(&dropped)),
        (false, false) => format!(
            "{path}: live adds {} and drops {}",
            names(&added),
            names(&dropped)
        ),
    };
    out.push(line);
}

fn show_list(items: impl Iterator<Item = String>) -> String {
    format!("[{}]", items.collect::<Vec<_>>().join(", "))
}

/// A value as an operator reads it, whole: plain strings bare, others as
/// JSON strings; lists as `[a, b]`, objects as `{k: v}`.
fn show(v: &Value) -> String {
    match v {
        Value::String(s) => show_str(s),
        Value::Array(items) => show_list(items.iter().map(show)),
        Value::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, v)| format!("{}: {}", show_str(k), show(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        other => other.to_string(),
    }
}

/// A string bare when it reads unambiguously so (no spaces, separators or
/// quotes; not a number, bool or null); else quoted as JSON.
fn show_str(s: &str) -> String {
    let bare = !s.is_empty()
        && !s
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || ",;[]{}()\"'".contains(c))
        && !matches!(s, "null" | "true" | "false")
        && s.parse::<f64>().is_err();
    if bare {
        s.to_string()
    } else {
        Value::String(s.to_string()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn diff(a: Value, b: Value) -> Vec<String> {
        let (a, b) = (json!({ "f": a }), json!({ "f": b }));
        diff_json("w", a.as_object().unwrap(), b.as_object().unwrap())
    }

    #[test]
    fn scalars_are_named_with_both_values_as_json() {
        assert_eq!(diff(json!(1000), json!(0)), ["w.f: captured 1000, live 0"]);
        assert_eq!(
            diff(json!("a"), json!(["a"])),
            [r#"w.f: captured "a", live ["a"]"#]
        );
        assert_eq!(
            diff(json!(null), json!([])),
            ["w.f: captured null, live []"]
        );
        assert!(diff(json!({"x": [1, {"y": 2}]}), json!({"x": [1, {"y": 2}]})).is_empty());
    }

    #[test]
    fn objects_are_named_field_by_field() {
        let d = diff(
            json!({"uid": 1000, "gid": 1000, "additionalGids": [10]}),
            json!({"uid": 0, "gid": 1000, "additionalGids": [10, 27]}),
        );
        assert_eq!(
            d,
            [
                "w.f.additionalGids: live adds 27",
                "w.f.uid: captured 1000, live 0"
            ]
        );
    }

    #[test]
    fn lists_of_scalars_name_what_the_live_one_adds_and_drops() {
        let caps = |extra: &[&str]| {
            let mut c = vec!["CAP_CHOWN", "CAP_KILL", "CAP_SETUID"];
            c.extend_from_slice(extra);
            json!({ "effective": c, "bounding": c })
        };
        assert_eq!(
            diff(caps(&[]), caps(&["CAP_NET_ADMIN"])),
            [
                "w.f.bounding: live adds CAP_NET_ADMIN",
                "w.f.effective: live adds CAP_NET_ADMIN"
            ]
        );
        assert_eq!(
            diff(
                json!(["CAP_CHOWN", "CAP_KILL"]),
                json!(["CAP_KILL", "CAP_SYS_ADMIN", "CAP_BPF"])
            ),
            ["w.f: live adds CAP_SYS_ADMIN, CAP_BPF and drops CAP_CHOWN"]
        );
        assert_eq!(diff(json!(["a", "b"]), json!(["a"])), ["w.f: live drops b"]);
        // An absent list is an empty one.
        assert_eq!(
            diff(json!(null), json!(["CAP_BPF"])),
            ["w.f: live adds CAP_BPF"]
        );
        // Counted: a repeated element is one more.
        assert_eq!(diff(json!(["a", "a"]), json!(["a"])), ["w.f: live drops a"]);
        // Strings that would not read unambiguously bare are quoted.
        assert_eq!(
            diff(json!(["x"]), json!(["x", "H200 GPU-1 570", "", "7", "a;b"])),
            [r#"w.f: live adds "H200 GPU-1 570", "", "7", "a;b""#]
        );
    }

    #[test]
    fn a_list_in_another_order_shows_both_orders() {
        assert_eq!(
            diff(json!(["a", "b", 1]), json!([1, "b", "a"])),
            ["w.f: the same elements in another order: [a, b, 1] -> [1, b, a]"]
        );
        let mount = |d: &str| json!({"destination": d, "type": "bind", "options": ["rbind"]});
        assert_eq!(
            diff(
                json!([mount("/a"), mount("/b")]),
                json!([mount("/b"), mount("/a")])
            ),
            ["w.f: the same elements in another order: [/a, /b] -> [/b, /a]"]
        );
    }

    fn mount(dst: &str, kind: &str, options: &[&str]) -> Value {
        json!({"destination": dst, "type": kind, "options": options})
    }

    #[test]
    fn mounts_are_matched_by_destination_and_named_with_what_changed() {
        let captured = json!([
            mount("/proc", "proc", &["nosuid", "noexec"]),
            mount("/data", "bind", &["rbind", "rw"]),
            mount("/cache", "bind", &["rbind", "rw"]),
            mount("/old", "tmpfs", &["nosuid"]),
        ]);
        let live = json!([
            mount("/proc", "proc", &["nosuid", "noexec"]),
            mount("/data", "bind", &["rbind", "ro"]),
            mount("/cache", "tmpfs", &["rbind", "rw", "nosuid", "ro"]),
            mount("/models", "bind", &["rbind", "ro"]),
        ]);
        assert_eq!(
            diff(captured, live),
            [
                "w.f: /cache: options [rbind, rw] -> [rbind, rw, nosuid, ro], type bind -> tmpfs",
                "w.f: /data: rw -> ro",
                "w.f: live adds /models (options [rbind, ro], type bind)",
                "w.f: live drops /old (options [nosuid], type tmpfs)",
            ]
        );
        // An absent list: each mount named.
        assert_eq!(
            diff(
                json!(null),
                json!([mount("/data", "bind", &["rbind", "rw"])])
            ),
            ["w.f: live adds /data (options [rbind, rw], type bind)"]
        );
    }

    #[test]
    fn other_lists_of_objects_are_keyed_by_path_or_type_when_unique() {
        // Device nodes by path.
        let node =
            |p: &str, minor: u32| json!({"path": p, "type": "c", "major": 195, "minor": minor});
        assert_eq!(
            diff(
                json!([node("/dev/nvidia0", 0)]),
                json!([node("/dev/nvidia0", 0), node("/dev/nvidia1", 1)])
            ),
            ["w.f: live adds /dev/nvidia1 (major 195, minor 1, type c)"]
        );
        // Namespaces by type.
        let ns = |t: &str, joined: bool| json!({"type": t, "joined": joined});
        assert_eq!(
            diff(
                json!([ns("pid", false), ns("network", false)]),
                json!([ns("pid", false), ns("network", true)])
            ),
            ["w.f: network: joined false -> true"]
        );
        // cgroup device rules: `type` repeats, so no key: each rule whole.
        let rule = |allow: bool, t: &str, access: &str| json!({"allow": allow, "type": t, "access": access});
        assert_eq!(
            diff(
                json!([rule(false, "a", "rwm"), rule(true, "c", "rw")]),
                json!([
                    rule(false, "a", "rwm"),
                    rule(true, "c", "rw"),
                    rule(true, "c", "rwm")
                ])
            ),
            ["w.f: live adds {access: rwm, allow: true, type: c}"]
        );
        // A destination two mounts share: no key either.
        let twice = json!([mount("/a", "bind", &[]), mount("/a", "tmpfs", &[])]);
        assert_eq!(
            diff(json!([mount("/a", "bind", &[])]), twice),
            ["w.f: live adds {destination: /a, options: [], type: tmpfs}"]
        );
    }

    #[test]
    fn nothing_is_cut_however_long() {
        let many: Vec<String> = (0..300)
            .map(|i| format!("CAP_NUMBER_{i:03}_{}", "é".repeat(40)))
            .collect();
        let d = diff(json!([]), json!(many));
        assert_eq!(d.len(), 1);
        assert!(many.iter().all(|c| d[0].contains(c.as_str())), "{}", d[0]);
        assert!(!d[0].contains("..."));
        // A long scalar whole, and a multi-byte character at the old cut
        // does not panic.
        let long = "é".repeat(500);
        let d = diff(json!("x"), json!(long));
        assert_eq!(d, [format!(r#"w.f: captured "x", live "{long}""#)]);
    }

    #[test]
    fn values_that_differ_always_give_a_line() {
        let values = [
            json!(null),
            json!([]),
            json!({}),
            json!(""),
            json!(0),
            json!(["a", "b"]),
            json!(["b", "a"]),
            json!(["a", "a", "b"]),
            json!([{"type": "a"}, {"type": "b"}]),
            json!([{"type": "b"}, {"type": "a"}]),
            json!([{"type": "a"}, {"type": "a"}]),
            json!([{"type": "a", "x": 1}]),
            json!([{"type": "a", "x": [1, 2]}]),
            json!([{"type": "a", "x": [2, 1]}]),
            json!([{"type": "a"}, 1]),
            json!([[1], [2]]),
            json!([[2], [1]]),
        ];
        for a in &values {
            for b in &values {
                let d = diff(a.clone(), b.clone());
                assert_eq!(d.is_empty(), a == b, "{a} {b}: {d:?}");
            }
        }
    }
}
