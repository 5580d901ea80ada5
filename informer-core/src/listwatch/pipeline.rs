//! The page-prefetch pipeline of [`ApiListerWatcher`](super::ApiListerWatcher): while page k
//! is decoded, page k+1 is already requested, its `continue` token read from the top of page
//! k's body without decoding it ([`peek_continue`]). Requests and body reads run on tokio;
//! every page is decoded on the lister-watcher's decoding thread ([`super::decoder`]), pages
//! fetched ahead queued behind the one being decoded. See the parent module's doc ("Paged
//! lists are pipelined") for what the reflector sees.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use futures::future::BoxFuture;
use kube::api::ListParams;
use kube::{Client, Resource};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio_util::task::AbortOnDropHandle;

use super::decode::{Finish, share_page};
use super::decoder::DecodeThread;
use super::{ACCEPT_METADATA_LIST, ListPage, ListWatchError, continuation, decode_list, list_request};

/// What requesting a list page needs, shared with the tasks that fetch pages ahead.
pub(super) struct PageFetcher {
    pub(super) client: Client,
    /// The collection's URL; also names it in logs.
    pub(super) url_path: Arc<str>,
    pub(super) max_page_bytes: usize,
    /// At most this many pages in flight ahead of the reflector (0: none, client-go's way).
    pub(super) pages_ahead: usize,
    /// Drop `metadata.managedFields` while decoding.
    pub(super) skip_managed_fields: bool,
    /// Ask for `PartialObjectMetadata` (see the module doc).
    pub(super) metadata_only: bool,
    /// Page bodies already read and decoded, kept to read the next pages into.
    pub(super) buffers: PageBuffers,
    /// Where pages (and the watch's reads) are decoded.
    pub(super) decoder: DecodeThread,
}

/// The buffers list page bodies are read into, reused from page to page.
///
/// A page body is a large allocation (500 ConfigMaps are ~600 KB) that lives only until the
/// page is decoded. Read into a fresh `Vec` every time, it grew by doubling (each step a copy)
/// and, above the allocator's mmap threshold, came fresh from the kernel, so every byte of
/// every page was a page fault: a quarter of the CPU time of a 100k-object list. Kept here, a
/// list touches about `pages_ahead + 2` buffers' worth of fresh memory, once; the last page
/// of a list releases them all, so a watching informer holds none.
#[derive(Default)]
pub(super) struct PageBuffers {
    state: Mutex<BuffersState>,
}

#[derive(Default)]
pub(super) struct BuffersState {
    free: Vec<Vec<u8>>,
    /// A list ended and no page was read since: buffers given back are dropped (a page
    /// decoded in parallel with the last one may finish after it).
    released: bool,
}

impl PageBuffers {
    /// At most this many idle buffers are kept (the pages in flight, plus one).
    const KEEP: usize = DEFAULT_PAGES_AHEAD + 2;
    /// A buffer larger than this is not kept (a page that big is rare, and memory held idle).
    const KEEP_BYTES: usize = 16 << 20;

    fn state(&self) -> MutexGuard<'_, BuffersState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take(&self) -> Vec<u8> {
        let mut state = self.state();
        state.released = false;
        state.free.pop().unwrap_or_default()
    }

    fn release(&self) {
        let mut state = self.state();
        state.released = true;
        state.free = Vec::new();
    }

    fn give_back(&self, mut buffer: Vec<u8>) {
        if buffer.capacity() > Self::KEEP_BYTES {
            return;
        }
        buffer.clear();
        let mut state = self.state();
        if !state.released && state.free.len() < Self::KEEP {
            state.free.push(buffer);
        }
    }
}

/// Pages requested ahead of the reflector (see the module doc), fetched and decoded by their
/// own tasks (with the transform of the request they follow); dropping one aborts it.
pub(super) type PagesAhead<K> = HashMap<String, AbortOnDropHandle<Result<ListPage<Arc<K>>, ListWatchError>>>;

/// How many pages may be in flight ahead of the reflector by default: two keep both cores
/// decoding while the next request is answered, and bound the memory a list holds beyond what
/// it has handed over to two pages.
pub const DEFAULT_PAGES_AHEAD: usize = 2;

/// The slot map of pages ahead, whatever a panicking holder left: it holds no invariant.
pub(super) fn lock_ahead<K>(ahead: &Mutex<PagesAhead<K>>) -> MutexGuard<'_, PagesAhead<K>> {
    ahead.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Fetches and decodes the page `params` asks for, each object finished as `finish` says and
