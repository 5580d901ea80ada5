//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`; not public API).
//!
//! Each takes arbitrary bytes, runs them through the decoders that read what the network sends
//! (watch lines, list pages, the `continue` peek that list pipelining relies on) and panics only
//! when a property fails; a decode error is an expected answer, never a finding. The crash inputs
//! the fuzzer found are kept in `fuzz/regressions/<target>/` and replayed by this crate's unit
//! tests with the seeds in `fuzz/seeds/<target>/`, so they run in every `cargo test`.

use crate::compact::compact_metadata;
use crate::listwatch::{ListWatchError, decode_list, decode_watch_line, peek_continue};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DynamicObject, WatchEvent};

/// One watch line, decoded as a typed object (with and without skipping managedFields) and as a
/// dynamic object.
///
/// Properties: nothing panics; whenever the full decode yields an object, the decode that skips
/// `managedFields` yields the same object without them (the skip must never lose or change
/// anything else).
pub fn watch_line(data: &[u8]) {
    let line = String::from_utf8_lossy(data);
    let full = decode_watch_line::<Pod>(&line, false, compact_metadata);
    let skipped = decode_watch_line::<Pod>(&line, true, compact_metadata);
    let _ = decode_watch_line::<DynamicObject>(&line, false, compact_metadata);
    let _ = decode_watch_line::<DynamicObject>(&line, true, compact_metadata);
    if let Some(Ok(event)) = full {
        let Some(Ok(skipped)) = skipped else {
            panic!("decoded in full but not with managedFields skipped: {skipped:?}");
        };
        match (event, skipped) {
            (WatchEvent::Added(mut a), WatchEvent::Added(b))
            | (WatchEvent::Modified(mut a), WatchEvent::Modified(b))
            | (WatchEvent::Deleted(mut a), WatchEvent::Deleted(b)) => {
                a.metadata.managed_fields = None;
                assert_eq!(a, b, "skipping managedFields changed the object");
            }
            (WatchEvent::Bookmark(a), WatchEvent::Bookmark(b)) => {
                assert_eq!(a.metadata.resource_version, b.metadata.resource_version);
            }
            (a, b) => panic!("different events: {a:?} vs {b:?}"),
        }
    }
}

/// One list response body, decoded as a page of Pods (with and without skipping
/// managedFields), and its `continue` token peeked without decoding.
///
/// Properties: nothing panics; when the page decodes, the peeked token, if any, is the page's
/// own (pipelining requests the next page with it before the decode finishes); both decodes
/// agree on the token and the resourceVersion, and every item the full decode keeps, the
/// skipping decode keeps too, in the same order. The skipping decode may keep more: an item
/// whose only defect is in its managedFields (the fuzzer's first finding, an unparsable `time`)
/// is malformed in full but whole once they are skipped, which is the point of skipping them.
pub fn list_page(data: &[u8]) {
    let peeked = peek_continue(data);
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let full = decode_list::<Pod>(text, false, compact_metadata);
    let skipped = decode_list::<Pod>(text, true, compact_metadata);
    if let Ok(page) = &full {
        if let Some(token) = &peeked {
            assert_eq!(
                Some(token),
                page.continue_token.as_ref(),
                "peeked a token the page does not carry"
            );
        }
        match &skipped {
            Ok(other) => {
                assert_eq!(page.continue_token, other.continue_token);
                assert_eq!(page.resource_version, other.resource_version);
                let mut kept = other.items.iter().map(|p| &p.metadata.name);
                for item in &page.items {
                    assert!(
                        kept.any(|name| *name == item.metadata.name),
                        "{:?} decoded in full but not with managedFields skipped",
                        item.metadata.name
                    );
                }
            }
            Err(ListWatchError::Decode(_)) => panic!("decoded in full but not with managedFields skipped"),
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    /// Replays the target's seeds (`fuzz/seeds/<target>/`) and the crash inputs the fuzzer found
    /// (`fuzz/regressions/<target>/`); returns how many inputs ran.
    pub(crate) fn replay(target: &str, run: fn(&[u8])) -> usize {
        let fuzz = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
        let mut replayed = 0;
        for kind in ["seeds", "regressions"] {
            let Ok(entries) = std::fs::read_dir(fuzz.join(kind).join(target)) else {
                continue;
            };
            for entry in entries {
                let path = entry.unwrap().path();
                run(&std::fs::read(&path).unwrap());
                replayed += 1;
            }
        }
        replayed
    }

    #[test]
    fn watch_line_seeds_and_regressions() {
        assert!(replay("watch_line", super::watch_line) > 0);
    }

    #[test]
    fn list_page_seeds_and_regressions() {
        assert!(replay("list_page", super::list_page) > 0);
    }
}
