//! Typed CRD version conversion, hub and spoke (controller-runtime's `pkg/webhook/conversion`
//! and `pkg/conversion`): one version of a kind is the hub, every other version (a spoke)
//! converts to and from it ([`Convertible`]), so N versions need 2(N−1) conversions, not N².
//!
//! Where it sits: kube-apiserver POSTs a `ConversionReview` (`apiextensions.k8s.io/v1`) to
//! `/convert` whenever it must hand out or store an object of a CRD with `conversion: Webhook`
//! in another version than it has. The server looks up each object's kind among the registered
//! [`Conversion`]s, decodes it as its version's type, converts it to the hub and from the hub to
//! `desiredAPIVersion`, and answers the converted objects in order. Any failure (an unknown
//! kind or version, a decode error, a conversion's `Err` or panic) fails the whole review with
//! `result.status: Failure` and the message, as controller-runtime; kube-apiserver then fails
//! the API request. An object already in the desired version is returned as it came
//! (controller-runtime refuses "conversion is not allowed between same type"; kube-apiserver
//! does not send such objects, and passing them through is harmless). A body that is not a
//! `ConversionReview` with a request is answered HTTP 400, as controller-runtime.
//!
//! The converted object's `apiVersion` and `kind` are set by the server; a conversion must
//! keep `metadata` (kube-apiserver refuses a conversion that changes more than labels and
//! annotations). Fields the Rust types do not know are lost in conversion, as with Go types.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::future::BoxFuture;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::{error, warn};

use super::error::WebhookError;
use super::server::{Hook, HookRequest, HookResponse, panic_message};
use crate::reconciler::BoxError;

/// A spoke version of a kind: converts to and from the hub type `H` (controller-runtime's
/// `Convertible`'s `ConvertTo` and `ConvertFrom`).
pub trait Convertible<H>: Sized {
    /// This object in the hub version.
    fn to_hub(self) -> Result<H, BoxError>;
    /// The hub object in this version.
    fn from_hub(hub: H) -> Result<Self, BoxError>;
}

/// The conversion of one kind through its hub `H`: `Conversion::<FooV1>::new().spoke::<FooV1alpha1>()`
/// (with `impl Convertible<FooV1> for FooV1alpha1`), registered with
/// [`WebhookServer::register_conversion`](super::WebhookServer::register_conversion).
#[must_use]
pub struct Conversion<H> {
    /// `apiVersion` → the version's codec; the hub's is the identity.
    versions: HashMap<String, Arc<dyn VersionCodec<H>>>,
    /// `group/Kind` of `H`.
    kind: String,
    errors: Vec<String>,
}

impl<H> Conversion<H>
where
    H: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// The conversion of `H`'s kind with `H` as the hub and no spoke yet.
    pub fn new() -> Self {
        let mut versions: HashMap<String, Arc<dyn VersionCodec<H>>> = HashMap::new();
        versions.insert(H::api_version(&()).into_owned(), Arc::new(HubCodec));
        Conversion {
            versions,
            kind: group_kind::<H>(),
            errors: Vec::new(),
        }
    }

    /// Adds the spoke version `S` (same group and kind as `H`).
    pub fn spoke<S>(mut self) -> Self
    where
        S: Convertible<H> + Resource<DynamicType = ()> + Serialize + DeserializeOwned + Send + Sync + 'static,
    {
        let version = S::api_version(&()).into_owned();
        if group_kind::<S>() != self.kind {
            self.errors
                .push(format!("spoke {version} {} is not of the hub's kind", S::kind(&())));
        } else {
            match self.versions.entry(version) {
                std::collections::hash_map::Entry::Occupied(taken) => {
                    self.errors.push(format!("version {} given twice", taken.key()));
                }
                std::collections::hash_map::Entry::Vacant(free) => {
                    free.insert(Arc::new(SpokeCodec::<S>(std::marker::PhantomData)));
                }
            }
        }
        self
    }

    pub(crate) fn into_kind(self) -> Result<(String, Arc<dyn KindConversion>), WebhookError> {
        if !self.errors.is_empty() {
            return Err(WebhookError::Conversion {
                kind: self.kind,
                reason: self.errors.join("; "),
            });
        }
        Ok((self.kind, Arc::new(self.versions)))
    }
}

impl<H> Default for Conversion<H>
where
    H: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Send + Sync + 'static,
{
    fn default() -> Self {
        Self::new()
    }
}

fn group_kind<K: Resource<DynamicType = ()>>() -> String {
    format!("{}/{}", K::group(&()), K::kind(&()))
}

/// One version's way to and from the hub, on JSON.
trait VersionCodec<H>: Send + Sync {
    fn decode_to_hub(&self, object: Value) -> Result<H, BoxError>;
    fn encode_from_hub(&self, hub: H) -> Result<Value, BoxError>;
}

struct HubCodec;

impl<H: Serialize + DeserializeOwned> VersionCodec<H> for HubCodec {
    fn decode_to_hub(&self, object: Value) -> Result<H, BoxError> {
        Ok(serde_json::from_value(object)?)
    }
    fn encode_from_hub(&self, hub: H) -> Result<Value, BoxError> {
        Ok(serde_json::to_value(hub)?)
    }
}

struct SpokeCodec<S>(std::marker::PhantomData<fn() -> S>);