/// in its `Arc`, on the decoding thread. As soon as its bytes are in, the page after it is
/// requested (see [`fetch_ahead`]) and this one is decoded meanwhile. A plain function
/// returning a boxed future, not an `async fn`: its tasks spawn more of it.
pub(super) fn fetch_page<K>(
    fetcher: Arc<PageFetcher>,
    params: ListParams,
    ahead: Weak<Mutex<PagesAhead<K>>>,
    finish: Finish<K>,
) -> BoxFuture<'static, Result<ListPage<Arc<K>>, ListWatchError>>
where
    K: Resource + DeserializeOwned + Clone + Send + Sync + 'static,
{
    Box::pin(async move {
        let mut request = list_request(&fetcher.url_path, &params)?;
        if fetcher.metadata_only {
            request.headers_mut().insert(
                http::header::ACCEPT,
                http::HeaderValue::from_static(ACCEPT_METADATA_LIST),
            );
        }
        let bytes = read_page(&fetcher.client, request, fetcher.max_page_bytes, fetcher.buffers.take()).await?;
        if params.limit.is_some()
            && let (Some(token), Some(ahead)) = (peek_continue(&bytes), ahead.upgrade())
        {
            fetch_ahead(&fetcher, &params, token, &ahead, &finish);
        }
        let skip = fetcher.skip_managed_fields;
        // Every page, small ones too, so that all of a cache's objects (their contents and
        // their `Arc`s) come from one arena.
        let decoded = fetcher.decoder.run(fetcher.url_path.clone(), move || {
            let page = match std::str::from_utf8(&bytes) {
                Ok(text) => {
                    decode_list::<K>(text, skip, finish.compact).map(|page| share_page(page, finish.transform.as_ref()))
                }
                Err(e) => Err(ListWatchError::Decode(e.to_string())),
            };
            (page, bytes)
        });
        let (page, bytes) = decoded
            .await
            .ok_or_else(|| ListWatchError::Decode("the list page's decoding panicked".into()))?;
        if matches!(&page, Ok(p) if p.continue_token.is_some()) {
            fetcher.buffers.give_back(bytes);
        } else {
            // The list is over (or failed): hold no idle buffers while watching.
            fetcher.buffers.release();
        }
        page
    })
}

/// Requests the page after `params`' page (the one `token` names) on a task of its own, unless
/// it is already on its way or as many pages as allowed are.
pub(super) fn fetch_ahead<K>(
    fetcher: &Arc<PageFetcher>,
    params: &ListParams,
    token: String,
    ahead: &Arc<Mutex<PagesAhead<K>>>,
    finish: &Finish<K>,
) where
    K: Resource + DeserializeOwned + Clone + Send + Sync + 'static,
{
    let mut pages = lock_ahead(ahead);
    if pages.len() >= fetcher.pages_ahead || pages.contains_key(&token) {
        return;
    }
    let next = continuation(params, token.clone());
    let task = tokio::spawn(fetch_page(fetcher.clone(), next, Arc::downgrade(ahead), finish.clone()));
    pages.insert(token, AbortOnDropHandle::new(task));
}

/// Reads one list response's body, at most `limit` bytes of it.
/// Reads a page body into `bytes` (a reused buffer, see [`PageBuffers`]).
pub(super) async fn read_page(
    client: &Client,
    request: http::Request<Vec<u8>>,
    limit: usize,
    mut bytes: Vec<u8>,
) -> Result<Vec<u8>, ListWatchError> {
    use futures::AsyncReadExt;
    let body = client.request_stream(request).await?;
    bytes.clear();
    // Read at most one byte past the bound: enough to tell, never more.
    body.take(u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1))
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| ListWatchError::Transport(kube::Error::ReadEvents(e)))?;
    if bytes.len() > limit {
        return Err(ListWatchError::TooLarge {
            what: "list page",
            limit,
        });
    }
    Ok(bytes)
}

/// How far into a list body [`peek_continue`] looks for `metadata`: a list's `kind` and
/// `apiVersion` come first, both short.
pub(super) const PEEK_BYTES: usize = 4096;

