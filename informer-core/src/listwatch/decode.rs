//! Decoding for [`ApiListerWatcher`](super::ApiListerWatcher): list pages (the whole page in
//! one pass, item by item only when that fails) and watch streams (the complete lines of each
//! read of the connection copied out in one piece, [`line_reads`], then decoded one event per
//! line, [`decode_lines`]). Both run on the lister-watcher's decoding thread
//! ([`super::decoder`]). An object that does not decode is a [`MalformedObject`] named by its
//! metadata when that decodes.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;

use futures::AsyncBufReadExt;
use kube::Resource;
use kube::api::WatchEvent;
use kube::core::{ObjectList, Status};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use super::decoder::panic_message;
use super::{ListPage, ListWatchError, MalformedObject};
use crate::reflector::TransformFunc;

/// An object's metadata alone. It must decode whole for the object to be named: an object
/// whose metadata does not decode is not one the cache could hold under a key.
#[derive(Deserialize)]
pub(super) struct NamedObject {
    #[serde(default)]
    metadata: kube::api::ObjectMeta,
}

#[derive(Deserialize)]
pub(super) struct RawEvent<'a> {
    #[serde(rename = "type")]
    event_type: Option<String>,
    #[serde(borrow)]
    object: &'a RawValue,
}

/// An object that did not decode as `K`, named by its metadata if that decodes.
pub(super) fn malformed_raw(raw: &str, error: String) -> MalformedObject {
    let mut malformed = MalformedObject::new(error);
    let Ok(named) = serde_json::from_str::<NamedObject>(raw) else {
        return malformed;
    };
    malformed.resource_version = named.metadata.resource_version;
    if let Some(name) = named.metadata.name.filter(|n| !n.is_empty()) {
        malformed.key = Some(match named.metadata.namespace {
            Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
            _ => name,
        });
    }
    malformed
}

/// Decodes one list response. The whole list is decoded in one pass; only when that fails
/// are items decoded one by one, so that one bad item costs only itself.
pub(crate) fn decode_list<K: Resource + DeserializeOwned + Clone + 'static>(
    text: &str,
    skip_managed_fields: bool,
    compact: fn(&mut K),
) -> Result<ListPage<K>, ListWatchError> {
    let page = |mut list: ObjectList<K>, malformed| {
        list.items.iter_mut().for_each(compact);
        ListPage {
            resource_version: list.metadata.resource_version.unwrap_or_default(),
            continue_token: list.metadata.continue_.filter(|c| !c.is_empty()),
            items: list.items,
            malformed,
        }
    };
    match parse::<ObjectList<K>>(text, skip_managed_fields) {
        Ok(list) => Ok(page(list, Vec::new())),
        Err(whole) => {
            let raw: ObjectList<Box<RawValue>> =
                serde_json::from_str(text).map_err(|_| ListWatchError::Decode(whole.to_string()))?;
            let mut items = Vec::with_capacity(raw.items.len());
            let mut malformed = Vec::new();
            for item in &raw.items {
                match parse::<K>(item.get(), skip_managed_fields) {
                    Ok(obj) => items.push(obj),
                    Err(e) => malformed.push(malformed_raw(item.get(), e.to_string())),
                }
            }
            let list = ObjectList {
                types: raw.types,
                metadata: raw.metadata,
                items,
            };
            Ok(page(list, malformed))
        }
    }
}

/// What is done to every object right after it is decoded, on the decoding thread: `compact`
/// (see [`ApiListerWatcher::compact`](super::ApiListerWatcher::compact)), then the reflector's
/// transform if it asked for one; then the object is put in the `Arc` the cache keeps it in.
pub(super) struct Finish<K> {
    pub(super) compact: fn(&mut K),
    pub(super) transform: Option<TransformFunc<K>>,
}

impl<K> Clone for Finish<K> {
    fn clone(&self) -> Self {
        Finish {
            compact: self.compact,
            transform: self.transform.clone(),
        }
    }
}

