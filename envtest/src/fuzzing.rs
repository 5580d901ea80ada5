//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`; not public API).
//!
//! [`request`] feeds arbitrary bytes to the parsers that read what a client sends: the query
//! string and its numeric parameters, label and field selectors, continue tokens, patches of
//! every kind, protobuf bodies and resource paths. A parser's typed error is an expected answer;
//! a panic, or a continue token that does not survive a round trip, is a finding. The crash
//! inputs kept in `fuzz/regressions/request/` and the seeds in `fuzz/seeds/request/` are replayed
//! by this crate's unit tests.

use crate::patch::{PatchKind, apply};
use crate::request::{Query, route};
use crate::resources::Registry;
use crate::selectors::{FieldSelector, LabelSelector};
use serde_json::json;

/// The first byte picks the parser (modulo 6); the rest is its input.
pub fn request(data: &[u8]) {
    let Some((&which, input)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(input);
    let object = || {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "web", "tier": "db"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Running"},
        })
    };
    match which % 6 {
        0 => {
            let q = Query::parse(&text);
            for name in ["limit", "timeoutSeconds", "gracePeriodSeconds", "resourceVersion"] {
                let _ = q.uint(name);
            }
            let _ = crate::rest::parse_rv(q.get("resourceVersion"));
            let _ = q.flag("watch");
        }
        1 => {
            if let Ok(selector) = LabelSelector::parse(&text) {
                let _ = selector.matches(&object());
            }
        }
        2 => {
            if let Ok(selector) = FieldSelector::parse(&text) {
                let _ = selector.matches(&object());
                let _ = selector.exact_name();
            }
        }
        3 => {
            if let Ok((rv, key)) = crate::rest::decode_continue(&text) {
                let again = crate::rest::decode_continue(&crate::rest::encode_continue(rv, &key));
                assert_eq!(again.ok(), Some((rv, key)), "a continue token that does not round-trip");
            }
        }
        4 => {
            let (kind, body) = match input.split_first() {
                Some((k, body)) => (
                    [
                        PatchKind::Merge,
                        PatchKind::Json,
                        PatchKind::Strategic,
                        PatchKind::Apply,
                    ][usize::from(*k % 4)],
                    body,
                ),
                None => (PatchKind::Merge, input),
            };
            let mut target = object();
            let _ = apply(kind, &mut target, body);
        }
        _ => {
            let _ = crate::protobuf::decode(input);
            let _ = route(&Registry::new(), &text);
        }
    }
}

#[cfg(test)]
mod tests {
    /// Replays the seeds (`fuzz/seeds/request/`) and the fuzzer's crash inputs
    /// (`fuzz/regressions/request/`).
    #[test]
    fn request_seeds_and_regressions() {
        let fuzz = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
        let mut replayed = 0;
        for kind in ["seeds", "regressions"] {
            let Ok(entries) = std::fs::read_dir(fuzz.join(kind).join("request")) else {
                continue;
            };
            for entry in entries {
                super::request(&std::fs::read(entry.unwrap().path()).unwrap());
                replayed += 1;
            }
        }
        assert!(replayed > 0, "no seeds under fuzz/seeds/request");
    }
}
