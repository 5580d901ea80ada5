use kinformer::Informer;

#[derive(Informer)]
#[informer(version = "v1", kind = "Foo", namespace = "default")]
pub struct Foo {
    pub replicas: i32,
}

fn main() {}