/// `obj` passed through `transform` (if any), in the `Arc` it is cached in.
fn share<K>(obj: K, transform: Option<&TransformFunc<K>>) -> Arc<K> {
    Arc::new(match transform {
        Some(transform) => transform(obj),
        None => obj,
    })
}

/// `page` with `f` applied to each of its objects.
pub(super) fn map_page<K, T>(page: ListPage<K>, f: impl FnMut(K) -> T) -> ListPage<T> {
    ListPage {
        items: page.items.into_iter().map(f).collect(),
        resource_version: page.resource_version,
        continue_token: page.continue_token,
        malformed: page.malformed,
    }
}

/// `page`'s objects passed through `transform` (if any), each in the `Arc` it is cached in.
pub(super) fn share_page<K>(page: ListPage<K>, transform: Option<&TransformFunc<K>>) -> ListPage<Arc<K>> {
    map_page(page, |obj| share(obj, transform))
}

/// `event` with `f` applied to its object, if it carries one.
pub(crate) fn map_event<K, T>(event: WatchEvent<K>, f: impl FnOnce(K) -> T) -> WatchEvent<T> {
    match event {
        WatchEvent::Added(obj) => WatchEvent::Added(f(obj)),
        WatchEvent::Modified(obj) => WatchEvent::Modified(f(obj)),
        WatchEvent::Deleted(obj) => WatchEvent::Deleted(f(obj)),
        WatchEvent::Bookmark(bookmark) => WatchEvent::Bookmark(bookmark),
        WatchEvent::Error(status) => WatchEvent::Error(status),
    }
}

/// `event`'s object passed through `transform` (if any), in the `Arc` it is cached in.
pub(super) fn share_event<K>(event: WatchEvent<K>, transform: Option<&TransformFunc<K>>) -> WatchEvent<Arc<K>> {
    map_event(event, |obj| share(obj, transform))
}

/// Why [`line_reads`] ended a stream early.
pub(super) enum LinesEnd {
    /// A line passed the bound; its bytes were read past, never buffered.
    TooLong,
    /// Reading failed.
    Failed(std::io::Error),
}

/// What one read of a watch body yields: the complete lines it finished, and how the stream
/// ended, if it did with it.
pub(super) struct LinesRead {
    /// Whole lines, each ended by `\n` except perhaps the stream's last.
    pub(super) lines: Vec<u8>,
    /// Set on the stream's last item when it ended early (the end of the body sets none).
    pub(super) end: Option<LinesEnd>,
}

/// At most this many buffers of [`line_reads`] are kept for reuse.
const READ_BUFFERS_KEPT: usize = 4;

/// Read buffers of [`line_reads`], given back once their lines are decoded, so a watch copies
/// its reads into the same few allocations.
#[derive(Clone, Default)]
pub(super) struct ReadBuffers(std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>);

impl ReadBuffers {
    fn take(&self) -> Vec<u8> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop()
            .unwrap_or_default()
    }

    /// Keeps `buffer` for a later read, unless it grew past [`PARTIAL_KEEP_BYTES`] or enough are
    /// kept.
    pub(super) fn give_back(&self, mut buffer: Vec<u8>) {
        if buffer.capacity() > PARTIAL_KEEP_BYTES {
            return;
        }
        buffer.clear();
        let mut kept = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if kept.len() < READ_BUFFERS_KEPT {
            kept.push(buffer);
        }
    }
}

/// Above this, a read buffer is not kept once its lines are decoded.
pub(super) const PARTIAL_KEEP_BYTES: usize = 1 << 20;