impl<H, S> VersionCodec<H> for SpokeCodec<S>
where
    S: Convertible<H> + Serialize + DeserializeOwned,
{
    fn decode_to_hub(&self, object: Value) -> Result<H, BoxError> {
        let spoke: S = serde_json::from_value(object)?;
        spoke.to_hub()
    }
    fn encode_from_hub(&self, hub: H) -> Result<Value, BoxError> {
        Ok(serde_json::to_value(S::from_hub(hub)?)?)
    }
}

/// The conversions of one kind, with the hub type erased.
pub(crate) trait KindConversion: Send + Sync {
    /// `object` (of this kind, any registered version) in `desired`.
    fn convert(&self, object: Value, desired: &str) -> Result<Value, String>;
}

impl<H: Send + Sync> KindConversion for HashMap<String, Arc<dyn VersionCodec<H>>> {
    fn convert(&self, mut object: Value, desired: &str) -> Result<Value, String> {
        let from = object
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let kind = object
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if from == desired {
            return Ok(object);
        }
        let source = self
            .get(&from)
            .ok_or_else(|| format!("no conversion from {from} {kind}"))?;
        let target = self
            .get(desired)
            .ok_or_else(|| format!("no conversion to {desired} {kind}"))?;
        // The types' own `apiVersion` may be checked by their deserializer: give each the one
        // it expects.
        let hub = source
            .decode_to_hub(object.take())
            .map_err(|e| format!("{from} {kind} failed to convert to the hub version: {e}"))?;
        let mut converted = target
            .encode_from_hub(hub)
            .map_err(|e| format!("{desired} {kind} failed to convert from the hub version: {e}"))?;
        if let Some(fields) = converted.as_object_mut() {
            fields.insert("apiVersion".into(), Value::String(desired.to_owned()));
            fields.insert("kind".into(), Value::String(kind));
        }
        Ok(converted)
    }
}

/// The `/convert` handler: every registered kind.
pub(crate) struct ConversionHook {
    pub(crate) kinds: std::sync::RwLock<HashMap<String, Arc<dyn KindConversion>>>,
}

/// `apiextensions.k8s.io/v1` `ConversionReview` (k8s-openapi has no type for it), the fields
/// this server reads and writes.
#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct ConversionReview {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    request: Option<ConversionRequest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    response: Option<ConversionResponse>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct ConversionRequest {
    uid: String,
    #[serde(rename = "desiredAPIVersion")]
    desired_api_version: String,
    #[serde(default)]
    objects: Vec<Value>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct ConversionResponse {
    uid: String,
    converted_objects: Vec<Value>,
    result: ConversionResult,
}

#[derive(Debug, Deserialize, Serialize)]
struct ConversionResult {
    status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    message: String,
}

impl ConversionHook {
    fn convert_all(&self, request: ConversionRequest) -> Result<Vec<Value>, String> {
        let kinds = self.kinds.read().unwrap_or_else(|e| e.into_inner()).clone();
        let desired = request.desired_api_version;
        let desired_group = desired.rsplit_once('/').map_or("", |(group, _)| group);
        request
            .objects
            .into_iter()
            .map(|object| {
                let kind = object.get("kind").and_then(Value::as_str).unwrap_or_default();
                let key = format!("{desired_group}/{kind}");
                let conversion = kinds
                    .get(&key)
                    .ok_or_else(|| format!("no conversion registered for {key}"))?
                    .clone();
                std::panic::catch_unwind(AssertUnwindSafe(|| conversion.convert(object, &desired))).unwrap_or_else(
                    |panic| {
                        let message = panic_message(panic);
                        error!(panic = %message, "conversion panicked");
                        Err(format!("panic: {message} [recovered]"))
                    },
                )
            })
            .collect()
    }
}

impl Hook for ConversionHook {
    fn serve(self: Arc<Self>, request: HookRequest) -> BoxFuture<'static, HookResponse> {
        Box::pin(async move {
            let review: ConversionReview = match serde_json::from_slice(&request.body) {
                Ok(review) => review,
                Err(e) => {
                    warn!(error = %e, "cannot decode the ConversionReview");
                    return HookResponse::bad_request(format!("decoding the ConversionReview: {e}"));
                }
            };
            let Some(conversion) = review.request else {
                warn!("ConversionReview without a request");
                return HookResponse::bad_request("conversion request is nil".into());
            };
            request.span.record("uid", conversion.uid.as_str());
            request.span.record("operation", "convert");
            request.span.record(
                "kind",
                conversion
                    .objects
                    .first()
                    .and_then(|o| o.get("kind"))
                    .and_then(Value::as_str),
            );
            let uid = conversion.uid.clone();
            let desired = conversion.desired_api_version.clone();
            let response = match self.convert_all(conversion) {
                Ok(converted_objects) => ConversionResponse {
                    uid,
                    converted_objects,
                    result: ConversionResult {
                        status: "Success".into(),
                        message: String::new(),
                    },
                },
                Err(message) => {
                    warn!(%desired, error = %message, "conversion failed");
                    ConversionResponse {
                        uid,
                        converted_objects: Vec::new(),
                        result: ConversionResult {
                            status: "Failure".into(),
                            message,
                        },
                    }
                }
            };
            HookResponse::json(&ConversionReview {
                api_version: if review.api_version.is_empty() {
                    "apiextensions.k8s.io/v1".into()
                } else {
                    review.api_version
                },
                kind: "ConversionReview".into(),
                request: None,
                response: Some(response),
            })
        })
    }
}
