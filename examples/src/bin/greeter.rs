//! The README's "Write your own controller": each Greeting gets a ConfigMap holding its message.
use kinformer::k8s_openapi::api::core::v1::ConfigMap;
use kinformer::k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition as Crd;
use kinformer::prelude::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// kube's CustomResource and kinformer's Informer, through kinformer's copies of kube's crates.
#[kinformer::resource(group = "example.com", version = "v1", kind = "Greeting", namespaced)]
#[derive(Serialize, Deserialize, Clone, Debug, JsonSchema)]
pub struct GreetingSpec {
    message: String,
}

async fn reconcile(req: Request, ctx: Context<Greeting>) -> Result<Action, kinformer::controller::BoxError> {
    // Deleted: nothing to do, its ConfigMap is garbage-collected through the owner reference.
    let Some(greeting) = ctx.get(&req)? else {
        return Ok(Action::Done);
    };
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(req.name.clone());
    cm.metadata.owner_references = greeting.controller_owner_ref(&()).map(|owner| vec![owner]);
    cm.data = Some([("message".to_string(), greeting.spec.message.clone())].into());
    let api: Api<ConfigMap> = Api::namespaced(ctx.client().clone(), req.namespace.as_deref().unwrap_or("default"));
    api.patch(&req.name, &PatchParams::apply("greeter").force(), &Patch::Apply(&cm))
        .await?;
    Ok(Action::Done)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Logs to stderr; RUST_LOG overrides the default (a line per reconcile, warnings, errors).
    kinformer::init_logging()?;
    // The kubeconfig's cluster (or, in a pod, its ServiceAccount's), as kube's
    // Client::try_default(); a connection error names the server's address.
    let client = kinformer::cache::client::infer().await?;
    let crd = Greeting::crd();
    Api::<Crd>::all(client.clone())
        .patch(
            "greetings.example.com",
            &PatchParams::apply("greeter"),
            &Patch::Apply(&crd),
        )
        .await?;
    let mut manager = Manager::builder(client).handle_signals(true).build()?;
    let greeter = manager
        .controller("greeter")
        .for_resource::<Greeting>()
        .owns::<ConfigMap>();
    manager.add(greeter.build(reconciler_fn(reconcile))?);
    manager.run(CancellationToken::new()).await?;
    Ok(())
}