/// The lines of `reader`, each at most `max` bytes, a read at a time: the complete lines of
/// each read of the connection are copied out (with the start of a line an earlier read left
/// unfinished) into one buffer, to be decoded elsewhere ([`decode_lines`], on the decoding
/// thread); a read that finishes no line yields nothing. A line longer than `max` bytes, or a
/// read error, ends the stream after the lines before it; so does the end of the body (a last
/// line without a newline still counts).
pub(super) fn line_reads<R>(reader: R, max: usize, buffers: ReadBuffers) -> impl futures::Stream<Item = LinesRead>
where
    R: futures::AsyncBufRead + Send + 'static,
{
    struct Lines<R> {
        reader: Pin<Box<R>>,
        /// The start of a line an earlier read left unfinished (no newline in it).
        pending: Vec<u8>,
        buffers: ReadBuffers,
    }
    let lines = Lines {
        reader: Box::pin(reader),
        pending: Vec::new(),
        buffers,
    };
    futures::stream::unfold(Some(lines), move |state| async move {
        let mut lines = state?;
        loop {
            let Lines {
                reader,
                pending,
                buffers,
            } = &mut lines;
            let available = match reader.fill_buf().await {
                Ok(available) => available,
                Err(e) => {
                    let read = LinesRead {
                        lines: Vec::new(),
                        end: Some(LinesEnd::Failed(e)),
                    };
                    return Some((read, None));
                }
            };
            if available.is_empty() {
                if pending.is_empty() {
                    return None;
                }
                let read = LinesRead {
                    lines: std::mem::take(pending),
                    end: None,
                };
                return Some((read, None));
            }
            // `pending` holds the start of a line an earlier read left unfinished, no newline.
            let mut previous: Option<usize> = None;
            for newline in memchr::memchr_iter(b'\n', available) {
                let len = match previous {
                    None => pending.len() + newline,
                    Some(p) => newline - p - 1,
                };
                if len > max {
                    let finished = previous.map_or(0, |p| p + 1);
                    return Some((too_long(pending, &available[..finished]), None));
                }
                previous = Some(newline);
            }
            let consumed = available.len();
            let Some(last) = previous else {
                if pending.len() + consumed > max {
                    return Some((too_long(pending, &[]), None));
                }
                pending.extend_from_slice(available);
                reader.as_mut().consume(consumed);
                continue;
            };
            let tail = &available[last + 1..];
            if tail.len() > max {
                return Some((too_long(pending, &available[..=last]), None));
            }
            pending.extend_from_slice(&available[..=last]);
            let mut next = buffers.take();
            next.extend_from_slice(tail);
            reader.as_mut().consume(consumed);
            let read = LinesRead {
                lines: std::mem::replace(pending, next),
                end: None,
            };
            return Some((read, Some(lines)));
        }
    })
}

/// The last item of a stream that met a line over the bound: the lines finished before it
/// (`pending`, the start of the first of them, and `finished`, the rest).
fn too_long(pending: &mut Vec<u8>, finished: &[u8]) -> LinesRead {
    let lines = if finished.is_empty() {
        Vec::new()
    } else {
        pending.extend_from_slice(finished);
        std::mem::take(pending)
    };
    LinesRead {
        lines,
        end: Some(LinesEnd::TooLong),
    }
}

/// Decodes every line of `lines` (a [`LinesRead`]'s), in order; blank lines are skipped by
/// `decode`.
pub(super) fn decode_lines<T>(lines: &[u8], mut decode: impl FnMut(&[u8]) -> Option<T>) -> Vec<T> {
    let mut out = Vec::new();
    let mut start = 0;
    for newline in memchr::memchr_iter(b'\n', lines) {
        out.extend(decode(&lines[start..newline]));
        start = newline + 1;
    }
    if start < lines.len() {
        out.extend(decode(&lines[start..]));
    }
    out
}

/// Decodes one line of a watch stream as the lister-watcher does
/// ([`decode_shared_watch_line`]) but leaves its object unshared; for the fuzz targets and
/// tests.
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn decode_watch_line<K: Resource + DeserializeOwned + Clone + 'static>(
    line: &str,
    skip_managed_fields: bool,
    compact: fn(&mut K),
) -> Option<Result<WatchEvent<K>, ListWatchError>> {
    decode_watch_line_then(line, skip_managed_fields, compact, |event| event)
}