/// The `continue` token of a list body, read from its top-level `metadata` without decoding
/// the items: built-in resources' lists are written in Go struct order (`kind`, `apiVersion`,
/// `metadata`, `items`), so it is near the start; custom resources' lists are written from a
/// map with sorted keys (`apiVersion`, `items`, `kind`, `metadata`), so it is at the end. `None`
/// when there is none or the body is laid out otherwise. A hint only: the caller checks it
/// against the decoded list.
pub(crate) fn peek_continue(body: &[u8]) -> Option<String> {
    const KEY: &[u8] = b"\"metadata\"";
    let head = &body[..body.len().min(PEEK_BYTES)];
    let find = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).position(|w| w == needle);
    if let Some(meta) = find(head, KEY)
        && find(head, b"\"items\"").is_none_or(|items| meta < items)
    {
        return metadata_continue(&body[meta + KEY.len()..]).map(|(token, _)| token)?;
    }
    // Items first: the list's own metadata is the last `"metadata"` key, and nothing but the
    // closing brace may follow its value.
    let tail_start = body.len().saturating_sub(PEEK_BYTES);
    let tail = &body[tail_start..];
    let meta = tail.windows(KEY.len()).rposition(|w| w == KEY)?;
    let (token, rest) = metadata_continue(&tail[meta + KEY.len()..])?;
    let rest: Vec<u8> = rest.iter().copied().filter(|b| !b.is_ascii_whitespace()).collect();
    if rest == b"}" { token } else { None }
}

/// Parses `: {...}` (a list's metadata after its key) and returns its `continue` token and the
/// bytes after the value; `None` if it is not that.
pub(super) fn metadata_continue(after_key: &[u8]) -> Option<(Option<String>, &[u8])> {
    #[derive(Deserialize)]
    struct ListMetaContinue {
        #[serde(rename = "continue")]
        continue_: Option<String>,
    }
    let colon = after_key.iter().position(|b| !b.is_ascii_whitespace())?;
    if after_key[colon] != b':' {
        return None;
    }
    let value = &after_key[colon + 1..];
    let mut values = serde_json::Deserializer::from_slice(value).into_iter::<ListMetaContinue>();
    let meta = values.next()?.ok()?;
    let rest = &value[values.byte_offset()..];
    Some((meta.continue_.filter(|c| !c.is_empty()), rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_buffers_are_reused_during_a_list_and_none_is_held_after_it() {
        let buffers = PageBuffers::default();
        let mut first = buffers.take();
        first.extend_from_slice(&[1; 1000]);
        let capacity = first.capacity();
        buffers.give_back(first);
        let again = buffers.take();
        assert!(
            again.is_empty() && again.capacity() == capacity,
            "the same allocation, emptied"
        );
        // Two pages in flight; the last one ends the list before the other is given back.
        let other = buffers.take();
        buffers.release();
        buffers.give_back(again);
        buffers.give_back(other);
        assert_eq!(buffers.state().free.len(), 0);
        // The next list reuses buffers again; one too large to hold idle is dropped.
        let next = buffers.take();
        buffers.give_back(next);
        buffers.give_back(Vec::with_capacity(PageBuffers::KEEP_BYTES + 1));
        assert_eq!(buffers.state().free.len(), 1);
    }

    #[test]
    fn the_continue_token_is_read_from_the_metadata_in_front_of_the_items() {
        let page = br#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"7","continue":"abc=="},"items":[{"metadata":{"continue":"no"}}]}"#;
        assert_eq!(peek_continue(page).as_deref(), Some("abc=="));
        let spaced = br#"{ "kind" : "List", "metadata" :
            { "continue" : "x\"y" }, "items" : [] }"#;
        assert_eq!(peek_continue(spaced).as_deref(), Some("x\"y"));
        // The last page, an empty token, and no metadata at all: nothing to fetch ahead.
        assert_eq!(
            peek_continue(br#"{"metadata":{"resourceVersion":"7"},"items":[]}"#),
            None
        );
        assert_eq!(peek_continue(br#"{"metadata":{"continue":""},"items":[]}"#), None);
        assert_eq!(peek_continue(br#"{"items":[]}"#), None);
        // Items first (custom resources' lists, sorted keys): the list's metadata at the end,
        // never an item's.
        let sorted = br#"{"apiVersion":"example.com/v1","items":[{"metadata":{"continue":"no"}}],"kind":"FooList","metadata":{"continue":"c"}}"#;
        assert_eq!(peek_continue(sorted).as_deref(), Some("c"));
        let last = br#"{"apiVersion":"v1","items":[{"metadata":{"continue":"no"}}],"kind":"FooList"}"#;
        assert_eq!(peek_continue(last), None);
        let item_last = br#"{"apiVersion":"v1","kind":"FooList","items":[{"x":1,"metadata":{"continue":"no"}}]}"#;
        assert_eq!(peek_continue(item_last), None);
        // Cut off or not JSON: no hint, no panic.
        assert_eq!(peek_continue(br#"{"metadata":{"continue":"ab"#), None);
        assert_eq!(peek_continue(b"\"metadata\""), None);
        assert_eq!(peek_continue(b""), None);
    }
}
