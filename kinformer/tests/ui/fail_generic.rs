use kinformer::Informer;

#[derive(Informer)]
#[informer(version = "v1", kind = "Foo")]
pub struct Foo<T> {
    pub spec: T,
}

fn main() {}