/// Decodes one line of a watch stream, its object passed through `finish`'s transform and put
/// in its `Arc`; `None` for a blank line. A line whose decoding panics (a `compact` function's
/// or the transform's panic) is a [`MalformedObject`] like one that does not decode: the
/// reflector counts and skips it, and the watch goes on.
pub(super) fn decode_shared_watch_line<K: Resource + DeserializeOwned + Clone + 'static>(
    line: &str,
    skip_managed_fields: bool,
    finish: &Finish<K>,
) -> Option<Result<WatchEvent<Arc<K>>, ListWatchError>> {
    decode_watch_line_then(line, skip_managed_fields, finish.compact, |event| {
        share_event(event, finish.transform.as_ref())
    })
}

/// Decodes one watch line, `then` applied to the decoded event under the same panic guard.
fn decode_watch_line_then<K: Resource + DeserializeOwned + Clone + 'static, T>(
    line: &str,
    skip_managed_fields: bool,
    compact: fn(&mut K),
    then: impl FnOnce(WatchEvent<K>) -> WatchEvent<T>,
) -> Option<Result<WatchEvent<T>, ListWatchError>> {
    if line.trim().is_empty() {
        return None;
    }
    let decoded = catch_unwind(AssertUnwindSafe(|| {
        decode_event::<K>(line, skip_managed_fields, compact).map(then)
    }));
    Some(decoded.unwrap_or_else(|panic| {
        let error = format!(
            "decoding panicked (a compact or transform function?): {}",
            panic_message(panic.as_ref())
        );
        Err(ListWatchError::Malformed(malformed_event(line, error)))
    }))
}

/// Decodes one watch event that is not a blank line.
fn decode_event<K: Resource + DeserializeOwned + Clone + 'static>(
    line: &str,
    skip_managed_fields: bool,
    compact: fn(&mut K),
) -> Result<WatchEvent<K>, ListWatchError> {
    match parse::<WatchEvent<K>>(line, skip_managed_fields) {
        Ok(WatchEvent::Error(status)) => Err(ListWatchError::from_status(&status)),
        Ok(mut event) => {
            if let WatchEvent::Added(obj) | WatchEvent::Modified(obj) | WatchEvent::Deleted(obj) = &mut event {
                compact(obj);
            }
            Ok(event)
        }
        Err(e) => {
            if let Ok(status) = serde_json::from_str::<Status>(line)
                && status.code != 0
            {
                return Err(ListWatchError::from_status(&status));
            }
            Err(ListWatchError::Malformed(malformed_event(line, e.to_string())))
        }
    }
}

/// The watch event `line` as a [`MalformedObject`] failing with `error`: named by its object's
/// metadata when that decodes, and marked deleted when it is a DELETED event.
fn malformed_event(line: &str, error: String) -> MalformedObject {
    match serde_json::from_str::<RawEvent>(line) {
        Ok(event) => malformed_raw(event.object.get(), error).deleted(event.event_type.as_deref() == Some("DELETED")),
        Err(_) => MalformedObject::new(error),
    }
}

/// Decodes `text`, dropping `metadata.managedFields` on the way when asked (see
/// [`ApiListerWatcher::skip_managed_fields`](super::ApiListerWatcher::skip_managed_fields)).
pub(super) fn parse<T: DeserializeOwned>(text: &str, skip_managed_fields: bool) -> serde_json::Result<T> {
    if skip_managed_fields {
        crate::skip_managed_fields::from_str(text)
    } else {
        serde_json::from_str(text)
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;
    use crate::compact::compact_metadata;
    use k8s_openapi::api::core::v1::ConfigMap;

    /// The batches `line_reads` and `decode_lines` make of `chunks` (one read each), lines as
    /// text, `END` for an early end.
    async fn batches_of(chunks: Vec<Result<&'static [u8], std::io::Error>>, max: usize) -> Vec<Vec<String>> {
        use futures::TryStreamExt;
        let reader = futures::stream::iter(chunks).into_async_read();
        let buffers = ReadBuffers::default();
        let reads: Vec<LinesRead> = line_reads(reader, max, buffers.clone()).collect().await;
        reads
            .into_iter()
            .map(|read| {
                let mut batch = decode_lines(&read.lines, |line| {
                    (!line.is_empty()).then(|| String::from_utf8_lossy(line).into_owned())
                });
                batch.extend(read.end.map(|end| match end {
                    LinesEnd::TooLong => "END too long".to_string(),
                    LinesEnd::Failed(e) => format!("END {e}"),
                }));
                buffers.give_back(read.lines);
                batch
            })
            .collect()
    }

    #[tokio::test]
    async fn watch_lines_are_decoded_a_read_at_a_time_and_a_line_split_across_reads_is_joined() {
        let batches = batches_of(vec![Ok(b"a\nbb\n\nc"), Ok(b"cc"), Ok(b"c\nd\n"), Ok(b"e")], 100).await;
        assert_eq!(batches, [vec!["a", "bb"], vec!["cccc", "d"], vec!["e"]]);

        // A long read is one batch.
        let many: &'static [u8] = "x\n".repeat(600).leak().as_bytes();
        let sizes: Vec<usize> = batches_of(vec![Ok(many)], 100).await.iter().map(Vec::len).collect();
        assert_eq!(sizes, [600]);
    }

    #[tokio::test]
    async fn a_watch_line_over_the_bound_or_a_failed_read_ends_the_stream() {
        // Over the bound in one read, across reads, and as an unfinished tail.
        assert_eq!(
            batches_of(vec![Ok(b"ok\nabcdef\nnever\n")], 3).await,
            [vec!["ok", "END too long"]]
        );
        assert_eq!(
            batches_of(vec![Ok(b"ab"), Ok(b"cd\nx\n")], 3).await,
            [vec!["END too long"]]
        );
        assert_eq!(batches_of(vec![Ok(b"a\nabcdef")], 3).await, [vec!["a", "END too long"]]);
        let failed = std::io::Error::other("reset");
        assert_eq!(
            batches_of(vec![Ok(b"a\n"), Err(failed)], 3).await,
            [vec!["a"], vec!["END reset"]]
        );
    }

    #[test]
    fn decoded_metadata_lists_hold_no_spare_capacity_in_lists_and_watch_events() {
        let meta = r#"{"name":"a","namespace":"ns","finalizers":["f"],
            "ownerReferences":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"rs","uid":"u"}],
            "managedFields":[{"manager":"m","operation":"Update"}]}"#;
        let assert_compact = |cm: &ConfigMap| {
            let m = &cm.metadata;
            for (len, capacity) in [
                m.owner_references.as_ref().map(|v| (v.len(), v.capacity())),
                m.finalizers.as_ref().map(|v| (v.len(), v.capacity())),
                m.managed_fields.as_ref().map(|v| (v.len(), v.capacity())),
            ]
            .into_iter()
            .flatten()
            {
                assert_eq!((len, capacity), (1, 1));
            }
        };
        // serde's own decode leaves room for four.
        let plain: ConfigMap = serde_json::from_str(&format!(r#"{{"metadata":{meta}}}"#)).unwrap();
        assert!(
            plain
                .metadata
                .owner_references
                .as_ref()
                .is_some_and(|v| v.capacity() > 1)
        );
        for skip in [false, true] {
            let list = format!(r#"{{"metadata":{{"resourceVersion":"1"}},"items":[{{"metadata":{meta}}}]}}"#);
            let page = decode_list::<ConfigMap>(&list, skip, compact_metadata).unwrap();
            assert_eq!(page.items.len(), 1);
            assert_compact(&page.items[0]);
            let line = format!(r#"{{"type":"MODIFIED","object":{{"metadata":{meta}}}}}"#);
            match decode_watch_line::<ConfigMap>(&line, skip, compact_metadata) {
                Some(Ok(WatchEvent::Modified(cm))) => assert_compact(&cm),
                other => panic!("not a MODIFIED event: {other:?}"),
            }
        }
    }

    #[test]
    fn a_list_with_one_bad_item_keeps_the_good_ones_and_names_the_bad_one() {
        let text = r#"{"apiVersion":"v1","kind":"ConfigMapList","metadata":{"resourceVersion":"42","continue":"tok"},
            "items":[{"metadata":{"name":"good","namespace":"ns"}},
                     {"metadata":{"name":"bad","namespace":"ns"},"data":"not a map"}]}"#;
        let page = decode_list::<ConfigMap>(text, false, compact_metadata).unwrap();
        assert_eq!(page.resource_version, "42");
        assert_eq!(page.continue_token.as_deref(), Some("tok"));
        assert_eq!(page.items.len(), 1);
        assert_eq!(page.items[0].metadata.name.as_deref(), Some("good"));
        assert_eq!(page.malformed.len(), 1);
        assert_eq!(page.malformed[0].key.as_deref(), Some("ns/bad"));
    }

    #[test]
    fn a_list_that_is_not_a_list_is_a_decode_error() {
        assert!(matches!(
            decode_list::<ConfigMap>("<html>", false, compact_metadata),
            Err(ListWatchError::Decode(_))
        ));
        assert!(matches!(
            decode_list::<ConfigMap>(r#"{"items":7}"#, false, compact_metadata),
            Err(ListWatchError::Decode(_))
        ));
    }

    #[test]
    fn watch_lines_decode_to_events_errors_and_named_malformed_objects() {
        let added = r#"{"type":"ADDED","object":{"metadata":{"name":"a","namespace":"ns","resourceVersion":"5"}}}"#;
        assert!(matches!(
            decode_watch_line::<ConfigMap>(added, false, compact_metadata),
            Some(Ok(WatchEvent::Added(_)))
        ));

        let bookmark =
            r#"{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"9"}}}"#;
        assert!(
            matches!(decode_watch_line::<ConfigMap>(bookmark, false, compact_metadata), Some(Ok(WatchEvent::Bookmark(b))) if b.metadata.resource_version == "9")
        );

        let expired = r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old","reason":"Expired","code":410}}"#;
        match decode_watch_line::<ConfigMap>(expired, false, compact_metadata) {
            Some(Err(e)) => assert!(e.is_gone(), "{e}"),
            other => panic!("expected a 410, got {other:?}"),
        }

        let malformed = r#"{"type":"MODIFIED","object":{"metadata":{"name":"b","namespace":"ns"},"data":[1,2]}}"#;
        match decode_watch_line::<ConfigMap>(malformed, false, compact_metadata) {
            Some(Err(ListWatchError::Malformed(m))) => assert_eq!(m.key.as_deref(), Some("ns/b")),
            other => panic!("expected a malformed object, got {other:?}"),
        }

        let garbage = "{not json";
        assert!(
            matches!(decode_watch_line::<ConfigMap>(garbage, false, compact_metadata), Some(Err(ListWatchError::Malformed(m))) if m.key.is_none())
        );
        assert!(decode_watch_line::<ConfigMap>("   ", false, compact_metadata).is_none());
    }

    #[test]
    fn a_watch_line_whose_compact_function_panics_is_a_malformed_object() {
        fn compact_panics_on_boom(cm: &mut ConfigMap) {
            assert_ne!(cm.metadata.name.as_deref(), Some("boom"), "compact refuses boom");
        }
        let lines = concat!(
            r#"{"type":"DELETED","object":{"metadata":{"name":"boom","namespace":"ns","resourceVersion":"7"}}}"#,
            "\n",
            r#"{"type":"ADDED","object":{"metadata":{"name":"fine","namespace":"ns"}}}"#,
            "\n",
        );
        let events = decode_lines(lines.as_bytes(), |line| {
            decode_watch_line::<ConfigMap>(&String::from_utf8_lossy(line), false, compact_panics_on_boom)
        });
        match events.as_slice() {
            [Err(ListWatchError::Malformed(boom)), Ok(WatchEvent::Added(fine))] => {
                assert_eq!(boom.key.as_deref(), Some("ns/boom"));
                assert_eq!(boom.resource_version.as_deref(), Some("7"));
                assert!(boom.deleted);
                assert!(boom.error.contains("compact refuses boom"), "{}", boom.error);
                assert_eq!(fine.metadata.name.as_deref(), Some("fine"));
            }
            other => panic!("expected the panicking line skipped as malformed, then the next event: {other:?}"),
        }
    }
}
